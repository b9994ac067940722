"""Tokenizers: a shared SentencePiece vocabulary for real text, a symbol list for synthetic tasks,
a word list for parsing (`t2t_jax.data.symbols`); which one a run uses is its source's choice.

All have the same interface: `encode(text) -> ids` (no EOS), `encode_batch(texts)`,
`decode(ids) -> text` (stops at EOS, drops pad/BOS) and `vocab_size`. Reserved ids come from
`t2t_jax.tokens` (pad 0 so that `ids > 0` is the non-padding mask; unknown deliberately not 0).

The vocabulary is trained once on (a bounded sample of) the training split only, written to the
workdir and re-used on resume and by translation; a stored vocabulary that disagrees with the
experiment is an error rather than something silently retrained over.
"""

import hashlib
import io
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Sequence

import ml_collections
import numpy as np
import sentencepiece as spm
from etils import epath
from numpy.typing import ArrayLike
from sentencepiece import sentencepiece_model_pb2

from t2t_jax.data import config as config_lib
from t2t_jax.data import mixture, sources
from t2t_jax.data.errors import DataError
from t2t_jax.data.sources.base import SENTENCEPIECE_FILE, PairSource  # noqa: F401
from t2t_jax.data.symbols import (  # noqa: F401 (every tokenizer kind is importable from here)
  SYMBOLS_FILE,
  WORD_CLASSES,
  WORDS_FILE,
  SymbolTokenizer,
  WordTokenizer,
  strip_ids,
  word_class,
)
from t2t_jax.run import files
from t2t_jax.tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID


class SentencePieceTokenizer:
  """A SentencePiece model (BPE or unigram) with t2t_jax's reserved ids."""

  def __init__(self, model_proto: bytes, num_threads: int = 0):
    self.model_proto = model_proto
    self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
    self._threads = num_threads or os.cpu_count() or 1
    _check_reserved_ids(self._sp)

  @property
  def vocab_size(self) -> int:
    return self._sp.get_piece_size()

  def encode(self, text: str) -> list[int]:
    return self._sp.encode(text)

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    return self._sp.encode(list(texts), num_threads=self._threads)

  def decode(self, ids: ArrayLike) -> str:
    return self._sp.decode(strip_ids(ids))

  def normalize(self, text: str) -> str:
    """The text as decode(encode(text)) returns it (NFKC, whitespace collapsed and trimmed)."""
    return self._sp.decode(self._sp.encode(text))

  def piece_id(self, piece: str) -> int | None:
    """The id of `piece` when the vocabulary holds it as one ordinary or user-defined piece
    (a corpus tag); None for an absent piece and for the reserved pad/EOS/BOS/unk."""
    token_id = self._sp.piece_to_id(piece)
    if self._sp.is_unknown(token_id) or self._sp.is_control(token_id):
      return None
    return token_id

  def id_to_piece(self, token_id: int) -> str:
    """The piece of one id as the model stores it ('▁' marks a word start): for labels."""
    return self._sp.id_to_piece(int(token_id))


# What the pipeline, the trainer and the Translator hold: any kind, same interface.
Tokenizer = SentencePieceTokenizer | SymbolTokenizer


def _check_reserved_ids(sp: spm.SentencePieceProcessor) -> None:
  got = (sp.pad_id(), sp.eos_id(), sp.bos_id(), sp.unk_id())
  if got != (PAD_ID, EOS_ID, BOS_ID, UNK_ID):
    raise DataError(
      f"SentencePiece model has pad/eos/bos/unk ids {got}, but t2t_jax needs "
      f"{(PAD_ID, EOS_ID, BOS_ID, UNK_ID)}; it was not trained by t2t_jax"
    )


def vocab_path(c: ml_collections.ConfigDict, workdir: str) -> epath.Path:
  """config.data.vocab_path, else the source's vocabulary file in data_dir or the workdir
  (its suffix tells `load_tokenizer` which kind to build)."""
  if c.vocab_path:
    return epath.Path(c.vocab_path)
  name = sources.get_source(c).vocab_file
  return epath.Path(config_lib.data_root(c, workdir)) / name


def load_tokenizer(path: str | os.PathLike, num_threads: int = 0) -> Tokenizer:
  """Loads a stored vocabulary (`*.symbols` -> SymbolTokenizer, `*.words` -> WordTokenizer,
  else SentencePiece)."""
  path = epath.Path(path)
  return tokenizer_from_bytes(path.name, path.read_bytes(), num_threads)


def tokenizer_from_bytes(name: str, data: bytes, num_threads: int = 0) -> Tokenizer:
  """The tokenizer a vocabulary file called `name` holding `data` describes."""
  for suffix, kind in ((".symbols", SymbolTokenizer), (".words", WordTokenizer)):
    if name.endswith(suffix):
      text = data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
      return kind(text.split("\n")[:-1])
  return SentencePieceTokenizer(data, num_threads)


def load_or_train_tokenizer(
  c: ml_collections.ConfigDict,
  workdir: str,
  *,
  process_index: int = 0,
  train_sentences: Callable[[], Iterable[str]] | None = None,
) -> Tokenizer:
  """Returns the experiment's tokenizer, training and storing it first if absent (see
  `load_or_train_tokenizer_and_sha256`)."""
  return load_or_train_tokenizer_and_sha256(
    c, workdir, process_index=process_index, train_sentences=train_sentences
  )[0]


def load_or_train_tokenizer_and_sha256(
  c: ml_collections.ConfigDict,
  workdir: str,
  *,
  process_index: int = 0,
  train_sentences: Callable[[], Iterable[str]] | None = None,
) -> tuple[Tokenizer, str]:
  """The experiment's tokenizer, training and storing it first if absent, and the sha256 of
  the very bytes it was built from (the file read once: a vocabulary replaced meanwhile
  cannot be recorded for arrays it did not tokenize).

  Args:
    c: the data config (`config.data`).
    workdir: where the vocabulary lives (`<data_dir or workdir>/vocab.model` unless
      c.vocab_path is set).
    process_index: only process 0 trains; the others wait for its file (shared workdir).
    train_sentences: returns the training sentences to learn from (already a bounded
      sample); by default the training split of `c` is opened and sampled.
  """
  path = vocab_path(c, workdir)
  expected = _symbols_text(c)
  if not path.exists():
    if process_index == 0:
      _write_atomic(
        path,
        expected.encode()
        if expected is not None
        else train_sentencepiece(_training_sentences(c, workdir, train_sentences), c),
      )
    else:
      sources.wait_for(path.exists, str(path), c.wait_for_process0_s)
  data = path.read_bytes()
  tokenizer = tokenizer_from_bytes(path.name, data, c.tokenize_threads)
  _check_matches_config(tokenizer, path, c, expected)
  return tokenizer, hashlib.sha256(data).hexdigest()


def _symbols_text(c: ml_collections.ConfigDict) -> str | None:
  """The symbol file the source of `c` builds (None: SentencePiece is trained)."""
  symbols = sources.get_source(c).symbols(c)
  if symbols is None:
    return None
  return "".join(s + "\n" for s in symbols)


def _training_sentences(
  c: ml_collections.ConfigDict,
  workdir: str,
  train_sentences: Callable[[], Iterable[str]] | None,
) -> Iterable[str]:
  if train_sentences is not None:
    return train_sentences()
  return sample_sentences(
    sources.open_splits(c, workdir)["train"], c.vocab_max_sentences, c.vocab_seed
  )


def _check_matches_config(
  tokenizer: Tokenizer,
  path: epath.Path,
  c: ml_collections.ConfigDict,
  expected_symbols: str | None,
) -> None:
  if expected_symbols is not None:
    if not isinstance(tokenizer, SymbolTokenizer) or (
      expected_symbols != "".join(s + "\n" for s in tokenizer.symbols)
    ):
      what = sources.get_source(c).symbols_description(c)
      raise DataError(
        f"{path} does not hold the symbols of {what} "
        f"({tokenizer.vocab_size} ids); use a fresh workdir or delete it"
      )
    return
  if tokenizer.vocab_size != c.vocab_size:
    raise DataError(
      f"{path} has {tokenizer.vocab_size} pieces but config.data.vocab_size={c.vocab_size}; "
      f"refusing to retrain over it: set --config.data.vocab_size={tokenizer.vocab_size}, "
      "or delete the file (or use a fresh workdir) to train a new vocabulary"
    )
  model = sentencepiece_model_pb2.ModelProto.FromString(tokenizer.model_proto)
  model_type = sentencepiece_model_pb2.TrainerSpec.ModelType.Name(
    model.trainer_spec.model_type
  ).lower()
  if model_type != c.vocab_type:
    raise DataError(
      f"{path} is a {model_type} model but config.data.vocab_type="
      f"{c.vocab_type!r}; delete it or fix the config"
    )
  tag_ids(tokenizer, c, path)


def tag_ids(tokenizer: Tokenizer, c: ml_collections.ConfigDict, path: object = "") -> list[int]:
  """The id of each training corpus's tag (-1: no tag), in corpus order; DataError names
  the corpus whose tag the vocabulary does not hold as one piece."""
  ids = []
  for corpus in mixture.corpora(c):
    if not corpus.tag:
      ids.append(-1)
      continue
    token_id = tokenizer.piece_id(corpus.tag) if hasattr(tokenizer, "piece_id") else None
    if token_id is None:
      raise DataError(
        f"config.data.{corpus.flag}.tag={corpus.tag!r} is not one piece of the vocabulary "
        f"{path}: a vocabulary built without that tag cannot hold it; "
        "delete the vocabulary (and the prepared store) to build one with the tag as a "
        "user-defined symbol, or use a tag it holds"
      )
    ids.append(token_id)
  return ids


def _write_atomic(path: epath.Path, data: bytes) -> None:
  """Readers on other hosts only ever see a complete file, fsynced with its directory
  (a remote path such as gs:// is written by its own client, which has no rename)."""
  path.parent.mkdir(parents=True, exist_ok=True)
  if "://" in str(path):
    path.write_bytes(data)
    return
  files.atomic_write_bytes(os.fspath(path), data)


def train_sentencepiece(sentences: Iterable[str], c: ml_collections.ConfigDict) -> bytes:
  """Trains a shared SentencePiece model on `sentences`; returns the serialized model."""
  model = io.BytesIO()
  logging.info("Training a %s vocabulary of %d pieces", c.vocab_type, c.vocab_size)
  try:
    spm.SentencePieceTrainer.train(
      sentence_iterator=iter(sentences),
      model_writer=model,
      vocab_size=c.vocab_size,
      model_type=c.vocab_type,
      pad_id=PAD_ID,
      eos_id=EOS_ID,
      bos_id=BOS_ID,
      unk_id=UNK_ID,
      character_coverage=c.vocab_character_coverage,
      byte_fallback=c.vocab_byte_fallback,
      num_threads=c.tokenize_threads or os.cpu_count() or 1,
      # Each corpus tag is one piece whatever the corpus (its id is put before the source).
      user_defined_symbols=mixture.tags(c),
      input_sentence_size=0,  # the caller already sampled a bounded number of sentences
      minloglevel=2,
    )
  except RuntimeError as e:
    raise DataError(
      f"SentencePiece training failed for config.data.vocab_size={c.vocab_size}"
      f" (vocab_type={c.vocab_type!r}): {e}"
    ) from None
  return model.getvalue()


def sample_sentences(
  train: PairSource, max_sentences: int, seed: int, chunk: int = 10000
) -> Iterator[str]:
  """Yields both sides of at most max_sentences // 2 training pairs, sampled uniformly."""
  n = len(train)
  k = min(n, max(1, max_sentences // 2))
  indices = (
    np.arange(n)
    if k == n
    else np.sort(np.random.default_rng(seed).choice(n, size=k, replace=False))
  )
  for start in range(0, k, chunk):
    for source, target in train.read(indices[start : start + chunk].tolist()):
      for text in (source, target):
        if text.strip():
          yield text
