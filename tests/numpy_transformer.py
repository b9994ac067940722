"""The Transformer forward pass (Vaswani et al. 2017, sections 3.1-3.5) in float64 numpy.

Written from the paper as a reference for the Flax model; only the parameter names and
layouts follow `t2t_jax.model` (kernels [in, ...out], attention projections per head as
[d_model, h, d] and W^O as [h, d_v, d_model], no key bias, LayerNorm epsilon 1e-6).

Conventions: ids are int [batch, length] with 0 = pad and right padding; the decoder input
is the target shifted right with BOS (id 2) in front; a key position whose token is pad is
never attended. Outputs at pad positions are whatever the maths gives and carry no meaning.
"""

from collections.abc import Mapping

import numpy as np

from tests.numpy_reference import sinusoidal

PAD_ID = 0
BOS_ID = 2
LAYER_NORM_EPS = 1e-6


def to_float64(params):
  """A params pytree (nested mappings of arrays) as nested dicts of float64 numpy arrays."""
  if isinstance(params, Mapping):
    return {k: to_float64(v) for k, v in params.items()}
  return np.asarray(params, np.float64)


def layer_norm(x, p):
  """(x - mean) / sqrt(var + eps) * scale + bias over the last axis (Ba et al. 2016)."""
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + LAYER_NORM_EPS) * p["scale"] + p["bias"]


def scaled_dot_product_attention(q, k, v, allowed):
  """Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V (eq. 1), per head.

  q [b, lq, h, d_k], k [b, lk, h, d_k], v [b, lk, h, d_v], allowed bool broadcastable to
  [b, h, lq, lk]. A query with no allowed key gets zero weights.
  Returns (out [b, lq, h, d_v], weights [b, h, lq, lk]).
  """
  d_k = q.shape[-1]
  scores = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(d_k)
  allowed = np.broadcast_to(allowed, scores.shape)
  top = np.where(allowed, scores, -np.inf).max(-1, keepdims=True)
  top = np.where(np.isfinite(top), top, 0.0)
  e = np.where(allowed, np.exp(scores - top), 0.0)
  total = e.sum(-1, keepdims=True)
  weights = e / np.where(total > 0, total, 1.0)
  return np.einsum("bhqk,bkhd->bqhd", weights, v), weights


def _project(x, p):
  """x [b, l, d_model] through one per-head projection W [d_model, h, d] (+ b [h, d])."""
  y = np.einsum("bld,dhe->blhe", x, p["kernel"])
  return y + p["bias"] if "bias" in p else y


def multi_head_attention(p, x_q, x_kv, allowed):
  """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O, head_i = Attention(Q W^Q_i, K W^K_i,
  V W^V_i) (section 3.2.2). x_q [b, lq, d_model], x_kv [b, lk, d_model], allowed bool
  [b, lq, lk] -> [b, lq, d_model]."""
  q = _project(x_q, p["query"])
  k = _project(x_kv, p["key"])
  v = _project(x_kv, p["value"])
  heads, _ = scaled_dot_product_attention(q, k, v, allowed[:, None])
  # Concatenating the heads then multiplying by W^O [h * d_v, d_model] is this contraction.
  return np.einsum("bqhe,hed->bqd", heads, p["out"]["kernel"]) + p["out"]["bias"]


def feed_forward(p, x):
  """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2 (eq. 2)."""
  hidden = np.maximum(0.0, x @ p["wi"]["kernel"] + p["wi"]["bias"])
  return hidden @ p["wo"]["kernel"] + p["wo"]["bias"]


def sublayer(norm, x, fn, norm_params):
  """'post': LayerNorm(x + Sublayer(x)) (section 3.1); 'pre': x + Sublayer(LayerNorm(x))."""
  if norm == "pre":
    return x + fn(layer_norm(x, norm_params))
  if norm == "post":
    return layer_norm(x + fn(x), norm_params)
  raise ValueError(f"norm must be 'pre' or 'post', got {norm!r}")


def embed(ids, embedding, position_table):
  """Embedding times sqrt(d_model) (section 3.4) plus the position encoding (3.5)."""
  d_model = embedding.shape[1]
  return embedding[ids] * np.sqrt(d_model) + position_table[: ids.shape[1]]


def _positions(params, positional, length, d_model):
  if positional == "sinusoidal":
    return sinusoidal(length, d_model)
  if positional == "learned":
    return params["positions"]["position_embedding"]
  raise ValueError(f"positional must be 'sinusoidal' or 'learned', got {positional!r}")


def _embeddings(params, share_embeddings):
  """(source embedding, target embedding) [vocab, d_model]; one matrix when shared (3.4)."""
  if share_embeddings:
    return params["embed"]["embedding"], params["embed"]["embedding"]
  return params["source_embed"]["embedding"], params["target_embed"]["embedding"]


def shift_right(targets):
  """Decoder input: BOS, then the targets without their last position."""
  bos = np.full((targets.shape[0], 1), BOS_ID, targets.dtype)
  return np.concatenate([bos, targets[:, :-1]], axis=1)


def encode(params, config, inputs):
  """inputs int [b, ls] -> encoder output [b, ls, d_model] (section 3.1, left half of fig. 1).

  `config` needs norm, positional, share_embeddings and encoder_layers; `params` is the
  whole model's (float64, see `to_float64`).
  """
  p = params["encoder"]
  source_embedding, _ = _embeddings(params, config.share_embeddings)
  d_model = source_embedding.shape[1]
  x = embed(inputs, source_embedding, _positions(p, config.positional, inputs.shape[1], d_model))
  allowed = np.broadcast_to((inputs != PAD_ID)[:, None, :], inputs.shape + inputs.shape[1:])
  for i in range(config.encoder_layers):
    layer = p[f"layer_{i}"]
    attend = lambda y, layer=layer: multi_head_attention(layer["self_attention"], y, y, allowed)
    x = sublayer(config.norm, x, attend, layer["norm_attention"])
    ffn = lambda y, layer=layer: feed_forward(layer["ffn"], y)
    x = sublayer(config.norm, x, ffn, layer["norm_ffn"])
  if config.norm == "pre":
    # Pre-norm leaves the residual stream unnormalised; the stack output needs a LayerNorm.
    x = layer_norm(x, p["final_norm"])
  return x


def decode(params, config, encoded, inputs, targets):
  """Teacher-forced decoder: logits [b, lt, vocab], position t predicting targets[:, t].

  Masked self-attention lets position t see positions <= t (3.2.3) whose targets are not
  pad; encoder-decoder attention sees the non-pad source positions.
  """
  p = params["decoder"]
  _, target_embedding = _embeddings(params, config.share_embeddings)
  d_model = target_embedding.shape[1]
  length = targets.shape[1]
  y = embed(
    shift_right(targets), target_embedding, _positions(p, config.positional, length, d_model)
  )
  causal = np.tril(np.ones((length, length), bool))
  self_allowed = causal[None] & (targets != PAD_ID)[:, None, :]
  cross_allowed = np.broadcast_to(
    (inputs != PAD_ID)[:, None, :], (inputs.shape[0], length, inputs.shape[1])
  )
  for i in range(config.decoder_layers):
    layer = p[f"layer_{i}"]
    self_attend = lambda z, layer=layer: multi_head_attention(
      layer["self_attention"], z, z, self_allowed
    )
    y = sublayer(config.norm, y, self_attend, layer["norm_self_attention"])
    cross_attend = lambda z, layer=layer: multi_head_attention(
      layer["cross_attention"], z, encoded, cross_allowed
    )
    y = sublayer(config.norm, y, cross_attend, layer["norm_cross_attention"])
    ffn = lambda z, layer=layer: feed_forward(layer["ffn"], z)
    y = sublayer(config.norm, y, ffn, layer["norm_ffn"])
  if config.norm == "pre":
    y = layer_norm(y, p["final_norm"])
  if config.share_embeddings:
    # The pre-softmax layer is the embedding matrix itself (3.4), without a bias.
    return y @ target_embedding.T
  return y @ p["logits"]["kernel"] + p["logits"]["bias"]


def transformer(params, config, inputs, targets):
  """(logits [b, lt, vocab], encoder output [b, ls, d_model]) for source ids `inputs` and
  target ids `targets` (both int, 0 = pad, right-padded)."""
  inputs, targets = np.asarray(inputs), np.asarray(targets)
  encoded = encode(params, config, inputs)
  return decode(params, config, encoded, inputs, targets), encoded
