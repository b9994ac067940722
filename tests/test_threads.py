"""State several threads share: the compiled-program store (the Translator's batch threads
call the same stored programs), the server's batch statistics (the model thread and the
event loop count there, /metrics reads them) and a Translator's search statistics. Each
test starts its threads together at a barrier and switches threads as often as Python
allows (where CPython would not switch inside a count, the counts themselves yield), so
that an unguarded read-then-write loses its race within the test's rounds."""

import collections
import contextlib
import dataclasses
import sys
import threading
import time

import numpy as np
import pytest

from t2t_jax import compilation
from t2t_jax.decoding.stages import StageStats
from t2t_jax.serve.batching import BatchStats

THREADS = 8


@contextlib.contextmanager
def _switching_often():
  interval = sys.getswitchinterval()
  sys.setswitchinterval(1e-6)
  try:
    yield
  finally:
    sys.setswitchinterval(interval)


def _together(work, threads: int = THREADS, timeout_s: float = 20.0) -> None:
  """work(i) in `threads` threads started at once; the first error is raised here, and a
  thread still running after `timeout_s` (a waiter whose build never ends) fails the test."""
  barrier = threading.Barrier(threads, timeout=timeout_s)
  errors = []

  def run(i):
    try:
      barrier.wait()
      work(i)
    except BaseException as e:
      errors.append(e)

  with _switching_often():
    started = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(threads)]
    for t in started:
      t.start()
    deadline = time.monotonic() + timeout_s
    for t in started:
      t.join(max(0.0, deadline - time.monotonic()))
  if errors:
    raise errors[0]
  hung = sum(t.is_alive() for t in started)
  assert not hung, f"{hung} of {threads} threads still running after {timeout_s} s"


# --- compilation.stored ----------------------------------------------------------------------


def _double(x, *, k):
  return x * 2 + k


class _Builds:
  """Stands in for a store's `_load_or_export`: counts its builds per key (the static `k`)
  and gives each build a program of its own, which returns the build's token."""

  def __init__(self, seconds: float = 0.0, fail=()) -> None:
    self.counts: collections.Counter = collections.Counter()
    self.lock = threading.Lock()
    self.seconds, self.fail = seconds, set(fail)

  def __call__(self, directory, key, args, static):
    del directory, key, args
    with self.lock:
      self.counts[static["k"]] += 1
    if self.seconds:
      time.sleep(self.seconds)  # the other threads ask for it meanwhile
    if static["k"] in self.fail:
      raise ValueError(f"k={static['k']} does not trace")
    token = object()
    return lambda *args: token


@pytest.fixture
def cache_dir(tmp_path):
  import jax

  before = jax.config.jax_compilation_cache_dir
  jax.config.update("jax_compilation_cache_dir", str(tmp_path))
  try:
    yield tmp_path
  finally:
    jax.config.update("jax_compilation_cache_dir", before)


def _stored(builds: _Builds):
  import jax

  store = compilation.stored(jax.jit(_double, static_argnames=("k",)))
  store._load_or_export = builds
  return store


def test_threads_asking_for_the_same_programs_at_once_build_each_once(cache_dir):
  """Rounds of eight threads each asking a fresh store for the same 6 programs, in
  different orders and twice over: each program is built once and every caller gets it."""
  x = np.zeros(3, np.float32)
  keys = range(6)
  for _ in range(40):
    builds = _Builds()
    store = _stored(builds)
    got = collections.defaultdict(list)

    def ask(i, store=store, got=got):
      order = list(keys)[i % 6 :] + list(keys)[: i % 6]
      for k in order * 2:
        got[k].append(store(x, k=k))  # list.append: atomic

    _together(ask)
    assert builds.counts == dict.fromkeys(keys, 1)
    assert {k: len(v) for k, v in got.items()} == dict.fromkeys(keys, 2 * THREADS)
    assert all(len({id(t) for t in tokens}) == 1 for tokens in got.values())
    assert len(store._programs) == len(keys) and not store._building


def test_a_slow_build_is_waited_for_and_a_failed_one_leaves_nothing(cache_dir):
  """Eight threads asking for one program while its build sleeps wait for that build; a
  build that fails is every waiting caller's error and the next call builds again."""
  x = np.zeros(3, np.float32)
  builds = _Builds(seconds=0.05, fail=[1])
  store = _stored(builds)
  tokens, errors = [], []

  def ask(i):
    tokens.append(store(x, k=0))
    try:
      store(x, k=1)
    except ValueError as e:
      errors.append(e)

  _together(ask)
  assert builds.counts == {0: 1, 1: 1}
  assert len(tokens) == THREADS and len({id(t) for t in tokens}) == 1
  assert len(errors) == THREADS
  assert len(store._programs) == 1 and not store._building  # k=0's alone
  builds.fail.clear()
  store(x, k=1)
  assert builds.counts == {0: 1, 1: 2}


def test_threads_filling_a_full_store_drop_the_oldest_programs_one_each(cache_dir, monkeypatch):
  """With room for 4 programs, eight threads asking for 200 each: every call is answered,
  and the store never holds more than 4 (each dropped program is dropped once)."""
  monkeypatch.setattr(compilation, "MAX_PROGRAMS", 4)
  x = np.zeros(3, np.float32)
  builds = _Builds()
  store = _stored(builds)
  answered = []

  def ask(i):
    for k in range(200):
      store(x, k=(k * 7 + i) % 50)
      answered.append(k)

  _together(ask)
  assert len(answered) == THREADS * 200
  assert len(store._programs) == 4 and not store._building
  assert sum(builds.counts.values()) >= 50


# --- the server's BatchStats -----------------------------------------------------------------


class _Yielding(int):
  """An int whose sums let another thread run first: a count read, added to and written
  back without the lock loses another thread's count (in CPython 3.11 `x.n += 1` switches
  threads too seldom for a test to see it; without the GIL it is an ordinary race)."""

  def __add__(self, other):
    time.sleep(0)
    return _Yielding(int(self) + other)


class _YieldingCounter(collections.Counter):
  def __getitem__(self, key):
    time.sleep(0)
    return _Yielding(super().__getitem__(key))


def test_batch_statistics_counted_from_several_threads_sum_exactly():
  """Four threads counting batches and two dropping requests while two read snapshots:
  every count arrives, and every snapshot is whole (its batches are its sizes' sum)."""
  zero = _Yielding(0)
  stats = BatchStats(zero, zero, zero, zero, zero, _YieldingCounter())
  rounds, torn = 600, []

  def work(i):
    for j in range(rounds):
      if i % 4 == 0:  # threads 0 and 4: /metrics
        seen = stats.snapshot()
        sizes = seen.sizes
        if (seen.batches, seen.requests) != (
          sum(sizes.values()),
          sum(k * n for k, n in sizes.items()),
        ):
          torn.append(seen)
      elif i % 2:  # 1, 3, 5, 7: the model thread
        stats.count_batch(requests=1 + j % 3, lines=2)
      else:  # 2, 6: the event loop
        stats.count_dropped(1)

  _together(work)
  batches = 4 * rounds
  assert stats.snapshot() == BatchStats(
    batches=batches,
    lines=2 * batches,
    requests=2 * batches,
    dropped=2 * rounds,
    last_batch_lines=2,
    sizes=collections.Counter(dict.fromkeys((1, 2, 3), batches // 3)),
  )
  assert torn == []


# --- Translator.stats ------------------------------------------------------------------------


def test_a_translator_s_statistics_counted_and_reset_from_several_threads_lose_nothing():
  """Seven threads adding batches to one Translator's stats while an eighth resets them
  again and again, copying each sum as it is handed over: the copies and the sums left
  count every batch, whole (a batch that finishes during a reset lands in the old sums
  before they are handed over, or in the new ones)."""
  from t2t_jax.decoding.translator import DecodeStats, Translator
  from tests import support
  from tests.test_score import _IdTokenizer

  model, params = support.small_model(seed=5, max_len=32)
  translator = Translator(model, params, _IdTokenizer(), batch_tokens=48, batch_threads=1)
  best = np.array([[5, 6, 0]], np.int32)
  one = StageStats(row_steps=2, stages=1, compactions=1, resizes=1)
  rounds, taken = 2000, []

  def work(i):
    for _ in range(rounds):
      if i == 0:
        taken.append(dataclasses.asdict(translator.reset_stats()))
      else:
        translator._count(1, 2, best, one)

  _together(work)
  taken.append(dataclasses.asdict(translator.stats))
  sums = {f.name: sum(s[f.name] for s in taken) for f in dataclasses.fields(DecodeStats)}
  n = (THREADS - 1) * rounds
  assert sums == dict(
    row_steps=2 * n,
    stages=n,
    compactions=n,
    resizes=n,
    batches=n,
    sentences=n,
    rows=2 * n,
    needed_row_steps=2 * n,
  )
  assert all(s["rows"] == 2 * s["batches"] == 2 * s["stages"] for s in taken)  # each whole
