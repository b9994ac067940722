"""The paper's optimiser (section 5.3): Adam(0.9, 0.98, 1e-9) with the rsqrt warmup of eq. 3
(t2t_jax.schedule)."""

import functools

import optax

from t2t_jax.schedule import rsqrt_schedule

ADAM_B1 = 0.9
ADAM_B2 = 0.98
ADAM_EPS = 1e-9


# One schedule and one optimizer object per setting: the pmapped steps and the TrainState's
# static optimizer field are cached by identity (training/parallel.py).
@functools.lru_cache(maxsize=16)
def optimizer_schedule(
  d_model: int, warmup_steps: int = 4000, factor: float = 1.0
) -> optax.Schedule:
  """The schedule as optax calls it: optax passes the number of updates done (from 0)."""
  schedule = rsqrt_schedule(d_model, warmup_steps, factor)
  return lambda count: schedule(count + 1)


@functools.lru_cache(maxsize=16)
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
