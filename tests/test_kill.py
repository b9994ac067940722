"""kill -9 at random moments: the run resumes and ends exactly as if it had never been killed.

A small synthetic run is started as `python -m t2t_jax.cli.train`, SIGKILLed during a step,
during a checkpoint write (an orbax temporary directory exists) and during evaluation (after
the "evaluating on dev" line), and rerun each time with the same command. Its final
parameters and every step's logged losses must equal, bit for bit, those of one uninterrupted
run; the newest checkpoint complete before each kill must be the one the rerun resumes from.
"""

import os
import random
import re
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from t2t_jax.run import checkpoint
from t2t_jax.run.workdir import read_metrics
from tests import support

STEPS = 12
ARGS = [
  "--experiment=tiny",
  f"--config.num_train_steps={STEPS}",
  "--config.model.d_model=32",
  "--config.model.d_ff=64",
  "--config.model.num_layers=1",
  "--config.model.max_len=16",
  "--config.model.dropout_rate=0.1",
  "--config.data.synthetic_train_size=2000",
  "--config.data.synthetic_eval_size=16",
  "--config.data.synthetic_max_len=8",
  "--config.data.tokens_per_batch=512",
  "--config.data.max_len=16",
  "--config.log_every_steps=1",
  "--config.eval_every_steps=4",
  "--config.bleu_every_steps=8",
  "--config.bleu_num_sentences=8",
  "--config.checkpoint_every_steps=3",
  "--config.keep_checkpoints=2",
  "--config.test_at_end=False",
]
KINDS = ("checkpoint", "evaluation", "step", "checkpoint", "evaluation")


def _start(workdir: str, log: str, cache: str) -> subprocess.Popen:
  env = support.cpu_env(
    devices=2,
    PYTHONUNBUFFERED="1",
    JAX_COMPILATION_CACHE_DIR=cache,  # later starts skip compiling: more kills per minute
    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
  )
  with open(log, "w") as out:
    return subprocess.Popen(
      [sys.executable, "-m", "t2t_jax.cli.train", f"--workdir={workdir}", *ARGS],
      env=env,
      stdout=out,
      stderr=subprocess.STDOUT,
    )


def _committed(workdir: str) -> list[int]:
  directory = os.path.join(workdir, "checkpoints")
  if not os.path.isdir(directory):
    return []
  out = []
  for name in os.listdir(directory):
    path = os.path.join(directory, name)
    if name.isdigit():
      try:
        if not checkpoint.missing_commit_markers(path):
          out.append(int(name))
      except FileNotFoundError:  # pruned while we looked
        pass
  return sorted(out)


def _unfinished(workdir: str) -> list[str]:
  try:
    return [
      n for n in os.listdir(os.path.join(workdir, "checkpoints")) if checkpoint.TMP_MARKER in n
    ]
  except FileNotFoundError:
    return []


def _wait_for(proc, condition, timeout=300.0, poll=0.002) -> bool:
  """True once `condition()` holds; False if the process ended first."""
  deadline = time.time() + timeout
  while not condition():
    if proc.poll() is not None:
      return False
    assert time.time() < deadline, "the run never reached the moment to kill"
    time.sleep(poll)
  return True


def _read(path: str) -> str:
  with open(path, errors="replace") as f:
    return f.read()


def _kill_once(workdir, log, cache, kind, rng) -> dict | None:
  """Starts the run, kills it at a `kind` moment; None if it finished first."""
  proc = _start(workdir, log, cache)
  if kind == "checkpoint":
    reached = _wait_for(proc, lambda: bool(_unfinished(workdir)), poll=0.0005)
  elif kind == "evaluation":
    reached = _wait_for(proc, lambda: "evaluating on dev" in _read(log))
    time.sleep(rng.uniform(0.0, 0.2))
  else:
    reached = _wait_for(proc, lambda: re.search(rf"step \d+/{STEPS} ", _read(log)))
    time.sleep(rng.uniform(0.0, 1.0))
  complete = _committed(workdir)
  unfinished = _unfinished(workdir)
  evaluating = _evaluating(workdir, log)
  proc.kill()
  proc.wait()
  if not reached:  # it ended before the moment came: finished, not crashed
    assert proc.returncode == 0, _read(log)
    return None
  # Killed here, or finished in the instant between the check and the kill.
  assert proc.returncode in (-signal.SIGKILL, 0), (proc.returncode, _read(log))
  return dict(
    kind=kind, complete=complete, unfinished=unfinished, evaluating=evaluating, log=_read(log)
  )


def _evaluating(workdir: str, log: str) -> bool:
  """Whether the run is inside an evaluation: it announced one whose record is not written."""
  announced = re.findall(r"step (\d+): evaluating on dev", _read(log))
  if not announced:
    return False
  step = int(announced[-1])
  return not any(
    r["step"] == step and ("eval_loss" in r or "dev_bleu" in r) for r in read_metrics(workdir)
  )


def _losses(workdir: str) -> list:
  keys = ("loss", "nll", "accuracy", "grad_norm", "learning_rate", "eval_loss", "dev_bleu")
  return [
    (r["step"],) + tuple((k, r[k]) for k in keys if k in r)
    for r in read_metrics(workdir)
    if "loss" in r or "eval_loss" in r
  ]


@pytest.mark.slow
def test_sigkill_at_random_moments_changes_nothing(tmp_path):
  cache = str(tmp_path / "xla_cache")
  reference, killed = str(tmp_path / "reference"), str(tmp_path / "killed")
  proc = _start(reference, str(tmp_path / "reference.log"), cache)
  assert proc.wait(timeout=600) == 0, _read(str(tmp_path / "reference.log"))

  rng = random.Random(18)
  kills = []
  for i, kind in enumerate(KINDS):
    kill = _kill_once(killed, str(tmp_path / f"run{i}.log"), cache, kind, rng)
    if kill is None:
      break
    kills.append(kill)
  final_log = str(tmp_path / "final.log")
  proc = _start(killed, final_log, cache)
  assert proc.wait(timeout=600) == 0, _read(final_log)

  logs = [k["log"] for k in kills[1:]] + [_read(final_log)]
  for kill, next_log in zip(kills, logs):
    resumed = re.findall(r"resumed from \S+/(\d+)", next_log)
    if kill["complete"]:  # the newest complete checkpoint survived and was resumed from
      assert resumed and int(resumed[0]) >= kill["complete"][-1], next_log
    if kill["unfinished"]:
      assert "unfinished checkpoint write(s)" in next_log, next_log
  assert any(k["unfinished"] for k in kills), "no kill landed inside a checkpoint write"
  assert any(k["evaluating"] for k in kills), "no kill landed inside an evaluation"

  assert _losses(killed) == _losses(reference)
  trained = [r["step"] for r in read_metrics(killed) if "loss" in r]
  assert trained == list(range(1, STEPS + 1))  # each step logged once, in order
  ref = checkpoint.Checkpoints(reference).restore_params(STEPS)
  got = checkpoint.Checkpoints(killed).restore_params(STEPS)
  for x, y in zip(jax.tree.leaves(ref), jax.tree.leaves(got), strict=True):
    np.testing.assert_array_equal(x, y)
  landed = {kind: sum(k["kind"] == kind for k in kills) for kind in set(KINDS)}
  print(
    f"\nkill -9: {len(kills)} kills survived ({landed}; "
    f"{sum(bool(k['unfinished']) for k in kills)} inside a checkpoint write, "
    f"{sum(k['evaluating'] for k in kills)} inside an evaluation); final "
    "parameters and every step's losses equal the uninterrupted run's"
  )
