"""JAX's persistent compilation cache, on by default for t2t-train, t2t-translate and the
Translator: a program compiled once on a machine is read back by later processes instead of
compiled again (an entry is keyed by the program, the XLA flags and the jax/jaxlib versions,
so it is never used for anything else). Beside jax's entries, `stored` keeps the
translation search's programs whole, so that a warm process neither traces nor lowers them.

Where: $T2T_COMPILATION_CACHE if set ('off' or '' turns it off), else
$XDG_CACHE_HOME/t2t_jax/xla, else ~/.cache/t2t_jax/xla. A process that already has a cache
directory (JAX_COMPILATION_CACHE_DIR, or jax.config set by the caller, e.g. the test suite)
keeps its own.
"""

import contextlib
import functools
import hashlib
import os
import pickle
import tempfile
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
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


# --- compiled programs kept whole: no tracing or lowering in a warm process ---------------

STORED_PREFIX = "t2t-executable-"  # beside jax's entries, bounded by the same trim()


class stored:  # noqa: N801 (a decorator, named like jax.jit)
  """A jitted function whose compiled programs are also kept whole in the persistent cache's
  directory, so that a later process calls them without tracing or lowering them again.

  JAX's persistent cache saves the XLA compilation, but every process still traces and
  lowers each program to find its entry: a staged search has tens of programs (one per
  batch shape, cache segment and stage kind), and their tracing was most of a warm
  t2t-translate's start. Here a program is looked up by what decides it: this function,
  its static (keyword) arguments, the pytree structure, shapes, dtypes and shardings of its
  positional arguments, and the software and devices it was built for (`_environment`:
  the jax, jaxlib and flax versions, the t2t_jax sources, the backend, XLA_FLAGS and jax's
  settings). Positional arguments are the traced ones; keyword arguments must be static.

  With the cache off (no `jax.config.jax_compilation_cache_dir`), or called inside another
  traced function, this is the jitted function itself. A stored program that cannot be
  read (another jax, a truncated file) is compiled again and rewritten; one that cannot be
  written is only not kept. Like jax's own entries, the files are executables for this
  machine, read from the user's own cache.
  """

  def __init__(self, jitted: Any) -> None:
    self.jitted = jitted
    functools.update_wrapper(self, jitted)
    self._name = f"{jitted.__module__}.{jitted.__qualname__}"
    self._programs: dict[Any, Any] = {}

  def __call__(self, *args: Any, **static: Any) -> Any:
    directory = jax.config.jax_compilation_cache_dir
    if not directory:
      return self.jitted(*args, **static)
    leaves, tree = jax.tree_util.tree_flatten((args, {}))
    if any(isinstance(x, jax.core.Tracer) for x in leaves):
      return self.jitted(*args, **static)  # called inside another traced function
    signature = tuple(_signature(x) for x in leaves)
    key = (tuple(sorted(static.items())), tree, signature, _settings())
    program = self._programs.get(key)
    if program is None:
      program = self._load_or_compile(directory, key, args, static)
      if len(self._programs) >= MAX_PROGRAMS:
        self._programs.pop(next(iter(self._programs)))
      self._programs[key] = program
    return program(*args)

  def _load_or_compile(self, directory: str, key: Any, args: tuple, static: dict) -> Any:
    path = self._path(directory, key)
    if path is not None:
      program = _read(path, key[1])
      if program is not None:
        return program
    lowered = self.jitted.lower(*args, **static)
    if path is None:
      return lowered.compile()
    with _without_jax_cache():
      program = lowered.compile()
    _write(path, program)
    return program

  def _path(self, directory: str, key: Any) -> str | None:
    """The file of `key`'s program, or None when a static argument's text names an object
    by its address (it would differ in every process)."""
    statics, tree, signature, settings = key
    text = repr((self._name, statics, str(tree), signature, settings, _environment()))
    if " at 0x" in text:
      return None
    digest = hashlib.sha256(text.encode()).hexdigest()
    return os.path.join(directory, STORED_PREFIX + digest + ENTRY_SUFFIX)


@contextlib.contextmanager
def _without_jax_cache():
  """Compiles without jax's own persistent cache: an executable jax read back from it
  serializes without the kernels XLA:CPU compiled separately (a later process then fails
  with "Function ... not found"), so a stored program must be compiled afresh; it is then
  kept once, here, and not also in jax's cache."""
  import logging as std_logging

  from jax._src import compilation_cache

  quiet = std_logging.getLogger(compilation_cache.__name__)  # its reset logs at INFO
  level = quiet.level
  quiet.setLevel(std_logging.WARNING)
  before = jax.config.jax_enable_compilation_cache
  jax.config.update("jax_enable_compilation_cache", False)
  compilation_cache.reset_cache()
  try:
    yield
  finally:
    jax.config.update("jax_enable_compilation_cache", before)
    compilation_cache.reset_cache()
    quiet.setLevel(level)


def stored_shapes(name: str, settings: Any, trace: Callable[[], Any]) -> Any:
  """`trace()`'s pytree of jax.ShapeDtypeStruct (a `jax.eval_shape`), kept in the persistent
  cache's directory under `name` and `settings` (whose repr must decide the result, like a
  model's config) and the software of `_environment`, so that a later process does not
  trace it again; with the cache off, `trace()` itself."""
  directory = jax.config.jax_compilation_cache_dir
  text = repr((name, settings, _settings(), _environment()))
  if not directory or " at 0x" in text:
    return trace()
  digest = hashlib.sha256(text.encode()).hexdigest()
  path = os.path.join(directory, STORED_PREFIX + "shapes-" + digest + ENTRY_SUFFIX)
  try:
    with open(path, "rb") as f:
      leaves, tree = pickle.load(f)
    return tree.unflatten([jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in leaves])
  except FileNotFoundError:
    pass
  except Exception as e:  # an unreadable entry is traced again
    logging.info("stored shapes %s not used (%s: %s)", path, type(e).__name__, e)
  result = trace()
  flat, tree = jax.tree_util.tree_flatten(result)
  leaves = [(tuple(x.shape), np.dtype(x.dtype).name) for x in flat]
  _write_bytes(path, pickle.dumps((leaves, tree)))
  return result


MAX_PROGRAMS = 1024  # per function and process; the oldest loaded is dropped beyond it


def _signature(x: Any) -> tuple:
  """What a compiled program takes of one argument leaf: shape, dtype, weak type and, for
  a jax array, its sharding (the devices it is on)."""
  if isinstance(x, jax.Array):
    return (x.shape, str(x.dtype), x.weak_type, str(x.sharding))
  if isinstance(x, (np.ndarray, np.generic)):
    return (x.shape, str(x.dtype), False, None)
  return (type(x).__name__, repr(x))  # a Python scalar: jit would make it a weak type


def _settings() -> tuple:
  """jax's settings (x64, matmul precision, ...) as they are now: a program traced under
  others is another program. The cache's own settings are left out."""
  return tuple(
    (name, value)
    for name, value in sorted(jax.config.values.items())
    if "cache" not in name and isinstance(value, (bool, int, float, str, type(None)))
  )


@functools.cache
def _environment() -> tuple:
  """What besides the program's arguments and jax's settings decides what it compiles to;
  fixed for a process."""
  import flax
  import jaxlib

  devices = jax.devices()
  return (
    jax.__version__,
    jaxlib.__version__,
    flax.__version__,
    devices[0].client.platform,
    devices[0].client.platform_version,
    tuple(d.device_kind for d in devices),
    jax.process_count(),
    os.environ.get("XLA_FLAGS", ""),
    _sources_digest(),
  )


def _sources_digest() -> str:
  """sha256 of t2t_jax's Python sources: a change anywhere in the package makes new
  programs (cheaper to compile again than to prove which changes could matter)."""
  root = os.path.dirname(os.path.abspath(__file__))
  digest = hashlib.sha256()
  for folder, dirs, files in os.walk(root):
    dirs.sort()
    for name in sorted(files):
      if name.endswith(".py"):
        path = os.path.join(folder, name)
        digest.update(os.path.relpath(path, root).encode())
        with open(path, "rb") as f:
          digest.update(f.read())
  return digest.hexdigest()


def _read(path: str, in_tree: Any) -> Any:
  """The program stored at `path`, loaded onto this process's devices, or None."""
  from jax.experimental import serialize_executable

  try:
    with open(path, "rb") as f:
      saved = pickle.load(f)
    if saved["in_tree"] != in_tree:
      return None
    by_id = {d.id: d for d in jax.devices()}
    program = serialize_executable.deserialize_and_load(
      saved["executable"],
      saved["in_tree"],
      saved["out_tree"],
      execution_devices=[by_id[i] for i in saved["devices"]],
    )
  except FileNotFoundError:
    return None
  except Exception as e:  # any unreadable entry is compiled again
    logging.info("stored program %s not used (%s: %s): compiling", path, type(e).__name__, e)
    return None
  with contextlib.suppress(OSError):
    os.utime(path)  # trim() drops the least recently used first
  return program


def _write(path: str, program: Any) -> None:
  """Stores `program` at `path` atomically (a reader never sees half a file)."""
  from jax.experimental import serialize_executable

  try:
    executable, in_tree, out_tree = serialize_executable.serialize(program)
    devices = [d.id for d in program.runtime_executable().local_devices()]
    saved = dict(executable=executable, in_tree=in_tree, out_tree=out_tree, devices=devices)
    data = pickle.dumps(saved)
  except Exception as e:  # not keeping a program is only slower later
    logging.info("program not stored at %s (%s: %s)", path, type(e).__name__, e)
    return
  _write_bytes(path, data)


def _write_bytes(path: str, data: bytes) -> None:
  """Writes `path` atomically (a reader never sees half a file); a failure is logged: not
  keeping an entry is only slower later."""
  try:
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
    try:
      with os.fdopen(fd, "wb") as f:
        f.write(data)
      os.replace(tmp, path)
    except BaseException:
      with contextlib.suppress(OSError):
        os.remove(tmp)
      raise
  except OSError as e:
    logging.info("%s not written (%s)", path, e)
