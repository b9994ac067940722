#!/usr/bin/env bash
# t2t-train on this machine: one process, or N processes joined through a coordinator on
# localhost (a multi-host run in miniature, e.g. to try one before renting a cluster).
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: launch/local.sh [OPTIONS] [--] T2T_TRAIN_ARGS...

Runs `t2t-train T2T_TRAIN_ARGS...` on this machine. With -n N > 1, starts N processes of the
same command joined as one run (--coordinator_address=localhost:PORT --num_processes=N
--process_id=I are added); process 0's output is shown and every process's output is written
to LOG_DIR/process_I.log. When one process fails, the others are stopped and the exit
status is the failed one's.

Options:
  -n, --num_processes N   processes to start (default 1: plain t2t-train)
  --cpu_devices K         simulate K CPU devices per process (sets JAX_PLATFORMS=cpu and
                          XLA_FLAGS=--xla_force_host_platform_device_count=K)
  --gpus_per_process K    give process I the accelerators I*K .. I*K+K-1 (--local_device_ids)
  --port PORT             coordinator port (default: a free port; env PORT)
  --log_dir DIR           where process_I.log go (default: ./t2t-local-logs; env LOG_DIR)
  --dry-run               print every command instead of running it (env DRY_RUN=1)
  -h, --help              this text

Environment: T2T_TRAIN overrides the command (default "t2t-train", e.g.
T2T_TRAIN="python -m t2t_jax.cli.train").

Examples:
  launch/local.sh --experiment=tiny --workdir=workdirs/tiny
  launch/local.sh -n 2 --cpu_devices 4 -- --experiment=tiny --workdir=workdirs/tiny2
EOF
}

num_processes=1
cpu_devices=""
gpus_per_process=""
port="${PORT:-}"
log_dir="${LOG_DIR:-t2t-local-logs}"
dry_run="${DRY_RUN:-0}"

while (($#)); do
  case "$1" in
    -n | --num_processes) num_processes="$2"; shift 2 ;;
    --num_processes=*) num_processes="${1#*=}"; shift ;;
    --cpu_devices) cpu_devices="$2"; shift 2 ;;
    --cpu_devices=*) cpu_devices="${1#*=}"; shift ;;
    --gpus_per_process) gpus_per_process="$2"; shift 2 ;;
    --gpus_per_process=*) gpus_per_process="${1#*=}"; shift ;;
    --port) port="$2"; shift 2 ;;
    --port=*) port="${1#*=}"; shift ;;
    --log_dir) log_dir="$2"; shift 2 ;;
    --log_dir=*) log_dir="${1#*=}"; shift ;;
    --dry-run | --dry_run) dry_run=1; shift ;;
    -h | --help) usage; exit 0 ;;
    --) shift; break ;;
    *) break ;;
  esac
done

if ! [[ "$num_processes" =~ ^[1-9][0-9]*$ ]]; then
  echo "local.sh: -n must be a positive integer, got '$num_processes'" >&2
  usage >&2
  exit 2
fi
if (($# == 0)); then
  echo "local.sh: no t2t-train arguments (at least --workdir=DIR)" >&2
  usage >&2
  exit 2
fi

read -r -a train_cmd <<<"${T2T_TRAIN:-t2t-train}"

env_cmd=()
if [[ -n "$cpu_devices" ]]; then
  env_cmd=(env JAX_PLATFORMS=cpu "XLA_FLAGS=--xla_force_host_platform_device_count=$cpu_devices")
fi

# Prints a command the way it would be run (shell-quoted), or runs it.
show() {
  local out="+"
  local arg
  for arg in "$@"; do out+=" $(printf '%q' "$arg")"; done
  printf '%s\n' "$out"
}

if ((num_processes == 1)); then
  if [[ "$dry_run" == 1 ]]; then
    show ${env_cmd[@]+"${env_cmd[@]}"} "${train_cmd[@]}" "$@"
    exit 0
  fi
  exec ${env_cmd[@]+"${env_cmd[@]}"} "${train_cmd[@]}" "$@"
fi

if [[ -z "$port" ]]; then
  port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("localhost", 0))
print(s.getsockname()[1])')"
fi

pids=()
stop_all() {
  local pid
  for pid in ${pids[@]+"${pids[@]}"}; do kill -TERM "$pid" 2>/dev/null || true; done
}
trap 'stop_all; exit 130' INT
trap 'stop_all; exit 143' TERM

[[ "$dry_run" == 1 ]] || mkdir -p "$log_dir"
for ((i = 0; i < num_processes; i++)); do
  cmd=(${env_cmd[@]+"${env_cmd[@]}"} "${train_cmd[@]}" "$@" "--coordinator_address=localhost:$port"
       "--num_processes=$num_processes" "--process_id=$i")
  if [[ -n "$gpus_per_process" ]]; then
    ids="$(seq -s, $((i * gpus_per_process)) $((i * gpus_per_process + gpus_per_process - 1)))"
    cmd+=("--local_device_ids=$ids")
  fi
  log="$log_dir/process_$i.log"
  if [[ "$dry_run" == 1 ]]; then
    if ((i == 0)); then
      echo "$(show "${cmd[@]}") 2>&1 | tee $log &"
    else
      echo "$(show "${cmd[@]}") > $log 2>&1 &"
    fi
    continue
  fi
  if ((i == 0)); then
    "${cmd[@]}" > >(tee "$log") 2>&1 &
  else
    "${cmd[@]}" >"$log" 2>&1 &
  fi
  pids+=("$!")
done
[[ "$dry_run" == 1 ]] && exit 0

echo "local.sh: $num_processes processes (pids ${pids[*]}), coordinator localhost:$port," \
  "logs in $log_dir/" >&2
status=0
running=("${pids[@]}")
while ((${#running[@]})); do
  still=()
  for pid in "${running[@]}"; do
    if kill -0 "$pid" 2>/dev/null; then
      still+=("$pid")
    else
      wait "$pid" || status=$?
    fi
  done
  running=("${still[@]+"${still[@]}"}")
  if ((status != 0)); then
    echo "local.sh: a process exited with status $status; stopping the others" >&2
    stop_all
    wait || true
    break
  fi
  sleep 1
done
exit "$status"
