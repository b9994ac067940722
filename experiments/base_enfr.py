"""Transformer (base model), WMT 2014 English-French.

    t2t-train --experiment=base_enfr --workdir=/tmp/base_enfr

The base model of Table 3 on WMT14 en-fr (36M sentence pairs) with a 32,000 word-piece
vocabulary (paper 5.1). The paper reports only the big model on en-fr (41.0 BLEU, Table 2);
expect a few BLEU less from base.
"""

from t2t_jax.experiments import base


def get_config():
  config = base.get_config()
  config.data.pair = "fr-en"
  config.data.source_lang = "en"
  config.data.target_lang = "fr"
  config.data.vocab_size = 32000
  return config
