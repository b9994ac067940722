"""Faults a long run meets: damaged checkpoints, a full disk, two runs on one workdir, Ctrl-C,
a changed config on resume, over-long dev pairs, senseless flags and half-written files."""

import asyncio
import collections
import copy
import errno
import gc
import glob
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time

import jax
import numpy as np
import pytest

from t2t_jax.data import DataError, tokenized
from t2t_jax.decoding.config import SearchConfig
from t2t_jax.decoding.translator import TranslateError, Translator
from t2t_jax.run import checkpoint, files, fingerprint, lock
from t2t_jax.run.workdir import Workdir, read_metrics
from t2t_jax.training import checks, evaluation, summary
from t2t_jax.training import trainer as train
from tests import support
from tests.test_train import _cli, small_config


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """A finished 6-step run with checkpoints 2, 4 and 6 (copy it before changing it)."""
  workdir = str(tmp_path_factory.mktemp("trained") / "w")
  train.train_and_evaluate(_six_steps(), workdir)
  return workdir


def _six_steps(**overrides):
  return small_config(
    **{"num_train_steps": 6, "checkpoint_every_steps": 2, "eval_every_steps": 100, **overrides}
  )


def _copy(trained, tmp_path) -> str:
  workdir = str(tmp_path / "w")
  shutil.copytree(trained, workdir)
  return workdir


# --- 2. damaged checkpoints ---------------------------------------------------------------


def _truncate_arrays(step_dir: str) -> None:
  for path in glob.glob(os.path.join(step_dir, "state", "ocdbt.process_0", "d", "*")):
    with open(path, "r+b") as f:
      f.truncate(10)


# What a restore that fails leaves behind in orbax, by the one message each piece ends with.
LOOP_CLOSED = "a read ended after orbax closed its event loop"
READ_CLOSED = "an abandoned read coroutine was collected"
ORBAX_DIR = os.sep + os.path.join("orbax", "checkpoint") + os.sep


def _stray_kind(unraisable) -> str | None:
  error, obj = unraisable.exc_value, unraisable.object
  if isinstance(error, RuntimeError) and str(error) == "Event loop is closed":
    return LOOP_CLOSED
  code = getattr(obj, "cr_code", None)
  if code and ORBAX_DIR in code.co_filename and isinstance(error.__cause__, GeneratorExit):
    return READ_CLOSED
  return None


class OrbaxStrays:
  """Takes what a restore failing on purpose leaves behind in orbax, within the test that made
  it, and lets it end there.

  Orbax runs a restore's reads on an event loop of its own (asyncio_utils.run_sync ->
  _run_sync_via_new_loop: `loop.run_until_complete(coro)`, then `loop.close()`). When one read
  fails, asyncio.gather raises at once without cancelling the others, and the loop is closed
  under them. Each read left in flight then ends in an error Python can only report through
  sys.unraisablehook: tensorstore's completion calls `call_soon_threadsafe` on the closed loop
  ('RuntimeError: Event loop is closed'), and the read's coroutine, when the garbage collector
  closes it, raises an Exception, since orbax's `except BaseException` around the read
  (serialization._read_array_index_and_device_put) turns the GeneratorExit into one. Both
  come whenever the read ends or the collector runs: often in a later test. These reads only
  read the step already skipped (test_reads_left_in_flight_by_a_failed_restore_change_nothing).
  Anything else unraisable goes on to pytest."""

  def __init__(self) -> None:
    self.seen: collections.Counter[str] = collections.Counter()
    self.previous = sys.unraisablehook

  def hook(self, unraisable) -> None:
    kind = _stray_kind(unraisable)
    if kind is None:
      self.previous(unraisable)
    else:
      self.seen[kind] += 1

  def wait(self, timeout_s: float = 30.0) -> None:
    """Until no task is left pending on a closed event loop (it can never run again: it is
    garbage once its read has ended)."""
    deadline = time.monotonic() + timeout_s
    while True:
      gc.collect()
      left = sum(  # type(), not isinstance(): that would ask every object its __class__
        issubclass(type(o), asyncio.Task) and not o.done() and o.get_loop().is_closed()
        for o in gc.get_objects()
      )
      if not left:
        return
      assert time.monotonic() < deadline, f"{left} task(s) of a failed restore never ended"
      time.sleep(0.05)


@pytest.fixture
def orbax_strays():
  strays = OrbaxStrays()
  sys.unraisablehook = strays.hook
  try:
    yield strays
    strays.wait()
  finally:
    sys.unraisablehook = strays.previous


@pytest.mark.slow
def test_damaged_latest_checkpoints_are_reported_kept_and_skipped(
  trained, tmp_path, caplog, orbax_strays
):
  caplog.set_level("INFO")
  workdir = _copy(trained, tmp_path)
  ckpt = os.path.join(workdir, "checkpoints")
  os.remove(os.path.join(ckpt, "6", checkpoint.COMMIT_MARKER))  # an unfinished write
  _truncate_arrays(os.path.join(ckpt, "4"))  # truncated files
  reference = checkpoint.Checkpoints(trained).restore_params(6)
  out = train.train_and_evaluate(_six_steps(), workdir)
  assert f"step 6 at {ckpt}/6: no commit marker" in caplog.text
  assert f"checkpoint step 4 at {ckpt}/4 does not restore" in caplog.text
  assert "resumed from" in caplog.text and f"{ckpt}/2" in caplog.text
  assert out["step"] == 6
  # Never deleted: set aside when the run saved those steps again.
  assert os.path.isdir(f"{ckpt}/6.damaged") and os.path.isdir(f"{ckpt}/4.damaged")
  redone = checkpoint.Checkpoints(workdir).restore_params(6)  # and exactly as before
  for x, y in zip(jax.tree.leaves(reference), jax.tree.leaves(redone), strict=True):
    np.testing.assert_array_equal(x, y)


@pytest.mark.slow
def test_no_restorable_checkpoint_stops_naming_every_path(trained, tmp_path, orbax_strays):
  workdir = _copy(trained, tmp_path)
  ckpt = os.path.join(workdir, "checkpoints")
  os.remove(os.path.join(ckpt, "6", "state", checkpoint.COMMIT_MARKER))
  for step in ("2", "4"):
    _truncate_arrays(os.path.join(ckpt, step))
  with pytest.raises(checkpoint.CheckpointDamagedError) as e:
    train.train_and_evaluate(_six_steps(), workdir)
  for step in (2, 4, 6):
    assert f"step {step} at {ckpt}/{step}" in str(e.value)
  assert sorted(os.listdir(ckpt)) == ["2", "4", "6"]  # nothing moved or deleted


def _bits(tree) -> list[tuple[str, tuple[int, ...], bytes]]:
  return [
    (str(np.asarray(x).dtype), np.shape(x), np.asarray(x).tobytes()) for x in jax.tree.leaves(tree)
  ]


def test_reads_left_in_flight_by_a_failed_restore_change_nothing(
  tmp_path, monkeypatch, orbax_strays
):
  """One array's read fails while orbax is still reading the others, as with a damaged
  checkpoint (made certain here: every other read of the step waits until orbax has given
  up). The step is skipped, the older one restores bit for bit, the reads left behind end
  on orbax's closed loop without writing a byte, and then the skipped step restores exactly
  as saved."""
  import tensorstore as ts
  from orbax.checkpoint._src.serialization import serialization

  workdir = str(tmp_path / "w")
  _, state = support.small_state()
  saved = {
    s: state.replace(params=jax.tree.map(lambda x, s=s: x * s, state.params)) for s in (1, 2)
  }
  writer = checkpoint.Checkpoints(workdir, owner=True)
  for step, at_step in saved.items():
    writer.save(step, at_step, {"position": step})
  writer.wait()
  writer.close()
  before = _contents(workdir)

  read_shard, reads = serialization._read_shard, []

  async def counted(**kwargs):
    reads.append(1)
    return await read_shard(**kwargs)

  monkeypatch.setattr(serialization, "_read_shard", counted)
  checkpoint.Checkpoints(workdir).restore(2, state)
  n = len(reads)  # the reads one restore of the state makes
  assert n > 1
  release, later = ts.Promise.new()

  async def last_fails(**kwargs):
    reads.append(1)
    if len(reads) < 2 * n:
      await later  # still in flight when the last one fails
    elif len(reads) == 2 * n:
      raise OSError(errno.EIO, "Input/output error (injected)")
    return await read_shard(**kwargs)

  monkeypatch.setattr(serialization, "_read_shard", last_fails)
  ckpts = checkpoint.Checkpoints(workdir)
  unstick = threading.Timer(60, release.set_result, (None,))  # no hang if orbax reads otherwise
  unstick.start()
  try:
    restored, data_state, step = ckpts.restore_newest(state, lambda *a: None)
  finally:
    unstick.cancel()
    release.set_result(None)  # the reads left in flight end now, after their loop was closed
  orbax_strays.wait()
  assert (step, data_state) == (1, {"position": 1})
  assert _bits(checkpoint.state_tree(restored)) == _bits(checkpoint.state_tree(saved[1]))
  why = f"step 2 at {ckpts.path(2)}: Exception: Encountered error while reading array"
  assert ckpts.damaged()[0].startswith(why) and ckpts.steps() == [1]
  # orbax 0.12.8 leaves the other reads running on its closed loop (each reported twice);
  # releases that wait for them before closing leave none: either way nothing is written.
  assert orbax_strays.seen in ({LOOP_CLOSED: n - 1, READ_CLOSED: n - 1}, {})
  monkeypatch.undo()
  assert _contents(workdir) == before  # they only read
  again, data_state = checkpoint.Checkpoints(workdir).restore(2, state)
  assert data_state == {"position": 2}
  assert _bits(checkpoint.state_tree(again)) == _bits(checkpoint.state_tree(saved[2]))


# --- 3. disk full while saving ------------------------------------------------------------


@pytest.mark.slow
def test_disk_full_while_saving_stops_naming_step_and_keeps_the_last_checkpoint(
  tmp_path, monkeypatch
):
  from orbax.checkpoint._src.path import async_path

  write_text = async_path.write_text

  async def full_at_step_4(path, text, *args, **kwargs):
    if "/4.orbax-checkpoint-tmp" in str(path):
      raise OSError(errno.ENOSPC, "No space left on device", str(path))
    return await write_text(path, text, *args, **kwargs)

  monkeypatch.setattr(async_path, "write_text", full_at_step_4)
  workdir = str(tmp_path / "w")
  with pytest.raises(checkpoint.CheckpointSaveError) as e:
    train.train_and_evaluate(_six_steps(), workdir)
  monkeypatch.undo()
  ckpt = os.path.join(workdir, "checkpoints")
  assert f"saving checkpoint step 4 to {ckpt}/4 failed" in str(e.value)
  assert "No space left on device" in str(e.value) and "[2]" in str(e.value)
  assert checkpoint.Checkpoints(workdir).steps() == [2]  # nothing half-written is listed
  assert not os.path.exists(os.path.join(ckpt, "4"))
  out = train.train_and_evaluate(_six_steps(), workdir)  # resumes from 2
  assert out["step"] == 6 and checkpoint.Checkpoints(workdir).steps() == [2, 4, 6]


# --- 4. two runs on one workdir -----------------------------------------------------------

HOLD = textwrap.dedent(
  """
  import os, signal, sys, time
  from t2t_jax.run.lock import WorkdirLock
  WorkdirLock(sys.argv[1]).acquire()
  print("held", flush=True)
  if sys.argv[2] == "die":
    os.kill(os.getpid(), signal.SIGKILL)
  time.sleep(600)
  """
)


def _holder(workdir: str, mode: str) -> subprocess.Popen:
  os.makedirs(workdir, exist_ok=True)
  proc = subprocess.Popen(
    [sys.executable, "-c", HOLD, workdir, mode], stdout=subprocess.PIPE, text=True
  )
  assert proc.stdout.readline().strip() == "held"
  return proc


def test_second_run_on_a_live_workdir_is_refused_naming_the_holder(tmp_path):
  workdir = str(tmp_path / "w")
  holder = _holder(workdir, "live")
  try:
    with pytest.raises(lock.WorkdirLockedError) as e:
      train.train_and_evaluate(_six_steps(), workdir)
    assert f"pid {holder.pid} on host {os.uname().nodename} (started 20" in str(e.value)
    assert not os.path.exists(os.path.join(workdir, "checkpoints"))  # refused at once
  finally:
    holder.kill()
    holder.wait()


def test_lock_of_a_dead_run_is_taken_over_with_a_warning(tmp_path, caplog):
  caplog.set_level("WARNING")
  workdir = str(tmp_path / "w")
  dead = _holder(workdir, "die")
  assert dead.wait() == -signal.SIGKILL
  with lock.WorkdirLock(workdir):
    assert f"from pid {dead.pid} on host" in caplog.text and "no longer running" in caplog.text
  with open(Workdir(workdir).lock_file) as f:
    assert f.read() == ""  # a clean release leaves no holder behind


# --- 5. preemption ------------------------------------------------------------------------


@pytest.mark.slow
def test_sigint_saves_and_exits_75(tmp_path):
  workdir = str(tmp_path / "w")
  args = [
    "--experiment=tiny",
    f"--workdir={workdir}",
    "--config.num_train_steps=100000",
    "--config.log_every_steps=2",
    "--config.checkpoint_every_steps=100000",
    "--config.eval_every_steps=100000",
    "--config.model.d_model=32",
    "--config.model.d_ff=64",
    "--config.model.num_layers=1",
    "--config.data.synthetic_train_size=2000",
    "--config.data.synthetic_eval_size=16",  # the closing translations are not under test
  ]
  proc = _cli(*args)
  for line in proc.stdout:
    if "step 2/100000" in line:
      break
  proc.send_signal(signal.SIGINT)
  out, _ = proc.communicate(timeout=120)
  assert proc.returncode == 75, out
  assert "SIGINT received: saved step" in out and "exit status 75" in out
  # Committed and complete, as a resume needs it (the resume itself, the same after either
  # signal: tests/test_train.py::test_sigterm_saves_and_resumes).
  saved = checkpoint.Checkpoints(workdir).latest_step()
  assert saved >= 2 and checkpoint.Checkpoints(workdir).steps() == [saved]
  assert not checkpoint.Checkpoints(workdir).damaged()


def test_second_ctrl_c_is_explained_and_a_third_aborts(capfd, monkeypatch):
  stop = train.StopRequest()
  try:
    os.kill(os.getpid(), signal.SIGINT)
    assert stop.signal == "SIGINT" and capfd.readouterr().err == ""
    os.kill(os.getpid(), signal.SIGINT)
    err = capfd.readouterr().err
    assert (
      "SIGINT again: the run is finishing its step and saving a checkpoint, then it exits" in err
    )
    exits = []
    monkeypatch.setattr(os, "_exit", exits.append)
    os.kill(os.getpid(), signal.SIGINT)
    assert exits == [128 + signal.SIGINT]
    assert "aborted without saving" in capfd.readouterr().err
  finally:
    stop.restore()


def test_a_signal_inside_interrupting_raises_and_one_before_it_raises_on_entry():
  stop = train.StopRequest()
  try:
    with pytest.raises(train.StopRequested) as e, stop.interrupting():
      os.kill(os.getpid(), signal.SIGTERM)
      signal.sigtimedwait([], 0)  # a handler runs at the next bytecode; this is one
      pytest.fail("SIGTERM did not interrupt the block")
    assert e.value.signal == "SIGTERM" and stop.signal == "SIGTERM"
    with pytest.raises(train.StopRequested), stop.interrupting():
      pytest.fail("entered although a signal had come")
  finally:
    stop.restore()
  assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def _slow(mode, workdir, tmp_path, *flags):
  """t2t-train through tests/slow_save.py: its checkpoint commit or test translation waits."""
  env = support.cpu_env(devices=2, T2T_SLOW_DIR=str(tmp_path), T2T_SLOW_S="10")
  args = [
    "--experiment=tiny",
    f"--workdir={workdir}",
    "--config.log_every_steps=2",
    "--config.eval_every_steps=100000",
    "--config.model.d_model=32",
    "--config.model.d_ff=64",
    "--config.model.num_layers=1",
    "--config.data.synthetic_train_size=2000",
    "--config.data.synthetic_eval_size=16",  # the closing translations are not under test
    *flags,
  ]
  return subprocess.Popen(
    [sys.executable, "-m", "tests.slow_save", mode, *args],
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
  )


def _read_until(proc, text):
  lines = []
  for line in proc.stdout:
    lines.append(line)
    if text in line:
      return "".join(lines)
  pytest.fail(f"no {text!r} in the output:\n{''.join(lines)[-3000:]}")


@pytest.mark.slow
@pytest.mark.parametrize("second", ["SIGINT", "SIGTERM"])
def test_a_second_signal_during_the_checkpoint_write_still_commits_it_and_exits_75(
  tmp_path, second
):
  workdir = str(tmp_path / "w")
  flags = ["--config.num_train_steps=100000", "--config.checkpoint_every_steps=100000"]
  proc = _slow("write", workdir, tmp_path, *flags)
  try:
    head = _read_until(proc, "step 2/100000")
    proc.send_signal(signal.SIGTERM)
    head += _read_until(proc, "slow write: started")  # the stop's checkpoint is being written
    proc.send_signal(getattr(signal, second))
    out, _ = proc.communicate(timeout=120)
  finally:
    proc.kill()
  out = head + out
  assert proc.returncode == 75, out[-3000:]
  assert f"{second} again: the run is finishing its step and saving a checkpoint" in out
  assert "Traceback" not in out and "KeyboardInterrupt" not in out
  saved = out.index("SIGTERM received: saved step")
  assert out.index("slow write: committing") < saved  # logged once it is on disk
  step = int(re.search(r"saved step (\d+)", out[saved:]).group(1))
  assert checkpoint.Checkpoints(workdir).steps() == [step]  # committed, complete
  assert not checkpoint.Checkpoints(workdir).damaged()


@pytest.mark.slow
def test_sigterm_during_the_test_translation_exits_75_and_the_next_run_only_translates(tmp_path):
  workdir = str(tmp_path / "w")
  flags = ["--config.num_train_steps=4", "--config.checkpoint_every_steps=100000"]
  proc = _slow("test", workdir, tmp_path, *flags)
  try:
    head = _read_until(proc, "slow test: started")
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
  finally:
    proc.kill()
  out = head + out
  assert proc.returncode == 75, out[-3000:]
  assert "SIGTERM received during the test translation: stopping" in out
  assert "slow test: translating" not in out  # stopped at once, not after the wait
  assert checkpoint.Checkpoints(workdir).steps() == [4] and not glob.glob(f"{workdir}/test.*")
  rerun = _cli(*proc.args[4:])  # the same flags, without the slow test translation
  out, _ = rerun.communicate(timeout=240)
  assert rerun.returncode == 0, out[-3000:]
  assert f"resumed from {workdir}/checkpoints/4" in out
  assert "step 2/4" not in out and "step 4/4" not in out  # no training again
  assert glob.glob(f"{workdir}/test.*"), out[-3000:]


# --- 6. resume fingerprint ----------------------------------------------------------------


def _fingerprint(**overrides):
  return fingerprint.make(small_config(**overrides), "ab" * 32)


@pytest.mark.parametrize(
  "field, value",
  [("model.dropout_rate", 0.3), ("model.norm", "pre"), ("data.synthetic_seed", 7), ("seed", 1)],
)
def test_resume_with_another_experiment_is_refused(field, value):
  saved = _fingerprint()
  old = fingerprint.flatten(saved["config"])[field]
  with pytest.raises(
    fingerprint.FingerprintError, match=rf"config\.{field}={old!r}.*config\.{field}={value!r}"
  ):
    fingerprint.compare(saved, _fingerprint(**{field: value}), "checkpoint /w/checkpoints/6")


def test_safe_changes_are_allowed_and_returned():
  changes = fingerprint.compare(
    _fingerprint(),
    _fingerprint(num_train_steps=99, log_every_steps=7, train_time_limit_minutes=5.0),
    "here",
  )
  assert changes == {
    "log_every_steps": [1, 7],
    "num_train_steps": [6, 99],
    "train_time_limit_minutes": [0.0, 5.0],
  }
  other_vocab = dict(_fingerprint(), vocab_sha256="cd" * 32)
  with pytest.raises(fingerprint.FingerprintError, match=f"sha256 {'ab' * 32}.*sha256 {'cd' * 32}"):
    fingerprint.compare(_fingerprint(), other_vocab, "here")


def _resume_table() -> dict[str, str]:
  """{field: 'refused' | 'allowed' | 'allowed, not bit-exact'} from docs/faults.md's table
  "What a resume may change" (fields as `run.fingerprint.policy_name` spells them)."""
  text = (pathlib.Path(__file__).parents[1] / "docs" / "faults.md").read_text(encoding="utf-8")
  section = text.split("## What a resume may change", 1)[1].split("\n## ", 1)[0]
  table = {}
  for line in section.splitlines():
    cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
    if len(cells) != 3 or cells[1] not in ("refused", "allowed", "allowed, not bit-exact"):
      continue
    for field in re.findall(r"`([a-z_0-9.\[\]]+)`", cells[0]):
      assert field not in table, f"{field} has two rows"
      table[field] = cells[1]
  return table


RESUME_TABLE = _resume_table()


def _one_corpus_fingerprint():
  """A fingerprint of the base experiment's config with one training corpus, 8 devices."""
  from t2t_jax.experiments import base

  config = base.get_config()
  config.data.train_corpora = ({"source": "a.en", "target": "a.de", "weight": 1.0, "tag": ""},)
  identity = dict(name="textfiles", **{"train_corpora[0].target": dict(size=3, sha256="ab")})
  return fingerprint.make(config, "ab" * 32, None, identity, dict(devices=8, processes=1))


def _other(value):
  if isinstance(value, bool):
    return not value
  if isinstance(value, int | float):
    return value + (1 if isinstance(value, int) else 0.5)
  if isinstance(value, list):
    return [*value, 7]
  return f"{value}x"


def test_every_field_has_one_row_in_the_resume_table():
  saved = _one_corpus_fingerprint()
  fields = {fingerprint.policy_name(f) for f in fingerprint.flatten(saved["config"])}
  assert fields | set(fingerprint.RUN_FIELDS) == set(RESUME_TABLE)
  allowed = {f for f, verdict in RESUME_TABLE.items() if verdict != "refused"}
  assert allowed == fingerprint.MAY_CHANGE_ON_RESUME
  inexact = {f for f, verdict in RESUME_TABLE.items() if verdict.endswith("not bit-exact")}
  assert inexact == fingerprint.NOT_BIT_EXACT


@pytest.mark.parametrize("field", sorted(RESUME_TABLE))
def test_a_resume_changing_one_field_does_what_the_table_says(field):
  saved = _one_corpus_fingerprint()
  current = copy.deepcopy(saved)
  name = field.replace("[]", "[0]")
  if field in fingerprint.RUN_FIELDS:
    tree, key = current["run"], field
  else:  # walk 'data.train_corpora[0].tag' down the JSON config
    tree = current["config"]
    *path, key = re.split(r"\.|\[(\d+)\]\.", name)
    for part in filter(None, path):
      tree = tree[int(part)] if part.isdigit() else tree[part]
  before = tree[key]
  tree[key] = after = _other(before)
  if RESUME_TABLE[field] == "refused":
    with pytest.raises(fingerprint.FingerprintError, match=re.escape(f"config.{name}={before!r}")):
      fingerprint.compare(saved, current, "checkpoint /w/checkpoints/6")
  else:
    assert fingerprint.compare(saved, current, "here") == {name: [before, after]}


def test_other_training_data_is_refused_naming_the_file_and_a_moved_copy_allowed():
  saved = _one_corpus_fingerprint()
  moved = copy.deepcopy(saved)
  moved["config"]["data"]["train_corpora"][0]["target"] = "/elsewhere/a.de"
  assert fingerprint.compare(saved, moved, "here") == {
    "data.train_corpora[0].target": ["a.de", "/elsewhere/a.de"]
  }
  edited = copy.deepcopy(moved)
  edited["train_data"]["train_corpora[0].target"] = dict(size=3, sha256="cd")
  with pytest.raises(
    fingerprint.FingerprintError,
    match=r"other training data: config\.data\.train_corpora\[0\]\.target=/elsewhere/a\.de is "
    r"now 3 bytes, sha256 cd, the checkpoint's was 3 bytes, sha256 ab",
  ):
    fingerprint.compare(saved, edited, "here")
  more = copy.deepcopy(saved)  # one corpus more is other data, though its fields are new
  more["config"]["data"]["train_corpora"].append(dict(source="b.en", target="b.de"))
  with pytest.raises(fingerprint.FingerprintError, match=r"train_corpora\[1\]\.source"):
    fingerprint.compare(saved, more, "here")
  old = {k: v for k, v in saved.items() if k not in ("train_data", "run")}  # an older save
  assert fingerprint.compare(old, edited, "here") == {
    "data.train_corpora[0].target": ["a.de", "/elsewhere/a.de"]
  }


def test_a_resume_after_a_config_field_was_added_reports_it_and_a_removed_one_refuses():
  """A checkpoint written before a field existed resumes with the field's value reported as
  a change from '<absent>'; a field the checkpoint has and this start lacks is refused unless
  the table allows changing it; a field added inside a list (a corpus more) is other data."""
  saved = _one_corpus_fingerprint()
  older = copy.deepcopy(saved)
  del older["config"]["patience"], older["config"]["model"]["d_ff"]  # one allowed, one not
  assert fingerprint.compare(older, saved, "here") == {
    "model.d_ff": ["<absent>", saved["config"]["model"]["d_ff"]],
    "patience": ["<absent>", saved["config"]["patience"]],
  }
  # The other way round: this start lacks a field the checkpoint has.
  assert fingerprint.compare(
    saved, older | {"config": dict(older["config"], model=saved["config"]["model"])}, "here"
  ) == {"patience": [saved["config"]["patience"], "<absent>"]}
  with pytest.raises(
    fingerprint.FingerprintError,
    match=r"config\.model\.d_ff=\d+, but .*"
    r"config\.model\.d_ff='<absent>'",
  ):
    fingerprint.compare(saved, older, "here")
  added = copy.deepcopy(saved)
  added["config"]["data"]["train_corpora"][0]["note"] = "x"
  with pytest.raises(fingerprint.FingerprintError, match=r"train_corpora\[0\]\.note='<absent>'"):
    fingerprint.compare(saved, added, "here")
  # The run record: devices are reported, a checkpoint without one is not checked.
  moved = copy.deepcopy(saved)
  moved["run"]["devices"] = 4
  assert fingerprint.compare(saved, moved, "here") == {"devices": [8, 4]}
  assert fingerprint.compare(dict(saved, run=None), moved, "here") == {}
  assert fingerprint.compare(saved, copy.deepcopy(saved), "here") == {}


def _starts(workdir):
  with open(Workdir(workdir).starts_file) as f:
    return [json.loads(line) for line in f]


@pytest.mark.slow
@pytest.mark.parametrize("prepared", [True, False])
def test_an_edited_corpus_is_refused_on_resume_a_moved_one_resumes(tmp_path, prepared):
  from tests.test_data_store import _corpus, _small_train_config

  corpus = _corpus(tmp_path / "corpus", n=300, long_every=0)
  original = (corpus / "train.de").read_text(encoding="utf-8")
  workdir = str(tmp_path / "w")
  train.train_and_evaluate(_small_train_config(corpus, prepared), workdir)  # 4 steps
  lines = original.split("\n")
  lines[3] = lines[3][::-1]  # same size, other content
  (corpus / "train.de").write_text("\n".join(lines), encoding="utf-8")
  shutil.rmtree(os.path.join(workdir, "prepared"), ignore_errors=True)  # as its error advises
  config = _small_train_config(corpus, prepared)
  config.num_train_steps = 6
  with pytest.raises(
    fingerprint.FingerprintError,
    match=rf"other training data: config\.data\.train_target={corpus}/train\.de is now",
  ):
    train.train_and_evaluate(config, workdir)
  moved = tmp_path / "moved"
  shutil.copytree(corpus, moved)
  (moved / "train.de").write_text(original, encoding="utf-8")
  config = _small_train_config(moved, prepared)
  config.num_train_steps = 6
  shutil.rmtree(os.path.join(workdir, "prepared"), ignore_errors=True)
  assert train.train_and_evaluate(config, workdir)["step"] == 6
  last = _starts(workdir)[-1]
  assert last["step"] == 4 and last["changed"]["data.train_target"] == [
    f"{corpus}/train.de",
    f"{moved}/train.de",
  ]


@pytest.mark.slow
def test_a_resume_on_other_devices_goes_on_and_is_recorded(tmp_path):
  workdir = str(tmp_path / "w")
  train.train_and_evaluate(small_config(num_train_steps=2, checkpoint_every_steps=2), workdir)
  code = (
    "from t2t_jax.training import trainer; from tests.test_train import small_config; "
    f"trainer.train_and_evaluate(small_config(checkpoint_every_steps=2), {workdir!r})"
  )
  out = subprocess.run(
    [sys.executable, "-c", code],
    env=support.cpu_env(devices=2),
    capture_output=True,
    text=True,
    timeout=300,
    cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
  )
  assert out.returncode == 0, out.stderr[-3000:]
  assert "resuming with devices changed from 8 to 2" in out.stderr
  first, second = _starts(workdir)
  assert (first["devices"], first["processes"], first["changed"]) == (8, 1, {})
  assert (second["step"], second["devices"], second["processes"]) == (2, 2, 1)
  assert second["changed"] == {"devices": [8, 2], "num_train_steps": [2, 6]}
  assert second["not_bit_exact"] == ["devices"]
  assert checkpoint.Checkpoints(workdir).latest_step() == 6


@pytest.mark.slow
def test_resume_checks_the_fingerprint_and_records_each_start(trained, tmp_path):
  workdir = _copy(trained, tmp_path)
  with pytest.raises(fingerprint.FingerprintError, match=r"config\.model\.dropout_rate=0\.0"):
    train.train_and_evaluate(_six_steps(**{"model.dropout_rate": 0.2}), workdir)
  train.train_and_evaluate(_six_steps(num_train_steps=8, log_every_steps=2), workdir)
  with open(os.path.join(workdir, "config.json")) as f:
    assert json.load(f)["num_train_steps"] == 8  # the latest start's config
  with open(Workdir(workdir).starts_file) as f:
    starts = [json.loads(line) for line in f]
  assert [s["step"] for s in starts] == [0, 6]
  assert starts[1]["changed"] == {"log_every_steps": [1, 2], "num_train_steps": [6, 8]}


@pytest.mark.slow
def test_translate_refuses_a_vocabulary_the_checkpoint_was_not_trained_with(trained, tmp_path):
  workdir = _copy(trained, tmp_path)
  vocab = os.path.join(workdir, "vocab.symbols")
  with open(vocab) as f:
    lines = f.read().splitlines()
  with open(vocab, "w") as f:  # same size, two symbols swapped
    f.write("\n".join([lines[1], lines[0], *lines[2:]]) + "\n")
  with pytest.raises(TranslateError, match=rf"vocabulary {vocab} \(sha256 [0-9a-f]{{64}}\) is not"):
    Translator.from_workdir(workdir, "latest")


# --- 7. evaluation never crashes ----------------------------------------------------------


def _corpus(directory, name, lines):
  for lang, offset in (("en", 0), ("de", 1)):
    with open(os.path.join(directory, f"{name}.{lang}"), "w") as f:
      f.write(
        "".join(" ".join(f"w{(i + j + offset) % 20}" for j in range(n)) + "\n" for i, n in lines)
      )


@pytest.mark.slow
def test_dev_and_test_pairs_longer_than_max_len_are_truncated_with_one_warning(tmp_path, caplog):
  caplog.set_level("WARNING")
  corpus = tmp_path / "corpus"
  corpus.mkdir()
  _corpus(corpus, "train", [(i, 3 + i % 8) for i in range(300)])
  _corpus(corpus, "val", [(i, 4) for i in range(6)] + [(99, 400)])
  _corpus(corpus, "test", [(i, 5) for i in range(6)] + [(98, 400)])
  config = small_config(num_train_steps=2, eval_every_steps=2, bleu_every_steps=2, test_at_end=True)
  config.data = support.textfiles_config(
    corpus, test="test", vocab_size=24, vocab_byte_fallback=False, max_len=16, tokens_per_batch=1024
  )
  config.model.max_len = 64
  out = train.train_and_evaluate(config, str(tmp_path / "w"))
  assert np.isfinite(out["eval_loss"]) and "dev_bleu" in out and "test_bleu" in out
  dev, test = f"{corpus}/val.en / {corpus}/val.de", f"{corpus}/test.en / {corpus}/test.de"
  assert caplog.text.count(f"{dev}: 1 of 7 pairs longer than the model's max_len=64") == 1
  assert f"{dev}: 1 of 7 sentences have more source tokens than the model's max_len=64" in (
    caplog.text
  )
  assert f"{test}: 1 of 7 sentences have more source tokens" in caplog.text


def test_truncate_keeps_short_pairs_and_cuts_long_ones_to_max_len_with_eos():
  class Ids:
    def encode_batch(self, texts):
      return [[int(w) for w in t.split()] for t in texts]

  pairs = tokenized.tokenize_pairs([("5 6", "7"), (" ".join(["9"] * 10), "8 8 8")], Ids())
  cut, n = tokenized.truncate(pairs, 4)
  assert n == 1
  assert cut.pair(0)["inputs"].tolist() == [5, 6, 1] and cut.pair(0)["targets"].tolist() == [7, 1]
  assert cut.pair(1)["inputs"].tolist() == [9, 9, 9, 1]
  assert cut.pair(1)["targets"].tolist() == [8, 8, 8, 1]


# --- 8. values that make no sense ---------------------------------------------------------

# Fields that must be positive integers (training.checks: TrainConfig's, the data config's).
FIELDS = [
  "log_every_steps",
  "eval_every_steps",
  "checkpoint_every_steps",
  "grad_accum_steps",
  "num_train_steps",
  "keep_checkpoints",
  "data.tokens_per_batch",
]


def _refused_commands(trained: str, root: str) -> dict[str, tuple[list[str], str]]:
  """case -> (t2t command and flags, what its one line of error must say)."""
  return {
    "translate average:x": (
      ["translate", f"--workdir={trained}", "--checkpoint=average:x"],
      "--checkpoint=average:x: not 'auto', 'selected', 'latest', 'average:N'",
    ),
    "translate average:0": (
      ["translate", f"--workdir={trained}", "--checkpoint=average:0"],
      "--checkpoint=average:0: not 'auto', 'selected', 'latest', 'average:N'",
    ),
    "translate beam_size 0": (
      ["translate", f"--workdir={trained}", "--beam_size=0"],
      "--beam_size=0 must be >= 1",
    ),
    "average num 0": (
      ["average", f"--workdir={trained}", "--num=0", f"--output={root}/avg"],
      "--num=0 must be >= 1",
    ),
    "train log_every_steps 0": (
      ["train", f"--workdir={root}/w", "--config.log_every_steps=0"],
      "config.log_every_steps=0 must be a positive integer",
    ),
    "train vocab_size": (
      [
        "train",
        f"--workdir={root}/w",
        "--config.data.source=textfiles",
        f"--config.data.train_source={root}/t.en",
        f"--config.data.train_target={root}/t.de",
        "--config.data.vocab_size=5",
      ],
      "config.data.vocab_size=5",
    ),
  }


REFUSED_COMMANDS = sorted(_refused_commands("TRAINED", "ROOT"))


@pytest.fixture(scope="module")
def refused(trained, tmp_path_factory):
  """(root, case -> {status, stderr, created}): every command of _refused_commands, each in
  a forked child of one interpreter (tests.support.forked_commands), as its console script
  runs it."""
  root = str(tmp_path_factory.mktemp("refused"))
  for lang in ("en", "de"):
    with open(f"{root}/t.{lang}", "w") as f:
      f.write("".join(f"word{i} other{i}\n" for i in range(50)))
  cases = [
    [name, command, args]
    for name, ((command, *args), _) in _refused_commands(trained, root).items()
  ]
  return root, support.forked_commands(cases, root, str(tmp_path_factory.mktemp("refused_err")))


@pytest.mark.parametrize(
  "case",
  [
    *(f"config.{f}={v}" for f in FIELDS for v in (0, -1)),
    *(pytest.param(case, marks=pytest.mark.slow) for case in REFUSED_COMMANDS),
  ],
)
def test_values_that_make_no_sense_are_refused_in_one_line(case, tmp_path, request):
  if case.startswith("config."):
    field, value = case[len("config.") :].split("=")
    config = small_config(**{field: int(value)})
    refusals = (train.ConfigError, DataError)
    with pytest.raises(refusals, match=rf"config\.{field}={value} must be a positive"):
      train.train_and_evaluate(config, str(tmp_path / "w"))
    assert not (tmp_path / "w").exists()  # refused before any work
    return
  root, results = request.getfixturevalue("refused")
  (command, *_), expected = _refused_commands(request.getfixturevalue("trained"), root)[case]
  result = results[case]
  # 2: a wrong command line; 1: a vocabulary the corpus cannot give, found on reading it
  assert result["status"] == (1 if case == "train vocab_size" else 2), result["stderr"]
  stderr = result["stderr"]
  assert expected in stderr and "Traceback" not in stderr, stderr
  assert stderr.strip().splitlines()[-1].startswith(f"t2t-{command}: ")


# --- 9. files never half-written ----------------------------------------------------------


def test_an_interrupted_write_leaves_the_previous_file(tmp_path, monkeypatch):
  path = str(tmp_path / "selected.json")
  files.atomic_write_text(path, "old\n")

  def crash(fd):
    raise OSError(errno.EIO, "disk gone")

  monkeypatch.setattr(os, "fsync", crash)
  selection = evaluation.Selection("latest", {"latest": 1.0}, {"latest": [6]}, 3)
  with pytest.raises(OSError, match="disk gone"):
    evaluation.write_selection(str(tmp_path), selection, SearchConfig(beam_size=4, alpha=0.6))
  with pytest.raises(OSError, match="disk gone"):
    Workdir(str(tmp_path)).write_start(small_config())
  monkeypatch.undo()
  assert open(path).read() == "old\n" and not (tmp_path / "config.json").exists()
  assert sorted(os.listdir(tmp_path)) == ["selected.json"]  # no temporary file left


def test_metrics_reader_skips_an_incomplete_last_line_and_resume_drops_it(tmp_path):
  path = tmp_path / "metrics.jsonl"
  records = [dict(step=s, time=0.0, loss=1.0 / s) for s in (1, 2, 3)]
  text = "".join(json.dumps(r) + "\n" for r in records)
  path.write_text(text + '{"step": 4, "lo')  # killed mid-write
  assert read_metrics(str(tmp_path)) == records
  summary.MetricsWriter(str(tmp_path), resume_step=2).close()  # resumed from checkpoint 2
  assert path.read_text() == "".join(json.dumps(r) + "\n" for r in records[:2])
  path.write_text(text.replace('"step": 2', '"step": 2 oops'))
  with pytest.raises(ValueError, match=r"metrics.jsonl:2: not a JSON record"):
    read_metrics(str(tmp_path))


@pytest.mark.parametrize(
  "field, value, expected",
  [
    ("beam_stop", "never", "config.beam_stop='never' must be one of exact, heuristic"),
    ("bleu_beam_size", -1, "config.bleu_beam_size=-1 must be >= 0"),
    ("bleu_every_steps", -2, "config.bleu_every_steps=-2 must be >= 0"),
  ],
)
def test_decoding_settings_are_checked_before_training(field, value, expected):
  config = small_config()
  config[field] = value
  with pytest.raises(train.ConfigError, match=re.escape(expected)):
    checks.check(config)


# --- 10. a checkpoint missing an item its save wrote --------------------------------------

FINGERPRINT_SAVED = {"vocab_sha256": "ab" * 32, "config": {"seed": 0}}


def _two_checkpoints(workdir: str, data: bool = True):
  """Checkpoints 1 and 2 of the small model, saved as the trainer saves them (data position
  and fingerprint) or, with data=False, as an averaged workdir's (no data item)."""
  _, state = support.small_state()
  ckpts = checkpoint.Checkpoints(workdir, owner=True)
  for step in (1, 2):
    ckpts.save(step, state, {"position": step} if data else None, FINGERPRINT_SAVED)
  ckpts.wait()
  ckpts.close()
  return state


@pytest.mark.parametrize("item", [checkpoint.DATA, checkpoint.FINGERPRINT])
def test_a_checkpoint_missing_an_item_its_save_wrote_is_damaged_kept_and_skipped(
  item, tmp_path, caplog
):
  caplog.set_level("INFO")
  workdir = str(tmp_path / "w")
  state = _two_checkpoints(workdir)
  step_dir = os.path.join(workdir, "checkpoints", "2")
  shutil.rmtree(os.path.join(step_dir, item))
  ckpts = checkpoint.Checkpoints(workdir, owner=True)
  assert ckpts.steps() == [1]  # neither resumed from nor counted among the kept ones
  why = f"step 2 at {step_dir}: no {item} item ({step_dir}/{item} is missing"
  assert len(ckpts.damaged()) == 1 and ckpts.damaged()[0].startswith(why)
  checked = []
  _, data_state, step = ckpts.restore_newest(state, lambda s, saved: checked.append((s, saved)))
  assert (step, data_state, checked) == (1, {"position": 1}, [(1, FINGERPRINT_SAVED)])
  assert why in caplog.text and "left in place and skipped" in caplog.text
  assert os.path.isdir(step_dir) and os.listdir(step_dir)  # kept as it was
  shutil.rmtree(os.path.join(workdir, "checkpoints", "1", item))
  with pytest.raises(checkpoint.CheckpointDamagedError, match=f"no {item} item") as e:
    checkpoint.Checkpoints(workdir, owner=True).restore_newest(state, lambda *a: None)
  assert f"step 1 at {workdir}/checkpoints/1" in str(e.value) and why in str(e.value)


def test_a_checkpoint_saved_without_data_is_intact_and_readers_create_nothing(tmp_path):
  workdir = str(tmp_path / "w")
  state = _two_checkpoints(workdir, data=False)  # as t2t-average writes one
  ckpts = checkpoint.Checkpoints(workdir)
  assert ckpts.steps() == [1, 2] and ckpts.damaged() == []
  _, data_state, step = ckpts.restore_newest(state, lambda *a: None)
  assert (step, data_state) == (2, None)
  typo = tmp_path / "typo"
  assert checkpoint.Checkpoints(str(typo)).steps() == [] and not typo.exists()


# --- 11. a fresh start in a used workdir ----------------------------------------------------


def _contents(root) -> dict[str, bytes]:
  root = str(root)
  return {
    os.path.relpath(os.path.join(d, n), root): pathlib.Path(d, n).read_bytes()
    for d, _, names in os.walk(root)
    for n in names
  }


def test_a_fresh_start_sets_the_earlier_runs_logs_aside_and_deletes_nothing(tmp_path, caplog):
  workdir = Workdir(str(tmp_path))
  workdir.write_start(small_config())
  earlier = summary.MetricsWriter(str(tmp_path))
  for step in (1, 2, 3):
    earlier.write(step, dict(loss=4.0 - step))
  earlier.close()
  workdir.write_selection({"checkpoint": "latest"})
  workdir.write_best({"metric": "eval_loss", "history": [[3, 1.0]], "best": [{"step": 3}]})
  (tmp_path / "test.de").write_text("ein Test\n")
  logs = {n: v for n, v in _contents(tmp_path).items() if n != "starts.jsonl"}
  starts = (tmp_path / "starts.jsonl").read_text()

  fresh = summary.MetricsWriter(str(tmp_path), resume_step=0)  # no checkpoint to resume from
  fresh.write(1, dict(loss=9.0))
  fresh.close()
  (aside,) = [n for n in os.listdir(tmp_path) if n.startswith("before-")]
  assert _contents(tmp_path / aside) == logs  # every byte of the earlier run, config included
  assert [(r["step"], r["loss"]) for r in read_metrics(str(tmp_path))] == [(1, 9.0)]
  assert os.listdir(tmp_path / "tensorboard") and not (tmp_path / "selected.json").exists()
  assert (tmp_path / "config.json").exists() and (tmp_path / "starts.jsonl").read_text() == starts
  assert not (tmp_path / "best.json").exists()
  moved = "best.json, metrics.jsonl, selected.json, tensorboard, test.de"
  assert f"moved {moved} to {tmp_path}/{aside}" in (caplog.text)
  # A second fresh start keeps the first one's aside as it was, beside its own.
  kept = _contents(tmp_path / aside)
  summary.MetricsWriter(str(tmp_path), resume_step=0).close()
  asides = sorted(n for n in os.listdir(tmp_path) if n.startswith("before-"))
  assert len(asides) == 2 and _contents(tmp_path / aside) == kept
  # A resume sets nothing aside.
  summary.MetricsWriter(str(tmp_path), resume_step=4).close()
  assert sorted(n for n in os.listdir(tmp_path) if n.startswith("before-")) == asides


@pytest.mark.slow
def test_training_from_scratch_in_a_used_workdir_keeps_the_earlier_metrics(trained, tmp_path):
  workdir = _copy(trained, tmp_path)
  before = open(os.path.join(workdir, "metrics.jsonl"), "rb").read()
  ckpt = os.path.join(workdir, "checkpoints")
  os.rename(ckpt, f"{tmp_path}/damaged_checkpoints")  # as CheckpointDamagedError advises
  out = train.train_and_evaluate(_six_steps(), workdir)
  assert out["step"] == 6
  (aside,) = [n for n in os.listdir(workdir) if n.startswith("before-")]
  assert open(os.path.join(workdir, aside, "metrics.jsonl"), "rb").read() == before
  steps = [r["step"] for r in read_metrics(workdir) if "loss" in r]
  assert steps == [1, 2, 3, 4, 5, 6]  # the new run's, each once


@pytest.mark.slow
def test_resume_skips_a_checkpoint_without_its_data_item_and_ends_the_same(
  trained, tmp_path, caplog
):
  caplog.set_level("INFO")
  workdir = _copy(trained, tmp_path)
  ckpt = os.path.join(workdir, "checkpoints")
  shutil.rmtree(os.path.join(ckpt, "6", checkpoint.DATA))
  reference = checkpoint.Checkpoints(trained).restore_params(6)
  train.train_and_evaluate(_six_steps(), workdir)
  assert f"step 6 at {ckpt}/6: no data item" in caplog.text and f"{ckpt}/4" in caplog.text
  assert os.path.isdir(f"{ckpt}/6.damaged")  # set aside when step 6 was saved anew
  redone = checkpoint.Checkpoints(workdir).restore_params(6)  # the data order was kept
  for x, y in zip(jax.tree.leaves(reference), jax.tree.leaves(redone), strict=True):
    np.testing.assert_array_equal(x, y)
