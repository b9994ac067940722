"""Transformer (base model), WMT 2014 English-German: Table 3 row "base".

N=6, d_model=512, d_ff=2048, h=8, d_k=d_v=64, P_drop=0.1, eps_ls=0.1; 65M parameters in the
paper (63.1M here at a 37,000-token shared vocabulary: see tests/test_model.py).
Paper result: 27.3 BLEU on newstest2014 after 100k steps (12 hours on 8 P100 GPUs).
"""

import ml_collections


def model_config() -> ml_collections.ConfigDict:
  """The model part of Table 3; field names are those of t2t_jax.model.TransformerConfig."""
  return ml_collections.ConfigDict(dict(
      d_model=512,
      d_ff=2048,
      num_heads=8,
      num_layers=6,
      num_encoder_layers=0,        # 0: same as num_layers
      num_decoder_layers=0,
      dropout_rate=0.1,            # P_drop
      attention_dropout_rate=0.0,  # the paper drops only sub-layer outputs and embeddings
      norm="post",
      positional="sinusoidal",
      share_embeddings=True,
      dtype="float32",
      max_len=512,
      attention_impl="reference",
  ))


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.model = model_config()
  config.vocab_size = 37000        # shared BPE source-target vocabulary (paper 5.1)
  config.label_smoothing = 0.1     # eps_ls (paper 5.4)
  config.warmup_steps = 4000       # paper 5.3
  config.learning_rate_factor = 1.0
  config.num_train_steps = 100_000
  return config
