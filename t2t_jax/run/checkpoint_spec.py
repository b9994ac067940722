"""Which checkpoints a --checkpoint choice names: 'latest', 'average:N', 'best[:N]', 'ema',
'selected', 'auto' or a step, from the step list, best.json and selected.json alone.

Nothing here reads a checkpoint or imports orbax (run.checkpoint does), so that a process
whose parameters are kept elsewhere (decoding.kept_params) names its errors without it.
"""

import os
from collections.abc import Sequence
from typing import Protocol

from t2t_jax.run.workdir import Workdir

# The spec of the moving average of the parameters kept by config.ema_decay, and its entry
# in the saved state.
EMA = "ema"


class CheckpointSpecError(ValueError):
  """A checkpoint choice ('latest', 'average:N', 'best[:N]', a step, 'selected') the workdir
  cannot meet."""


class Steps(Protocol):
  """What choosing steps reads of a workdir's checkpoints (run.checkpoint.Checkpoints)."""

  directory: str | os.PathLike
  workdir: Workdir

  def steps(self) -> list[int]: ...


def average_count(spec: str, what: str | None = None) -> int:
  """N of 'average:N'; anything but a positive integer is a CheckpointSpecError (its message
  starts with `what`, by default '--checkpoint=SPEC')."""
  what = what or f"--checkpoint={spec}"
  text = spec.split(":", 1)[1]
  if not text.isdigit() or int(text) < 1:
    raise CheckpointSpecError(
      f"{what}: N of average:N must be a positive integer (the number of latest "
      "checkpoints to average)"
    )
  return int(text)


def choose_steps(ckpts: "Steps", spec: str, what: str | None = None) -> list[int]:
  """'latest' -> [last]; 'average:N' -> the last N steps; 'best' -> [the best kept step by
  the dev metric]; 'best:N' -> the N best, best first; 'STEP' -> [STEP]. A spec the workdir
  cannot meet is a CheckpointSpecError whose message starts with `what` (by default
  '--checkpoint=SPEC': the flag the user wrote)."""
  what = what or f"--checkpoint={spec}"
  available = ckpts.steps()
  if not available:
    raise CheckpointSpecError(f"{ckpts.directory}: no checkpoint to translate with")
  if spec in ("latest", EMA):  # 'ema': the moving average kept in the latest checkpoint
    return available[-1:]
  if spec.startswith("average:"):
    n = average_count(spec, what)
    if n > len(available):
      raise CheckpointSpecError(
        f"{what}: {ckpts.directory} holds {len(available)} "
        f"checkpoint(s) {available}, fewer than {n}"
      )
    return available[-n:]
  if spec == "best" or spec.startswith("best:"):
    return best_steps(ckpts, spec, available, what)
  if spec.isdigit() and int(spec) in available:
    return [int(spec)]
  raise CheckpointSpecError(
    f"{what}: not 'latest', 'average:N', 'best', 'best:N', 'ema' or one of the steps "
    f"{available} in {ckpts.directory}"
  )


def best_steps(
  ckpts: "Steps", spec: str, available: Sequence[int], what: str | None = None
) -> list[int]:
  """The steps of 'best' (1) or 'best:N' (N), best first, from <workdir>/best.json (written
  by t2t-train when config.keep_best_checkpoints > 0)."""
  what = what or f"--checkpoint={spec}"
  n = 1
  if spec != "best":
    text = spec.split(":", 1)[1]
    if not text.isdigit() or int(text) < 1:
      raise CheckpointSpecError(
        f"{what}: N of best:N must be a positive integer (the number of best "
        "checkpoints to average)"
      )
    n = int(text)
  path = ckpts.workdir.best_file
  try:
    record = ckpts.workdir.read_best()
  except ValueError as e:
    raise CheckpointSpecError(f"{what}: {path} is not a best record: {e}") from None
  if record is None:
    raise CheckpointSpecError(
      f"{what}: {path} does not exist: the workdir has no record of its best "
      "checkpoints (t2t-train writes it at each dev evaluation)"
    )
  try:
    ranked = [int(entry["step"]) for entry in record["best"]]
    metric = record["metric"]
  except (KeyError, TypeError, ValueError):
    raise CheckpointSpecError(
      f"{what}: {path} is not a best record: no 'metric' and 'best' list"
    ) from None
  if not ranked:
    raise CheckpointSpecError(
      f"{what}: {path} records no best checkpoint (the run kept none: "
      "config.keep_best_checkpoints=0)"
    )
  if n > len(ranked):
    raise CheckpointSpecError(
      f"{what}: {path} records {len(ranked)} best checkpoint(s) {ranked} by "
      f"{metric}, fewer than {n} (config.keep_best_checkpoints sets how many are kept)"
    )
  missing = [step for step in ranked[:n] if step not in available]
  if missing:
    raise CheckpointSpecError(
      f"{what}: the best step(s) {missing} by {metric} recorded in {path} are "
      f"not among the usable checkpoints {list(available)} in {ckpts.directory}"
    )
  return ranked[:n]


def selected_spec(workdir: str, what: str = "--checkpoint=selected") -> str:
  """The checkpoint choice t2t-train made on dev (written to <workdir>/selected.json); a
  missing or broken file is a CheckpointSpecError whose message starts with `what`."""
  run_dir = Workdir(workdir)
  path = run_dir.selected_file
  try:
    record = run_dir.read_selection()
  except (OSError, ValueError) as e:
    raise CheckpointSpecError(f"{what}: {path} is not a selection file: {e}") from None
  if record is None:
    raise CheckpointSpecError(
      f"{what}: {path} does not exist (set config.select_checkpoints in training to write it)"
    )
  if not isinstance(record, dict) or "checkpoint" not in record:
    raise CheckpointSpecError(f"{what}: {path} is not a selection file: no 'checkpoint' entry")
  if not isinstance(record["checkpoint"], str):
    raise CheckpointSpecError(
      f"{what}: {path} is not a selection file: its 'checkpoint' entry "
      f"{record['checkpoint']!r} is not a checkpoint choice such as 'latest' or 'average:5'"
    )
  return record["checkpoint"]


def resolve_spec(workdir: str, spec: str) -> str:
  """'auto' (what t2t-train scored the test split with: 'selected' when it chose on dev,
  else 'latest') and 'selected' (<workdir>/selected.json's choice) as the spec they stand
  for; read before any model is built, so that a bad selection file is the first error."""
  if spec == "auto":
    spec = "selected" if Workdir(workdir).has_selection() else "latest"
  if spec == "selected":
    spec = selected_spec(workdir)
  return spec


def spec_item(spec: str) -> str:
  """The entry of the saved state a (resolved) checkpoint spec reads: the moving average of
  the parameters for 'ema', else the parameters."""
  return EMA if spec == EMA else "params"
