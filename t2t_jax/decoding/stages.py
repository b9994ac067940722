"""The host side of a search: `run_in_stages` steps a batch in jitted stages and, between
them, drops finished rows (halving the batch) and grows the self-attention cache, as
CTranslate2 does step by step. `Schedule` is the one place that decides which move follows
a stage, for `run_in_stages` and for the warm-up that compiles every program it can reach.
"""

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np


class Stages(NamedTuple):
  """What `run_in_stages` needs of a search, each a (jitted) function of its rows' state.

  The rows' state is any pytree whose non-scalar leaves have leading dim rows (the search
  state with its cache, plus per-row inputs such as limits and prefixes) and that holds
  the scalar step.
  """

  run: Callable[[Any, int, int], tuple[Any, jax.Array, jax.Array, tuple[jax.Array, ...]]]
  # (rows, bound, until) -> (rows, step, done, outputs): steps until step == bound (the
  # cache's positions) or at most `until` rows are not done; then the scalar step, bool
  # [rows] whose results are final, and every row's results so far (leading dim rows)
  take: Callable[[Any, jax.Array, int | None], Any]  # (rows, keep int32 [n], length) ->
  # those rows in order, the cache grown to `length` positions (None: as it is)
  resize: Callable[[Any, int], Any] | None  # (rows, n) -> the cache grown to n positions
  first: Callable[[Any, int, int], tuple] | None = None  # the first stage, as `run`, from


@dataclasses.dataclass
class StageStats:
  """What a staged search did, summed over calls (docs/performance.md): rows stepped times
  steps (padding and done rows included; times beam_size: hypothesis-steps), stages run,
  and how often the batch was compacted and the cache grown."""

  row_steps: int = 0
  stages: int = 0
  compactions: int = 0
  resizes: int = 0


def power_of_two_at_least(n: int) -> int:
  return 1 << max(n - 1, 0).bit_length()


def compacted_size(running: int, min_rows: int) -> int:
  """The rows `run_in_stages` gathers `running` unfinished rows into: the next power of two,
  at least min_rows (padded with done rows)."""
  return max(power_of_two_at_least(running), min_rows)


def until_of(size: int, min_rows: int) -> int:
  """A stage of `size` rows stops once at most this many rows run (0: only at its bound or
  the end): half of them, so that at least half of the rows stepped are running; a batch
  of min_rows or fewer is never compacted."""
  return size // 2 if size > min_rows else 0


def compacted_segment(bounds: Sequence[int], segment: int, compacted_bound: int) -> int:
  """The segment of `bounds` a batch compacted in `segment` continues in: the first whose
  bound is at least compacted_bound, and never an earlier one."""
  while segment + 1 < len(bounds) and bounds[segment] < compacted_bound:
    segment += 1
  return segment


class Move(NamedTuple):
  """A batch's next stage: `size` rows on a cache of bounds[segment] positions; `length`,
  the positions its take grows the cache to (None: as it is)."""

  size: int
  segment: int
  length: int | None = None


@dataclasses.dataclass(frozen=True)
class Schedule:
  """Which stage follows which: the one place `run_in_stages` asks, and from which the
  warm-up enumerates every program it can reach (`moves`).

  bounds: the cache's lengths (`segment_bounds`); min_rows: the smallest batch compacted
  to; compacted_bound: the shortest cache of a compacted batch (`compacted_segment`).
  """

  bounds: tuple[int, ...]
  min_rows: int = 1
  compacted_bound: int = 0

  def until(self, size: int) -> int:
    return until_of(size, self.min_rows)

  def compaction(self, running: int, segment: int) -> Move:
    """Where `running` unfinished rows of a stage in `segment` go on."""
    grown = compacted_segment(self.bounds, segment, self.compacted_bound)
    length = self.bounds[grown] if grown > segment else None
    return Move(compacted_size(running, self.min_rows), grown, length)

  def growth(self, move: Move) -> Move | None:
    """The stage after `move`'s reached its bound with rows running (None: the last)."""
    if move.segment + 1 >= len(self.bounds):
      return None
    return Move(move.size, move.segment + 1)

  def moves(self, batch_size: int) -> dict[Move, tuple[Move, ...]]:
    """Every stage a batch of `batch_size` rows can run (the first is Move(batch_size, 0)),
    each with the stages it can be followed by: every compaction `compaction` can choose
    and the growth. Keys are ordered as a search meets them: by segment, largest first."""
    table: dict[Move, tuple[Move, ...]] = {}
    todo = [Move(batch_size, 0)]
    while todo:
      move = todo.pop()
      key = move._replace(length=None)
      if key in table:
        continue
      running = range(1, self.until(move.size) + 1)
      after = list(dict.fromkeys(self.compaction(n, move.segment) for n in running))
      if (grown := self.growth(move)) is not None:
        after.append(grown)
      table[key] = tuple(after)
      todo.extend(after)
    return dict(sorted(table.items(), key=lambda kv: (kv[0].segment, -kv[0].size)))


def run_in_stages(
  stages: Stages,
  rows: Any,
  batch_size: int,
  bounds: Sequence[int],
  min_rows: int = 1,
  stats: StageStats | None = None,
  compacted_bound: int = 0,
) -> tuple[np.ndarray, ...]:
  """Runs a search to its end in jitted stages chosen on the host, as CTranslate2 does
  step by step: whenever at most half of the rows are still running, those are gathered
  into a batch of the next power of two at least their number (padded with done rows,
  whose results are final), and whenever the step reaches the cache's length it grows to
  the next of `bounds` (`segment_bounds`; the first is its length already). A stage runs
  only as long as neither is due, so the cache is never longer than twice what has been
  written and at least half of the rows stepped are running, at every batch size. Each
  (rows, bound) pair compiles once; powers of two keep the pairs few. A compacted batch's
  cache is at least `compacted_bound` positions long (`compacted_segment`: its take grows
  it), so that no batch below the full size runs on the shortest caches, whose stages would
  compile for a few steps each. `rows` is what the first stage starts from
  (`Stages.first`'s input when it is given, else the rows).

  Returns the outputs (`Stages.run`) of the batch_size original rows, as numpy arrays, each
  row taken when it was done (frozen from then on, so the same whatever runs beside it).
  `stats`, when given, is added to.
  """
  schedule = Schedule(tuple(bounds), min_rows, compacted_bound)
  origin = np.arange(batch_size)  # each current row's original row; -1: padding
  results: list[np.ndarray] | None = None
  move, step = Move(batch_size, 0), 0
  stats = StageStats() if stats is None else stats

  def collect(outputs: tuple[jax.Array, ...], which: np.ndarray) -> None:
    nonlocal results
    outputs = jax.device_get(outputs)
    if results is None:
      results = [np.zeros((batch_size,) + x.shape[1:], x.dtype) for x in outputs]
    for result, x in zip(results, outputs):
      result[origin[which]] = x[which]

  stage = stages.first or stages.run
  while True:
    until = schedule.until(move.size)
    rows, step_now, done, outputs = stage(rows, bounds[move.segment], until)
    stage = stages.run
    before, (step, done) = step, jax.device_get((step_now, done))
    step = int(step)  # a Python int: the sums in `stats` must not wrap at 2^31
    stats.stages += 1
    stats.row_steps += move.size * (step - before)
    real = origin >= 0
    running = np.flatnonzero(real & ~done)
    if running.size == 0 or step >= bounds[-1]:
      collect(outputs, np.flatnonzero(real))
      return tuple(results)
    if running.size <= until:
      move = schedule.compaction(running.size, move.segment)
      filler = np.flatnonzero(done)[: move.size - running.size]
      keep = np.concatenate([running, filler])
      rows = stages.take(rows, jax.device_put(keep.astype(np.int32)), move.length)  # no program
      collect(outputs, np.flatnonzero(real & done))
      origin = np.concatenate([origin[running], np.full(filler.size, -1)])
      stats.compactions += 1
    elif step >= bounds[move.segment]:
      move = schedule.growth(move)
      stats.resizes += 1
      rows = stages.resize(rows, bounds[move.segment])
