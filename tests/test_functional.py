"""Pure functions (attention, masks, positional table) against float64 numpy references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t_jax.model import attention, masks, positional
from tests import numpy_reference as ref


def _rel_err(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-12)


@pytest.mark.parametrize("b,lq,lk,h,d", [(2, 5, 5, 4, 8), (3, 1, 7, 2, 16), (1, 9, 4, 8, 4)])
def test_attention_matches_numpy(b, lq, lk, h, d):
  rng = np.random.default_rng(b * 100 + lq)
  q, k, v = (
    rng.normal(size=s).astype(np.float32) for s in [(b, lq, h, d), (b, lk, h, d), (b, lk, h, d)]
  )
  mask = rng.random((b, 1, lq, lk)) < 0.7
  mask[0, 0, 0, :] = False  # a row with nothing to attend to
  want_out, want_w = ref.attention(q, k, v, mask)
  got_w = attention.attention_weights(q, k, mask)
  got = attention.dot_product_attention(q, k, v, mask)
  assert _rel_err(got_w, want_w) < 1e-5
  assert _rel_err(got, want_out) < 1e-5
  assert np.all(np.asarray(got)[0, 0] == 0.0)  # the empty row: zeros, not NaN
  # Unmasked too.
  assert _rel_err(attention.dot_product_attention(q, k, v), ref.attention(q, k, v)[0]) < 1e-5


def test_fused_path_matches_reference():
  rng = np.random.default_rng(0)
  b, lq, lk, h, d = 2, 6, 7, 4, 8
  q, k, v = (
    rng.normal(size=s).astype(np.float32) for s in [(b, lq, h, d), (b, lk, h, d), (b, lk, h, d)]
  )
  tokens_q = np.array([[5, 6, 7, 0, 0, 0], [5, 6, 7, 8, 9, 4]])
  tokens_k = np.array([[5, 6, 7, 8, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0]])  # 2nd row: no keys at all
  mask = masks.combine_masks(
    masks.padding_mask(tokens_q, tokens_k), masks.causal_mask(lk)[:, :, :lq]
  )
  want = attention.dot_product_attention(q, k, v, mask, implementation="reference")
  got = attention.dot_product_attention(q, k, v, mask, implementation="xla")
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(got, ref.attention(q, k, v, mask)[0], rtol=1e-5, atol=1e-6)
  with pytest.raises(ValueError, match="implementation"):
    attention.dot_product_attention(q, k, v, implementation="flash")


def test_attention_bf16_softmax_in_float32():
  rng = np.random.default_rng(1)
  q, k, v = (rng.normal(size=(2, 5, 2, 8)).astype(np.float32) for _ in range(3))
  w = attention.attention_weights(jnp.bfloat16(q), jnp.bfloat16(k))
  assert w.dtype == jnp.float32
  out = attention.dot_product_attention(jnp.bfloat16(q), jnp.bfloat16(k), jnp.bfloat16(v))
  assert out.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(out, np.float32), ref.attention(q, k, v)[0], atol=5e-2)


def test_attention_dropout():
  rng = np.random.default_rng(2)
  q, k, v = (rng.normal(size=(2, 4, 2, 8)).astype(np.float32) for _ in range(3))
  key = jax.random.PRNGKey(0)
  w = attention.attention_weights(q, k, dropout_rng=key, dropout_rate=0.5, deterministic=False)
  w0 = attention.attention_weights(q, k)
  kept = np.asarray(w) != 0
  assert 0 < kept.mean() < 1
  np.testing.assert_allclose(np.asarray(w)[kept], 2 * np.asarray(w0)[kept], rtol=1e-6)
  # deterministic ignores the rate
  np.testing.assert_array_equal(
    attention.attention_weights(q, k, dropout_rng=key, dropout_rate=0.5), w0
  )


def test_masks_match_loops():
  rng = np.random.default_rng(3)
  q_tok = rng.integers(0, 4, size=(3, 5))
  kv_tok = rng.integers(0, 4, size=(3, 7))
  q_seg = rng.integers(0, 3, size=(3, 5))
  kv_seg = rng.integers(0, 3, size=(3, 7))
  pad = np.asarray(masks.padding_mask(q_tok, kv_tok))
  seg = np.asarray(masks.segment_mask(q_seg, kv_seg))
  causal = np.asarray(masks.causal_mask(7))
  assert pad.shape == seg.shape == (3, 1, 5, 7) and causal.shape == (1, 1, 7, 7)
  for b in range(3):
    for i in range(5):
      for j in range(7):
        assert pad[b, 0, i, j] == (q_tok[b, i] != 0 and kv_tok[b, j] != 0)
        assert seg[b, 0, i, j] == (q_seg[b, i] == kv_seg[b, j])
  for i in range(7):
    for j in range(7):
      assert causal[0, 0, i, j] == (j <= i)
  both = np.asarray(masks.combine_masks(pad, None, seg))
  np.testing.assert_array_equal(both, pad & seg)
  assert masks.combine_masks(None, None) is None


@pytest.mark.parametrize("length,d_model", [(7, 4), (50, 32), (128, 512)])
def test_sinusoidal_matches_numpy(length, d_model):
  got = positional.sinusoidal(length, d_model)
  assert got.shape == (length, d_model) and got.dtype == jnp.float32
  want = ref.sinusoidal(length, d_model)
  assert np.max(np.abs(np.asarray(got, np.float64) - want)) < 1e-6  # values are in [-1, 1]


def test_sinusoidal_hand_points():
  pe = np.asarray(positional.sinusoidal(3, 8), np.float64)
  np.testing.assert_allclose(pe[1, 0], np.sin(1.0), rtol=1e-6)
  np.testing.assert_allclose(pe[1, 1], np.cos(1.0), rtol=1e-6)
  np.testing.assert_allclose(pe[0], [0, 1] * 4, atol=0)
  np.testing.assert_allclose(pe[2, 2], np.sin(2 / 10000 ** (2 / 8)), rtol=1e-6)
  np.testing.assert_allclose(pe[2, 7], np.cos(2 / 10000 ** (6 / 8)), rtol=1e-6)
  with pytest.raises(ValueError, match="even"):
    positional.sinusoidal(3, 7)


@pytest.mark.parametrize("k", [1, 5, 17])
def test_sinusoidal_relative_positions_are_linear(k):
  """PE(pos + k) = M_k PE(pos), M_k block-diagonal rotations by k * omega_i (paper 3.5)."""
  length, d_model = 64, 16
  pe = np.asarray(positional.sinusoidal(length + k, d_model), np.float64)
  omega = 10000.0 ** (-np.arange(0, d_model, 2) / d_model)
  m = np.zeros((d_model, d_model))
  for i, w in enumerate(omega):
    c, s = np.cos(k * w), np.sin(k * w)
    m[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = [[c, s], [-s, c]]
  for pos in range(length):
    np.testing.assert_allclose(m @ pe[pos], pe[pos + k], atol=2e-6)


@pytest.mark.parametrize(
  "x_shape,k_shape,n",
  [
    ((3, 5, 8), (8, 6), 1),  # FFN / Dense: [batch, length, d] x [d, f]
    ((3, 5, 8), (8, 2, 4), 1),  # query/key/value: [.., d] x [d, heads, d_k]
    ((3, 5, 2, 4), (2, 4, 8), 2),  # output: [.., heads, d_v] x [heads, d_v, d]
  ],
)
def test_flat_dot_general_values_and_gradients_match_numpy(x_shape, k_shape, n):
  from t2t_jax.model.layers import flat_dot_general

  rng = np.random.default_rng(3)
  x, k = rng.normal(size=x_shape), rng.normal(size=k_shape)
  out_shape = x_shape[: len(x_shape) - n] + k_shape[n:]
  c = rng.normal(size=out_shape)
  dims = ((tuple(range(len(x_shape) - n, len(x_shape))), tuple(range(n))), ((), ()))

  def f(x, k):
    return jnp.sum(flat_dot_general(x, k, dims) * c)

  x32, k32 = x.astype(np.float32), k.astype(np.float32)
  got = flat_dot_general(x32, k32, dims)
  m = int(np.prod(x_shape[: len(x_shape) - n]))
  kk = int(np.prod(k_shape[:n]))
  x2, k2, c2 = x.reshape(m, kk), k.reshape(kk, -1), c.reshape(m, -1)
  np.testing.assert_allclose(got, (x2 @ k2).reshape(out_shape), rtol=1e-5, atol=1e-5)
  dx, dk = jax.grad(f, argnums=(0, 1))(x32, k32)
  np.testing.assert_allclose(dx, (c2 @ k2.T).reshape(x_shape), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(dk, (x2.T @ c2).reshape(k_shape), rtol=1e-5, atol=1e-5)
  # anything else (here a batch dimension) is plain lax.dot_general
  batched = (((2,), (1,)), ((0,), (0,)))
  a = rng.normal(size=(3, 5, 8)).astype(np.float32)
  y = rng.normal(size=(3, 8, 4)).astype(np.float32)
  np.testing.assert_allclose(
    flat_dot_general(a, y, batched), jax.lax.dot_general(a, y, batched), rtol=1e-6
  )
  # forward mode works too (the why-self-attention path lengths use jvp)
  _, tangent = jax.jvp(lambda x: flat_dot_general(x, k32, dims), (x32,), (x32,))
  np.testing.assert_allclose(tangent, got, rtol=1e-5, atol=1e-5)
  dk_in = rng.normal(size=k_shape)
  _, tangent = jax.jvp(
    lambda x, k: flat_dot_general(x, k, dims), (x32, k32), (x32, dk_in.astype(np.float32))
  )
  expected = x2 @ k2 + x2 @ dk_in.reshape(kk, -1)
  np.testing.assert_allclose(tangent, expected.reshape(out_shape), rtol=1e-5, atol=1e-5)
