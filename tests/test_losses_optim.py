"""Losses against float64 numpy; the paper's learning-rate schedule and Adam settings."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from t2t_jax.decoding import kernels
from t2t_jax.schedule import rsqrt_schedule
from t2t_jax.training import losses, optim
from tests import numpy_reference as ref


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_label_smoothed_cross_entropy_matches_numpy(eps):
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(3, 5, 11)).astype(np.float32) * 3
  targets = rng.integers(1, 11, size=(3, 5))
  targets[0, 3:] = 0  # padding carries no weight
  total, denom = losses.label_smoothed_cross_entropy(logits, targets, label_smoothing=eps)
  want_total, want_denom = ref.smoothed_cross_entropy(logits, targets, targets != 0, eps)
  np.testing.assert_allclose(float(total), want_total, rtol=1e-5)
  assert float(denom) == want_denom == 13


def test_loss_sums_agree_with_the_separate_functions():
  rng = np.random.default_rng(4)
  logits = rng.normal(size=(2, 6, 9)).astype(np.float32)
  targets = rng.integers(1, 9, size=(2, 6))
  targets[1, 4:] = 0
  sums = losses.loss_sums(logits, targets, 0.1)
  np.testing.assert_allclose(
    sums["loss"],
    losses.label_smoothed_cross_entropy(logits, targets, label_smoothing=0.1)[0],
    rtol=1e-6,
  )
  np.testing.assert_allclose(
    sums["nll"], losses.negative_log_likelihood(logits, targets)[0], rtol=1e-6
  )
  assert float(sums["correct"]) == float(losses.token_accuracy(logits, targets)[0])
  assert float(sums["denominator"]) == 10


def test_argmax_matches_numpy_with_ties_and_nan():
  rng = np.random.default_rng(7)
  x = rng.integers(-3, 4, size=(6, 5, 9)).astype(np.float32)  # small integers: many ties
  x[0, 0, 4] = x[0, 0, 7] = np.nan  # the first NaN counts as the maximum, as in jnp/numpy
  x[1, 2, :] = -np.inf
  for axis in (-1, 0, 1):
    got = np.asarray(jax.jit(kernels.argmax, static_argnums=1)(x, axis))
    np.testing.assert_array_equal(got, np.argmax(x, axis=axis))
    np.testing.assert_array_equal(got, np.asarray(jnp.argmax(x, axis=axis)))


def test_argmax_in_chunks_matches_numpy_with_ties_and_inf():
  """A vocabulary-sized axis goes through the chunk maxima (`kernels.first_max_index`): the
  first maximum overall, where ties fall in one chunk or in several, in the first chunk or
  the last. A row holding a NaN gets the index of a NaN or of its maximum (XLA:CPU's max
  reductions may skip NaNs, so which one is not numpy's rule)."""
  rng = np.random.default_rng(11)
  vocab = 1000  # 8 chunks of 125
  assert kernels.chunked(vocab)
  x = rng.integers(-50, 50, size=(12, vocab)).astype(np.float32)
  x[0, [130, 140, 900]] = 99  # ties in two chunks
  x[1, [998, 999]] = 99  # the last chunk
  x[2, [0, 124]] = 99  # the first chunk, both ends
  x[3, :] = -np.inf
  x[4, :] = 7.0  # all equal
  x[5, 125] = np.inf
  x[6, :] = np.where(x[6] > -1, -1.0, x[6])
  x[6, [300, 3]] = [-0.0, 0.0]  # equal zeros: the first
  x[7, [900, 5]] = 98  # the maximum in the last chunk but one, after an earlier tie below it
  x[7, 901] = 99
  for axis, data in ((-1, x), (0, x.T.copy())):
    got = np.asarray(jax.jit(kernels.argmax, static_argnums=1)(data, axis))
    np.testing.assert_array_equal(got, np.argmax(data, axis=axis))
    np.testing.assert_array_equal(got, np.asarray(jnp.argmax(data, axis=axis)))
  x[8, 500], x[8, 200] = np.nan, 99  # NaN after the maximum
  x[9, [5, 700]], x[9, 3] = np.nan, 99  # NaN after it in the same chunk, and later
  x[10, 40], x[10, 600] = np.nan, 99  # NaN first
  got = np.asarray(jax.jit(kernels.argmax)(x))
  for row in (8, 9, 10):
    assert np.isnan(x[row, got[row]]) or x[row, got[row]] == np.nanmax(x[row])


def test_target_is_top_is_argmax_except_ties():
  rng = np.random.default_rng(8)
  logits = rng.normal(size=(4, 7, 50)).astype(np.float32)
  targets = rng.integers(0, 50, size=(4, 7))
  targets[0, :] = np.argmax(logits[0], axis=-1)  # some rows correct for sure
  np.testing.assert_array_equal(
    np.asarray(losses.target_is_top(logits, targets)), np.argmax(logits, axis=-1) == targets
  )
  tied = np.zeros((1, 2, 5), np.float32)  # constant logits: argmax says index 0; we say no
  assert not np.asarray(losses.target_is_top(tied, np.array([[0, 3]]))).any()


def test_target_is_top_with_ties_nan_inf_and_large_logits():
  rng = np.random.default_rng(9)
  x = rng.integers(-3, 4, size=(64, 12)).astype(np.float32)  # small integers: many ties
  x[0, 5] = np.nan
  x[1, :] = -np.inf
  x[2, 3] = np.inf
  x[3] = rng.normal(size=12) * 1e20  # differences far above float32 range after scaling
  x[4] = rng.normal(size=12) * 1e-20
  targets = rng.integers(0, 12, size=64)
  targets[2], targets[3:5] = 3, np.argmax(x[3:5], axis=-1)
  targets[5:32] = np.argmax(x[5:32], axis=-1)  # the first index of the max: a tie, or not
  top = np.max(x, axis=-1)
  unique_top = np.sum(x == top[:, None], axis=-1) == 1
  expected = (x[np.arange(64), targets] == top) & unique_top  # NaN rows: top is NaN
  got = np.asarray(jax.jit(losses.target_is_top)(x, targets))
  np.testing.assert_array_equal(got, expected)
  assert got[2:5].all() and not got[:2].any() and 0 < got[5:32].sum() < 27


def test_smoothed_loss_is_zero_at_the_smoothed_target():
  vocab, eps = 7, 0.1
  targets = np.array([[3, 5]])
  q = np.full((1, 2, vocab), eps / (vocab - 1))
  np.put_along_axis(q, targets[..., None], 1 - eps, axis=-1)
  total, _ = losses.label_smoothed_cross_entropy(np.log(q), targets, label_smoothing=eps)
  assert abs(float(total)) < 1e-5


def test_nll_and_accuracy():
  logits = np.log(np.array([[[0.1, 0.7, 0.2], [0.5, 0.25, 0.25], [0.3, 0.3, 0.4]]]))
  targets = np.array([[1, 2, 0]])
  total, denom = losses.negative_log_likelihood(logits, targets)
  np.testing.assert_allclose(float(total), -np.log(0.7) - np.log(0.25), rtol=1e-6)
  assert float(denom) == 2
  correct, denom = losses.token_accuracy(logits, targets)
  assert (float(correct), float(denom)) == (1.0, 2.0)
  weights = np.array([[0.0, 1.0, 1.0]])
  correct, denom = losses.token_accuracy(logits, targets, weights)
  assert (float(correct), float(denom)) == (0.0, 2.0)


def test_schedule_formula_and_peak():
  d_model, warmup = 512, 4000
  schedule = rsqrt_schedule(d_model, warmup)
  steps = np.array([1, 10, 1000, 3999, 4000, 4001, 10000, 100000])
  want = d_model**-0.5 * np.minimum(steps**-0.5, steps * warmup**-1.5)
  np.testing.assert_allclose(np.asarray(jax.vmap(schedule)(steps)), want, rtol=1e-6)
  grid = np.arange(1, 20001)
  values = np.asarray(jax.vmap(schedule)(grid))
  assert grid[np.argmax(values)] == warmup
  np.testing.assert_allclose(values.max(), (d_model * warmup) ** -0.5, rtol=1e-6)
  print(f"\npeak learning rate {values.max():.6g} at step {warmup} (d_model={d_model})")
  with pytest.raises(ValueError, match="warmup_steps=0"):
    rsqrt_schedule(512, 0)


def test_adam_is_the_papers():
  """Two updates of make_optimizer equal Adam(0.9, 0.98, 1e-9) written out in numpy."""
  assert (optim.ADAM_B1, optim.ADAM_B2, optim.ADAM_EPS) == (0.9, 0.98, 1e-9)
  d_model, warmup = 16, 10
  tx = optim.make_optimizer(d_model, warmup)
  params = {"w": jnp.array([0.5, -1.0, 2.0])}
  grads = [np.array([0.1, -0.2, 0.3]), np.array([-0.05, 0.4, 1e-6])]
  state = tx.init(params)
  p = np.array(params["w"], np.float64)
  m = v = np.zeros(3)
  for step, g in enumerate(grads, start=1):
    updates, state = tx.update({"w": jnp.asarray(g, jnp.float32)}, state, params)
    params = optax.apply_updates(params, updates)
    lr = d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)
    m = 0.9 * m + 0.1 * g
    v = 0.98 * v + 0.02 * g * g
    m_hat, v_hat = m / (1 - 0.9**step), v / (1 - 0.98**step)
    p = p - lr * m_hat / (np.sqrt(v_hat) + 1e-9)
    np.testing.assert_allclose(np.asarray(params["w"]), p, rtol=1e-6)


@pytest.mark.parametrize("eps,chunk,with_bias", [(0.1, 4, True), (0.0, 5, False), (0.1, 64, False)])
def test_chunked_output_loss_matches_numpy(eps, chunk, with_bias):
  """Loss, NLL, accuracy and all three gradients of the fused, chunked output layer."""
  rng = np.random.default_rng(1)
  x = rng.normal(size=(3, 7, 8)).astype(np.float32)  # 21 tokens: chunks 4 and 5 need padding
  weights = (rng.normal(size=(13, 8)) * 0.5).astype(np.float32)
  bias = rng.normal(size=(13,)).astype(np.float32) if with_bias else None
  targets = rng.integers(1, 13, size=(3, 7))
  targets[1, 4:] = 0
  fn = lambda x, w, b: losses.output_loss_sums(x, w, b, targets, eps, chunk_tokens=chunk)
  sums = jax.jit(fn)(x, weights, bias)
  want, want_grads = ref.output_layer_loss_and_grads(x, weights, bias, targets, eps)
  np.testing.assert_allclose(float(sums["loss"]), want, rtol=1e-5)
  logits = np.einsum("bld,vd->blv", x, weights) + (0 if bias is None else bias)
  plain = losses.loss_sums(jnp.asarray(logits), targets, eps)
  for key in ("nll", "correct", "denominator"):
    np.testing.assert_allclose(float(sums[key]), float(plain[key]), rtol=1e-5)
  grads = jax.jit(jax.grad(lambda *a: fn(*a)["loss"], argnums=(0, 1, 2) if with_bias else (0, 1)))(
    x, weights, bias
  )
  for got, expected in zip(grads, want_grads):
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-4, atol=1e-5)
