"""Arrays of hypotheses: the pytree helpers that add, flatten and gather a beam dimension,
and the token writes of a step. Scalar leaves (a shared step index) pass through untouched.
"""

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.typing import ArrayLike

PyTree = Any  # arrays in nested tuples/lists/dicts/NamedTuples, as jax.tree_util sees them


def map_nonscalar(fn: Callable[[jax.Array], jax.Array], tree: PyTree) -> PyTree:
  return jax.tree_util.tree_map(lambda x: x if jnp.ndim(x) == 0 else fn(x), tree)


def add_beam_dim(tree: PyTree, beam_size: int) -> PyTree:
  """[batch, ...] -> [batch, beam, ...], each sentence repeated beam_size times."""

  def add(x: ArrayLike) -> jax.Array:
    x = jnp.asarray(x)
    return jnp.broadcast_to(x[:, None], (x.shape[0], beam_size) + x.shape[1:])

  return map_nonscalar(add, tree)


def flatten_beam_dim(tree: PyTree) -> PyTree:
  """[batch, beam, ...] -> [batch * beam, ...]: the layout `tokens_to_logits` sees."""
  return map_nonscalar(lambda x: x.reshape((-1,) + x.shape[2:]), tree)


def unflatten_beam_dim(tree: PyTree, batch_size: int) -> PyTree:
  """[batch * beam, ...] -> [batch, beam, ...]."""
  return map_nonscalar(lambda x: x.reshape((batch_size, -1) + x.shape[1:]), tree)


def gather_beams(tree: PyTree, beam_indices: jax.Array) -> PyTree:
  """Picks beams per sentence: leaves [batch, old_beam, ...] -> [batch, new_beam, ...].

  `beam_indices` is int [batch, new_beam] into the old beam dimension.
  """
  batch_indices = jnp.arange(beam_indices.shape[0])[:, None]
  return map_nonscalar(lambda x: x[batch_indices, beam_indices], tree)


def write_tokens(seqs: jax.Array, step: jax.Array, tokens: jax.Array) -> jax.Array:
  """seqs int32 [batch, beam, max_decode_len] with `tokens` [batch, beam] written at `step`."""
  return lax.dynamic_update_slice_in_dim(seqs, tokens[..., None].astype(seqs.dtype), step, axis=2)


def last_tokens(seqs: jax.Array, step: jax.Array, bos_id: int) -> jax.Array:
  """Input of this step: BOS at step 0, else the token written at step - 1. [...] int32."""
  prev = lax.dynamic_index_in_dim(seqs, jnp.maximum(step - 1, 0), axis=-1, keepdims=False)
  return jnp.where(step == 0, jnp.asarray(bos_id, seqs.dtype), prev)


def resize_positions(x: jax.Array, length: int, axis: int = -1) -> jax.Array:
  """x with its `axis` cut or zero-padded to `length`."""
  axis = axis % x.ndim
  if x.shape[axis] >= length:
    return lax.slice_in_dim(x, 0, length, axis=axis)
  pad = [(0, 0)] * x.ndim
  pad[axis] = (0, length - x.shape[axis])
  return jnp.pad(x, pad)


def materialized(tree: PyTree) -> PyTree:
  """A while loop's initial state, computed once before the loop.

  Without the barrier XLA may sink cheap ops on loop-invariant leaves into the loop body
  (e.g. the transpose that puts the encoder keys/values into the cache layout), where they
  run at every step.
  """
  return lax.optimization_barrier(tree)
