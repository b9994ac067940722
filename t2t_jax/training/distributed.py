"""Several processes, one training run: when and how to call `jax.distributed.initialize`.

Every process (one per TPU VM worker, one per GPU node, or one per GPU) runs the same
`t2t-train` command. Before anything touches the devices, `setup()` decides from flags and
the environment whether this run has several processes and joins them:

- `--coordinator_address=HOST:PORT --num_processes=N --process_id=I` (or the environment
  variables JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID): explicit; pieces
  left out are filled in from Slurm when inside an `srun` step.
- Slurm: an `srun` step of N > 1 tasks (SLURM_STEP_NUM_TASKS, SLURM_PROCID); the coordinator
  is the step's first node, port JAX_COORDINATOR_PORT or one derived from the job id.
- Cloud TPU pod slices (several TPU VM workers): JAX detects the workers itself.
- Anything else, or `--num_processes=1`, or `--distributed=off`: one process, and
  `jax.distributed.initialize` is not called.

Failure handling, so that one host failing stops the others instead of leaving them waiting:
joining has a deadline (`--distributed_init_timeout_s`; a missing process is named as the
likely cause); the JAX distributed service's heartbeats (`--heartbeat_timeout_s`) make every
process abort, with JAX's message "Terminating process because the JAX distributed service
detected fatal errors ... another task died", when one process dies, which also ends
collectives blocked on the dead process; and `fail_fast()` makes a process whose training
raised exit at once (without the shutdown barrier, where it would otherwise wait up to
`--shutdown_timeout_s` while the others sit in a collective).
"""

import contextlib
import dataclasses
import functools
import importlib.util
import inspect
import os
import re
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping

from absl import flags, logging

MODES = ("auto", "off")
ENV_COORDINATOR = "JAX_COORDINATOR_ADDRESS"  # also read by jax itself
ENV_NUM_PROCESSES = "JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "JAX_PROCESS_ID"
ENV_LOCAL_DEVICE_IDS = "JAX_LOCAL_DEVICE_IDS"  # also read by jax itself
ENV_COORDINATOR_PORT = "JAX_COORDINATOR_PORT"  # Slurm: port on the first node


class DistributedSetupError(ValueError):
  """The flags/environment describe an impossible multi-process run."""


class DistributedInitError(RuntimeError):
  """jax.distributed.initialize raised (e.g. it was called after the backend started)."""


@dataclasses.dataclass(frozen=True)
class Plan:
  """How this process joins the run. `source`: 'single', 'flags', 'slurm' or 'tpu'."""

  source: str
  coordinator_address: str | None = None
  num_processes: int | None = None
  process_id: int | None = None
  local_device_ids: tuple[int, ...] | None = None
  reason: str = ""

  @property
  def multi_process(self) -> bool:
    return self.source != "single"

  def describe(self) -> str:
    if not self.multi_process:
      return f"one process ({self.reason})"
    who = (
      "a TPU worker (index and count from the slice)"
      if self.num_processes is None
      else f"process {self.process_id} of {self.num_processes}"
    )
    where = self.coordinator_address or "auto-detected coordinator"
    devices = (
      "all visible local devices"
      if self.local_device_ids is None
      else f"local devices {list(self.local_device_ids)}"
    )
    return f"{who} via {self.source} ({self.reason}), coordinator {where}, {devices}"


# ----------------------------------------------------------------------------- flags


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """The multi-process flags of t2t-train (empty / -1 = from the environment or auto)."""
  flags.DEFINE_enum(
    "distributed",
    "auto",
    MODES,
    "auto: join several processes when flags, Slurm or a TPU pod slice say "
    "so; off: always one process",
    flag_values=flag_values,
  )
  flags.DEFINE_string(
    "coordinator_address",
    "",
    f"HOST:PORT of process 0, reachable from every process (env "
    f"{ENV_COORDINATOR}; Slurm: first node of the step)",
    flag_values=flag_values,
  )
  flags.DEFINE_integer(
    "num_processes",
    0,
    f"processes in the run, 0 = auto (env {ENV_NUM_PROCESSES}; Slurm: "
    "tasks of the srun step; TPU: workers of the slice)",
    flag_values=flag_values,
  )
  flags.DEFINE_integer(
    "process_id",
    -1,
    f"this process's index in [0, num_processes), -1 = auto (env "
    f"{ENV_PROCESS_ID}; Slurm: SLURM_PROCID)",
    flag_values=flag_values,
  )
  flags.DEFINE_string(
    "local_device_ids",
    "",
    "comma-separated accelerator ids this process uses ('' = all visible; "
    "Slurm with several tasks per node: the task's SLURM_LOCALID)",
    flag_values=flag_values,
  )
  flags.DEFINE_integer(
    "distributed_init_timeout_s",
    300,
    "give up (exit 1, naming the coordinator) when not every process has "
    "joined within this many seconds",
    flag_values=flag_values,
  )
  flags.DEFINE_integer(
    "heartbeat_timeout_s",
    100,
    "a process silent this long counts as dead and every process aborts",
    flag_values=flag_values,
  )
  flags.DEFINE_integer(
    "shutdown_timeout_s",
    1800,
    "how long a finished process waits for the others at exit (process 0 "
    "alone translates the test split at the end)",
    flag_values=flag_values,
  )
  flags.DEFINE_bool(
    "log_all_processes",
    False,
    "INFO logs from every process (default: process 0 only; the others log warnings and errors)",
    flag_values=flag_values,
  )


def setup(
  flag_values: flags.FlagValues = flags.FLAGS, environ: Mapping[str, str] | None = None
) -> Plan:
  """Resolves the plan from flags and environment, joins the other processes if any, and
  quiets INFO logs on processes other than 0. Call before anything touches the devices."""
  f = flag_values
  plan = resolve(
    f.distributed,
    f.coordinator_address,
    f.num_processes,
    f.process_id,
    f.local_device_ids,
    os.environ if environ is None else environ,
  )
  plan = initialize(
    plan,
    init_timeout_s=f.distributed_init_timeout_s,
    heartbeat_timeout_s=f.heartbeat_timeout_s,
    shutdown_timeout_s=f.shutdown_timeout_s,
  )
  if plan.multi_process and plan.process_id != 0 and not f.log_all_processes:
    logging.set_verbosity(logging.WARNING)
  return plan


# ----------------------------------------------------------------------------- resolution


def resolve(
  mode: str = "auto",
  coordinator_address: str = "",
  num_processes: int = 0,
  process_id: int = -1,
  local_device_ids: str = "",
  environ: Mapping[str, str] | None = None,
  tpu_process_count: Callable[[Mapping[str, str]], int] | None = None,
) -> Plan:
  """Decides how this process joins the run (pure: reads only `environ` and, on a Cloud TPU
  VM, the TPU metadata through `tpu_process_count`). Raises DistributedSetupError."""
  env = os.environ if environ is None else environ
  if mode not in MODES:
    raise DistributedSetupError(f"--distributed={mode!r} must be one of {MODES}")
  if mode == "off":
    return Plan("single", reason="--distributed=off")
  coordinator = coordinator_address or env.get(ENV_COORDINATOR, "") or None
  num = num_processes or _env_int(env, ENV_NUM_PROCESSES, "--num_processes") or None
  pid = process_id if process_id >= 0 else _env_int(env, ENV_PROCESS_ID, "--process_id")
  local = _parse_ids(local_device_ids or env.get(ENV_LOCAL_DEVICE_IDS, ""))
  slurm = slurm_plan(env)
  if num is None and slurm is not None:
    num = slurm.num_processes
  if num is None:
    count = (tpu_process_count or tpu_process_count_from_environment)(env)
    if count != 1:  # several TPU VM workers, or unknown (0): let JAX detect them
      return Plan(
        "tpu",
        coordinator,
        None,
        pid,
        local,
        reason=(
          f"Cloud TPU slice of {count} workers"
          if count > 1
          else "Cloud TPU VM, worker count not readable: JAX detects it"
        ),
      )
    if coordinator is not None or pid is not None:
      raise DistributedSetupError(
        "--coordinator_address/--process_id given without --num_processes (or "
        f"{ENV_NUM_PROCESSES}): say how many processes the run has"
      )
    return Plan("single", reason="no coordinator, Slurm step or TPU slice")
  if num < 1:
    raise DistributedSetupError(f"--num_processes={num} must be >= 1")
  if num == 1:
    if pid not in (None, 0):
      raise DistributedSetupError(f"--process_id={pid} with a single process (must be 0)")
    return Plan("single", reason="num_processes=1")
  used_slurm = False
  if pid is None and slurm is not None:
    pid, used_slurm = slurm.process_id, True
  if coordinator is None and slurm is not None:
    coordinator, used_slurm = slurm.coordinator_address, True
  if local is None and slurm is not None and used_slurm:
    local = slurm.local_device_ids
  if pid is None:
    raise DistributedSetupError(
      f"--num_processes={num} needs --process_id (or "
      f"{ENV_PROCESS_ID}): this process's index in [0, {num})"
    )
  if not 0 <= pid < num:
    raise DistributedSetupError(f"--process_id={pid} must be in [0, --num_processes={num})")
  if coordinator is None:
    raise DistributedSetupError(
      f"--num_processes={num} needs --coordinator_address=HOST:PORT"
      f" (or {ENV_COORDINATOR}): where process 0 listens"
    )
  if not re.fullmatch(r".+:\d+", coordinator):
    raise DistributedSetupError(f"--coordinator_address={coordinator!r} must be HOST:PORT")
  source = "slurm" if used_slurm else "flags"
  reason = "srun step" if used_slurm else "coordinator/process flags or environment"
  return Plan(source, coordinator, num, pid, local, reason=reason)


def slurm_plan(env: Mapping[str, str]) -> Plan | None:
  """The plan an `srun` step implies, or None outside one (the batch script itself, where
  SLURM_NTASKS is the allocation's, has no SLURM_STEP_NUM_TASKS)."""
  needed = ("SLURM_JOB_ID", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS")
  if not all(env.get(k) for k in needed):
    return None
  num = int(env["SLURM_STEP_NUM_TASKS"])
  nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or ""
  hosts = expand_hostlist(nodes)
  port = env.get(ENV_COORDINATOR_PORT) or str(61440 + int(env["SLURM_JOB_ID"]) % 4096)
  coordinator = f"{hosts[0]}:{port}" if hosts else None
  local = None
  if _slurm_tasks_on_this_node(env) > 1:
    # Several tasks share the node's GPUs: one each, unless Slurm already bound one GPU
    # per task (then CUDA_VISIBLE_DEVICES names just that one and it is all we see).
    visible = [d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    if len(visible) != 1:
      local = (int(env.get("SLURM_LOCALID", "0")),)
  return Plan("slurm", coordinator, num, int(env["SLURM_PROCID"]), local, reason="srun step")


def expand_hostlist(nodelist: str) -> list[str]:
  """Slurm's compressed host list: 'gpu[01-03,07],login2' -> ['gpu01', ..., 'login2']."""
  hosts = []
  for item in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", nodelist):
    match = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", item)
    if not match:
      hosts.append(item)
      continue
    prefix, ranges, suffix = match.groups()
    for part in ranges.split(","):
      lo, _, hi = part.partition("-")
      for n in range(int(lo), int(hi or lo) + 1):
        hosts.append(f"{prefix}{n:0{len(lo)}d}{suffix}")
  return hosts


def _slurm_tasks_on_this_node(env: Mapping[str, str]) -> int:
  """Tasks of this step on this node, from SLURM_STEP_TASKS_PER_NODE ('4(x2),3')."""
  spec = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or ""
  counts = []
  for part in filter(None, spec.split(",")):
    match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
    if match:
      counts += [int(match.group(1))] * int(match.group(2) or 1)
  node = int(env.get("SLURM_NODEID", "0"))
  if node < len(counts):
    return counts[node]
  return int(env.get("SLURM_NTASKS_PER_NODE", "1").split("(")[0] or 1)


def tpu_process_count_from_environment(
  env: Mapping[str, str], metadata: Callable[[str], str] | None = None
) -> int:
  """Workers of this Cloud TPU slice (x slices): 1 when not on a TPU VM, 0 if unknown.

  GKE names the workers in the environment; a Cloud TPU VM names them in its GCE metadata
  (attribute `worker-network-endpoints`, which JAX's own cluster detection reads too), asked
  only where libtpu is installed. `metadata(key)` returns an instance attribute (default:
  the metadata server, see `gce_metadata`)."""
  hosts = env.get("TPU_PROCESS_ADDRESSES") or env.get("TPU_WORKER_HOSTNAMES")
  slices = int(env.get("MEGASCALE_NUM_SLICES") or 1)
  if hosts:
    return len([h for h in hosts.split(",") if h.strip()]) * slices
  # `import jax` sets TPU_SKIP_MDS_QUERY where it finds no TPU chips; JAX then skips the
  # metadata as well.
  if env.get("TPU_SKIP_MDS_QUERY") or not libtpu_installed(env):
    return 1
  read = metadata or functools.partial(gce_metadata, env=env)
  try:
    workers = [w for w in read("worker-network-endpoints").split(",") if w.strip()]
  except urllib.error.HTTPError as e:
    if e.code == 404:  # a GCE VM, but no TPU VM
      return 1
    logging.warning("Cloud TPU VM: could not read the worker count (%s); letting JAX decide", e)
    return 0
  except urllib.error.URLError:  # no metadata server: not on GCE
    return 1
  except OSError as e:
    logging.warning("Cloud TPU VM: could not read the worker count (%s); letting JAX decide", e)
    return 0
  if not workers:
    return 0
  if "MEGASCALE_NUM_SLICES" not in env:  # a multislice run lists its slices in tpu-env
    with contextlib.suppress(OSError, ValueError):
      match = re.search(r"^MEGASCALE_NUM_SLICES:\s*'?(\d+)", read("tpu-env"), re.MULTILINE)
      slices = int(match.group(1)) if match else 1
  return len(workers) * slices


def libtpu_installed(env: Mapping[str, str]) -> bool:
  """Whether JAX could drive TPU chips here: the libtpu package, or TPU_LIBRARY_PATH."""
  path = env.get("TPU_LIBRARY_PATH")
  return bool(path and os.path.isfile(path)) or importlib.util.find_spec("libtpu") is not None


def gce_metadata(key: str, env: Mapping[str, str] | None = None, timeout_s: float = 5) -> str:
  """One instance attribute from the GCE metadata server
  (https://cloud.google.com/compute/docs/metadata/querying-metadata); raises OSError."""
  host = (os.environ if env is None else env).get("GCE_METADATA_IP", "metadata.google.internal")
  request = urllib.request.Request(
    f"http://{host}/computeMetadata/v1/instance/attributes/{key}",
    headers={"Metadata-Flavor": "Google"},
  )
  with urllib.request.urlopen(request, timeout=timeout_s) as response:
    return response.read().decode()


def _env_int(env: Mapping[str, str], name: str, flag: str) -> int | None:
  value = env.get(name, "").strip()
  if not value:
    return None
  try:
    return int(value)
  except ValueError:
    raise DistributedSetupError(f"{name}={value!r} (for {flag}) is not an integer") from None


def _parse_ids(text: str) -> tuple[int, ...] | None:
  text = text.strip()
  if not text:
    return None
  try:
    return tuple(int(x) for x in text.split(",") if x.strip())
  except ValueError:
    raise DistributedSetupError(
      f"--local_device_ids={text!r}: comma-separated integers expected"
    ) from None


# ----------------------------------------------------------------------------- joining


def initialize(
  plan: Plan,
  *,
  init_timeout_s: int = 300,
  heartbeat_timeout_s: int = 100,
  shutdown_timeout_s: int = 1800,
) -> Plan:
  """Calls jax.distributed.initialize for a multi-process plan (nothing for one process).

  Returns the plan with the process id/count JAX settled on. Not joining within
  `init_timeout_s` ends the process (exit 1) with a message naming the coordinator.
  """
  if not plan.multi_process:
    return plan
  import jax

  if getattr(jax.config, "jax_cpu_collectives_implementation", "gloo") is None:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # older jax: CPU runs
  kwargs = dict(
    coordinator_address=plan.coordinator_address,
    num_processes=plan.num_processes,
    process_id=plan.process_id,
    local_device_ids=list(plan.local_device_ids) if plan.local_device_ids else None,
    # JAX's own deadline (an abort with a less specific message) comes later.
    initialization_timeout=int(init_timeout_s) + 30,
    heartbeat_timeout_seconds=int(heartbeat_timeout_s),
    shutdown_timeout_seconds=int(shutdown_timeout_s),
  )
  if plan.source in ("flags", "slurm"):
    kwargs["cluster_detection_method"] = "deactivate"  # we decided; JAX must not override
  accepted = inspect.signature(jax.distributed.initialize).parameters
  dropped = sorted(k for k in kwargs if k not in accepted)
  if dropped:
    logging.warning("jax %s: jax.distributed.initialize ignores %s", jax.__version__, dropped)
  kwargs = {k: v for k, v in kwargs.items() if k in accepted}
  who = f"process {plan.process_id} of {plan.num_processes}" if plan.num_processes else "TPU worker"
  logging.info("joining a multi-process run: %s", plan.describe())
  message = (
    f"t2t-train: {who} gave up after {init_timeout_s}s waiting for all processes "
    f"to join the coordinator at {plan.coordinator_address or '(auto-detected)'}: "
    "a process did not start or died early, or the address/port is not reachable "
    "from every process. Start every process with the same --coordinator_address "
    "and --num_processes and distinct --process_id values "
    "(--distributed_init_timeout_s sets the wait)."
  )
  with deadline(init_timeout_s, message):  # returns once every process has registered
    try:
      jax.distributed.initialize(**kwargs)
    except Exception as e:
      raise DistributedInitError(f"{who}: jax.distributed.initialize failed: {e}") from e
  plan = dataclasses.replace(
    plan, num_processes=jax.process_count(), process_id=jax.process_index()
  )
  logging.info(
    "joined: process %d of %d, %d local devices, %d in total",
    plan.process_id,
    plan.num_processes,
    jax.local_device_count(),
    jax.device_count(),
  )
  return plan


@contextlib.contextmanager
def deadline(seconds: float, message: str, exit_code: int = 1) -> Iterator[None]:
  """Ends the process with `message` (on stderr) and `exit_code` if the block outlives
  `seconds`: for C++ calls that block with the GIL released (JAX's connect, collectives)."""
  done = threading.Event()

  def watch() -> None:
    if not done.wait(seconds):
      _die(message, exit_code)

  thread = threading.Thread(target=watch, name="t2t-deadline", daemon=True)
  thread.start()
  try:
    yield
  finally:
    done.set()


@contextlib.contextmanager
def fail_fast(plan: Plan) -> Iterator[None]:
  """In a multi-process run, an exception (or Ctrl-C) ends this process at once with exit
  status 1, skipping JAX's shutdown barrier: the JAX distributed service then tells the other
  processes (within --heartbeat_timeout_s) and they abort instead of waiting in a collective.
  One process: exceptions propagate as usual."""
  if not plan.multi_process:
    yield
    return
  try:
    yield
  except SystemExit as e:
    if e.code in (None, 0):
      raise
    _die(
      f"t2t-train: process {plan.process_id} of {plan.num_processes} exiting with "
      f"{e.code!r}; the other processes will stop too",
      1,
    )
  except BaseException:
    logging.exception("training failed")
    _die(
      f"t2t-train: process {plan.process_id} of {plan.num_processes} failed (traceback "
      "above); exiting now so that the other processes stop too (the JAX distributed "
      "service aborts them when this one stops sending heartbeats)",
      1,
    )


def _die(message: str, exit_code: int) -> None:
  with contextlib.suppress(Exception):  # stdout may be closed; the message still goes out
    sys.stdout.flush()
  try:
    sys.stderr.write(f"{message}\n")
    sys.stderr.flush()
  finally:
    os._exit(exit_code)
