"""Transformer (base model), WMT 2014 English-German: Table 3 row "base".

    t2t-train --experiment=base --workdir=/tmp/base_ende

N=6, d_model=512, d_ff=2048, h=8, d_k=d_v=64, P_drop=0.1, eps_ls=0.1; 65M parameters in the
paper (63.1M here at a 37,000-token shared vocabulary: see tests/test_model.py). Batches of
~25,000 source + 25,000 target tokens, 100k steps, warmup 4000, average the last 5
checkpoints. Paper result: 27.3 BLEU on newstest2014 (12 hours on 8 P100 GPUs).
"""

import ml_collections

from t2t_jax import data
from t2t_jax.decoding.config import SearchConfig


def model_config() -> ml_collections.ConfigDict:
  """The model part of Table 3; field names are those of t2t_jax.model.TransformerConfig."""
  return ml_collections.ConfigDict(
    dict(
      d_model=512,
      d_ff=2048,
      num_heads=8,
      d_k=0,  # 0: d_model / num_heads
      d_v=0,
      num_layers=6,
      num_encoder_layers=0,  # 0: same as num_layers
      num_decoder_layers=0,
      dropout_rate=0.1,  # P_drop
      attention_dropout_rate=0.0,  # the paper drops only sub-layer outputs and embeddings
      norm="post",
      positional="sinusoidal",
      share_embeddings=True,
      dtype="float32",  # 'bfloat16' on accelerators (parameters stay float32)
      max_len=512,
      attention_impl="reference",  # 'cudnn' on NVIDIA GPUs
      loss_chunk_tokens=512,  # pre-softmax layer + loss over chunks of this many tokens (0: whole)
    )
  )


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
  # Decoding (paper 6.1): config.beam_size, alpha (length penalty), max_output_extra (max
  # output = input + it) and beam_stop ('exact' or 'heuristic'); see SearchConfig.
  config.update(SearchConfig().config_fields())
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
