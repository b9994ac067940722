"""Independent float64 numpy implementations used as references in tests."""

import numpy as np


def attention(q, k, v, mask=None):
  """softmax(q k^T / sqrt(d)) v per head; rows with no allowed key give zeros.

  q [b, lq, h, d], k/v [b, lk, h, d], mask bool broadcastable to [b, h, lq, lk].
  Returns (out [b, lq, h, d], weights [b, h, lq, lk]).
  """
  q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
  b, lq, h, d = q.shape
  lk = k.shape[1]
  mask = np.ones((b, h, lq, lk), bool) if mask is None else np.broadcast_to(mask, (b, h, lq, lk))
  weights = np.zeros((b, h, lq, lk))
  for bi in range(b):
    for hi in range(h):
      for i in range(lq):
        allowed = mask[bi, hi, i]
        if not allowed.any():
          continue
        logits = np.array([q[bi, i, hi] @ k[bi, j, hi] for j in range(lk)]) / np.sqrt(d)
        e = np.where(allowed, np.exp(logits - logits[allowed].max()), 0.0)
        weights[bi, hi, i] = e / e.sum()
  out = np.einsum("bhqk,bkhd->bqhd", weights, v)
  return out, weights


def sinusoidal(length, d_model):
  """Eq. 5/6 written out element by element."""
  pe = np.zeros((length, d_model))
  for pos in range(length):
    for i in range(d_model // 2):
      angle = pos / 10000 ** (2 * i / d_model)
      pe[pos, 2 * i] = np.sin(angle)
      pe[pos, 2 * i + 1] = np.cos(angle)
  return pe


def smoothed_cross_entropy(logits, targets, weights, eps):
  """KL(q || p) summed over weighted tokens, q the explicit smoothed one-hot."""
  logits = np.asarray(logits, np.float64)
  vocab = logits.shape[-1]
  logp = logits - logits.max(-1, keepdims=True)
  logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
  q = np.full(logits.shape, eps / (vocab - 1))
  np.put_along_axis(q, np.asarray(targets)[..., None], 1.0 - eps, axis=-1)
  kl = np.sum(np.where(q > 0, q * (np.log(np.where(q > 0, q, 1.0)) - logp), 0.0), axis=-1)
  return float(np.sum(kl * weights)), float(np.sum(weights))


def output_layer_loss_and_grads(x, weights, bias, targets, eps):
  """Smoothed cross-entropy of logits = x W^T + b over non-pad tokens, and its gradients
  (d/dlogits = w (p - q)) with respect to x, W and b, in float64."""
  x, weights = np.asarray(x, np.float64), np.asarray(weights, np.float64)
  bias = np.zeros(weights.shape[0]) if bias is None else np.asarray(bias, np.float64)
  targets = np.asarray(targets)
  w = (targets != 0).astype(np.float64)
  logits = x @ weights.T + bias
  total, _ = smoothed_cross_entropy(logits, targets, w, eps)
  p = np.exp(logits - logits.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  q = np.full(logits.shape, eps / (weights.shape[0] - 1))
  np.put_along_axis(q, targets[..., None], 1.0 - eps, axis=-1)
  g = w[..., None] * (p - q)
  g2 = g.reshape(-1, g.shape[-1])
  return total, (g @ weights, g2.T @ x.reshape(-1, x.shape[-1]), g2.sum(0))
