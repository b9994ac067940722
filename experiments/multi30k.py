"""A small Transformer on Multi30k (image captions), English->German, sized for a 2-core CPU.

    t2t-train --experiment=multi30k --workdir=/tmp/multi30k
    t2t-train --experiment=multi30k:de-en --workdir=/tmp/multi30k_deen

29,000 training pairs, val (1,014) as dev, test2016 (1,000) as test, read from local text
files: by default ../shared/data/multi30k beside the repository; point elsewhere with
--config.corpus_dir=/path/to/multi30k (files train/val/test2016 .en/.de). Shared BPE
vocabulary of 8,000 pieces. After training, the test split is translated with the
candidate (last checkpoint, or the average of the last 3, 5 or 8) of best sacreBLEU on all of
val; the choice is written to <workdir>/selected.json. Training stops after 3,400 steps or 58
minutes, whichever comes first (the schedule has no end point to miss).

Measured (2-core CPU, from empty workdirs, commit d763fb2; README, Results): en->de 3,400
steps in 50.3 minutes, test2016 sacreBLEU 39.09 (tokenized 39.12, lowercased 39.50, chrF
63.10); de->en 3,400 steps in 50.0 minutes, sacreBLEU 42.40 (tokenized 42.57, lowercased
42.67, chrF 61.42). Both chose the average of the last 8 checkpoints on val.

Ablations (all on val, beam 4, alpha 0.6):
- dropout, the one that mattered: P_drop 0.1 (now) against 0.3 (commit fb3610e, 3,000
  steps, otherwise the same): test2016 sacreBLEU 39.09 vs 35.75 (en->de) and 42.40 vs
  38.17 (de->en). Dev BLEU on 200 val sentences, en->de, at 400 / 800 / 1,200 / 1,600
  steps: 20.26 / 27.50 / 33.74 / 37.14 with 0.1 against 11.10 / 22.62 / 27.93 / 31.82 with
  0.3 (36.33 at 3,000). With 0.1 dev loss bottoms out near 2,400 steps (en->de 1.61, de->en
  1.52) and rises slowly after, while dev BLEU still creeps up.
- checkpoint averaging, all 1,014 val sentences, sacreBLEU of the last / average of the
  last 3 / 5 / 8 checkpoints (every 200 steps): P_drop 0.1, en->de 36.84 / 39.32 / 39.93 /
  40.75, de->en 40.66 / 42.13 / 42.77 / 43.01; P_drop 0.3, en->de 35.53 / 36.05 / 36.03 /
  35.44, de->en 37.80 / 38.84 / 38.39 / 37.93. With weaker dropout the single checkpoints
  are noisier and long averages win; with 0.3 the model was still improving quickly and
  short averages won. The paper averages 5 of 100k steps.
- not ablated (each costs a ~50-minute run here): model size, warmup, label smoothing,
  batch size; set once and explained in the README.
"""

import os

from t2t_jax.experiments import base

DEFAULT_DIR = os.path.normpath(os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data", "multi30k"))


def get_config(direction: str = "en-de"):
  direction = direction or "en-de"
  if direction not in ("en-de", "de-en"):
    raise ValueError(f"multi30k: direction {direction!r} must be 'en-de' or 'de-en'")
  source, target = direction.split("-")
  config = base.get_config()
  config.corpus_dir = os.environ.get("T2T_MULTI30K", DEFAULT_DIR)
  corpus = config.get_ref("corpus_dir")
  config.data.update(source="textfiles", source_lang=source, target_lang=target,
                     vocab_size=8000, max_len=64, tokens_per_batch=4096, batching="bucket",
                     bucket_boundaries=(16, 24, 32, 48, 64))
  for split, name in (("train", "train"), ("dev", "val"), ("test", "test2016")):
    config.data[f"{split}_source"] = corpus + f"/{name}.{source}"
    config.data[f"{split}_target"] = corpus + f"/{name}.{target}"
  config.model.update(d_model=256, d_ff=1024, num_heads=4, num_layers=3, dropout_rate=0.1,
                      max_len=128)
  config.num_train_steps = 3400    # ~32 epochs; the time limit below may end it earlier
  config.warmup_steps = 800
  config.learning_rate_factor = 1.5
  config.log_every_steps = 100
  config.eval_every_steps = 400
  config.checkpoint_every_steps = 200
  config.keep_checkpoints = 10
  config.average_checkpoints = 5
  config.bleu_every_steps = 400
  config.bleu_num_sentences = 200
  config.test_at_end = True
  # The test split is translated by the candidate with the best BLEU on all of val.
  config.select_checkpoints = "latest,average:3,average:5,average:8"
  config.train_time_limit_minutes = 58.0
  return config
