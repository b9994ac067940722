"""Beam and greedy search run in host-driven stages (`translator.decode_in_stages`,
`search.run_in_stages`), the 1-best stopping rule (`final=1`), frozen done sentences, and
constrained decoding (decoding/constraints.py) inside the searches.

Every comparison is against the one-program search (`translator.decode` under jit), which
tests/test_decode.py checks against the reference searches.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t_jax.decoding import constraints, search
from t2t_jax.decoding import translator as translate
from t2t_jax.model import Transformer, TransformerConfig
from t2t_jax.tokens import EOS_ID, PAD_ID
from tests import support

VOCAB = 24
OPEN, CLOSE, LEAF = (4, 5, 6), (7, 8, 9), (10,)
WORDS = range(11, VOCAB)


@functools.cache
def _model_and_params(seed: int = 3, eos_bias: float = 2.0):
  """A small random Transformer with peaked output distributions and a likelier EOS, so
  that outputs end at many lengths (flat random distributions end at once)."""
  cfg = TransformerConfig(
    vocab_size=VOCAB,
    d_model=32,
    d_ff=64,
    num_heads=4,
    num_layers=2,
    dropout_rate=0.0,
    max_len=64,
    share_embeddings=False,
  )
  model = Transformer(cfg)
  dummy = jnp.ones((1, 4), jnp.int32)
  params = support.jit_init(model, jax.random.PRNGKey(seed), dummy, dummy)
  out = params["decoder"]["logits"]
  out["kernel"] = out["kernel"] * 8.0
  out["bias"] = out["bias"].at[EOS_ID].set(eos_bias)
  return model, params


def _batch(batch: int, src_len: int = 7, extra: int = 20, seed: int = 0):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(2, src_len + 1, size=batch)
  inputs = rng.integers(WORDS.start, VOCAB, size=(batch, src_len))
  inputs[np.arange(src_len) >= lengths[:, None]] = PAD_ID
  inputs[np.arange(batch), lengths - 1] = EOS_ID
  return jnp.asarray(inputs, jnp.int32), jnp.asarray(lengths + extra, jnp.int32)


def _one_program(beam_size, **kw):
  model, params = _model_and_params()
  run = jax.jit(
    functools.partial(translate.decode, model=model, beam_size=beam_size, **kw),
    static_argnames=("max_decode_len",),
  )
  return lambda inputs, limits, max_decode_len: tuple(
    np.asarray(x) for x in run(params, inputs, limits, 0.6, max_decode_len=max_decode_len)
  )


def _staged(beam_size, stats=None, **kw):
  model, params = _model_and_params()
  return lambda inputs, limits, max_decode_len: translate.decode_in_stages(
    params,
    inputs,
    limits,
    0.6,
    model=model,
    max_decode_len=max_decode_len,
    beam_size=beam_size,
    stats=stats,
    **kw,
  )


@pytest.mark.parametrize("beam_size", [1, 4])
@pytest.mark.parametrize("stop", ["exact", "heuristic"])
def test_stages_give_the_one_program_search_outputs(beam_size, stop, monkeypatch):
  """Compaction (batch 32 halving as sentences finish) and the cache grown 4, 8, 16, 32
  positions: every hypothesis and score equal the one-program search's."""
  monkeypatch.setattr(search, "FIRST_SEGMENT", 4)
  inputs, limits = _batch(32)
  stats = search.StageStats()
  want = _one_program(beam_size, stop=stop)(inputs, limits, 32)
  got = _staged(beam_size, stats, stop=stop)(inputs, limits, 32)
  np.testing.assert_array_equal(got[0], want[0])
  # Two programs: float32 sums in another order (about 1e-6 of a score of 2).
  np.testing.assert_allclose(got[1], want[1], rtol=1e-5)
  lengths = (want[0][:, 0] != PAD_ID).sum(-1)
  assert len(set(lengths.tolist())) > 3, "outputs should end at many lengths"
  assert stats.compactions >= 2 and stats.resizes >= 2, stats
  # Every row is stepped until its output ended at least; compaction keeps the rest small.
  assert lengths.sum() <= stats.row_steps < 32 * lengths.max()


@pytest.mark.parametrize("with_prefix", [False, True])
def test_staged_sampling_gives_the_one_program_samples(with_prefix, monkeypatch):
  """Sampling in stages (rows leave as their samples end, the cache grows 4, 8, 16, 32): every
  sample, its log-prob and the samples' order equal the one-program sampler's, each row
  keyed by its sentence id and sample."""
  monkeypatch.setattr(search, "FIRST_SEGMENT", 4)
  model, params = _model_and_params(eos_bias=1.0)
  inputs, limits = _batch(16, seed=2)
  ids = jnp.arange(16, dtype=jnp.int32) * 3 + 5
  draw = translate.Draw(jnp.float32(1.3), jnp.int32(0), jnp.float32(0.95), jnp.int32(7), ids)
  prefix = None
  if with_prefix:
    prefix = np.zeros((16, 2), np.int32)
    prefix[::3] = [WORDS.start, WORDS.start + 1]
    prefix = jnp.asarray(prefix)
  kw = dict(model=model, beam_size=1, draw=draw, num_samples=3, prefix=prefix)
  run = jax.jit(functools.partial(translate.decode, **kw), static_argnames=("max_decode_len",))
  want = [np.asarray(x) for x in run(params, inputs, limits, 0.6, max_decode_len=32)]
  stats = search.StageStats()
  got = translate.decode_in_stages(
    params, inputs, limits, 0.6, max_decode_len=32, stats=stats, **kw
  )
  np.testing.assert_array_equal(got[0], want[0])
  np.testing.assert_allclose(got[1], want[1], rtol=1e-5)
  lengths = (want[0] != PAD_ID).sum(-1)
  assert len(set(lengths.ravel().tolist())) > 3, "samples should end at many lengths"
  assert stats.compactions >= 1 and stats.resizes >= 2, stats
  if with_prefix:
    np.testing.assert_array_equal(got[0][::3, :, :2], np.broadcast_to(prefix[::3, None], (6, 3, 2)))


def test_final_one_keeps_the_best_output():
  inputs, limits = _batch(32, seed=1)
  want = _staged(4)(inputs, limits, 32)
  got = _staged(4, final=1)(inputs, limits, 32)
  np.testing.assert_array_equal(got[0][:, 0], want[0][:, 0])
  np.testing.assert_array_equal(got[1][:, 0], want[1][:, 0])


@pytest.mark.parametrize("stop", ["exact", "heuristic"])
def test_final_counts_the_finished_hypotheses_that_must_be_beaten(stop):
  """A sentence whose best live hypothesis can no longer beat its best finished one is
  done for final=1 but not while it could still beat the second (final=2) or the empty
  slots (final=None); the bound divides by the larger of lp(step + 1) and, for the exact
  rule, lp(limit)."""
  limit, alpha, step = 20, 0.6, 5
  lp = search.length_penalty(limit if stop == "exact" else step + 1, alpha)
  live = -2.0
  bound = live / float(lp)
  state = search.init_beam_state({}, 1, 4, 32)._replace(
    step=jnp.int32(step),
    live_log_probs=jnp.array([[live, -3.0, -4.0, -5.0]]),
    finished_scores=jnp.array([[bound + 0.1, bound - 0.1, -jnp.inf, -jnp.inf]]),
  )
  done = lambda final: bool(search.beam_done(state, jnp.array([limit]), alpha, stop, final)[0])
  assert done(1) and not done(2) and not done(None)
  with pytest.raises(ValueError, match="final=5"):
    search.check_stop(stop, 5, 4)


def _two_kinds_model(ids, cache):
  """A per-row stand-in model over 8 tokens. Kind 0 rows: EOS likely at the first step, then
  token 5 nearly certain with EOS second, so a done sentence that kept stepping would keep
  finding new finished hypotheses. Kind 1 rows: EOS ruled out, they run to their limit."""
  step, kind = cache["step"], cache["kind"]
  first = jnp.array([0.0, 5.0, 0.0, 0.0, 0.0, 2.6, 2.5, 2.4])
  later = jnp.array([0.0, 5.0, 0.0, 0.0, 0.0, 10.0, 0.0, 0.0])
  short = jnp.where(step == 0, first, later)
  long = jnp.array([0.0, -30.0, 0.0, 0.0, 0.0, 1.0, 0.5, 0.0])
  logits = jnp.where((kind == 0)[:, None], short[None], long[None])
  return logits, dict(cache, step=step + 1)


@pytest.mark.parametrize("stop", ["exact", "heuristic"])
def test_an_output_does_not_depend_on_the_sentences_beside_it(stop):
  """A sentence done early (final=1: its best output is final) gives the same hypotheses
  alone as beside a sentence that runs to its limit: done sentences are frozen, so the
  steps run for the neighbour cannot add finished hypotheses to it (under the heuristic,
  or below the best one with final=1, they could)."""
  run = lambda kinds, limits: search.beam_search(
    _two_kinds_model,
    dict(step=jnp.int32(0), kind=jnp.array(kinds, jnp.int32)),
    max_lengths=jnp.array(limits, jnp.int32),
    max_decode_len=12,
    beam_size=4,
    stop=stop,
    final=1,
  )
  alone_seqs, alone_scores = run([0], [10])
  seqs, scores = run([0, 1], [10, 12])
  assert int((np.asarray(seqs[1, 0]) != PAD_ID).sum()) == 12  # the neighbour ran to its limit
  np.testing.assert_array_equal(seqs[0], alone_seqs[0])
  np.testing.assert_array_equal(scores[0], alone_scores[0])


def _well_formed(seq: np.ndarray, words: int) -> bool:
  """A python check: balanced and matching brackets, one root, every leaf inside a
  bracket, exactly `words` leaves, EOS right after the root closes."""
  stack, leaves, closed_root = [], 0, False
  for token in seq.tolist():
    if token == EOS_ID:
      return closed_root and leaves == words
    if closed_root:
      return False
    if token in OPEN:
      stack.append(OPEN.index(token))
    elif token in CLOSE:
      if not stack or stack.pop() != CLOSE.index(token):
        return False
      closed_root = not stack
    elif token in LEAF:
      if not stack:
        return False
      leaves += 1
    else:
      return False
  return False


@pytest.mark.parametrize("beam_size", [1, 4])
def test_constrained_outputs_are_trees_over_the_source_words(beam_size):
  """Under TreeConstraint no output is malformed (greedy and beam, every hypothesis), the
  staged search equals the one-program one, and without the constraint this model's
  outputs are mostly not trees (so the check can fail)."""
  tree = constraints.TreeConstraint(vocab_size=VOCAB, open_ids=OPEN, close_ids=CLOSE, leaf_ids=LEAF)
  inputs, limits = _batch(16, extra=12, seed=4)
  words = np.asarray((inputs != PAD_ID).sum(-1)) - 1  # EOS is not a word
  want = _one_program(beam_size, constraint=tree)(inputs, limits, 32)
  got = _staged(beam_size, constraint=tree)(inputs, limits, 32)
  np.testing.assert_array_equal(got[0], want[0])
  np.testing.assert_allclose(got[1], want[1], rtol=1e-6)
  for row in range(16):
    for seq, score in zip(got[0][row], got[1][row]):
      if np.isfinite(score):
        assert _well_formed(seq, int(words[row])), (row, seq)
  free = _staged(beam_size)(inputs, limits, 32)[0][:, 0]
  assert sum(_well_formed(s, int(w)) for s, w in zip(free, words)) < 8


def test_search_refuses_a_constraint_without_its_state():
  model, params = _model_and_params()
  tree = constraints.TreeConstraint(vocab_size=VOCAB, open_ids=OPEN, close_ids=CLOSE, leaf_ids=LEAF)
  with pytest.raises(ValueError, match="go together"):
    search.greedy_search(
      lambda ids, cache: (jnp.zeros((1, VOCAB)), cache),
      {},
      max_lengths=[4],
      max_decode_len=4,
      constraint=tree,
    )


def test_run_in_stages_halves_and_grows_on_a_counting_search():
  """The driver alone, on a stand-in search whose row r is done after r + 1 steps: each
  row's result is taken when it was done, batches shrink to powers of two, the cache
  grows through every bound, and row-steps are counted."""
  batch, bounds = 16, [4, 8, 16]

  def run(rows, bound, until):
    step, cache, left = rows["step"], rows["cache"], rows["left"]
    while step < bound and np.sum(left > step) > until:
      step += 1
    assert cache.shape[0] == bound, "the cache has the current bound's length"
    return dict(rows, step=step), step, left <= step

  outputs = lambda rows: (rows["left"] * 10,)
  rows = dict(step=0, cache=np.zeros(bounds[0]), left=np.arange(1, batch + 1))
  stages = search.Stages(
    run=run,
    take=lambda rows, keep: (dict(rows, left=rows["left"][np.asarray(keep)]), outputs(rows)),
    outputs=outputs,
    resize=lambda rows, n: dict(rows, cache=np.zeros(n)),
  )
  stats = search.StageStats()
  (out,) = search.run_in_stages(stages, rows, batch, bounds, stats=stats)
  np.testing.assert_array_equal(out, np.arange(1, batch + 1) * 10)
  assert stats.resizes == 2 and stats.compactions >= 3
  # 16 rows to step 8 (half done), 8 to step 12, 4 to 14, 2 to 15, 1 to 16.
  assert stats.row_steps == 16 * 8 + 8 * 4 + 4 * 2 + 2 * 1 + 1 * 1
