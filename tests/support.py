"""Helpers shared by the data tests and the benchmark: locating the offline corpora, configs."""

import ast
import atexit
import fcntl
import functools
import gc
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from typing import Any

from t2t_jax.data.config import default_config


def shared_data_dir() -> pathlib.Path:
  """`<repo>/../shared/data` (the offline corpora), or $T2T_SHARED_DATA if set."""
  if os.environ.get("T2T_SHARED_DATA"):
    return pathlib.Path(os.environ["T2T_SHARED_DATA"])
  return pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "data"


def cpu_env(devices: int = 1, **extra: str) -> dict:
  """The environment for a command a test starts: JAX on `devices` simulated CPU devices, the
  conftest's fast-compiling XLA flags (the run's compilation cache comes through os.environ)."""
  from tests.conftest import FAST_COMPILE

  flags = FAST_COMPILE
  if devices > 1:
    flags += f" --xla_force_host_platform_device_count={devices}"
  return dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=flags, **extra)


def textfiles_config(
  directory,
  train: str = "train",
  dev: str = "val",
  test: str = "test2016",
  source_lang: str = "en",
  target_lang: str = "de",
  **overrides,
):
  """A data config reading `<directory>/{train,dev,test}.{source_lang,target_lang}`."""
  c = default_config()
  c.source = "textfiles"
  c.source_lang, c.target_lang = source_lang, target_lang
  for split, stem in (("train", train), ("dev", dev), ("test", test)):
    if stem:
      c[f"{split}_source"] = str(pathlib.Path(directory) / f"{stem}.{source_lang}")
      c[f"{split}_target"] = str(pathlib.Path(directory) / f"{stem}.{target_lang}")
  c.update(overrides)
  return c


# The small Transformer most model, training and decoding tests build: one layer of each
# kind, 4 heads of 8 dimensions, 40 ids (4 reserved), positions up to 16.
SMALL_MODEL = dict(
  vocab_size=40, d_model=32, d_ff=64, num_heads=4, num_layers=1, dropout_rate=0.0, max_len=16
)


def jit_apply(model, variables, *arrays, **options):
  """`model.apply(variables, *arrays, **options)` as one compiled program. Eager Flax runs
  each operation as an XLA program of its own, compiled for each new shape: seconds per
  forward pass on a CPU where one jitted program takes a fraction of that. `options`
  (method, mutable, rngs, flags) are fixed at trace time."""
  import jax

  return jax.jit(lambda v, *a: model.apply(v, *a, **options))(variables, *arrays)


def jit_init(model, key, *arrays, **options):
  """`model.init(key, *arrays, **options)["params"]`, compiled as one program (`jit_apply`)."""
  import jax

  return jax.jit(lambda k, *a: model.init(k, *a, **options))(key, *arrays)["params"]


def small_model(seed: int = 0, **overrides):
  """(Transformer, params) of SMALL_MODEL with `overrides`, initialised from `seed`."""
  import jax
  import jax.numpy as jnp

  from t2t_jax.model import Transformer, TransformerConfig

  model = Transformer(TransformerConfig(**{**SMALL_MODEL, **overrides}))
  x = jnp.ones((1, 8), jnp.int32)
  return model, jit_init(model, jax.random.PRNGKey(seed), x, x)


def small_state(seed: int = 0, warmup_steps: int = 4, **overrides):
  """(Transformer, TrainState) for `small_model`: Adam with the paper's schedule, dropout
  key 1."""
  import jax

  from t2t_jax.training import optim, steps

  model, params = small_model(seed, **overrides)
  tx = optim.make_optimizer(model.config.d_model, warmup_steps=warmup_steps)
  return model, steps.TrainState.create(params, tx, jax.random.PRNGKey(1))


def made_once(name: str, make: Callable[[str], Any]) -> str:
  """`<run scratch>/<name>`, made by `make(path)` in the first process of the run to ask and
  read by every later one (xdist workers wait on a lock). Readers must not change it: copy
  it first. Without the conftest's scratch (a test module run by hand), a fresh directory."""
  root = os.environ.get("T2T_TEST_SHARED_SCRATCH") or _private_scratch()
  path = os.path.join(root, name)
  with open(path + ".lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not os.path.exists(path + ".done"):
      shutil.rmtree(path, ignore_errors=True)  # a failed attempt's leftovers
      make(path)
      open(path + ".done", "w").close()
  return path


@functools.cache
def _private_scratch() -> str:
  path = tempfile.mkdtemp(prefix="t2t-test-shared-")
  atexit.register(shutil.rmtree, path, ignore_errors=True)
  return path


def small_trained_workdir() -> str:
  """A workdir of tests/test_train.py's small_config trained for its six steps, made once per
  test run (read only)."""

  def make(path: str) -> None:
    from t2t_jax.training import trainer
    from tests.test_train import small_config

    trainer.train_and_evaluate(small_config(eval_every_steps=100), path)

  return made_once("small_trained_workdir", make)


# Runs t2t_jax.cli.<command>.run() as its console script does (flag parsing, absl's app.run,
# the interpreter's handling of SystemExit) in a forked child of one interpreter that loaded
# the libraries once: one subprocess for many cases instead of one (about 4 s) per case.
FORKED_RUNNER = r"""
import hashlib, importlib, json, os, signal, sys, traceback
import jax, orbax.checkpoint, ml_collections.config_flags  # loaded once, for every child
import t2t_jax.training.trainer, t2t_jax.export, t2t_jax.decoding.translator
import absl.app, t2t_jax.cli.common, t2t_jax.cli.host, t2t_jax.training.distributed  # no flags

def listing(root):
  return sorted(os.path.relpath(os.path.join(d, n), root)
                for d, dirs, files in os.walk(root) for n in dirs + files)

def state(root):  # path -> what a change would alter: mtime and, for a file, its bytes
  out = {}
  for d, dirs, files in os.walk(root):
    for n in dirs + files:
      path = os.path.join(d, n)
      digest = "" if n in dirs else hashlib.sha256(open(path, "rb").read()).hexdigest()
      out[os.path.relpath(path, root)] = [os.lstat(path).st_mtime_ns, digest]
  return out

cases, root, out_dir = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
limit = int(sys.argv[4])  # seconds a child may run (0: no limit); SIGALRM ends it
results = {}
for name, command, args in cases:
  err, out = (os.path.join(out_dir, name + suffix) for suffix in (".stderr", ".stdout"))
  before, was = listing(root), state(root)
  pid = os.fork()
  if pid == 0:  # the command's console script, as the interpreter would run it
    signal.alarm(limit)
    os.dup2(os.open(os.devnull, os.O_RDWR), 0)
    os.dup2(os.open(out, os.O_WRONLY | os.O_CREAT), 1)
    os.dup2(os.open(err, os.O_WRONLY | os.O_CREAT), 2)
    sys.argv = [f"t2t-{command}", *args]
    code = 0
    try:
      importlib.import_module(f"t2t_jax.cli.{command}").run()
    except SystemExit as e:
      if isinstance(e.code, str):
        print(e.code, file=sys.stderr)
      code = 1 if isinstance(e.code, str) else (e.code or 0)
    except BaseException:
      traceback.print_exc()
      code = 1
    sys.stdout.flush(), sys.stderr.flush()
    os._exit(code)
  status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
  created = sorted(set(listing(root)) - set(before))
  now = state(root)
  changed = sorted(path for path in was if now.get(path) != was[path])
  results[name] = dict(status=status, stderr=open(err).read(), stdout=open(out).read(),
                       created=created, changed=changed)
print(json.dumps(results))
"""


def forked_commands(
  cases: list, root: str, out_dir: str, child_timeout_s: int = 0
) -> dict[str, dict[str, Any]]:
  """name -> {status, stderr, stdout, created, changed} for each [name, command, args] of
  `cases`, each run in its own forked child; `created` lists what appeared under `root`
  during the case, `changed` what was there and was modified (bytes or mtime) or removed.
  A child still running after `child_timeout_s` seconds (0: no limit) is ended by SIGALRM:
  its status is -14."""
  proc = subprocess.run(
    [sys.executable, "-c", FORKED_RUNNER, json.dumps(cases), root, out_dir, str(child_timeout_s)],
    capture_output=True,
    text=True,
    env=cpu_env(T2T_HUGE_PAGES="0"),
    timeout=300,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


def parse_source(path: "str | pathlib.Path") -> ast.Module:
  """ast.parse of a file with the garbage collector paused. A collection during the parse
  can run Python code (the warning of a coroutine another test left unawaited), and CPython
  3.11 before 3.11.8 then fails the parse with "AST constructor recursion depth mismatch"."""
  text = pathlib.Path(path).read_text(encoding="utf-8")
  enabled = gc.isenabled()
  gc.disable()
  try:
    return ast.parse(text, str(path))
  finally:
    if enabled:
      gc.enable()
