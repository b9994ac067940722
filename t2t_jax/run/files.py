"""Files people and tools read are never seen half-written.

A whole file is written beside its final name and renamed over it, so a kill leaves the old
or the new file, never a mixture; the file is fsynced before the rename and its directory
after it, so that a power loss cannot undo the rename or leave the new name on empty data.
A log of JSON lines grows one record per write, so a kill leaves at most an incomplete last
line, which readers skip.

Temporaries are named `<name>.tmp-<host>-<pid>-<random>`: pids repeat across the containers
and hosts sharing a file system, the random part keeps two writers in one process apart. A
kill leaves its temporary behind; whoever holds the lock of the directory removes them
(`remove_stale_temporaries`).
"""

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import socket
import uuid
from collections.abc import Iterator
from typing import IO, Any

TEMP_MARK = ".tmp-"


def temporary_name(name: str) -> str:
  """A name for a temporary of `name` no other host, container or writer picks."""
  host = re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname()) or "host"
  return f"{name}{TEMP_MARK}{host}-{os.getpid()}-{uuid.uuid4().hex[:12]}"


def is_temporary_of(entry: str, name: str) -> bool:
  """Whether the directory entry `entry` is a temporary of `name` (dotted or not)."""
  return entry.startswith((f"{name}{TEMP_MARK}", f".{name}{TEMP_MARK}"))


def remove_stale_temporaries(directory: str | os.PathLike, names: tuple[str, ...]) -> list[str]:
  """Removes the temporaries of `names` in `directory` (left by killed writers); returns the
  entries removed. Only the holder of the lock that every writer of `names` takes may call
  this: a live writer's temporary would go too."""
  try:
    entries = sorted(os.listdir(directory))
  except FileNotFoundError:
    return []
  removed = []
  for entry in entries:
    if not any(is_temporary_of(entry, name) for name in names):
      continue
    path = os.path.join(directory, entry)
    if os.path.isdir(path) and not os.path.islink(path):
      shutil.rmtree(path, ignore_errors=True)
    else:
      with contextlib.suppress(FileNotFoundError):
        os.remove(path)
    removed.append(entry)
  return removed


def fsync_dir(path: str | os.PathLike) -> None:
  """Makes the entries of directory `path` (a rename into it) durable. File systems that
  cannot fsync a directory (EINVAL, EBADF) order their metadata themselves: ignored."""
  fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
  try:
    os.fsync(fd)
  except OSError as e:
    if e.errno not in (errno.EINVAL, errno.EBADF, errno.ENOTSUP):
      raise
  finally:
    os.close(fd)


def publish_directory(tmp: str | os.PathLike, path: str | os.PathLike) -> None:
  """Renames the complete directory `tmp` to `path` durably: every file in it and `tmp`
  itself are fsynced first (the rename must not reach the disk before the data), the parent
  after. OSError from the rename (`path` exists) is the caller's."""
  for entry in sorted(os.listdir(tmp)):
    name = os.path.join(tmp, entry)
    if os.path.isfile(name):
      fd = os.open(name, os.O_RDONLY)
      try:
        os.fsync(fd)
      finally:
        os.close(fd)
  fsync_dir(tmp)
  os.rename(tmp, path)
  fsync_dir(os.path.dirname(os.path.abspath(path)))


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", **kwargs: Any) -> Iterator[IO[Any]]:
  """A file object for `path` that only replaces `path` when the block ends without error.

  The data is fsynced before the rename and the directory after it, so after a crash `path`
  holds the old or the new contents, never a truncated file.
  """
  path = os.fspath(path)
  directory = os.path.dirname(os.path.abspath(path))
  tmp = os.path.join(directory, "." + temporary_name(os.path.basename(path)))
  try:
    with open(tmp, mode, **kwargs) as f:
      yield f
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(directory)
  finally:
    with contextlib.suppress(FileNotFoundError):
      os.remove(tmp)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
  """Replaces `path` with `text` (UTF-8) in one rename."""
  with atomic_open(path, "w", encoding="utf-8") as f:
    f.write(text)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
  """Replaces `path` with `data` in one rename."""
  with atomic_open(path, "wb") as f:
    f.write(data)


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
