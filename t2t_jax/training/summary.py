"""Metrics for people and tools: a progress line, JSON lines, and TensorBoard events.

TensorBoard files come from tensorboardX (no TensorFlow needed). Only process 0 writes.
"""

import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from absl import logging

from t2t_jax.training import workdir as workdir_lib


class MetricsWriter:
  """Writes <workdir>/metrics.jsonl and <workdir>/tensorboard/ (process 0 only).

  Each record is one `write` of one line, so a kill leaves at most an incomplete last line.
  On a resume from step `resume_step`, records of later steps (logged by a run killed before
  it could save them) and an incomplete last line are dropped: training redoes those steps
  and logs them again, so every step has one record. TensorBoard is told the same
  (`purge_step`).
  """

  def __init__(self, workdir: str, enabled: bool = True, resume_step: int | None = None):
    self.enabled = enabled
    self.jsonl_path = os.path.join(workdir, "metrics.jsonl")
    self._tb = None
    if enabled:
      SummaryWriter = _summary_writer_class()
      if resume_step is not None:
        _drop_after(self.jsonl_path, resume_step)
      purge = resume_step + 1 if resume_step is not None else None
      self._tb = SummaryWriter(os.path.join(workdir, "tensorboard"), purge_step=purge)

  def write(self, step: int, scalars: dict[str, float]) -> None:
    if not self.enabled:
      return
    record = dict(step=int(step), time=time.time(), **{k: float(v) for k, v in scalars.items()})
    append_line(self.jsonl_path, json.dumps(record))
    for name, value in scalars.items():
      self._tb.add_scalar(name, float(value), int(step))
    self._tb.flush()

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()


def append_line(path: str, line: str) -> None:
  """Appends `line` and a newline with one write (a kill cannot interleave two records)."""
  with open(path, "a", encoding="utf-8") as f:
    f.write(line + "\n")


def _drop_after(path: str, step: int) -> None:
  if not os.path.exists(path):
    return
  records, complete = _parse(path)
  kept = [r for r in records if r["step"] <= step]
  if len(kept) == len(records) and complete:
    return
  workdir_lib.atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in kept))
  logging.info(
    "%s: dropped %d record(s) of steps after %d%s (training redoes those steps)",
    path,
    len(records) - len(kept),
    step,
    "" if complete else " and an incomplete last line",
  )


def _parse(path: str) -> tuple[list[dict[str, Any]], bool]:
  """(records, whether the last line was complete). A broken last line (a kill mid-write) is
  skipped; a broken line elsewhere is an error naming the file and line."""
  with open(path, encoding="utf-8", errors="replace") as f:
    lines = f.read().split("\n")
  tail = lines.pop()  # '' when the file ends with a newline
  records = []
  for number, line in enumerate(lines, start=1):
    if not line.strip():
      continue
    try:
      records.append(json.loads(line))
    except ValueError as e:
      if number == len(lines) and not tail:
        return records, False
      raise ValueError(f"{path}:{number}: not a JSON record ({e})") from None
  if tail.strip():
    try:
      records.append(json.loads(tail))
    except ValueError:
      return records, False
    return records, False
  return records, True


def read_metrics(workdir: str) -> list[dict[str, Any]]:
  """All records of a workdir's metrics.jsonl, in order (an incomplete last line, left by a
  kill mid-write, is skipped)."""
  return _parse(os.path.join(workdir, "metrics.jsonl"))[0]


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
  records = read_metrics(workdir)
  starts = [r for r in records if "train_start" in r]
  trained = [r for r in records if "loss" in r]
  out = dict(workdir=workdir, steps=trained[-1]["step"] if trained else 0)
  if starts and trained:
    out["train_minutes"] = (trained[-1]["time"] - starts[0]["time"]) / 60
    out["resumed"] = len(starts) > 1
  selected = os.path.join(workdir, "selected.json")
  if os.path.exists(selected):
    with open(selected, encoding="utf-8") as f:
      out["selected"] = json.load(f)
  tests = [r for r in records if "test_bleu" in r]
  if tests:
    out.update({k: v for k, v in tests[-1].items() if k.startswith("test_")})
  return out


def _row(s: dict[str, Any]) -> str:
  pick = s.get("selected", {})
  chosen = f"{pick['checkpoint']} (dev {pick['dev_bleu'][pick['checkpoint']]:.2f})" if pick else "-"
  minutes = f"{s['train_minutes']:.1f}" if "train_minutes" in s else "-"
  figure = lambda key: f"{s[key]:.2f}" if key in s else "-"
  scores = " | ".join(
    figure(f"test_{k}") for k in ("bleu", "tokenized_bleu", "lowercased_bleu", "chrf")
  )
  return f"| {s['workdir']} | {s['steps']} | {minutes} | {chosen} | {scores} |"


def main(argv: Sequence[str]) -> None:
  """python -m t2t_jax.training.summary WORKDIR... : one markdown row per finished run."""
  print(
    "| workdir | steps | training minutes | checkpoint (chosen on dev) | test sacreBLEU | "
    "tokenized BLEU | lowercased BLEU | chrF |"
  )
  print("|---|---|---|---|---|---|---|---|")
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
