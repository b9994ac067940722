"""translate() decodes several batches at once (`Translator.batch_threads`): the outputs,
n-best lists and statistics are those of one batch at a time, batches do run together,
and the default is two threads on a CPU, one on an accelerator."""

import dataclasses
import sys
import threading

import jax
import numpy as np
import pytest

from t2t_jax.decoding import SearchConfig
from t2t_jax.decoding import translator as translator_lib
from t2t_jax.decoding.stages import StageStats
from t2t_jax.decoding.translator import TranslateError, Translator
from tests import support
from tests.test_score import _IdTokenizer

# sentences of 1-20 tokens: with batch_tokens=48 several batches of several shapes
LINES = [" ".join(str(3 + (i * 5 + j) % 40) for j in range(1 + i % 20)) for i in range(40)]


def _translator(batch_threads: int | None) -> Translator:
  model, params = support.small_model(seed=5, max_len=32)
  extra = SearchConfig(max_output_extra=6)
  return Translator(
    model, params, _IdTokenizer(), extra, batch_tokens=48, batch_threads=batch_threads
  )


def test_batches_decoded_together_give_the_outputs_and_stats_of_one_at_a_time():
  """1, 2 and 3 threads: the same texts, the same n-best texts and scores, and the same
  summed search statistics (each batch's added under a lock)."""
  runs = {}
  for threads in (1, 2, 3):
    translator = _translator(threads)
    plain = translator.translate(LINES, search=translator.search.override(beam_size=3))
    nbest = translator.translate(LINES, nbest=2, search=translator.search.override(beam_size=3))
    runs[threads] = plain, nbest, dataclasses.asdict(translator.stats)
  plain, nbest, stats = runs[1]
  assert stats["batches"] >= 6 * 2, stats  # several batches per call, two calls
  assert stats["row_steps"] >= stats["needed_row_steps"] > 0, stats
  assert stats["stages"] >= stats["batches"] and stats["resizes"] > 0, stats
  for threads in (2, 3):
    assert runs[threads][0] == plain
    got = runs[threads][1]
    assert got == nbest  # texts, scores and log-probs, exactly
    assert runs[threads][2] == stats


def test_batches_finishing_together_lose_no_statistics():
  """Eight threads adding 3,000 batches each to one Translator's stats, switching threads
  as often as Python allows: every count arrives (`_count` adds under a lock)."""
  translator = _translator(1)
  interval = sys.getswitchinterval()
  sys.setswitchinterval(1e-6)
  best = np.array([[5, 6, 0]], np.int32)
  one = StageStats(row_steps=2, stages=1, compactions=1, resizes=1)

  def add():
    for _ in range(3000):
      translator._count(1, 2, best, one)

  try:
    threads = [threading.Thread(target=add) for _ in range(8)]
    for t in threads:
      t.start()
    for t in threads:
      t.join()
  finally:
    sys.setswitchinterval(interval)
  n = 8 * 3000
  assert dataclasses.asdict(translator.stats) == dict(
    row_steps=2 * n,
    stages=n,
    compactions=n,
    resizes=n,
    batches=n,
    sentences=n,
    rows=2 * n,
    needed_row_steps=2 * n,
  )


def test_two_batch_threads_decode_two_batches_at_once(monkeypatch):
  """The first two batches meet at a barrier inside their decoding: one at a time, the
  first would wait there alone until the barrier broke."""
  translator = _translator(2)
  barrier, calls, lock = threading.Barrier(2, timeout=20), [], threading.Lock()
  real = translator._translate_batch

  def meeting(*args, **kwargs):
    with lock:
      calls.append(threading.get_ident())
      first_two = len(calls) <= 2
    if first_two:
      barrier.wait()
    return real(*args, **kwargs)

  monkeypatch.setattr(translator, "_translate_batch", meeting)
  two = translator.search.override(beam_size=2)
  assert translator.translate(LINES, search=two) == _translator(1).translate(LINES, search=two)
  assert len(calls) > 2 and len(set(calls[:2])) == 2


def test_batch_threads_default_to_two_on_a_cpu_and_one_on_an_accelerator(monkeypatch):
  assert _translator(None).batch_threads == translator_lib.default_batch_threads() == 2
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  assert translator_lib.default_batch_threads() == 1
  with pytest.raises(TranslateError, match="batch_threads=0: must be at least 1"):
    _translator(0)
