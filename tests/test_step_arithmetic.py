"""The training step's arithmetic against references that share none of its code.

Adam's update barely changes when its gradients are rescaled, so comparing two runs of the
step cannot see a wrong loss normalisation. Here the gradient the step hands to the
optimizer is captured and compared with jax.grad of (summed label-smoothed loss / non-pad
target tokens); Adam's constants with a float64 numpy Adam on gradients small enough for
eps and varied enough for b2 to matter; the learning rate the trainer logs with eq. 3; and
the trainer's run with the config's label_smoothing, warmup_steps and learning_rate_factor.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn

from t2t_jax.experiments import tiny
from t2t_jax.run.workdir import read_metrics
from t2t_jax.training import optim, parallel, steps
from t2t_jax.training import trainer as train
from tests import numpy_reference as ref
from tests import support

EPS_LS = 0.2
ROWS, LENGTH = 24, 12  # the global batch, split 24 ways at most (8 devices x 3 microbatches)
PACK_KEYS = ("inputs_segmentation", "targets_segmentation", "inputs_position", "targets_position")


def eq3(step, d_model, warmup, factor):
  """lrate = factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), step from 1."""
  step = np.asarray(step, np.float64)
  return factor * d_model**-0.5 * np.minimum(step**-0.5, step * float(warmup) ** -1.5)


def capture_gradients() -> optax.GradientTransformation:
  """An 'optimizer' whose state becomes the gradient it is given and whose update is zero:
  the gradient the step applies, read back exactly."""
  return optax.GradientTransformation(
    lambda params: jax.tree.map(np.zeros_like, params),
    lambda grads, state, params=None: (jax.tree.map(jnp.zeros_like, grads), grads),
  )


CAPTURE = capture_gradients()


def packed_batch(rows, length, seed):
  """Rows of one or two packed pairs of ragged lengths, then padding; per row the token
  counts differ, so a per-device or per-microbatch normalisation would show."""
  rng = np.random.default_rng(seed)
  batch = {k: np.zeros((rows, length), np.int32) for k in ("inputs", "targets", *PACK_KEYS)}
  for r in range(rows):
    segments = int(rng.integers(1, 3))
    for side in ("inputs", "targets"):
      at = 0
      for s in range(1, segments + 1):
        n = int(rng.integers(2, length // 2 - 1))
        batch[side][r, at : at + n] = rng.integers(4, 40, size=n)
        batch[f"{side}_segmentation"][r, at : at + n] = s
        batch[f"{side}_position"][r, at : at + n] = np.arange(n)
        at += n
  return batch


def model_logits(model, params, batch):
  args = {k: jnp.asarray(v) for k, v in batch.items()}
  return jax.jit(lambda p, a: model.apply({"params": p}, **a, deterministic=True))(params, args)


def smoothed_kl(logits, targets, eps):
  """Per-token KL(q || softmax(logits)), q = 1 - eps on the target, eps / (V - 1) elsewhere."""
  vocab = logits.shape[-1]
  log_p = jax.nn.log_softmax(logits, axis=-1)
  q = jnp.where(jax.nn.one_hot(targets, vocab) > 0, 1.0 - eps, eps / (vocab - 1))
  return jnp.sum(jax.scipy.special.xlogy(q, q) - q * log_p, axis=-1)


def reference_gradient(model, params, batch, eps):
  """(logits, jax.grad of the summed smoothed loss / non-pad target tokens), no dropout."""
  weights = (batch["targets"] != 0).astype(np.float32)

  def mean_loss(p):
    logits = model_logits(model, p, batch)
    loss = jnp.sum(smoothed_kl(logits, batch["targets"], eps) * weights) / weights.sum()
    return loss, logits

  grads, logits = jax.jit(jax.grad(mean_loss, has_aux=True))(params)
  return np.asarray(logits), jax.device_get(grads)


@pytest.fixture(scope="module")
def global_batch():
  """The small model, a global batch, its loss sum and token count (float64 numpy, from the
  logits) and the reference gradient."""
  built = {}

  def init():
    built["model"], params = support.small_model()
    return params

  params = jax.device_get(jax.jit(init)())  # one compilation, not one per operation
  model = built["model"]
  batch = packed_batch(ROWS, LENGTH, seed=3)
  logits, grads = reference_gradient(model, params, batch, EPS_LS)
  total, count = ref.smoothed_cross_entropy(logits, batch["targets"], batch["targets"] != 0, EPS_LS)
  return model, params, batch, total, count, grads


def _per_device(batch, devices, micro=1):
  """[ROWS, L] -> `micro` batches of [devices, ROWS / (devices * micro), L]."""
  split = {k: v.reshape(micro, devices, -1, v.shape[-1]) for k, v in batch.items()}
  return [{k: v[i] for k, v in split.items()} for i in range(micro)]


def _replicated(params, devices, step=0):
  state = steps.TrainState.create(params, CAPTURE, jax.random.PRNGKey(1))
  state = jax.device_get(state.replace(step=jnp.array(step, jnp.int32)))
  return jax.tree.map(lambda x: np.stack([x] * devices), state)


@pytest.mark.parametrize(
  "devices,micro,start",
  [
    pytest.param(1, 1, 0, id="1 device, one step"),
    pytest.param(8, 3, 5, id="8 devices, 3 microbatches"),
    pytest.param(8, 1, 3, id="8 devices, one step", marks=pytest.mark.slow),
    pytest.param(1, 3, 0, id="1 device, 3 microbatches", marks=pytest.mark.slow),
  ],
)
def test_applied_gradient_is_grad_of_loss_over_global_tokens(devices, micro, start, global_batch):
  """The gradient the step applies and its grad_norm are jax.grad of the union's summed
  loss / its non-pad target tokens, however the union is split over devices and
  microbatches; the loss and token sums and the learning rate it reports are the union's."""
  assert jax.local_device_count() >= devices, "tests run with 8 simulated CPU devices"
  model, params, batch, total, count, want = global_batch
  schedule = optim.optimizer_schedule(model.config.d_model, 4)
  parts = _per_device(batch, devices, micro)
  local = [int(n) for p in parts for n in (p["targets"] != 0).sum(axis=(1, 2))]
  assert sum(local) == count
  assert devices * micro == 1 or len(set(local)) > 1  # a local normalisation would show
  p_state = _replicated(params, devices, start)
  if micro == 1:
    new, metrics = parallel.pmap_train_step(model, EPS_LS, schedule)(p_state, parts[0])
  else:
    accum = parallel.pmap_zero_accumulator()(p_state.params)
    accumulate = parallel.pmap_accumulate_step(model, EPS_LS)
    for i, part in enumerate(parts):
      accum = accumulate(p_state, accum, part, i)
    new, metrics = parallel.pmap_apply_step(schedule)(p_state, accum)
  metrics, got = jax.device_get((metrics, new.opt_state))
  for (path, g), w in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want)):
    scale = float(np.max(np.abs(w)))
    for device in range(devices):
      np.testing.assert_allclose(
        g[device], w, rtol=2e-4, atol=2e-5 * scale, err_msg=jax.tree_util.keystr(path)
      )
  norm = np.sqrt(sum(np.sum(np.asarray(w, np.float64) ** 2) for w in jax.tree.leaves(want)))
  np.testing.assert_allclose(metrics["grad_norm"], norm, rtol=1e-4)
  np.testing.assert_array_equal(metrics["denominator"], count)
  np.testing.assert_allclose(metrics["loss"], total, rtol=1e-5)
  np.testing.assert_allclose(metrics["learning_rate"], eq3(start + 1, 32, 4, 1.0), rtol=1e-6)
  assert (np.asarray(new.step) == start + 1).all()


def numpy_adam(grads, lrs, b1, b2, eps):
  """Updates of Adam (Kingma & Ba, algorithm 1) in float64, one per gradient."""
  m = v = np.zeros_like(grads[0], np.float64)
  out = []
  for t, (g, lr) in enumerate(zip(grads, lrs), start=1):
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    out.append(-lr * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps))
  return out


def test_make_optimizer_is_adam_090_098_1e9_with_eq3():
  """Six updates of make_optimizer, through warmup and past it, equal numpy's Adam with the
  paper's constants and eq. 3's rate, and no other constants would pass."""
  d_model, warmup, factor, n = 32, 3, 2.5, 6
  rng = np.random.default_rng(0)
  # Per coordinate: magnitudes near eps (where 1e-8 would differ from 1e-9) and O(1) ones
  # rescaled step to step (where b2 = 0.999 would weigh the history differently from 0.98).
  magnitude = np.array([1e-9, 3e-9, 1e-8, 2e-8, 1.0, 1.0, 1.0, 1.0])
  rescale = np.array([[1.0, 1.0, 1.0, 1.0, 1.0, 0.1, 10.0, 0.3]]).T ** np.arange(n)
  grads = [
    magnitude * rng.choice([-1.0, 1.0], 8) * rng.uniform(0.5, 1.5, 8) * rescale[:, t]
    for t in range(n)
  ]
  lrs = eq3(np.arange(1, n + 1), d_model, warmup, factor)
  tx = optim.make_optimizer(d_model, warmup, factor)
  params = {"w": jnp.zeros(8, jnp.float32)}
  state = tx.init(params)
  got, update = [], jax.jit(tx.update)
  for g in grads:
    updates, state = update({"w": jnp.asarray(g, jnp.float32)}, state, params)
    got.append(np.asarray(updates["w"], np.float64))
  want = numpy_adam(grads, lrs, 0.9, 0.98, 1e-9)
  np.testing.assert_allclose(np.stack(got), np.stack(want), rtol=3e-5, atol=0)
  # The gradients are chosen so that the wrong constants are far outside that tolerance.
  for wrong in (dict(b1=0.95), dict(b2=0.999), dict(eps=1e-8)):
    other = numpy_adam(grads, lrs, **{"b1": 0.9, "b2": 0.98, "eps": 1e-9, **wrong})
    assert np.max(np.abs(np.stack(other) / np.stack(want) - 1)) > 1e-2, wrong


WARMUP, FACTOR, TRAINER_EPS_LS = 2, 3.0, 0.3


def trainer_config(**overrides):
  """The tiny experiment, shrunk, with warmup 2, factor 3 and eps_ls 0.3: none of them the
  experiment's values or the defaults, so a trainer that dropped one would be seen."""
  config = tiny.get_config()
  assert config.warmup_steps != WARMUP and config.learning_rate_factor != FACTOR
  assert config.label_smoothing not in (TRAINER_EPS_LS, 0.1)
  config.model.update(d_model=16, d_ff=32, num_heads=2, num_layers=1, max_len=16)
  config.data.update(
    synthetic_train_size=500,
    synthetic_eval_size=16,
    synthetic_max_len=6,  # with EOS <= 7 tokens: every batch in the length-8 bucket
    tokens_per_batch=512,
    max_len=16,
  )
  config.update(
    num_train_steps=3,
    warmup_steps=WARMUP,
    learning_rate_factor=FACTOR,
    label_smoothing=TRAINER_EPS_LS,
    log_every_steps=1,
    eval_every_steps=1000,
    checkpoint_every_steps=1000,
    test_at_end=False,
    select_checkpoints="",
  )
  config.update(overrides)
  return config


def _record(patch, module, name, calls, keep_result=False):
  """Replaces module.name by a wrapper that appends (args, kwargs) (or with `keep_result`,
  what the call returned) to `calls`."""
  real = getattr(module, name)

  def recording(*args, **kwargs):
    result = real(*args, **kwargs)
    calls.append(result if keep_result else (args, kwargs))
    return result

  patch.setattr(module, name, recording)


def _argument(call, index, name):
  args, kwargs = call
  return kwargs[name] if name in kwargs else args[index]


class _Scalars(nn.Module):
  """Stands in for the Transformer where only the optimizer and schedule are looked at."""

  @nn.compact
  def __call__(self, inputs, targets):
    del inputs, targets
    return self.param("w", nn.initializers.zeros, (3,))


def test_trainer_hands_the_configs_values_to_its_steps_and_optimizer(monkeypatch):
  """label_smoothing reaches the train, accumulate and eval steps; warmup_steps and
  learning_rate_factor reach the schedule the steps log and the optimizer the run starts
  with: the learning rate logged and applied at steps below, at and above warmup is eq. 3."""
  names = ("pmap_train_step", "pmap_accumulate_step", "pmap_apply_step", "pmap_eval_step")
  calls = {name: [] for name in names}
  for name in names:
    _record(monkeypatch, parallel, name, calls[name])
  trainers = {}
  for accum in (1, 2):
    config = trainer_config(grad_accum_steps=accum)
    model, model_cfg = train.build_model(config, 20)
    trainers[accum] = train.Trainer(config, "unused", model, None, None, None, 5)
  for name in ("pmap_train_step", "pmap_accumulate_step"):
    assert [_argument(c, 1, "label_smoothing") for c in calls[name]] == [TRAINER_EPS_LS], name
  assert [_argument(c, 1, "label_smoothing") for c in calls["pmap_eval_step"]] == [
    TRAINER_EPS_LS
  ] * 2
  lrs = eq3(np.arange(1, 6), model_cfg.d_model, WARMUP, FACTOR)  # warmup 2: steps 1 to 5
  for schedule in (
    _argument(calls["pmap_train_step"][0], 2, "schedule"),
    _argument(calls["pmap_apply_step"][0], 0, "schedule"),
  ):
    got = [float(schedule(count)) for count in range(5)]  # optax counts updates from 0
    np.testing.assert_allclose(got, lrs, rtol=1e-6)

  # The trainer's apply step on the state init_state builds, with a constant gradient: Adam
  # then moves every parameter by lr_t * g / (|g| + eps) = lr_t / (1 + 1e-9) at every step t.
  state = train.init_state(_Scalars(), model_cfg, config)
  p_state, pending = parallel.replicate(state), []
  devices = jax.local_device_count()
  sums = dict(loss=6.0, nll=5.0, correct=1.0, denominator=2.0)
  accum = ({"w": np.full(3, 2.0, np.float32)}, sums)
  accum = jax.tree.map(lambda x: np.broadcast_to(np.float32(x), (devices, *np.shape(x))), accum)
  before = np.zeros(3)
  for lr in lrs:
    p_state, metrics = trainers[2].p_apply(p_state, accum)
    pending.append(metrics)
    np.testing.assert_allclose(parallel.host_metrics(metrics)["learning_rate"], lr, rtol=1e-6)
    # A copy: the next step donates the state's buffers.
    after = np.array(parallel.unreplicate(p_state.params)["w"], np.float64)
    np.testing.assert_allclose(before - after, lr, rtol=1e-4)  # float32 Adam
    before = after
  logged = train._sum_metrics(pending[-2:])  # what the trainer writes after steps 4 and 5
  np.testing.assert_allclose(logged["learning_rate"], lrs[-1], rtol=1e-6)
  np.testing.assert_allclose(logged["loss"], 3.0, rtol=1e-6)
  np.testing.assert_allclose(logged["grad_norm"], np.sqrt(3.0), rtol=1e-6)


@pytest.fixture(scope="module")
def trainer_run(tmp_path_factory):
  """3 steps of the trainer (below, at and above warmup), with what it handed to the step
  factories, the state it started from and the host batches it sharded."""
  config = trainer_config()
  workdir = str(tmp_path_factory.mktemp("trainer"))
  calls = {name: [] for name in ("pmap_train_step", "shard", "init_state")}
  with pytest.MonkeyPatch.context() as patch:
    for name in ("pmap_train_step", "shard"):
      _record(patch, parallel, name, calls[name])
    _record(patch, train, "init_state", calls["init_state"], keep_result=True)
    train.train_and_evaluate(config, workdir)
  return config, workdir, calls


@pytest.mark.slow
def test_trainer_logs_eq3_and_the_smoothed_loss(trainer_run):
  """metrics.jsonl of a real run: the learning rate of each step is eq. 3 of the config's
  warmup and factor; step 1's loss is the eps_ls = 0.3 loss of its batch."""
  config, workdir, calls = trainer_run
  records = [r for r in read_metrics(workdir) if "loss" in r]
  assert [r["step"] for r in records] == [1, 2, 3]  # below, at and above warmup_steps = 2
  for r in records:
    want = eq3(r["step"], config.model.d_model, WARMUP, FACTOR)
    np.testing.assert_allclose(r["learning_rate"], want, rtol=1e-6)
  (state,) = calls["init_state"]
  first = _argument(calls["shard"][0], 0, "batch")
  first = {k: np.asarray(v).reshape(-1, v.shape[-1]) for k, v in first.items()}
  model = _argument(calls["pmap_train_step"][0], 0, "model")
  logits = np.asarray(jax.jit(functools.partial(model_logits, model))(state.params, first))
  total, count = ref.smoothed_cross_entropy(
    logits, first["targets"], first["targets"] != 0, TRAINER_EPS_LS
  )
  assert records[0]["tokens"] == count
  np.testing.assert_allclose(records[0]["loss"], total / count, rtol=1e-5)


def test_accumulate_step_compiles_once_for_every_microbatch():
  """The zero accumulator carries the steps' axis name: micro-batch 1 reuses micro-batch 0's
  program (zeros under another axis name made the step compile twice)."""
  model, state = support.small_state()
  p_state = parallel.replicate(state)
  accumulate = parallel.pmap_accumulate_step(model, EPS_LS)
  rng = np.random.default_rng(0)
  shape = (jax.local_device_count(), 2, 6)
  parts = [
    parallel.shard(dict(inputs=x, targets=x))
    for x in (rng.integers(3, 40, shape).astype(np.int32) for _ in range(3))
  ]
  accum = jax.block_until_ready(parallel.pmap_zero_accumulator()(p_state.params))
  compiles = []
  listener = lambda name, secs, **kw: compiles.append(name)
  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    for i, part in enumerate(parts):
      accum = jax.block_until_ready(accumulate(p_state, accum, part, i))
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
  # Lowering, not the backend compile: a program loaded from the compilation cache is not
  # compiled again but is still lowered once per distinct signature.
  assert compiles.count("/jax/core/compile/jaxpr_to_mlir_module_duration") == 1
