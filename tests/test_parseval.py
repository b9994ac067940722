"""EVALB (COLLINS.prm) bracket scoring on hand-made trees, each figure computed by hand."""

import pytest

from t2t_jax.data import trees
from t2t_jax.evaluation import parseval

# Words: The dog barked . -> after deleting '.', brackets S[0,3] NP[0,2] VP[2,3].
GOLD = "(S (NP (DT The) (NN dog)) (VP (VBD barked)) (. .))"


def _t(text: str) -> trees.Tree:
  return next(trees.parse_brackets(text))[0]


def _score(test: str, gold: str = GOLD, labelled: bool = True) -> parseval.ParseScore:
  return parseval.corpus_score([_t(test)], [_t(gold)], labelled)


def _prf(score):
  return round(score.precision, 2), round(score.recall, 2), round(score.f1, 2)


def test_perfect():
  s = _score(GOLD)
  assert _prf(s) == (100.0, 100.0, 100.0) and (s.matched, s.gold_brackets) == (3, 3)
  assert s.exact == 100.0


def test_one_wrong_label():
  # NP -> ADJP: 2 of 3 match both ways.
  s = _score("(S (ADJP (DT The) (NN dog)) (VP (VBD barked)) (. .))")
  assert _prf(s) == (66.67, 66.67, 66.67) and s.exact == 0.0
  # Unlabelled (EVALB LABELED 0) the same spans all match.
  assert _score("(S (ADJP (DT The) (NN dog)) (VP (VBD barked)) (. .))", labelled=False).f1 == 100


def test_one_missing_bracket():
  # No VP: precision 2/2, recall 2/3, F1 = 2 * 1 * 2/3 / (5/3) = 0.8.
  s = _score("(S (NP (DT The) (NN dog)) (VBD barked) (. .))")
  assert _prf(s) == (100.0, 66.67, 80.0)


def test_punctuation_is_ignored():
  # '.' inside the VP, or a bracket holding only punctuation, changes nothing.
  assert _score("(S (NP (DT The) (NN dog)) (VP (VBD barked) (. .)))").f1 == 100.0
  assert _score("(S (NP (DT The) (NN dog)) (VP (VBD barked)) (X (. .)))").f1 == 100.0
  # ... but a test bracket that differs on real words does not match: NP[0,3] is wrong.
  s = _score("(S (NP (DT The) (NN dog) (VBD barked)) (. .))")
  assert (s.matched, s.test_brackets, s.gold_brackets) == (1, 2, 3)


def test_punctuation_is_found_by_the_gold_tags():
  # A parser's XX tags carry no punctuation; the gold tree's '.' does.
  s = _score("(S (NP (XX The) (XX dog)) (VP (XX barked) (XX .)))")
  assert s.f1 == 100.0
  # Gold tagged "'" as POS (a word, kept): the span then includes it.
  gold = "(S (NP (NP (NNS analysts) (POS ')) (NNS estimates)))"
  assert _score("(S (NP (NP (XX analysts)) (XX ') (XX estimates)))", gold).matched == 2


def test_advp_and_prt_are_equal_and_function_tags_ignored():
  gold = "(S (NP-SBJ (PRP He)) (VP (VBD gave) (PRT (RP up))))"
  assert _score("(S (NP (XX He)) (VP (XX gave) (ADVP (XX up))))", gold).f1 == 100.0


def test_root_bracket_not_counted_and_repeated_brackets_are_a_multiset():
  assert _score(f"(TOP {GOLD})").f1 == 100.0
  assert _score(f"( {GOLD} )").test_brackets == 3
  # Gold NP over NP: test with one NP gets recall 3/4, precision 3/3.
  gold = "(S (NP (NP (DT The) (NN dog))) (VP (VBD barked)) (. .))"
  s = _score(GOLD, gold)
  assert (s.matched, s.gold_brackets, s.test_brackets) == (3, 4, 3)


def test_corpus_figures_sum_brackets_before_dividing():
  # Sentence 1 perfect (3/3), sentence 2 no VP (2 matched of 3 gold, 2 test): P 5/5, R 5/6.
  tests = [_t(GOLD), _t("(S (NP (DT The) (NN dog)) (VBD barked) (. .))")]
  s = parseval.corpus_score(tests, [_t(GOLD), _t(GOLD)])
  assert _prf(s) == (100.0, 83.33, round(2 * 100 * 83.333333 / 183.333333, 2))
  assert s.exact == 50.0


def test_score_outputs_rebuilds_and_counts_repairs():
  gold = _t(GOLD)
  s = parseval.score_outputs(
    ["(S (NP XX XX )NP (VP XX )VP XX )S", "(S (NP XX XX )NP (VP XX )VP XX"], [gold, gold]
  )
  assert s.f1 == 100.0 and (s.rebalanced, s.wrong_leaf_count) == (1, 0)
  s = parseval.score_outputs(["(S (NP XX XX )NP (VP XX XX XX )VP )S"], [gold])
  assert s.wrong_leaf_count == 1 and s.f1 == 100.0  # the extra XX is dropped
  # One word short: '.' joins S, so the brackets still match.
  s = parseval.score_outputs(["(S (NP XX XX )NP (VP XX )VP )S"], [gold])
  assert s.wrong_leaf_count == 1 and s.f1 == 100.0


def test_words_must_match():
  with pytest.raises(ValueError, match="words differ"):
    _score("(S (NP (DT A) (NN dog)) (VP (VBD barked)) (. .))")


def test_right_branching_baseline():
  tree = parseval.right_branching(["a", "b", "c", "d"])
  assert str(tree) == "(S (XX a) (S (XX b) (S (XX c) (XX d))))"
  # Against GOLD: S[0,4]->[0,3] matches S; S[1,4]->[1,3] and S[2,4]->[2,3] do not (VP there).
  s = parseval.corpus_score([parseval.right_branching(["The", "dog", "barked", "."])], [_t(GOLD)])
  assert (s.matched, s.test_brackets) == (1, 3)
