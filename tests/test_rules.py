"""The decoding rules (decoding/rules.py, decoding/no_repeat.py) against Python references,
the searches under them against the trie model's float64 references (tests/test_decode.py),
and the scores every mode returns against the model's teacher-forced log-probabilities
(what t2t-score computes)."""

import itertools

import jax.numpy as jnp
import numpy as np
import pytest

from t2t_jax.decoding import SearchConfig, rules, scoring, search_batch
from t2t_jax.decoding.no_repeat import NoRepeatNgram
from t2t_jax.tokens import EOS_ID, PAD_ID
from tests import test_decode as trie
from tests.test_staged_search import _batch, _model_and_params


def _banned_reference(seq: list[int], n: int, vocab: int) -> set[int]:
  """Tokens t for which seq + [t] holds some n-gram twice (EOS never)."""
  banned = set()
  for t in range(vocab):
    out = seq + [t]
    grams = [tuple(out[i : i + n]) for i in range(len(out) - n + 1)]
    if t != EOS_ID and len(grams) != len(set(grams)) and grams and grams.count(grams[-1]) > 1:
      banned.add(t)
  return banned


@pytest.mark.parametrize("n", [1, 2, 3])
def test_no_repeat_ngram_bans_what_a_python_reference_bans(n):
  """Random rows over 5 tokens (many repeats) at every step: the allowed tokens are the
  complement of the reference's banned set."""
  rng = np.random.default_rng(n)
  rows, length, vocab = 12, 10, 6
  seqs = rng.integers(3, vocab, size=(rows, length)).astype(np.int32)
  rule = NoRepeatNgram(n)
  for step in range(length):
    written = np.where(np.arange(length) < step, seqs, PAD_ID)
    view = rules.View(jnp.int32(step), jnp.asarray(written), jnp.full(rows, 99), None, vocab)
    allowed = np.asarray(rule.choice(view, None).tokens)
    for r in range(rows):
      want = _banned_reference(seqs[r, :step].tolist(), n, vocab)
      assert set(np.flatnonzero(~allowed[r]).tolist()) == want, (n, step, r)


def test_a_bad_ngram_size_is_refused():
  with pytest.raises(ValueError, match="no_repeat_ngram=0"):
    NoRepeatNgram(0)
  with pytest.raises(ValueError, match="no_repeat_ngram=-1"):
    SearchConfig(no_repeat_ngram=-1)


def test_merged_choices_allow_what_every_rule_allows():
  """merge, token_mask and end_where_stopped against numpy on random restrictions."""
  rng = np.random.default_rng(0)
  rows, vocab = 7, 9
  parts = [
    rules.Choice(tokens=jnp.asarray(rng.random((rows, vocab)) < 0.7)),
    rules.Choice(go_on=jnp.asarray(rng.random(rows) < 0.6)),
    rules.Choice(eos=jnp.asarray(rng.random(rows) < 0.5)),
    rules.Choice(tokens=jnp.asarray(rng.random((rows, vocab)) < 0.7)),
  ]
  merged = rules.merge(parts)
  tokens = np.asarray(parts[0].tokens) & np.asarray(parts[3].tokens)
  np.testing.assert_array_equal(merged.tokens, tokens)
  mask = tokens.copy()
  mask[:, EOS_ID] &= np.asarray(parts[2].eos)
  np.testing.assert_array_equal(rules.token_mask(merged, vocab), mask)
  picked = jnp.arange(rows, dtype=jnp.int32) + 3
  want = np.where(np.asarray(parts[1].go_on), np.arange(rows) + 3, EOS_ID)
  np.testing.assert_array_equal(rules.end_where_stopped(merged, picked), want)
  assert rules.token_mask(rules.Choice(), vocab) is None


def _ref_greedy_no_repeat(table, max_length, n):
  """Numpy greedy over the trie model's float64 log-probs with the n-gram ban."""
  seq, total = (), 0.0
  while not seq or seq[-1] != trie.EOS_ID:
    log_probs = trie._ref_log_probs(table, seq, trie.SLOPE).copy()
    for t in _banned_reference(list(seq), n, trie.VOCAB):
      log_probs[t] = -np.inf
    token = trie.EOS_ID if len(seq) + 1 >= max_length else int(np.argmax(log_probs))
    total += trie._ref_log_probs(table, seq, trie.SLOPE)[token]
    seq += (token,)
  return seq, total


def _ref_exhaustive_no_repeat(table, max_length, alpha, n):
  """Every output without a repeated n-gram, scored, best first."""
  scored = []
  for k in range(max_length):
    for prefix in itertools.product((trie.A, trie.B), repeat=k):
      grams = [prefix[i : i + n] for i in range(len(prefix) - n + 1)]
      if len(grams) != len(set(grams)):
        continue
      seq = prefix + (trie.EOS_ID,)
      log_prob = trie._ref_sequence_log_prob(table, seq, trie.SLOPE)
      scored.append((log_prob / trie._ref_lp(len(seq), alpha), seq))
  return sorted(scored, reverse=True)


@pytest.mark.parametrize("staged", [False, True])
def test_searches_without_repeated_ngrams_equal_the_trie_references(staged):
  """Greedy with no 2-gram twice equals numpy greedy under the ban; beam 16 equals the
  exhaustive search over the outputs without a repeated 3-gram (a/b outputs repeat soon)."""
  max_lengths = np.array([8, 6, 7], np.int32)
  table = trie._random_table(70, batch=3, max_decode_len=8)
  lm, cache = trie._trie_lm(table, 8, trie.SLOPE)
  seqs, log_probs = trie.decode.greedy_search(
    lm,
    cache,
    max_lengths=max_lengths,
    max_decode_len=8,
    search=SearchConfig(beam_size=1, no_repeat_ngram=2),
    staged=staged,
  )
  for b in range(3):
    ref_seq, ref_log_prob = _ref_greedy_no_repeat(table[b], max_lengths[b], 2)
    assert trie._strip(np.asarray(seqs[b])) == ref_seq
    np.testing.assert_allclose(log_probs[b], ref_log_prob, rtol=1e-5)
  lm, cache = trie._trie_lm(table, 8, trie.SLOPE)
  seqs, scores = trie.decode.beam_search(
    lm,
    cache,
    max_lengths=max_lengths,
    max_decode_len=8,
    search=SearchConfig(beam_size=16, alpha=0.6, no_repeat_ngram=3),
    staged=staged,
  )
  for b in range(3):
    best_score, best_seq = _ref_exhaustive_no_repeat(table[b], max_lengths[b], 0.6, 3)[0]
    assert trie._strip(np.asarray(seqs[b, 0])) == best_seq
    np.testing.assert_allclose(scores[b, 0], best_score, rtol=1e-5)


@pytest.mark.parametrize("mode", ["beam", "greedy", "sample"])
def test_scores_are_the_models_log_probs_in_every_mode(mode):
  """With EOS only at the limit (every output runs to it) and no repeated 2-gram, each
  mode's returned log-probability (beam: score times the length penalty) equals the
  teacher-forced log-probability of the same output (`scoring.target_log_probs`, t2t-score's
  figure): the rules remove choices but never renormalise, and EOS stays in the softmax."""
  model, params = _model_and_params()
  inputs, limits = _batch(8, extra=6, seed=5)
  settings = SearchConfig(
    beam_size=4 if mode == "beam" else 1,
    alpha=0.6,
    sampling=mode == "sample",
    num_samples=2 if mode == "sample" else 1,
    no_repeat_ngram=2,
  )
  seqs, scores = search_batch(
    params,
    inputs,
    limits,
    model=model,
    max_decode_len=16,
    search=settings,
    eos_only_at_limit=True,
    nbest=settings.hypotheses,
  )
  seqs, scores = np.asarray(seqs)[:, 0], np.asarray(scores)[:, 0]
  lengths = (seqs != PAD_ID).sum(-1)
  np.testing.assert_array_equal(lengths, np.minimum(np.asarray(limits), 16))
  if mode == "beam":
    scores = scores * ((5.0 + lengths) / 6.0) ** 0.6
  forced = np.asarray(scoring.target_log_probs(params, inputs, jnp.asarray(seqs), model=model))
  assert np.all(forced.sum(-1) > -1e3)  # no -1e9 for a suppressed EOS
  np.testing.assert_allclose(scores, forced.sum(-1), rtol=1e-4)


def _ref_min_length(sources: np.ndarray, limits: np.ndarray, ratio: float) -> list[int]:
  """Each sentence's minimum output length, EOS included: ceil(ratio * its source tokens),
  within its limit (Python's own arithmetic)."""
  lengths = [int(np.sum(row != PAD_ID)) for row in sources]
  return [min(int(np.ceil(np.float32(ratio) * n)), int(m)) for n, m in zip(lengths, limits)]


@pytest.mark.parametrize("staged", [False, True])
def test_searches_with_a_minimum_length_ratio_equal_the_trie_references(staged):
  """Sources of 2-7 tokens and ratio 1.3: greedy equals numpy greedy with EOS banned
  before each sentence's minimum; beam 16 equals the exhaustive search over the outputs at
  least that long; every output holds its minimum (a rule registered in rulebook.py and
  turned on by SearchConfig.min_length_ratio alone)."""
  max_lengths = np.array([8, 6, 7, 8], np.int32)
  sources = np.zeros((4, 7), np.int32)
  for row, n in enumerate([2, 4, 7, 5]):
    sources[row, :n] = np.arange(3, 3 + n)
  minimum = _ref_min_length(sources, max_lengths, 1.3)
  assert minimum == [3, 6, 7, 7]  # one capped at its limit
  table = trie._random_table(71, batch=4, max_decode_len=8, eos_bias=1.5)
  lm, cache = trie._trie_lm(table, 8, trie.SLOPE)
  common = dict(max_lengths=max_lengths, max_decode_len=8, sources=jnp.asarray(sources))
  greedy = SearchConfig(beam_size=1, min_length_ratio=1.3)
  seqs, log_probs = trie.decode.greedy_search(lm, cache, search=greedy, staged=staged, **common)
  for b in range(4):
    seq, total = (), 0.0
    while not seq or seq[-1] != EOS_ID:
      step_log_probs = trie._ref_log_probs(table[b], seq, trie.SLOPE).copy()
      if len(seq) + 1 < minimum[b]:
        step_log_probs[EOS_ID] = -np.inf
      last = len(seq) + 1 >= max_lengths[b]
      token = EOS_ID if last else int(np.argmax(step_log_probs))
      total += trie._ref_log_probs(table[b], seq, trie.SLOPE)[token]
      seq += (token,)
    assert trie._strip(np.asarray(seqs[b])) == seq and len(seq) >= minimum[b]
    np.testing.assert_allclose(log_probs[b], total, rtol=1e-5)
  lm, cache = trie._trie_lm(table, 8, trie.SLOPE)
  beam = SearchConfig(beam_size=16, alpha=0.6, min_length_ratio=1.3)
  seqs, scores = trie.decode.beam_search(lm, cache, search=beam, staged=staged, **common)
  for b in range(4):
    ranked = [
      (score, seq)
      for score, seq in trie._ref_exhaustive(table[b], max_lengths[b], 0.6)
      if len(seq) >= minimum[b]
    ]
    assert trie._strip(np.asarray(seqs[b, 0])) == ranked[0][1]
    np.testing.assert_allclose(scores[b, 0], ranked[0][0], rtol=1e-5)
  plain = trie.decode.greedy_search(lm, cache, search=SearchConfig(beam_size=1), **common)[0]
  assert min(len(trie._strip(np.asarray(s))) for s in plain) < 3  # the rule did change them


def test_a_minimum_length_needs_the_sources():
  with pytest.raises(ValueError, match="min_length_ratio needs the sources"):
    trie.decode.greedy_search(
      lambda ids, cache: (jnp.zeros((1, trie.VOCAB)), cache),
      {},
      max_lengths=[4],
      max_decode_len=4,
      search=SearchConfig(beam_size=1, min_length_ratio=0.5),
    )
  with pytest.raises(ValueError, match=r"^min_length_ratio=-0\.5 must be >= 0 \(0: off\)$"):
    SearchConfig(min_length_ratio=-0.5)
