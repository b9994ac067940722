"""How translate() runs its batches: up to `batch_threads` at once, each from a thread of
its own, and what their searches did, summed (`DecodeStats`)."""

import concurrent.futures
import dataclasses
from collections.abc import Callable, Iterable

import jax

from t2t_jax.decoding.stages import StageStats


@dataclasses.dataclass
class DecodeStats(StageStats):
  """A Translator's staged searches, summed (`Translator.stats`; t2t-bench prints them):
  batches, the sentences in them and their rows (padding rows included), and the steps
  the outputs needed (each sentence's best output length, EOS included: a search that
  stepped every sentence only until its output ended would run that many row-steps)."""

  batches: int = 0
  sentences: int = 0
  rows: int = 0
  needed_row_steps: int = 0


def default_batch_threads() -> int:
  """Batches translate() decodes at once by default: 2 where JAX runs on the CPU (one
  batch's small compacted stages leave a core idle, docs/performance.md), 1 on an
  accelerator, where each batch holds its own device memory."""
  return 2 if jax.default_backend() == "cpu" else 1


def each_batch(fn: Callable[[list[int]], list], batches: list[list[int]], threads: int) -> Iterable:
  """fn of each batch, in order: up to `threads` batches at once. Batches are independent,
  so the results are those of one at a time; on a CPU a batch's small compacted stages and
  its host work leave a core idle that another batch's steps use (docs/performance.md)."""
  threads = min(threads, len(batches))
  if threads <= 1:
    return map(fn, batches)
  with concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="t2t-batch") as pool:
    return list(pool.map(fn, batches))
