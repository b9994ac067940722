"""The paper's optimiser (section 5.3): Adam(0.9, 0.98, 1e-9) with rsqrt warmup."""

import jax
import jax.numpy as jnp
import optax
from jax.typing import ArrayLike

ADAM_B1 = 0.9
ADAM_B2 = 0.98
ADAM_EPS = 1e-9


def rsqrt_schedule(d_model: int, warmup_steps: int = 4000, factor: float = 1.0) -> optax.Schedule:
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


def optimizer_schedule(
  d_model: int, warmup_steps: int = 4000, factor: float = 1.0
) -> optax.Schedule:
  """The schedule as optax calls it: optax passes the number of updates done (from 0)."""
  schedule = rsqrt_schedule(d_model, warmup_steps, factor)
  return lambda count: schedule(count + 1)


def make_optimizer(
  d_model: int,
  warmup_steps: int = 4000,
  factor: float = 1.0,
  b1: float = ADAM_B1,
  b2: float = ADAM_B2,
  eps: float = ADAM_EPS,
) -> optax.GradientTransformation:
  """Adam with the paper's hyperparameters and learning-rate schedule."""
  return optax.adam(optimizer_schedule(d_model, warmup_steps, factor), b1=b1, b2=b2, eps=eps)
