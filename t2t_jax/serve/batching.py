"""Cross-request batching: worker threads take the queued requests' lines together.

Requests put their lines in a bounded queue and wait on a future; a free worker thread takes
the oldest request, waits until `window_s` after its arrival for others (or until the batch
is full), and translates all their lines in one call, so concurrent clients share the
model's batches as one client's many lines do. With `workers=2` (t2t-serve's default on a
CPU, as `Translator.batch_threads`) a second batch runs while the first does: one batch's
small compacted stages leave a core idle (docs/performance.md). A batch's cost is its
padded size, rows x longest line in characters (an upper bound of the tokens it pads to),
capped by `max_batch_chars`. Answers never depend on what was batched with them: the
search decodes each row on its own, and each request gets back exactly its own slice of the
results.

Nothing here knows the model: `translate(lines, nbest)` is any function with Translator's
answer shape, so the tests drive the batching with a stand-in.
"""

import collections
import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

TranslateFn = Callable[[list[str], int], list[Any]]


class QueueFullError(Exception):
  """The queue holds max_queue_lines lines already: the request is refused (503)."""


@dataclasses.dataclass
class _Job:
  lines: list[str]
  nbest: int  # 0: plain translations; else this many hypotheses per line
  future: Future
  arrived: float


@dataclasses.dataclass
class _Call:
  """Other work for the model (the page's attention), a batch of its own in a worker."""

  fn: Callable[[], Any]
  future: Future
  arrived: float
  lines: tuple = ()


@dataclasses.dataclass
class BatchStats:
  """What the workers did, for /metrics and the benchmark. The batching threads and the event
  loop both count here and /metrics reads it: each count and each `snapshot` is taken
  under `lock`."""

  batches: int = 0
  lines: int = 0
  requests: int = 0
  dropped: int = 0  # requests cancelled (client gone, timed out) before they ran
  last_batch_lines: int = 0
  sizes: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  lock: Any = dataclasses.field(
    default_factory=threading.Lock, init=False, repr=False, compare=False
  )

  def count_dropped(self, requests: int) -> None:
    with self.lock:
      self.dropped += requests

  def count_batch(self, requests: int, lines: int) -> None:
    """One batch of `requests` requests and `lines` lines has run."""
    with self.lock:
      self.batches += 1
      self.requests += requests
      self.lines += lines
      self.last_batch_lines = lines
      self.sizes[requests] += 1

  def snapshot(self) -> "BatchStats":
    """A copy of the counts as they are now, every batch counted whole."""
    with self.lock:
      return dataclasses.replace(self, sizes=collections.Counter(self.sizes))


def padded_cost(lines: Sequence[str]) -> int:
  """The padded size of translating `lines` in one batch: rows x the longest (characters)."""
  return len(lines) * max((len(line) for line in lines), default=0)


def split_results(results: Sequence[Any], counts: Sequence[int]) -> list[list[Any]]:
  """`results` of the concatenated lines cut back into consecutive runs of `counts`."""
  out, start = [], 0
  for count in counts:
    out.append(list(results[start : start + count]))
    start += count
  if start != len(results):
    raise ValueError(f"{len(results)} results for {start} lines")
  return out


class Batcher:
  """A bounded queue of requests and the `workers` threads that run them through
  `translate` (which must allow that many calls at once, as Translator.translate does)."""

  def __init__(
    self,
    translate: TranslateFn,
    window_s: float = 0.005,
    max_batch_chars: int = 32768,
    max_queue_lines: int = 4096,
    workers: int = 1,
  ) -> None:
    if workers < 1:
      raise ValueError(f"workers={workers}: at least 1")
    self.workers = workers
    self._translate = translate
    self.window_s = window_s
    self.max_batch_chars = max_batch_chars
    self.max_queue_lines = max_queue_lines
    self._queue: collections.deque = collections.deque()
    self._queued_lines = 0
    self._cond = threading.Condition()
    self._stopping = False
    self._running = 0  # batches the workers have taken and not finished
    self._call_running = False  # one of them is a _Call, which runs alone
    self._threads: list[threading.Thread] = []
    self.stats = BatchStats()

  @property
  def depth(self) -> int:
    """Lines waiting (not yet taken into a batch)."""
    return self._queued_lines

  def start(self) -> None:
    self._threads = [
      threading.Thread(target=self._loop, name=f"t2t-serve-model-{i}", daemon=True)
      for i in range(self.workers)
    ]
    for thread in self._threads:
      thread.start()

  def stop(self, timeout: float | None = None) -> None:
    """Runs what is queued, then ends the threads (`timeout` for each)."""
    with self._cond:
      self._stopping = True
      self._cond.notify_all()
    for thread in self._threads:
      thread.join(timeout)

  def submit(self, lines: Sequence[str], nbest: int = 0) -> Future:
    """Queues lines for translation; the future gets their results in order."""
    return self._put(_Job(list(lines), nbest, Future(), time.monotonic()))

  def call(self, fn: Callable[[], Any]) -> Future:
    """Queues `fn()` to run in a worker thread, as a batch of its own."""
    return self._put(_Call(fn, Future(), time.monotonic()))

  def _put(self, job: "_Job | _Call") -> Future:
    with self._cond:
      if self._stopping:
        raise QueueFullError("the server is shutting down")
      if self._queued_lines + len(job.lines) > self.max_queue_lines:
        self._purge()
      if self._queued_lines + len(job.lines) > self.max_queue_lines and self._queue:
        raise QueueFullError(
          f"the queue holds {self._queued_lines} lines (at most {self.max_queue_lines})"
        )
      self._queue.append(job)
      self._queued_lines += len(job.lines)
      self._cond.notify_all()
    return job.future

  def _purge(self) -> None:
    """Drops the cancelled jobs (clients gone, timed out) from the queue."""
    kept = [job for job in self._queue if not job.future.cancelled()]
    self.stats.count_dropped(len(self._queue) - len(kept))
    self._queue = collections.deque(kept)
    self._queued_lines = sum(len(job.lines) for job in kept)

  def _take(self) -> list:
    """The next batch: the oldest job and those that arrive within its window and fit
    max_batch_chars, or one _Call, which runs alone (the model's load, the page's
    attention: no batch beside it); [] when stopping with nothing queued."""
    with self._cond:
      while True:
        if not self._queue:
          if self._stopping:
            return []
          self._cond.wait()
          continue
        head = self._queue[0]
        if self._call_running or (isinstance(head, _Call) and self._running):
          self._cond.wait()
          continue
        if isinstance(head, _Call):
          self._call_running = True
          self._running += 1
          return [self._pop()]
        deadline = head.arrived + self.window_s
        if not self._stopping and not self._full() and time.monotonic() < deadline:
          self._cond.wait(max(0.0, deadline - time.monotonic()))
          continue  # another worker may have taken the head meanwhile
        first = self._pop()
        batch, lines = [first], list(first.lines)
        while self._queue and isinstance(self._queue[0], _Job):
          if padded_cost(lines + self._queue[0].lines) > self.max_batch_chars:
            break
          lines += self._queue[0].lines
          batch.append(self._pop())
        self._running += 1
        return batch

  def _done(self, batch: list) -> None:
    """A batch `_take` gave has run: its worker is free again."""
    with self._cond:
      self._running -= 1
      if isinstance(batch[0], _Call):
        self._call_running = False
      self._cond.notify_all()

  def _full(self) -> bool:
    lines: list[str] = []
    for job in self._queue:
      if isinstance(job, _Call):
        return True
      lines += job.lines
      if padded_cost(lines) >= self.max_batch_chars:
        return True
    return False

  def _pop(self) -> "_Job | _Call":
    job = self._queue.popleft()
    self._queued_lines -= len(job.lines)
    return job

  def _loop(self) -> None:
    while True:
      batch = self._take()
      if not batch:
        return
      try:
        self._run(batch)
      finally:
        self._done(batch)

  def _run(self, batch: list) -> None:
    running = [job for job in batch if job.future.set_running_or_notify_cancel()]
    self.stats.count_dropped(len(batch) - len(running))
    if not running:
      return
    if isinstance(running[0], _Call):
      _settle(running[0].future, running[0].fn)
    else:
      self._run_jobs(running)

  def _run_jobs(self, jobs: list[_Job]) -> None:
    """One translate call per nbest asked for; each job gets its own slice back."""
    for nbest in sorted({job.nbest for job in jobs}):
      group = [job for job in jobs if job.nbest == nbest]
      lines = [line for job in group for line in job.lines]
      try:
        results = self._translate(lines, nbest) if lines else []
        parts = split_results(results, [len(job.lines) for job in group])
      except Exception as e:  # the model's error is every waiting request's answer
        for job in group:
          job.future.set_exception(e)
        continue
      for job, part in zip(group, parts):
        job.future.set_result(part)
      self.stats.count_batch(len(group), len(lines))


def _settle(future: Future, fn: Callable[[], Any]) -> None:
  try:
    future.set_result(fn())
  except Exception as e:
    future.set_exception(e)
