"""The `textfiles` source: any local parallel corpus, as pairs of aligned plain-text files.

Line i of the source file is the translation of line i of the target file, so anything that
could shift one side against the other is either handled exactly or reported, by ONE reader
(`LineFile`): only '\\n' ends a line (a stray '\\r' or U+2028 inside a sentence does not split
it), one trailing '\\r' and a leading BOM are dropped, bad UTF-8 names file and line, unequal
line counts name both files. The reader indexes a file in one pass (8 bytes per line, memory
mapped) and hashes it, and pairs are then read by index, so preparing a WMT-sized corpus
needs memory for the index, not for the text.

The prepared store reads the files in place (`open_for_store`); without a store the pairs go
through a TFDS builder (`Textfiles`), prepared once into `<data_dir or workdir>/tfds`.
"""

import functools
import hashlib
import json
import mmap
import os
import pathlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import ml_collections
import numpy as np
from etils import epath

from t2t_jax.data import config as config_lib
from t2t_jax.data import mixture
from t2t_jax.data.errors import DataError
from t2t_jax.data.sources import base
from t2t_jax.data.sources.tfds_pairs import TFDS_SPLIT, TfdsPairs
from t2t_jax.run.files import sha256_file

_BOM = b"\xef\xbb\xbf"
_BLOCK = 1 << 26  # bytes scanned (and UTF-8 checked) at a time
FILE_FLAGS = tuple(f"{split}_{side}" for split in base.SPLITS for side in ("source", "target"))

# ----------------------------------------------------------------------------- content hashes

# sha256 of each local file this process has read, by (path, size, mtime, ctime, inode): the
# store's check, the TFDS copy's name and the training data's identity in a checkpoint's
# fingerprint all ask for it, and a corpus of gigabytes is hashed once per start, not once
# per question. Any write changes ctime, so an edited file is hashed again.
_HASHES: dict[tuple[Any, ...], str] = {}


def _stat_key(path: str) -> tuple[Any, ...]:
  stat = os.stat(path)
  return (os.path.abspath(path), stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino)


def file_sha256(path: str) -> str:
  """The sha256 of local file `path`, computed once per process while the file is unchanged."""
  key = _stat_key(path)
  if key not in _HASHES:
    _HASHES[key] = sha256_file(path)
  return _HASHES[key]


def file_identity(path: str) -> dict[str, Any]:
  """What names a local file's content in a manifest: path, size, mtime and sha256."""
  path = os.path.abspath(path)
  stat = os.stat(path)
  return dict(path=path, size=stat.st_size, mtime_ns=stat.st_mtime_ns, sha256=file_sha256(path))


# ----------------------------------------------------------------------------- the line reader


class LineFile:
  """One UTF-8 file: `len()` lines, `lines(indices)`, and its size and sha256."""

  def __init__(self, path: str, flag: str = ""):
    self._remote = "://" in str(path)
    self.path = str(path) if self._remote else os.path.abspath(path)
    self._where = f" (config.data.{flag})" if flag else ""
    self._data = self._read(path)
    self.size = len(self._data)
    self._first = len(_BOM) if self._data[:3] == _BOM else 0
    key = None if self._remote else _stat_key(self.path)  # before reading: an edit is seen
    self.ends, self.sha256 = self._index()
    if key is not None:
      _HASHES[key] = self.sha256  # the index pass hashed it: others ask `file_sha256`

  def _read(self, path: str) -> bytes | mmap.mmap:
    """A memory map of a local file (bytes for an empty or a remote one, e.g. gs://)."""
    try:
      if self._remote:
        return epath.Path(path).read_bytes()
      with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
          return b""
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except FileNotFoundError:
      raise DataError(f"{path}: no such file{self._where}") from None
    except OSError as e:  # a directory, no permission, I/O error
      raise DataError(f"{path}: cannot read: {e.strerror or e}{self._where}") from None

  def _index(self) -> tuple[np.ndarray, str]:
    """int64 [lines] end offsets (the '\\n', or the file end), and the file's sha256."""
    digest, ends, start = hashlib.sha256(), [], 0
    while start < self.size:
      stop = min(start + _BLOCK, self.size)
      if stop < self.size:  # whole lines only: a multi-byte character never holds a '\\n'
        newline = self._data.rfind(b"\n", start, stop)
        stop = newline + 1 if newline >= 0 else (self._data.find(b"\n", stop) + 1 or self.size)
      block = self._data[start:stop]
      digest.update(block)
      newlines = np.flatnonzero(np.frombuffer(block, np.uint8) == 10)
      self._check_utf8(block, start, sum(len(e) for e in ends), newlines)
      ends.append(newlines.astype(np.int64) + start)
      start = stop
    ends = np.concatenate(ends) if ends else np.zeros(0, np.int64)
    if self.size > self._first and self._data[self.size - 1 : self.size] != b"\n":
      ends = np.append(ends, self.size)  # a last line without a final newline
    return ends, digest.hexdigest()

  def _check_utf8(self, block: bytes, start: int, lines_before: int, newlines: np.ndarray) -> None:
    try:
      block.decode("utf-8")
    except UnicodeDecodeError as e:
      line = lines_before + int(np.searchsorted(newlines, e.start)) + 1
      line_start = self._data.rfind(b"\n", 0, start + e.start) + 1
      column = start + e.start - line_start + 1
      raise DataError(
        f"{self.path}:{line}: bytes that are not UTF-8 at byte {column} of the line "
        f"({block[e.start : e.end]!r}: {e.reason}){self._where}"
      ) from None

  def __len__(self) -> int:
    return len(self.ends)

  def _start(self, i: int) -> int:
    return int(self.ends[i - 1]) + 1 if i else self._first

  def lines(self, indices: Sequence[int]) -> list[str]:
    """The text of the given lines (contiguous ranges are decoded in one piece)."""
    indices = list(indices)
    if not indices:
      return []
    first, last = indices[0], indices[-1]
    if last - first + 1 == len(indices) and indices == list(range(first, last + 1)):
      text = self._data[self._start(first) : int(self.ends[last])].decode("utf-8")
      return [line.removesuffix("\r") for line in text.split("\n")]
    return [
      self._data[self._start(i) : int(self.ends[i])].decode("utf-8").removesuffix("\r")
      for i in indices
    ]

  def identity(self) -> dict[str, Any]:
    """What names this file's content in a manifest."""
    return dict(
      path=self.path, size=self.size, mtime_ns=os.stat(self.path).st_mtime_ns, sha256=self.sha256
    )


class AlignedFiles:
  """A PairSource over two aligned files: pair i is (line i of source, line i of target)."""

  def __init__(self, source_path: str, target_path: str, split: str = "", flag: str = ""):
    """`split` ('train') names the flags config.data.<split>_source/_target in messages,
    `flag` ('train_corpora[1]') config.data.<flag>.source/.target instead."""
    src_flag, tgt_flag = (f"{split}_source", f"{split}_target") if split else ("", "")
    if flag:
      src_flag, tgt_flag = f"{flag}.source", f"{flag}.target"
    self.source = LineFile(source_path, src_flag)
    self.target = LineFile(target_path, tgt_flag)
    if len(self.source) != len(self.target):
      raise DataError(
        f"{flag or split or 'parallel'} files are not aligned: {source_path} has "
        f"{len(self.source)} lines but {target_path} has {len(self.target)} lines"
      )

  def __len__(self) -> int:
    return len(self.source)

  def read(self, indices: Sequence[int]) -> list[tuple[str, str]]:
    return list(zip(self.source.lines(indices), self.target.lines(indices)))


def read_lines(path: str, flag: str = "") -> list[str]:
  """Every line of a UTF-8 file, without terminators; DataError names the file (and
  `config.data.<flag>`), and the line for bad UTF-8."""
  lines = LineFile(path, flag)
  return lines.lines(range(len(lines)))


def read_parallel(source_path: str, target_path: str, split: str = "") -> list[tuple[str, str]]:
  """The aligned (source, target) lines of two files, empty lines included: skipping them
  later is counted and can never shift alignment."""
  pairs = AlignedFiles(source_path, target_path, split)
  return pairs.read(range(len(pairs)))


# ----------------------------------------------------------------------------- the TFDS copy


@functools.cache
def _builder_class() -> type:
  """The TFDS builder class, defined at first use: a translating process, which reads no
  corpus, never imports tensorflow_datasets (about 0.4 s of its start)."""
  import tensorflow_datasets as tfds

  class Textfiles(tfds.core.GeneratorBasedBuilder):
    """Any local parallel corpus, given as pairs of aligned plain-text files per split.

    The config name is a fingerprint of the files' content, so an edited corpus is prepared
    again instead of being read stale. Examples keep file order (shuffling is
    disabled) and include empty lines, which the pipeline skips and counts, never shifting
    alignment. Validation (line counts, UTF-8) happens while preparing, before any training.
    """

    VERSION = tfds.core.Version("1.0.0")

    @tfds.core.utils.classproperty
    @classmethod
    def code_path(cls) -> None:
      # No checksums or metadata files live beside this code. (TFDS's lookup of them needs the
      # `importlib_resources` package for builders defined inside a package.)
      return None

    def __init__(self, *, files: dict[str, tuple[str, str]], **kwargs: Any) -> None:
      self._files = files
      name = "files_" + _fingerprint(files)
      super().__init__(config=tfds.core.BuilderConfig(name=name), **kwargs)

    def _info(self) -> tfds.core.DatasetInfo:
      features = {"source": tfds.features.Text(), "target": tfds.features.Text()}
      return tfds.core.DatasetInfo(
        builder=self,
        description="Aligned local text files: " + json.dumps(self._files),
        features=tfds.features.FeaturesDict(features),
        supervised_keys=("source", "target"),
        disable_shuffling=True,
      )

    def _split_generators(
      self, dl_manager: tfds.download.DownloadManager
    ) -> dict[str, Iterator[tuple[int, dict[str, str]]]]:
      del dl_manager  # local files only
      # Read (and so validate) every split before anything is written.
      pairs = {split: read_parallel(*paths, split=split) for split, paths in self._files.items()}
      return {TFDS_SPLIT[split]: self._generate_examples(p) for split, p in pairs.items()}

    def _generate_examples(
      self, pairs: Iterable[tuple[str, str]]
    ) -> Iterator[tuple[int, dict[str, str]]]:
      for i, (source, target) in enumerate(pairs):
        yield i, {"source": source, "target": target}

  return Textfiles


def __getattr__(name: str) -> Any:
  if name == "Textfiles":  # the builder class, by its name, as when it was module-level
    return _builder_class()
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _fingerprint(files: dict[str, tuple[str, str]]) -> str:
  """A digest of the corpus CONTENT, so an edited file is prepared again while a copy or a
  `touch` is not, and every host of a multi-host job names the same prepared dataset."""
  digest = hashlib.sha256()
  for split, paths in sorted(files.items()):
    for side, path in zip(("source", "target"), paths):
      digest.update(f"{split}_{side}:".encode())
      digest.update(_file_digest(path, f"{split}_{side}"))
  return digest.hexdigest()[:16]


def _file_digest(path: str, flag: str) -> bytes:
  p = epath.Path(path)
  try:
    if p.is_dir():
      raise IsADirectoryError(21, "is a directory")
    if "://" not in str(path):
      return bytes.fromhex(file_sha256(str(path)))
    digest = hashlib.sha256()
    with p.open("rb") as f:
      for block in iter(lambda: f.read(1 << 20), b""):
        digest.update(block)
    return digest.digest()
  except FileNotFoundError:
    raise DataError(f"{path}: no such file (config.data.{flag})") from None
  except OSError as e:
    raise DataError(f"{path}: cannot read: {e.strerror or e} (config.data.{flag})") from None


# ----------------------------------------------------------------------------- the source


def _check_file(
  path: pathlib.Path, flag: str, recorded: dict[str, Any] | None, configured: str
) -> None:
  """The configured file must hold the content the store was made from (the same path, size
  and mtime, or else the same size and sha256: a moved or copied corpus is still accepted)."""
  if recorded is None or not configured:
    if recorded is not None or configured:
      raise base.store_mismatch(path, flag, recorded["path"] if recorded else "", configured)
    return
  current = os.path.abspath(configured)
  try:
    stat = os.stat(current)
  except OSError as e:
    raise DataError(f"{configured}: cannot read: {e.strerror} (config.data.{flag})") from None
  if (current, stat.st_size, stat.st_mtime_ns) == (
    recorded["path"],
    recorded["size"],
    recorded["mtime_ns"],
  ):
    return
  if stat.st_size != recorded["size"] or file_sha256(current) != recorded["sha256"]:
    raise DataError(
      f"{path}: config.data.{flag}={configured} ({stat.st_size} bytes) is not the file the "
      f"data was prepared from ({recorded['path']}, {recorded['size']} bytes, sha256 "
      f"{recorded['sha256'][:12]}...); restore it, point config.data.data_dir elsewhere, or "
      f"delete {path} to prepare the data again"
    )


def _files(c: ml_collections.ConfigDict) -> dict[str, tuple[str, str]]:
  """{split: (source file, target file)} of the splits the config gives files for."""
  return {
    split: (c[f"{split}_source"], c[f"{split}_target"])
    for split in base.SPLITS
    if c[f"{split}_source"]
  }


def _configured_files(c: ml_collections.ConfigDict) -> dict[str, str]:
  """{flag: path} of every configured file: '{split}_{side}', and with train_corpora
  'train_corpora[i].{side}' in place of the train files."""
  files = {flag: c[flag] for flag in FILE_FLAGS if c[flag]}
  if mixture.given(c):
    for corpus in mixture.corpora(c):
      files[f"{corpus.flag}.source"] = corpus.source
      files[f"{corpus.flag}.target"] = corpus.target
  return files


def _open_in_place(c: ml_collections.ConfigDict) -> base.Splits:
  """Every split read in place through the line index; train is a `CorporaPairs` when the
  config lists train_corpora."""
  files = _files(c)
  splits = {
    split: AlignedFiles(*files[split], split) if split in files else None for split in base.SPLITS
  }
  if mixture.given(c):
    splits["train"] = base.CorporaPairs(
      [
        (corpus, AlignedFiles(corpus.source, corpus.target, flag=corpus.flag))
        for corpus in mixture.corpora(c)
      ]
    )
  return splits


class TextfilesSource(base.Source):
  """Aligned plain-text files per split; a SentencePiece vocabulary is trained on train."""

  name = "textfiles"
  takes_train_corpora = True

  def validate(self, c: ml_collections.ConfigDict) -> None:
    for split in base.SPLITS:
      src, tgt = c[f"{split}_source"], c[f"{split}_target"]
      if bool(src) != bool(tgt):
        raise DataError(
          f"config.data.{split}_source={src!r} and {split}_target={tgt!r}: "
          "give both files of a split or neither"
        )
    if mixture.given(c):
      mixture.check(c)
    elif not c.train_source:
      raise DataError(
        "config.data.train_corpora is empty and train_source/train_target are unset: "
        "textfiles needs at least one training corpus"
      )

  def check_inputs(self, c: ml_collections.ConfigDict) -> None:
    """Every file exists, is UTF-8 and has its partner's line count (one indexing pass, whose
    sha256s the store's preparation then reuses)."""
    _open_in_place(c)

  def open_splits(
    self, c: ml_collections.ConfigDict, workdir: str, process_index: int
  ) -> base.Splits:
    """The files through their TFDS copy, prepared once (by process 0); several training
    corpora are read in place instead (their pairs are the same either way)."""
    if mixture.given(c):
      return _open_in_place(c)
    files = _files(c)
    data_dir = c.tfds_data_dir or str(epath.Path(config_lib.data_root(c, workdir)) / "tfds")
    builder = _builder_class()(files=files, data_dir=data_dir, file_format="array_record")
    base.prepare_once(
      builder.is_prepared,
      builder.download_and_prepare,
      f"{builder.info.full_name} in {builder.data_dir}",
      process_index,
      c.wait_for_process0_s,
    )
    return {
      split: (
        TfdsPairs(builder.as_data_source(split=TFDS_SPLIT[split]), "source", "target")
        if split in files
        else None
      )
      for split in base.SPLITS
    }

  def open_for_store(
    self, c: ml_collections.ConfigDict, workdir: str
  ) -> tuple[base.Splits, dict[str, Any]]:
    """The files read in place through their line index: no TFDS copy for the store."""
    splits = _open_in_place(c)
    return splits, self.identity(c, splits)

  def identity(self, c: ml_collections.ConfigDict, splits: base.Splits) -> dict[str, Any]:
    """Path, size, mtime and sha256 of every file, from the `AlignedFiles` splits or, for
    the TFDS copy's splits, from the configured files (and the training corpora's tags,
    which are part of their tokens)."""
    files, tags = {}, None
    for split, pairs in splits.items():
      if isinstance(pairs, base.CorporaPairs):
        tags = [corpus.tag for corpus, _ in pairs.parts]
        for corpus, part in pairs.parts:
          files[f"{corpus.flag}.source"] = part.source.identity()
          files[f"{corpus.flag}.target"] = part.target.identity()
      elif isinstance(pairs, AlignedFiles):
        files[f"{split}_source"] = pairs.source.identity()
        files[f"{split}_target"] = pairs.target.identity()
      elif pairs is not None:
        for side in ("source", "target"):
          files[f"{split}_{side}"] = file_identity(c[f"{split}_{side}"])
    identity = dict(name=self.name, files=files)
    if tags is not None:
      identity["tags"] = tags
    return identity

  def train_identity(
    self, c: ml_collections.ConfigDict, identity: dict[str, Any]
  ) -> dict[str, Any]:
    """Size and sha256 of each training file, by flag ('train_target',
    'train_corpora[1].source'), and the corpora's tags: no path, so a moved copy matches."""
    out = dict(name=self.name)
    for flag, file in sorted(identity["files"].items()):
      if flag.startswith("train_"):
        out[flag] = dict(size=file["size"], sha256=file["sha256"])
    if "tags" in identity:
      out["tags"] = identity["tags"]
    return out

  def check_identity(
    self, path: pathlib.Path, recorded: dict[str, Any], c: ml_collections.ConfigDict
  ) -> None:
    configured = _configured_files(c)
    for flag in dict.fromkeys([*FILE_FLAGS, *recorded["files"], *configured]):
      _check_file(path, flag, recorded["files"].get(flag), configured.get(flag, ""))
    if mixture.given(c):  # the files agree, so the two lists have the same corpora
      for corpus, tag in zip(mixture.corpora(c), recorded["tags"]):
        if corpus.tag != tag:
          raise base.store_mismatch(path, f"{corpus.flag}.tag", tag, corpus.tag)

  def split_name(self, c: ml_collections.ConfigDict, split: str) -> str:
    if c.get(f"{split}_source"):
      return f"{c[f'{split}_source']} / {c[f'{split}_target']}"
    return super().split_name(c, split)

  def describe_test_set(self, data: Mapping[str, Any], pair: str) -> tuple[str, str] | None:
    """'<corpus directory>/<file stem>' of the test source file, e.g. multi30k/test2016."""
    path = data.get("test_source")
    if not path:
      return None
    corpus = os.path.basename(os.path.dirname(path))
    return f"{corpus}/{os.path.splitext(os.path.basename(path))[0]}", pair


base.register(TextfilesSource())
