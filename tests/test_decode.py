"""Tests for t2t_jax.decoding.search against exhaustive float64 numpy search.

The language models here are tries over a 5-token vocabulary (PAD, EOS, BOS, a, b): every
prefix over {a, b} is a node with its own logits (PAD and BOS get -inf). The model reads the
node off the whole token history kept in its cache ([N, max_decode_len] leaf, plus a
per-row sentence index and a scalar step), so a search that gathers the cache wrongly, or
repeats a scalar leaf, or does not start from BOS, sees a different model and fails.
"""

import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from t2t_jax.decoding import SearchConfig, kernels, model_view, modes
from t2t_jax.decoding import search as decode
from t2t_jax.decoding.beam import length_penalty
from t2t_jax.decoding.model_view import BeamSlots, segment_bounds
from t2t_jax.tokens import BOS_ID, EOS_ID, PAD_ID
from tests import support

A, B = 3, 4
VOCAB = 5
SLOPE = 0.1  # logits are scaled by (1 + SLOPE * step): the model also reads the scalar leaf

_steps = []  # step indices seen by tokens_to_logits at run time (via jax.debug.callback)


# --- the trie language model (JAX side) --------------------------------------------------------


def _trie_lm(table, max_decode_len, slope):
  """tokens_to_logits over `table` [batch, nodes, VOCAB] and its cache for `batch` sentences."""
  table = jnp.asarray(table)
  batch = table.shape[0]
  cache = {
    "history": jnp.full((batch, max_decode_len), PAD_ID, jnp.int32),
    "sentence": jnp.arange(batch, dtype=jnp.int32),
    "step": jnp.array(0, jnp.int32),
  }

  def tokens_to_logits(ids, cache):
    step = cache["step"]
    jax.debug.callback(_steps.append, step)
    history = lax.dynamic_update_slice_in_dim(cache["history"], ids, step, axis=1)
    # Heap numbering of the prefix history[1..step]: node = 2^step - 1 + binary(prefix).
    pos = jnp.arange(max_decode_len)
    weights = jnp.where((pos >= 1) & (pos <= step), 2 ** jnp.clip(step - pos, 0, 30), 0)
    node = 2**step - 1 + jnp.sum(jnp.clip(history - A, 0, 1) * weights, axis=1)
    node = jnp.minimum(node, table.shape[1] - 1)
    logits = table[cache["sentence"], node] * (1.0 + slope * step)
    logits = jnp.where(history[:, :1] == BOS_ID, logits, jnp.roll(logits, 1, axis=-1))
    return logits, {"history": history, "sentence": cache["sentence"], "step": step + 1}

  return tokens_to_logits, cache


def _beam_search(
  table,
  max_lengths,
  alpha,
  *,
  beam_size,
  max_decode_len,
  slope=SLOPE,
  early_stop=True,
  stop="exact",
  staged=False,
):
  lm, cache = _trie_lm(table, max_decode_len, slope)
  return decode.beam_search(
    lm,
    cache,
    max_lengths=max_lengths,
    max_decode_len=max_decode_len,
    search=SearchConfig(beam_size=beam_size, alpha=alpha, beam_stop=stop),
    early_stop=early_stop,
    staged=staged,
  )


_beam_once = jax.jit(
  _beam_search, static_argnames=("beam_size", "max_decode_len", "slope", "early_stop", "stop")
)


def _beam(*args, staged=False, **kwargs):
  """Beam search over the trie model: one program, or (staged) from the host driver, which
  drops finished sentences from the batch down to one row."""
  if staged:
    return _beam_search(*args, staged=True, **kwargs)
  return _beam_once(*args, **kwargs)


def _greedy_search(table, max_lengths, *, max_decode_len, slope=SLOPE, staged=False):
  lm, cache = _trie_lm(table, max_decode_len, slope)
  return decode.greedy_search(
    lm,
    cache,
    max_lengths=max_lengths,
    max_decode_len=max_decode_len,
    eos_id=EOS_ID,
    bos_id=BOS_ID,
    staged=staged,
  )


_greedy_once = jax.jit(_greedy_search, static_argnames=("max_decode_len", "slope"))


def _greedy(*args, staged=False, **kwargs):
  if staged:
    return _greedy_search(*args, staged=True, **kwargs)
  return _greedy_once(*args, **kwargs)


def _run_counting_steps(fn, *args, **kwargs):
  """Runs fn and returns (outputs as numpy, number of tokens_to_logits calls)."""
  _steps.clear()
  out = jax.tree_util.tree_map(np.asarray, fn(*args, **kwargs))
  jax.effects_barrier()
  return out, len(_steps)


# --- tables ------------------------------------------------------------------------------------


def _num_nodes(max_decode_len):
  return 2**max_decode_len - 1  # prefixes of length <= max_decode_len - 1


def _depth_nodes(depth):
  return slice(2**depth - 1, 2 ** (depth + 1) - 1)


def _random_table(seed, batch, max_decode_len, eos_bias=0.0):
  table = np.random.default_rng(seed).normal(size=(batch, _num_nodes(max_decode_len), VOCAB)) * 2
  table[..., EOS_ID] += eos_bias
  table[..., PAD_ID] = table[..., BOS_ID] = -np.inf
  return table.astype(np.float32)


def _hand_table(probs, max_decode_len):
  """One sentence's table from {prefix: {token: prob}}; prefixes not listed end (EOS prob 1)."""
  table = np.full((1, _num_nodes(max_decode_len), VOCAB), -np.inf, np.float32)
  table[0, :, EOS_ID] = 0.0
  for prefix, dist in probs.items():
    row = np.full(VOCAB, -np.inf)
    for token, p in dist.items():
      row[token] = math.log(p)
    table[0, _node(prefix)] = row
  return table


# --- float64 numpy reference -------------------------------------------------------------------


def _node(prefix):
  node = 0
  for token in prefix:
    node = 2 * node + 1 + (token - A)
  return node


def _ref_log_probs(table, prefix, slope):
  logits = table[_node(prefix)].astype(np.float64) * (1 + slope * len(prefix))
  m = logits.max()
  return logits - (m + np.log(np.sum(np.exp(logits - m))))


def _ref_sequence_log_prob(table, seq, slope):
  return sum(_ref_log_probs(table, seq[:t], slope)[seq[t]] for t in range(len(seq)))


def _ref_lp(length, alpha):
  return ((5.0 + length) / 6.0) ** alpha


def _ref_exhaustive(table, max_length, alpha, slope=SLOPE):
  """Every output of length <= max_length ((a|b)* EOS), scored, best first."""
  scored = []
  for k in range(max_length):
    for prefix in itertools.product((A, B), repeat=k):
      seq = prefix + (EOS_ID,)
      scored.append((_ref_sequence_log_prob(table, seq, slope) / _ref_lp(len(seq), alpha), seq))
  return sorted(scored, reverse=True)


def _ref_greedy(table, max_length, slope=SLOPE):
  seq, total = (), 0.0
  while not seq or seq[-1] != EOS_ID:
    log_probs = _ref_log_probs(table, seq, slope)
    token = EOS_ID if len(seq) + 1 >= max_length else int(np.argmax(log_probs))
    seq, total = seq + (token,), total + log_probs[token]
  return seq, total


def _strip(row):
  """Output row -> tuple up to and including EOS; checks the PAD tail and no PAD before."""
  row = [int(t) for t in row]
  assert EOS_ID in row, row
  end = row.index(EOS_ID) + 1
  assert all(t == PAD_ID for t in row[end:]), row
  assert PAD_ID not in row[:end], row
  return tuple(row[:end])


# --- beam search vs exhaustive search ---------------------------------------------------------


@pytest.mark.parametrize("seed,staged", [(0, False), (1, False), (2, False), (3, True)])
def test_beam_search_equals_exhaustive_search(seed, staged):
  """Beam 16 >= the 2^4 prefixes of length 4 is exact: the top 16 equal exhaustive search,
  as one program and run by the host driver (sentences leave the batch as they finish)."""
  max_lengths = np.array([5, 3, 4], np.int32)
  table = _random_table(seed, batch=3, max_decode_len=6)
  for alpha in [0.0, 0.6, 1.5, 4.0] if not staged else [0.6, 4.0]:
    found = _beam(table, max_lengths, alpha, beam_size=16, max_decode_len=6, staged=staged)
    seqs, scores = map(np.asarray, found)
    for b, max_length in enumerate(max_lengths):
      ref = _ref_exhaustive(table[b], max_length, alpha)[:16]
      ref_scores = np.array([s for s, _ in ref])
      assert ref_scores[0] - ref_scores[1] > 1e-3  # a clear winner: the best is well defined
      assert _strip(seqs[b, 0]) == ref[0][1]
      np.testing.assert_allclose(scores[b, : len(ref)], ref_scores, rtol=1e-5, atol=1e-5)
      gaps = np.diff(ref_scores, prepend=np.inf, append=-np.inf)
      for i, (_, ref_seq) in enumerate(ref):
        if min(-gaps[i], -gaps[i + 1]) > 1e-4:  # order well defined
          assert _strip(seqs[b, i]) == ref_seq
      # Fewer possible outputs than beams: the rest are empty slots.
      assert np.all(scores[b, len(ref) :] == -np.inf)
      assert np.all(seqs[b, len(ref) :] == PAD_ID)


def test_early_stop_changes_nothing_but_the_step_count():
  """Stopping on the bound gives the same output as running every sentence to its limit.

  EOS is made likely (+2) so finished sets fill early and the stop is tempting; alpha up to
  4 rewards length, so a bound that ignored the longer lengths still reachable would stop
  too soon (checked deterministically in the length-penalty test below).
  """
  max_lengths = np.array([9, 7, 9, 4], np.int32)
  kwargs = dict(beam_size=3, max_decode_len=9)
  saved_steps = 0
  for seed in range(6):
    table = _random_table(100 + seed, batch=4, max_decode_len=9, eos_bias=2.0)
    for alpha in [0.0, 0.6, 2.0, 4.0]:
      (seqs, scores), steps = _run_counting_steps(_beam, table, max_lengths, alpha, **kwargs)
      (full_seqs, full_scores), full_steps = _run_counting_steps(
        _beam, table, max_lengths, alpha, early_stop=False, **kwargs
      )
      assert full_steps == 9
      np.testing.assert_array_equal(seqs, full_seqs)
      np.testing.assert_array_equal(scores, full_scores)
      saved_steps += full_steps - steps
  assert saved_steps > 0  # the stop did fire, so the comparison above means something


def test_beam_search_beats_greedy_on_a_hand_built_model():
  """Greedy takes `a` (p .5) and then ends (.35): p = .175. The best output is b EOS: p = .36."""
  probs = {
    (): {EOS_ID: 0.1, A: 0.5, B: 0.4},
    (A,): {EOS_ID: 0.35, A: 0.33, B: 0.32},
    (B,): {EOS_ID: 0.9, A: 0.05, B: 0.05},
  }
  table = _hand_table(probs, max_decode_len=3)
  max_lengths = np.array([3], np.int32)
  greedy_seqs, greedy_log_probs = _greedy(table, max_lengths, max_decode_len=3, slope=0.0)
  assert _strip(greedy_seqs[0]) == (A, EOS_ID)
  np.testing.assert_allclose(greedy_log_probs[0], math.log(0.5 * 0.35), rtol=1e-6)
  seqs, scores = _beam(table, max_lengths, 0.6, beam_size=2, max_decode_len=3, slope=0.0)
  assert _strip(seqs[0, 0]) == (B, EOS_ID)
  np.testing.assert_allclose(scores[0, 0], math.log(0.4 * 0.9) / (7 / 6) ** 0.6, rtol=1e-6)
  # Second best over all outputs: a a EOS, log(.5 * .33) / (8/6)^0.6 (a b EOS has .16).
  assert _strip(seqs[0, 1]) == (A, A, EOS_ID)
  np.testing.assert_allclose(scores[0, 1], math.log(0.5 * 0.33) / (8 / 6) ** 0.6, rtol=1e-6)


def test_beam_size_one_keeps_an_earlier_better_ending_greedy_passes_by():
  """Greedy goes a (.6), a (.4), EOS (1): p = .24. Beam 1 also finished EOS at step 0: p = .4.

  With a finished set, beam_size=1 returns the best of the ends met along the greedy path,
  which is not always greedy's.
  """
  probs = {(): {EOS_ID: 0.4, A: 0.6}, (A,): {EOS_ID: 0.3, A: 0.4, B: 0.3}}
  table = _hand_table(probs, max_decode_len=3)
  max_lengths = np.array([3], np.int32)
  greedy_seqs, greedy_log_probs = _greedy(table, max_lengths, max_decode_len=3, slope=0.0)
  assert _strip(greedy_seqs[0]) == (A, A, EOS_ID)
  np.testing.assert_allclose(greedy_log_probs[0], math.log(0.24), rtol=1e-6)
  seqs, scores = _beam(table, max_lengths, 0.6, beam_size=1, max_decode_len=3, slope=0.0)
  assert _strip(seqs[0, 0]) == (EOS_ID,)
  np.testing.assert_allclose(scores[0, 0], math.log(0.4), rtol=1e-6)


@pytest.mark.parametrize("seed", [0, 1])
def test_beam_size_one_equals_greedy_when_greedys_end_is_the_best_end_on_its_path(seed):
  """Beam 1 returns greedy's output whenever that beats every earlier end on greedy's path.

  Here EOS has logit -50 except at one depth per sentence, where it has +50: ending early
  costs about 50 nats, far more than the <= 7 log 2 nats of the random a/b choices on the
  way, so the condition holds and the a/b choices (random, history-dependent) must agree.
  """
  end_depths, max_lengths = [2, 4, 6], np.array([8, 5, 7], np.int32)
  table = _random_table(200 + seed, batch=3, max_decode_len=8)
  table[..., EOS_ID] = -50.0
  for b, depth in enumerate(end_depths):
    table[b, _depth_nodes(depth), EOS_ID] = 50.0
  greedy_seqs, greedy_log_probs = map(np.asarray, _greedy(table, max_lengths, max_decode_len=8))
  for alpha in [0.0, 0.6]:
    seqs, scores = map(np.asarray, _beam(table, max_lengths, alpha, beam_size=1, max_decode_len=8))
    np.testing.assert_array_equal(seqs[:, 0], greedy_seqs)
    lengths = np.sum(greedy_seqs != PAD_ID, axis=1)
    np.testing.assert_allclose(scores[:, 0] * _ref_lp(lengths, alpha), greedy_log_probs, rtol=1e-5)
  for b, depth in enumerate(end_depths):
    ref_seq, ref_log_prob = _ref_greedy(table[b], max_lengths[b])
    assert len(ref_seq) == depth + 1
    assert _strip(greedy_seqs[b]) == ref_seq
    np.testing.assert_allclose(greedy_log_probs[b], ref_log_prob, rtol=1e-5)


@pytest.mark.parametrize("staged", [False, True])
def test_greedy_search_equals_numpy_greedy(staged):
  max_lengths = np.array([8, 5, 7], np.int32)
  for seed in range(3):
    table = _random_table(300 + seed, batch=3, max_decode_len=8)
    seqs, log_probs = _greedy(table, max_lengths, max_decode_len=8, staged=staged)
    for b in range(3):
      ref_seq, ref_log_prob = _ref_greedy(table[b], max_lengths[b])
      assert _strip(seqs[b]) == ref_seq
      np.testing.assert_allclose(log_probs[b], ref_log_prob, rtol=1e-5)


@pytest.mark.parametrize("beam_size", [1, 2])
def test_length_penalty_flips_the_choice_where_the_formula_says(beam_size):
  """Short: EOS at once, p = .6 (length 1). Long: a a a EOS, p = .4 (length 4).

  The scores log .6 / lp(1) and log .4 / lp(4) tie where (9/6)^alpha = log .4 / log .6,
  i.e. alpha* = log(log .4 / log .6) / log 1.5 ~ 1.441; the long output wins above alpha*.

  With beam 1 the short output fills the finished set at step 0 while `a` (log .4) is live:
  an early stop bounding the live score by lp at the current length instead of the
  largest reachable one would stop there and miss the long winner above alpha*. With
  alpha = 0 and beam 2, a stop before the finished set is full would leave slot 2 empty.
  """
  probs = {(): {EOS_ID: 0.6, A: 0.4}, (A,): {A: 1.0}, (A, A): {A: 1.0}}
  table = _hand_table(probs, max_decode_len=6)
  max_lengths = np.array([6], np.int32)
  alpha_star = math.log(math.log(0.4) / math.log(0.6)) / math.log(1.5)
  short, long = (EOS_ID,), (A, A, A, EOS_ID)
  for alpha, winner, loser in [
    (0.0, short, long),
    (alpha_star - 1e-3, short, long),
    (alpha_star + 1e-3, long, short),
  ]:
    seqs, scores = _beam(
      table, max_lengths, alpha, beam_size=beam_size, max_decode_len=6, slope=0.0
    )
    expected = {short: math.log(0.6) / _ref_lp(1, alpha), long: math.log(0.4) / _ref_lp(4, alpha)}
    assert _strip(seqs[0, 0]) == winner
    np.testing.assert_allclose(scores[0, 0], expected[winner], rtol=1e-6)
    if beam_size == 2:
      assert _strip(seqs[0, 1]) == loser
      np.testing.assert_allclose(scores[0, 1], expected[loser], rtol=1e-6)


def test_heuristic_stop_misses_the_long_winner_the_exact_stop_finds():
  """The length-penalty test's model at alpha* + 1e-3, beam 1: after step 0 the finished
  set holds EOS (log .6 / lp(1)) and `a` (log .4) is live. Scored as if it ended now, `a`
  cannot win, so stop="heuristic" ends there; the exact rule sees that a a a EOS, with the
  larger lp(4), still can, continues, and returns it."""
  probs = {(): {EOS_ID: 0.6, A: 0.4}, (A,): {A: 1.0}, (A, A): {A: 1.0}}
  table = _hand_table(probs, max_decode_len=6)
  max_lengths = np.array([6], np.int32)
  alpha = math.log(math.log(0.4) / math.log(0.6)) / math.log(1.5) + 1e-3
  kwargs = dict(beam_size=1, max_decode_len=6, slope=0.0)
  (seqs, _), steps = _run_counting_steps(_beam, table, max_lengths, alpha, **kwargs)
  (h_seqs, h_scores), h_steps = _run_counting_steps(
    _beam, table, max_lengths, alpha, stop="heuristic", **kwargs
  )
  assert _strip(seqs[0, 0]) == (A, A, A, EOS_ID) and steps >= 4
  assert _strip(h_seqs[0, 0]) == (EOS_ID,) and h_steps == 1
  np.testing.assert_allclose(h_scores[0, 0], math.log(0.6), rtol=1e-6)  # lp(1) = 1


def test_heuristic_stop_is_the_exact_stop_without_a_length_reward():
  """For alpha <= 0 a longer ending never scores better, so both rules stop at the same step
  with the same outputs; for alpha > 0 the heuristic never runs longer than the exact rule."""
  max_lengths = np.array([9, 7, 9, 4], np.int32)
  kwargs = dict(beam_size=3, max_decode_len=9)
  saved = 0
  for seed in range(4):
    table = _random_table(700 + seed, batch=4, max_decode_len=9, eos_bias=2.0)
    for alpha in [-0.5, 0.0, 0.6, 2.0]:
      exact, steps = _run_counting_steps(_beam, table, max_lengths, alpha, **kwargs)
      heuristic, h_steps = _run_counting_steps(
        _beam, table, max_lengths, alpha, stop="heuristic", **kwargs
      )
      assert h_steps <= steps
      if alpha <= 0:
        assert h_steps == steps
        np.testing.assert_array_equal(heuristic[0], exact[0])
        np.testing.assert_array_equal(heuristic[1], exact[1])
      saved += steps - h_steps
  assert saved > 0  # with a length reward it did stop sooner somewhere


def test_unknown_stop_rule_is_refused():
  with pytest.raises(ValueError, match="stop='never'"):
    _beam(
      _random_table(1, 1, 3),
      np.array([3], np.int32),
      0.6,
      beam_size=2,
      max_decode_len=3,
      stop="never",
    )


def test_each_sentence_keeps_its_own_max_length():
  """Ending is cheap only past each sentence's limit, so outputs must be cut at the limit.

  Per sentence, EOS has logit -30 before the last allowed position, -3 at it (below a and
  b: greedy must be forced) and +5 after it (a search that ignores the limit ends there).
  """
  max_lengths = np.array([1, 3, 6], np.int32)
  table = _random_table(400, batch=3, max_decode_len=7)
  for b, max_length in enumerate(max_lengths):
    for depth in range(6):
      eos_logit = -30.0 if depth < max_length - 1 else -3.0 if depth == max_length - 1 else 5.0
      table[b, _depth_nodes(depth), EOS_ID] = eos_logit
  (seqs, scores), steps = _run_counting_steps(
    _beam, table, max_lengths, 0.6, beam_size=3, max_decode_len=7
  )
  assert steps <= 6  # not max_decode_len: every sentence is over once it is at its limit
  for b, max_length in enumerate(max_lengths):
    lengths = [len(_strip(row)) for row, score in zip(seqs[b], scores[b]) if score > -np.inf]
    assert lengths[0] == max_length and max(lengths) <= max_length
    best_score, best_seq = _ref_exhaustive(table[b], max_length, 0.6)[0]
    assert _strip(seqs[b, 0]) == best_seq
    np.testing.assert_allclose(scores[b, 0], best_score, rtol=1e-5)
  assert _strip(seqs[0, 0]) == (EOS_ID,)
  assert np.all(scores[0, 1:] == -np.inf)  # only one output of length <= 1 exists

  (greedy_seqs, _), greedy_steps = _run_counting_steps(
    _greedy, table, max_lengths, max_decode_len=7
  )
  assert greedy_steps == 6  # stops when all sentences have ended, not at max_decode_len
  assert [len(_strip(row)) for row in greedy_seqs] == list(max_lengths)


def test_jit_and_eager_calls_agree():
  table = _random_table(500, batch=2, max_decode_len=5)
  max_lengths = np.array([5, 4], np.int32)
  lm, cache = _trie_lm(jnp.asarray(table), 5, SLOPE)
  search = functools.partial(
    decode.beam_search,
    lm,
    max_lengths=max_lengths,
    max_decode_len=5,
    search=SearchConfig(beam_size=3, alpha=0.6),
  )
  eager_seqs, eager_scores = search(cache)
  jit_seqs, jit_scores = jax.jit(search)(cache)
  np.testing.assert_array_equal(eager_seqs, jit_seqs)
  np.testing.assert_allclose(eager_scores, jit_scores, rtol=1e-6)
  for b in range(2):
    assert _strip(jit_seqs[b, 0]) == _ref_exhaustive(table[b], max_lengths[b], 0.6)[0][1]


def test_cache_with_wrong_batch_dim_is_rejected():
  cache = {"k": jnp.zeros((3, 2)), "index": jnp.array(0)}
  with pytest.raises(ValueError, match=r"\(3, 2\).*batch = len\(max_lengths\) = 2"):
    decode.beam_search(
      lambda ids, c: (None, c), cache, max_lengths=np.array([2, 2]), max_decode_len=4
    )


def test_length_penalty_values():
  np.testing.assert_allclose(
    length_penalty(np.array([1, 4, 25]), 0.6), [1.0, 1.5**0.6, 5.0**0.6], rtol=1e-6
  )


# --- the optimized search against the straightforward one it replaced ---------------------------
#
# `_reference_beam_search` is the previous implementation, kept verbatim in substance: the
# cache is copied to every hypothesis and gathered whole after every step, one lax.top_k
# over beam * vocab, one while loop over the whole batch. Given the same model, the search
# in t2t_jax.decoding.search must return exactly the same sequences and scores (bit for bit, ties
# included) whether its batch compacts or not. Through the Transformer's beam-aware cache
# the model's own arithmetic differs in rounding (see the last test).


def _reference_beam_search(
  tokens_to_logits,
  cache,
  *,
  max_lengths,
  max_decode_len,
  beam_size,
  alpha,
  eos_id=EOS_ID,
  bos_id=BOS_ID,
):
  neg_inf = float("-inf")
  lp = lambda length: ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha
  nonscalar = lambda fn, tree: jax.tree_util.tree_map(
    lambda x: x if jnp.ndim(x) == 0 else fn(x), tree
  )
  max_lengths = jnp.clip(jnp.asarray(max_lengths, jnp.int32), 1, max_decode_len)
  batch = max_lengths.shape[0]

  def gather(tree, beams):
    rows = jnp.arange(beams.shape[0])[:, None]
    return nonscalar(lambda x: x[rows, beams], tree)

  def write(seqs, step, tokens):
    return lax.dynamic_update_slice_in_dim(seqs, tokens[..., None], step, axis=2)

  def body(state):
    step, live_seqs, live_lp, fin_seqs, fin_scores, cache = state
    prev = lax.dynamic_index_in_dim(live_seqs, jnp.maximum(step - 1, 0), axis=-1, keepdims=False)
    ids = jnp.where(step == 0, bos_id, prev)
    flat = nonscalar(lambda x: x.reshape((-1,) + x.shape[2:]), cache)
    logits, new = tokens_to_logits(ids.reshape(-1, 1), flat)
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    log_probs = log_probs.reshape(ids.shape + log_probs.shape[-1:])
    new = nonscalar(lambda x: x.reshape((batch, -1) + x.shape[1:]), new)
    at_limit = (step + 1 >= max_lengths)[:, None, None]
    log_probs = jnp.where(
      at_limit & (jnp.arange(log_probs.shape[-1]) != eos_id), neg_inf, log_probs
    )
    cand = live_lp[..., None] + log_probs
    eos_seqs = write(live_seqs, step, jnp.full(ids.shape, eos_id, jnp.int32))
    all_seqs = jnp.concatenate([fin_seqs, eos_seqs], axis=1)
    all_scores = jnp.concatenate([fin_scores, cand[..., eos_id] / lp(step + 1)], axis=1)
    fin_scores, top = lax.top_k(all_scores, beam_size)
    fin_seqs = gather(all_seqs, top)
    cand = cand.at[..., eos_id].set(neg_inf)
    live_lp, flat_index = lax.top_k(cand.reshape(batch, -1), beam_size)
    parent, token = flat_index // cand.shape[-1], flat_index % cand.shape[-1]
    live_seqs = write(gather(live_seqs, parent), step, token)
    return step + 1, live_seqs, live_lp, fin_seqs, fin_scores, gather(new, parent)

  def cond(state):
    step, _, live_lp, _, fin_scores, _ = state
    best = live_lp[:, 0] / jnp.maximum(lp(step + 1), lp(max_lengths))
    done = (live_lp[:, 0] == neg_inf) | (best < fin_scores[:, -1])
    return (step < max_decode_len) & ~jnp.all(done)

  empty = jnp.full((batch, beam_size, max_decode_len), PAD_ID, jnp.int32)
  live_lp = jnp.broadcast_to(
    jnp.where(jnp.arange(beam_size) == 0, 0.0, neg_inf), (batch, beam_size)
  )
  cache = nonscalar(
    lambda x: jnp.broadcast_to(x[:, None], (x.shape[0], beam_size) + x.shape[1:]), cache
  )
  init = (
    jnp.array(0, jnp.int32),
    empty,
    live_lp,
    empty,
    jnp.full((batch, beam_size), neg_inf, jnp.float32),
    cache,
  )
  step, live_seqs, live_lp, fin_seqs, fin_scores, _ = lax.while_loop(cond, body, init)
  has_finished = fin_scores[:, 0] > neg_inf
  seqs = jnp.where(has_finished[:, None, None], fin_seqs, live_seqs)
  scores = jnp.where(has_finished[:, None], fin_scores, live_lp / lp(step))
  return jnp.where((scores > neg_inf)[..., None], seqs, PAD_ID), scores


def _hashed_lm(embedding):
  """A per-row model with a large vocabulary and many tied logits: its state is a running
  mix of every token read (cache leaf [N, d]), logits are rounded to halves."""

  def tokens_to_logits(ids, cache):
    state = jnp.tanh(cache["state"] * 0.9 + embedding[ids[:, 0]])
    logits = jnp.round(8.0 * state @ embedding.T) / 2.0
    return logits, {"state": state, "step": cache["step"] + 1}

  return tokens_to_logits


@pytest.mark.parametrize("beam_size,alpha", [(4, 0.6), (3, 2.0), (1, 0.0)])
def test_beam_search_equals_reference_with_a_trie_model(beam_size, alpha):
  """32 sentences, limits 1..9, EOS likely: exactly equal, as one program and staged (the
  batch halves 32 -> 1 as sentences finish)."""
  rng = np.random.default_rng(600 + beam_size)
  max_lengths = rng.integers(1, 10, size=32).astype(np.int32)
  table = _random_table(600 + beam_size, batch=32, max_decode_len=9, eos_bias=1.0)
  kwargs = dict(beam_size=beam_size, max_decode_len=9)
  ref = jax.jit(
    lambda t, m, a: _reference_beam_search(
      *_trie_lm(t, 9, SLOPE), max_lengths=m, max_decode_len=9, beam_size=beam_size, alpha=a
    )
  )(table, max_lengths, jnp.float32(alpha))
  for staged in (False, True):  # alpha traced, as in the reference: x ** alpha rounds alike
    seqs, scores = _beam(table, max_lengths, jnp.float32(alpha), staged=staged, **kwargs)
    np.testing.assert_array_equal(seqs, ref[0])
    np.testing.assert_array_equal(scores, ref[1])


def test_beam_search_equals_reference_with_a_large_tied_vocabulary():
  """Vocabulary 2100 (the chunked top-k, with a short last chunk), logits full of ties,
  64 sentences of limits 2..12: exactly equal, as one program and staged."""
  vocab, batch, max_decode_len = 2100, 64, 12
  embedding = jax.random.normal(jax.random.PRNGKey(7), (vocab, 6)) * 0.7
  rng = np.random.default_rng(7)
  max_lengths = jnp.asarray(rng.integers(2, max_decode_len + 1, size=batch), jnp.int32)
  cache = {
    "state": jax.random.normal(jax.random.PRNGKey(8), (batch, 6)),
    "step": jnp.array(0, jnp.int32),
  }
  lm = _hashed_lm(embedding)
  kwargs = dict(max_lengths=max_lengths, max_decode_len=max_decode_len)
  ref = jax.jit(lambda c: _reference_beam_search(lm, c, beam_size=4, alpha=0.6, **kwargs))
  ref_seqs, ref_scores = ref(cache)
  lengths = np.sum(np.asarray(ref_seqs[:, 0]) != PAD_ID, axis=1)
  assert len(set(lengths.tolist())) > 4  # sentences end at many different steps
  kwargs["search"] = SearchConfig(beam_size=4, alpha=0.6)
  once = jax.jit(lambda c: decode.beam_search(lm, c, **kwargs))
  for search in (once, lambda c: decode.beam_search(lm, c, staged=True, **kwargs)):
    seqs, scores = search(cache)
    np.testing.assert_array_equal(seqs, ref_seqs)
    np.testing.assert_array_equal(scores, ref_scores)


def test_greedy_search_equals_reference_with_a_large_tied_vocabulary():
  """Vocabulary 2000 (16 chunks of 125: the argmax through the chunk maxima), logits full of
  ties within and across chunks, 48 sentences of limits 2..12: the tokens numpy's argmax
  picks (the first maximum) and their log-softmax in float64, as one program and staged."""
  vocab, batch, max_decode_len = 2000, 48, 12
  assert kernels.chunked(vocab)
  embedding = jax.random.normal(jax.random.PRNGKey(9), (vocab, 6)) * 0.7
  rng = np.random.default_rng(9)
  max_lengths = rng.integers(2, max_decode_len + 1, size=batch).astype(np.int32)
  cache = {
    "state": jax.random.normal(jax.random.PRNGKey(10), (batch, 6)),
    "step": jnp.array(0, jnp.int32),
  }
  lm = _hashed_lm(embedding)
  step = jax.jit(lm)
  ids, state = np.full((batch, 1), BOS_ID, np.int32), cache
  ref_seqs = np.full((batch, max_decode_len), PAD_ID, np.int32)
  ref_log_probs, done, ties = np.zeros(batch), np.zeros(batch, bool), 0
  for t in range(max_decode_len):
    logits, state = step(jnp.asarray(ids), state)
    logits = np.asarray(logits, np.float64)
    log_probs = (
      logits
      - np.log(np.sum(np.exp(logits - logits.max(-1, keepdims=True)), -1))[:, None]
      - logits.max(-1, keepdims=True)
    )
    at_max = (logits == logits.max(-1, keepdims=True)) & ~done[:, None]
    ties += int(np.sum(at_max.reshape(batch, -1, 125).any(-1).sum(-1) > 1))
    tokens = np.where(t + 1 >= max_lengths, EOS_ID, np.argmax(logits, -1))
    tokens = np.where(done, PAD_ID, tokens)
    ref_log_probs += np.where(done, 0.0, log_probs[np.arange(batch), tokens])
    ref_seqs[:, t] = tokens
    done |= tokens == EOS_ID
    ids = tokens[:, None].astype(np.int32)
  assert done.all() and ties >= 10, ties  # steps whose tied maxima lie in several chunks
  kwargs = dict(max_lengths=max_lengths, max_decode_len=max_decode_len, eos_id=EOS_ID)
  once = jax.jit(lambda c: decode.greedy_search(lm, c, **kwargs))
  for search in (once, lambda c: decode.greedy_search(lm, c, staged=True, **kwargs)):
    seqs, log_probs = search(cache)
    np.testing.assert_array_equal(seqs, ref_seqs)
    np.testing.assert_allclose(log_probs, ref_log_probs, rtol=1e-5)


@pytest.mark.parametrize("eos_id", [1, 130, 999])
def test_chunked_top_tokens_equal_lax_top_k_without_eos(eos_id):
  """The pruned top-k over chunks (EOS left out, the row max with EOS) against lax.top_k and
  jnp.max, on logits full of ties, with EOS in the first, a middle and the short last chunk."""
  rng = np.random.default_rng(9)
  x = np.round(rng.normal(size=(15, 1000)) * 2) / 2  # ties everywhere
  x[0] = -np.inf
  x[1, 500:] = -np.inf
  x[2, ::7] = 9.0  # many equal maxima
  x[3, eos_id] = 50.0  # EOS is the row's maximum
  x = jnp.asarray(x, jnp.float32)
  top_tokens = jax.jit(kernels.top_tokens, static_argnums=(1, 2, 3))
  masked = jnp.where(jnp.arange(1000) == eos_id, -jnp.inf, x)
  for k in (1, 4, 5):
    want = lax.top_k(masked, k)
    for chunk in (8, 16, 48, 125):  # 1000 = 125 * 8 = 62.5 * 16 = 20.8 * 48 = 8 * 125
      values, tokens, row_max = top_tokens(x, k, eos_id, chunk)
      np.testing.assert_array_equal(values, want[0])
      np.testing.assert_array_equal(tokens, want[1])
      np.testing.assert_array_equal(row_max, jnp.max(x, axis=-1))


def test_chunk_size_divides_the_vocabulary_where_it_can():
  assert kernels.chunk_size(8000) == 125
  assert kernels.chunk_size(32000) == 128
  assert kernels.chunk_size(37000) == 125
  assert kernels.chunk_size(7919) == 128  # a prime: no divisor near 128


def test_beam_slots_track_each_hypothesis_history():
  """After steps with given parents, each hypothesis reads its ancestors' slots."""
  slots = BeamSlots.create(batch_size=1, beam_size=3, max_decode_len=4)
  parents = [[0, 0, 0], [2, 0, 2], [1, 1, 0]]
  history = [[(0, b)] for b in range(3)]  # (position, slot) read at step 0: own slot
  for step, p in enumerate(parents):
    mask = np.asarray(slots.attention_mask()).reshape(3, 4, 3)  # [hyp, position, slot]
    for b in range(3):
      assert sorted(zip(*np.nonzero(mask[b]))) == history[b], (step, b)
    slots = slots.reorder(jnp.array([p], jnp.int32))
    history = [history[p[b]] + [(step + 1, b)] for b in range(3)]


def model_and_reference_searches(model, params, inputs, max_lengths, max_decode_len, beam_size):
  """(sequences, scores) of the Translator's search (`programs.decode_in_stages`: shared
  encoder keys/values, in-place slots, staged), then of `reference_search`; alpha 0.6."""
  found = _staged_search(model, params, inputs, max_lengths, max_decode_len, beam_size)
  return (*found, *reference_search(model, params, inputs, max_lengths, max_decode_len, beam_size))


def reference_search(model, params, inputs, max_lengths, max_decode_len, beam_size):
  """`_reference_beam_search` over the model's per-row decode_step (cache copied per
  hypothesis and gathered whole); alpha 0.6."""
  from t2t_jax.model import Transformer

  @jax.jit
  def reference(params, inputs, max_lengths):
    encoded = model.apply({"params": params}, inputs, method=Transformer.encode)
    _, state = model.apply(
      {"params": params},
      encoded,
      inputs,
      max_decode_len,
      method=Transformer.init_cache,
      mutable=["cache"],
    )

    def tokens_to_logits(ids, cache):
      logits, new = model.apply(
        {"params": params, "cache": cache}, ids, method=Transformer.decode_step, mutable=["cache"]
      )
      return logits, new["cache"]

    return _reference_beam_search(
      tokens_to_logits,
      state["cache"],
      max_lengths=max_lengths,
      max_decode_len=max_decode_len,
      beam_size=beam_size,
      alpha=0.6,
    )

  return tuple(np.asarray(x) for x in reference(params, inputs, max_lengths))


def _staged_search(model, params, inputs, max_lengths, max_decode_len, beam_size):
  """The Translator's search (`programs.decode_in_stages`), beam or greedy, alpha 0.6."""
  from t2t_jax.decoding import SearchConfig, programs

  settings = SearchConfig(beam_size=beam_size, alpha=0.6)
  batch = programs.Batch(inputs, max_lengths, None, jnp.arange(inputs.shape[0]))
  return programs.decode_in_stages(
    params,
    batch,
    programs.Knobs.of(settings),
    model=model,
    max_decode_len=max_decode_len,
    decoding=programs.Decoding.of(settings),
  )


@pytest.mark.slow
@pytest.mark.parametrize("first_segment", [16, pytest.param(2, marks=pytest.mark.slow)])
def test_transformer_beam_search_equals_reference(first_segment, monkeypatch):
  """The Transformer's beam-aware decoding (shared encoder keys/values, in-place slots,
  compaction, and with first_segment 2 a cache grown segment by segment: 2, 4, 8, 16
  positions) against the reference search over its per-row decode_step."""
  monkeypatch.setattr(model_view, "FIRST_SEGMENT", first_segment)
  monkeypatch.setattr(modes.Beam, "first_segment", first_segment)
  assert len(segment_bounds(16)) == (1 if first_segment == 16 else 4)
  from t2t_jax.model import Transformer, TransformerConfig

  cfg = TransformerConfig(
    vocab_size=60,
    d_model=32,
    d_ff=64,
    num_heads=4,
    num_layers=2,
    dropout_rate=0.0,
    max_len=32,
    share_embeddings=False,
  )
  model = Transformer(cfg)
  rng = np.random.default_rng(10)
  batch, src_len, max_decode_len = 32, 9, 16
  lengths = rng.integers(2, src_len + 1, size=batch)
  inputs = rng.integers(4, cfg.vocab_size, size=(batch, src_len))
  inputs[np.arange(src_len) >= lengths[:, None]] = PAD_ID
  inputs, max_lengths = jnp.asarray(inputs, jnp.int32), jnp.asarray(lengths + 4, jnp.int32)
  params = support.jit_init(model, jax.random.PRNGKey(10), inputs[:, :4], inputs[:, :4])
  # Peaked distributions and a likelier EOS: outputs end at many different lengths (random
  # parameters as they are give flat distributions, where ending at once scores best).
  output = params["decoder"]["logits"]
  output["kernel"] = output["kernel"] * 8.0
  output["bias"] = output["bias"].at[EOS_ID].set(3.0)

  seqs, scores, ref_seqs, ref_scores = model_and_reference_searches(
    model, params, inputs, max_lengths, max_decode_len, beam_size=4
  )
  out_lengths = np.sum(np.asarray(ref_seqs[:, 0]) != PAD_ID, axis=1)
  assert len(set(out_lengths.tolist())) > 4, out_lengths
  np.testing.assert_array_equal(seqs, ref_seqs)
  # The log-probs come from differently shaped computations of the same function (attention
  # over 4x the slots, masked; queries of 4 hypotheses against one copy of the encoder
  # keys/values), so the scores agree to rounding (max difference 5e-6 here), not bitwise.
  np.testing.assert_allclose(scores, ref_scores, rtol=1e-6, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("share_embeddings", [True, False])
def test_bfloat16_search_ranks_float32_logits_of_the_bfloat16_features(share_embeddings):
  """A bfloat16 model's beam and greedy searches score float32 logits: the same searches over
  logits computed here in float32 from the decoder's bfloat16 features give the same
  sequences and scores (logits rounded to bfloat16 would not)."""
  from t2t_jax.model import Transformer, TransformerConfig, beam_search_cache

  cfg = TransformerConfig(
    vocab_size=50,
    d_model=32,
    d_ff=64,
    num_heads=4,
    num_layers=2,
    dropout_rate=0.0,
    max_len=32,
    dtype="bfloat16",
    share_embeddings=share_embeddings,
  )
  model = Transformer(cfg)
  rng = np.random.default_rng(11)
  inputs = jnp.asarray(rng.integers(4, cfg.vocab_size, size=(4, 7)), jnp.int32)
  max_lengths = jnp.asarray([6, 8, 5, 8], jnp.int32)
  params = support.jit_init(model, jax.random.PRNGKey(11), inputs[:, :4], inputs[:, :4])
  max_decode_len = 8

  def features_logits(module, ids, mask):
    y, weights, bias = module.decoder(
      None, ids, mask, None, deterministic=True, decode=True, features=True
    )
    assert y.dtype == jnp.bfloat16
    w = weights.astype(jnp.bfloat16).astype(jnp.float32)
    logits = jnp.einsum("...d,vd->...v", y.astype(jnp.float32), w)
    return logits if bias is None else logits + bias

  def reference(params, inputs, max_lengths, beam_size):
    encoded = model.apply({"params": params}, inputs, method=Transformer.encode)
    _, state = model.apply(
      {"params": params},
      encoded,
      inputs,
      max_decode_len,
      method=Transformer.init_cache,
      mutable=["cache"],
    )
    if beam_size == 1:

      def step(ids, cache):
        logits, new = model.apply(
          {"params": params, "cache": cache},
          ids,
          None,
          method=features_logits,
          mutable=["cache"],
        )
        return logits[:, -1], new["cache"]

      seqs, log_probs = decode.greedy_search(
        step, state["cache"], max_lengths=max_lengths, max_decode_len=max_decode_len
      )
      return seqs[:, None], log_probs[:, None]

    def beam_step(ids, cache):
      model_cache, slots = cache
      logits, new = model.apply(
        {"params": params, "cache": model_cache},
        ids,
        slots.attention_mask(),
        method=features_logits,
        mutable=["cache"],
      )
      return logits, (new["cache"], slots)

    cache = (
      beam_search_cache(state["cache"], beam_size),
      BeamSlots.create(inputs.shape[0], beam_size, max_decode_len),
    )
    return decode.beam_search(
      beam_step,
      cache,
      max_lengths=max_lengths,
      max_decode_len=max_decode_len,
      search=SearchConfig(beam_size=beam_size, alpha=0.6),
      reorder_cache=lambda c, parents: (c[0], c[1].reorder(parents)),
    )

  for beam_size in (3, 1):
    seqs, scores = _staged_search(model, params, inputs, max_lengths, max_decode_len, beam_size)
    ref_seqs, ref_scores = jax.jit(reference, static_argnums=3)(
      params, inputs, max_lengths, beam_size
    )
    assert scores.dtype == jnp.float32
    np.testing.assert_array_equal(seqs, ref_seqs)
    np.testing.assert_allclose(scores, ref_scores, rtol=1e-6, atol=1e-5)
