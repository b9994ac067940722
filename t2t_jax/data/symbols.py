"""Symbol vocabularies: one id per whitespace-separated symbol (synthetic tasks) or word and
bracket symbol (parsing), after the reserved ids of `t2t_jax.tokens`.

Both kinds share the interface of the SentencePiece tokenizer (`encode`, `encode_batch`,
`decode`, `vocab_size`, `id_to_piece`) and are stored as one symbol per line.
"""

from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike

from t2t_jax.tokens import BOS_ID, EOS_ID, NUM_RESERVED, PAD_ID, UNK_ID

SYMBOLS_FILE = "vocab.symbols"
WORDS_FILE = "vocab.words"
# Shapes of words outside a word vocabulary: a rare or unseen word is read as its class, so
# the parser still knows it is a number, a name, a gerund... (as in Petrov et al.'s parser).
WORD_CLASSES = (
  "<unk-num>",
  "<unk-cap>",
  "<unk-hyphen>",
  "<unk-ing>",
  "<unk-ed>",
  "<unk-ly>",
  "<unk-s>",
  "<unk-other>",
)


def strip_ids(ids: ArrayLike) -> list[int]:
  """Ids up to the first EOS, without pad and BOS."""
  out = []
  for i in np.asarray(ids).reshape(-1).tolist():
    if i == EOS_ID:
      break
    if i not in (PAD_ID, BOS_ID):
      out.append(i)
  return out


class SymbolTokenizer:
  """Whitespace-separated symbols, one id each, after the reserved ids (synthetic tasks)."""

  def __init__(self, symbols: Sequence[str]):
    self.symbols = list(symbols)
    self._ids = {s: i + NUM_RESERVED for i, s in enumerate(self.symbols)}

  @property
  def vocab_size(self) -> int:
    return NUM_RESERVED + len(self.symbols)

  def encode(self, text: str) -> list[int]:
    return [self._ids.get(s, UNK_ID) for s in text.split()]

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    return [self.encode(t) for t in texts]

  def decode(self, ids: ArrayLike) -> str:
    return " ".join(
      self.symbols[i - NUM_RESERVED] if i >= NUM_RESERVED else "<unk>" for i in strip_ids(ids)
    )

  def id_to_piece(self, token_id: int) -> str:
    """The symbol of one id; the reserved ids as <pad>, </s>, <s>, <unk>."""
    token_id = int(token_id)
    if token_id < NUM_RESERVED:
      return ("<pad>", "</s>", "<s>", "<unk>")[token_id]
    return self.symbols[token_id - NUM_RESERVED]


def word_class(word: str) -> str:
  """The WORD_CLASSES entry of a word by its shape: digits, capital, hyphen, then suffix."""
  if any(ch.isdigit() for ch in word):
    return "<unk-num>"
  if word[:1].isupper():
    return "<unk-cap>"
  if "-" in word:
    return "<unk-hyphen>"
  for suffix in ("ing", "ed", "ly", "s"):
    if word.endswith(suffix):
      return f"<unk-{suffix}>"
  return "<unk-other>"


class WordTokenizer(SymbolTokenizer):
  """Words and bracket symbols, one id each (parsing); a word outside the list is read as its
  `word_class` (UNK only where the list lacks that class)."""

  def encode(self, text: str) -> list[int]:
    ids = self._ids
    return [ids.get(w) or ids.get(word_class(w), UNK_ID) for w in text.split()]
