"""One owner at a time: one trainer per workdir, one preparer per prepared store.

A holder keeps an exclusive `flock` on a lock file (released by the kernel when the process
dies, however it dies) for as long as it works; the file names the holder so that the next
process can say who it is. A lock is only worth something where the file system's `flock`
excludes other processes, so taking one refuses, in one line naming the file system, a file
system without `flock` (some FUSE mounts), one whose locks are local to each host (NFS
mounted with `local_lock=all|flock` or `nolock`) and one whose `flock` lets a second process
in: a child process tries the same lock once per acquisition and must fail.
"""

import datetime
import fcntl
import json
import os
import socket
import subprocess
import sys
import time

from absl import logging

from t2t_jax.run.workdir import Workdir

MOUNTS = "/proc/mounts"  # the mount table: which file system a lock file is on

# Run by a child process with the lock file's path: exit 0 if it could take the lock (the
# file system's flock does not exclude), 3 if refused. -I -S: no site packages to import.
_PROBE = (
  "import fcntl, os, sys\n"
  "fd = os.open(sys.argv[1], os.O_RDWR)\n"
  "try:\n"
  "  fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
  "except OSError:\n"
  "  sys.exit(3)\n"
  "sys.exit(0)\n"
)


class LockError(RuntimeError):
  """A lock another live process holds, or one this file system cannot give; the message
  names the lock file and the way out."""


class WorkdirLockedError(LockError):
  """Another live process trains in this workdir (or its file system cannot lock it)."""


def file_system(path: str) -> tuple[str, str, list[str]]:
  """(mount point, file system type, mount options) of the mount holding `path`, from the
  mount table; ('?', 'unknown', []) where it cannot be read."""
  real = os.path.realpath(path)
  best = ("?", "unknown", [])
  try:
    with open(MOUNTS, encoding="utf-8", errors="replace") as f:
      lines = f.read().splitlines()
  except OSError:
    return best
  for line in lines:
    fields = line.split()
    if len(fields) < 4:
      continue
    mount = fields[1].replace("\\040", " ")
    inside = real == mount or real.startswith(mount.rstrip("/") + "/")
    if inside and (best[0] == "?" or len(mount) >= len(best[0])):
      best = (mount, fields[2], fields[3].split(","))
  return best


def _host_local_locks(fstype: str, options: list[str]) -> str | None:
  """The mount option that makes an NFS mount's flock local to this host, if any."""
  if not fstype.startswith("nfs"):
    return None
  for option in options:
    if option in ("local_lock=all", "local_lock=flock", "nolock"):
      return option
  return None


def another_process_can_take(path: str) -> bool:
  """Whether a child process can take the exclusive flock on `path` that this process holds
  (the file system's locks do not exclude). A child that cannot start or errors out tells
  nothing: logged, and counted as excluded."""
  try:
    done = subprocess.run(
      [sys.executable, "-I", "-S", "-c", _PROBE, path],
      capture_output=True,
      text=True,
      timeout=60,
      check=False,
    )
  except (OSError, subprocess.SubprocessError) as e:
    logging.warning("could not check that %s excludes other processes: %s", path, e)
    return False
  if done.returncode not in (0, 3):
    tail = done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"]
    logging.warning("could not check that %s excludes other processes: %s", path, tail[0])
  return done.returncode == 0


def describe_holder(text: str) -> str:
  """Who the lock file's content `text` names; never fails, whatever the file holds."""
  if not text.strip():
    return "a process that has not written its name yet"
  try:
    holder = json.loads(text)
  except ValueError:
    holder = None
  if not isinstance(holder, dict) or not ({"pid", "host"} & holder.keys()):
    return f"an unknown holder (the lock file holds {text.strip()[:60]!r})"
  try:
    started = datetime.datetime.fromtimestamp(float(holder.get("start_time"))).isoformat(
      sep=" ", timespec="seconds"
    )
  except (TypeError, ValueError, OverflowError, OSError):
    started = "at an unknown time"
  return f"pid {holder.get('pid')} on host {holder.get('host')} (started {started})"


class FileLock:
  """The exclusive, checked `flock` of one lock file; see the module docstring.

  A lock file whose holder died (kill -9, lost node) is free to `flock` again: it is taken
  over with a warning naming the dead holder.

  Args:
    path: the lock file (created if absent, never deleted: a waiting process may hold it).
    way_out: what a person can do when the file system cannot lock, ending the one-line
      error (e.g. "put --workdir on a local file system").
  """

  error: type[LockError] = LockError

  def __init__(self, path: str | os.PathLike, way_out: str) -> None:
    self.path = os.fspath(path)
    self.way_out = way_out
    self._fd: int | None = None

  def held_message(self, holder: str) -> str:
    """The refusal while another live process holds the lock (`holder` describes it)."""
    return f"{self.path} is held by {holder}; wait for it to finish or stop it"

  def _read(self) -> str:
    try:
      with open(self.path, encoding="utf-8", errors="replace") as f:
        return f.read()
    except OSError:
      return ""

  def _cannot_lock(self, what: str) -> LockError:
    mount, fstype, _ = file_system(os.path.dirname(os.path.abspath(self.path)))
    where = f"the {fstype} file system at {mount}" if mount != "?" else "its file system"
    return self.error(f"lock file {self.path}: {where} {what}; {self.way_out}")

  def _try_lock(self, fd: int) -> bool:
    """True once locked, False while another process holds the lock."""
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      return False
    except OSError as e:  # ENOLCK, EOPNOTSUPP, ENOSYS, EIO: no flock on this file system
      raise self._cannot_lock(f"cannot flock ({e.strerror or e})") from None
    return True

  def acquire(self, wait_s: float = 0.0) -> None:
    """Takes the lock (waiting up to `wait_s` seconds for a holder to finish) and writes
    this process's name into it; `error` if it stays held or cannot be an exclusive lock."""
    mount, fstype, options = file_system(os.path.dirname(os.path.abspath(self.path)))
    local = _host_local_locks(fstype, options)
    if local:
      raise self._cannot_lock(
        f"is mounted with {local}: its locks do not exclude processes on other hosts"
      )
    try:
      fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
      raise self.error(
        f"lock file {self.path}: cannot open ({e.strerror}); {self.way_out}"
      ) from None
    try:
      deadline, waiting = time.monotonic() + wait_s, False
      while not self._try_lock(fd):
        if time.monotonic() >= deadline:
          raise self.error(self.held_message(describe_holder(self._read())))
        if not waiting:
          logging.warning("waiting for %s (%s) to finish", describe_holder(self._read()), self.path)
          waiting = True
        time.sleep(min(0.5, max(deadline - time.monotonic(), 0.01)))
      if another_process_can_take(self.path):
        raise self._cannot_lock(
          "has a flock that does not exclude other processes (a child process took the "
          "lock this one holds)"
        )
    except BaseException:
      os.close(fd)  # closing drops the flock, if taken
      raise
    previous = self._read()
    if previous.strip():
      logging.warning(
        "taking over %s from %s, which is no longer running",
        self.path,
        describe_holder(previous),
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

  def __enter__(self) -> "FileLock":
    self.acquire()
    return self

  def __exit__(self, *exc: object) -> None:
    self.release()


class WorkdirLock(FileLock):
  """The exclusive right to train in a workdir; `acquire` refuses while another run holds it,
  so that a second run stops at once instead of pruning the first's checkpoints."""

  error = WorkdirLockedError

  def __init__(self, workdir: str) -> None:
    super().__init__(
      Workdir(workdir).lock_file,
      "put --workdir on a local file system, or on one whose flock excludes processes on "
      "every host (NFSv4 without local_lock)",
    )

  def held_message(self, holder: str) -> str:
    return (
      f"{os.path.dirname(self.path)} is in use by another t2t-train: {holder}; lock file "
      f"{self.path}. Wait for it to finish, stop it, or use another --workdir"
    )
