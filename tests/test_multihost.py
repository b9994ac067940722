"""Two processes on this machine against one: multi-host pmap training, data shards, failures.

Each worker process has 4 simulated CPU devices and joins the other through
t2t_jax.training.distributed (jax.distributed on localhost, gloo collectives): 2 processes x 4
devices must give what this test process (8 devices, tests/conftest.py) gives on the same
global batch. The workers are this file run as `python -m tests.test_multihost MODE ...`.
"""

import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from t2t_jax.training import distributed
from tests import support

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOCAL_DEVICES = 4
HEARTBEAT_S = {
  "step": 60,
  "hang": 5,
  "raise": 5,
  "resume": 60,
}  # short where a failure is to be seen


# ----------------------------------------------------------------------------- shared set-up


@functools.cache
def _model_and_state():
  from tests import support

  model, state = support.small_state(dropout_rate=0.1)
  return model, state, model.config


def _global_batch(rows=32, length=8):
  """[8 devices, rows / 8, length]: device d's rows are rows[d * rows / 8 : ...]."""
  rng = np.random.default_rng(0)
  batch = {}
  for key in ("inputs", "targets"):
    x = rng.integers(4, 40, size=(rows, length)).astype(np.int32)
    for r in range(rows):  # ragged lengths, so the global token count matters
      x[r, rng.integers(2, length) :] = 0
    batch[key] = x.reshape(8, rows // 8, length)
  return batch


def _data_config():
  from t2t_jax import data

  c = data.default_config()
  c.update(
    source="synthetic",
    task="copy",
    synthetic_num_symbols=16,
    synthetic_min_len=6,
    synthetic_max_len=10,
    synthetic_train_size=240,
    synthetic_eval_size=16,
    max_len=16,
    bucket_boundaries=(8, 16),
    tokens_per_batch=512,
    prefetch_batches=0,
    wait_for_process0_s=120.0,
  )
  return c


def _train_step(local_batch):
  """One pmapped step (dropout on) on this process's devices; (host params, host metrics)."""
  from t2t_jax.training import (
    optim,
    parallel,
  )

  model, state, cfg = _model_and_state()
  step = parallel.pmap_train_step(model, 0.1, optim.optimizer_schedule(cfg.d_model, 4))
  new_state, metrics = step(parallel.replicate(state), parallel.shard(local_batch))
  evals = parallel.pmap_eval_step(model, 0.1)(new_state.params, parallel.shard(local_batch))
  return (
    parallel.unreplicate(new_state.params),
    parallel.host_metrics(metrics),
    parallel.host_metrics(evals),
  )


def _flat(tree):
  import jax

  return {
    jax.tree_util.keystr(p): np.asarray(v) for p, v in jax.tree_util.tree_flatten_with_path(tree)[0]
  }


def _checksum(params):
  import jax

  return float(sum(np.sum(np.asarray(x, np.float64)) for x in jax.tree.leaves(params)))


def _read_epoch(datasets, num_steps):
  it = datasets.train_iter()
  batches = [next(it) for _ in range(num_steps)]
  it.close()
  return batches


# ----------------------------------------------------------------------------- worker side


def _worker(mode, process_id, num_processes, coordinator, out_dir):
  plan = distributed.resolve("auto", coordinator, num_processes, process_id, "", environ={})
  plan = distributed.initialize(
    plan, init_timeout_s=120, heartbeat_timeout_s=HEARTBEAT_S[mode], shutdown_timeout_s=60
  )
  import jax

  from t2t_jax.training import parallel

  assert jax.process_count() == num_processes and jax.device_count() == 8
  mine = slice(process_id * LOCAL_DEVICES, (process_id + 1) * LOCAL_DEVICES)
  if mode == "step":
    params, metrics, evals = _train_step({k: v[mine] for k, v in _global_batch().items()})
    from t2t_jax import data

    datasets = data.get_datasets(
      _data_config(),
      os.path.join(out_dir, "data"),
      process_index=process_id,
      process_count=num_processes,
      num_local_devices=LOCAL_DEVICES,
    )
    batches = _read_epoch(datasets, datasets.bucket_plan.steps_before(1))
    arrays = {f"param{k}": v for k, v in _flat(params).items()}
    arrays.update({f"batch{i}_{k}": v for i, b in enumerate(batches) for k, v in b.items()})
    np.savez(os.path.join(out_dir, f"worker{process_id}.npz"), **arrays)
    with open(os.path.join(out_dir, f"worker{process_id}.json"), "w") as f:
      json.dump(dict(metrics=metrics, evals=evals, steps=len(batches)), f)
    return
  if mode == "resume":  # each process resumes from its own copy of one workdir
    from t2t_jax.run import checkpoint
    from t2t_jax.training import trainer

    ckpts = checkpoint.Checkpoints(os.path.join(out_dir, f"w{process_id}"), owner=True)
    state, _, step = trainer._resume(ckpts, _model_and_state()[1], None, {})
    with open(os.path.join(out_dir, f"worker{process_id}.json"), "w") as f:
      json.dump(dict(step=step, state_step=int(state.step), params=_checksum(state.params)), f)
    return
  # "hang" / "raise": keep running cross-process collectives until the test intervenes.
  psum = jax.pmap(lambda x: jax.lax.psum(x, "batch"), axis_name="batch")
  x = np.ones((LOCAL_DEVICES,), np.float32)
  with distributed.fail_fast(plan):
    for i in range(10**9):
      total = float(parallel.unreplicate(psum(x)))
      assert total == 8.0
      if i == 20:
        open(os.path.join(out_dir, f"ready{process_id}"), "w").close()
        print(f"process {process_id}: collectives running", flush=True)
      if mode == "raise" and process_id == 1 and os.path.exists(os.path.join(out_dir, "go")):
        raise RuntimeError("injected failure on process 1")


# ----------------------------------------------------------------------------- test side


def _free_port():
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _launch(mode, out_dir, num_processes=2):
  env = support.cpu_env(devices=LOCAL_DEVICES, PYTHONUNBUFFERED="1")
  for key in [k for k in env if k.startswith(("SLURM_", "TPU_", "JAX_COORDINATOR"))]:
    del env[key]
  coordinator = f"localhost:{_free_port()}"
  procs = []
  for i in range(num_processes):
    log = open(os.path.join(out_dir, f"log{i}.txt"), "w")
    procs.append(
      subprocess.Popen(
        [
          sys.executable,
          "-m",
          "tests.test_multihost",
          mode,
          str(i),
          str(num_processes),
          coordinator,
          out_dir,
        ],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
      )
    )
    log.close()
  return procs


def _log(out_dir, i):
  with open(os.path.join(out_dir, f"log{i}.txt"), errors="replace") as f:
    return f.read()


def _wait(procs, out_dir, timeout):
  deadline = time.time() + timeout
  for p in procs:
    try:
      p.wait(timeout=max(1.0, deadline - time.time()))
    except subprocess.TimeoutExpired:
      for q in procs:
        q.kill()
      pytest.fail(
        f"workers still running after {timeout}s:\n"
        + "\n".join(_log(out_dir, i)[-3000:] for i in range(len(procs)))
      )
  return [p.returncode for p in procs]


def _wait_for_files(paths, procs, out_dir, timeout=240):
  deadline = time.time() + timeout
  while not all(os.path.exists(p) for p in paths):
    if any(p.poll() is not None for p in procs) or time.time() > deadline:
      for q in procs:
        q.kill()
      pytest.fail(
        "workers did not start their collectives:\n"
        + "\n".join(_log(out_dir, i)[-3000:] for i in range(len(procs)))
      )
    time.sleep(0.2)


@pytest.mark.slow
def test_two_processes_equal_one_process_and_read_disjoint_halves(tmp_path):
  import jax

  from t2t_jax import data

  assert jax.local_device_count() == 8, "tests run with 8 simulated CPU devices (conftest)"
  out = str(tmp_path)
  # One process, 8 devices: writes the (synthetic) vocabulary the workers then share.
  reference = data.get_datasets(
    _data_config(), os.path.join(out, "data"), process_index=0, process_count=1, num_local_devices=8
  )
  procs = _launch("step", out)
  params1, metrics1, evals1 = _train_step(_global_batch())
  initial = _flat(_model_and_state()[1].params)
  assert max(float(np.max(np.abs(v - initial[k]))) for k, v in _flat(params1).items()) > 1e-4
  num_steps = reference.bucket_plan.steps_before(1)
  global_batches = _read_epoch(reference, num_steps)
  codes = _wait(procs, out, timeout=300)
  assert codes == [0, 0], "\n".join(_log(out, i)[-3000:] for i in range(2))

  # The same update: parameters, loss and token count; dev statistics summed over hosts.
  for i in range(2):
    with open(os.path.join(out, f"worker{i}.json")) as f:
      report = json.load(f)
    for key in ("loss", "denominator", "grad_norm"):
      np.testing.assert_allclose(report["metrics"][key], metrics1[key], rtol=1e-5)
    for key in ("loss", "nll", "correct", "denominator"):
      np.testing.assert_allclose(report["evals"][key], evals1[key], rtol=1e-5)
    assert report["steps"] == num_steps
    got = np.load(os.path.join(out, f"worker{i}.npz"))
    for name, value in _flat(params1).items():
      np.testing.assert_allclose(
        got[f"param{name}"], value, atol=1e-5, rtol=1e-5, err_msg=f"process {i}: {name}"
      )

  # Data: each step's global batch is process 0's devices then process 1's; over an epoch
  # the two processes read disjoint halves that together are every pair the epoch holds.
  workers = [np.load(os.path.join(out, f"worker{i}.npz")) for i in range(2)]
  seen = [set(), set()]
  for step, expected in enumerate(global_batches):
    for key in ("inputs", "targets"):
      halves = [w[f"batch{step}_{key}"] for w in workers]
      assert all(h.shape[0] == LOCAL_DEVICES for h in halves)
      np.testing.assert_array_equal(np.concatenate(halves), expected[key])
    for i, w in enumerate(workers):
      rows = zip(
        w[f"batch{step}_inputs"].reshape(-1, w[f"batch{step}_inputs"].shape[-1]),
        w[f"batch{step}_targets"].reshape(-1, w[f"batch{step}_targets"].shape[-1]),
      )
      for src, tgt in rows:
        if src.any():
          pair = (tuple(src[src > 0]), tuple(tgt[tgt > 0]))
          assert pair not in seen[i], "a pair read twice within one epoch"
          seen[i].add(pair)
  assert not seen[0] & seen[1], "the two processes read the same pair"
  assert len(seen[0]) == len(seen[1])
  plan = reference.bucket_plan
  in_full_batches = int(np.sum(plan.counts - plan.counts % plan.global_rows))
  all_pairs = {
    (
      tuple(reference.train_pairs.pair(i)["inputs"]),
      tuple(reference.train_pairs.pair(i)["targets"]),
    )
    for i in range(len(reference.train_pairs))
  }
  assert len(seen[0] | seen[1]) == in_full_batches and seen[0] | seen[1] <= all_pairs
  assert in_full_batches >= 0.8 * len(all_pairs)


@pytest.mark.slow
@pytest.mark.parametrize("failure", ["kill", "raise"])
def test_one_process_failing_stops_the_other(tmp_path, failure):
  out = str(tmp_path)
  procs = _launch("hang" if failure == "kill" else "raise", out)
  _wait_for_files([os.path.join(out, f"ready{i}") for i in range(2)], procs, out)
  start = time.time()
  if failure == "kill":
    procs[1].send_signal(signal.SIGKILL)
  else:
    open(os.path.join(out, "go"), "w").close()
  codes = _wait(procs, out, timeout=90)
  elapsed = time.time() - start
  survivor = _log(out, 0)
  assert codes[0] != 0 and elapsed < 60, (codes, elapsed, survivor[-3000:])
  # The survivor stops by whichever comes first: JAX's service noticing the missing
  # heartbeats, or its own collective failing (Gloo's connection reset) and fail_fast.
  stopped_by = (
    "Terminating process because the JAX distributed service detected fatal errors",
    "exiting now so that the other processes stop too",
  )
  assert any(line in survivor for line in stopped_by), survivor[-3000:]
  if failure == "kill":
    assert codes[1] == -signal.SIGKILL, codes
  if failure == "raise":
    failed = _log(out, 1)
    assert codes[1] == 1, failed[-3000:]
    assert "injected failure on process 1" in failed
    assert "process 1 of 2 failed (traceback above); exiting now" in failed


@pytest.mark.slow
def test_processes_resume_from_the_newest_step_every_one_can_read(tmp_path):
  """Process 1 cannot read step 6 (its copy's arrays are cut short): both resume from 4."""
  import jax

  from t2t_jax.run import checkpoint

  out = str(tmp_path)
  state = _model_and_state()[1]
  writer = checkpoint.Checkpoints(os.path.join(out, "w"), owner=True)
  sums = {}
  for step in (2, 4, 6):
    saved = state.replace(
      step=np.int32(step), params=jax.tree.map(lambda x, k=step: x * k, state.params)
    )
    writer.save(step, saved, None)
    writer.wait()
    sums[step] = _checksum(saved.params)
  writer.close()
  for i in range(2):
    shutil.copytree(os.path.join(out, "w"), os.path.join(out, f"w{i}"))
  damaged = os.path.join(out, "w1", "checkpoints", "6", "state", "ocdbt.process_0", "d")
  for name in os.listdir(damaged):
    with open(os.path.join(damaged, name), "r+b") as f:
      f.truncate(10)
  procs = _launch("resume", out)
  codes = _wait(procs, out, timeout=300)
  logs = [_log(out, i) for i in range(2)]
  assert codes == [0, 0], "\n".join(log[-3000:] for log in logs)
  for i in range(2):
    with open(os.path.join(out, f"worker{i}.json")) as f:
      report = json.load(f)
    assert (report["step"], report["state_step"]) == (4, 4), (i, report, logs[i][-3000:])
    np.testing.assert_allclose(report["params"], sums[4], rtol=1e-6)
  assert "checkpoint step 6 at" in logs[1] and "does not restore" in logs[1]
  assert "step(s) [6] in" in logs[0] and "not on every one" in logs[0]


@pytest.mark.slow
def test_initialization_gives_up_with_a_clear_message(tmp_path):
  """Process 0 of 2 alone: exit 1 after --distributed_init_timeout_s, naming the address."""
  env = support.cpu_env()
  code = (
    "from t2t_jax.training import distributed as d\n"
    f"p = d.resolve('auto', 'localhost:{_free_port()}', 2, 0, '', environ={{}})\n"
    "d.initialize(p, init_timeout_s=3)\n"
  )
  start = time.time()
  proc = subprocess.run(
    [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
  )
  assert proc.returncode == 1, proc.stderr[-3000:]
  assert time.time() - start < 60
  assert (
    "process 0 of 2 gave up after 3s waiting for all processes to join the "
    "coordinator at localhost:" in proc.stderr
  )


def test_t2t_train_rejects_an_incomplete_multi_process_setup(tmp_path):
  env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "JAX_COORD"))}
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "t2t_jax.cli.train",
      f"--workdir={tmp_path}",
      "--num_processes=2",
      "--process_id=1",
    ],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert proc.returncode != 0
  assert "--num_processes=2 needs --coordinator_address=HOST:PORT" in proc.stderr


def test_resolve_single_explicit_slurm_and_errors(monkeypatch):
  import jax

  def must_not_be_called(*args, **kwargs):
    raise AssertionError("jax.distributed.initialize called for a single process")

  monkeypatch.setattr(jax.distributed, "initialize", must_not_be_called)
  single = distributed.resolve(environ={}, tpu_process_count=lambda e: 1)
  assert not single.multi_process and distributed.initialize(single) is single
  assert not distributed.resolve("off", "h:1", 4, 0, environ={}).multi_process
  assert not distributed.resolve(num_processes=1, environ={}).multi_process
  plan = distributed.resolve(
    environ={
      "JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234",
      "JAX_NUM_PROCESSES": "4",
      "JAX_PROCESS_ID": "3",
    }
  )
  assert (plan.source, plan.coordinator_address, plan.num_processes, plan.process_id) == (
    "flags",
    "10.0.0.1:1234",
    4,
    3,
  )
  slurm = {
    "SLURM_JOB_ID": "4097",
    "SLURM_PROCID": "5",
    "SLURM_STEP_NUM_TASKS": "8",
    "SLURM_STEP_NODELIST": "gpu[07-08,11]",
    "SLURM_NODEID": "1",
    "SLURM_LOCALID": "1",
    "SLURM_STEP_TASKS_PER_NODE": "4(x2)",
  }
  plan = distributed.resolve(environ=slurm)
  assert (
    plan.source,
    plan.coordinator_address,
    plan.num_processes,
    plan.process_id,
    plan.local_device_ids,
  ) == ("slurm", "gpu07:61441", 8, 5, (1,))
  # One task per node: every GPU of the node; explicit coordinator and count are kept.
  plan = distributed.resolve(
    coordinator_address="head:9999",
    num_processes=2,
    environ=dict(
      slurm, SLURM_STEP_NUM_TASKS="2", SLURM_PROCID="1", SLURM_STEP_TASKS_PER_NODE="1(x2)"
    ),
  )
  assert (plan.coordinator_address, plan.num_processes, plan.process_id, plan.local_device_ids) == (
    "head:9999",
    2,
    1,
    None,
  )
  # Slurm bound one GPU per task already: no further restriction.
  assert distributed.resolve(environ=dict(slurm, CUDA_VISIBLE_DEVICES="1")).local_device_ids is None
  # The batch script itself (no srun step) is one process.
  assert not distributed.resolve(
    environ={"SLURM_JOB_ID": "1", "SLURM_PROCID": "0", "SLURM_NTASKS": "8"},
    tpu_process_count=lambda e: 1,
  ).multi_process
  tpu = distributed.resolve(environ={"TPU_WORKER_HOSTNAMES": "w0,w1,w2,w3"})
  assert tpu.source == "tpu" and tpu.num_processes is None
  assert distributed.expand_hostlist("a[1-3],b,c[08-10]x") == [
    "a1",
    "a2",
    "a3",
    "b",
    "c08x",
    "c09x",
    "c10x",
  ]
  for kwargs, match in [
    (dict(num_processes=2, process_id=0), "needs --coordinator_address"),
    (dict(coordinator_address="h:1", num_processes=2), "needs --process_id"),
    (dict(coordinator_address="h:1", num_processes=2, process_id=2), r"must be in \[0, "),
    (dict(coordinator_address="h", num_processes=2, process_id=1), "must be HOST:PORT"),
    (dict(coordinator_address="h:1"), "without --num_processes"),
  ]:
    with pytest.raises(distributed.DistributedSetupError, match=match):
      distributed.resolve(environ={}, tpu_process_count=lambda e: 1, **kwargs)


def test_tpu_worker_count_from_environment_and_metadata(monkeypatch):
  import urllib.error

  count = distributed.tpu_process_count_from_environment

  def metadata(**answers):
    def read(key):
      answer = answers.get(key.replace("-", "_"), http(404))  # as the server: unset is 404
      if isinstance(answer, Exception):
        raise answer
      return answer

    return read

  def unasked(key):
    raise AssertionError(f"metadata {key} asked for")

  def http(code):
    return urllib.error.HTTPError("http://metadata/", code, "", {}, None)

  assert count({"TPU_WORKER_HOSTNAMES": "w0,w1,w2,w3"}, unasked) == 4
  assert count({"TPU_PROCESS_ADDRESSES": "a:1,b:1", "MEGASCALE_NUM_SLICES": "3"}, unasked) == 6
  monkeypatch.setattr(distributed, "libtpu_installed", lambda env: False)
  assert count({}, unasked) == 1  # no libtpu: not a TPU VM, and no network call
  monkeypatch.setattr(distributed, "libtpu_installed", lambda env: True)
  assert count({"TPU_SKIP_MDS_QUERY": "1"}, unasked) == 1  # jax found no TPU chips
  endpoints = "w-0:0:10.0.0.2,w-1:1:10.0.0.3"  # the older name:id:ip form
  assert count({}, metadata(worker_network_endpoints=endpoints)) == 2
  assert count({}, metadata(worker_network_endpoints="h0", tpu_env="ZONE: 'x'")) == 1
  two_slices = "ACCELERATOR_TYPE: 'v5e-8'\nMEGASCALE_NUM_SLICES: '2'\n"
  assert count({}, metadata(worker_network_endpoints="h0", tpu_env=two_slices)) == 2
  assert count({"MEGASCALE_NUM_SLICES": "3"}, metadata(worker_network_endpoints="h0,h1")) == 6
  assert count({}, metadata(worker_network_endpoints=http(404))) == 1  # GCE, but no TPU VM
  no_server = urllib.error.URLError("Name or service not known")
  assert count({}, metadata(worker_network_endpoints=no_server)) == 1
  assert count({}, metadata(worker_network_endpoints=http(503))) == 0  # unknown: JAX decides
  assert count({}, metadata(worker_network_endpoints=TimeoutError("read"))) == 0
  assert count({}, metadata(worker_network_endpoints="")) == 0
  plan = distributed.resolve(
    environ={}, tpu_process_count=lambda e: count(e, metadata(worker_network_endpoints="a,b"))
  )
  assert (plan.source, plan.num_processes, plan.reason) == (
    "tpu",
    None,
    "Cloud TPU slice of 2 workers",
  )


def test_tpu_worker_count_asks_the_metadata_server_the_way_gce_answers(monkeypatch):
  import http.server
  import threading

  asked = []

  class Metadata(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
      asked.append((self.path, self.headers.get("Metadata-Flavor")))
      key = self.path.rsplit("/", 1)[-1]
      if self.headers.get("Metadata-Flavor") == "Google" and key == "worker-network-endpoints":
        body = b"t-w-0,t-w-1,t-w-2"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
      else:
        self.send_error(404)

    def log_message(self, *args):
      pass

  server = http.server.HTTPServer(("127.0.0.1", 0), Metadata)
  threading.Thread(target=server.serve_forever, daemon=True).start()
  monkeypatch.setattr(distributed, "libtpu_installed", lambda env: True)
  try:
    env = {"GCE_METADATA_IP": f"127.0.0.1:{server.server_port}"}
    assert distributed.tpu_process_count_from_environment(env) == 3
    prefix = "/computeMetadata/v1/instance/attributes/"
    assert asked == [
      (prefix + "worker-network-endpoints", "Google"),
      (prefix + "tpu-env", "Google"),
    ]
  finally:
    server.shutdown()
    server.server_close()
  # Nothing listening: not on GCE, so one process.
  env = {"GCE_METADATA_IP": f"127.0.0.1:{server.server_port}"}
  assert distributed.tpu_process_count_from_environment(env) == 1


if __name__ == "__main__":
  _worker(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
