"""Sampling's maths: the distribution a token is drawn from (temperature, top-k, top-p),
the draw itself, and the keys that make a sentence's samples independent of its batch."""

import jax
import jax.numpy as jnp
from jax import lax
from jax.typing import ArrayLike

from t2t_jax.decoding.kernels import NEG_INF, argmax


def top_k_log_probs(log_probs: jax.Array, k: int | jax.Array) -> jax.Array:
  """log_probs [..., vocab] with every token below the k-th largest set to -inf (k <= 0 or
  k >= vocab: unchanged). Tokens equal to the k-th largest are kept, so a tie at the
  boundary keeps more than k; nothing is renormalised. `k` may be traced."""
  vocab = log_probs.shape[-1]
  ordered = -jnp.sort(-log_probs, axis=-1)  # descending
  index = jnp.clip(jnp.asarray(k, jnp.int32) - 1, 0, vocab - 1)
  kth = jnp.take_along_axis(ordered, jnp.broadcast_to(index, ordered.shape[:-1])[..., None], -1)
  keep = (log_probs >= kth) | (jnp.asarray(k) <= 0)
  return jnp.where(keep, log_probs, NEG_INF)


def top_p_log_probs(log_probs: jax.Array, p: float | jax.Array) -> jax.Array:
  """log_probs [..., vocab] (normalised) restricted to the nucleus: the most probable tokens
  whose probabilities first add up to at least p (Holtzman et al. 2020); the others get
  -inf, nothing is renormalised. A token is in the nucleus when the tokens more probable
  than it hold less than p; the most probable token always is, ties with the last token in
  are kept, and p >= 1 keeps everything (rounding in the sum cannot drop the tail). `p`
  may be traced."""
  ordered = -jnp.sort(-log_probs, axis=-1)
  probs = jnp.exp(ordered)
  before = jnp.cumsum(probs, axis=-1) - probs  # mass of the tokens ranked above each one
  inside = (before < p) | (jnp.arange(ordered.shape[-1]) == 0)
  last = jnp.min(jnp.where(inside, ordered, jnp.inf), axis=-1, keepdims=True)
  keep = (log_probs >= last) | (jnp.asarray(p) >= 1.0)
  return jnp.where(keep, log_probs, NEG_INF)


def sampling_log_probs(
  log_probs: jax.Array,
  temperature: float | jax.Array = 1.0,
  topk: int | jax.Array = 0,
  topp: float | jax.Array = 1.0,
) -> jax.Array:
  """The distribution a token is drawn from, as normalised log-probabilities [..., vocab]:
  the model's log_probs divided by `temperature` and renormalised, cut to the `topk` best
  and renormalised, then cut to the `topp` nucleus and renormalised (the order of
  fairseq's and Hugging Face's samplers: top-p is taken within the top-k).

  Each cut runs only when it removes something (`lax.cond` on the traced settings): both
  sort the vocabulary, which inside the sampling loop cost about 20 times the rest of a
  step on a CPU (docs/performance.md)."""
  tempered = jax.nn.log_softmax(log_probs / temperature, axis=-1)
  topk, topp = jnp.asarray(topk, jnp.int32), jnp.asarray(topp, jnp.float32)
  cut_k = (topk > 0) & (topk < log_probs.shape[-1])
  kept = lax.cond(
    cut_k, lambda x: jax.nn.log_softmax(top_k_log_probs(x, topk), axis=-1), lambda x: x, tempered
  )
  return lax.cond(
    topp < 1.0, lambda x: jax.nn.log_softmax(top_p_log_probs(x, topp), axis=-1), lambda x: x, kept
  )


def draw_tokens(keys: jax.Array, log_probs: jax.Array) -> jax.Array:
  """One token per row drawn from normalised log_probs [rows, vocab] by inverting the
  cumulative distribution with one uniform number per row (uint32 key data keys [rows, 2]):
  token = the first index whose cumulative probability exceeds u * total. Exact, like
  jax.random.categorical's Gumbel-max, which needs vocab random numbers per row: with a
  vocabulary of thousands, generating them was most of a sampling step on a CPU
  (docs/performance.md). A token of probability 0 is never drawn (its cumulative value
  equals its predecessor's), nor is one past the last token of nonzero probability."""
  probs = jnp.exp(log_probs.astype(jnp.float32))
  cumulative = jnp.cumsum(probs, axis=-1)
  u = jax.vmap(jax.random.uniform)(keys) * cumulative[:, -1]
  token = jnp.sum(cumulative <= u[:, None], axis=-1)
  vocab = log_probs.shape[-1]
  last = vocab - 1 - argmax(jnp.flip(probs > 0, axis=-1).astype(jnp.int32))
  return jnp.minimum(token, last).astype(jnp.int32)


def sample_keys(seed: int | jax.Array, sentence_ids: ArrayLike, num_samples: int) -> jax.Array:
  """One key per (sentence, sample): fold_in(fold_in(PRNGKey(seed), sentence id), sample),
  uint32 key data [len(sentence_ids) * num_samples, 2], sentence-major. A sentence's
  samples depend on its id (its index in the input) only, not on its batch or row."""
  root = jax.random.PRNGKey(seed)
  samples = jnp.arange(num_samples)

  def of_sentence(i: jax.Array) -> jax.Array:
    key = jax.random.fold_in(root, i)
    return jax.vmap(lambda j: jax.random.fold_in(key, j))(samples)

  keys = jax.vmap(of_sentence)(jnp.asarray(sentence_ids))
  return keys.reshape(-1, keys.shape[-1])
