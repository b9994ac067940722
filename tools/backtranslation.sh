#!/usr/bin/env bash
# The back-translation recipe of docs/backtranslation.md on Multi30k, end to end:
# half of the training pairs as bitext, the other half's German as monolingual text; a de->en
# model back-translates it by sampling and by beam search; en->de is trained on the bitext
# alone (two seeds, also scored as an ensemble) and on the bitext plus each tagged
# back-translation. Every model has the same step budget; test2016 BLEU of each at the end.
#
#   tools/backtranslation.sh OUT [STEPS]     (OUT: a new folder; STEPS default 400)
#
# T2T_MULTI30K (default ../shared/data/multi30k beside the repository) holds train/val/test2016.
set -euo pipefail
out=${1:?usage: tools/backtranslation.sh OUT [STEPS]}
steps=${2:-400}
here=$(cd "$(dirname "$0")/.." && pwd)
m30k=${T2T_MULTI30K:-$here/../shared/data/multi30k}
mkdir -p "$out"
out=$(cd "$out" && pwd)
d=$out/data
mkdir -p "$d"

half=$(($(wc -l <"$m30k/train.en") / 2))
head -n "$half" "$m30k/train.en" >"$d/bitext.en"
head -n "$half" "$m30k/train.de" >"$d/bitext.de"
tail -n +"$((half + 1))" "$m30k/train.de" >"$d/mono.de"

# One budget for every model: STEPS steps of 4,096 tokens a side, warmup over the same
# steps (the experiment's 800 would end in warmup), one checkpoint, no averaging.
budget=(--config.corpus_dir="$m30k" --config.num_train_steps="$steps"
  --config.warmup_steps="$steps" --config.train_time_limit_minutes=0
  --config.eval_every_steps="$steps" --config.checkpoint_every_steps="$steps"
  --config.bleu_every_steps=0 --config.select_checkpoints= --config.average_checkpoints=1)
log() { echo "[$(date +%T)] $*"; }
train() {  # train WORKDIR ARGS...: skipped when WORKDIR already finished (rerun-safe)
  local w=$1
  shift
  [[ -f $w/.finished ]] && return 0
  log "train $w"
  /usr/bin/time -f "%e s wall" t2t-train --workdir="$w" "${budget[@]}" "$@" 2>"$w.log" ||
    { tail -n 20 "$w.log"; exit 1; }
  tail -n 1 "$w.log"
  touch "$w/.finished"
}

# 1. de->en on the bitext.
train "$out/deen" --experiment=multi30k:de-en \
  --config.data.train_source="$d/bitext.de" --config.data.train_target="$d/bitext.en"
# 2. en->de on the bitext alone, two seeds sharing one vocabulary and store.
for seed in 0 1; do
  train "$out/bitext_s$seed" --experiment=multi30k --config.seed="$seed" \
    --config.data.data_dir="$out/store_bitext" \
    --config.data.train_source="$d/bitext.en" --config.data.train_target="$d/bitext.de"
done

# 3. The monolingual German back-translated by the de->en model, twice.
if [[ ! -f $d/bt_beam.en ]]; then
  log "back-translate by beam search (beam 4, alpha 0.6)"
  t2t-translate --workdir="$out/deen" --input="$d/mono.de" --output="$d/bt_beam.en.tmp" \
    2>"$out/bt_beam.log"
  mv "$d/bt_beam.en.tmp" "$d/bt_beam.en"
fi
if [[ ! -f $d/bt_sample.en ]]; then
  log "back-translate by unrestricted sampling (temperature 1, seed 1)"
  t2t-translate --workdir="$out/deen" --input="$d/mono.de" --output="$d/bt_sample.en.tmp" \
    --sampling --seed=1 2>"$out/bt_sample.log"
  mv "$d/bt_sample.en.tmp" "$d/bt_sample.en"
fi

# 4. en->de on the bitext plus the tagged back-translations (weight 1 each).
for kind in beam sample; do
  train "$out/bt_$kind" --experiment=multi30k \
    --config.data.train_source= --config.data.train_target= \
    --config.data.train_corpora="({'source': '$d/bitext.en', 'target': '$d/bitext.de'},
      {'source': '$d/bt_$kind.en', 'target': '$d/mono.de', 'tag': '<bt>'})"
done

# 5. test2016 BLEU of each model, and of the two bitext seeds as an ensemble.
for w in deen bitext_s0 bitext_s1 bt_beam bt_sample bitext_s0,bitext_s1; do
  src=en ref=de
  [[ $w == deen ]] && src=de ref=en
  dirs=$out/${w//,/,$out/}
  printf '%s\t' "$w"
  t2t-translate --workdir="$dirs" --input="$m30k/test2016.$src" \
    --reference="$m30k/test2016.$ref" --output="$out/test2016.${w/,/+}.out" 2>&1 |
    grep -iE "bleu|chrf" | tr '\n' ' '
  echo
done
