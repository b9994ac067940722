"""Attention masks built from token ids and segment ids (pure functions).

Every mask is boolean and broadcastable to `[batch, heads, q_len, kv_len]`; True means
"this query position may attend to this key position". Masks are merged with
`combine_masks`, and `t2t_jax.model.attention` turns them into -inf logits.
"""

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from t2t_jax.tokens import PAD_ID


def padding_mask(q_tokens: ArrayLike, kv_tokens: ArrayLike, pad_id: int = PAD_ID) -> jax.Array:
  """Masks out padded queries and keys.

  Args:
    q_tokens: int [batch, q_len].
    kv_tokens: int [batch, kv_len].
    pad_id: the padding token id.

  Returns:
    bool [batch, 1, q_len, kv_len].
  """
  q_valid = jnp.asarray(q_tokens) != pad_id
  kv_valid = jnp.asarray(kv_tokens) != pad_id
  return q_valid[:, None, :, None] & kv_valid[:, None, None, :]


def causal_mask(length: int) -> jax.Array:
  """Lets position i attend to positions <= i (paper 3.2.3): bool [1, 1, length, length]."""
  idx = jnp.arange(length)
  return (idx[:, None] >= idx[None, :])[None, None]


def segment_mask(q_segments: ArrayLike, kv_segments: ArrayLike) -> jax.Array:
  """Keeps packed sequences apart: a query sees only keys of its own segment.

  Args:
    q_segments: int [batch, q_len] segment ids (1, 2, ... per packed pair; 0 on padding).
    kv_segments: int [batch, kv_len].

  Returns:
    bool [batch, 1, q_len, kv_len].
  """
  q_segments = jnp.asarray(q_segments)
  kv_segments = jnp.asarray(kv_segments)
  return q_segments[:, None, :, None] == kv_segments[:, None, None, :]


def combine_masks(*masks: jax.Array | None) -> jax.Array | None:
  """Logical AND of the given masks, skipping None; None when all are None."""
  masks = [m for m in masks if m is not None]
  if not masks:
    return None
  out = masks[0].astype(bool)
  for m in masks[1:]:
    out = out & m.astype(bool)
  return out
