"""Orbax checkpoints of the training state, the data-iterator state and the run's fingerprint.

Layout: <workdir>/checkpoints/<step>/{state,data,fingerprint}. Resume order (explicit): the
newest checkpoint in the workdir that restores, else a fresh start. Orbax writes a step to
`<step>.orbax-checkpoint-tmp-*` and renames it when complete (after writing its commit
marker), so a kill mid-save leaves a temporary directory that is never taken for a
checkpoint; the trainer removes those and says so. A step directory without the commit
marker, without an item its step metadata says was saved (a checkpoint without its data
position would restart the data order; one without its fingerprint would skip the
experiment check), or one that fails to restore, is reported by step and path, left where it
is (never deleted) and skipped. A checkpoint whose shapes differ from the model the config
builds is refused with the first mismatching parameter named; nothing in the workdir is
overwritten or deleted by a failed restore. Readers (t2t-translate, t2t-average's input,
t2t-export) create nothing: only a writer makes the checkpoint directory.
"""

import dataclasses
import json
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol, TypeVar

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from flax.typing import VariableDict

from t2t_jax.run.checkpoint_spec import (  # noqa: F401 (the choice of steps, re-exported)
  EMA,
  CheckpointSpecError,
  average_count,
  best_steps,
  choose_steps,
  resolve_spec,
  selected_spec,
  spec_item,
)
from t2t_jax.run.workdir import Workdir

STATE, DATA, FINGERPRINT = "state", "data", "fingerprint"
COMMIT_MARKER = "commit_success.txt"  # written by orbax into every finished step and item
TMP_MARKER = ".orbax-checkpoint-tmp"
# Orbax's record of a finished step: its "item_handlers" name every item the save wrote.
STEP_METADATA = "_CHECKPOINT_METADATA"


class CheckpointMismatchError(ValueError):
  """The checkpoint in the workdir does not fit the model the config builds."""


class CheckpointDamagedError(RuntimeError):
  """The workdir holds checkpoints, but none of them restores."""


class CheckpointSaveError(RuntimeError):
  """Writing a checkpoint failed (disk full, permissions); the earlier ones are intact."""


class TrainState(Protocol):
  """What a checkpoint saves of the trainer's state (training.steps.TrainState has it); named
  by shape so that reading checkpoints never imports the trainer."""

  step: Any
  params: VariableDict
  opt_state: Any
  rng: Any
  bad_step: Any

  def replace(self, **changes: Any) -> "TrainState": ...


State = TypeVar("State", bound=TrainState)


def state_tree(state: TrainState) -> dict[str, Any]:
  """The saved part of a TrainState (everything but the optimizer definition); the moving
  average of the parameters only when the run keeps one, so that a run without it saves
  what earlier versions saved."""
  tree = dict(
    step=state.step,
    params=state.params,
    opt_state=state.opt_state,
    rng=state.rng,
    bad_step=state.bad_step,
  )
  ema = getattr(state, EMA, None)  # a state type without the field keeps none
  if ema is not None:
    tree[EMA] = ema
  return tree


def missing_commit_markers(step_dir: str) -> list[str]:
  """The commit markers a finished orbax step directory has and `step_dir` lacks."""
  wanted = [os.path.join(step_dir, COMMIT_MARKER)] + [
    os.path.join(step_dir, item, COMMIT_MARKER)
    for item in sorted(os.listdir(step_dir))
    if os.path.isdir(os.path.join(step_dir, item))
  ]
  return [path for path in wanted if not os.path.exists(path)]


def missing_items(step_dir: str) -> list[str]:
  """The items `step_dir` lacks of those its save wrote: the ones its step metadata names
  (the trainer's saves: state, data, fingerprint; an averaged checkpoint: state and
  fingerprint), and `state`, which every checkpoint has. Without readable metadata, only
  `state` is required."""
  try:
    with open(os.path.join(step_dir, STEP_METADATA), encoding="utf-8") as f:
      handlers = json.load(f).get("item_handlers")
  except (OSError, ValueError, AttributeError):
    handlers = None
  saved = set(handlers) if isinstance(handlers, dict) else set()
  return [i for i in sorted(saved | {STATE}) if not os.path.isdir(os.path.join(step_dir, i))]


@dataclasses.dataclass(frozen=True)
class _CommittedSteps(ocp.path.step.NameFormat):
  """Orbax's standard step names, listing only committed steps not in `skip`: a damaged step
  is neither resumed from, nor counted among the kept checkpoints, nor pruned."""

  standard: ocp.path.step.NameFormat
  skip: set[int]

  def build_name(self, step: int) -> str:
    return self.standard.build_name(step)

  def _usable(self, metadata: ocp.path.step.Metadata) -> bool:
    path = str(metadata.path)
    return metadata.step not in self.skip and not (
      missing_commit_markers(path) or missing_items(path)
    )

  def find_all(self, base_path: str | os.PathLike) -> Iterator[ocp.path.step.Metadata]:
    return (m for m in self.standard.find_all(base_path) if self._usable(m))

  def find_step(self, base_path: str | os.PathLike, step: int) -> ocp.path.step.Metadata:
    metadata = self.standard.find_step(base_path, step)
    if not self._usable(metadata):
      raise ValueError(f"checkpoint step {step} in {base_path} is damaged or unfinished")
    return metadata


@dataclasses.dataclass
class _NewestAndProtected:
  """Orbax's pruning rule: keep the newest `n` checkpoints and every step in `protected`
  (the best ones by the dev metric, which recency alone would prune). `protected` is
  replaced whole, never mutated, so a background save's pruning reads a consistent set."""

  n: int | None
  protected: frozenset[int] = frozenset()

  def should_preserve(self, checkpoints: Sequence[Any], *, context: Any) -> list[bool]:
    newest = ocp.checkpoint_managers.LatestN(self.n).should_preserve(checkpoints, context=context)
    return [keep or info.step in self.protected for keep, info in zip(newest, checkpoints)]


def _first_line(error: BaseException) -> str:
  text = str(error).strip().splitlines()
  return f"{type(error).__name__}: {text[0] if text else ''}"[:300]


class Checkpoints:
  """Keeps the last `max_to_keep` checkpoints of a run and the steps given to `protect` (async
  saves, one writer per host).

  `owner=True` (the trainer, which holds the workdir lock) removes the temporary directories
  of saves that a kill interrupted; readers (t2t-translate, t2t-average) never touch them,
  since they may belong to a live run's save in progress. The checkpoint directory is made
  for the owner or with `create=True` (a new averaged workdir), never for a reader.
  """

  def __init__(
    self, workdir: str, max_to_keep: int = 5, owner: bool = False, create: bool = False
  ) -> None:
    self.workdir = Workdir(workdir)
    self.directory = self.workdir.checkpoint_dir
    self._keep = _NewestAndProtected(max_to_keep)
    self.skip: set[int] = set()
    self.pending: int | None = None
    self._why: dict[int, str] = {}
    if owner:
      self._report_unfinished()
    options = ocp.CheckpointManagerOptions(
      preservation_policy=self._keep,
      create=owner or create,
      cleanup_tmp_directories=owner,
      step_name_format=_CommittedSteps(ocp.path.step.standard_name_format(), self.skip),
    )
    handlers = {
      STATE: ocp.StandardCheckpointHandler(),
      DATA: ocp.JsonCheckpointHandler(),
      FINGERPRINT: ocp.JsonCheckpointHandler(),
    }
    self.manager = ocp.CheckpointManager(self.directory, options=options, item_handlers=handlers)

  def _report_unfinished(self) -> None:
    if not os.path.isdir(self.directory):
      return
    unfinished = sorted(n for n in os.listdir(self.directory) if TMP_MARKER in n)
    if unfinished:
      logging.warning(
        "removing %d unfinished checkpoint write(s) left in %s by an interrupted run "
        "(never complete, never used): %s",
        len(unfinished),
        self.directory,
        ", ".join(unfinished),
      )

  def path(self, step: int) -> str:
    return os.path.join(self.directory, str(step))

  def protect(self, steps: Sequence[int]) -> None:
    """Steps never pruned by recency (the best by the dev metric); replaces the previous set.
    Takes effect at the next save, where orbax prunes."""
    self._keep.protected = frozenset(int(s) for s in steps)

  @property
  def protected(self) -> frozenset[int]:
    return self._keep.protected

  def steps(self) -> list[int]:
    return sorted(self.manager.all_steps())

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def damaged(self) -> list[str]:
    """'step N at PATH: why' for every step directory that is not a usable checkpoint."""
    if not os.path.isdir(self.directory):
      return []
    out = []
    for name in sorted(os.listdir(self.directory), key=lambda n: (len(n), n)):
      path = os.path.join(self.directory, name)
      if not (name.isdigit() and os.path.isdir(path)):
        continue
      missing = missing_commit_markers(path)
      items = missing_items(path)
      if missing:
        out.append(f"step {name} at {path}: no commit marker {missing[0]} (unfinished write)")
      elif items:
        out.append(
          f"step {name} at {path}: no {items[0]} item ({os.path.join(path, items[0])} is "
          "missing, though the checkpoint was saved with it)"
        )
      elif int(name) in self.skip:
        out.append(f"step {name} at {path}: {self._why.get(int(name), 'does not restore')}")
    return out

  def save(
    self,
    step: int,
    state: TrainState,
    data_state: dict[str, Any] | None,
    fingerprint: dict[str, Any] | None = None,
  ) -> None:
    self.wait()  # orbax waits for the previous save anyway; its error must name its step
    self._move_aside(step)
    self.skip.discard(step)
    self._why.pop(step, None)
    items = {STATE: ocp.args.StandardSave(state_tree(state))}
    if data_state is not None:
      items[DATA] = ocp.args.JsonSave(data_state)
    if fingerprint is not None:
      items[FINGERPRINT] = ocp.args.JsonSave(fingerprint)
    self.pending = step
    try:
      self.manager.save(step, args=ocp.args.Composite(**items), force=True)
    except Exception as e:
      raise self._save_error(e) from e

  def _move_aside(self, step: int) -> None:
    """A damaged directory of the step about to be saved is renamed, never deleted."""
    path = self.path(step)
    if jax.process_index() != 0 or not os.path.exists(path):
      return
    target, n = f"{path}.damaged", 1
    while os.path.exists(target):
      n += 1
      target = f"{path}.damaged-{n}"
    os.rename(path, target)
    logging.warning("damaged checkpoint %s renamed to %s to save step %d anew", path, target, step)

  def _save_error(self, error: BaseException) -> CheckpointSaveError:
    step, self.pending = self.pending, None
    self.manager.reload()
    kept = self.steps()
    return CheckpointSaveError(
      f"saving checkpoint step {step} to {self.path(step)} failed ({_first_line(error)}); "
      f"nothing half-written is used: the complete checkpoints {kept} in {self.directory} "
      f"are intact, and a new run resumes from {kept[-1] if kept else 'scratch'}"
    )

  def check_for_errors(self) -> None:
    """Raises CheckpointSaveError if the save in flight has failed (it runs in the background)."""
    try:
      self.manager.check_for_errors()
    except Exception as e:
      raise self._save_error(e) from e

  def fingerprint(self, step: int) -> dict[str, Any] | None:
    """The fingerprint saved with checkpoint `step` (None: saved without one)."""
    return self._fingerprint(step, self.manager)

  def _fingerprint(self, step: int, manager: ocp.CheckpointManager) -> dict[str, Any] | None:
    if not os.path.isdir(os.path.join(self.path(step), FINGERPRINT)):
      return None
    return manager.restore(step, args=ocp.args.Composite(**{FINGERPRINT: ocp.args.JsonRestore()}))[
      FINGERPRINT
    ]

  def restore(self, step: int, state: State) -> tuple[State, dict[str, Any] | None]:
    """Restores into the structure of `state` (a host TrainState); returns (state, data)."""
    return self._restore(step, state, self.manager)

  def _restore(
    self, step: int, state: State, manager: ocp.CheckpointManager
  ) -> tuple[State, dict[str, Any] | None]:
    target = state_tree(state)
    self.check_shapes(step, target["params"])
    saved_ema = self._has_ema(step, manager)
    if saved_ema and EMA not in target:  # read (the saved tree must be matched) and dropped
      target[EMA] = target["params"]
    elif EMA in target and not saved_ema:
      logging.warning(
        "checkpoint %s holds no moving average of the parameters (trained without "
        "config.ema_decay): the average starts from its parameters",
        self.path(step),
      )
      del target[EMA]
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
    restored = manager.restore(
      step, args=ocp.args.Composite(**{STATE: ocp.args.StandardRestore(abstract)})
    )[STATE]
    if getattr(state, EMA, None) is None:
      restored.pop(EMA, None)
    elif EMA not in restored:
      restored[EMA] = jax.tree.map(np.copy, restored["params"])
    data_state = None
    if os.path.isdir(os.path.join(self.path(step), DATA)):
      data_state = manager.restore(step, args=ocp.args.Composite(**{DATA: ocp.args.JsonRestore()}))[
        DATA
      ]
    return state.replace(**restored), data_state

  def _local_reader(self) -> ocp.CheckpointManager:
    """A read-only manager over this process alone. Orbax's restore ends in a barrier of all
    processes, which a process whose read failed never reaches: the others would wait there
    while it tries an older step. Reading the host copy of the state needs no other process."""
    if jax.process_count() == 1:
      return self.manager
    me = jax.process_index()
    options = ocp.CheckpointManagerOptions(
      read_only=True,
      step_name_format=_CommittedSteps(ocp.path.step.standard_name_format(), self.skip),
      multiprocessing_options=ocp.options.MultiprocessingOptions(
        primary_host=me, active_processes={me}, barrier_sync_key_prefix=f"local{me}"
      ),
    )
    handlers = {STATE: ocp.StandardCheckpointHandler(), DATA: ocp.JsonCheckpointHandler()}
    handlers[FINGERPRINT] = ocp.JsonCheckpointHandler()
    return ocp.CheckpointManager(self.directory, options=options, item_handlers=handlers)

  def restore_newest(
    self,
    state: State,
    check: Callable[[int, dict | None], None],
    common: Callable[[Sequence[int]], Sequence[int]] | None = None,
  ) -> tuple[State, dict[str, Any] | None, int | None]:
    """(state, data_state, step) of the newest checkpoint that restores; (state, None, None)
    when the workdir has none. `check(step, fingerprint)` may refuse a checkpoint by raising.

    With several processes, every one must resume from the same step (else the replicas
    diverge, or one waits in a collective the others never enter): `common(steps)`, a
    collective, returns the steps every process still counts as readable. Each round, every
    process reads the newest common step on its own; one that fails drops it, and the next
    round's `common` tells the others. They stop together at the newest step that all have
    read. One process: `common` is the identity.

    Damaged checkpoints are reported and skipped (left in place); if there are checkpoints
    but none restores, raises CheckpointDamagedError naming every path.
    """
    for line in self.damaged():
      logging.warning("checkpoint %s; left in place and skipped", line)
    common = common or list
    reader = self._local_reader()
    readable = self.steps()
    restored: dict[int, tuple[State, dict[str, Any] | None]] = {}
    try:
      while shared := sorted(common(readable)):
        step = shared[-1]
        if step in restored:
          newer = [s for s in readable if s > step]
          if newer:
            logging.warning(
              "checkpoint step(s) %s in %s restore on this process but not on every one; "
              "every process resumes from step %d",
              newer,
              self.directory,
              step,
            )
          return (*restored[step], step)
        try:
          saved = self._fingerprint(step, reader)
        except Exception as e:  # a damaged checkpoint raises whatever its reader meets
          self._skip(step, e)
          readable.remove(step)
          continue
        check(step, saved)
        try:
          restored[step] = self._restore(step, state, reader)
        except CheckpointMismatchError:
          raise
        except Exception as e:
          # Orbax closes its event loop at the first read that fails and leaves the step's
          # other reads running: as they end, Python may print "Event loop is closed" and
          # "Exception ignored in: <coroutine ...>" tracebacks to stderr. They only read
          # this step, which is skipped (tests/test_faults.py, OrbaxStrays).
          self._skip(step, e)
          readable.remove(step)
    finally:
      if reader is not self.manager:
        reader.close()
    damaged = self.damaged()
    if damaged:
      raise CheckpointDamagedError(
        f"no checkpoint in {self.directory} restores: {'; '.join(damaged)}. They are left in "
        "place: move them away to start from scratch, or repair them"
      )
    return state, None, None

  def _skip(self, step: int, error: BaseException) -> None:
    self._why[step] = _first_line(error)
    logging.warning(
      "checkpoint step %d at %s does not restore (%s); left in place; trying an older one",
      step,
      self.path(step),
      self._why[step],
    )
    self.skip.add(step)
    self.manager.reload()

  def restore_params(
    self, step: int, params_like: VariableDict | None = None, item: str = "params"
  ) -> VariableDict:
    """The parameters of checkpoint `step` as numpy (shape-checked against `params_like`);
    `item=EMA`: their moving average instead (CheckpointSpecError if the run kept none).

    Only the parameters are read: a training checkpoint also holds Adam's two moments, twice
    the parameters' bytes, which translating, averaging and warm starts never use. The
    state item is read with orbax's PyTree handler (what its StandardSave wrote), whose
    partial restore the manager's Standard handler does not offer."""
    saved = self._saved_params(step)
    if params_like is not None:
      self.check_shapes(step, params_like, saved)
    if item == EMA and not self._has_ema(step, self.manager):
      raise CheckpointSpecError(
        f"--checkpoint={EMA}: checkpoint {self.path(step)} holds no moving average of the "
        "parameters (the run was trained with config.ema_decay=0; train with "
        "--config.ema_decay=0.999, say, to keep one)"
      )
    abstract = {item: saved}
    restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), abstract)
    restored = ocp.PyTreeCheckpointer().restore(
      os.path.join(self.path(step), STATE),
      args=ocp.args.PyTreeRestore(item=abstract, restore_args=restore_args, partial_restore=True),
    )
    return restored[item]

  def _has_ema(self, step: int, manager: ocp.CheckpointManager) -> bool:
    """Whether checkpoint `step` holds a moving average of the parameters."""
    meta = manager.item_metadata(step)[STATE]
    return EMA in getattr(meta, "tree", meta)

  def has_optimizer_state(self, step: int) -> bool:
    """Whether checkpoint `step` holds Adam's moments (t2t-average's output holds only the
    parameters)."""
    meta = self.manager.item_metadata(step)[STATE]
    return "opt_state" in getattr(meta, "tree", meta)

  def _saved_params(self, step: int) -> Any:
    """The metadata tree (shapes, dtypes) of checkpoint `step`'s parameters."""
    meta = self.manager.item_metadata(step)[STATE]
    return getattr(meta, "tree", meta)["params"]

  def check_shapes(self, step: int, params_like: VariableDict, saved: Any = None) -> None:
    """Raises CheckpointMismatchError naming the first parameter whose shape differs
    (`saved`: the step's `_saved_params`, when already read)."""
    saved = _shapes(self._saved_params(step) if saved is None else saved)
    wanted = _shapes(params_like)
    where = os.path.join(self.directory, str(step))
    for name in sorted(set(saved) | set(wanted)):
      if saved.get(name) != wanted.get(name):
        raise CheckpointMismatchError(
          f"checkpoint {where} does not fit the configured model: parameter {name} is "
          f"{saved.get(name, 'absent')} in the checkpoint but {wanted.get(name, 'absent')} "
          "in the model. Use a new --workdir for a different model (nothing was changed)."
        )

  def wait(self) -> None:
    """Waits for the save in flight; raises CheckpointSaveError if it failed."""
    try:
      self.manager.wait_until_finished()
    except Exception as e:
      raise self._save_error(e) from e
    self.pending = None

  def close(self) -> None:
    self.manager.close()


def _shapes(tree: VariableDict) -> dict[str, tuple[int, ...]]:
  flat = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {
    jax.tree_util.keystr(path): tuple(np.shape(leaf) if not hasattr(leaf, "shape") else leaf.shape)
    for path, leaf in flat
  }


def average_params(param_trees: Sequence[VariableDict]) -> VariableDict:
  """Element-wise mean of parameter trees (accumulated in float64, cast back)."""
  if not param_trees:
    raise ValueError("nothing to average")
  total = jax.tree.map(lambda x: np.asarray(x, np.float64), param_trees[0])
  for tree in param_trees[1:]:
    total = jax.tree.map(lambda a, b: a + np.asarray(b, np.float64), total, tree)
  return jax.tree.map(
    lambda a, ref: (a / len(param_trees)).astype(np.asarray(ref).dtype), total, param_trees[0]
  )


def write_averaged_workdir(
  workdir: str, steps: Sequence[int], output: str, item: str = "params"
) -> str:
  """Averages the parameters of `steps` into a new workdir usable by t2t-translate.

  The output holds config.json, the vocabulary files and one checkpoint (named after the
  last averaged step) with only the parameters (`item=EMA`: the steps' moving averages of
  them). Refuses to write into an existing
  checkpoint directory, so nothing is overwritten.
  """
  source = Checkpoints(workdir)
  params = average_params([source.restore_params(step, item=item) for step in steps])
  target_dir = Workdir(output).checkpoint_dir
  if os.path.exists(target_dir) and os.listdir(target_dir):
    raise FileExistsError(f"{target_dir} already holds checkpoints; choose a new --output")
  Workdir(workdir).copy_model_files(output)
  out = Checkpoints(output, max_to_keep=1, create=True)
  items = {STATE: ocp.args.StandardSave({"params": params})}
  fingerprint = source.fingerprint(max(steps))
  if fingerprint is not None:  # t2t-translate checks the vocabulary against it
    items[FINGERPRINT] = ocp.args.JsonSave(fingerprint)
  out.manager.save(max(steps), args=ocp.args.Composite(**items), force=True)
  out.wait()
  return os.path.join(target_dir, str(max(steps)))


def load_params(
  workdir: str, spec: str, params_like: VariableDict | None
) -> tuple[VariableDict, list[int]]:
  """Parameters for a checkpoint spec (see `choose_steps`; also 'selected' and 'auto'), with
  the steps they came from; several steps are averaged (the paper's checkpoint averaging);
  'ema' reads the latest checkpoint's moving average of the parameters."""
  spec = resolve_spec(workdir, spec)
  ckpts = Checkpoints(workdir)
  chosen = choose_steps(ckpts, spec)
  trees = [ckpts.restore_params(step, params_like, spec_item(spec)) for step in chosen]
  return (trees[0] if len(trees) == 1 else average_params(trees)), chosen
