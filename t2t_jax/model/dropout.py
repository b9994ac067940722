"""Inverted dropout (paper 5.4) from 16 random bits per decision.

`jax.random.bernoulli`, which flax's `nn.Dropout` uses, spends one whole Threefry-2x32 hash
(64 bits) on every element under JAX's default partitionable Threefry. Here each hash gives
four 16-bit draws, a quarter of the hashing (docs/performance.md has the timings). An
element is dropped when its draw is below round(rate * 65536), so the drop probability is
rate to within 2^-17 (0.1 -> 0.100006), and the kept values are scaled by
65536 / (65536 - threshold), which makes the expected output exactly x for that
probability.
"""

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax.extend.random import threefry_2x32

RESOLUTION = 1 << 16


def threshold(rate: float) -> int:
  """Draws below this (of 0..65535) drop their element."""
  if not 0.0 <= rate <= 1.0:
    raise ValueError(f"dropout rate {rate} must be in [0, 1]")
  return int(round(rate * RESOLUTION))


def random_bits16(rng: jax.Array, shape: Sequence[int]) -> jax.Array:
  """uint32 array of `shape` holding independent uniform draws from 0..65535.

  ceil(n / 2) words from `threefry_2x32` (one hash per two words); element i takes
  the low half of word i
  and element ceil(n / 2) + i the high half. A non-Threefry key (rbg) falls back to
  `jax.random.bits`.
  """
  n = math.prod(shape)
  key = rng
  if jnp.issubdtype(rng.dtype, jax.dtypes.prng_key):
    key = jax.random.key_data(rng) if str(jax.random.key_impl(rng)) == "threefry2x32" else None
  if key is None or key.shape != (2,):  # another implementation (typed, or a raw key)
    return jax.random.bits(rng, shape, jnp.uint16).astype(jnp.uint32)
  half = (n + 1) // 2
  if half >= 1 << 32:
    raise ValueError(f"dropout over {n} elements: at most 2^33 per call")
  words = threefry_2x32((key[0], key[1]), jax.lax.iota(jnp.uint32, half))
  bits = jnp.concatenate([words & 0xFFFF, words >> 16])
  return bits[:n].reshape(shape)


def dropout(rng: jax.Array, x: jax.Array, rate: float) -> jax.Array:
  """x with each element dropped (0) at probability `rate`, the rest scaled up to keep the
  expectation (inverted dropout). rate 0 returns x, rate 1 zeros."""
  cut = threshold(rate)
  if cut == 0:
    return x
  if cut >= RESOLUTION:
    return jnp.zeros_like(x)
  keep = random_bits16(rng, x.shape) >= cut
  scale = jnp.asarray(RESOLUTION / (RESOLUTION - cut), x.dtype)
  return jnp.where(keep, x * scale, jnp.zeros((), x.dtype))
