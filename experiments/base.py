"""Transformer (base model), WMT 2014 English-German: Table 3 row "base".

    t2t-train --experiment=base --workdir=/tmp/base_ende

N=6, d_model=512, d_ff=2048, h=8, d_k=d_v=64, P_drop=0.1, eps_ls=0.1; 65M parameters in the
paper (63.1M here at a 37,000-token shared vocabulary: see tests/test_model.py). Batches of
~25,000 source + 25,000 target tokens, 100k steps, warmup 4000, average the last 5
checkpoints. Paper result: 27.3 BLEU on newstest2014 (12 hours on 8 P100 GPUs).
"""

import ml_collections

from t2t_jax import data
from t2t_jax.model import TransformerConfig


def model_config() -> ml_collections.ConfigDict:
  """The model part of Table 3: TransformerConfig's defaults, which are the base model."""
  return ml_collections.ConfigDict(TransformerConfig.defaults())


def data_config() -> ml_collections.ConfigDict:
  config = data.default_config()
  config.source = "wmt14_translate"
  config.pair = "de-en"
  config.source_lang = "en"
  config.target_lang = "de"
  config.vocab_size = 37000  # shared BPE source-target vocabulary (paper 5.1)
  config.tokens_per_batch = 25000  # ~25k source + 25k target tokens per step (paper 5.1)
  return config


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.model = model_config()
  config.data = data_config()
  config.seed = 0
  config.num_train_steps = 100_000
  config.warmup_steps = 4000  # paper 5.3
  config.learning_rate_factor = 1.0
  config.label_smoothing = 0.1  # eps_ls (paper 5.4)
  config.grad_accum_steps = 1  # raise to reach 25k+25k tokens on fewer devices
  config.log_every_steps = 100
  config.eval_every_steps = 1000
  config.checkpoint_every_steps = 1000
  config.keep_checkpoints = 20  # >= the checkpoints averaged at the end (5 base, 20 big)
  config.average_checkpoints = 5
  config.prefetch_batches = 2
  # Decoding (paper 6.1): beam 4, length penalty alpha 0.6, max output = input + 50.
  config.beam_size = 4
  config.alpha = 0.6
  config.max_output_extra = 50
  # When beam search stops a sentence: 'exact' (tensor2tensor: no live hypothesis can still
  # win) or 'heuristic' (none would if it ended now; faster, may differ; decoding/search.py).
  config.beam_stop = "exact"
  config.bleu_every_steps = 0  # sacreBLEU on dev sentences every M steps (0 = off)
  config.bleu_num_sentences = 500
  config.bleu_beam_size = 0  # beam of those dev scores (0 = beam_size; 1 = greedy, cheaper)
  config.test_at_end = False  # translate and score the test split after training
  # Checkpoint selection on dev only: candidates ('latest', 'average:N', 'STEP', comma
  # separated) are scored by dev sacreBLEU and the best one translates the test split;
  # '' = the average of the last `average_checkpoints` (the paper's practice).
  config.select_checkpoints = ""
  config.select_num_sentences = 0  # dev sentences scored per candidate (0 = all)
  config.train_time_limit_minutes = 0.0  # stop, save and evaluate after this long (0 = no limit)
  return config
