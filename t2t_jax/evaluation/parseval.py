"""Labelled bracket precision, recall and F1 of parses, with EVALB's COLLINS.prm conventions.

The figure parsers report (the paper's Table 4: 91.3 F1 on WSJ section 23) is EVALB's
(Sekine and Collins 1997) with the COLLINS.prm parameters, which this module follows:

- a bracket is a phrase (not a part-of-speech tag) with its label and its span of words;
- LABELED 1: a test bracket matches a gold bracket of the same span and label, each gold
  bracket matched at most once (so repeated unary brackets count as a multiset);
- function tags and indices are removed from labels (NP-SBJ-1 -> NP, NP=2 -> NP);
- DELETE_LABEL TOP: the root bracket (TOP, or the treebank's unlabelled one) is not counted;
- DELETE_LABEL -NONE- , : `` '' . : empty elements and punctuation words are removed before
  spans are measured, and brackets left without words are not counted. Which words are
  punctuation is read from the GOLD tree's tags (a parser that emits XX has none of its own;
  EVALB is run on outputs with the gold tags put back for the same reason);
- EQ_LABEL ADVP PRT: the two labels are the same;
- every sentence counts (EVALB's summary line for all lengths, not only <= 40 words).

Precision = matched / test brackets, recall = matched / gold brackets, summed over the corpus.
`score_outputs` first turns each model output into a tree over the input words
(`t2t_jax.data.trees.rebuild`) and counts the outputs that needed repairs.
"""

import collections
import dataclasses
from collections.abc import Sequence

from t2t_jax.data import trees

DELETED_TAGS = frozenset({"-NONE-", ",", ":", "``", "''", "."})
EQUIVALENT_LABELS = {"PRT": "ADVP"}


def _label(label: str) -> str:
  base = trees.base_label(label)
  return EQUIVALENT_LABELS.get(base, base)


def brackets(
  tree: trees.Tree, deleted: Sequence[bool], labelled: bool = True
) -> collections.Counter:
  """The counted brackets of `tree` as a multiset of (start, end, label).

  `deleted[i]` says whether word i is removed before measuring spans (punctuation or an empty
  element, by the gold tags); start/end index the remaining words. With labelled=False
  (EVALB's LABELED 0) every label is ''.
  """
  kept_before = [0]
  for gone in deleted:
    kept_before.append(kept_before[-1] + (not gone))
  out = collections.Counter()

  def walk(node: trees.Tree, start: int, is_root: bool) -> int:
    if node.is_preterminal:
      return start + 1
    end = start
    for child in node.children:
      end = walk(child, end, False)
    label = _label(node.label) if labelled else ""
    if not (is_root and node.label in trees.ROOT_LABELS):
      a, b = kept_before[start], kept_before[end]
      if b > a:
        out[(a, b, label)] += 1
    return end

  end = walk(tree, 0, True)
  if end != len(deleted):
    raise ValueError(f"tree has {end} words but {len(deleted)} deletion flags")
  return out


@dataclasses.dataclass
class SentenceCounts:
  matched: int
  gold: int
  test: int


def score_sentence(test: trees.Tree, gold: trees.Tree, labelled: bool = True) -> SentenceCounts:
  """Matched, gold and test bracket counts of one parse; the words must be the same."""
  if test.leaves() != gold.leaves():
    raise ValueError(
      f"the parse's words differ from the gold tree's: {' '.join(test.leaves())!r} vs "
      f"{' '.join(gold.leaves())!r}"
    )
  deleted = [tag in DELETED_TAGS for tag in gold.tags()]
  g, t = brackets(gold, deleted, labelled), brackets(test, deleted, labelled)
  return SentenceCounts(sum((g & t).values()), sum(g.values()), sum(t.values()))


@dataclasses.dataclass
class ParseScore:
  """Corpus figures (percentages) and what rebuilding the outputs took."""

  precision: float
  recall: float
  f1: float
  exact: float  # % of sentences with every bracket right (EVALB's complete match)
  sentences: int
  matched: int
  gold_brackets: int
  test_brackets: int
  rebalanced: int = 0  # outputs whose brackets did not balance
  wrong_leaf_count: int = 0  # outputs with more or fewer leaf tokens than input words
  wrong_leaf_tokens: int = 0  # outputs with a leaf token not its place's (words, positions)

  def summary(self) -> str:
    return (
      f"bracket F1 {self.f1:.2f} (precision {self.precision:.2f}, recall {self.recall:.2f}; "
      f"EVALB COLLINS.prm, {self.sentences} sentences, {self.matched} of "
      f"{self.gold_brackets} gold / {self.test_brackets} test brackets matched); exact "
      f"{self.exact:.2f}%; outputs rebalanced {self.rebalanced}, with the wrong number of "
      f"leaves {self.wrong_leaf_count}"
      + (f", with a wrong leaf token {self.wrong_leaf_tokens}" if self.wrong_leaf_tokens else "")
    )


def corpus_score(
  tests: Sequence[trees.Tree], golds: Sequence[trees.Tree], labelled: bool = True
) -> ParseScore:
  """EVALB figures of parses against gold trees (same words, one gold per parse)."""
  if len(tests) != len(golds):
    raise ValueError(f"{len(tests)} parses but {len(golds)} gold trees")
  counts = [score_sentence(t, g, labelled) for t, g in zip(tests, golds)]
  matched = sum(c.matched for c in counts)
  gold = sum(c.gold for c in counts)
  test = sum(c.test for c in counts)
  precision = 100.0 * matched / test if test else 0.0
  recall = 100.0 * matched / gold if gold else 0.0
  f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
  exact = sum(c.matched == c.gold == c.test for c in counts)
  return ParseScore(
    precision,
    recall,
    f1,
    100.0 * exact / max(1, len(counts)),
    len(counts),
    matched,
    gold,
    test,
  )


def score_outputs(
  outputs: Sequence[str], golds: Sequence[trees.Tree], leaves: str = "xx"
) -> ParseScore:
  """Rebuilds each linearized output over its gold tree's words (its leaf tokens in form
  `leaves`, trees.TREE_LEAVES), then `corpus_score`.

  An output with the wrong number of leaves is repaired (`trees.rebuild`) and scored like any
  other, so it counts in every figure; EVALB would skip such a sentence ("length unmatch")
  and score the rest, which flatters a parser that miscounts."""
  if len(outputs) != len(golds):
    raise ValueError(f"{len(outputs)} outputs but {len(golds)} gold trees")
  rebuilt = [trees.rebuild(out, gold.leaves(), leaves) for out, gold in zip(outputs, golds)]
  score = corpus_score([tree for tree, _ in rebuilt], golds)
  score.rebalanced = sum(r.rebalanced for _, r in rebuilt)
  score.wrong_leaf_count = sum(r.wrong_leaf_count for _, r in rebuilt)
  score.wrong_leaf_tokens = sum(bool(r.wrong_leaf_tokens) for _, r in rebuilt)
  return score


def right_branching(words: Sequence[str], label: str = "S") -> trees.Tree:
  """The right-branching baseline: every suffix of two or more words is a constituent,
  (S w1 (S w2 (S ... (S wn-1 wn)))). All labels are `label`, so only S brackets can match."""
  node = trees.Tree(label, tuple(trees.Tree(trees.XX, (w,)) for w in words[-2:]))
  for word in reversed(words[:-2]):
    node = trees.Tree(label, (trees.Tree(trees.XX, (word,)), node))
  return node
