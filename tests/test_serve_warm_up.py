"""The server's warm-up: every program a served batch can need is compiled before /ready.

The shapes it compiles are checked against brute force (every batch `translate` and the
staged search can form, over random inputs), and on a small model a burst of concurrent
requests of mixed lengths, counts and n-best sizes after `Translator.warm_up_batches`
compiles nothing, with answers equal to each request translated alone.
"""

import collections
import concurrent.futures
import random

import numpy as np
import pytest
from jax._src import monitoring

from t2t_jax import compilation
from t2t_jax.decoding import SearchConfig, batching, modes, programs
from t2t_jax.decoding.model_view import segment_bounds
from t2t_jax.decoding.stages import (
  Stages,
  compacted_segment,
  compacted_size,
  run_in_stages,
  until_of,
)
from t2t_jax.decoding.translator import Translator
from t2t_jax.serve import worker
from t2t_jax.serve.batching import Batcher
from tests import support
from tests.test_score import _IdTokenizer


def _stage_calls(
  batch_size: int, bounds: list[int], min_rows: int, rng, compacted_bound: int = 0
) -> set:
  """The (stage, size, bound, ...) calls `run_in_stages` makes when rows finish at random
  steps: a stand-in search whose rows are numpy (row r done once step >= its end)."""
  calls = set()
  # rows finishing together at a few steps: whole batches end at once, or most of them
  # (deep compactions), at any of the cache's segments
  steps = rng.integers(1, rng.choice(bounds) + 1, rng.integers(1, 10))
  ends = rng.choice(steps, batch_size, p=rng.dirichlet(np.full(len(steps), 0.3)))

  def run(rows, bound, until, kind="run"):
    calls.add((kind, len(rows["end"]), bound))
    step = rows["step"]
    while step < bound and np.sum(rows["end"] > step) > until:
      step += 1
    return dict(rows, step=step), step, rows["end"] <= step, (rows["end"],)

  def take(rows, keep, length):
    calls.add(("take", len(rows["end"]), len(keep), rows["bound"], length))
    return dict(rows, end=rows["end"][np.asarray(keep)], bound=length or rows["bound"])

  def resize(rows, length):
    calls.add(("resize", len(rows["end"]), rows["bound"], length))
    return dict(rows, bound=length)

  first = lambda rows, bound, until: run(rows, bound, until, "first")
  rows = dict(end=ends, step=0, bound=bounds[0])
  stages = Stages(run, take, resize, first)
  run_in_stages(stages, rows, batch_size, bounds, min_rows, None, compacted_bound)
  return calls


def _stage_sizes(batch_size: int, min_rows: int) -> dict[int, tuple[int, ...]]:
  """Every batch size a staged search of `batch_size` rows can step at, each with the sizes
  it can be compacted to (none at min_rows or below): a size above min_rows is compacted
  once at most `until_of` rows run, to `compacted_size` of their number. Written apart
  from `stages.Schedule.moves`, which the warm-up follows, so that the two check each other."""
  table: dict[int, tuple[int, ...]] = {}
  todo = [batch_size]
  while todo:
    size = todo.pop()
    if size not in table:
      running = range(1, until_of(size, min_rows) + 1)
      table[size] = tuple(sorted({compacted_size(n, min_rows) for n in running}))
      todo.extend(table[size])
  return table


def _predicted_calls(
  batch_size: int, bounds: list[int], min_rows: int, compacted_bound: int = 0
) -> set:
  """The calls `programs.warm_up_stages` makes, from `_stage_sizes`: below the full
  size, only at the bounds from compacted_bound on."""
  sizes = _stage_sizes(batch_size, min_rows)
  calls = set()
  for i, bound in enumerate(bounds):
    after = compacted_segment(bounds, i, compacted_bound)
    length = bounds[after] if after > i else None
    for size, targets in sizes.items():
      if size < batch_size and bound < compacted_bound and i + 1 < len(bounds):
        continue
      calls.add(("first" if (size, i) == (batch_size, 0) else "run", size, bound))
      calls |= {("take", size, target, bound, length) for target in targets}
      if i + 1 < len(bounds):
        calls.add(("resize", size, bound, bounds[i + 1]))
  return calls


@pytest.mark.parametrize(
  "batch_size,min_rows,compacted_bound",
  [(64, 8, 0), (32, 1, 0), (12, 8, 0), (4, 8, 0), (48, 4, 0), (64, 8, 32), (32, 1, 64)],
)
def test_predicted_calls_are_every_call_a_staged_search_makes_and_no_other(
  batch_size, min_rows, compacted_bound
):
  """Against a brute-force search over random finishing steps: every call is predicted, and
  over enough runs every predicted call is made (the table is no loose superset)."""
  rng = np.random.default_rng(batch_size)
  bounds = segment_bounds(64)
  predicted = _predicted_calls(batch_size, bounds, min_rows, compacted_bound)
  seen: set = set()
  for _ in range(800):
    seen |= _stage_calls(batch_size, bounds, min_rows, rng, compacted_bound)
  assert seen <= predicted, sorted(seen - predicted)
  assert seen == predicted, sorted(predicted - seen)


def test_warm_up_stages_makes_the_predicted_calls_on_the_rows_a_search_makes(monkeypatch):
  """`programs.warm_up_stages` with stand-in programs that record each call and the cache
  length of the rows it is given: exactly the calls `_predicted_calls` holds (brute force
  checks those against the search), each run on rows whose cache has its bound's length,
  as a search's are (a take below COMPACTED_BOUND grows the cache)."""
  from types import SimpleNamespace

  calls = set()

  def stage(rows, bound, kind):
    assert rows["bound"] == bound, (kind, rows, bound)
    calls.add((kind, rows["size"], bound))
    return rows, None, None, (np.zeros((1, 1, 1)), np.zeros((1, 1)))

  def first(params, batch, knobs, until, *, max_decode_len, bound, **_):
    return stage(dict(size=batch.inputs.shape[0], bound=bound), bound, "first")

  def take(rows, keep, *, layout, memory_len, length):
    assert layout == "beam"
    calls.add(("take", rows["size"], len(keep), rows["bound"], length))
    return dict(size=len(keep), bound=length or rows["bound"])

  def resize(rows, *, layout, length):
    assert layout == "beam"
    calls.add(("resize", rows["size"], rows["bound"], length))
    return dict(rows, bound=length)

  monkeypatch.setattr(programs, "_stage_first", first)
  monkeypatch.setattr(
    programs, "_stage_run", lambda p, rows, k, u, *, bound, **_: stage(rows, bound, "run")
  )
  monkeypatch.setattr(programs, "_stage_take", take)
  monkeypatch.setattr(programs, "_stage_resize", resize)
  decoding = programs.Decoding(mode=modes.Beam(4))
  batch = SimpleNamespace(inputs=np.zeros((64, 5), np.int32))
  count = programs.warm_up_stages(
    None, batch, None, model=None, max_decode_len=64, decoding=decoding, min_rows=8
  )
  bounds = programs.stage_bounds(64, decoding)
  assert calls == _predicted_calls(64, bounds, 8, programs.COMPACTED_BOUND)
  assert count == len(calls)


SERVED = batching.Shapes(rows=(1, 8), buckets=(16, 32, 64))  # serve.worker.shapes((1, 8), 64)


@pytest.mark.parametrize(
  "max_len,batch_tokens,extra,max_rows,shapes",
  [
    (64, 64, 50, None, batching.DEFAULT_SHAPES),
    (64, 256, 50, 16, batching.DEFAULT_SHAPES),
    (40, 100, 4, 8, batching.DEFAULT_SHAPES),
    (16, 32, 50, None, batching.DEFAULT_SHAPES),
    (64, 4096, 50, None, SERVED),
    (64, 100, 50, None, batching.Shapes(rows=(1, 3, 8), buckets=(16, 32))),
    (40, 4096, 4, 4, batching.Shapes(rows=(2, 16))),
  ],
)
def test_batch_shapes_are_every_shape_translate_forms(
  max_len, batch_tokens, extra, max_rows, shapes
):
  """`batch_shapes` against brute force: sentence lengths drawn at random (some runs of one
  length, to fill batches up to their bounds), batched and padded as translate() does, with
  translate()'s own shapes and with a server's fixed row counts and buckets."""
  rng = random.Random(max_len + batch_tokens)
  predicted = set(batching.batch_shapes(max_len, batch_tokens, extra, max_rows, shapes))
  seen = set()
  for _ in range(800):
    top, count = rng.randint(1, max_len), int(2 ** rng.uniform(0, np.log2(3 * batch_tokens)))
    lengths = [rng.randint(1, top) for _ in range(count)]
    if rng.random() < 0.5:
      lengths = [top] * count
    sources = [[1] * n for n in lengths]
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    for batch in batching.batches(order, sources, batch_tokens, max_rows, shapes):
      assert max_rows is None or len(batch) <= max_rows
      inputs, _, max_decode_len, _ = batching.padded_batch(
        max_len, [sources[i] for i in batch], extra, None, shapes=shapes
      )
      assert shapes.rows is None or inputs.shape[0] in shapes.rows
      seen.add((inputs.shape[0], inputs.shape[1], max_decode_len))
  assert seen <= predicted, sorted(seen - predicted)
  assert seen == predicted, sorted(predicted - seen)


class _Compilations:
  """Counts what compiles: jax's compile events (tracing, lowering, XLA) and the programs
  `compilation.stored` loads or exports (with the persistent cache on, a stored program is
  read back without any jax event)."""

  def __init__(self, monkeypatch) -> None:
    self.events: list[str] = []
    self.stored: list[str] = []
    original = compilation.stored._load_or_export

    def load_or_compile(stored, directory, key, args, static):
      self.stored.append(stored._name)
      return original(stored, directory, key, args, static)

    monkeypatch.setattr(compilation.stored, "_load_or_export", load_or_compile)

  def listen(self, event: str, seconds: float, **_) -> None:
    if event.startswith("/jax/core/compile/"):
      self.events.append(event)

  def clear(self) -> None:
    self.events.clear()
    self.stored.clear()


LINES = [" ".join(str(3 + (i * 7 + j) % 30) for j in range(n)) for i, n in enumerate(range(1, 24))]


def _translator(max_len: int, **kwargs) -> Translator:
  model, params = support.small_model(seed=3, max_len=max_len)
  return Translator(model, params, _IdTokenizer(), SearchConfig(max_output_extra=4), **kwargs)


def _same_answers(got: list, expected: list) -> None:
  """Equal texts; scores equal to float32 rounding (a batch of another size runs another
  program, whose sums may round differently)."""
  if not got or isinstance(got[0], str):
    assert got == expected
    return
  for hyps, want in zip(got, expected):
    assert [h.text for h in hyps] == [h.text for h in want]
    for h, w in zip(hyps, want):
      np.testing.assert_allclose([h.score, h.log_prob], [w.score, w.log_prob], rtol=1e-5)


def test_after_warm_up_a_burst_of_requests_compiles_nothing_and_answers_as_alone(monkeypatch):
  """Concurrent requests of 1-12 lines of 1-23 tokens (cut to max_len), plain and n-best,
  batched together by the server's Batcher (two batches at once, as on a CPU) into batches
  padded as a server pads them (rows 1, 4 or 16, sources to powers of two:
  `serve.worker.shapes`; 16 rows is more than the staged search's MIN_ROWS, so batches
  compact): nothing compiles after the warm-up, and
  each answer is the Translator's for that request alone. (A larger run, 40 tokens and
  n-best 4, compiled 150 programs and checked nothing this one does not.)"""
  max_len, nbests = 24, (0, 2)
  served = worker.shapes((1, 4, 16), max_len)
  assert served == batching.Shapes(rows=(1, 4, 16), buckets=(16, 24), memory=24)
  translator = _translator(max_len, batch_tokens=64, shapes=served)
  compiled = _Compilations(monkeypatch)
  shapes, calls = translator.warm_up_batches(
    nbests=[n or None for n in nbests], search=translator.search.override(beam_size=4)
  )
  assert shapes == len(nbests) * len(batching.batch_shapes(max_len, 64, 4, None, served)) < calls
  translate = lambda lines, nbest: translator.translate(
    lines, nbest=nbest or None, search=translator.search.override(beam_size=4)
  )
  batcher = Batcher(translate, window_s=0.05, max_batch_chars=10**6, workers=2)
  rng = random.Random(0)
  requests = [(rng.sample(LINES, rng.randint(1, 12)), rng.choice(nbests)) for _ in range(12)]
  compiled.clear()
  monitoring.register_event_duration_secs_listener(compiled.listen)
  batcher.start()
  try:
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
      futures = list(pool.map(lambda r: batcher.submit(*r), requests))
      answers = [f.result(timeout=120) for f in futures]
  finally:
    batcher.stop()
    monitoring.unregister_event_duration_listener(compiled.listen)
  assert batcher.stats.batches < len(requests)  # requests did share batches
  assert compiled.events == [] and compiled.stored == [], (compiled.events, compiled.stored)
  for (lines, nbest), answer in zip(requests, answers):
    _same_answers(
      answer,
      translator.translate(
        lines, nbest=nbest or None, search=translator.search.override(beam_size=4)
      ),
    )


def test_a_served_model_decodes_two_batches_at_once_on_a_cpu_unless_told():
  """t2t-serve's --batch_threads (0: `default_batch_threads`, 2 where JAX runs on the CPU)
  is the number of its model's batching threads."""
  app = pytest.importorskip("t2t_jax.serve.app")
  workdir = support.small_trained_workdir()
  for threads, expected in ((0, 2), (1, 1), (3, 3)):
    model = worker.Model(worker.ModelSettings(workdirs=(workdir,), batch_threads=threads))
    assert model.batch_threads == expected
    assert app.Served(model, app.ServerSettings()).batcher.workers == expected


def test_warm_up_calls_every_stage_program_once_per_shape(monkeypatch):
  """The program calls warm_up_batches counts are the stage calls `warm_up_stages` makes:
  per batch its first stage, and per stage table the runs, takes and resizes."""
  translator = _translator(24, batch_tokens=64, max_rows=16)
  made = []
  real = programs.warm_up_stages

  def counting(params, batch, knobs, **kw):
    calls = real(params, batch, knobs, **kw)
    made.append((batch.inputs.shape, kw, calls))
    return calls

  monkeypatch.setattr(programs, "warm_up_stages", counting)
  shapes, calls = translator.warm_up_batches(
    nbests=[None, 1, 2], search=translator.search.override(beam_size=4)
  )
  assert shapes == len(made) and calls == sum(m[-1] for m in made)
  for (rows, src_len), kw, count in made:
    bounds = programs.stage_bounds(kw["max_decode_len"], kw["decoding"])
    # a call's longest bucket, which compacted batches attend over, is any from src_len up
    memories = [b for b in sorted(set(batching.source_buckets(24))) if b >= src_len]
    assert kw["memory_lens"] == tuple(memories)
    predicted = _predicted_calls(rows, bounds, programs.MIN_ROWS, programs.COMPACTED_BOUND)
    # the full batch's stages and resizes once; every other call once per memory
    once = [c for c in predicted if c[0] != "take" and c[1] == rows]
    assert count == len(once) + (len(predicted) - len(once)) * len(memories)
  # nbest 1 shares the plain search's programs
  assert len({m[1]["decoding"].mode.stop for m in made}) == 2


def test_shapes_pad_rows_to_the_ladder_and_cut_runs_at_its_rungs():
  """n sentences take the smallest row count that holds them; a run longer than a batch is
  cut at the largest count it fills, so that only the last batch has padding rows; the
  buckets end at max_len whatever is given; a ladder out of order or below 1 is refused."""
  ladder = batching.Shapes(rows=(1, 8), buckets=(16, 32, 64, 128))
  assert [ladder.padded_rows(n) for n in (1, 2, 5, 8)] == [1, 8, 8, 8]
  assert [ladder.full_rows(n) for n in (1, 7, 8)] == [1, 1, 8]
  assert ladder.largest_rows(None) == 8 and ladder.largest_rows(4) == 4
  assert ladder.source_buckets(40) == [16, 32, 40]
  assert batching.DEFAULT_SHAPES.source_buckets(40) == [16, 24, 32, 40]
  assert [batching.DEFAULT_SHAPES.padded_rows(n) for n in (1, 3, 5)] == [1, 4, 8]
  sources = [[1] * 3] * 20
  batches = list(batching.batches(range(20), sources, 4096, None, ladder))
  assert [len(b) for b in batches] == [8, 8, 4]  # the last holds the rest, padded to 8
  inputs, *_ = batching.padded_batch(64, sources[:3], 4, None, shapes=ladder)
  assert inputs.shape == (8, 16)
  for rows in ((), (0, 8), (8, 1), (1, 1)):
    with pytest.raises(ValueError, match="ascending"):
      batching.Shapes(rows=rows)


def test_a_full_memory_shares_every_program_after_the_first_stage(monkeypatch):
  """With `Shapes.memory` every batch's encoder keys/values are padded to it from the first
  step, so the warm-up of two source buckets compiles a first stage for each and every later
  program once, where without it each bucket compiles its own; the translations are those
  without the padding. (max_len 37: programs no other test compiles.)"""
  max_len, search = 37, SearchConfig(max_output_extra=4, beam_size=4)
  names = {}
  for memory in (None, max_len):
    translator = _translator(
      max_len, shapes=batching.Shapes(rows=(1,), buckets=(16, max_len), memory=memory)
    )
    compiled = _Compilations(monkeypatch)
    translator.warm_up_batches(search=search)
    names[memory] = collections.Counter(name.rsplit(".", 1)[-1] for name in compiled.stored)
    monkeypatch.undo()
  assert names[None]["_stage_first"] == names[max_len]["_stage_first"] == 2
  assert names[None]["_stage_run"] > names[max_len]["_stage_run"] > 0
  lines = ["3 4 5", " ".join(str(3 + i % 20) for i in range(30))]
  assert translator.translate(lines, search=search) == _translator(max_len).translate(
    lines, search=search
  )
