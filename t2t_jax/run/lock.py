"""One trainer per workdir: a second run stops at once instead of pruning the first's
checkpoints.

A run holds the workdir's lock file (an exclusive `flock`, released by the kernel when the
process dies, however it dies) for its whole life; the file names the holder so that a second
run can say who it is.
"""

import datetime
import fcntl
import json
import os
import socket
import time
from typing import Any

from absl import logging

from t2t_jax.run.workdir import Workdir


class WorkdirLockedError(RuntimeError):
  """Another live process trains in this workdir."""


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
    self.path = Workdir(workdir).lock_file
    self._fd: int | None = None

  def _read(self) -> dict[str, Any]:
    try:
      with open(self.path, encoding="utf-8") as f:
        text = f.read()
      return json.loads(text) if text.strip() else {}
    except (OSError, ValueError):
      return {}

  def acquire(self) -> None:
    """Takes the lock and writes this process's name into it; WorkdirLockedError if held."""
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
