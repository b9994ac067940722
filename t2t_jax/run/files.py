"""Files people and tools read are never seen half-written.

A whole file is written beside its final name and renamed over it, so a kill leaves the old
or the new file, never a mixture. A log of JSON lines grows one record per write, so a kill
leaves at most an incomplete last line, which readers skip.
"""

import contextlib
import hashlib
import json
import os
from collections.abc import Iterator
from typing import IO, Any


@contextlib.contextmanager
def atomic_open(path: str, mode: str = "w", **kwargs: Any) -> Iterator[IO[Any]]:
  """A file object for `path` that only replaces `path` when the block ends without error.

  The data is fsynced before the rename, so after a crash `path` holds the old or the new
  contents, never a truncated file.
  """
  directory = os.path.dirname(os.path.abspath(path))
  tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp-{os.getpid()}")
  try:
    with open(tmp, mode, **kwargs) as f:
      yield f
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  finally:
    with contextlib.suppress(FileNotFoundError):
      os.remove(tmp)


def atomic_write_text(path: str, text: str) -> None:
  """Replaces `path` with `text` (UTF-8) in one rename."""
  with atomic_open(path, "w", encoding="utf-8") as f:
    f.write(text)


def sha256_file(path: str | os.PathLike) -> str:
  """The hex sha256 of a file, read in 1 MiB blocks so a large corpus never sits in memory."""
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()


def append_line(path: str, line: str) -> None:
  """Appends `line` and a newline with one write (a kill cannot interleave two records)."""
  with open(path, "a", encoding="utf-8") as f:
    f.write(line + "\n")


def read_json_lines(path: str) -> tuple[list[dict[str, Any]], bool]:
  """(records, whether the last line was complete). A broken last line (a kill mid-write) is
  skipped; a broken line elsewhere is an error naming the file and line."""
  with open(path, encoding="utf-8", errors="replace") as f:
    lines = f.read().split("\n")
  tail = lines.pop()  # '' when the file ends with a newline
  records = []
  for number, line in enumerate(lines, start=1):
    if not line.strip():
      continue
    try:
      records.append(json.loads(line))
    except ValueError as e:
      if number == len(lines) and not tail:
        return records, False
      raise ValueError(f"{path}:{number}: not a JSON record ({e})") from None
  if tail.strip():
    with contextlib.suppress(ValueError):
      records.append(json.loads(tail))
  return records, not tail.strip()


def atomic_copy(source: str | os.PathLike, path: str) -> None:
  """Copies `source` to `path` through a temporary beside it: another host waiting for
  `path` sees no file or the whole file."""
  with open(source, "rb") as src, atomic_open(path, "wb") as dst:
    for block in iter(lambda: src.read(1 << 20), b""):
      dst.write(block)
