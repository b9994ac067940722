"""Everything before the first training step, done once: source -> vocabulary -> token store.

    store = ensure_store(config.data, workdir, process_index=jax.process_index())

opens the prepared store of `<data_dir or workdir>/prepared` when its manifest matches the
config, prepares it when there is none (process 0; the other processes wait for its
manifest), and refuses one that does not match, naming the field. `t2t-prepare` runs the same
preparation ahead of training; `get_datasets` calls `ensure_store`, so a one-command
`t2t-train` still works.

Preparing streams the corpus in chunks (text files are read in place through a line index,
TFDS sources through their random-access data source) into the arrays of `store.py`, in a
temporary directory that receives the manifest last and is renamed into place, fsynced,
when complete: no host ever sees a store without its manifest. The preparer holds the
store's lock file (`prepared.lock`, beside the store in the possibly shared data root), so
that two preparers (two runs or a t2t-prepare sharing config.data.data_dir) never write the
same store: the second waits for the first and then opens its store.
"""

import contextlib
import logging
import pathlib
import shutil
import time
from collections.abc import Iterator
from typing import Any

import ml_collections
import numpy as np
from numpy.typing import DTypeLike

from t2t_jax.data import sources, tokenized
from t2t_jax.data import store as store_lib
from t2t_jax.data import tokenizer as tokenizer_lib
from t2t_jax.data.errors import DataError
from t2t_jax.data.sources import PairSource
from t2t_jax.data.tokenized import SplitCounts
from t2t_jax.data.tokenizer import Tokenizer
from t2t_jax.run import files, lock

CHUNK_PAIRS = 20000  # pairs read and tokenized at a time (SentencePiece batch encoding)
_LOG_EVERY = 1_000_000  # pairs between progress lines


def ensure_store(
  c: ml_collections.ConfigDict, workdir: str, *, process_index: int = 0
) -> "OpenedStore":
  """The run's prepared data, prepared first where absent (see the module docstring)."""
  sources.validate(c)
  path = store_lib.store_path(c, workdir)
  manifest = store_lib.read_manifest(path)
  if manifest is None:
    if process_index == 0:
      prepare(c, workdir)
    else:
      sources.wait_for(
        (path / store_lib.MANIFEST_FILE).exists,
        str(path / store_lib.MANIFEST_FILE),
        c.wait_for_process0_s,
      )
  return open_store(c, workdir, process_index=process_index)


class OpenedStore(store_lib.Store):
  """A checked store with the tokenizer its arrays were made with."""

  def __init__(self, path: pathlib.Path, manifest: dict[str, Any], tokenizer: Tokenizer) -> None:
    super().__init__(path, manifest)
    self.tokenizer = tokenizer


def open_store(
  c: ml_collections.ConfigDict, workdir: str, *, process_index: int = 0
) -> OpenedStore:
  """Opens a complete store after checking it against `c`; DataError names any mismatch."""
  path = store_lib.store_path(c, workdir)
  manifest = store_lib.read_manifest(path)
  if manifest is None:
    raise DataError(
      f"{path / store_lib.MANIFEST_FILE}: no prepared data; run t2t-prepare "
      "with the same experiment and overrides"
    )
  store_lib.check_manifest(path, manifest, c)
  vocab = tokenizer_lib.vocab_path(c, workdir)
  if not vocab.exists():
    raise DataError(
      f"{path}: prepared with the vocabulary {vocab}, which is missing; restore "
      f"it, or delete {path} to prepare the data again"
    )
  tokenizer, sha256 = tokenizer_lib.load_or_train_tokenizer_and_sha256(
    c, workdir, process_index=process_index
  )
  store_lib.check_vocabulary(path, manifest, vocab, sha256)
  return OpenedStore(path, manifest, tokenizer)


class StoreLock(lock.FileLock):
  """The right to prepare the store at `path` (see the module docstring)."""

  def __init__(self, path: pathlib.Path) -> None:
    super().__init__(
      store_lib.lock_path(path),
      f"put config.data.data_dir (now {path.parent}) on a local file system, or on one whose "
      "flock excludes processes on every host (NFSv4 without local_lock)",
    )
    self.store = path

  def held_message(self, holder: str) -> str:
    return (
      f"{self.store} is being prepared by {holder} (lock file {self.path}); "
      "config.data.wait_for_process0_s ran out: wait for it to finish, stop it, or point "
      "config.data.data_dir elsewhere"
    )


def check_inputs(c: ml_collections.ConfigDict, workdir: str) -> None:
  """DataError for a bad config field or a missing, unreadable or misaligned input file,
  raised before anything is written. The files are read only while there is no store to
  open: a prepared store's files were checked when it was written, and it names them."""
  source = sources.validate(c)
  try:
    prepared = c.prepared_store and store_lib.read_manifest(store_lib.store_path(c, workdir))
  except DataError:  # unreadable (a file in a directory's place): reported where it is opened
    prepared = None
  if not prepared:
    source.check_inputs(c)


def prepare(c: ml_collections.ConfigDict, workdir: str) -> pathlib.Path:
  """Builds the store of `c` (replacing an incomplete one) under the store's lock; returns
  its path. A store another process finished meanwhile is kept."""
  sources.validate(c)
  path = store_lib.store_path(c, workdir)
  if store_lib.read_manifest(path) is not None:
    return path
  path.parent.mkdir(parents=True, exist_ok=True)
  held = StoreLock(path)
  held.acquire(wait_s=c.wait_for_process0_s)
  try:
    if store_lib.read_manifest(path) is not None:  # prepared while this process waited
      return path
    removed = files.remove_stale_temporaries(path.parent, (store_lib.STORE_DIR,))
    if removed:
      logging.warning("removed preparations that were stopped: %s", ", ".join(removed))
    if path.exists():  # a store without its manifest: a version that wrote it after the rename
      logging.warning("%s has no manifest (an interrupted preparation): preparing it again", path)
      shutil.rmtree(path)
    tmp = path.parent / files.temporary_name(store_lib.STORE_DIR)
    tmp.mkdir()
    try:
      manifest = _write_arrays(c, workdir, tmp)
      store_lib.write_manifest(tmp, manifest)
      files.publish_directory(tmp, path)
    finally:
      shutil.rmtree(tmp, ignore_errors=True)
  finally:
    held.release()
  return path


def _write_arrays(
  c: ml_collections.ConfigDict, workdir: str, directory: pathlib.Path
) -> dict[str, Any]:
  """Tokenizes every split into `directory`; returns the manifest (without 'files')."""
  start = time.perf_counter()
  seconds = {}
  with _timed(seconds, "open source"):
    splits, identity = open_source(c, workdir)
  with _timed(seconds, "vocabulary"):
    tokenizer, vocab_sha256 = tokenizer_lib.load_or_train_tokenizer_and_sha256(
      c,
      workdir,
      train_sentences=lambda: tokenizer_lib.sample_sentences(
        splits["train"], c.vocab_max_sentences, c.vocab_seed
      ),
    )
  dtype = np.uint16 if tokenizer.vocab_size <= 2**16 else np.int32
  tags = tokenizer_lib.tag_ids(tokenizer, c, tokenizer_lib.vocab_path(c, workdir))
  counts, corpora = {}, []
  for split in store_lib.SPLITS:
    with _timed(seconds, f"tokenize {split}"):
      if splits[split] is None:
        counts[split] = None
      elif split == "train":
        counts[split], corpora = _write_split(
          directory, split, splits[split], tokenizer, c.max_len, dtype, c.max_length_ratio, tags
        )
      else:
        counts[split], _ = _write_split(directory, split, splits[split], tokenizer, None, dtype)
  if not counts["train"].kept:
    raise DataError(
      f"no training pairs left ({counts['train']}); check the training files "
      "and config.data.max_len"
    )
  vocab = tokenizer_lib.vocab_path(c, workdir)
  seconds["total"] = time.perf_counter() - start
  return dict(
    format_version=store_lib.FORMAT_VERSION,
    source=identity,
    train_max_pairs=c.train_max_pairs,
    max_len=c.max_len,
    max_length_ratio=c.max_length_ratio,
    train_corpora=[k.__dict__ for k in corpora],
    dtype=np.dtype(dtype).name,
    vocabulary=dict(path=str(vocab), sha256=vocab_sha256, size=tokenizer.vocab_size),
    splits={k: (v.__dict__ if v is not None else None) for k, v in counts.items()},
    seconds={k: round(v, 2) for k, v in seconds.items()},
  )


@contextlib.contextmanager
def _timed(seconds: dict[str, float], stage: str) -> Iterator[None]:
  start = time.perf_counter()
  yield
  seconds[stage] = time.perf_counter() - start


def open_source(
  c: ml_collections.ConfigDict, workdir: str
) -> tuple[dict[str, PairSource | None], dict[str, Any]]:
  """({'train', 'dev', 'test'} -> PairSource or None, the corpus identity for the manifest)."""
  splits, identity = sources.get_source(c).open_for_store(c, workdir)
  return sources.head(splits, c), identity


def _write_split(
  directory: pathlib.Path,
  split: str,
  source: PairSource,
  tokenizer: Tokenizer,
  max_len: int | None,
  dtype: DTypeLike,
  max_ratio: float = 0.0,
  tag_ids: list[int] | None = None,
) -> tuple[SplitCounts, list[SplitCounts]]:
  """Tokenizes one split into `directory`, corpus after corpus for training; returns the
  split's counts and each corpus's."""
  counts, per_corpus = SplitCounts(), []
  writer = store_lib.SplitWriter(directory, split, dtype, with_text=split != "train")
  for k, part in enumerate(tokenized.corpus_parts(source)):
    mine = SplitCounts()
    tag = tag_ids[k] if tag_ids else -1
    for start in range(0, len(part), CHUNK_PAIRS):
      pairs = tokenized.non_empty(
        part.read(range(start, min(start + CHUNK_PAIRS, len(part)))), mine
      )
      writer.add(*tokenized.encode_pairs(pairs, tokenizer, max_len, mine, max_ratio, tag), pairs)
      if (start // CHUNK_PAIRS + 1) % (_LOG_EVERY // CHUNK_PAIRS) == 0:
        logging.info("%s: %d of %d pairs tokenized", split, start + CHUNK_PAIRS, len(part))
    per_corpus.append(mine)
    counts.add(mine)
  writer.close()
  return counts, per_corpus
