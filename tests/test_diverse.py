"""Diverse beam search (decoding/diverse.py) against a float64 numpy implementation over the
trie models of tests/test_decode.py, one program and staged."""

import numpy as np
import pytest

from t2t_jax.decoding import SearchConfig, programs
from tests import test_decode as trie


def _ref_diverse(table, max_length, beam, groups, strength, alpha):
  """Groups of beam / groups hypotheses choose in turn at each step, ranking extensions by
  log-prob - strength * (earlier choices of the token this step); every live hypothesis's
  EOS extension is offered to one finished set of the beam best by log p / lp."""
  size = beam // groups
  live = [[((), 0.0)] for _ in range(groups)]
  finished = []
  for step in range(max_length):
    chosen, new_live = [], []
    for g in range(groups):
      candidates = []
      for seq, log_prob in live[g]:
        log_probs = trie._ref_log_probs(table, seq, trie.SLOPE)
        end = seq + (trie.EOS_ID,)
        score = (log_prob + log_probs[trie.EOS_ID]) / trie._ref_lp(len(end), alpha)
        finished.append((score, end))
        if step + 1 < max_length:
          for t in (trie.A, trie.B):
            total = log_prob + log_probs[t]
            candidates.append((total - strength * chosen.count(t), total, seq + (t,)))
      picked = sorted(candidates, key=lambda c: -c[0])[:size]
      chosen += [c[2][-1] for c in picked]
      new_live.append([(c[2], c[1]) for c in picked])
    live = new_live
  return sorted(finished, reverse=True)[:beam]


@pytest.mark.parametrize("beam,groups,strength", [(2, 2, 50.0), (4, 2, 0.7), (6, 3, 1.5)])
@pytest.mark.parametrize("staged", [False, True])
def test_diverse_beam_search_equals_the_numpy_reference(beam, groups, strength, staged):
  """The best outputs and their scores (the model's log-probs / lp, no penalty) equal the
  reference's; with a strong penalty the groups take other first tokens, so the outputs
  differ from plain beam search's."""
  max_lengths = np.array([6, 5, 4], np.int32)
  table = trie._random_table(80 + beam, batch=3, max_decode_len=6)
  lm, cache = trie._trie_lm(table, 6, trie.SLOPE)
  seqs, scores = trie.decode.beam_search(
    lm,
    cache,
    max_lengths=max_lengths,
    max_decode_len=6,
    search=SearchConfig(
      beam_size=beam, alpha=0.6, diverse_groups=groups, diversity_strength=strength
    ),
    staged=staged,
  )
  seqs, scores = np.asarray(seqs), np.asarray(scores)
  for b in range(3):
    ref = _ref_diverse(table[b], int(max_lengths[b]), beam, groups, strength, 0.6)
    ref_scores = np.array([s for s, _ in ref])
    np.testing.assert_allclose(scores[b, : len(ref)], ref_scores, rtol=1e-5)
    gaps = np.diff(ref_scores, prepend=np.inf, append=-np.inf)
    for i, (_, ref_seq) in enumerate(ref):
      if min(-gaps[i], -gaps[i + 1]) > 1e-4:  # order well defined
        assert trie._strip(seqs[b, i]) == ref_seq
  if strength > 10:
    plain = trie._beam(table, max_lengths, 0.6, beam_size=beam, max_decode_len=6)
    assert not np.array_equal(np.asarray(plain[0]), seqs)


def test_diverse_groups_must_divide_the_beam():
  with pytest.raises(ValueError, match="diverse_groups=3 must divide beam_size=4"):
    SearchConfig(beam_size=4, diverse_groups=3)
  with pytest.raises(ValueError, match="diversity_strength=-1"):
    SearchConfig(beam_size=4, diverse_groups=2, diversity_strength=-1.0)
  # One group is plain beam search whatever the strength: the same compiled programs.
  one = programs.Decoding.of(SearchConfig(beam_size=4, diversity_strength=3.0))
  assert one == programs.Decoding.of(SearchConfig(beam_size=4))
