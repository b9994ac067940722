"""The learning rate of eq. 3 as a pure function of the step.

The trainer's optimizer (training.optim) follows it and the plots (viz) draw it for any
config, before or without a run, so it lives apart from both.
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

Schedule = Callable[[ArrayLike], jax.Array]


def rsqrt_schedule(d_model: int, warmup_steps: int = 4000, factor: float = 1.0) -> Schedule:
  """lrate = factor * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5) (eq. 3).

  `step` counts from 1 as in the paper: the first update uses step 1. The rate rises
  linearly for warmup_steps steps, peaks at factor * (d_model * warmup_steps)^-0.5, then
  decays with the inverse square root of the step.
  """
  if warmup_steps <= 0:
    raise ValueError(f"warmup_steps={warmup_steps}: must be a positive integer")

  def schedule(step: ArrayLike) -> jax.Array:
    step = jnp.maximum(jnp.asarray(step, jnp.float32), 1.0)
    return factor * d_model**-0.5 * jnp.minimum(step**-0.5, step * warmup_steps**-1.5)

  return schedule
