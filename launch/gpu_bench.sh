#!/usr/bin/env bash
# The accelerator figures of the performance issue, in one run (see usage below).
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: launch/gpu_bench.sh [--dry-run] [--no-check] [OUT_DIR]

On one accelerator: base and big training steps on a ~25k+25k-token batch in bf16 with
cuDNN attention (targets on one H200: base <= 30 ms, big <= 100 ms per step), and base
beam-4 decoding of newstest2014 (3003 sentences; target <= 3 s), each beside the measured
bf16 matmul peak. Writes OUT_DIR/{base,big}.json and .log (OUT_DIR: $OUT, else ./gpu_bench).

newstest2014 is read from $T2T_SHARED_DATA (else ../shared/data beside the checkout);
without it the decoding figure uses 3003 synthetic 30-token sentences, and says so.
--dry-run (or DRY_RUN=1) prints the t2t-bench commands instead of running them.

Before any of that it checks that the Python of t2t-bench (its #! line; PYTHON overrides)
has everything t2t_jax needs (setup.cfg's list; T2T_REQUIREMENTS=FILE checks a requirements
file instead). Where something is missing, as on a node without network whose image holds
only jax, flax and optax, it stops with status 3, naming what to bring and how
(launch/wheelhouse.sh); a dry run says so and goes on. --no-check skips this.
USAGE
}

dry_run=${DRY_RUN:-}
out=${OUT:-gpu_bench}
check=1
while [[ $# -gt 0 ]]; do
  case $1 in
    -h|--help) usage; exit 0 ;;
    --dry-run) dry_run=1; shift ;;
    --no-check) check=""; shift ;;
    -*) echo "gpu_bench: unknown option $1" >&2; usage >&2; exit 2 ;;
    *) out=$1; shift ;;
  esac
done

launch=$(dirname "$0")

# The interpreter of a console script: `#!/path/python`, `#!/usr/bin/env python3`, or the
# `#!/bin/sh` line pip writes when the path is too long for #!, followed by
# `'''exec' "/path/python" "$0" "$@"`.
script_python() {
  local first="" second="" words
  { IFS= read -r first || true; IFS= read -r second || true; } <"$1"
  read -r -a words <<<"${first#\#!}"
  if [[ ${words[0]:-} == */env ]]; then
    words=("${words[@]:1}")
  fi
  local pip_sh="^'''exec' \"([^\"]+)\""
  if [[ ${words[0]:-} == */sh && $second =~ $pip_sh ]]; then
    words=("${BASH_REMATCH[1]}")
  fi
  [[ ${words[0]:-} == python* || ${words[0]:-} == */python* ]] || return 1
  echo "${words[0]}"
}

# Stops when the Python that t2t-bench runs in lacks a requirement, naming what to bring: on
# a node without network the run would otherwise fail at the first import, after the wait.
check_requirements() {
  local bench python missing="" status=0
  bench=$(command -v t2t-bench || true)
  python=${PYTHON:-}
  if [[ -z $python && -n $bench ]] && ! python=$(script_python "$bench"); then
    echo "gpu_bench: $bench is not a Python console script; its requirements are not" \
      "checked (PYTHON=... names the interpreter to check)" >&2
    return 0
  fi
  python=${python:-python3}
  local args=(check)
  [[ -z ${T2T_REQUIREMENTS:-} ]] || args+=(--requirements "$T2T_REQUIREMENTS")
  missing=$("$python" "$launch/wheelhouse.py" "${args[@]}") || status=$?
  if ((status > 1)); then
    echo "gpu_bench: $python could not check the requirements (status $status)" >&2
    exit 3
  fi
  [[ -n $bench ]] || missing+=$'\n'"t2t_jax (no t2t-bench on PATH)"
  missing=${missing#$'\n'}
  [[ -n $missing ]] || return 0
  {
    echo "gpu_bench: $python lacks what t2t_jax needs:"
    local lines
    mapfile -t lines <<<"$missing"
    printf '  %s\n' "${lines[@]}"
    echo "Bring it in a wheelhouse (launch/README.md, \"Machines without network\"):"
    echo "  here:  $python $launch/wheelhouse.py freeze > have.txt"
    echo "  on a machine with network, in a checkout, with have.txt copied there:"
    echo "         launch/wheelhouse.sh build --dir wheels --have have.txt"
    echo "  here, with wheels/ copied back:"
    echo "         PYTHON=$python $launch/wheelhouse.sh install --dir wheels"
  } >&2
  if [[ -n $dry_run ]]; then
    echo "gpu_bench: (a run would stop here, with status 3)" >&2
    return 0
  fi
  exit 3
}

[[ -z $check ]] || check_requirements

data=${T2T_SHARED_DATA:-$launch/../../shared/data}
batch=(--batch_tokens=25000 --seq_len=64 --config.model.dtype=bfloat16
       --config.model.attention_impl=cudnn)
decode=(--decode_sentences=3003)
if [[ -f "$data/wmt14/newstest2014.en" ]]; then
  decode+=(--decode_corpus=newstest2014)
else
  echo "gpu_bench: $data/wmt14/newstest2014.en not found; decoding synthetic sentences" >&2
fi

run() {
  local name=$1
  shift
  echo "+ t2t-bench $* --json=$out/$name.json"
  if [[ -z "$dry_run" ]]; then
    t2t-bench "$@" --json="$out/$name.json" 2>&1 | tee "$out/$name.log"
  fi
}

[[ -n "$dry_run" ]] || mkdir -p "$out"
run base --experiment=base "${batch[@]}" --parts=peak,train,decode "${decode[@]}"
run big --experiment=big "${batch[@]}" --parts=peak,train
