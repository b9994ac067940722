"""Dropout from 16-bit draws: exact values, drop frequency, independence, determinism."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.random import threefry_2x32

from t2t_jax.model import dropout
from t2t_jax.model.layers import Dropout


@pytest.mark.parametrize("shape", [(7,), (3, 5, 8), (1, 1)])
def test_bits_are_both_halves_of_threefry_words(shape):
  key = jax.random.PRNGKey(3)
  n = int(np.prod(shape))
  words = np.asarray(
    threefry_2x32((key[0], key[1]), jnp.arange((n + 1) // 2, dtype=jnp.uint32)), np.uint64
  )
  expected = np.concatenate([words & 0xFFFF, words >> 16])[:n].reshape(shape)
  got = np.asarray(dropout.random_bits16(key, shape))
  np.testing.assert_array_equal(got, expected)
  # a typed key gives the same draws
  np.testing.assert_array_equal(
    np.asarray(dropout.random_bits16(jax.random.wrap_key_data(key), shape)), expected
  )


def test_draws_are_uniform_and_independent():
  bits = np.asarray(dropout.random_bits16(jax.random.PRNGKey(0), (1 << 20,)), np.float64)
  assert bits.min() >= 0 and bits.max() <= 65535
  counts = np.bincount((bits // 256).astype(int), minlength=256)  # 256 bins of 4096 expected
  chi2 = np.sum((counts - 4096.0) ** 2 / 4096.0)
  assert chi2 < 255 + 6 * np.sqrt(2 * 255), chi2  # 6 sigma of chi2(255)
  low, high = bits[: 1 << 19], bits[1 << 19 :]  # halves of the same words
  for a, b in ((low, high), (bits[:-1], bits[1:])):
    assert abs(np.corrcoef(a, b)[0, 1]) < 6 / np.sqrt(a.size)


@pytest.mark.parametrize("rate", [0.1, 0.3])
def test_dropout_values_and_drop_frequency(rate):
  key = jax.random.PRNGKey(1)
  x = np.random.default_rng(0).normal(size=(256, 64, 32)).astype(np.float32)
  y = np.asarray(jax.jit(dropout.dropout, static_argnums=2)(key, x, rate))
  bits = np.asarray(dropout.random_bits16(key, x.shape))
  cut = round(rate * 65536)
  kept = bits >= cut
  # float64 reference from the definition
  expected = np.where(kept, x.astype(np.float64) * 65536 / (65536 - cut), 0.0)
  np.testing.assert_allclose(y, expected, rtol=1e-6)
  n, p = x.size, cut / 65536
  assert abs(p - rate) < 2**-17
  assert abs((~kept).sum() - n * p) < 6 * np.sqrt(n * p * (1 - p))
  # unbiased: the scale undoes the quantized keep probability exactly
  assert (65536 / (65536 - cut)) * (1 - p) == pytest.approx(1.0, abs=1e-15)


def test_dropout_edges_and_determinism():
  x = jnp.ones((4, 5))
  key = jax.random.PRNGKey(2)
  assert dropout.dropout(key, x, 0.0) is x
  np.testing.assert_array_equal(dropout.dropout(key, x, 1.0), np.zeros((4, 5)))
  with pytest.raises(ValueError, match="rate 1.5"):
    dropout.dropout(key, x, 1.5)
  a, b = dropout.dropout(key, x, 0.5), dropout.dropout(key, x, 0.5)
  np.testing.assert_array_equal(a, b)
  c = dropout.dropout(jax.random.PRNGKey(5), x, 0.5)
  assert not np.array_equal(np.asarray(a), np.asarray(c))
  # another key implementation falls back to jax.random.bits and still drops
  rbg = jax.random.key(0, impl="rbg")
  y = np.asarray(dropout.dropout(rbg, jnp.ones((100, 100)), 0.5))
  assert 0.4 < np.mean(y == 0) < 0.6 and set(np.unique(y)) <= {0.0, 2.0}


def test_dropout_module_uses_the_dropout_rng_and_is_off_when_deterministic():
  x = jnp.ones((8, 16))
  module = Dropout(0.25)
  np.testing.assert_array_equal(module.apply({}, x, True), x)
  y1 = module.apply({}, x, False, rngs={"dropout": jax.random.PRNGKey(0)})
  y2 = module.apply({}, x, False, rngs={"dropout": jax.random.PRNGKey(1)})
  assert set(np.unique(np.asarray(y1))) == {0.0, np.float32(4 / 3)}
  assert not np.array_equal(np.asarray(y1), np.asarray(y2))
