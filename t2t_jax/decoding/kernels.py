"""Reductions over the vocabulary that every search step runs, written for XLA:CPU: the
first maximum (greedy's argmax), the k best non-EOS logits (beam search's candidates) and
log-softmax values of the few logits a search keeps.

XLA:CPU lowers `jnp.argmax` and `lax.top_k` over a whole [rows, vocab] row to reductions
that do not vectorize; these take one pass of per-chunk maxima (`chunk_maxima`) and then
look inside the few chunks that can hold the answer. Each returns what the jnp/lax
function it replaces returns, ties included (tests/test_decode.py)."""

import jax
import jax.numpy as jnp
from jax import lax

NEG_INF = float("-inf")


def argmax(x: jax.Array, axis: int = -1) -> jax.Array:
  """`jnp.argmax` (the first index of the maximum) without the variadic (value, index)
  reduce XLA:CPU lowers jnp.argmax to, which does not vectorize; greedy decoding takes one
  per step. Along a vocabulary-sized axis in chunks (`first_max_index`); else max, then
  the smallest matching index. A NaN counts as a maximum, but XLA:CPU's max reductions may
  skip NaNs, so a row holding one gets the index of a NaN or of its largest number."""
  axis = axis % x.ndim
  if chunked(x.shape[axis]):
    return first_max_index(jnp.moveaxis(x, axis, -1))
  top = jnp.max(x, axis=axis, keepdims=True)
  index = lax.broadcasted_iota(jnp.int32, x.shape, axis)
  hit = (x == top) | jnp.isnan(x)
  return jnp.min(jnp.where(hit, index, x.shape[axis]), axis=axis)


def chunked(size: int) -> bool:
  """Whether an axis of `size` is taken in chunks: at least 4 of them, dividing it."""
  chunk = chunk_size(size)
  return size % chunk == 0 and size >= 4 * chunk


def chunk_maxima(x: jax.Array, chunk: int | None = None) -> jax.Array:
  """[..., vocab] -> [..., ceil(vocab / chunk)]: the maximum of each chunk (default
  `chunk_size`), read from x in place where the chunk divides vocab (a short last chunk is
  reduced on its own)."""
  vocab = x.shape[-1]
  chunk = chunk or chunk_size(vocab)
  full = vocab // chunk
  maxima = jnp.max(x[..., : full * chunk].reshape(x.shape[:-1] + (full, chunk)), axis=-1)
  if full * chunk < vocab:
    maxima = jnp.concatenate([maxima, jnp.max(x[..., full * chunk :], axis=-1, keepdims=True)], -1)
  return maxima


def max_of_chunks(maxima: jax.Array) -> jax.Array:
  """[..., chunks] chunk maxima -> [...] the row maximum. The barrier keeps XLA from folding
  this into a second full pass over the row."""
  return jnp.max(lax.optimization_barrier(maxima), axis=-1)


def row_max(x: jax.Array) -> jax.Array:
  """[..., vocab] -> [...]: the maximum, over the chunk maxima where the axis is taken in
  chunks (`first_max_index` takes the same, so XLA computes them once for both)."""
  if not chunked(x.shape[-1]):
    return jnp.max(x, axis=-1)
  return max_of_chunks(chunk_maxima(x))


def first_max_index(x: jax.Array) -> jax.Array:
  """argmax over the last axis in one pass over x: the chunk maxima give the row maximum
  and the first chunk holding it (or a NaN); the index is then found in that chunk alone,
  gathered [..., chunk]. First chunk, then first index in it: the first index overall.
  Max-then-min-index reads x twice and writes an int32 copy of it in between."""
  maxima = chunk_maxima(x)
  top = max_of_chunks(maxima)[..., None]
  chunks = maxima.shape[-1]
  first = lax.broadcasted_iota(jnp.int32, maxima.shape, maxima.ndim - 1)
  first = jnp.min(jnp.where((maxima == top) | jnp.isnan(maxima), first, chunks), axis=-1)
  blocks = x.reshape(x.shape[:-1] + (chunks, -1))
  block = jnp.take_along_axis(blocks, first[..., None, None], axis=-2)[..., 0, :]
  inside = lax.broadcasted_iota(jnp.int32, block.shape, block.ndim - 1)
  hit = (block == top) | jnp.isnan(block)
  return first * block.shape[-1] + jnp.min(jnp.where(hit, inside, block.shape[-1]), axis=-1)


def chunk_size(vocab: int, near: int = 128) -> int:
  """A divisor of `vocab` in [near / 2, 2 * near] closest to `near` (then the chunk maxima
  read the logits in place; a short last chunk makes XLA copy the rest), else `near`."""
  divisors = [c for c in range(near // 2, 2 * near + 1) if vocab % c == 0]
  return min(divisors, key=lambda c: abs(c - near)) if divisors else near


def top_tokens(
  rows: jax.Array, k: int, eos_id: int, chunk: int | None = None
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Each row's k largest logits other than EOS, and the row's maximum (EOS included).

  rows float32 [R, vocab] -> (values [R, k], tokens int32 [R, k], row_max [R]); values and
  tokens are what lax.top_k gives on the rows with EOS set to -inf (best first, lower index
  first on ties), with far less work than XLA's TopK over the whole vocabulary: the top k
  elements lie in the k chunks with the largest maxima (an element of the top k whose chunk
  is not among them would have k better chunk maxima above it; equal maxima order chunks by
  index, as equal elements are ordered). So one max-reduction per chunk, a top_k over the
  chunk maxima, and a top_k over the k chosen chunks, gathered in index order so that ties
  still go to the lower index. The chunk maxima are taken over the logits as they are
  (XLA:CPU's fast reductions read their input from memory, so a masked copy would be
  written first), which also gives the row maximum; only the maximum of EOS's own chunk is
  then taken again without EOS.
  """
  vocab = rows.shape[-1]
  chunk = chunk or chunk_size(vocab)
  if 4 * k * chunk > vocab:
    masked = jnp.where(jnp.arange(vocab) != eos_id, rows, NEG_INF)
    values, tokens = lax.top_k(masked, k)
    return values, tokens.astype(jnp.int32), jnp.max(rows, axis=-1)
  maxima = chunk_maxima(rows, chunk)
  row_max = max_of_chunks(maxima)
  start = eos_id // chunk * chunk
  eos_chunk = rows[:, start : start + chunk]
  eos_chunk = jnp.where(
    jnp.arange(start, start + eos_chunk.shape[-1]) != eos_id, eos_chunk, NEG_INF
  )
  maxima = jnp.where(
    jnp.arange(maxima.shape[-1]) == eos_id // chunk, jnp.max(eos_chunk, -1)[:, None], maxima
  )
  _, chunks = lax.top_k(maxima, k)
  chunks = jnp.sort(chunks, axis=-1)
  index = (chunks[..., None] * chunk + jnp.arange(chunk)).reshape(-1, k * chunk)
  values = jnp.take_along_axis(rows, jnp.minimum(index, vocab - 1), axis=-1)
  values = jnp.where((index < vocab) & (index != eos_id), values, NEG_INF)
  top_values, top = lax.top_k(values, k)
  return top_values, jnp.take_along_axis(index, top, axis=-1).astype(jnp.int32), row_max


def log_probs_of(logits: jax.Array, row_max: jax.Array, log_normalizer: jax.Array) -> jax.Array:
  """log-softmax values of some of a row's logits, computed as jax.nn.log_softmax computes
  them: (l - max) - log(sum(exp(l - max))). logits [R, j]; row_max, log_normalizer [R]."""
  return (logits - row_max[:, None]) - log_normalizer[:, None]
