"""tools/step_breakdown.py: the replay of a batch's row ends runs the row-steps
`stages.run_in_stages` runs, split into categories that add up; on a small model the
recorded ends replayed under the search's schedule give `Translator.stats`' row-steps."""

import numpy as np

from t2t_jax.decoding import SearchConfig
from t2t_jax.decoding.translator import Translator
from tests import support
from tools import step_breakdown


def _batch(ends, real=None, needed=None, bounds=(4, 8, 16), min_rows=1) -> step_breakdown.Batch:
  real = [True] * len(ends) if real is None else real
  needed = [e if r else 0 for e, r in zip(ends, real)] if needed is None else needed
  return step_breakdown.Batch(
    list(bounds), min_rows, 0, list(ends), needed, real, [max(bounds)] * len(ends), 8
  )


def test_a_replay_counts_what_run_in_stages_runs_by_category():
  """Rows done after 1..16 steps (tests/test_staged_search.py's counting search): 16 rows
  to step 8, 8 to 12, 4 to 14, 2 to 15, 1 to 16, the done rows waiting until each halving."""
  batch = _batch(range(1, 17), needed=[e - 1 for e in range(1, 17)])
  out = step_breakdown.replay(batch)
  assert out["row_steps"] == 16 * 8 + 8 * 4 + 4 * 2 + 2 * 1 + 1 * 1
  assert out["needed"] == sum(range(16)) and out["rule"] == 16
  # a row done at step e < 8 waits 8 - e steps, then 12 - e for 8 < e < 12, ...
  waited = sum(8 - e for e in range(1, 8)) + sum(12 - e for e in range(9, 12)) + 1
  assert out["waiting"] == waited and out["padding"] == out["filler"] == 0
  assert out["compactions"] == 4


def test_padding_and_filler_rows_are_counted_apart():
  """6 sentences in 8 rows (2 padding rows, done after a step); 3 sentences done together
  at step 2 leave 3 running, compacted into 4 rows with a done filler."""
  batch = _batch([2, 2, 2, 9, 9, 9, 1, 1], real=[True] * 6 + [False] * 2, bounds=(16,))
  out = step_breakdown.replay(batch)
  assert out["padding"] == 2 * 2  # two rows, two steps (the first stage ends at step 2)
  assert out["filler"] == 1 * 7  # one filler row, steps 2 to 9
  assert out["row_steps"] == 8 * 2 + 4 * 7
  assert out["waiting"] == 0 and out["rule"] == 0


def test_the_schedules_to_weigh_compact_sooner():
  """With --halves_from=12, 16 rows go on in 12 once 4 are done, then in 8; with
  --every_size every row leaves as it is done, so the run is the floor."""
  batch = _batch(range(1, 17))
  with step_breakdown.halves_from(12):
    out = step_breakdown.replay(batch)
  assert out["row_steps"] == 16 * 4 + 12 * 4 + 8 * 4 + 4 * 2 + 2 + 1
  with step_breakdown.every_size():
    out = step_breakdown.replay(batch)
  assert out["row_steps"] == sum(range(1, 17)) and out["waiting"] == out["filler"] == 0
  assert step_breakdown.replay(batch)["row_steps"] == 171  # restored


def test_recorded_ends_replay_to_the_translators_row_steps():
  """A small model's translate(): the recording pass gives its outputs, every row's end
  is at least its output's length, and the replay under the search's own schedule runs
  the row-steps `Translator.stats` counts, its outputs the steps they needed (padding rows
  needing none; beam and greedy)."""
  model, params = support.small_model(seed=3, max_len=40)

  class Ids:
    def encode(self, text):
      return [int(t) for t in text.split()]

    def decode(self, ids):
      return " ".join(str(int(i)) for i in ids if i > 2)

  tr = Translator(model, params, Ids(), SearchConfig(max_output_extra=6), batch_tokens=160)
  rng = np.random.default_rng(0)
  lines = [" ".join(map(str, rng.integers(3, 20, rng.integers(1, 12)))) for _ in range(37)]
  for beam_size in (4, 1):
    search = tr.search.override(beam_size=beam_size)
    texts, batches = step_breakdown.record(tr, lines, search)
    tr.reset_stats()
    assert tr.translate(lines, search=search) == texts
    assert len(batches) > 1 and batches[0].min_rows == 8
    assert any(not all(b.real) for b in batches), "a batch has padding rows"
    for batch in batches:
      ends, needed = np.asarray(batch.ends), np.asarray(batch.needed)
      assert (ends >= needed).all() and (needed[batch.real] > 0).all()
    total = step_breakdown.summed(batches)
    assert total["row_steps"] == tr.stats.row_steps and tr.stats.compactions > 0
    assert total["needed"] == tr.stats.needed_row_steps
    assert total["floor"] <= total["row_steps"] and total["stage_programs"] > 0
