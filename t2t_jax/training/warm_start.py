"""Warm start (`config.init_from=WORKDIR[:SPEC]`): a new run from another workdir's parameters.

Where a run's initial state comes from, in this order (trainer._train):
  1. the workdir's own newest checkpoint (a restarted fine-tune resumes itself; the parent
     is not even read, so it may have been moved or deleted since);
  2. `config.init_from`: the parent's parameters (SPEC as t2t-translate's --checkpoint;
     default its selected checkpoint, else its latest), and with `init_keep_optimizer` its
     Adam moments, at step 0 with a fresh dropout key and learning-rate schedule;
  3. a fresh initialisation from `config.seed`.

The run tokenizes with the parent's vocabulary file (copied to where this config reads its
vocabulary), so ids mean what the parameters learnt. Everything here that can refuse the
parent runs before the data is read or anything is compiled; parameters are restored on the
host like a fresh initialisation, and the trainer replicates them the same way.
"""

import dataclasses
import os
import re
from typing import Any

import jax
import ml_collections
import numpy as np
import optax
from absl import logging

from t2t_jax import data as data_lib
from t2t_jax.model import TransformerConfig
from t2t_jax.run import checkpoint
from t2t_jax.run.files import atomic_copy, sha256_file
from t2t_jax.run.workdir import Workdir
from t2t_jax.training import config as config_lib
from t2t_jax.training import steps


class WarmStartError(ValueError):
  """`config.init_from` names no usable parent for this config (the message names why)."""


# What may follow 'WORKDIR:' (checked again, against the parent's steps, by choose_steps).
_SPEC = re.compile(r"(latest|selected|ema|average:\d+|\d+)$")
_SYNTAX = "WORKDIR[:SPEC], SPEC one of latest, average:N, STEP, selected, ema"


@dataclasses.dataclass(frozen=True)
class Parent:
  """The checkpoint(s) a warm start reads, resolved and checked against this run's config."""

  workdir: str  # absolute
  spec: str  # resolved: 'latest', 'average:N' or 'STEP' ('selected' read from selected.json)
  steps: tuple[int, ...]  # the parent's checkpoint steps it names (averaged when several)
  vocab: str  # the parent's vocabulary file
  vocab_sha256: str
  keep_optimizer: bool

  def record(self) -> dict[str, Any]:
    """What the run's fingerprint and starts.jsonl say about the parent."""
    return dict(
      workdir=self.workdir,
      spec=self.spec,
      steps=list(self.steps),
      vocab=self.vocab,
      vocab_sha256=self.vocab_sha256,
      keep_optimizer=self.keep_optimizer,
    )


def parse(value: str) -> tuple[str, str | None]:
  """(workdir, SPEC or None) of 'WORKDIR[:SPEC]'. The longest prefix that is a directory is
  the workdir, so a directory name holding ':' still works."""
  if os.path.isdir(value):
    return value, None
  cut = value.rfind(":")
  while cut > 0:
    if os.path.isdir(value[:cut]):
      return value[:cut], value[cut + 1 :]
    cut = value.rfind(":", 0, cut)
  head, _, tail = value.partition(":")
  missing = head if tail and _SPEC.match(tail) else value
  raise WarmStartError(
    f"config.init_from={value!r}: no directory {missing!r} (expected {_SYNTAX}; the "
    "workdir of an earlier t2t-train run)"
  )


def resolve(config: ml_collections.ConfigDict, workdir: str) -> Parent | None:
  """The parent of `config.init_from`, checked against `config`; None when there is no
  init_from or when `workdir` holds a checkpoint step of its own (complete or damaged: the
  resume deals with it), which comes first.

  Reads the parent's config.json, selected.json, checkpoint list and metadata and
  vocabulary, nothing else: no data, no compilation. Raises WarmStartError naming the
  problem: no such directory, no checkpoint, a bad SPEC, another architecture (the field and
  both values), another vocabulary.
  """
  value = config.init_from
  if not value:
    return None
  own = Workdir(workdir)
  if own.has_checkpoints():
    logging.info(
      "config.init_from=%s not used: %s has checkpoints of its own, and a run resumes its "
      "own checkpoint first",
      value,
      own.checkpoint_dir,
    )
    return None
  what = f"config.init_from={value}"
  path, spec = parse(value)
  path = os.path.abspath(path)
  if os.path.realpath(path) == os.path.realpath(workdir):
    raise WarmStartError(f"{what}: names this run's own workdir {workdir}")
  if spec is not None and not _SPEC.match(spec):
    raise WarmStartError(
      f"{what}: SPEC {spec!r} is not one of latest, average:N, STEP, selected, ema"
    )
  run_dir = Workdir(path)
  if not os.path.isdir(run_dir.checkpoint_dir):
    raise WarmStartError(f"{what}: {path} holds no checkpoints (no {run_dir.checkpoint_dir})")
  ckpts = checkpoint.Checkpoints(path)
  try:
    return _check(config, workdir, what, path, spec, ckpts)
  finally:
    ckpts.close()


def _check(
  config: ml_collections.ConfigDict,
  workdir: str,
  what: str,
  path: str,
  spec: str | None,
  ckpts: checkpoint.Checkpoints,
) -> Parent:
  run_dir = Workdir(path)
  if not ckpts.steps():
    raise WarmStartError(f"{what}: {path} holds no complete checkpoint in {run_dir.checkpoint_dir}")
  if spec is None:
    spec = "selected" if run_dir.has_selection() else "latest"
  try:
    if spec == "selected":
      spec = checkpoint.selected_spec(path, what)
    chosen = checkpoint.choose_steps(ckpts, spec, what)
  except checkpoint.CheckpointSpecError as e:
    raise WarmStartError(str(e)) from None
  if config.init_keep_optimizer and spec == checkpoint.EMA:
    raise WarmStartError(
      f"{what}: config.init_keep_optimizer=True keeps the moments of the parameters, not of "
      "their moving average ('ema'); name a STEP or 'latest'"
    )
  if config.init_keep_optimizer and len(chosen) > 1:
    raise WarmStartError(
      f"{what}: config.init_keep_optimizer=True needs one checkpoint, but {spec} averages "
      f"steps {chosen} (optimizer moments are not averaged); name a STEP"
    )
  if config.init_keep_optimizer and not ckpts.has_optimizer_state(chosen[-1]):
    raise WarmStartError(
      f"{what}: config.init_keep_optimizer=True, but checkpoint {ckpts.path(chosen[-1])} "
      "holds parameters only (no optimizer state)"
    )
  saved = ckpts.fingerprint(chosen[-1])
  parent_config = _parent_config(run_dir, saved, what)
  where = f"{what}: {ckpts.path(chosen[-1])}"
  check_architecture(parent_config, config, where)
  vocab = str(data_lib.vocab_path(parent_config.data, path))
  if not os.path.isfile(vocab):
    raise WarmStartError(f"{what}: the parent's vocabulary {vocab} does not exist")
  vocab_sha256 = sha256_file(vocab)
  if saved is not None and saved["vocab_sha256"] != vocab_sha256:
    raise WarmStartError(
      f"{where} was trained with a vocabulary of sha256 {saved['vocab_sha256']}, but "
      f"{vocab} now has sha256 {vocab_sha256}"
    )
  return Parent(
    workdir=path,
    spec=spec,
    steps=tuple(chosen),
    vocab=vocab,
    vocab_sha256=vocab_sha256,
    keep_optimizer=bool(config.init_keep_optimizer),
  )


def _parent_config(
  run_dir: Workdir, saved: dict[str, Any] | None, what: str
) -> ml_collections.ConfigDict:
  """The config the chosen checkpoint was trained with: its fingerprint's, else the
  workdir's config.json (a checkpoint written without a fingerprint)."""
  if saved is not None:
    values = saved["config"]
  else:
    values = run_dir.config_values()
    if values is None:
      raise WarmStartError(
        f"{what}: {run_dir.config_file} does not exist (not a t2t-train workdir)"
      )
  return config_lib.with_defaults(ml_collections.ConfigDict(values))


def check_architecture(
  parent: ml_collections.ConfigDict, config: ml_collections.ConfigDict, where: str
) -> None:
  """Refuses a model field that changes the parameters' shapes, naming it and both values
  (resolved: d_k=0 and d_k=d_model/h are the same). The vocabulary is the parent's file, so
  its size is checked through `config.data.vocab_size` where a SentencePiece model is read;
  symbol and word vocabularies are checked against the data config by the tokenizer."""
  # vocab_size is a placeholder on both sides: it comes from the (shared) vocabulary file.
  old = TransformerConfig.from_dict(parent.model.to_dict(), vocab_size=1).parameter_fields()
  new = TransformerConfig.from_dict(config.model.to_dict(), vocab_size=1).parameter_fields()
  for field in sorted(set(old) | set(new)):
    if old.get(field) != new.get(field):
      raise WarmStartError(
        f"{where} was trained with config.model.{field}={old.get(field)!r}, but this run has "
        f"config.model.{field}={new.get(field)!r}: a warm start needs the parent's parameter "
        "shapes (dropout, label smoothing, the schedule and the data may change)"
      )
  if _vocab_kind(data_lib.vocab_path(config.data, "")) == "sentencepiece" and (
    parent.data.vocab_size != config.data.vocab_size
  ):
    raise WarmStartError(
      f"{where} was trained with config.data.vocab_size={parent.data.vocab_size}, but this "
      f"run has config.data.vocab_size={config.data.vocab_size}: a warm start keeps the "
      "parent's vocabulary"
    )


def _vocab_kind(path: str | os.PathLike) -> str:
  """The tokenizer a vocabulary file's name selects (data.load_tokenizer's rule)."""
  name = os.fspath(path)
  for suffix in (".symbols", ".words"):
    if name.endswith(suffix):
      return suffix[1:]
  return "sentencepiece"


def adopt_vocabulary(
  config: ml_collections.ConfigDict, workdir: str, parent: Parent, process_index: int
) -> str:
  """Puts the parent's vocabulary where `config` reads its own (config.data.vocab_path,
  else <data_dir or workdir>/vocab.*) and returns that path. A file already there must be
  the same bytes: another one is refused naming both files, never overwritten. Only process
  0 copies; the others wait for the file in the tokenizer, as for a trained vocabulary."""
  target = str(data_lib.vocab_path(config.data, workdir))
  if _vocab_kind(target) != _vocab_kind(parent.vocab):
    raise WarmStartError(
      f"config.init_from={config.init_from}: the parent's vocabulary {parent.vocab} is a "
      f"{_vocab_kind(parent.vocab)} file, but this config reads a {_vocab_kind(target)} file "
      f"{target} (config.data.source={config.data.source!r})"
    )
  if os.path.exists(target):
    sha = sha256_file(target)
    if sha != parent.vocab_sha256:
      raise WarmStartError(
        f"config.init_from={config.init_from}: this run's vocabulary {target} (sha256 {sha}) "
        f"is not the parent's {parent.vocab} (sha256 {parent.vocab_sha256}); a warm start "
        "tokenizes with the parent's: set config.data.vocab_path to it, or use a new "
        "--workdir (nothing was changed)"
      )
    return target
  if process_index == 0:
    os.makedirs(os.path.dirname(os.path.abspath(target)), exist_ok=True)
    atomic_copy(parent.vocab, target)
    logging.info("warm start: copied the parent's vocabulary %s to %s", parent.vocab, target)
  return target


def restart_schedule(opt_state: Any) -> Any:
  """`opt_state` with the learning-rate schedule's update count at 0 (the new run's warmup)
  and Adam's moments and bias-correction count as they are: those belong to the moments."""
  is_schedule = lambda s: isinstance(s, optax.ScaleByScheduleState)
  return jax.tree.map(
    lambda s: s._replace(count=np.zeros_like(s.count)) if is_schedule(s) else s,
    opt_state,
    is_leaf=is_schedule,
  )


def initial_state(state: steps.TrainState, parent: Parent) -> steps.TrainState:
  """`state` (a fresh host state: step 0, this run's dropout key and optimizer) with the
  parent's parameters (the mean of `parent.steps` when several) and, if
  `parent.keep_optimizer`, its optimizer state with the schedule restarted. Shapes are
  checked against `state` (CheckpointMismatchError names the parameter)."""
  ckpts = checkpoint.Checkpoints(parent.workdir)
  try:
    if parent.keep_optimizer:
      (step,) = parent.steps
      restored, _ = ckpts.restore(step, state)
      params, opt_state = restored.params, restart_schedule(restored.opt_state)
    else:
      item = checkpoint.spec_item(parent.spec)
      trees = [ckpts.restore_params(step, state.params, item) for step in parent.steps]
      params = trees[0] if len(trees) == 1 else checkpoint.average_params(trees)
      opt_state = state.opt_state
  finally:
    ckpts.close()
  # The fresh tree's structure and dtypes, with the parent's values.
  params = jax.tree.map(lambda ref, x: np.asarray(x, dtype=ref.dtype), state.params, params)
  logging.info(
    "warm start from %s checkpoint(s) %s (%s)%s",
    parent.workdir,
    list(parent.steps),
    parent.spec,
    " with its optimizer state" if parent.keep_optimizer else "",
  )
  # A moving average starts at the parameters the run starts from.
  ema = None if state.ema is None else jax.tree.map(np.copy, params)
  return state.replace(params=params, opt_state=opt_state, ema=ema)
