"""Aligned plain-text files read in place: a line index over a memory map, strict checks.

Gives exactly the lines of `textio.read_parallel` (only '\\n' ends a line, one trailing '\\r'
and a leading BOM are dropped, bad UTF-8 names file and line, unequal line counts name both
files) without holding the corpus in memory: one pass indexes a file (8 bytes per line) and
hashes it, and pairs are then read by index. Preparing a WMT-sized corpus thus needs memory
for the index, not for the text.
"""

import hashlib
import mmap
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from t2t_jax.data.errors import DataError

_BOM = b"\xef\xbb\xbf"
_BLOCK = 1 << 26  # bytes scanned (and UTF-8 checked) at a time


class LineFile:
  """One UTF-8 file: `len()` lines, `lines(indices)`, and its size and sha256."""

  def __init__(self, path: str, flag: str = ""):
    self.path = os.path.abspath(path)
    self._where = f" (config.data.{flag})" if flag else ""
    self._data = self._map(path)
    self.size = len(self._data)
    self._first = len(_BOM) if self._data[:3] == _BOM else 0
    self.ends, self.sha256 = self._index()

  def _map(self, path: str):
    try:
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

  def __init__(self, source_path: str, target_path: str, split: str = ""):
    src_flag, tgt_flag = (f"{split}_source", f"{split}_target") if split else ("", "")
    self.source = LineFile(source_path, src_flag)
    self.target = LineFile(target_path, tgt_flag)
    if len(self.source) != len(self.target):
      raise DataError(
        f"{split or 'parallel'} files are not aligned: {source_path} has "
        f"{len(self.source)} lines but {target_path} has {len(self.target)} lines"
      )

  def __len__(self) -> int:
    return len(self.source)

  def read(self, indices: Sequence[int]) -> list[tuple[str, str]]:
    return list(zip(self.source.lines(indices), self.target.lines(indices)))
