#!/usr/bin/env bash
# Cloud TPU VM slices with gcloud: create or reuse one, install t2t_jax on every worker, run
# the same t2t-train on all workers (--worker=all), follow the logs, stop or delete it.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: launch/tpu_vm.sh [--dry-run] COMMAND [--] [T2T_TRAIN_ARGS...]

Commands:
  create    create the TPU VM slice, unless one named TPU_NAME exists (then reuse it)
  install   copy this checkout (git archive of HEAD) to every worker, pip install '.[tpu]'
            there (or pip install "$INSTALL_SPEC" when set)
  train     run `t2t-train T2T_TRAIN_ARGS...` on every worker at once; the output of all
            workers streams here and is appended to ~/t2t-train.log on each worker
            (DETACH=1: start it in the background on the workers and return; see `logs`)
  up        create, install, then train
  logs      follow ~/t2t-train.log on every worker
  status    describe the slice
  stop      stop the slice (single-host slices; pod slices can only be deleted)
  delete    delete the slice

Every worker runs the same command: t2t-train joins them itself (JAX detects the workers
of a TPU slice). --workdir must name storage that all workers share (e.g. an NFS/Filestore
mount, or a gcsfuse mount of a bucket at the same path on each worker): process 0 writes
the vocabulary and metrics, checkpoints are written jointly.

Environment:
  TPU_NAME          slice name (required)
  ZONE              e.g. us-central2-b (required)
  PROJECT           gcloud project (default: gcloud's configured one)
  ACCELERATOR_TYPE  default v4-32 (4 hosts x 4 chips)
  RUNTIME_VERSION   default tpu-ubuntu2204-base
  SPOT=1            create a Spot slice
  INSTALL_SPEC      pip requirement to install instead of this checkout
  DETACH=1          `train` returns at once; training continues on the workers
  DRY_RUN=1         same as --dry-run: print every command instead of running it

Example:
  TPU_NAME=t2t ZONE=us-central2-b launch/tpu_vm.sh up -- --experiment=base \
      --workdir=/mnt/shared/base
EOF
}

dry_run="${DRY_RUN:-0}"
if [[ "${1:-}" == "--dry-run" || "${1:-}" == "--dry_run" ]]; then
  dry_run=1
  shift
fi
if (($# == 0)); then
  usage >&2
  exit 2
fi
command="$1"
shift
if [[ "${1:-}" == "--" ]]; then
  shift
fi
case "$command" in
  -h | --help | help) usage; exit 0 ;;
esac

: "${TPU_NAME:?set TPU_NAME (see launch/tpu_vm.sh --help)}"
: "${ZONE:?set ZONE (see launch/tpu_vm.sh --help)}"
accelerator_type="${ACCELERATOR_TYPE:-v4-32}"
runtime_version="${RUNTIME_VERSION:-tpu-ubuntu2204-base}"
remote_log="t2t-train.log"
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

tpu=(gcloud compute tpus tpu-vm)
where=("--zone=$ZONE")
if [[ -n "${PROJECT:-}" ]]; then
  where+=("--project=$PROJECT")
fi

# One argument as the shell would need it: bare when safe, else in single quotes.
quote() {
  if [[ "$1" =~ ^[A-Za-z0-9_./:=@,+%-]+$ ]]; then
    printf '%s' "$1"
  else
    local q="'\\''"
    printf "'%s'" "${1//\'/$q}"
  fi
}

quote_args() {
  local out=""
  local arg
  for arg in "$@"; do out+=" $(quote "$arg")"; done
  printf '%s' "$out"
}

# Prints a command (dry run) or runs it.
run() {
  if [[ "$dry_run" == 1 ]]; then
    printf '+%s\n' "$(quote_args "$@")"
  else
    "$@"
  fi
}

# Runs a shell command line on every worker of the slice.
on_all_workers() {
  run "${tpu[@]}" ssh "$TPU_NAME" "${where[@]}" --worker=all --command="$1"
}

do_create() {
  if [[ "$dry_run" != 1 ]] && "${tpu[@]}" describe "$TPU_NAME" "${where[@]}" >/dev/null 2>&1; then
    echo "tpu_vm.sh: reusing the existing slice $TPU_NAME" >&2
    return
  fi
  [[ "$dry_run" == 1 ]] && echo "# unless \`${tpu[*]} describe $TPU_NAME ${where[*]}\` finds it:"
  local create=("${tpu[@]}" create "$TPU_NAME" "${where[@]}"
                "--accelerator-type=$accelerator_type" "--version=$runtime_version")
  if [[ "${SPOT:-0}" == 1 ]]; then
    create+=(--spot)
  fi
  run "${create[@]}"
}

do_install() {
  if [[ -n "${INSTALL_SPEC:-}" ]]; then
    on_all_workers "python3 -m pip install --upgrade $(quote "$INSTALL_SPEC")"
    return
  fi
  local tarball
  tarball="${TMPDIR:-/tmp}/t2t_jax-$TPU_NAME.tar.gz"
  run git -C "$repo_root" archive --format=tar.gz "--output=$tarball" HEAD
  run "${tpu[@]}" scp "$tarball" "$TPU_NAME:t2t_jax.tar.gz" "${where[@]}" --worker=all
  local unpack='set -e; rm -rf ~/t2t_jax; mkdir -p ~/t2t_jax; '
  unpack+='tar -xzf ~/t2t_jax.tar.gz -C ~/t2t_jax; '
  # shellcheck disable=SC2016  # $HOME expands on the workers
  on_all_workers "$unpack"'python3 -m pip install --upgrade "$HOME/t2t_jax[tpu]"'
}

do_train() {
  if (($# == 0)); then
    echo "tpu_vm.sh: train needs t2t-train arguments (at least --workdir=DIR)" >&2
    exit 2
  fi
  local train
  train="t2t-train$(quote_args "$@")"
  # shellcheck disable=SC2016  # $HOME and $PATH expand on the workers
  local prefix='export PATH="$HOME/.local/bin:$PATH" PYTHONUNBUFFERED=1; cd "$HOME"; '
  if [[ "${DETACH:-0}" == 1 ]]; then
    on_all_workers "${prefix}nohup $train >> $remote_log 2>&1 < /dev/null & echo \"started on \$(hostname)\""
  else
    on_all_workers "set -o pipefail; ${prefix}$train 2>&1 | tee -a $remote_log"
  fi
}

case "$command" in
  create) do_create ;;
  install) do_install ;;
  train) do_train "$@" ;;
  up)
    do_create
    do_install
    do_train "$@"
    ;;
  logs) on_all_workers "tail -n 50 -F \"\$HOME/$remote_log\"" ;;
  status) run "${tpu[@]}" describe "$TPU_NAME" "${where[@]}" ;;
  stop) run "${tpu[@]}" stop "$TPU_NAME" "${where[@]}" ;;
  delete) run "${tpu[@]}" delete "$TPU_NAME" "${where[@]}" --quiet ;;
  *)
    echo "tpu_vm.sh: unknown command '$command'" >&2
    usage >&2
    exit 2
    ;;
esac
