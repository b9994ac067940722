"""The target's leaf forms (config.data.tree_leaves: xx, words, positions): linearize and
rebuild invert each other, the word vocabulary holds every target token, and scoring counts
wrong leaves the same way whatever the form."""

import random

import numpy as np
import pytest

from t2t_jax import data
from t2t_jax.data import trees
from t2t_jax.data.sources import treebank
from t2t_jax.evaluation import parseval
from t2t_jax.tokens import UNK_ID
from tests import support

PTB = support.shared_data_dir() / "ptb_sample"
needs_ptb = pytest.mark.skipif(not PTB.is_dir(), reason="no ../shared/data/ptb_sample")

HAND = [
  "(S (NP (NNP John)) (VP (VBZ has) (NP (DT a) (NN dog))) (. .))",
  "(NP (NN x))",
  "(S (S (NP (PRP It)) (VP (VBD rained))) (, ,) (CC and) (S (NP (PRP we)) (VP (VBD left))))",
  "(FRAG (NP (NP (CD 3)) (PP (IN of) (NP (CD 4)))) (: --) (ADVP (RB only)))",
]


def _tree(text: str) -> trees.Tree:
  return next(trees.parse_brackets(text))[0]


def _random_tree(rng: random.Random, depth: int = 0) -> trees.Tree:
  """A random tree (a phrase at the root, as `trees.clean` leaves it) with labels from a few
  phrases and words of mixed shapes."""
  if depth and (depth > 3 or rng.random() < 0.3):
    word = rng.choice(["the", "Dog", "ran", "1987", "ex-post", "quickly", "-LRB-", ",", "cats"])
    return trees.Tree(rng.choice(["DT", "NN", "VBD", ","]), (word,))
  children = tuple(_random_tree(rng, depth + 1) for _ in range(rng.randint(1, 3)))
  return trees.Tree(rng.choice(["S", "NP", "VP", "PP", "SBAR"]), children)


def test_each_leaf_form_writes_its_own_leaf_tokens():
  words, xx = trees.linearize(_tree(HAND[0]))
  assert " ".join(xx) == "(S (NP XX )NP (VP XX (NP XX XX )NP )VP XX )S"
  assert " ".join(trees.linearize(_tree(HAND[0]), "words")[1]) == (
    "(S (NP John )NP (VP has (NP a dog )NP )VP . )S"
  )
  assert " ".join(trees.linearize(_tree(HAND[0]), "positions")[1]) == (
    "(S (NP XX1 )NP (VP XX2 (NP XX3 XX4 )NP )VP XX5 )S"
  )
  with pytest.raises(ValueError, match="'trees' must be one of"):
    trees.linearize(_tree(HAND[0]), "trees")
  with pytest.raises(ValueError, match="reads as a bracket"):
    trees.linearize(trees.Tree("S", (trees.Tree("NN", ("(NP",)),)), "words")


@pytest.mark.parametrize("leaves", trees.TREE_LEAVES)
def test_hand_written_and_random_trees_round_trip(leaves):
  rng = random.Random(0)
  cases = [_tree(t) for t in HAND] + [_random_tree(rng) for _ in range(300)]
  for tree in cases:
    words, symbols = trees.linearize(tree, leaves)
    # Brackets are the same in every form; only the leaf tokens differ.
    assert [s for s in symbols if trees.is_bracket(s)] == [
      s for s in trees.linearize(tree)[1] if trees.is_bracket(s)
    ]
    rebuilt, repairs = trees.rebuild(" ".join(symbols), words, leaves)
    assert rebuilt == trees.strip_tags(tree) and repairs == trees.Repairs(), str(tree)


@pytest.mark.slow
@needs_ptb
@pytest.mark.parametrize("leaves", trees.TREE_LEAVES)
def test_every_sample_tree_round_trips_in_each_leaf_form(leaves):
  c = data.default_config()
  c.update(source="treebank", treebank_dir=str(PTB), tree_leaves=leaves)
  c.update(treebank_train="1-199", treebank_dev="", treebank_test="")
  golds = treebank.gold_trees(c, "train")
  pairs = treebank.split_pairs(c, "train")
  assert len(golds) == len(pairs) == 3914
  for gold, (source, target) in zip(golds, pairs):
    rebuilt, repairs = trees.rebuild(target, source.split(), leaves)
    assert rebuilt == trees.strip_tags(gold) and repairs == trees.Repairs(), source
    assert parseval.score_outputs([target], [gold], leaves).f1 == 100.0


def test_rebuild_counts_leaf_tokens_not_of_their_place():
  words = ["Vinken", "is", "chairman"]
  # words: the word itself or its shape class (what the word vocabulary decodes a rare word
  # to) is right; another word is counted, and still stands for its place's word.
  tree, r = trees.rebuild("(S Vinken is chairman )S", words, "words")
  assert r == trees.Repairs() and tree.leaves() == words
  tree, r = trees.rebuild("(S <unk-cap> is chairman )S", words, "words")
  assert r == trees.Repairs()
  tree, r = trees.rebuild("(S <unk-num> was chairman )S", words, "words")
  assert r.wrong_leaf_tokens == 2 and not r.wrong_leaf_count and tree.leaves() == words
  tree, r = trees.rebuild("(S XX1 XX3 XX2 )S", words, "positions")
  assert r.wrong_leaf_tokens == 2 and tree.leaves() == words
  # A wrong number of leaves is repaired and counted the same way in every form.
  for leaves, out in [
    ("xx", "(S XX XX )S"),
    ("words", "(S Vinken is )S"),
    ("positions", "(S XX1 XX2 )S"),
  ]:
    tree, r = trees.rebuild(out, words, leaves)
    assert (r.missing_leaves, r.wrong_leaf_count) == (1, True) and tree.leaves() == words
    s = parseval.score_outputs(
      [out + " extra extra"],
      [trees.Tree("S", tuple(trees.Tree("NN", (w,)) for w in words))],
      leaves,
    )
    assert s.wrong_leaf_count == 1  # one leaf too many: the two extra tokens for one word


def _corpus(tmp_path, leaves):
  corpus = tmp_path / "ptb"
  corpus.mkdir(exist_ok=True)
  texts = [
    "( (S (NP (NNP John)) (VP (VBZ has) (NP (DT a) (NN dog))) (. .)) )\n"
    "( (S (NP (DT a) (NN dog)) (VP (VBZ barks))) )\n",
    "( (S (NP (NNP Mary)) (VP (VBZ has) (NP (DT a) (NN cat)))) )\n",
    "( (S (NP (DT a) (NN cat)) (VP (VBZ sleeps) (ADVP (RB quietly)))) )\n",
  ]
  for n, text in enumerate(texts, start=1):
    (corpus / f"wsj_{n:04d}.mrg").write_text(text)
  c = data.default_config()
  c.update(source="treebank", treebank_dir=str(corpus), tree_leaves=leaves, vocab_min_count=2)
  c.update(treebank_train="1", treebank_dev="2", treebank_test="3")
  c.update(max_len=24, tokens_per_batch=96, bucket_boundaries=(24,))
  return c


@pytest.mark.parametrize("leaves", trees.TREE_LEAVES)
def test_the_shared_vocabulary_holds_every_target_token(tmp_path, leaves):
  c = _corpus(tmp_path, leaves)
  d = data.get_datasets(c, str(tmp_path / "w"))
  tok = d.tokenizer
  symbols = tok.symbols
  if leaves == "xx":
    assert symbols[: symbols.index("XX") + 1] == ["(NP", "(S", "(VP", ")NP", ")S", ")VP", "XX"]
  elif leaves == "positions":
    assert [trees.position_symbol(k) for k in range(1, 25)] == [
      s for s in symbols if s.startswith("XX")
    ]
  else:
    assert "XX" not in symbols
  for source, target in d.dev_pairs + d.test_pairs + treebank.split_pairs(c, "train"):
    src, tgt = tok.encode(source), tok.encode(target)
    assert UNK_ID not in tgt, target
    leaf_ids = [i for i, s in zip(tgt, target.split()) if not trees.is_bracket(s)]
    assert len(leaf_ids) == len(src)
    if leaves == "words":  # the decoder copies: a leaf is its source word's very id
      assert leaf_ids == src
  # Dev's 'Mary' and 'cat' are rare: their leaves are their shape classes, as in the source.
  if leaves == "words":
    ((source, target),) = d.dev_pairs
    assert tok.decode(tok.encode(target)).split()[2] == "<unk-cap>"


def test_the_leaf_form_is_checked_and_names_its_flag(tmp_path):
  c = _corpus(tmp_path, "tags")
  with pytest.raises(data.DataError, match=r"config.data.tree_leaves='tags' must be one of"):
    data.get_datasets(c, str(tmp_path / "w"))


def test_a_store_of_one_leaf_form_is_refused_for_another(tmp_path):
  c = _corpus(tmp_path, "xx")
  data.get_datasets(c, str(tmp_path / "w"))
  c.tree_leaves = "words"
  with pytest.raises(data.DataError, match="tree_leaves"):
    data.get_datasets(c, str(tmp_path / "w"))


def test_older_manifests_and_fingerprints_read_as_xx_leaves(tmp_path):
  c = _corpus(tmp_path, "xx")
  source = treebank.Treebank()
  recorded = treebank.identity(c)
  older = {k: v for k, v in recorded.items() if k != "tree_leaves"}
  source.check_identity(tmp_path / "manifest.json", older, c)  # no error
  assert source.train_identity(c, older) == source.train_identity(c, recorded)
  assert "tree_leaves" not in source.train_identity(c, recorded)
  c.tree_leaves = "positions"
  with pytest.raises(data.DataError, match="tree_leaves"):
    source.check_identity(tmp_path / "manifest.json", older, c)
  assert source.train_identity(c, treebank.identity(c))["tree_leaves"] == "positions"


def test_score_is_the_same_for_the_same_tree_in_every_form():
  rng = np.random.default_rng(0)
  gold = _tree(HAND[2])
  words = gold.leaves()
  for _ in range(20):
    # A random corruption of the gold sequence: some brackets dropped, one leaf dropped.
    _, xx = trees.linearize(gold)
    keep = rng.random(len(xx)) > 0.2
    outs = {}
    for leaves in trees.TREE_LEAVES:
      _, symbols = trees.linearize(gold, leaves)
      outs[leaves] = " ".join(s for s, k in zip(symbols, keep) if k)
    scores = {k: parseval.score_outputs([o], [gold], k) for k, o in outs.items()}
    # Positions count misnumbered leaves once a leaf is dropped; the trees are the same.
    figures = {(s.f1, s.rebalanced, s.wrong_leaf_count) for s in scores.values()}
    assert len(figures) == 1, outs
    assert all(
      trees.rebuild(o, words, k)[0] == trees.rebuild(outs["xx"], words)[0] for k, o in outs.items()
    )
