"""A jax.profiler trace of chosen training steps (config.profile_steps='START,END').

The trace is written as flax's examples and t5x do: `jax.profiler.start_trace` before step
START runs, `stop_trace` once step END's results are ready, each step inside a
`StepTraceAnnotation` so that TensorBoard's profiler shows step boundaries. It lands in
<workdir>/tensorboard/plugins/profile/<time>/ (`<host>.xplane.pb` for TensorBoard's
profiler, `perfetto_trace.json.gz` for ui.perfetto.dev). Only process 0 traces: every
process runs the same program. Steps count from 1, as the progress lines do.
"""

import contextlib
from collections.abc import Iterator
from typing import Any

import jax
from absl import logging


def parse_steps(text: str) -> tuple[int, int] | None:
  """(START, END) of 'START,END' (1 <= START <= END); None for ''. Anything else is a
  ValueError naming config.profile_steps."""
  if not text:
    return None
  parts = [p.strip() for p in str(text).split(",")]
  if len(parts) != 2 or not all(p.isdigit() for p in parts):
    raise ValueError(
      f"config.profile_steps={text!r} must be 'START,END': the first and last step to trace "
      "(e.g. '10,12'), or '' for none"
    )
  start, end = int(parts[0]), int(parts[1])
  if not 1 <= start <= end:
    raise ValueError(f"config.profile_steps={text!r}: need 1 <= START <= END")
  return start, end


class StepProfiler:
  """Starts a trace before step `start` and stops it after step `end` (inclusive)."""

  def __init__(self, steps: tuple[int, int] | None, directory: str, enabled: bool) -> None:
    self.steps = steps if enabled else None
    self.directory = directory
    self.active = False
    self.done = False

  @contextlib.contextmanager
  def step(self, number: int) -> Iterator[None]:
    """Wraps the dispatch of step `number` (1-based)."""
    if self.steps is None:
      yield
      return
    start, end = self.steps
    if start <= number <= end and not (self.active or self.done):  # a resume may begin inside
      jax.profiler.start_trace(self.directory, create_perfetto_trace=True)
      self.active = True
    if not self.active:
      yield
      return
    with jax.profiler.StepTraceAnnotation("train", step_num=number):
      yield

  def finished(self, number: int, outputs: Any) -> None:
    """After step `number` was dispatched: at END, waits for its `outputs` and stops."""
    if self.active and number >= self.steps[1]:
      jax.block_until_ready(outputs)
      self.stop()

  def stop(self) -> None:
    """Ends a trace still running (training ended before END)."""
    if self.active:
      jax.profiler.stop_trace()
      self.active, self.done = False, True
      logging.info(
        "profile of steps %d-%d written under %s/plugins/profile (TensorBoard's profiler, "
        "or perfetto_trace.json.gz at ui.perfetto.dev)",
        *self.steps,
        self.directory,
      )
