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
from t2t_jax.model import TransformerConfig
from t2t_jax.training.config import TrainConfig


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
  """Model, data, TrainConfig's training fields (the paper's, section 5) and decoding."""
  config = ml_collections.ConfigDict()
  config.model = model_config()
  config.data = data_config()
  config.update(TrainConfig.defaults())
  # Decoding (paper 6.1): config.beam_size, alpha (length penalty), max_output_extra (max
  # output = input + it) and beam_stop ('exact' or 'heuristic'); see SearchConfig.
  config.update(SearchConfig().config_fields())
  return config
