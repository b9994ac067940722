"""What a workdir needs to survive faults: one owner at a time, and files never half-written.

A run holds <workdir>/lock (an exclusive `flock`, released by the kernel when the process
dies, however it dies) for its whole life; the file names the holder so that a second run can
say who it is. Files people and tools read are written beside their final name and renamed
over it, so a kill leaves either the old or the new file, never a mixture.
"""

import contextlib
import datetime
import fcntl
import hashlib
import json
import os
import socket
import time
from collections.abc import Iterator
from typing import IO, Any

from absl import logging

LOCK_FILE = "lock"


class WorkdirLockedError(RuntimeError):
  """Another live process trains in this workdir."""


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
  with atomic_open(path, "w", encoding="utf-8") as f:
    f.write(text)


def sha256_file(path: str) -> str:
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()


def _describe(holder: dict[str, Any]) -> str:
  if not holder:
    return "a process that has not written its name yet"
  started = datetime.datetime.fromtimestamp(holder.get("start_time", 0)).isoformat(
    sep=" ", timespec="seconds"
  )
  return f"pid {holder.get('pid')} on host {holder.get('host')} (started {started})"


class WorkdirLock:
  """The exclusive right to train in a workdir; `acquire` refuses while another run holds it.

  A lock file whose holder died (kill -9, lost node) is free to `flock` again: it is taken
  over with a warning naming the dead holder.
  """

  def __init__(self, workdir: str) -> None:
    self.path = os.path.join(workdir, LOCK_FILE)
    self._fd: int | None = None

  def _read(self) -> dict[str, Any]:
    try:
      with open(self.path, encoding="utf-8") as f:
        text = f.read()
      return json.loads(text) if text.strip() else {}
    except (OSError, ValueError):
      return {}

  def acquire(self) -> None:
    fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      os.close(fd)
      raise WorkdirLockedError(
        f"{os.path.dirname(self.path)} is in use by another t2t-train: "
        f"{_describe(self._read())}; lock file {self.path}. Wait for it to finish, stop it, "
        "or use another --workdir"
      ) from None
    previous = self._read()
    if previous:
      logging.warning(
        "taking over %s from %s, which is no longer running", self.path, _describe(previous)
      )
    me = dict(host=socket.gethostname(), pid=os.getpid(), start_time=time.time())
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(me) + "\n").encode(), 0)
    os.fsync(fd)
    self._fd = fd

  def release(self) -> None:
    """Empties the file (a clean end leaves no holder to report) and unlocks it."""
    if self._fd is None:
      return
    os.ftruncate(self._fd, 0)
    fcntl.flock(self._fd, fcntl.LOCK_UN)
    os.close(self._fd)
    self._fd = None

  def __enter__(self) -> "WorkdirLock":
    self.acquire()
    return self

  def __exit__(self, *exc: object) -> None:
    self.release()
