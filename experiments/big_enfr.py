"""Transformer (big model), WMT 2014 English-French: Table 2's 41.0 BLEU row.

    t2t-train --experiment=big_enfr --workdir=/tmp/big_enfr

Big model with P_drop = 0.1 for en-fr (paper 6.1, not 0.3 as for en-de), 32,000-token
vocabulary, 300k steps, average of the last 20 checkpoints. Paper: 41.0 BLEU on
newstest2014 (3.5 days on 8 P100 GPUs).
"""

from t2t_jax.experiments import base_enfr, big


def get_config():
  config = big.get_config()
  config.data = base_enfr.get_config().data
  config.model.dropout_rate = 0.1
  return config
