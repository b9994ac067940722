"""A small Transformer on Multi30k (image captions), English->German, sized for two CPU cores.

    t2t-train --experiment=multi30k --workdir=/tmp/multi30k
    t2t-train --experiment=multi30k:de-en --workdir=/tmp/multi30k_deen

29,000 training pairs, val (1,014) as dev, test2016 (1,000) as test, read from local text
files: by default ../shared/data/multi30k beside the repository; point elsewhere with
--config.corpus_dir=/path/to/multi30k (files train/val/test2016 .en/.de). Shared BPE
vocabulary of 8,000 pieces. After training, the test split is translated with the
candidate (last checkpoint, or the average of the last 3, 5 or 8) of best sacreBLEU on all of
val; the choice is written to <workdir>/selected.json. Training stops after 3,400 steps or 58
minutes, whichever comes first (the schedule has no end point to miss).

Expected (README, Results; docs/results.md has the ablations behind these settings): test2016
sacreBLEU about 39 (en->de) and 42 (de->en), with the average of the last 8 checkpoints
chosen on val. Dropout 0.1 rather than the paper's 0.1/0.3 choice matters most at this size.
"""

import os

from t2t_jax.experiments import base

DEFAULT_DIR = os.path.normpath(
  os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data", "multi30k")
)


def get_config(direction: str = "en-de"):
  direction = direction or "en-de"
  if direction not in ("en-de", "de-en"):
    raise ValueError(f"multi30k: direction {direction!r} must be 'en-de' or 'de-en'")
  source, target = direction.split("-")
  config = base.get_config()
  config.corpus_dir = os.environ.get("T2T_MULTI30K", DEFAULT_DIR)
  corpus = config.get_ref("corpus_dir")
  config.data.update(
    source="textfiles",
    source_lang=source,
    target_lang=target,
    vocab_size=8000,
    max_len=64,
    tokens_per_batch=4096,
    batching="bucket",
    bucket_boundaries=(16, 24, 32, 48, 64),
  )
  for split, name in (("train", "train"), ("dev", "val"), ("test", "test2016")):
    config.data[f"{split}_source"] = corpus + f"/{name}.{source}"
    config.data[f"{split}_target"] = corpus + f"/{name}.{target}"
  config.model.update(
    d_model=256, d_ff=1024, num_heads=4, num_layers=3, dropout_rate=0.1, max_len=128
  )
  config.num_train_steps = 3400  # ~32 epochs; the time limit below may end it earlier
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


def check_config(config):
  """The experiment's own rule: config.corpus_dir names the directory of the files."""
  if not isinstance(config.corpus_dir, str) or not config.corpus_dir.strip():
    raise ValueError(
      f"config.corpus_dir={config.corpus_dir!r} must be the directory of the Multi30k files "
      "(train, val and test2016 .en and .de)"
    )
