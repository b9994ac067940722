"""The sinusoidal positional encoding of paper section 3.5 (pure function)."""

import jax
import jax.numpy as jnp
import numpy as np


def sinusoidal(length: int, d_model: int, max_timescale: float = 10000.0) -> jax.Array:
  """Eq. 5/6, interleaved as the paper writes them.

    PE(pos, 2i)   = sin(pos / 10000^(2i / d_model))
    PE(pos, 2i+1) = cos(pos / 10000^(2i / d_model))

  Interleaving (rather than tensor2tensor's [sin..., cos...] concatenation) keeps each
  (sin, cos) pair adjacent, so PE(pos + k) = M_k PE(pos) with M_k block-diagonal 2x2
  rotations. Computed in numpy float64 once, then cast: the table is a constant.

  Args:
    length: number of positions.
    d_model: model width (must be even).
    max_timescale: the 10000 of the paper.

  Returns:
    float32 [length, d_model].
  """
  if d_model % 2:
    raise ValueError(f"sinusoidal: d_model must be even, got {d_model}")
  pos = np.arange(length, dtype=np.float64)[:, None]
  inv_freq = max_timescale ** (-np.arange(0, d_model, 2, dtype=np.float64) / d_model)
  angles = pos * inv_freq[None, :]
  table = np.empty((length, d_model), dtype=np.float64)
  table[:, 0::2] = np.sin(angles)
  table[:, 1::2] = np.cos(angles)
  return jnp.asarray(table, dtype=jnp.float32)
