"""Every layer's and head's attention for one sentence pair, teacher-forced: what a
notebook draws (`Translator.attention_weights`)."""

from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np
from flax.typing import VariableDict

from t2t_jax.data.tokenizer import Tokenizer
from t2t_jax.model import Transformer
from t2t_jax.tokens import EOS_ID


def attention_weights(
  model: Transformer,
  params: VariableDict,
  tokenizer: Tokenizer,
  source_ids: Sequence[int],
  target: str,
) -> dict[str, np.ndarray | list[str]]:
  """{'encoder_self': [layers, heads, src, src], 'decoder_self': [layers, heads, tgt, tgt],
  'cross': [layers, heads, tgt, src]} as numpy, plus the 'source_tokens' and
  'target_tokens' (subword strings, EOS included) that label the axes; `source_ids` with
  EOS, `target` as text."""
  tgt = list(tokenizer.encode(target)) + [EOS_ID]
  inputs, targets = jnp.array([list(source_ids)]), jnp.array([tgt])
  _, state = model.apply({"params": params}, inputs, targets, mutable=["intermediates"])
  inter = state["intermediates"]
  stack = lambda part, layers, kind: np.stack(
    [np.asarray(inter[part][f"layer_{i}"][kind]["attention_weights"][0][0]) for i in range(layers)]
  )
  cfg = model.config
  return dict(
    encoder_self=stack("encoder", cfg.encoder_layers, "self_attention"),
    decoder_self=stack("decoder", cfg.decoder_layers, "self_attention"),
    cross=stack("decoder", cfg.decoder_layers, "cross_attention"),
    source_tokens=pieces(tokenizer, source_ids),
    target_tokens=pieces(tokenizer, tgt),
  )


def pieces(tokenizer: Tokenizer, ids: Sequence[int]) -> list[str]:
  """Each id as its subword string (EOS: '</s>')."""
  piece = getattr(tokenizer, "id_to_piece", None)
  if piece is not None:
    return [piece(i) for i in ids]
  return [tokenizer.decode([i]) if i != EOS_ID else "</s>" for i in ids]
