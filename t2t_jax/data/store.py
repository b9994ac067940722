"""The prepared store: every split tokenized once, as memory-mapped arrays plus a manifest.

    <data_dir or workdir>/prepared/
      manifest.json                 what the arrays were made from, each file's size and
                                    sha256; written before the directory is renamed into
                                    place, so a store without it is never published
      {split}.{side}.npy            flat token ids, each pair's side ending in EOS
                                    (uint16 when the vocabulary fits, else int32)
      {split}.{side}_offsets.npy    int64 [pairs + 1]: pair i is flat[offsets[i]:offsets[i + 1]]
      {dev,test}.jsonl              the kept text pairs, [source, target] per line (BLEU)

with split in train/dev/test and side in inputs/targets. Opening maps the arrays
(np.load(mmap_mode='r')), so a process holds in memory only the pages it reads, and a restart
tokenizes nothing. The manifest names what the arrays were made from (corpus identity,
vocabulary sha256, max_len, max_length_ratio, train_max_pairs) with the counts of skipped
and dropped pairs, per training corpus too (the train arrays hold the corpora of
config.data.train_corpora one after the other, in order); a store whose manifest disagrees
with the config is refused, naming the field, rather than silently trained on.

    <data_dir or workdir>/prepared.lock          held by the one process preparing the store
    <data_dir or workdir>/prepared.tmp-<host>-…  a preparation under way (or killed: removed
                                                 by the next lock holder)

Opening checks each file's size; `verify` (t2t-prepare --verify) recomputes the sha256s.
"""

import json
import os
import pathlib
import struct
from typing import Any

import ml_collections
import numpy as np
from numpy.typing import DTypeLike

from t2t_jax.data import config as config_lib
from t2t_jax.data import sources, tokenized
from t2t_jax.data.errors import DataError
from t2t_jax.data.sources import base
from t2t_jax.data.tokenized import SplitCounts, TokenizedPairs
from t2t_jax.run import files
from t2t_jax.run.files import sha256_file

FORMAT_VERSION = 1
STORE_DIR = "prepared"
MANIFEST_FILE = "manifest.json"
LOCK_FILE = f"{STORE_DIR}.lock"
SPLITS = sources.SPLITS
SIDES = ("inputs", "targets")
_HEADER_BYTES = 128  # a fixed-size .npy header, rewritten once the length is known


def store_path(c: ml_collections.ConfigDict, workdir: str) -> pathlib.Path:
  return pathlib.Path(config_lib.data_root(c, workdir)) / STORE_DIR


def lock_path(path: pathlib.Path) -> pathlib.Path:
  """The lock file of the store at `path`: beside it, in the (possibly shared) data root."""
  return path.parent / LOCK_FILE


def read_manifest(path: pathlib.Path) -> dict[str, Any] | None:
  """The manifest of the store at `path`, or None while there is no complete store."""
  try:
    return json.loads((path / MANIFEST_FILE).read_text(encoding="utf-8"))
  except FileNotFoundError:
    return None
  except (OSError, ValueError) as e:
    raise DataError(
      f"{path / MANIFEST_FILE}: unreadable manifest ({e}); delete {path} to prepare the data again"
    ) from None


# ----------------------------------------------------------------------------- writing


def _npy_header(dtype: np.dtype, length: int) -> bytes:
  """A version 1.0 .npy header for a 1-D array, padded to exactly _HEADER_BYTES."""
  text = (
    f"{{'descr': '{np.lib.format.dtype_to_descr(np.dtype(dtype))}', "
    f"'fortran_order': False, 'shape': ({length},), }}"
  )
  text = text.ljust(_HEADER_BYTES - 10 - 1) + "\n"
  return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text.encode("latin1")


class ArrayWriter:
  """Appends to a 1-D .npy file whose final length is only known at close()."""

  def __init__(self, path: pathlib.Path, dtype: DTypeLike) -> None:
    self.path, self.dtype, self.length = path, np.dtype(dtype), 0
    self._file = open(path, "wb")  # noqa: SIM115 (held across append() calls, closed by close())
    self._file.write(b"\0" * _HEADER_BYTES)

  def append(self, values: np.ndarray) -> None:
    values = np.ascontiguousarray(values, self.dtype)
    self._file.write(values.tobytes())
    self.length += len(values)

  def close(self) -> None:
    self._file.seek(0)
    self._file.write(_npy_header(self.dtype, self.length))
    self._file.close()


class SplitWriter:
  """Streams one split's tokenized pairs (and, for dev/test, their text) into a directory."""

  def __init__(
    self, directory: pathlib.Path, split: str, dtype: DTypeLike, with_text: bool
  ) -> None:
    self._tokens = [ArrayWriter(directory / f"{split}.{side}.npy", dtype) for side in SIDES]
    self._offsets = [
      ArrayWriter(directory / f"{split}.{side}_offsets.npy", np.int64) for side in SIDES
    ]
    for offsets in self._offsets:
      offsets.append(np.zeros(1, np.int64))
    self._text = None
    if with_text:  # held across add() calls, closed by close()
      self._text = open(directory / f"{split}.jsonl", "w", encoding="utf-8")  # noqa: SIM115

  def add(
    self,
    sources: list[list[int]],
    targets: list[list[int]],
    text_pairs: list[tuple[str, str]] | None = None,
  ) -> None:
    for seqs, tokens, offsets in zip((sources, targets), self._tokens, self._offsets):
      flat, lengths = tokenized.flatten(seqs, tokens.dtype)
      offsets.append(tokens.length + np.cumsum(lengths))
      tokens.append(flat)
    if self._text is not None:
      self._text.writelines(json.dumps(list(p), ensure_ascii=False) + "\n" for p in text_pairs)

  def close(self) -> None:
    for writer in self._tokens + self._offsets:
      writer.close()
    if self._text is not None:
      self._text.close()


def _data_files(directory: pathlib.Path) -> list[pathlib.Path]:
  return [p for p in sorted(directory.iterdir()) if p.is_file() and p.name != MANIFEST_FILE]


def write_manifest(directory: pathlib.Path, manifest: dict[str, Any]) -> None:
  """Writes `manifest`, with the size and sha256 of every file in `directory`, into the
  (unpublished) store directory: the last file before it is renamed into place."""
  data = _data_files(directory)
  manifest = dict(
    manifest,
    files={p.name: p.stat().st_size for p in data},
    sha256={p.name: sha256_file(p) for p in data},
  )
  text = json.dumps(manifest, indent=1, sort_keys=True) + "\n"
  files.atomic_write_text(directory / MANIFEST_FILE, text)


# ----------------------------------------------------------------------------- checking


def check_manifest(
  path: pathlib.Path, manifest: dict[str, Any], c: ml_collections.ConfigDict
) -> None:
  """Raises DataError naming the first field where the store and config `c` disagree."""
  if manifest.get("format_version") != FORMAT_VERSION:
    raise DataError(
      f"{path}: store format {manifest.get('format_version')!r}, this t2t_jax "
      f"reads format {FORMAT_VERSION}; delete {path} to prepare the data again"
    )
  source = sources.get_source(c)
  recorded = manifest["source"]
  if recorded["name"] != source.name:
    raise base.store_mismatch(path, "source", recorded["name"], source.name)
  source.check_identity(path, recorded, c)
  for field in ("train_max_pairs", "max_len"):
    if manifest[field] != c[field]:
      raise base.store_mismatch(path, field, manifest[field], c[field])
  ratio = manifest.get("max_length_ratio", 0.0)  # a store made before the ratio filter: off
  if ratio != c.max_length_ratio:
    raise base.store_mismatch(path, "max_length_ratio", ratio, c.max_length_ratio)
  _check_files(path, manifest)


def _check_files(path: pathlib.Path, manifest: dict[str, Any]) -> None:
  for name, size in manifest["files"].items():
    try:
      actual = (path / name).stat().st_size
    except FileNotFoundError:
      actual = None
    if actual != size:
      raise DataError(
        f"{path / name}: {actual} bytes where the manifest says {size}: the "
        f"store is damaged; delete {path} to prepare the data again"
      )


def verify(path: pathlib.Path) -> list[str]:
  """Recomputes the sha256 of every file the manifest of the store at `path` lists; returns
  one line per damaged or missing file (empty: intact). DataError when there is no store."""
  manifest = read_manifest(path)
  if manifest is None:
    raise DataError(f"{path / MANIFEST_FILE}: no prepared data to verify; run t2t-prepare")
  hashes = manifest.get("sha256")
  if hashes is None:
    raise DataError(
      f"{path / MANIFEST_FILE}: made before stores kept sha256s, so its contents cannot be "
      f"verified; delete {path} and run t2t-prepare to make one that can"
    )
  damaged = []
  for name, recorded in sorted(hashes.items()):
    try:
      current = sha256_file(path / name)
    except FileNotFoundError:
      damaged.append(f"{path / name}: missing")
      continue
    if current != recorded:
      damaged.append(
        f"{path / name}: sha256 {current[:12]}... where the manifest says {recorded[:12]}..."
      )
  return damaged


def check_vocabulary(
  path: pathlib.Path,
  manifest: dict[str, Any],
  vocab_file: str | os.PathLike,
  current: str | None = None,
) -> None:
  """Refuses a vocabulary other than the store's; `current`: the sha256 of the bytes the
  tokenizer was loaded from (by default the file's, read again)."""
  recorded = manifest["vocabulary"]["sha256"]
  current = current or sha256_file(vocab_file)
  if current != recorded:
    raise DataError(
      f"{path}: prepared with a vocabulary of sha256 {recorded[:12]}..., but {vocab_file} "
      f"(config.data.vocab_path) has sha256 {current[:12]}...; restore that vocabulary, or "
      f"delete {path} to tokenize again with this one"
    )


# ----------------------------------------------------------------------------- reading


class Store:
  """An opened, checked store: memory-mapped token arrays, dev/test text and the counts."""

  def __init__(self, path: pathlib.Path, manifest: dict[str, Any]) -> None:
    self.path, self.manifest = path, manifest

  def has(self, split: str) -> bool:
    return self.manifest["splits"][split] is not None

  def counts(self, split: str) -> SplitCounts:
    return SplitCounts(**(self.manifest["splits"][split] or {}))

  def corpus_counts(self) -> list[SplitCounts]:
    """The counts of each training corpus, in order (one corpus: the train split's)."""
    recorded = self.manifest.get("train_corpora") or [self.manifest["splits"]["train"]]
    return [SplitCounts(**counts) for counts in recorded]

  def pairs(self, split: str) -> TokenizedPairs:
    """The split's tokenized pairs; arrays are read-only memory maps."""
    if not self.has(split):
      return tokenized.empty_pairs()
    arrays = []
    for side in SIDES:
      arrays.append(np.load(self.path / f"{split}.{side}.npy", mmap_mode="r"))
      arrays.append(np.load(self.path / f"{split}.{side}_offsets.npy", mmap_mode="r"))
    return TokenizedPairs(*arrays)

  def text_pairs(self, split: str) -> list[tuple[str, str]]:
    """The kept (source, target) text of dev or test, in order."""
    if not self.has(split):
      return []
    with open(self.path / f"{split}.jsonl", encoding="utf-8") as f:
      return [tuple(json.loads(line)) for line in f]
