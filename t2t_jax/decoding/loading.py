"""A Translator's model from workdirs: one workdir's model, parameters, vocabulary, search
and task (`load_workdir`), and the checks that let several be an ensemble
(`check_members`, before any checkpoint is read; `check_same_shape`, of loaded ones)."""

from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import numpy as np
from flax.typing import VariableDict

from t2t_jax import data as data_lib
from t2t_jax.data.tokenizer import Tokenizer
from t2t_jax.decoding import kept_params, precision
from t2t_jax.decoding import workdirs as workdirs_lib
from t2t_jax.decoding.config import SearchConfig
from t2t_jax.decoding.workdirs import TranslateError, load_config, task_constraint
from t2t_jax.model import Transformer, TransformerConfig
from t2t_jax.run import checkpoint_spec as checkpoint_spec_lib


class Loaded(NamedTuple):
  """One workdir as a Translator takes it: Translator(model, params, tokenizer, **settings)."""

  model: Transformer
  params: VariableDict
  tokenizer: Tokenizer
  settings: dict[str, Any]  # search, constraint, checkpoint_steps, target_lang, workdirs


def load_workdir(workdir: str, checkpoint_spec: str, dtype: str | None) -> Loaded:
  """config.json, the vocabulary and checkpoint(s) ('auto', 'latest', 'average:N',
  'best[:N]', 'ema', 'selected', 'STEP'); the search is the config's
  (SearchConfig.from_config), the constraint the task's (`task_constraint`). dtype: the
  products' dtype ('float32', 'bfloat16', or 'auto': precision.decode_dtype); None: the
  config's."""
  config = load_config(workdir)
  checkpoint_spec = checkpoint_spec_lib.resolve_spec(workdir, checkpoint_spec)
  tokenizer = workdirs_lib.load_tokenizer(config, workdir)
  model_dict = config.model.to_dict()
  if dtype is not None:
    configured = model_dict.get("dtype", "float32")
    try:
      model_dict["dtype"] = precision.decode_dtype(dtype, configured, jax.default_backend())
    except ValueError as e:  # a bad $T2T_DECODE_DTYPE: one line from the commands
      raise TranslateError(str(e)) from None
  model = Transformer(TransformerConfig.from_dict(model_dict, vocab_size=tokenizer.vocab_size))
  kept = read_params(workdir, checkpoint_spec, workdirs_lib.param_shapes(model))
  params, steps = kept.params, kept.steps
  workdirs_lib.check_vocabulary(
    workdir, steps, kept.vocab_sha256, data_lib.vocab_path(config.data, workdir)
  )
  settings = dict(
    search=SearchConfig.from_config(config),
    constraint=task_constraint(config.data, tokenizer),
    checkpoint_steps=steps,
    target_lang=data_lib.target_language(config.data),
    workdirs=[workdir],
  )
  return Loaded(model, params, tokenizer, settings)


def read_params(workdir: str, spec: str, params_like: Any) -> kept_params.Kept:
  """The parameters of `spec` (resolved) and their steps' vocabulary fingerprints: kept in
  the compilation cache after a first read (`decoding.kept_params`), so that a warm process
  neither imports orbax nor restores a checkpoint."""

  def restore() -> kept_params.Kept:
    from t2t_jax.run import checkpoint  # orbax: only where the checkpoints are read

    params, steps = checkpoint.load_params(workdir, spec, params_like)
    # numpy leaves, as the kept entry reads back: a cold and a warm process then call the
    # stored search programs with arguments of one signature
    params = jax.tree.map(np.asarray, params)
    return kept_params.Kept(params, steps, workdirs_lib.vocabulary_fingerprints(workdir, steps))

  return kept_params.load(workdir, spec, params_like, restore)[0]


def check_members(workdirs: Sequence[str]) -> None:
  """Before any checkpoint is read: the members' vocabulary files must have the same
  sha256, and their models the same vocabulary size and max_len; otherwise refused in one
  line naming both workdirs."""
  first = workdirs_lib.member_shape(workdirs[0])
  for workdir in workdirs[1:]:
    other = workdirs_lib.member_shape(workdir)
    if other.vocab_sha256 != first.vocab_sha256:
      raise TranslateError(
        f"ensemble: vocabulary {other.vocab} (sha256 {other.vocab_sha256}) differs from "
        f"{first.vocab} (sha256 {first.vocab_sha256}); the members must share one"
      )
    for what in ("vocab_size", "max_len"):
      if getattr(other, what) != getattr(first, what):
        raise TranslateError(
          f"ensemble: {workdir} has model {what}={getattr(other, what)} but "
          f"{workdirs[0]} has {getattr(first, what)}"
        )


def check_same_shape(members: Sequence[tuple[str, Transformer]]) -> None:
  """Loaded members (name, model) must agree on the vocabulary size and max_len: refused
  naming both otherwise."""
  first_name, first = members[0]
  for name, other in members[1:]:
    for what in ("vocab_size", "max_len"):
      mine, theirs = getattr(other.config, what), getattr(first.config, what)
      if mine != theirs:
        label = "vocabulary size" if what == "vocab_size" else what
        raise TranslateError(f"ensemble: {name} has {label} {mine} but {first_name} has {theirs}")
