"""The exact stopping rule of beam search (beam.beam_done) for every sign of the length-penalty
exponent, alpha < 0 included: against a brute-force enumeration of every length a live
hypothesis can still end at, and, through the whole search, against exhaustive search over
the trie models of tests/test_decode.py (a beam as large as the number of prefixes is exact,
so an early stop is the only way to differ)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t_jax.decoding import SearchConfig
from t2t_jax.decoding import search as decode
from t2t_jax.decoding.beam import BeamState, Stop, beam_done
from t2t_jax.tokens import EOS_ID, PAD_ID
from tests.test_decode import (
  SLOPE,
  A,
  B,
  _depth_nodes,
  _random_table,
  _ref_log_probs,
  _ref_lp,
  _run_counting_steps,
  _strip,
  _trie_lm,
)

ALPHAS = (-0.5, 0.0, 0.6, 1.0)
NEG_INF = float("-inf")


# --- beam_done on hand-built states against every continuation length --------------------------


def _can_still_enter(step, limit, live, last_needed, alpha):
  """Whether some live hypothesis (log-prob L; it ends with at most L) could still score at
  least `last_needed` by ending at some length n in [step + 1, limit]: tried length by length."""
  return any(
    log_prob > NEG_INF and log_prob / _ref_lp(n, alpha) >= last_needed
    for log_prob in live
    for n in range(step + 1, limit + 1)
  )


def _rows(step, alpha, rng):
  """(limit, live log-probs, finished scores) rows for `step`: the finished set's last
  needed score just above and just below what a live hypothesis reaches at each length in
  [step, limit + 1] (one past each end of the real range), so that a bound read at any wrong
  length decides some row wrongly; and rows with empty slots."""
  rows = []
  for limit in (step + 1, step + 2, step + 5):
    for best in (-0.3, -2.0, -7.0):
      live = [best, best - 1.0, NEG_INF]
      for n in range(step, limit + 2):
        for side in (1 - 1e-3, 1 + 1e-3):
          needed = best / _ref_lp(n, alpha) * side
          finished = sorted([needed + 0.5, needed, needed - 4.0], reverse=True)
          rows.append((limit, live, finished))
      rows.append((limit, live, [best + 1.0, NEG_INF, NEG_INF]))  # not full
      rows.append((limit, [NEG_INF] * 3, [best, best, best]))  # nothing live
  for limit, live, finished in list(rows[:20]):  # the live hypotheses unsorted
    rows.append((limit, live[::-1], finished))
  rng.shuffle(rows)
  return rows


@pytest.mark.parametrize("alpha", ALPHAS)
def test_beam_done_is_the_brute_force_answer_for_every_alpha(alpha):
  """done == no live hypothesis can still reach the nbest-th finished score at any length
  in [step + 1, limit], for nbest = 1, 2 and the whole beam (None), float32 states."""
  rng = np.random.default_rng(int(10 * alpha) + 100)
  beam, length = 3, 12
  done_fn = jax.jit(beam_done, static_argnames=("stop",))
  checked = {True: 0, False: 0}
  for step in (0, 1, 3, 6):
    rows = _rows(step, alpha, rng)
    limits = np.asarray([r[0] for r in rows], np.int32)
    live = np.asarray([r[1] for r in rows], np.float32)
    finished = np.asarray([r[2] for r in rows], np.float32)
    seqs = jnp.full((len(rows), beam, length), PAD_ID, jnp.int32)
    state = BeamState(
      step=jnp.asarray(step, jnp.int32),
      live_seqs=seqs,
      live_log_probs=jnp.asarray(live),
      finished_seqs=seqs,
      finished_scores=jnp.asarray(finished),
      cache=None,
    )
    for nbest in (1, 2, None):
      stop = Stop(beam_stop="exact", nbest=nbest)
      done = np.asarray(done_fn(state, jnp.asarray(limits), alpha, stop))
      rank = beam if nbest is None else nbest
      for i, (limit, row_live, row_finished) in enumerate(zip(limits, live, finished)):
        # The float32 values the function read, compared in float64.
        can = _can_still_enter(
          step, int(limit), row_live.astype(float), float(row_finished[rank - 1]), alpha
        )
        assert done[i] == (not can), (step, nbest, limit, row_live, row_finished)
        checked[bool(done[i])] += 1
  assert min(checked.values()) > 100  # both answers, many times


# --- the whole search against exhaustive search ------------------------------------------------


def _sparse_table(seed, batch, max_decode_len):
  """Random trie models in which `b` is possible at two depths only (0 and one more per
  sentence), so no sentence has more than 4 possible prefixes of any length: beam 4 is
  exact, and with 2 to 4 outputs ending at each length the finished set fills long before
  the limit, where the stopping rule decides."""
  table = _random_table(seed, batch, max_decode_len, eos_bias=1.0)
  rng = np.random.default_rng(seed)
  for b in range(batch):
    branching = {0, int(rng.integers(1, max_decode_len - 2))}
    for depth in set(range(max_decode_len)) - branching:
      table[b, _depth_nodes(depth), B] = NEG_INF
  return table


def _outputs(table, max_length):
  """(log-prob, sequence) of every output of nonzero probability and at most `max_length`
  tokens (float64; tests/test_decode.py's trie model read in numpy), prefix by prefix."""
  found, prefixes = [], [((), 0.0)]
  while prefixes:
    prefix, log_prob = prefixes.pop()
    log_probs = _ref_log_probs(table, prefix, SLOPE)
    found.append((log_prob + log_probs[EOS_ID], prefix + (EOS_ID,)))
    if len(prefix) + 1 < max_length:
      prefixes += [
        (prefix + (t,), log_prob + log_probs[t]) for t in (A, B) if log_probs[t] > NEG_INF
      ]
  return found


def _exhaustive(outputs, alpha):
  """`outputs` (`_outputs`) scored log p / lp(length), best first."""
  return sorted(
    ((log_prob / _ref_lp(len(seq), alpha), seq) for log_prob, seq in outputs), reverse=True
  )


@functools.partial(jax.jit, static_argnames=("beam_size", "nbest", "max_decode_len", "early_stop"))
def _search(table, max_lengths, alpha, *, beam_size, nbest, max_decode_len, early_stop=True):
  lm, cache = _trie_lm(table, max_decode_len, SLOPE)
  return decode.beam_search(
    lm,
    cache,
    max_lengths=max_lengths,
    max_decode_len=max_decode_len,
    search=SearchConfig(beam_size=beam_size, alpha=alpha, beam_stop="exact"),
    nbest=nbest,
    early_stop=early_stop,
  )


@pytest.mark.parametrize("nbest", [1, 4])
def test_exact_stop_gives_exhaustive_search_for_every_alpha(nbest):
  """Beam 4 >= the possible prefixes of each length (`_sparse_table`): the search is exact,
  so for each alpha (a negative one too: lp falls with length, and the best a live
  hypothesis can still reach is at the next step) the best output, and with nbest = 4 the
  whole finished set, equal exhaustive search. The stop fires before the limit (fewer steps
  than running every sentence to its limit), so a bound read at the wrong length stops too
  soon and misses the best."""
  max_lengths = np.asarray([8, 6, 8, 7, 8, 5, 8, 8], np.int32)
  beam_size, max_decode_len = 4, 8
  kwargs = dict(beam_size=beam_size, nbest=nbest, max_decode_len=max_decode_len)
  saved = dict.fromkeys(ALPHAS, 0)
  for seed in range(4):
    table = _sparse_table(900 + seed, len(max_lengths), max_decode_len)
    outputs = [_outputs(table[b], max_length) for b, max_length in enumerate(max_lengths)]
    for alpha in ALPHAS:
      (seqs, scores), steps = _run_counting_steps(_search, table, max_lengths, alpha, **kwargs)
      _, full_steps = _run_counting_steps(
        _search, table, max_lengths, alpha, early_stop=False, **kwargs
      )
      saved[alpha] += full_steps - steps
      for b in range(len(max_lengths)):
        ref = _exhaustive(outputs[b], alpha)[:beam_size]
        ref_scores = np.asarray([s for s, _ in ref])
        assert len(ref) == beam_size and ref_scores[0] - ref_scores[1] > 1e-4, (seed, alpha, b)
        assert _strip(seqs[b, 0]) == ref[0][1], (seed, alpha, b)
        np.testing.assert_allclose(scores[b, 0], ref_scores[0], rtol=1e-5, atol=1e-5)
        if nbest == 1:
          continue
        np.testing.assert_allclose(scores[b], ref_scores, rtol=1e-5, atol=1e-5)
        gaps = np.diff(ref_scores, prepend=np.inf, append=-np.inf)
        for i, (_, ref_seq) in enumerate(ref):
          if min(-gaps[i], -gaps[i + 1]) > 1e-4:  # the order is well defined
            assert _strip(seqs[b, i]) == ref_seq, (seed, alpha, b, i)
  assert all(saved.values()), saved  # the stop fired early for every alpha
