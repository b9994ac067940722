#!/usr/bin/env bash
# The accelerator figures of the performance issue, in one run (see usage below).
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: launch/gpu_bench.sh [--dry-run] [OUT_DIR]

On one accelerator: base and big training steps on a ~25k+25k-token batch in bf16 with
cuDNN attention (targets on one H200: base <= 30 ms, big <= 100 ms per step), and base
beam-4 decoding of newstest2014 (3003 sentences; target <= 3 s), each beside the measured
bf16 matmul peak. Writes OUT_DIR/{base,big}.json and .log (OUT_DIR: $OUT, else ./gpu_bench).

newstest2014 is read from $T2T_SHARED_DATA (else ../shared/data beside the checkout);
without it the decoding figure uses 3003 synthetic 30-token sentences, and says so.
--dry-run (or DRY_RUN=1) prints the t2t-bench commands instead of running them.
USAGE
}

dry_run=${DRY_RUN:-}
out=${OUT:-gpu_bench}
while [[ $# -gt 0 ]]; do
  case $1 in
    -h|--help) usage; exit 0 ;;
    --dry-run) dry_run=1; shift ;;
    -*) echo "gpu_bench: unknown option $1" >&2; usage >&2; exit 2 ;;
    *) out=$1; shift ;;
  esac
done

data=${T2T_SHARED_DATA:-$(dirname "$0")/../../shared/data}
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
