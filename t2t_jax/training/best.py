"""The best checkpoints by a dev metric, and early stopping.

The maths is one pure fold, `standing(history, ...)`: from the (step, value) of every
evaluation of the best metric so far it gives the `keep` best evaluations (kept apart from the
newest checkpoints, never pruned by recency), the evaluations since the last improvement of at
least `min_delta`, and the step at which `patience` such evaluations ran out (the early stop).

`Tracker` holds the history of a run and writes it to <workdir>/best.json (run.workdir) before
the checkpoint of the same step, so a resume from checkpoint S folds the evaluations of steps
<= S again and reaches the state the uninterrupted run had at S: a killed and resumed run stops
at the same step as one never interrupted.
"""

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import ml_collections

from t2t_jax.evaluation import evaluate
from t2t_jax.run.workdir import Workdir

# The metrics a run can rank by, as logged to metrics.jsonl, and which way is better.
MODES = {"eval_loss": "min", "dev_bleu": "max", "dev_f1": "max"}
CHOICES = ("auto", *MODES)

Evaluation = tuple[int, float]  # (step, value)


def resolve_metric(config: ml_collections.ConfigDict) -> str:
  """config.best_metric, with 'auto' read as the task's dev score when one is computed
  (bleu_every_steps > 0: dev BLEU, parsing dev F1), else the dev loss (always evaluated)."""
  if config.best_metric != "auto":
    return config.best_metric
  if not config.bleu_every_steps:
    return "eval_loss"
  return "dev_f1" if evaluate.is_parsing(config.data) else "dev_bleu"


def check_config(config: ml_collections.ConfigDict) -> None:
  """ValueError naming the field for a best metric, patience or min_delta that cannot work."""
  if config.best_metric not in CHOICES:
    raise ValueError(
      f"config.best_metric={config.best_metric!r} is not one of {', '.join(CHOICES)}"
    )
  for field in ("keep_best_checkpoints", "patience"):
    value = config[field]
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
      raise ValueError(f"config.{field}={value!r} must be an integer >= 0 (0: off)")
  delta = config.min_delta
  if not isinstance(delta, int | float) or not math.isfinite(delta) or delta < 0:
    raise ValueError(f"config.min_delta={delta!r} must be a number >= 0")
  metric = resolve_metric(config)
  if metric == "eval_loss":
    return
  scored = "dev_f1" if evaluate.is_parsing(config.data) else "dev_bleu"
  if metric != scored:
    raise ValueError(
      f"config.best_metric={metric}: this experiment's dev score is {scored} "
      f"({'a parsing task' if scored == 'dev_f1' else 'a translation task'})"
    )
  if not config.bleu_every_steps:
    raise ValueError(
      f"config.best_metric={metric} is computed every config.bleu_every_steps steps, which "
      "is 0 (off): set config.bleu_every_steps > 0, or rank by eval_loss"
    )


def improves(value: float, reference: float, mode: str, min_delta: float) -> bool:
  """Whether `value` is better than `reference` by more than nothing and by at least
  `min_delta` (lower for 'min', higher for 'max')."""
  gain = reference - value if mode == "min" else value - reference
  return gain > 0 and gain >= min_delta


@dataclasses.dataclass(frozen=True)
class Standing:
  """Where a run stands after its evaluations (see `standing`)."""

  best: tuple[Evaluation, ...]  # the `keep` best evaluations, best first (ties: earlier)
  reference: Evaluation | None  # the last evaluation that improved by >= min_delta
  since: int  # evaluations after `reference` that did not
  stopped_at: int | None  # the step of the evaluation at which patience ran out

  @property
  def best_steps(self) -> list[int]:
    return [step for step, _ in self.best]


def standing(
  history: Sequence[Evaluation], mode: str, keep: int, patience: int, min_delta: float
) -> Standing:
  """Folds the evaluations (in step order) into the best `keep` and the early stop.

  The first evaluation sets the reference; each later one either improves on it by at least
  `min_delta` (it becomes the reference, the count restarts) or counts one evaluation
  without improvement; the `patience`-th in a row stops the run there (0: never).
  """
  reference, since, stopped_at = None, 0, None
  for step, value in history:
    if reference is None or improves(value, reference[1], mode, min_delta):
      reference, since = (step, value), 0
    else:
      since += 1
      if patience and since >= patience:
        stopped_at = step
        break
  sign = 1.0 if mode == "min" else -1.0
  ranked = sorted(history, key=lambda e: (sign * e[1], e[0]))
  return Standing(tuple(ranked[:keep]), reference, since, stopped_at)


class MetricChangedError(ValueError):
  """best.json ranks by another metric than this start's config.best_metric resolves to."""


class Tracker:
  """The evaluations of the best metric of one run, kept in <workdir>/best.json.

  `write` is False on every process but 0 (they all fold the same metrics, so they agree on
  the best steps to protect and on the stop; only one writes the file). `read` is False for
  a run that starts at step 0: a best.json there is an earlier run's, which the metrics
  writer sets aside, and ranks nothing of this run.
  """

  def __init__(
    self,
    config: ml_collections.ConfigDict,
    workdir: str,
    write: bool = True,
    read: bool = True,
  ):
    self.metric = resolve_metric(config)
    self.mode = MODES[self.metric]
    self.keep = config.keep_best_checkpoints
    self.patience = config.patience
    self.min_delta = float(config.min_delta)
    self.workdir = Workdir(workdir)
    self.write = write
    self.history: list[Evaluation] = []
    record = self._read() if read else None
    if record is not None:
      if record.get("metric") != self.metric:
        raise MetricChangedError(
          f"config.best_metric resolves to {self.metric} (config.best_metric="
          f"{config.best_metric!r}), but {self.workdir.best_file} ranks this run's "
          f"checkpoints by {record.get('metric')!r}: set config.best_metric="
          f"{record.get('metric')}, or move that file aside to rank anew (its best "
          "checkpoints are then kept by recency only)"
        )
      self.history = [(int(s), float(v)) for s, v in record.get("history", [])]
    self.standing = self._fold()

  def _read(self) -> dict[str, Any] | None:
    try:
      return self.workdir.read_best()
    except ValueError as e:
      raise MetricChangedError(f"{e}: move it aside to rank this run's checkpoints anew") from None

  def _fold(self) -> Standing:
    return standing(self.history, self.mode, self.keep, self.patience, self.min_delta)

  def rewind(self, step: int) -> Standing:
    """Forgets the evaluations after checkpoint `step` (a resume from it does them again)."""
    kept = [e for e in self.history if e[0] <= step]
    if kept != self.history:
      self.history = kept
      self._save()
    self.standing = self._fold()
    return self.standing

  def add(self, step: int, metrics: Mapping[str, float]) -> Standing | None:
    """Records the evaluation of `step` if `metrics` holds the best metric; the new standing
    (None: not evaluated at this step). Written before the step's checkpoint."""
    if self.metric not in metrics:
      return None
    value = float(metrics[self.metric])
    if not math.isfinite(value):  # no ranking; a NaN loss stops the run anyway
      return None
    self.history = [e for e in self.history if e[0] < step] + [(step, value)]
    self.standing = self._fold()
    self._save()
    return self.standing

  def record(self) -> dict[str, Any]:
    """best.json: what readers (t2t-translate --checkpoint=best) and people need."""
    s = self.standing
    stopped = None
    if s.stopped_at is not None and s.reference is not None:
      stopped = dict(step=s.stopped_at, best_step=s.reference[0], best_value=s.reference[1])
    return dict(
      metric=self.metric,
      mode=self.mode,
      best=[dict(step=step, value=value) for step, value in s.best],
      history=[[step, value] for step, value in self.history],
      patience=self.patience,
      min_delta=self.min_delta,
      evaluations_since_improvement=s.since,
      stopped=stopped,
    )

  def _save(self) -> None:
    if self.write:
      self.workdir.write_best(self.record())

  def stop_line(self) -> str:
    """Why the run stopped (the standing must have a stop)."""
    s = self.standing
    step, value = s.reference
    return (
      f"early stop at step {s.stopped_at}: {self.metric} has not improved on {value:.4f} "
      f"(step {step}) by at least min_delta={self.min_delta:g} for {self.patience} "
      f"evaluation(s) (patience)"
    )
