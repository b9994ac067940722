"""JAX's persistent compilation cache, on by default for t2t-train, t2t-translate and the
Translator: a program compiled once on a machine is read back by later processes instead of
compiled again (an entry is keyed by the program, the XLA flags and the jax/jaxlib versions,
so it is never used for anything else). Beside jax's entries, `stored` keeps the
translation search's programs exported (jax.export), so that a warm process does not trace
them.

Where: $T2T_COMPILATION_CACHE if set ('off' or '' turns it off), else
$XDG_CACHE_HOME/t2t_jax/xla, else ~/.cache/t2t_jax/xla. A process that already has a cache
directory (JAX_COMPILATION_CACHE_DIR, or jax.config set by the caller, e.g. the test suite)
keeps its own.
"""

import contextlib
import dataclasses
import functools
import hashlib
import inspect
import json
import os
import pickle
import secrets
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
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
  # A process that compiled before has settled on no cache; make it look again.
  from jax.experimental.compilation_cache import compilation_cache

  compilation_cache.reset_cache()
  return directory


def directory() -> str | None:
  """The persistent cache's directory in use by this process, or None (off)."""
  return jax.config.jax_compilation_cache_dir or None


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


# --- search programs kept as exported StableHLO: no tracing in a warm process ---------------

STORED_PREFIX = "t2t-exported-"  # beside jax's entries, bounded by the same trim()


class stored:  # noqa: N801 (a decorator, named like jax.jit)
  """A jitted function whose programs are also kept in the persistent cache's directory as
  `jax.export` artifacts (StableHLO, versioned), so that a later process calls them
  without tracing the Python that built them.

  JAX's persistent cache saves the XLA compilation, but every process still traces and
  lowers each program to find its entry: a staged search has tens of programs (one per
  batch shape, cache segment and stage kind), and their tracing was most of a warm
  t2t-translate's start. Here a process reads the exported program back, wraps it in a
  small jit (nothing of the search is traced) and compiles it, which jax's persistent cache
  answers; the compiled program is kept too, serialized for this CPU (`_executable_path`),
  and a later process loads that without lowering or asking jax's cache. A program is
  found by the sha256 of what decides it (`_content`): this
  function, the values of its static (keyword) arguments, the pytree structure, shapes,
  dtypes and shardings of its positional arguments, jax's settings and the software and
  devices (`_environment`: jax, jaxlib and flax versions, the t2t_jax sources, the
  backend, XLA_FLAGS), so that an upgraded installation never runs a program exported from
  its old code. Positional arguments are the traced ones, keyword arguments static;
  `donate` names positional arguments whose buffers the program may reuse, as jit's
  donate_argnames.

  With the cache off (no `jax.config.jax_compilation_cache_dir`), called inside another
  traced function, or with a static argument that is not plain data (`_content` refuses
  it), this is the jitted function itself. A file that cannot be read (another jax, a
  truncated file) is exported again and rewritten; one that cannot be written is only not
  kept. Nothing here changes jax's settings.

  Threads may share it (the Translator's batch threads do): a program several of them ask
  for at once is loaded or exported once, by the first, and the others wait for it.
  """

  def __init__(self, jitted: Any, donate: tuple[str, ...] = ()) -> None:
    self.jitted = jitted
    functools.update_wrapper(self, jitted)
    self._name = f"{jitted.__module__}.{jitted.__qualname__}"
    names = list(inspect.signature(jitted).parameters)
    self._donate = tuple(names.index(n) for n in donate)
    self._programs: dict[Any, Callable[..., Any]] = {}
    self._building: dict[Any, Future] = {}  # a key's program while its first caller builds it
    self._lock = threading.Lock()  # guards both dicts

  def __call__(self, *args: Any, **static: Any) -> Any:
    directory = jax.config.jax_compilation_cache_dir
    if not directory:
      return self.jitted(*args, **static)
    leaves, tree = jax.tree_util.tree_flatten(args)
    if any(isinstance(x, jax.core.Tracer) for x in leaves):
      return self.jitted(*args, **static)  # called inside another traced function
    signature = tuple(_signature(x) for x in leaves)
    key = (tuple(sorted(static.items())), tree, signature, _settings())
    return self._program(directory, key, args, static)(*args)

  def _program(self, directory: str, key: Any, args: tuple, static: dict) -> Callable:
    """`key`'s program, from memory or loaded or exported by the first of the threads that
    ask for it at once while the others wait for it. A build that fails is the error of
    every caller waiting for it and leaves nothing behind: the next call builds again."""
    with self._lock:
      program = self._programs.get(key)
      if program is not None:
        return program
      pending = self._building.get(key)
      if pending is None:
        pending = self._building[key] = Future()
        first = True
      else:
        first = False
    if not first:
      return pending.result()
    try:
      program = self._load_or_export(directory, key, args, static)
    except BaseException as e:
      with self._lock:
        del self._building[key]
      pending.set_exception(e)
      raise
    with self._lock:
      del self._building[key]
      if len(self._programs) >= MAX_PROGRAMS:
        self._programs.pop(next(iter(self._programs)))
      self._programs[key] = program
    pending.set_result(program)
    return program

  def _load_or_export(self, directory: str, key: Any, args: tuple, static: dict) -> Callable:
    path = self._path(directory, key)
    if path is None:
      return functools.partial(self.jitted, **static)
    executable = _executable_path(path)
    loaded_executable = _read_executable(executable)
    if loaded_executable is None:
      compiled, out_tree, by_xla = self._compile(path, args, static)
      if by_xla:
        _write_executable(executable, compiled, out_tree)
    else:
      compiled, out_tree = loaded_executable

    def program(*args: Any) -> Any:
      return out_tree.unflatten(compiled(*jax.tree_util.tree_leaves(args)))

    return program

  def _compile(self, path: str, args: tuple, static: dict) -> tuple[Any, Any, bool]:
    """(the compiled program of leaves -> leaves, the output's pytree structure, whether XLA
    compiled it here), from the exported program at `path` (exported and written first when
    there is none): a small jit around it, lowered for `args` and compiled, which jax's
    persistent cache answers when it has compiled this program before."""
    loaded = _read(path)
    if loaded is None:
      exported = self._export(args, static)
      _write(path, exported)
      # What a later process reads: the serialized form keeps no weak types, and the
      # outputs of both processes must be the same arguments of the next program.
      loaded = _read(path) or exported
    exported, out_tree = loaded
    donated = _donated_leaves(args, self._donate)
    leaves = jax.tree_util.tree_leaves(args)
    before = _compiled_here()
    compiled = jax.jit(_call_exported(exported), donate_argnums=donated).lower(*leaves).compile()
    if _compiled_here() == before:
      # jax's cache answered, and what it reads back cannot be serialized whole
      # (`_write_executable`): compile once more under a module name it has never seen.
      unseen = _call_exported(exported, f"call_exported_{secrets.token_hex(8)}")
      compiled = jax.jit(unseen, donate_argnums=donated).lower(*leaves).compile()
    return compiled, out_tree, _compiled_here() > before

  def _export(self, args: tuple, static: dict) -> tuple[Any, Any]:
    """(the exported program of leaves -> leaves, the output's pytree structure)."""
    in_tree = jax.tree_util.tree_structure(args)
    out_trees = []

    def flat(*leaves: Any) -> list:
      out = self.jitted(*in_tree.unflatten(leaves), **static)
      out_leaves, out_tree = jax.tree_util.tree_flatten(out)
      out_trees.append(out_tree)
      return out_leaves

    flat.__name__ = flat.__qualname__ = self.jitted.__name__  # traces report the function
    specs = [_spec(x) for x in jax.tree_util.tree_leaves(args)]
    exported = jax.export.export(jax.jit(flat))(*specs)
    return exported, out_trees[-1]

  def _path(self, directory: str, key: Any) -> str | None:
    """The file of `key`'s program, or None when a static argument is not plain data."""
    statics, tree, signature, settings = key
    try:
      described = _content((self._name, statics, str(tree), signature, settings, _environment()))
    except TypeError:
      return None
    digest = hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()
    return os.path.join(directory, STORED_PREFIX + digest + ENTRY_SUFFIX)


# --- and as serialized executables: neither lowered nor looked up in a warm process --------

EXECUTABLE_PREFIX = STORED_PREFIX + "executable-"


def _executable_path(exported_path: str) -> str:
  """The file of the compiled form of the program stored at `exported_path`, for this
  machine: an XLA:CPU executable is compiled for the CPU's instruction set (AVX-512, AMX,
  ...), so a cache directory shared between machines keeps one per CPU (`_machine`)."""
  directory, name = os.path.split(exported_path)
  digest = hashlib.sha256((name + _machine()).encode()).hexdigest()
  return os.path.join(directory, EXECUTABLE_PREFIX + digest + ENTRY_SUFFIX)


@functools.cache
def _machine() -> str:
  """The CPU's model and instruction-set flags (Linux's /proc/cpuinfo, first processor;
  elsewhere the platform's description), with the devices' kinds."""
  import platform

  described = [platform.machine(), platform.processor()]
  try:
    with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
      for line in f:
        if not line.strip():
          break  # the first processor's block
        field = line.split(":", 1)[0].strip()
        if field in ("vendor_id", "cpu family", "model", "model name", "flags", "Features"):
          described.append(line.strip())
  except OSError:
    pass
  described += [d.device_kind for d in jax.devices()]
  return "\n".join(described)


_cache_events = threading.local()  # this thread's counts of jax's compilation-cache events
REQUESTS = "/jax/compilation_cache/compile_requests_use_cache"
HITS = "/jax/compilation_cache/cache_hits"


def _compiled_here() -> int:
  """XLA compilations this thread has run so far: jax's requests to its persistent cache
  that the cache did not answer (a program read back from it was not compiled here)."""
  _listen_for_cache_events()
  return getattr(_cache_events, REQUESTS, 0) - getattr(_cache_events, HITS, 0)


@functools.cache
def _listen_for_cache_events() -> None:
  def listen(event: str, **kwargs: Any) -> None:
    del kwargs
    if event in (REQUESTS, HITS):
      setattr(_cache_events, event, getattr(_cache_events, event, 0) + 1)

  jax.monitoring.register_event_listener(listen)


def _read_executable(path: str) -> tuple[Any, Any] | None:
  """(the compiled program, its output structure) stored at `path`, or None."""
  from jax.experimental import serialize_executable

  def load(saved: dict) -> tuple[Any, Any]:
    devices = {d.id: d for d in jax.devices()}
    compiled = serialize_executable.deserialize_and_load(
      saved["executable"],
      saved["in_tree"],
      saved["flat_out_tree"],
      execution_devices=[devices[i] for i in saved["devices"]],
    )
    return compiled, saved["out_tree"]

  return _read_entry(path, "stored executable", load)


def _write_executable(path: str, compiled: Any, out_tree: Any) -> None:
  """Stores a compiled program (jax.experimental.serialize_executable) and its output
  structure at `path`; a program XLA cannot serialize is only not kept. Only a program XLA
  compiled in this process is stored: one jax read back from its own cache lacks XLA:CPU's
  separately compiled kernels once serialized again (its call fails: "Function
  reduce_add_fusion not found")."""
  from jax.experimental import serialize_executable

  try:
    executable, in_tree, flat_out_tree = serialize_executable.serialize(compiled)
    # The devices it runs on (deserialize_and_load's default is all of them).
    devices = [d.id for d in compiled._executable.xla_extension_executable().local_devices()]
    saved = dict(executable=executable, in_tree=in_tree, flat_out_tree=flat_out_tree)
    data = pickle.dumps(dict(saved, out_tree=out_tree, devices=devices))
  except Exception as e:
    logging.info("executable not stored at %s (%s: %s)", path, type(e).__name__, e)
    return
  _write_bytes(path, data)


def _donated_leaves(args: tuple, donate: tuple[int, ...]) -> tuple[int, ...]:
  """The flat indices of the leaves of the positional arguments `donate`."""
  out, start = [], 0
  for i, arg in enumerate(args):
    n = len(jax.tree_util.tree_leaves(arg))
    if i in donate:
      out += range(start, start + n)
    start += n
  return tuple(out)


def _call_exported(exported: Any, name: str = "call_exported") -> Callable[..., Any]:
  """A function of the leaves that calls `exported`; jit names its module after `name`."""

  def call_exported(*leaves: Any) -> Any:
    return exported.call(*leaves)

  call_exported.__name__ = call_exported.__qualname__ = name
  return call_exported


def _spec(x: Any) -> jax.ShapeDtypeStruct:
  """The abstract value jit gives the leaf `x` (a Python scalar is weakly typed)."""
  if isinstance(x, (jax.Array, np.ndarray, np.generic)):
    return jax.ShapeDtypeStruct(np.shape(x), x.dtype, weak_type=getattr(x, "weak_type", False))
  value = jax.numpy.asarray(x)
  return jax.ShapeDtypeStruct(value.shape, value.dtype, weak_type=True)


def _content(x: Any) -> Any:
  """A JSON form of `x` that is its value: plain data (None, bools, numbers, strings),
  tuples, lists and dicts of it, NamedTuples, dataclasses (a Flax module: its fields but its
  place in a tree) and types, each with its type's qualified name. TypeError for anything
  else: an object known only by its identity has no content to key a file by."""
  if x is None or isinstance(x, (bool, int, str)):
    return x
  if isinstance(x, float):
    return repr(x)  # nan and inf are no JSON numbers
  if isinstance(x, type):
    return ["type", f"{x.__module__}.{x.__qualname__}"]
  if isinstance(x, np.dtype):
    return ["dtype", x.name]
  kind = f"{type(x).__module__}.{type(x).__qualname__}"
  if isinstance(x, tuple) and hasattr(x, "_fields"):
    return [kind, {f: _content(getattr(x, f)) for f in x._fields}]
  if isinstance(x, (tuple, list)):
    return [kind, [_content(v) for v in x]]
  if isinstance(x, dict):
    return [kind, sorted([_content(k), _content(v)] for k, v in x.items())]
  if dataclasses.is_dataclass(x):
    fields = [f.name for f in dataclasses.fields(x) if f.name not in ("parent", "name")]
    return [kind, {f: _content(getattr(x, f)) for f in fields}]
  raise TypeError(f"{kind} is not plain data")


def stored_shapes(name: str, settings: Any, trace: Callable[[], Any]) -> Any:
  """`trace()`'s pytree of jax.ShapeDtypeStruct (a `jax.eval_shape`), kept in the persistent
  cache's directory under `name` and the content of `settings` (which must decide the
  result, like a model's config) and the software of `_environment`, so that a later
  process does not trace it again; with the cache off, `trace()` itself."""
  directory = jax.config.jax_compilation_cache_dir
  try:
    described = _content((name, settings, _settings(), _environment()))
  except TypeError:
    described = None
  if not directory or described is None:
    return trace()
  digest = hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()
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


# The settings jax has defined once this module is imported. A library imported later may
# define more (orbax 0.12 adds one of jax's experimental options at its import): a warm
# process that never imports it must still find the programs a cold one stored.
_JAX_SETTINGS = tuple(sorted(jax.config.values))


def _settings() -> tuple:
  """jax's settings (x64, matmul precision, ...) as they are now: a program traced under
  others is another program. The cache's own settings are left out."""
  values = jax.config.values
  return tuple(
    (name, values[name])
    for name in _JAX_SETTINGS
    if "cache" not in name and isinstance(values[name], (bool, int, float, str, type(None)))
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


SOURCES = os.path.dirname(os.path.abspath(__file__))  # the package whose sources key programs


def _sources_digest() -> str:
  """sha256 of t2t_jax's Python sources (`SOURCES`): a change anywhere in the package makes
  new programs (cheaper to export again than to prove which changes could matter)."""
  root = SOURCES
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


def _read(path: str) -> tuple[Any, Any] | None:
  """(the exported program, its output structure) stored at `path`, or None."""
  return _read_entry(
    path,
    "stored program",
    lambda saved: (jax.export.deserialize(saved["exported"]), saved["out_tree"]),
  )


def _read_entry(path: str, what: str, load: Callable[[dict], tuple[Any, Any]]) -> tuple | None:
  """`load` of the dict pickled at `path`, or None when there is none or it cannot be used
  (logged: the caller makes it again)."""
  try:
    with open(path, "rb") as f:
      loaded = load(pickle.load(f))
  except FileNotFoundError:
    return None
  except Exception as e:  # any unreadable entry is made again
    logging.info("%s %s not used (%s: %s)", what, path, type(e).__name__, e)
    return None
  with contextlib.suppress(OSError):
    os.utime(path)  # trim() drops the least recently used first
  return loaded


def _write(path: str, loaded: tuple[Any, Any]) -> None:
  """Stores an exported program and its output structure at `path`."""
  exported, out_tree = loaded
  try:
    data = pickle.dumps(dict(exported=bytes(exported.serialize()), out_tree=out_tree))
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


class CompileCounter:
  """Counts XLA compilations (jax's backend-compile events) and the wall-clock seconds in
  which at least one ran: compilations that overlap (two batches of `Translator.translate`
  compiling at once, each in its thread) count their common seconds once. A program read
  back from the persistent compilation cache is not compiled, so it adds nothing."""

  def __init__(self) -> None:
    self.count = 0
    self.seconds = 0.0
    self._covered_until = float("-inf")  # perf_counter time up to which seconds are counted
    self._lock = threading.Lock()
    jax.monitoring.register_event_duration_secs_listener(self._listen)

  def _listen(self, event: str, duration: float, **kwargs: Any) -> None:
    del kwargs
    if event == "/jax/core/compile/backend_compile_duration":
      end = time.perf_counter()
      self.add(end - duration, end)

  def add(self, start: float, end: float) -> None:
    """One compilation from `start` to `end` (perf_counter seconds), reported at its end:
    only the part after what earlier ones covered adds seconds."""
    with self._lock:
      self.count += 1
      self.seconds += max(0.0, end - max(start, self._covered_until))
      self._covered_until = max(self._covered_until, end)

  def snapshot(self) -> tuple[int, float]:
    """(compilations, compile seconds) so far: subtract two to get a span's."""
    return self.count, self.seconds


@functools.cache
def process_counter() -> CompileCounter:
  """The one CompileCounter of this process (a listener registered once, whoever asks)."""
  return CompileCounter()
