"""Orbax checkpoints of the training state and the data-iterator state.

Layout: <workdir>/checkpoints/<step>/{state,data}. Resume order (explicit): the latest
checkpoint in the workdir, else a fresh start. A checkpoint whose shapes differ from the
model the config builds is refused with the first mismatching parameter named; nothing in
the workdir is overwritten or deleted by a failed restore.
"""

import json
import os
import shutil
from collections.abc import Sequence

import jax
import numpy as np
import orbax.checkpoint as ocp

STATE, DATA = "state", "data"


class CheckpointMismatchError(ValueError):
  """The checkpoint in the workdir does not fit the model the config builds."""


class CheckpointSpecError(ValueError):
  """A checkpoint choice ('latest', 'average:N', a step, 'selected') the workdir cannot meet."""


def state_tree(state) -> dict:
  """The saved part of a TrainState (everything but the optimizer definition)."""
  return dict(
    step=state.step,
    params=state.params,
    opt_state=state.opt_state,
    rng=state.rng,
    bad_step=state.bad_step,
  )


class Checkpoints:
  """Keeps the last `max_to_keep` checkpoints of a run (async saves, one writer per host)."""

  def __init__(self, workdir: str, max_to_keep: int = 5):
    self.directory = os.path.abspath(os.path.join(workdir, "checkpoints"))
    options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True)
    handlers = {STATE: ocp.StandardCheckpointHandler(), DATA: ocp.JsonCheckpointHandler()}
    self.manager = ocp.CheckpointManager(self.directory, options=options, item_handlers=handlers)

  def steps(self) -> list:
    return sorted(self.manager.all_steps())

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, step: int, state, data_state: dict | None) -> None:
    items = {STATE: ocp.args.StandardSave(state_tree(state))}
    if data_state is not None:
      items[DATA] = ocp.args.JsonSave(data_state)
    self.manager.save(step, args=ocp.args.Composite(**items), force=True)

  def restore(self, step: int, state):
    """Restores into the structure of `state` (a host TrainState); returns (state, data)."""
    target = state_tree(state)
    self.check_shapes(step, target["params"])
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
    restored = self.manager.restore(
      step, args=ocp.args.Composite(**{STATE: ocp.args.StandardRestore(abstract)})
    )[STATE]
    data_state = None
    if os.path.isdir(os.path.join(self.directory, str(step), DATA)):
      data_state = self.manager.restore(
        step, args=ocp.args.Composite(**{DATA: ocp.args.JsonRestore()})
      )[DATA]
    return state.replace(**restored), data_state

  def restore_params(self, step: int, params_like=None):
    """The parameters of checkpoint `step` as numpy (shape-checked against `params_like`)."""
    if params_like is not None:
      self.check_shapes(step, params_like)
    restored = self.manager.restore(
      step, args=ocp.args.Composite(**{STATE: ocp.args.StandardRestore()})
    )
    return restored[STATE]["params"]

  def check_shapes(self, step: int, params_like) -> None:
    """Raises CheckpointMismatchError naming the first parameter whose shape differs."""
    meta = self.manager.item_metadata(step)[STATE]
    meta = getattr(meta, "tree", meta)
    saved = _shapes(meta["params"])
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
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.close()


def _shapes(tree) -> dict:
  flat = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {
    jax.tree_util.keystr(path): tuple(np.shape(leaf) if not hasattr(leaf, "shape") else leaf.shape)
    for path, leaf in flat
  }


def average_params(param_trees: Sequence) -> dict:
  """Element-wise mean of parameter trees (accumulated in float64, cast back)."""
  if not param_trees:
    raise ValueError("nothing to average")
  total = jax.tree.map(lambda x: np.asarray(x, np.float64), param_trees[0])
  for tree in param_trees[1:]:
    total = jax.tree.map(lambda a, b: a + np.asarray(b, np.float64), total, tree)
  return jax.tree.map(
    lambda a, ref: (a / len(param_trees)).astype(np.asarray(ref).dtype), total, param_trees[0]
  )


def write_averaged_workdir(workdir: str, steps: Sequence[int], output: str) -> str:
  """Averages the parameters of `steps` into a new workdir usable by t2t-translate.

  The output holds config.json, the vocabulary files and one checkpoint (named after the
  last averaged step) with only the parameters. Refuses to write into an existing
  checkpoint directory, so nothing is overwritten.
  """
  source = Checkpoints(workdir)
  params = average_params([source.restore_params(step) for step in steps])
  target_dir = os.path.join(output, "checkpoints")
  if os.path.exists(target_dir) and os.listdir(target_dir):
    raise FileExistsError(f"{target_dir} already holds checkpoints; choose a new --output")
  os.makedirs(output, exist_ok=True)
  for name in os.listdir(workdir):
    if name == "config.json" or name.startswith("vocab."):
      shutil.copy2(os.path.join(workdir, name), os.path.join(output, name))
  out = Checkpoints(output, max_to_keep=1)
  out.manager.save(
    max(steps),
    args=ocp.args.Composite(**{STATE: ocp.args.StandardSave({"params": params})}),
    force=True,
  )
  out.wait()
  return os.path.join(target_dir, str(max(steps)))


def choose_steps(ckpts: Checkpoints, spec: str) -> list[int]:
  """'latest' -> [last]; 'average:N' -> the last N steps; 'STEP' -> [STEP]."""
  available = ckpts.steps()
  if not available:
    raise CheckpointSpecError(f"{ckpts.directory}: no checkpoint to translate with")
  if spec == "latest":
    return available[-1:]
  if spec.startswith("average:"):
    n = int(spec.split(":", 1)[1])
    if n < 1 or n > len(available):
      raise CheckpointSpecError(
        f"--checkpoint={spec}: {ckpts.directory} holds {len(available)} "
        f"checkpoint(s) {available}, fewer than {n}"
      )
    return available[-n:]
  if spec.isdigit() and int(spec) in available:
    return [int(spec)]
  raise CheckpointSpecError(
    f"--checkpoint={spec}: not 'latest', 'average:N' or one of the steps "
    f"{available} in {ckpts.directory}"
  )


SELECTED_FILE = "selected.json"


def selected_spec(workdir: str) -> str:
  """The checkpoint choice t2t-train made on dev (written to <workdir>/selected.json)."""
  path = os.path.join(workdir, SELECTED_FILE)
  try:
    with open(path) as f:
      return json.load(f)["checkpoint"]
  except FileNotFoundError:
    raise CheckpointSpecError(
      f"--checkpoint=selected: {path} does not exist (set "
      "config.select_checkpoints in training to write it)"
    ) from None
  except (ValueError, KeyError) as e:
    raise CheckpointSpecError(
      f"--checkpoint=selected: {path} is not a selection file: {e}"
    ) from None


def load_params(workdir: str, spec: str, params_like) -> tuple[dict, list[int]]:
  """Parameters for a checkpoint spec (see `choose_steps`; also 'selected' and 'auto'), with
  the steps they came from; several steps are averaged (the paper's checkpoint averaging)."""
  if spec == "auto":  # what t2t-train scored the test split with, when it chose on dev
    has_choice = os.path.exists(os.path.join(workdir, SELECTED_FILE))
    spec = "selected" if has_choice else "latest"
  if spec == "selected":
    spec = selected_spec(workdir)
  ckpts = Checkpoints(workdir)
  chosen = choose_steps(ckpts, spec)
  trees = [ckpts.restore_params(step, params_like) for step in chosen]
  return (trees[0] if len(trees) == 1 else average_params(trees)), chosen
