"""A trained workdir as the decoder needs it: its config, vocabulary, parameters' shapes and
the grammar its outputs obey; refusals name the workdir and file (`TranslateError`)."""

import os
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections

from t2t_jax import compilation
from t2t_jax import data as data_lib
from t2t_jax.data.tokenizer import Tokenizer
from t2t_jax.decoding import constraints
from t2t_jax.model import Transformer, TransformerConfig
from t2t_jax.run.files import sha256_file
from t2t_jax.run.workdir import Workdir, WorkdirFileError


class TranslateError(ValueError):
  """A workdir, checkpoint choice or input file that cannot be used; names the path."""


def load_config(workdir: str) -> ml_collections.ConfigDict:
  """The resolved config t2t-train wrote to <workdir>/config.json; data fields added since
  that version have their defaults (model and search fields get theirs when
  TransformerConfig and SearchConfig are built from it)."""
  try:
    values = Workdir(workdir).config_values()
  except WorkdirFileError as e:
    raise TranslateError(str(e)) from None
  if values is None:
    raise TranslateError(f"{workdir}: no {Workdir.CONFIG} (not a t2t-train workdir?)")
  config = ml_collections.ConfigDict(values)
  if "data" in config:
    config.data = data_lib.config.with_defaults(config.data)
  return config


def load_tokenizer(config: ml_collections.ConfigDict, workdir: str) -> Tokenizer:
  path = data_lib.vocab_path(config.data, workdir)
  if not os.path.exists(str(path)):
    raise TranslateError(f"{workdir}: vocabulary {path} is missing")
  return data_lib.load_tokenizer(path)


def vocabulary_fingerprints(workdir: str, steps: Sequence[int]) -> list[str | None]:
  """The sha256 of the vocabulary each checkpoint was trained with (None: saved without a
  fingerprint), from the checkpoints themselves."""
  from t2t_jax.run import checkpoint  # orbax: only where the checkpoints are read

  ckpts = checkpoint.Checkpoints(workdir)
  saved = [ckpts.fingerprint(step) for step in steps]
  return [None if s is None else s["vocab_sha256"] for s in saved]


def check_vocabulary(
  workdir: str, steps: Sequence[int], saved: Sequence[str | None], vocab: str | os.PathLike
) -> None:
  """Refuses a vocabulary other than the one the checkpoints were trained with (`saved`:
  `vocabulary_fingerprints` of `steps`)."""
  have = sha256_file(str(vocab))
  for step, sha in zip(steps, saved):
    if sha is not None and sha != have:
      path = os.path.join(Workdir(workdir).checkpoint_dir, str(step))
      raise TranslateError(
        f"vocabulary {vocab} (sha256 {have}) is not the one checkpoint {path} "
        f"was trained with (sha256 {sha})"
      )


def param_shapes(model: Transformer) -> Any:
  """The shapes and dtypes of `model`'s parameters, which a checkpoint must match: traced
  from its init once per machine (kept by the compilation cache; the trace of a base-sized
  model's init is most of a second of every start)."""

  def trace() -> Any:
    dummy = jnp.ones((1, 4), jnp.int32)
    return jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), dummy, dummy))["params"]

  return compilation.stored_shapes("Transformer params", model.config, trace)


def task_constraint(data_config: ml_collections.ConfigDict, tokenizer: Tokenizer) -> Any:
  """The constraint of a task whose outputs have a grammar: for a source scored by trees
  (parsing), well-formed trees over the source's words in the workdir's leaf form, no
  deeper than config.data.tree_max_depth and with no longer runs of opening brackets than
  tree_max_opens; None for translation."""
  source = data_lib.sources.find(data_config.source)
  if source is None or not source.scores_trees:
    return None
  pieces = [tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)]
  return constraints.TreeConstraint.for_symbols(
    pieces,
    data_config.get("tree_leaves", "xx"),
    max_depth=data_config.get("tree_max_depth", 0) or 64,
    max_opens=data_config.get("tree_max_opens", 0),
  )


class MemberShape(NamedTuple):
  vocab: str
  vocab_sha256: str
  vocab_size: int
  max_len: int


def member_shape(workdir: str) -> MemberShape:
  """What an ensemble's members must share, from config.json and the vocabulary only."""
  config = load_config(workdir)
  tokenizer = load_tokenizer(config, workdir)
  vocab = str(data_lib.vocab_path(config.data, workdir))
  model_cfg = TransformerConfig.from_dict(config.model.to_dict(), vocab_size=tokenizer.vocab_size)
  return MemberShape(vocab, sha256_file(vocab), model_cfg.vocab_size, model_cfg.max_len)
