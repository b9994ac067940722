"""Test setup: the JAX platform (decided before the first jax import), the `accelerator`
marker's skip, the compilation cache, and fixtures for the small model and training state.

Platform rule: tests run on CPUs, with 8 simulated devices for the pmap code
(JAX_PLATFORMS=cpu, --xla_force_host_platform_device_count=8), unless accelerator tests are
selected: `-m accelerator`, or T2T_TEST_ACCELERATOR=1. Then JAX_PLATFORMS is left as the
environment has it (normally unset), so JAX picks a GPU or TPU when there is one. Unmarked
tests assume the 8 CPU devices: run them without T2T_TEST_ACCELERATOR. A JAX_PLATFORMS set in
the environment is always kept. Tests marked `accelerator` are skipped, with the reason,
wherever JAX ends up on CPUs only.
"""

import os
import shutil
import tempfile

import pytest

ACCELERATOR_ENV = "T2T_TEST_ACCELERATOR"
CACHE_ENV = "T2T_TEST_COMPILATION_CACHE"
# XLA's CPU backend set to compile quickly: LLVM optimisation level 0, the classic loop
# emitters for fusions instead of the MLIR fusion emitters, and one codegen thread (the two
# xdist workers keep both cores busy). The suite's programs are small, so they compile in
# about half the CPU time and run hardly slower (docs/testing.md).
FAST_COMPILE = (
  "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
  " --xla_cpu_parallel_codegen_split_count=1"
)
COMPILE_REPORT_ENV = "T2T_TEST_COMPILE_REPORT"  # a file: each test's compilations, appended
SCRATCH_ENV = "T2T_TEST_SHARED_SCRATCH"  # tests.support.made_once: workdirs made once per run
# The modules that take the most time on two CPU cores (`pytest --durations`), longest first.
LONGEST_MODULES = (
  "test_export_ctranslate2.py",
  "test_kill.py",
  "test_train.py",
  "test_translate_stream.py",
  "test_faults.py",
  "test_benchmark.py",
  "test_notebook.py",
  "test_multihost.py",
  "test_bench_peers.py",
  "test_warm_start.py",
  "test_best_and_early_stop.py",
)


def _platform_left_to_jax(config) -> bool:
  """`-m accelerator` or T2T_TEST_ACCELERATOR=1: let JAX pick the GPU or TPU."""
  if os.environ.get(ACCELERATOR_ENV) == "1":
    return True
  return (config.getoption("markexpr", "") or "").split() == ["accelerator"]


def _share_compilations(config) -> None:
  """One XLA compilation cache for the run, kept for the next. xdist workers and the
  commands tests start (t2t-train, t2t-translate) inherit it through
  JAX_COMPILATION_CACHE_DIR, so a program several tests build is compiled once, and a later
  run compiles only what changed. A cache entry is keyed by the program, the XLA flags and
  the jax and jaxlib versions, and holds the executable compiling would give, so no result
  depends on it. T2T_TEST_COMPILATION_CACHE: unset, <repo>/.cache/xla-tests (trimmed to
  2 GB at the start of a run, oldest entries first out); a directory, that one; 'run', a
  fresh directory removed at the end (nothing read from another run).

  jax's own size bound is off (-1): it lists and stats the whole directory at every write
  and locks it at every read, which made each of the suite's thousands of small programs
  slower to store than to compile once the cache held a run's entries."""
  chosen = os.environ.get(CACHE_ENV, "")
  if chosen == "run":
    chosen = tempfile.mkdtemp(prefix="t2t-test-xla-cache-")
    os.environ[CACHE_ENV] = chosen
    config._t2t_cache_owner = True
  elif not chosen:
    chosen = os.path.join(os.path.dirname(os.path.dirname(__file__)), ".cache", "xla-tests")
    os.makedirs(chosen, exist_ok=True)
    os.environ[CACHE_ENV] = chosen
  os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", chosen)
  os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", "-1")
  if not os.environ.get("PYTEST_XDIST_WORKER"):  # once per run, before the workers start
    from t2t_jax import compilation

    compilation.trim(chosen, compilation.MAX_BYTES)
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")


def _share_workdirs(config) -> None:
  """One scratch directory for the whole run, where tests.support.made_once keeps the trained
  workdirs several modules read, so that the xdist workers train each of them once."""
  if SCRATCH_ENV not in os.environ:
    os.environ[SCRATCH_ENV] = tempfile.mkdtemp(prefix="t2t-test-shared-")
    config._t2t_scratch_owner = True


def pytest_configure(config):
  # Before any test module (or tests.support, which imports t2t_jax and jax) is imported.
  os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count=8 {FAST_COMPILE}")
  if not _platform_left_to_jax(config):
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
  # What --dtype=auto picks (decoding.precision): float32 on every CPU, bfloat16 products
  # in hardware or not, so that the tests' exact comparisons mean the same everywhere;
  # tests of the choice unset it.
  os.environ.setdefault("T2T_DECODE_DTYPE", "float32")
  _share_compilations(config)
  _share_workdirs(config)


def _cpu_seconds() -> tuple[float, float]:
  """(this process's user + sys CPU seconds, those of its children waited for so far)."""
  import resource

  own, children = (
    resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
  )
  return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
  """With T2T_TEST_COMPILE_REPORT=FILE, appends one JSON line per test: its wall seconds,
  the CPU seconds of its process and of the commands it started (setup, the module fixtures
  it made first, call and teardown), and the XLA programs its process compiled (count,
  seconds of tracing, lowering and backend compilation), so that
  `python tools/compile_report.py FILE` can say where a run's time goes. CPU seconds hardly
  change when other work shares the cores, unlike wall seconds. Programs compiled in the
  commands a test starts are not counted as programs (their time is in the children's CPU)."""
  report = os.environ.get(COMPILE_REPORT_ENV)
  if not report:
    yield
    return
  import json
  import time

  from jax._src import monitoring

  totals = {}

  def listen(event: str, seconds: float, **_) -> None:
    if event.startswith("/jax/core/compile/"):
      name = event.rsplit("/", 1)[-1]
      count, total = totals.get(name, (0, 0.0))
      totals[name] = (count + 1, total + seconds)

  monitoring.register_event_duration_secs_listener(listen)
  (own, children), start = _cpu_seconds(), time.perf_counter()
  try:
    yield
  finally:
    monitoring.unregister_event_duration_listener(listen)
    own_after, children_after = _cpu_seconds()
    line = {
      "test": item.nodeid,
      "wall": time.perf_counter() - start,
      "cpu": own_after - own,
      "children_cpu": children_after - children,
      **{k: list(v) for k, v in totals.items()},
    }
    with open(report, "a") as f:
      f.write(json.dumps(line) + "\n")


def pytest_unconfigure(config):
  if getattr(config, "_t2t_cache_owner", False):
    shutil.rmtree(os.environ.pop(CACHE_ENV), ignore_errors=True)
  if getattr(config, "_t2t_scratch_owner", False):
    shutil.rmtree(os.environ.pop(SCRATCH_ENV), ignore_errors=True)


def _longest_first(items) -> None:
  """xdist hands tests to its workers in collection order; a module of minutes collected last
  would leave one worker running it alone at the end, so the longest modules go first (each
  keeps its own order, for its module fixtures)."""
  rank = {name: i for i, name in enumerate(LONGEST_MODULES)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


def _main_job_only_when_selected(config, items) -> None:
  """The README's main job (`main_job`: 3,000 training steps, a fifth of the suite's CPU
  time) runs when selected (`-m main_job`, or its file named), as its own CI step, not
  inside every run."""
  named = any("test_tiny_end_to_end" in arg for arg in config.args)
  if named or "main_job" in (config.getoption("markexpr", "") or ""):
    return
  main_job = [item for item in items if item.get_closest_marker("main_job")]
  if main_job:
    config.hook.pytest_deselected(items=main_job)
    items[:] = [item for item in items if item not in main_job]


def pytest_collection_modifyitems(config, items):
  """The main job only when selected; the longest modules first; tests marked `accelerator`
  run only where JAX sees a GPU or TPU."""
  _main_job_only_when_selected(config, items)
  _longest_first(items)
  marked = [item for item in items if item.get_closest_marker("accelerator")]
  if not marked:
    return
  import jax

  if jax.default_backend() != "cpu":
    return
  if os.environ.get("JAX_PLATFORMS") == "cpu" and not _platform_left_to_jax(config):
    reason = (
      "needs a GPU or TPU: this run keeps JAX on CPUs; select accelerator tests with "
      f"-m accelerator (or {ACCELERATOR_ENV}=1) to run them on one"
    )
  else:
    platforms = os.environ.get("JAX_PLATFORMS", "")
    reason = f"needs a GPU or TPU: JAX finds only CPUs here (JAX_PLATFORMS={platforms!r})"
  skip = pytest.mark.skip(reason=reason)
  for item in marked:
    item.add_marker(skip)


@pytest.fixture
def small_model():
  """`support.small_model`: (model, params) of the small test Transformer, with overrides."""
  from tests import support

  return support.small_model


@pytest.fixture
def small_state():
  """`support.small_state`: (model, TrainState) of the small test Transformer."""
  from tests import support

  return support.small_state
