"""Per-device training and evaluation steps (pure; wrapped with pmap in t2t_jax.training.parallel).

Every reduction across devices goes through `axis_name`; losses are token sums divided by the
global token count once, so N devices on a global batch give the update 1 device would.
"""

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct
from flax.typing import VariableDict

from t2t_jax.model import Transformer
from t2t_jax.training import losses

Batch = Mapping[str, jax.Array]  # 'inputs', 'targets' int [rows, length], packing keys
# (gradient sums shaped like the parameters, metric sums): what microbatches add up.
Accumulator = tuple[VariableDict, losses.Sums]

AXIS = "batch"
MODEL_KEYS = (
  "inputs",
  "targets",
  "inputs_segmentation",
  "targets_segmentation",
  "inputs_position",
  "targets_position",
)


class TrainState(struct.PyTreeNode):
  """Everything a resumed run needs from the device side."""

  step: jnp.ndarray  # updates applied so far
  params: Any
  opt_state: Any
  rng: jnp.ndarray  # base key; dropout keys are fold_in(rng, step, device, micro)
  bad_step: jnp.ndarray  # first step whose loss or gradient was not finite; -1 if none
  tx: optax.GradientTransformation = struct.field(pytree_node=False)
  # The exponential moving average of the parameters (None: off), and its decay.
  ema: Any = None
  ema_decay: float = struct.field(pytree_node=False, default=0.0)

  @classmethod
  def create(
    cls,
    params: VariableDict,
    tx: optax.GradientTransformation,
    rng: jax.Array,
    ema_decay: float = 0.0,
  ) -> "TrainState":
    """A fresh state at step 0; with `ema_decay` > 0 the average starts at `params`."""
    return cls(
      step=jnp.array(0, jnp.int32),
      params=params,
      opt_state=tx.init(params),
      rng=rng,
      bad_step=jnp.array(-1, jnp.int32),
      tx=tx,
      ema=jax.tree.map(jnp.array, params) if ema_decay else None,
      ema_decay=float(ema_decay or 0.0),
    )


def _model_args(batch: Batch) -> dict[str, jax.Array]:
  return {k: batch[k] for k in MODEL_KEYS if k in batch}


def batch_loss_sums(
  params: VariableDict,
  batch: Batch,
  *,
  model: Transformer,
  label_smoothing: float,
  rngs: dict[str, jax.Array] | None = None,
) -> losses.Sums:
  """losses.loss_sums of the model on `batch` (dropout when `rngs` are given); the output
  layer and loss run chunk by chunk unless the config's loss_chunk_tokens is 0."""
  kw = dict(deterministic=rngs is None, rngs=rngs)
  chunk = model.config.loss_chunk_tokens
  if not chunk:
    logits = model.apply({"params": params}, **_model_args(batch), **kw)
    return losses.loss_sums(logits, batch["targets"], label_smoothing)
  y, weights, bias = model.apply({"params": params}, **_model_args(batch), features=True, **kw)
  return losses.output_loss_sums(y, weights, bias, batch["targets"], label_smoothing, chunk)


def loss_and_grads(
  params: VariableDict,
  batch: Batch,
  dropout_rng: jax.Array,
  *,
  model: Transformer,
  label_smoothing: float,
) -> Accumulator:
  """Summed label-smoothed loss of one (micro)batch and its gradient (not yet normalised)."""

  def loss_fn(p: VariableDict) -> tuple[jax.Array, losses.Sums]:
    sums = batch_loss_sums(
      p, batch, model=model, label_smoothing=label_smoothing, rngs={"dropout": dropout_rng}
    )
    return sums["loss"], sums

  grads, sums = jax.grad(loss_fn, has_aux=True)(params)
  return grads, sums


def dropout_key(state: TrainState, micro_index: int | jax.Array) -> jax.Array:
  """Depends only on (rng, step, device, microbatch): reproducible and resume-safe."""
  key = jax.random.fold_in(state.rng, state.step)
  key = jax.random.fold_in(key, jax.lax.axis_index(AXIS))
  return jax.random.fold_in(key, micro_index)


def accumulate_step(
  state: TrainState,
  accum: Accumulator,
  batch: Batch,
  micro_index: int | jax.Array,
  *,
  model: Transformer,
  label_smoothing: float,
) -> Accumulator:
  """Adds one microbatch's gradient and metric sums to `accum` (gradient accumulation)."""
  grads, sums = loss_and_grads(
    state.params,
    batch,
    dropout_key(state, micro_index),
    model=model,
    label_smoothing=label_smoothing,
  )
  return jax.tree.map(jnp.add, accum, (grads, sums))


def ema_decay_at(decay: float, step: jax.Array) -> jax.Array:
  """The decay of update `step` (0-based): min(decay, (1 + step) / (10 + step)), the warmup of
  TensorFlow's ExponentialMovingAverage(num_updates) that Marian's exponential smoothing also
  uses, so that the average is not dominated by the random initial parameters."""
  step = step.astype(jnp.float32)
  return jnp.minimum(decay, (1.0 + step) / (10.0 + step))


def update_ema(ema: VariableDict, params: VariableDict, decay: jax.Array) -> VariableDict:
  """ema <- decay * ema + (1 - decay) * params, leaf by leaf. `params` are the parameters
  after the update, the same on every device (the gradients were summed over devices), so
  the average is too and needs no collective of its own."""
  return jax.tree.map(lambda e, p: decay * e + (1.0 - decay) * p, ema, params)


def apply_step(
  state: TrainState, accum: Accumulator, *, schedule: optax.Schedule
) -> tuple[TrainState, dict[str, jax.Array]]:
  """Sums gradients over devices, normalises by the global token count, updates.

  A non-finite loss or gradient leaves the parameters untouched and records the step in
  `bad_step`; the host checks it when it next syncs (logging, checkpointing).
  """
  grads, sums = jax.lax.psum(accum, AXIS)
  denom = jnp.maximum(sums["denominator"], 1.0)
  grads = jax.tree.map(lambda g: g / denom, grads)
  grad_norm = optax.tree.norm(grads)
  finite = jnp.isfinite(sums["loss"]) & jnp.isfinite(grad_norm)

  def update(operands: tuple[Any, ...]) -> tuple[Any, ...]:
    params, opt_state, ema = operands
    updates, opt_state = state.tx.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    if ema is not None:
      ema = update_ema(ema, params, ema_decay_at(state.ema_decay, state.step))
    return params, opt_state, ema

  # A branch, not a select over every parameter and moment: only one side runs. A skipped
  # (non-finite) step leaves the average untouched too.
  params, opt_state, ema = jax.lax.cond(
    finite, update, lambda operands: operands, (state.params, state.opt_state, state.ema)
  )
  new_state = state.replace(
    step=state.step + 1,
    params=params,
    opt_state=opt_state,
    ema=ema,
    bad_step=jnp.where(~finite & (state.bad_step < 0), state.step + 1, state.bad_step),
  )
  metrics = dict(sums, grad_norm=grad_norm, learning_rate=schedule(state.step))
  return new_state, metrics


def train_step(
  state: TrainState,
  batch: Batch,
  *,
  model: Transformer,
  label_smoothing: float,
  schedule: optax.Schedule,
) -> tuple[TrainState, dict[str, jax.Array]]:
  """One update from one batch per device (no accumulation): fused in a single program."""
  accum = accumulate_step(
    state, zero_accumulator(state.params), batch, 0, model=model, label_smoothing=label_smoothing
  )
  return apply_step(state, accum, schedule=schedule)


def zero_accumulator(params: VariableDict) -> Accumulator:
  zero = jnp.zeros((), jnp.float32)
  return (
    jax.tree.map(jnp.zeros_like, params),
    dict(loss=zero, nll=zero, correct=zero, denominator=zero),
  )


def eval_step(
  params: VariableDict, batch: Batch, *, model: Transformer, label_smoothing: float
) -> losses.Sums:
  """Teacher-forced dev metrics as sums over all devices: loss, NLL, correct tokens, tokens."""
  return jax.lax.psum(
    batch_loss_sums(params, batch, model=model, label_smoothing=label_smoothing), AXIS
  )
