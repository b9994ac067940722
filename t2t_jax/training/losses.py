"""Training and evaluation losses, returned as (sum, denominator) pairs.

Sums (not means) let data-parallel code psum both parts across devices and divide once,
so the result does not depend on how tokens are split over devices.
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax

from t2t_jax.tokens import PAD_ID

Array = jax.Array
# {'loss', 'nll', 'correct', 'denominator'}: float32 scalar sums over non-padding tokens.
Sums = dict[str, Array]


def _weights(targets: Array, weights: Array | None) -> Array:
  if weights is None:
    weights = targets != PAD_ID
  return weights.astype(jnp.float32)


def _target_and_others(logits: Array, targets: Array) -> tuple[Array, Array]:
  """(target logit, largest of the other logits), both float32 [...].

  The other logits' maximum is one max-reduction over logits with the target's entry pushed
  to -FLT_MAX by arithmetic (|index - target| clipped to 1 is 0 only there), which XLA:CPU
  fuses and vectorizes; a select on an index comparison made it write out a masked copy of
  the logits first. +inf logits are taken as FLT_MAX so the arithmetic never forms inf * 0.
  """
  logits = logits.astype(jnp.float32)
  big = jnp.finfo(jnp.float32).max
  target = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
  index = lax.broadcasted_iota(jnp.float32, logits.shape, logits.ndim - 1)
  other = jnp.minimum(1.0, jnp.abs(index - targets[..., None].astype(jnp.float32)))
  others = jnp.max(jnp.minimum(logits, big) * other + (other - 1.0) * big, axis=-1)
  return target, others


def target_is_top(logits: Array, targets: Array) -> Array:
  """Whether each target's logit is above every other logit: the accuracy statistic.

  Equals `jnp.argmax(logits) == targets` except on an exact tie for the maximum, which counts
  as wrong (so constant logits score 0), and rows with a NaN, which count as wrong. One
  fused max-reduction (`_target_and_others`, which also gives the loss its row maximum),
  cheaper than any argmax.
  """
  return _above_others(*_target_and_others(logits, targets))


def _above_others(target: Array, others: Array) -> Array:
  """target > others, with +inf taken as FLT_MAX as `_target_and_others` takes it."""
  return jnp.minimum(target, jnp.finfo(jnp.float32).max) > others


def token_losses(
  logits: Array, targets: Array, label_smoothing: float = 0.1
) -> tuple[Array, Array]:
  """Per-token label-smoothed loss and plain NLL from one log-softmax.

  The smoothed target distribution puts 1 - eps on the reference token and eps / (vocab - 1)
  on every other token. Its entropy is subtracted so a perfect prediction of the smoothed
  distribution scores 0 (the figure then tracks the KL divergence, as in tensor2tensor).

  Args:
    logits: float [batch, length, vocab].
    targets: int [batch, length].
    label_smoothing: eps_ls (paper: 0.1).

  Returns:
    (smoothed loss, nll), each float32 [batch, length], unweighted.
  """
  vocab = logits.shape[-1]
  confidence = 1.0 - label_smoothing
  low = label_smoothing / (vocab - 1)
  log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  nll = -jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
  # Sum over the smoothed distribution without materialising a one-hot [.., vocab].
  smooth = -jnp.sum(log_probs, axis=-1) - nll
  loss = confidence * nll + low * smooth
  if label_smoothing > 0.0:
    loss = loss + confidence * jnp.log(confidence) + (vocab - 1) * low * jnp.log(low)
  return loss, nll


def label_smoothed_cross_entropy(
  logits: Array, targets: Array, weights: Array | None = None, label_smoothing: float = 0.1
) -> tuple[Array, Array]:
  """Cross-entropy against targets smoothed with eps_ls (paper 5.4), see `token_losses`.

  Returns:
    (sum of per-token losses, sum of weights), both float32 scalars; weights default to 1
    on non-padding tokens.
  """
  loss, _ = token_losses(logits, targets, label_smoothing)
  w = _weights(targets, weights)
  return jnp.sum(loss * w), jnp.sum(w)


def loss_sums(logits: Array, targets: Array, label_smoothing: float) -> Sums:
  """Everything the train and eval steps report, as sums over non-padding tokens."""
  loss, nll = token_losses(logits, targets, label_smoothing)
  w = _weights(targets, None)
  correct = target_is_top(logits, targets).astype(jnp.float32)
  return dict(
    loss=jnp.sum(loss * w),
    nll=jnp.sum(nll * w),
    correct=jnp.sum(correct * w),
    denominator=jnp.sum(w),
  )


def negative_log_likelihood(
  logits: Array, targets: Array, weights: Array | None = None
) -> tuple[Array, Array]:
  """Plain cross-entropy -log p(target): (sum over tokens, sum of weights)."""
  return label_smoothed_cross_entropy(logits, targets, weights, label_smoothing=0.0)


def token_accuracy(
  logits: Array, targets: Array, weights: Array | None = None
) -> tuple[Array, Array]:
  """Tokens whose target has the largest logit (`target_is_top`): (correct count, sum of
  weights)."""
  w = _weights(targets, weights)
  correct = target_is_top(logits, targets).astype(jnp.float32)
  return jnp.sum(correct * w), jnp.sum(w)


def _chunk_logits(
  x: Array, weights: Array, bias: Array | None, weight_sum: tuple[Array, Array]
) -> tuple[Array, Array]:
  """[chunk, d] x [vocab, d] -> float32 [chunk, vocab] (float32 accumulation for bf16 x),
  and the per-token sums of the logits from `weight_sum` = sum_v (W_v, bias_v)."""
  logits = jnp.einsum("cd,vd->cv", x, weights.astype(x.dtype), preferred_element_type=jnp.float32)
  sums = jnp.dot(x.astype(jnp.float32), weight_sum[0])
  if bias is None:
    return logits, sums
  return logits + bias, sums + weight_sum[1]


def _weight_sum(weights: Array, bias: Array | None) -> tuple[Array, Array]:
  return (
    jnp.sum(weights.astype(jnp.float32), axis=0),
    jnp.zeros((), jnp.float32) if bias is None else jnp.sum(bias),
  )


def _chunk_sums(
  logits: Array, targets: Array, label_smoothing: float, logit_sums: Array
) -> tuple[Sums, Array, Array]:
  """Sums of one chunk (as `loss_sums`) and the softmax probabilities the gradient needs.

  `logit_sums` [chunk] is sum_v logits[:, v], which the caller forms as x . sum_v W_v
  (+ sum bias) without another pass over the [chunk, vocab] logits."""
  vocab = logits.shape[-1]
  # The accuracy's reduction also gives the row maximum for the logsumexp.
  target, others = _target_and_others(logits, targets)
  top = jnp.maximum(others, target)
  top = jnp.where(jnp.isfinite(top), top, 0.0)
  lse = top + jnp.log(jnp.sum(jnp.exp(logits - top[:, None]), axis=-1))
  nll = lse - target
  confidence, low = 1.0 - label_smoothing, label_smoothing / (vocab - 1)
  smooth = vocab * lse - logit_sums - nll  # -sum_v log p_v - nll
  loss = confidence * nll + low * smooth
  if label_smoothing > 0.0:
    loss = loss + confidence * jnp.log(confidence) + (vocab - 1) * low * jnp.log(low)
  w = _weights(targets, None)
  correct = _above_others(target, others).astype(jnp.float32)
  sums = dict(
    loss=jnp.sum(loss * w),
    nll=jnp.sum(nll * w),
    correct=jnp.sum(correct * w),
    denominator=jnp.sum(w),
  )
  return sums, jnp.exp(logits - lse[:, None]), w


def _zero_sums() -> Sums:
  zero = jnp.zeros((), jnp.float32)
  return dict(loss=zero, nll=zero, correct=zero, denominator=zero)


def _add(a: Sums, b: Sums) -> Sums:
  return jax.tree.map(jnp.add, a, b)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _chunked_sums(
  x: Array, weights: Array, bias: Array | None, targets: Array, label_smoothing: float
) -> Sums:
  def body(total: Sums, chunk: tuple[Array, Array]) -> tuple[Sums, None]:
    logits, logit_sums = _chunk_logits(chunk[0], weights, bias, weight_sum)
    sums, _, _ = _chunk_sums(logits, chunk[1], label_smoothing, logit_sums)
    return _add(total, sums), None

  weight_sum = _weight_sum(weights, bias)
  return jax.lax.scan(body, _zero_sums(), (x, targets))[0]


def _chunked_sums_fwd(
  x: Array, weights: Array, bias: Array | None, targets: Array, label_smoothing: float
) -> tuple[Sums, tuple[Array, Array, Array | None]]:
  """Forward and gradient together, one chunk at a time: d loss / d logits = w (p - q), with
  q the smoothed target distribution, is formed per chunk and contracted at once into the
  gradients of the features, the output matrix and the bias."""
  vocab = weights.shape[0]
  confidence, low = 1.0 - label_smoothing, label_smoothing / (vocab - 1)

  def body(
    carry: tuple[Sums, Array, Array | None], chunk: tuple[Array, Array, Array]
  ) -> tuple[tuple[Sums, Array, Array | None], Array]:
    total, d_weights_t, d_bias = carry
    xc, xc_t, tc = chunk
    logits, logit_sums = _chunk_logits(xc, weights, bias, weight_sum)
    sums, probs, w = _chunk_sums(logits, tc, label_smoothing, logit_sums)
    g = w[:, None] * (probs - low)
    g = g.at[jnp.arange(tc.shape[0]), tc].add(-w * (confidence - low))
    dx = jnp.einsum(
      "cv,vd->cd", g.astype(xc.dtype), weights.astype(xc.dtype), preferred_element_type=jnp.float32
    ).astype(xc.dtype)
    # x^T g into [d_model, vocab], from x^T transposed once before the loop: a plain
    # [d, chunk] x [chunk, vocab] product (XLA:CPU runs x^T g with a transposed operand
    # more slowly); transposed once after the loop.
    d_weights_t = d_weights_t + jnp.dot(xc_t.astype(jnp.float32), g)
    if bias is not None:
      d_bias = d_bias + jnp.sum(g, axis=0)
    return (_add(total, sums), d_weights_t, d_bias), dx

  weight_sum = _weight_sum(weights, bias)
  init = (
    _zero_sums(),
    jnp.zeros(weights.shape[::-1], jnp.float32),
    None if bias is None else jnp.zeros(bias.shape, jnp.float32),
  )
  (total, d_weights_t, d_bias), dx = jax.lax.scan(body, init, (x, jnp.swapaxes(x, 1, 2), targets))
  d_bias = None if bias is None else d_bias.astype(bias.dtype)
  return total, (dx, d_weights_t.T.astype(weights.dtype), d_bias)


def _chunked_sums_bwd(
  label_smoothing: float, residuals: tuple[Array, Array, Array | None], cotangent: Sums
) -> tuple[Array, Array, Array | None, None]:
  del label_smoothing
  dx, d_weights, d_bias = residuals
  scale = cotangent["loss"]  # nll, correct and denominator are statistics, not objectives
  d_bias = None if d_bias is None else scale * d_bias
  return (scale.astype(dx.dtype) * dx, scale * d_weights, d_bias, None)


_chunked_sums.defvjp(_chunked_sums_fwd, _chunked_sums_bwd)


def output_loss_sums(
  features: Array,
  weights: Array,
  bias: Array | None,
  targets: Array,
  label_smoothing: float,
  chunk_tokens: int = 512,
) -> Sums:
  """`loss_sums(features @ weights.T + bias, ...)` without the [tokens, vocab] logits.

  The pre-softmax layer and the loss run over chunks of `chunk_tokens` target tokens, so the
  logits (25k x 37k floats = 3.7 GB for the paper's batches) are never held whole, and the
  chunk that is held stays in cache. The
  gradient is formed in the same pass. Gradients flow through the `loss` sum only; `nll`,
  `correct` and `denominator` are reported statistics.

  Args:
    features: [batch, length, d_model] decoder outputs (after the final norm, if any).
    weights: [vocab, d_model] output matrix (the shared embedding, or the output kernel^T).
    bias: [vocab] or None.
    targets: int [batch, length], 0 = padding.
    label_smoothing: eps_ls.
    chunk_tokens: tokens per chunk.
  """
  d_model = features.shape[-1]
  x, t = features.reshape(-1, d_model), targets.reshape(-1)
  chunk = max(1, min(chunk_tokens, x.shape[0]))
  pad = -x.shape[0] % chunk
  if pad:  # padded positions have target PAD_ID, hence weight 0
    x = jnp.pad(x, ((0, pad), (0, 0)))
    t = jnp.pad(t, (0, pad), constant_values=PAD_ID)
  if bias is not None:
    bias = bias.astype(jnp.float32)
  return _chunked_sums(
    x.reshape(-1, chunk, d_model), weights, bias, t.reshape(-1, chunk), float(label_smoothing)
  )
