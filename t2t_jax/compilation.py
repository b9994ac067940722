"""JAX's persistent compilation cache, on by default for t2t-train, t2t-translate and the
Translator: a program compiled once on a machine is read back by later processes instead of
compiled again (an entry is keyed by the program, the XLA flags and the jax/jaxlib versions,
so it is never used for anything else).

Where: $T2T_COMPILATION_CACHE if set ('off' or '' turns it off), else
$XDG_CACHE_HOME/t2t_jax/xla, else ~/.cache/t2t_jax/xla. A process that already has a cache
directory (JAX_COMPILATION_CACHE_DIR, or jax.config set by the caller, e.g. the test suite)
keeps its own.
"""

import contextlib
import os

import jax
from absl import logging

ENV = "T2T_COMPILATION_CACHE"
OFF = ("", "off", "none", "false", "0")
MAX_BYTES = 2 * 2**30  # beyond this, the oldest entries go when a process turns it on
ENTRY_SUFFIX, ATIME_SUFFIX = "-cache", "-atime"  # jax's files: an entry and its access time


def default_dir() -> str | None:
  """The cache directory of this environment, or None when $T2T_COMPILATION_CACHE turns it
  off."""
  if ENV in os.environ:
    chosen = os.environ[ENV]
    return None if chosen.strip().lower() in OFF else chosen
  root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(root, "t2t_jax", "xla")


_chosen = False  # whether a command or caller has decided for this process


def enable(directory: str | None = "default") -> str | None:
  """Turns the persistent cache on in `directory` ('default': `default_dir()`; None or one
  of OFF: leave it off) unless the process has one already, or ('default') a command has
  chosen for it already; returns the directory in use, or None.

  Every program is cached, however quickly it compiled (jax's default keeps only those over
  a second, and a search compiles many small ones). A directory that cannot be created is
  warned about and the cache stays off: compiling is slower, never wrong.
  """
  global _chosen
  current = jax.config.jax_compilation_cache_dir
  if current or (_chosen and directory == "default"):
    return current or None
  _chosen = True
  if directory == "default":
    directory = default_dir()
  if directory is None or directory.strip().lower() in OFF:
    return None
  directory = os.path.expanduser(directory)
  try:
    os.makedirs(directory, exist_ok=True)
  except OSError as e:
    logging.warning(
      "compilation cache %s cannot be created (%s): compiling without it", directory, e
    )
    return None
  jax.config.update("jax_compilation_cache_dir", directory)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  # jax's own bound (a size >= 0) lists and stats the whole directory at every write and
  # locks it at every read: with thousands of entries each write costs more than the small
  # program it stores. The bound is kept here instead, once per process.
  jax.config.update("jax_compilation_cache_max_size", -1)
  trim(directory, MAX_BYTES)
  try:  # a process that compiled before has settled on no cache; make it look again
    from jax._src import compilation_cache

    compilation_cache.reset_cache()
  except (ImportError, AttributeError):
    pass
  return directory


def trim(directory: str, max_bytes: int) -> int:
  """Removes the oldest-written entries of the cache in `directory` until it holds at most
  `max_bytes`; returns how many were removed. One listing of the directory. Another process
  may be reading or writing: a vanished file is skipped, and an entry removed under a
  reader is only compiled again."""
  try:
    with os.scandir(directory) as listing:
      entries = [_entry(e) for e in listing if e.name.endswith(ENTRY_SUFFIX)]
  except OSError:
    return 0
  entries = [e for e in entries if e is not None]
  total = sum(size for _, size, _ in entries)
  removed = 0
  for _, size, path in sorted(entries):
    if total <= max_bytes:
      break
    for name in (path, path[: -len(ENTRY_SUFFIX)] + ATIME_SUFFIX):
      with contextlib.suppress(FileNotFoundError):
        os.remove(name)
    total -= size
    removed += 1
  return removed


def _entry(entry: os.DirEntry) -> tuple[float, int, str] | None:
  """(mtime, size, path) of a cache file, or None for one that vanished or is no file."""
  try:
    if not entry.is_file(follow_symlinks=False):
      return None
    stat = entry.stat(follow_symlinks=False)
  except FileNotFoundError:
    return None
  return stat.st_mtime, stat.st_size, entry.path
