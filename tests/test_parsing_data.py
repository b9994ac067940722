"""Parsing data (paper 6.3): bracket reading, cleaning, linearization and its inverse, the
treebank source and its word vocabulary."""

import pytest

from t2t_jax import data
from t2t_jax.data import tokenizer, trees
from t2t_jax.data.sources import treebank
from tests import support

PTB = support.shared_data_dir() / "ptb_sample"
needs_ptb = pytest.mark.skipif(not PTB.is_dir(), reason="no ../shared/data/ptb_sample")

RAW = """
( (S
    (NP-SBJ-1 (NNP John) )
    (VP (VBZ has)
      (NP (DT a) (NN dog) )
      (SBAR (-NONE- 0)
        (S (-NONE- *T*-1) )))
    (. .) ))
"""


def _tree(text: str) -> trees.Tree:
  (tree, _), *rest = list(trees.parse_brackets(text))
  assert not rest
  return tree


def test_clean_removes_empty_elements_function_tags_and_root():
  cleaned = trees.clean(_tree(RAW))
  # -NONE- gone, SBAR and S left empty gone, NP-SBJ-1 -> NP, the unlabelled root dropped.
  assert str(cleaned) == "(S (NP (NNP John)) (VP (VBZ has) (NP (DT a) (NN dog))) (. .))"
  assert trees.base_label("NP-SBJ-1") == "NP" and trees.base_label("NP=2") == "NP"
  assert trees.base_label("-NONE-") == "-NONE-" and trees.base_label("-LRB-") == "-LRB-"


def test_linearize_in_the_style_of_vinyals():
  words, symbols = trees.linearize(trees.clean(_tree(RAW)))
  assert words == ["John", "has", "a", "dog", "."]
  assert " ".join(symbols) == "(S (NP XX )NP (VP XX (NP XX XX )NP )VP XX )S"


def test_rebuild_repairs_and_counts():
  words = ["a", "b", "c", "d"]
  tree, r = trees.rebuild("(S (NP XX XX )NP (VP XX XX )VP )S", words)
  assert str(tree) == "(S (NP (XX a) (XX b)) (VP (XX c) (XX d)))" and r == trees.Repairs()
  # Unclosed brackets close at the end; a wrong closing label closes the innermost one.
  tree, r = trees.rebuild("(S (NP XX XX )VP (VP XX XX", words)
  assert str(tree) == "(S (NP (XX a) (XX b)) (VP (XX c) (XX d)))"
  assert (r.unclosed, r.mislabelled, r.rebalanced, r.wrong_leaf_count) == (2, 1, True, False)
  # Extra closings are ignored, extra leaves dropped, empty constituents removed.
  tree, r = trees.rebuild(")S (S (NP XX XX XX XX XX )NP (PP )PP )S", words)
  assert str(tree) == "(S (NP (XX a) (XX b) (XX c) (XX d)))"
  assert (r.unopened, r.extra_leaves, r.empty) == (1, 1, 1)
  # Missing words join the top constituent; several top pieces go under TOP.
  tree, r = trees.rebuild("(S (NP XX )NP XX )S", words)
  assert str(tree) == "(S (NP (XX a)) (XX b) (XX c) (XX d))" and r.missing_leaves == 2
  tree, r = trees.rebuild("(NP XX XX )NP (VP XX XX )VP", words)
  assert str(tree) == "(TOP (NP (XX a) (XX b)) (VP (XX c) (XX d)))"
  tree, r = trees.rebuild("", words)
  assert str(tree) == "(TOP (XX a) (XX b) (XX c) (XX d))" and r.missing_leaves == 4


@pytest.mark.parametrize(
  "text, message",
  [
    ("(S (NP (NN a))", "line 1: bracket opened here is never closed"),
    ("(S (NN a)))", "line 1: ')' closes no open bracket"),
    ("word (S (NN a))", "line 1: 'word' outside any bracket"),
    ("(S (NN a b))", "holds the word 'a' beside others"),
    ("(S ())", "empty bracket"),
  ],
)
def test_malformed_brackets(text, message):
  with pytest.raises(trees.BracketError, match=message.replace("(", r"\(").replace(")", r"\)")):
    list(trees.parse_brackets(text))


def _config(directory, **overrides):
  c = data.default_config()
  c.update(source="treebank", treebank_dir=str(directory), **overrides)
  return c


def test_reader_names_file_and_sentence_of_a_malformed_tree(tmp_path):
  good = "( (S (NP (NN a)) (VP (VBD b))) )\n"
  (tmp_path / "wsj_0001.mrg").write_text(good * 2 + "( (S (NP (NN a)) (VP (VBD b)) )\n")
  with pytest.raises(data.DataError, match=r"wsj_0001.mrg: sentence 3: line 3: .*never closed"):
    data.get_datasets(
      _config(tmp_path, treebank_train="1", treebank_dev="", treebank_test=""), str(tmp_path / "w")
    )
  (tmp_path / "wsj_0001.mrg").write_text(good + "( (S (-NONE- *)) )\n")
  with pytest.raises(data.DataError, match=r"wsj_0001.mrg: sentence 2: no words left"):
    treebank.split_pairs(
      _config(tmp_path, treebank_train="1", treebank_dev="", treebank_test=""), "train"
    )


def test_split_flags_are_checked(tmp_path):
  for n in (1, 2, 3):
    (tmp_path / f"wsj_{n:04d}.mrg").write_text("( (S (NN a)) )\n")
  assert treebank.file_numbers("1-3,7", "x") == [1, 2, 3, 7]
  with pytest.raises(data.DataError, match="treebank_dev: wsj_0002.mrg is also in treebank_train"):
    treebank.split_files(_config(tmp_path, treebank_train="1-2", treebank_dev="2-3"))
  with pytest.raises(data.DataError, match="treebank_test: .*wsj_0004.mrg does not exist"):
    treebank.split_files(_config(tmp_path, treebank_train="1", treebank_dev="2", treebank_test="4"))
  with pytest.raises(data.DataError, match="config.data.treebank_train='3-1'"):
    treebank.split_files(_config(tmp_path, treebank_train="3-1"))
  with pytest.raises(data.DataError, match="treebank_dir="):
    treebank.split_files(_config(tmp_path / "absent"))


def test_word_tokenizer_reads_unknown_words_as_their_shape():
  assert [
    tokenizer.word_class(w)
    for w in ["1987", "Vinken", "ex-dividend", "going", "owned", "only", "cats", "x"]
  ] == [
    "<unk-num>",
    "<unk-cap>",
    "<unk-hyphen>",
    "<unk-ing>",
    "<unk-ed>",
    "<unk-ly>",
    "<unk-s>",
    "<unk-other>",
  ]
  tok = tokenizer.WordTokenizer(["(S", ")S", "XX", "<unk-cap>", "the"])
  ids = tok.encode("the Dog barked")
  assert ids == [8, 7, 3]  # 4 reserved ids; no <unk-ed> in this list: UNK
  assert tok.decode(tok.encode("(S XX )S")) == "(S XX )S"


@needs_ptb
def test_every_sample_tree_round_trips():
  """tree -> (words, sequence) -> tree gives the same tree (tags as XX) for all 3,914 trees;
  the reader sees the sample's 100,676 leaves (the count nltk documents for it)."""
  count = leaves = 0
  for path in sorted(PTB.glob("wsj_*.mrg")):
    for raw in treebank.read_trees(str(path)):
      count += 1
      leaves += len(raw.leaves())
      cleaned = trees.clean(raw)
      words, symbols = trees.linearize(cleaned)
      rebuilt, repairs = trees.rebuild(" ".join(symbols), words)
      assert rebuilt == trees.strip_tags(cleaned) and repairs == trees.Repairs(), path
      assert str(trees.strip_tags(cleaned)) == str(rebuilt)
  assert (count, leaves) == (3914, 100676)


@needs_ptb
def test_treebank_source_splits_by_file_and_builds_a_word_vocabulary(tmp_path):
  c = _config(PTB, max_len=160, tokens_per_batch=4096, bucket_boundaries=(64, 160))
  d = data.get_datasets(c, str(tmp_path))
  assert (d.stats.train.read, len(d.dev_pairs), len(d.test_pairs)) == (3669, 127, 118)
  assert isinstance(d.tokenizer, tokenizer.WordTokenizer)
  assert (tmp_path / "vocab.words").exists()
  symbols = d.tokenizer.symbols
  assert symbols[: symbols.index("XX") + 1] == sorted(symbols[: symbols.index("XX") + 1])
  source, target = d.test_pairs[0]
  gold = treebank.gold_trees(c, "test")[0]
  assert source.split() == gold.leaves() and target.count("XX") == len(gold.leaves())
  # A second run re-uses the stored vocabulary; another split's does not fit it.
  assert data.get_datasets(c, str(tmp_path)).tokenizer.symbols == symbols
  c.treebank_train = "1-100"
  with pytest.raises(data.DataError, match="prepared for config.data.treebank_train='1-179'"):
    data.get_datasets(c, str(tmp_path))
  c.prepared_store = False
  with pytest.raises(data.DataError, match="does not hold the symbols of this treebank split"):
    data.get_datasets(c, str(tmp_path))


def test_prepared_store_refuses_edited_treebank_files(tmp_path):
  corpus = tmp_path / "ptb"
  corpus.mkdir()
  for n in (1, 2, 3):
    (corpus / f"wsj_{n:04d}.mrg").write_text(f"( (S (NP (NN a{n})) (VP (VBD b))) )\n")
  c = _config(corpus, treebank_train="1", treebank_dev="2", treebank_test="3", vocab_min_count=1)
  c.update(max_len=16, tokens_per_batch=64, bucket_boundaries=(16,))
  d = data.get_datasets(c, str(tmp_path / "w"))
  assert d.dev_pairs == [("a2 b", "(S (NP XX )NP (VP XX )VP )S")]
  (corpus / "wsj_0002.mrg").write_text("( (S (NP (NN c)) (VP (VBD b))) )\n")
  with pytest.raises(data.DataError, match="prepared from other treebank files"):
    data.get_datasets(c, str(tmp_path / "w"))


@needs_ptb
def test_the_experiments_tree_bounds_are_the_training_splits_maxima():
  """The parsing experiment's decoding bounds (config.data.tree_max_depth, tree_max_opens)
  are the deepest nesting and the longest run of opening brackets of its training targets:
  no training tree is refused, and nothing deeper than the treebank is allowed."""
  from experiments import parsing

  c = parsing.get_config().data
  depth = opens = 0
  for _, target in treebank.split_pairs(c, "train"):
    level = run = 0
    for symbol in target.split():
      opening = symbol.startswith("(")
      level += 1 if opening else -symbol.startswith(")")
      run = run + 1 if opening else 0
      depth, opens = max(depth, level), max(opens, run)
  assert (c.tree_max_depth, c.tree_max_opens) == (depth, opens)
