"""Training and evaluation losses, returned as (sum, denominator) pairs.

Sums (not means) let data-parallel code psum both parts across devices and divide once,
so the result does not depend on how tokens are split over devices.
"""

from typing import Optional

import jax
import jax.numpy as jnp

from t2t_jax.tokens import PAD_ID


def _weights(targets, weights):
  if weights is None:
    weights = targets != PAD_ID
  return weights.astype(jnp.float32)


def token_losses(logits, targets, label_smoothing: float = 0.1):
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


def label_smoothed_cross_entropy(logits, targets, weights: Optional[jnp.ndarray] = None,
                                 label_smoothing: float = 0.1):
  """Cross-entropy against targets smoothed with eps_ls (paper 5.4), see `token_losses`.

  Returns:
    (sum of per-token losses, sum of weights), both float32 scalars; weights default to 1
    on non-padding tokens.
  """
  loss, _ = token_losses(logits, targets, label_smoothing)
  w = _weights(targets, weights)
  return jnp.sum(loss * w), jnp.sum(w)


def loss_sums(logits, targets, label_smoothing: float) -> dict:
  """Everything the train and eval steps report, as sums over non-padding tokens."""
  loss, nll = token_losses(logits, targets, label_smoothing)
  w = _weights(targets, None)
  correct = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
  return dict(loss=jnp.sum(loss * w), nll=jnp.sum(nll * w), correct=jnp.sum(correct * w),
              denominator=jnp.sum(w))


def negative_log_likelihood(logits, targets, weights: Optional[jnp.ndarray] = None):
  """Plain cross-entropy -log p(target): (sum over tokens, sum of weights)."""
  return label_smoothed_cross_entropy(logits, targets, weights, label_smoothing=0.0)


def token_accuracy(logits, targets, weights: Optional[jnp.ndarray] = None):
  """Tokens whose argmax prediction equals the target: (correct count, sum of weights)."""
  w = _weights(targets, weights)
  correct = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
  return jnp.sum(correct * w), jnp.sum(w)
