"""Scaled dot-product attention (paper eq. 1) as pure functions.

Shapes follow `[batch, length, heads, head_dim]` for q/k/v, and boolean masks broadcastable
to `[batch, heads, q_len, kv_len]` (True = may attend). Two paths compute the same thing:
`reference` (explicit einsums, returns weights too, supports attention dropout) and
`jax.nn.dot_product_attention` (`xla`, or `cudnn` flash attention on NVIDIA GPUs).
"""

import jax
import jax.numpy as jnp

from t2t_jax.model import dropout

IMPLEMENTATIONS = ("reference", "xla", "cudnn")


def attention_weights(
  query: jax.Array,
  key: jax.Array,
  mask: jax.Array | None = None,
  *,
  dropout_rng: jax.Array | None = None,
  dropout_rate: float = 0.0,
  deterministic: bool = True,
) -> jax.Array:
  """softmax(Q K^T / sqrt(d_k)) with masking, in float32.

  Args:
    query: [batch, q_len, heads, head_dim].
    key: [batch, kv_len, heads, head_dim].
    mask: bool, broadcastable to [batch, heads, q_len, kv_len], or None.
    dropout_rng: PRNG key for attention dropout (needed when dropout is active).
    dropout_rate: probability of dropping an attention weight.
    deterministic: disables dropout.

  Returns:
    float32 [batch, heads, q_len, kv_len]. A query row whose keys are all masked gets
    all-zero weights (not a uniform or NaN row), so padding never leaks.
  """
  depth = query.shape[-1]
  # Scaling q before the product keeps bf16 logits in range; float32 accumulation and
  # softmax even for bf16 inputs (the softmax is where bf16 loses accuracy).
  query = query / jnp.sqrt(depth).astype(query.dtype)
  logits = jnp.einsum("bqhd,bkhd->bhqk", query, key, preferred_element_type=jnp.float32)
  if mask is not None:
    logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
  weights = jax.nn.softmax(logits, axis=-1)
  if mask is not None:
    weights = jnp.where(mask, weights, 0.0)
  if not deterministic and dropout_rate > 0.0:
    weights = dropout.dropout(dropout_rng, weights, dropout_rate)
  return weights


def dot_product_attention(
  query: jax.Array,
  key: jax.Array,
  value: jax.Array,
  mask: jax.Array | None = None,
  *,
  dropout_rng: jax.Array | None = None,
  dropout_rate: float = 0.0,
  deterministic: bool = True,
  implementation: str = "reference",
) -> jax.Array:
  """Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V, per head.

  Args:
    query: [batch, q_len, heads, head_dim].
    key, value: [batch, kv_len, heads, head_dim].
    mask: bool broadcastable to [batch, heads, q_len, kv_len] (True = may attend), or None.
    dropout_rng, dropout_rate, deterministic: attention dropout (reference path only; the
      fused paths fall back to the reference path while dropout is active).
    implementation: 'reference', 'xla' or 'cudnn' (the latter two via
      `jax.nn.dot_product_attention`).

  Returns:
    [batch, q_len, heads, head_dim] in value's dtype; rows with nothing to attend to are 0.
  """
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(
      f"attention implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}"
    )
  dropout_active = not deterministic and dropout_rate > 0.0
  if implementation == "reference" or dropout_active:
    weights = attention_weights(
      query,
      key,
      mask,
      dropout_rng=dropout_rng,
      dropout_rate=dropout_rate,
      deterministic=deterministic,
    )
    out = jnp.einsum(
      "bhqk,bkhd->bqhd", weights.astype(value.dtype), value, preferred_element_type=jnp.float32
    )
    return out.astype(value.dtype)
  return _fused_attention(query, key, value, mask, implementation)


def _fused_attention(
  query: jax.Array,
  key: jax.Array,
  value: jax.Array,
  mask: jax.Array | None,
  implementation: str,
) -> jax.Array:
  """jax.nn.dot_product_attention, with fully-masked query rows zeroed like the reference."""
  if mask is not None:
    batch, q_len, heads, _ = query.shape
    mask = jnp.broadcast_to(mask, (mask.shape[0], mask.shape[1], q_len, key.shape[1]))
  out = jax.nn.dot_product_attention(query, key, value, mask=mask, implementation=implementation)
  if mask is not None:
    # jax gives such rows a uniform average of the values; the reference gives zeros.
    has_key = jnp.any(mask, axis=-1)  # [b or 1, h or 1, q_len]
    out = out * jnp.transpose(has_key, (0, 2, 1))[..., None].astype(out.dtype)
  return out
