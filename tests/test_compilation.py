"""t2t_jax.compilation: the persistent compilation cache's directory, its bound, its switch."""

import contextlib
import json
import os
import shutil
import subprocess
import sys

import pytest

from t2t_jax import compilation
from t2t_jax.decoding.beam import Stop
from tests import support


def _entry(directory, name: str, size: int, mtime: float) -> None:
  for suffix, data in (("-cache", b"x" * size), ("-atime", b"0" * 8)):
    path = os.path.join(directory, name + suffix)
    with open(path, "wb") as f:
      f.write(data)
    os.utime(path, (mtime, mtime))


def test_trim_removes_the_oldest_entries_down_to_the_bound(tmp_path):
  for i, mtime in enumerate([300, 100, 400, 200]):
    _entry(tmp_path, f"e{i}", 1000, mtime)
  (tmp_path / "unrelated.txt").write_text("kept")
  assert compilation.trim(str(tmp_path), 4000) == 0
  assert compilation.trim(str(tmp_path), 2500) == 2  # e1 (100) and e3 (200) go
  assert sorted(os.listdir(tmp_path)) == [
    "e0-atime",
    "e0-cache",
    "e2-atime",
    "e2-cache",
    "unrelated.txt",
  ]
  assert compilation.trim(str(tmp_path / "missing"), 0) == 0


PROBE = r"""
import json, os, sys
import jax
from t2t_jax import compilation
used = compilation.enable(sys.argv[1])
print(json.dumps(dict(used=used, dir=jax.config.jax_compilation_cache_dir,
                      max_size=jax.config.jax_compilation_cache_max_size,
                      min_time=jax.config.jax_persistent_cache_min_compile_time_secs)))
"""


def _probe(directory: str, **env: str) -> dict:
  environ = support.cpu_env(**env)
  environ.pop("JAX_COMPILATION_CACHE_DIR", None)  # the suite's own cache
  proc = subprocess.run(
    [sys.executable, "-c", PROBE, directory],
    env=environ,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


def test_enable_uses_the_directory_without_jax_s_per_write_bound(tmp_path):
  chosen = str(tmp_path / "xla")
  got = _probe(chosen)
  assert got == dict(used=chosen, dir=chosen, max_size=-1, min_time=0.0)
  assert os.path.isdir(chosen)
  # 'default' follows $T2T_COMPILATION_CACHE; 'off' there turns the cache off.
  assert _probe("default", T2T_COMPILATION_CACHE=chosen)["used"] == chosen
  assert _probe("default", T2T_COMPILATION_CACHE="off")["used"] is None
  assert _probe("off")["used"] is None


# --- compilation.stored: whole programs kept for the next process ---------------------------


def _traces(run, prefix: str = "") -> list[str]:
  """The functions (named `prefix`...) jax traced while run() ran."""
  from jax._src import monitoring

  traced = []

  def listen(event: str, seconds: float, fun_name: str = "", **_) -> None:
    del seconds
    if event == "/jax/core/compile/jaxpr_trace_duration" and fun_name.startswith(prefix):
      traced.append(fun_name)

  monitoring.register_event_duration_secs_listener(listen)
  try:
    run()
  finally:  # the name jax gave it before 0.9
    if hasattr(monitoring, "unregister_event_duration_listener"):
      monitoring.unregister_event_duration_listener(listen)
    else:
      monitoring._unregister_event_duration_listener_by_callback(listen)
  return traced


@contextlib.contextmanager
def _cache_dir(directory):
  import jax

  before = jax.config.jax_compilation_cache_dir
  jax.config.update("jax_compilation_cache_dir", directory)
  try:
    yield
  finally:
    jax.config.update("jax_compilation_cache_dir", before)


def _stored_files(directory) -> list[str]:
  """The exported programs stored in `directory` (not their executables)."""
  return sorted(
    n
    for n in os.listdir(directory)
    if n.startswith(compilation.STORED_PREFIX) and not n.startswith(compilation.EXECUTABLE_PREFIX)
  )


def _executables(directory) -> list[str]:
  return sorted(n for n in os.listdir(directory) if n.startswith(compilation.EXECUTABLE_PREFIX))


def _scaled_sum(x, y, *, scale):
  return x * scale + y, (x * y).sum()


def _jitted():
  import jax

  return jax.jit(_scaled_sum, static_argnames=("scale",), donate_argnames=("y",))


def test_a_stored_program_is_read_back_without_tracing_and_gives_the_same_results(tmp_path):
  import jax.numpy as jnp
  import numpy as np

  x = np.arange(6, dtype=np.float32).reshape(2, 3)
  want = (x * 3 + 1, (x * 1).sum())

  def call(f, scale=3.0, rows=2):
    def run():
      out = f(jnp.asarray(x[:rows]), jnp.ones((rows, 3), jnp.float32), scale=scale)
      results.extend(np.asarray(o) for o in out)

    results = []
    return _traces(run, "_scaled_sum"), results

  with _cache_dir(str(tmp_path)):
    first = compilation.stored(_jitted())
    # Traced when first exported (jax before 0.10 also reports the jitted call inside the
    # exported function: the same name twice).
    assert set(call(first)[0]) == {"_scaled_sum"}
    assert call(first)[0] == []  # in memory
    assert len(_stored_files(tmp_path)) == 1
    traced, got = call(compilation.stored(_jitted()))  # a new process: nothing in memory
    assert traced == []
    np.testing.assert_array_equal(got[0], want[0])
    assert got[1] == want[1]
    # Another static value or another shape is another program.
    fresh = compilation.stored(_jitted())
    assert set(call(fresh, scale=2.0)[0]) == {"_scaled_sum"}
    assert set(call(fresh, rows=1)[0]) == {"_scaled_sum"}
    assert len(_stored_files(tmp_path)) == 3
    assert len(_executables(tmp_path)) == 3  # each compiled here, by XLA
    # A damaged file is compiled again, and replaced.
    for name in _stored_files(tmp_path) + _executables(tmp_path):
      (tmp_path / name).write_bytes(b"not a program")
    traced, got = call(compilation.stored(_jitted()))
    assert set(traced) == {"_scaled_sum"}
    np.testing.assert_array_equal(got[0], want[0])
    assert call(compilation.stored(_jitted()))[0] == []


def test_a_stored_program_is_exported_again_once_the_sources_change(tmp_path, monkeypatch):
  """An upgraded installation never runs a program exported from its old code: with one
  byte of a t2t_jax source file changed (here in a copy the digest is pointed at), a new
  process traces and stores the program again instead of reading the old one back."""
  import jax.numpy as jnp

  sources, cache = tmp_path / "t2t_jax", tmp_path / "xla"
  sources.mkdir()
  cache.mkdir()
  copy = sources / "compilation.py"
  shutil.copy(compilation.__file__, copy)
  monkeypatch.setattr(compilation, "SOURCES", str(sources))

  def traced_by_a_new_process() -> list[str]:
    compilation._environment.cache_clear()  # what a new process computes again
    f = compilation.stored(_jitted())
    return _traces(lambda: f(jnp.ones(3), jnp.ones(3), scale=2.0), "_scaled_sum")

  try:
    with _cache_dir(str(cache)):
      assert set(traced_by_a_new_process()) == {"_scaled_sum"}
      assert traced_by_a_new_process() == []  # the same sources: read back
      text = copy.read_bytes()
      copy.write_bytes(text.replace(b"MAX_PROGRAMS = 1024", b"MAX_PROGRAMS = 1025", 1))
      assert copy.read_bytes() != text
      assert set(traced_by_a_new_process()) == {"_scaled_sum"}  # not the old program
      assert len(_stored_files(cache)) == 2
      assert traced_by_a_new_process() == []
  finally:
    compilation._environment.cache_clear()  # the real sources' digest for later tests


def _fresh_process(code: str, *args) -> dict:
  """The JSON last printed by `python -c code *args` in a new process (the repo as its
  working directory, so that it can import tests)."""
  env = support.cpu_env()
  env.pop("JAX_COMPILATION_CACHE_DIR", None)  # the suite's own cache
  proc = subprocess.run(
    [sys.executable, "-c", code, *map(str, args)],
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
    cwd=os.path.dirname(os.path.dirname(__file__)),
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


STORED_PROBE = r"""
import json, sys
import jax, jax.numpy as jnp, numpy as np
from t2t_jax import compilation
from tests.test_compilation import _traces
compilation.enable(sys.argv[2])
f = jax.jit(lambda x, y: (-(x**2) + jnp.sin(y) * 3, jnp.sum(y * x)))
if sys.argv[1] == "stored":
  f = compilation.stored(f)
x = jnp.arange(20.0).reshape(4, 5); y = jnp.ones((4, 5))
out = []
traced = _traces(lambda: out.extend(np.asarray(o).tolist() for o in f(x, y)), "<lambda>")
print(json.dumps(dict(out=out, traced=traced)))
"""


def test_a_program_jax_read_from_its_own_cache_is_stored_whole(tmp_path):
  """A program already in jax's persistent cache (compiled there by an earlier process
  without the store) is exported and stored by the next one, and a third process runs it
  without tracing, with the same results (a store of serialized executables once failed
  here: an executable jax had read back from its cache lacked XLA:CPU's separately
  compiled kernels)."""
  plain, storing, reading = (
    _fresh_process(STORED_PROBE, m, tmp_path) for m in ("plain",) + ("stored",) * 2
  )
  assert set(storing["traced"]) == {"<lambda>"} and reading["traced"] == []
  assert plain["out"] == storing["out"] == reading["out"]
  assert len(_stored_files(tmp_path)) == 1


def test_an_executable_is_stored_only_as_xla_compiled_it(tmp_path):
  """A stored program's executable, serialized, is read back by a later process without
  lowering; but what jax's persistent cache answers is never serialized (it would lack
  XLA:CPU's separately compiled kernels, and its call fail): with the executable removed,
  the next process finds the program in jax's cache, compiles it again under a module name
  jax has never seen and stores that, and later processes read it with the same results.
  A damaged executable is compiled again."""
  first = _fresh_process(STORED_PROBE, "stored", tmp_path)
  (executable,) = _executables(tmp_path)
  again = _fresh_process(STORED_PROBE, "stored", tmp_path)  # reads the executable
  assert again == {"out": first["out"], "traced": []}
  os.remove(tmp_path / executable)
  from_jax_cache = _fresh_process(STORED_PROBE, "stored", tmp_path)
  assert _executables(tmp_path) == [executable]
  assert [n for n in os.listdir(tmp_path) if n.startswith("jit_call_exported_")]  # unseen
  for _ in range(2):
    assert _fresh_process(STORED_PROBE, "stored", tmp_path)["out"] == first["out"]
  assert from_jax_cache["out"] == first["out"]
  (tmp_path / executable).write_bytes(b"not an executable")
  assert _fresh_process(STORED_PROBE, "stored", tmp_path)["out"] == first["out"]


def test_stored_programs_follow_the_cache_switch_and_never_key_on_an_address(tmp_path):
  import jax
  import jax.numpy as jnp

  x, y = jnp.ones(3), jnp.ones(3)
  with _cache_dir(""):  # the cache off: the jitted function itself, nothing written
    f = compilation.stored(_jitted())
    assert float(f(x, jnp.ones(3), scale=2.0)[1]) == 3.0
  with _cache_dir(str(tmp_path)):
    assert _stored_files(tmp_path) == []

    class Opaque:  # hashable, but its text is its address: it differs in every process
      def __init__(self, scale):
        self.scale = scale

      def __hash__(self):
        return hash(self.scale)

      def __eq__(self, other):
        return isinstance(other, Opaque) and other.scale == self.scale

    g = compilation.stored(
      jax.jit(lambda a, b, *, scale: a * scale.scale + b, static_argnames=("scale",))
    )
    assert float(g(x, y, scale=Opaque(2.0))[0]) == 3.0
    assert _stored_files(tmp_path) == []
    # Inside another traced function, it is traced with it.
    f = compilation.stored(_jitted())
    assert float(jax.jit(lambda a: f(a, jnp.ones(3), scale=2.0)[1])(x)) == 3.0
    assert _stored_files(tmp_path) == []


def test_a_translator_in_a_new_process_traces_none_of_its_search_programs(tmp_path):
  """t2t-translate's warm start: the second process reads every stage program and the
  parameters' shapes the first stored, traces none of them, and translates the same."""
  code = (
    "import json, sys; from tests.test_compilation import _traces; "
    "from t2t_jax import compilation; compilation.enable(sys.argv[2]); "
    "from t2t_jax.decoding.translator import Translator; "
    "made, out = [], []; "
    "traced = _traces(lambda: made.append(Translator.from_workdir(sys.argv[1]))); "
    "traced += _traces(lambda: out.extend(made[0].translate(['a b c', 'd e f g h i', 'a']))); "
    "print(json.dumps(dict(out=out, traced=traced)))"
  )
  workdir = support.small_trained_workdir()
  first, second = (_fresh_process(code, workdir, tmp_path) for _ in range(2))

  def searched_or_initialized(run):  # the stages, and the init traced for the shapes
    return [n for n in run["traced"] if n.startswith("_stage") or n == "<lambda>"]

  assert {"_stage_first", "<lambda>"} <= set(searched_or_initialized(first))
  assert searched_or_initialized(second) == []
  assert second["out"] == first["out"]


def test_a_program_s_key_is_the_content_of_its_static_arguments():
  """Equal values built apart give one key and any changed field another; an object known
  only by its identity has no key (the program is then not kept across processes)."""
  from t2t_jax.decoding import constraints, modes, programs
  from t2t_jax.decoding.diverse import Diversity
  from t2t_jax.decoding.min_length import MinLengthRatio
  from t2t_jax.decoding.no_repeat import NoRepeatNgram
  from t2t_jax.model.config import TransformerConfig
  from t2t_jax.model.transformer import Transformer

  def key(x):
    return json.dumps(compilation._content(x), sort_keys=True)

  def model(**changes):
    return Transformer(TransformerConfig(vocab_size=20, d_model=16, d_ff=32, **changes))

  def decoding(**changes):
    tree = constraints.TreeConstraint(vocab_size=20, open_ids=(3,), close_ids=(4,), leaf_ids=(5,))
    fields = dict(mode=modes.Beam(4, Stop()), constraint=tree) | changes
    return programs.Decoding(**fields)

  assert key((model(), decoding(), 0.6)) == key((model(), decoding(), 0.6))
  base = key((model(), decoding(), 0.6))
  changed = [
    (model(num_heads=2), decoding(), 0.6),
    (model(dropout_rate=0.2), decoding(), 0.6),
    (model(), decoding(mode=modes.Beam(2, Stop())), 0.6),
    (model(), decoding(mode=modes.Beam(4, Stop("heuristic"))), 0.6),
    (model(), decoding(mode=modes.Beam(4, Stop(), Diversity(2, 0.5))), 0.6),
    (model(), decoding(mode=modes.Greedy()), 0.6),
    (model(), decoding(mode=modes.Sample(num_samples=2)), 0.6),
    (model(), decoding(constraint=None), 0.6),
    (model(), decoding(registered=(NoRepeatNgram(3),)), 0.6),
    (model(), decoding(registered=(MinLengthRatio(0.5),)), 0.6),
    (model(), decoding(registered=(MinLengthRatio(0.75),)), 0.6),
    (model(), decoding(), 0.7),
    (model(), decoding(), 1),
  ]
  keys = [key(c) for c in changed]
  assert base not in keys and len(set(keys)) == len(keys)
  for opaque in (lambda: 0, object(), {1, 2}):
    with pytest.raises(TypeError):
      compilation._content(opaque)


def test_an_executable_is_kept_per_cpu(monkeypatch):
  """XLA:CPU compiles for the CPU's instruction set: the same program's executable on a CPU
  with other flags (a cache directory shared between machines) is another file."""
  compilation._machine.cache_clear()
  if os.path.exists("/proc/cpuinfo"):
    assert "flags" in compilation._machine() or "Features" in compilation._machine()
  exported = os.path.join("cache", compilation.STORED_PREFIX + "0" * 64 + "-cache")
  here = compilation._executable_path(exported)
  monkeypatch.setattr(compilation, "_machine", lambda: "model name : other\nflags : sse2")
  there = compilation._executable_path(exported)
  assert here != there
  for path in (here, there):
    assert os.path.basename(path).startswith(compilation.EXECUTABLE_PREFIX)
