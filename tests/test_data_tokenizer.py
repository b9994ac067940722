"""Vocabulary: reserved ids, trained once and re-used, mismatches refused, lossless round trip."""

import unicodedata

import numpy as np
import pytest

from t2t_jax import data
from t2t_jax.data import tokenizer as tokenizer_lib
from t2t_jax.data.sources import textfiles
from t2t_jax.tokens import BOS_ID, EOS_ID, NUM_RESERVED, PAD_ID, UNK_ID
from tests import support as testing

SHARED = testing.shared_data_dir()
needs_shared = pytest.mark.skipif(
  not (SHARED / "multi30k").is_dir(), reason=f"offline corpora not found at {SHARED}"
)

SENTENCES = [f"the {w} sat on the mat number {i}" for i in range(300) for w in ("cat", "dog")] + [
  "Grüße aus Köln, sagte die Frau."
] * 20


def _config(**overrides):
  c = data.default_config()
  c.source = "textfiles"
  c.vocab_size = 300
  c.update(overrides)
  return c


def _train(tmp_path, **overrides):
  c = _config(**overrides)
  return c, data.load_or_train_tokenizer(c, str(tmp_path), train_sentences=lambda: iter(SENTENCES))


def test_reserved_ids_and_encode_decode(tmp_path):
  c, tok = _train(tmp_path)
  assert tok.vocab_size == 300
  sp = tok._sp
  assert (
    (sp.pad_id(), sp.eos_id(), sp.bos_id(), sp.unk_id())
    == (PAD_ID, EOS_ID, BOS_ID, UNK_ID)
    == (0, 1, 2, 3)
  )
  ids = tok.encode("the cat sat")
  assert ids and EOS_ID not in ids and PAD_ID not in ids and min(ids) >= NUM_RESERVED
  assert tok.decode(ids) == "the cat sat"
  # decode stops at EOS and ignores pad/BOS, whatever the container.
  assert tok.decode(np.array([BOS_ID] + ids + [EOS_ID] + ids + [PAD_ID] * 3)) == "the cat sat"
  assert tok.decode([]) == ""
  # byte fallback: characters never seen in training survive the round trip.
  assert tok.decode(tok.encode("Δ 東京 🙂")) == "Δ 東京 🙂"
  assert (tmp_path / "vocab.model").exists()
  # Attention-map labels keep SentencePiece's word-start marks.
  pieces = [tok.id_to_piece(i) for i in ids]
  assert "".join(pieces).replace("▁", " ").strip() == "the cat sat"
  assert pieces[0].startswith("▁") and tok.id_to_piece(EOS_ID) == "</s>"


def test_trained_once_then_reused(tmp_path, monkeypatch):
  _, first = _train(tmp_path)

  def refuse(*args, **kwargs):
    raise AssertionError("retrained although a vocabulary is stored")

  monkeypatch.setattr(tokenizer_lib, "train_sentencepiece", refuse)
  c = _config()
  again = data.load_or_train_tokenizer(c, str(tmp_path))
  assert again.model_proto == first.model_proto
  assert data.load_tokenizer(tmp_path / "vocab.model").encode("the dog") == first.encode("the dog")


def test_stored_vocab_of_other_size_is_an_error_not_a_retrain(tmp_path):
  _train(tmp_path)
  before = (tmp_path / "vocab.model").read_bytes()
  with pytest.raises(
    data.DataError,
    match=r"vocab\.model has 300 pieces but "
    r"config\.data\.vocab_size=400; refusing to retrain",
  ):
    data.load_or_train_tokenizer(_config(vocab_size=400), str(tmp_path))
  with pytest.raises(
    data.DataError,
    match=r"is a bpe model but config\.data\.vocab_type="
    r"'unigram'",
  ):
    data.load_or_train_tokenizer(_config(vocab_type="unigram"), str(tmp_path))
  assert (tmp_path / "vocab.model").read_bytes() == before


def test_vocab_too_large_for_corpus_names_flag(tmp_path):
  with pytest.raises(data.DataError, match=r"config\.data\.vocab_size=5000"):
    _train(tmp_path, vocab_size=5000)


def test_unigram(tmp_path):
  _, tok = _train(tmp_path, vocab_type="unigram")
  assert tok.decode(tok.encode("the dog sat on the mat")) == "the dog sat on the mat"


def test_symbol_tokenizer_and_its_stored_vocab(tmp_path):
  c = data.default_config()  # synthetic
  tok = data.load_or_train_tokenizer(c, str(tmp_path))
  assert isinstance(tok, data.SymbolTokenizer)
  assert tok.vocab_size == NUM_RESERVED + c.synthetic_num_symbols
  assert tok.encode("3 0 15") == [7, 4, 19]
  assert tok.decode([7, 4, 19, EOS_ID, 5]) == "3 0 15"
  assert tok.encode("99") == [UNK_ID]
  assert [tok.id_to_piece(i) for i in (7, 4, EOS_ID)] == ["3", "0", "</s>"]
  assert (tmp_path / "vocab.symbols").exists()
  c.synthetic_num_symbols = 8
  with pytest.raises(data.DataError, match="does not hold the symbols"):
    data.load_or_train_tokenizer(c, str(tmp_path))


def _normalized(text: str) -> str:
  """What SentencePiece's default nmt_nfkc normalization does to our corpora's text: NFKC,
  then runs of whitespace collapsed to one space and trimmed at both ends."""
  return " ".join(unicodedata.normalize("NFKC", text).split())


@needs_shared
def test_round_trip_multi30k_and_newstest2014(tmp_path):
  c = testing.textfiles_config(SHARED / "multi30k", vocab_size=1000, train_max_pairs=2000)
  d = data.get_datasets(c, str(tmp_path))
  tok = d.tokenizer
  files = [
    SHARED / "multi30k" / f"{s}.{l}" for s in ("train", "val", "test2016") for l in ("en", "de")
  ]
  files += [SHARED / "wmt14" / f"newstest2014.{l}" for l in ("en", "de")]
  for path in files:
    lines = textfiles.read_lines(str(path))
    decoded = [tok.decode(ids) for ids in tok.encode_batch(lines)]
    bad = [(a, b) for a, b in zip(lines, decoded) if _normalized(a) != b]
    assert not bad, f"{path}: {len(bad)} lines differ, e.g. {bad[:2]}"
    assert UNK_ID not in {i for ids in tok.encode_batch(lines) for i in ids}
