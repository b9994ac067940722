"""Metrics for people and tools: a progress line, JSON lines, and TensorBoard events.

TensorBoard files come from tensorboardX (no TensorFlow needed). Only process 0 writes.
"""

import sys
import time
from collections.abc import Sequence
from typing import Any

from absl import logging

from t2t_jax.run.workdir import Workdir


class MetricsWriter:
  """Writes <workdir>/metrics.jsonl and <workdir>/tensorboard/ (process 0 only).

  Each record is one `write` of one line, so a kill leaves at most an incomplete last line.
  On a resume from step `resume_step`, records of later steps (logged by a run killed before
  it could save them) and an incomplete last line are dropped: training redoes those steps
  and logs them again, so every step has one record. TensorBoard is told the same
  (`purge_step`). `resume_step=0` is a fresh start (no checkpoint to resume from): the logs
  of earlier runs in the workdir are moved to <workdir>/before-<time>/, never truncated.
  """

  def __init__(self, workdir: str, enabled: bool = True, resume_step: int | None = None):
    self.enabled = enabled
    self.workdir = Workdir(workdir)
    self.jsonl_path = self.workdir.metrics_file
    self._tb = None
    if enabled:
      SummaryWriter = _summary_writer_class()
      if resume_step == 0:
        _set_aside(self.workdir)
      elif resume_step is not None:
        _drop_after(self.workdir, resume_step)
      purge = resume_step + 1 if resume_step else None
      self._tb = SummaryWriter(self.workdir.tensorboard_dir, purge_step=purge)

  def write(self, step: int, scalars: dict[str, float]) -> None:
    if not self.enabled:
      return
    record = dict(step=int(step), time=time.time(), **{k: float(v) for k, v in scalars.items()})
    self.workdir.append_metrics(record)
    for name, value in scalars.items():
      self._tb.add_scalar(name, float(value), int(step))
    self._tb.flush()

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()


def _set_aside(workdir: Workdir) -> None:
  moved = workdir.set_aside_earlier_run()
  if moved is not None:
    logging.warning(
      "starting from scratch in %s, which holds the logs of an earlier run: moved %s to %s "
      "(nothing deleted)",
      workdir.path,
      ", ".join(moved[1]),
      moved[0],
    )


def _drop_after(workdir: Workdir, step: int) -> None:
  dropped = workdir.drop_metrics_after(step)
  if dropped is None:
    return
  count, incomplete = dropped
  logging.info(
    "%s: dropped %d record(s) of steps after %d%s (training redoes those steps)",
    workdir.metrics_file,
    count,
    step,
    " and an incomplete last line" if incomplete else "",
  )


def format_duration(seconds: float) -> str:
  seconds = int(max(seconds, 0))
  h, rest = divmod(seconds, 3600)
  m, s = divmod(rest, 60)
  return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


def progress_line(
  step: int,
  total: int,
  train: dict[str, float],
  steps_per_s: float,
  tokens_per_s: float,
  num_devices: int,
  eval_metrics: dict[str, float] | None = None,
) -> str:
  """'step 200/2000 (10%) | loss 2.31 | lr 4.4e-04 | 51.2k tok/s (6.4k/device) | ...'."""
  eta = (total - step) / steps_per_s if steps_per_s > 0 else float("nan")
  line = (
    f"step {step}/{total} ({100 * step / total:.0f}%) | loss {train['loss']:.4f} | "
    f"lr {train['learning_rate']:.3g} | {tokens_per_s / 1e3:.1f}k tok/s "
    f"({tokens_per_s / num_devices / 1e3:.2f}k/device) | {steps_per_s:.2f} steps/s | "
    f"ETA {format_duration(eta)}"
  )
  if eval_metrics and "eval_loss" in eval_metrics:
    line += f" | dev loss {eval_metrics['eval_loss']:.4f} acc {eval_metrics['eval_accuracy']:.3f}"
  if eval_metrics and "dev_bleu" in eval_metrics:
    line += f" | dev BLEU {eval_metrics['dev_bleu']:.2f}"
  if eval_metrics and "dev_f1" in eval_metrics:
    line += f" | dev F1 {eval_metrics['dev_f1']:.2f}"
  return line


def log(line: str) -> None:
  logging.info(line)


def run_summary(workdir: str) -> dict[str, Any]:
  """What a finished run reports: steps, training wall time (from the loop's start to the
  last training record, evaluations included, the final test excluded), the checkpoint
  chosen on dev (selected.json) and the last test scores."""
  records = Workdir(workdir).read_metrics()
  starts = [r for r in records if "train_start" in r]
  trained = [r for r in records if "loss" in r]
  out = dict(workdir=workdir, steps=trained[-1]["step"] if trained else 0)
  if starts and trained:
    out["train_minutes"] = (trained[-1]["time"] - starts[0]["time"]) / 60
    out["resumed"] = len(starts) > 1
  selected = Workdir(workdir).read_selection()
  if selected is not None:
    out["selected"] = selected
  tests = [r for r in records if "test_bleu" in r or "test_f1" in r]  # translation, parsing
  if tests:
    out.update({k: v for k, v in tests[-1].items() if k.startswith("test_")})
  return out


def _row(s: dict[str, Any]) -> str:
  pick = s.get("selected", {})
  chosen = "-"
  if pick:
    metric, scores = Workdir.selection_scores(pick)
    label = {"dev_bleu": "BLEU", "dev_f1": "F1"}.get(metric, metric)
    chosen = f"{pick['checkpoint']} (dev {label} {scores[pick['checkpoint']]:.2f})"
  minutes = f"{s['train_minutes']:.1f}" if "train_minutes" in s else "-"
  figure = lambda key: f"{s[key]:.2f}" if key in s else "-"
  scores = " | ".join(
    figure(f"test_{k}") for k in ("bleu", "tokenized_bleu", "lowercased_bleu", "chrf", "f1")
  )
  return f"| {s['workdir']} | {s['steps']} | {minutes} | {chosen} | {scores} |"


def main(argv: Sequence[str]) -> None:
  """python -m t2t_jax.training.summary WORKDIR... : one markdown row per finished run."""
  print(
    "| workdir | steps | training minutes | checkpoint (chosen on dev) | test sacreBLEU | "
    "tokenized BLEU | lowercased BLEU | chrF | bracket F1 (parsing) |"
  )
  print("|---|---|---|---|---|---|---|---|---|")
  for workdir in argv[1:]:
    print(_row(run_summary(workdir)))


if __name__ == "__main__":
  import sys

  main(sys.argv)


def _summary_writer_class() -> type:
  """tensorboardX's SummaryWriter, imported without torch: tensorboardX imports torch, where it
  is installed, only to accept torch tensors (seconds at every start; we log floats). A torch
  already imported is left as it is."""
  if "torch" in sys.modules:
    from tensorboardX import SummaryWriter

    return SummaryWriter
  sys.modules["torch"] = None  # makes `import torch` raise ImportError, which it catches
  try:
    from tensorboardX import SummaryWriter
  finally:
    del sys.modules["torch"]
  return SummaryWriter
