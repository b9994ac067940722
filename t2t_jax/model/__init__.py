"""The paper's network: pure functions (attention, masks, positions, dropout) composed into
Flax modules (layers) and the encoder-decoder Transformer (transformer), configured by the
frozen TransformerConfig (config).

`t2t_jax.model.Transformer` and `t2t_jax.model.TransformerConfig` are the public entry points.
"""

from t2t_jax.model.config import TransformerConfig
from t2t_jax.model.transformer import (
  Decoder,
  Encoder,
  OutputLayer,
  Transformer,
  beam_search_cache,
  decoding_params,
  map_self_attention_cache,
  pad_memory,
  shift_right,
)

__all__ = [
  "Decoder",
  "Encoder",
  "OutputLayer",
  "Transformer",
  "TransformerConfig",
  "beam_search_cache",
  "decoding_params",
  "map_self_attention_cache",
  "pad_memory",
  "shift_right",
]
