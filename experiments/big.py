"""Transformer (big model), WMT 2014 English-German: Table 3 row "big".

    t2t-train --experiment=big --workdir=/tmp/big_ende

N=6, d_model=1024, d_ff=4096, h=16, P_drop=0.3 (en-de); 213M parameters in the paper
(214M here at a 37,000-token vocabulary). 300k steps; average the last 20 checkpoints.
Paper result: 28.4 BLEU on newstest2014 (3.5 days on 8 P100 GPUs).
"""

from t2t_jax.experiments import base


def get_config():
  config = base.get_config()
  config.model.d_model = 1024
  config.model.d_ff = 4096
  config.model.num_heads = 16
  config.model.dropout_rate = 0.3
  config.num_train_steps = 300_000
  config.average_checkpoints = 20
  config.keep_checkpoints = 20
  return config
