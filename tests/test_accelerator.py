"""On a GPU or TPU: cuDNN attention against the reference path, bfloat16 training against
float32, and the configuration launch/gpu_bench.sh times.

Every test here is marked `accelerator`. Run them with `pytest -m accelerator` (tests/conftest.py
then leaves the JAX platform to JAX); wherever JAX sees only CPUs they are skipped, with the
reason. The cuDNN tests also need the GPU to be an NVIDIA one.

Tolerances: bfloat16 keeps 8 significant bits (a relative step of 2^-8, 0.4%). Two bf16
computations of the same values that round at different points (a fused kernel, an einsum
chain) differ by a few such steps, and more in gradients that sum many of them. So the cuDNN
path is held to the accuracy of the reference path in bf16, both measured against float32.
"""

import importlib
import os
import shlex
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t_jax.bench import timing
from t2t_jax.bench import train as bench
from t2t_jax.model import Transformer, TransformerConfig, attention
from t2t_jax.tokens import EOS_ID, PAD_ID
from t2t_jax.training import optim, parallel, steps
from tests import support

pytestmark = pytest.mark.accelerator

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BF16_RTOL = 2e-2  # a few bf16 steps


@pytest.fixture
def nvidia_gpu():
  """cuDNN runs only on NVIDIA GPUs (a TPU or a ROCm GPU still gets the other tests)."""
  device = jax.devices()[0]
  version = getattr(getattr(device, "client", None), "platform_version", "")
  if device.platform != "gpu" or "rocm" in version.lower():
    pytest.skip(f"cuDNN attention needs an NVIDIA GPU; JAX runs on {device.device_kind}")


def _relative_error(x, truth):
  x, truth = (np.asarray(a, np.float64) for a in (x, truth))
  return float(np.linalg.norm(x - truth) / np.linalg.norm(truth))


def _assert_as_accurate(got, ours, truth, what):
  """`got` (bf16 through cuDNN) is about as close to the float32 `truth` as `ours` (bf16
  through the reference path) is: within twice its relative error, plus 1%."""
  assert np.shape(got) == np.shape(truth) and np.all(np.isfinite(got)), what
  error, ours_error = _relative_error(got, truth), _relative_error(ours, truth)
  assert error <= 2 * ours_error + 0.01, f"{what}: {error:.4f} vs the reference's {ours_error:.4f}"


def _lengths_mask(q_lengths, k_lengths, q_len, k_len, causal):
  """bool [batch, 1, q_len, k_len]: real queries may see real keys (and, if causal, no
  later ones); a padded query row has no key at all."""
  q_ok = np.arange(q_len)[None] < np.asarray(q_lengths)[:, None]
  k_ok = np.arange(k_len)[None] < np.asarray(k_lengths)[:, None]
  mask = q_ok[:, None, :, None] & k_ok[:, None, None, :]
  if causal:
    mask = mask & np.tril(np.ones((q_len, k_len), bool))
  return mask


@pytest.mark.parametrize("causal", [False, True], ids=["padding", "causal+padding"])
def test_cudnn_attention_matches_the_reference_on_a_ragged_batch(nvidia_gpu, causal):
  # Even lengths: cuDNN's backward pass with a mask (a bias) needs them.
  batch, heads, depth = 3, 4, 64
  q_len, k_len = (12, 12) if causal else (10, 12)
  q_lengths, k_lengths = ([12, 7, 2], [12, 7, 2]) if causal else ([10, 6, 1], [12, 5, 1])
  mask = jnp.asarray(_lengths_mask(q_lengths, k_lengths, q_len, k_len, causal))
  rng = np.random.default_rng(0)
  q, k, v, cotangent = (
    jnp.asarray(rng.normal(0, 1, shape), jnp.bfloat16)
    for shape in [(batch, q_len, heads, depth), *2 * [(batch, k_len, heads, depth)]]
    + [(batch, q_len, heads, depth)]
  )

  def run(implementation, dtype):
    def loss(q, k, v):
      out = attention.dot_product_attention(q, k, v, mask, implementation=implementation)
      return jnp.sum(out.astype(jnp.float32) * cotangent.astype(jnp.float32)), out

    grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))
    (_, out), grads = grad(*(x.astype(dtype) for x in (q, k, v)))
    return (out, *grads)

  got = run("cudnn", jnp.bfloat16)
  ours = run("reference", jnp.bfloat16)
  truth = run("reference", jnp.float32)
  for name, *values in zip(("output", "dq", "dk", "dv"), got, ours, truth):
    _assert_as_accurate(*values, name)
  # A query row with no key to attend to is 0 on both paths (padding never leaks).
  empty = ~np.asarray(mask).any(-1)[:, 0]  # [batch, q_len]
  assert empty.any() and np.all(np.asarray(got[0], np.float32)[empty] == 0)


def _ragged_batch(rows, src_len=12, tgt_len=10, vocab=40, seed=0):
  """Sources and targets ending in EOS, padded with 0, every row a different length."""
  rng = np.random.default_rng(seed)
  inputs = np.full((rows, src_len), PAD_ID, np.int32)
  targets = np.full((rows, tgt_len), PAD_ID, np.int32)
  for r in range(rows):
    n, m = rng.integers(2, src_len + 1), rng.integers(2, tgt_len + 1)
    inputs[r, : n - 1], inputs[r, n - 1] = rng.integers(4, vocab, n - 1), EOS_ID
    targets[r, : m - 1], targets[r, m - 1] = rng.integers(4, vocab, m - 1), EOS_ID
  inputs[0], targets[0] = rng.integers(4, vocab, src_len), rng.integers(4, vocab, tgt_len)
  inputs[0, -1] = targets[0, -1] = EOS_ID  # one row without padding
  return dict(inputs=jnp.asarray(inputs), targets=jnp.asarray(targets))


def test_cudnn_model_gives_the_reference_logits_and_gradients(nvidia_gpu):
  """The bf16 model with attention_impl='cudnn' against 'reference', same parameters, on a
  ragged padded batch: encoder padding, decoder causal + padding, cross-attention padding."""
  model, params = support.small_model(
    dtype="bfloat16", d_model=64, d_ff=128, num_heads=2, num_layers=2, loss_chunk_tokens=0
  )  # heads of 32 dimensions, a size every cuDNN attention kernel takes
  batch = _ragged_batch(rows=6)
  real = np.asarray(batch["targets"]) != PAD_ID

  def run(**changes):
    m = Transformer(model.config.replace(**changes))

    def loss(p):
      sums = steps.batch_loss_sums(p, batch, model=m, label_smoothing=0.1)
      return sums["loss"] / sums["denominator"]

    logits = jax.jit(lambda p: m.apply({"params": p}, batch["inputs"], batch["targets"]))(params)
    loss, grads = jax.jit(jax.value_and_grad(loss))(params)
    return np.asarray(logits, np.float32)[real], float(loss), grads

  got, ours, truth = run(attention_impl="cudnn"), run(), run(dtype="float32")
  _assert_as_accurate(got[0], ours[0], truth[0], "logits")
  assert got[1] == pytest.approx(truth[1], rel=BF16_RTOL)
  flat = jax.tree_util.tree_flatten_with_path(got[2])[0]
  for (path, g), o, t in zip(
    flat, jax.tree.leaves(ours[2]), jax.tree.leaves(truth[2]), strict=True
  ):
    assert g.dtype == jnp.float32  # gradients of float32 parameters
    _assert_as_accurate(g, o, t, f"d loss / d {jax.tree_util.keystr(path)}")


def _train(dtype, batch, num_steps, warmup_steps=32):
  """(per-step losses, final state) of `num_steps` pmapped steps on `batch`, from seed 0.

  A warmup long enough that the loss falls steadily: at the peak rate of a short one the
  loss rises again, and then bf16's rounding and float32's take different paths."""
  model, state = support.small_state(dtype=dtype, warmup_steps=warmup_steps)
  schedule = optim.optimizer_schedule(model.config.d_model, warmup_steps)
  step = parallel.pmap_train_step(model, 0.1, schedule)
  devices = jax.local_device_count()
  sharded = parallel.shard(
    {k: np.asarray(v).reshape((devices, -1) + v.shape[1:]) for k, v in batch.items()}
  )
  p_state, out = parallel.replicate(state), []
  for _ in range(num_steps):
    p_state, metrics = step(p_state, sharded)
    host = parallel.host_metrics(metrics)
    out.append(host["loss"] / host["denominator"])
  return np.array(out), parallel.unreplicate(p_state)


def test_bfloat16_training_steps_track_float32():
  batch = _ragged_batch(rows=2 * jax.local_device_count())
  losses, state = _train("bfloat16", batch, num_steps=8)
  want, _ = _train("float32", batch, num_steps=8)
  assert np.all(np.isfinite(losses)) and np.all(np.diff(losses) < 0), losses
  assert losses[-1] < losses[0] - 1.0, losses
  # Parameters and Adam's moments stay float32; only the computation is bf16.
  for leaf in jax.tree.leaves((state.params, state.opt_state)):
    assert leaf.dtype in (jnp.float32, jnp.int32), leaf.dtype
  np.testing.assert_allclose(losses, want, rtol=BF16_RTOL)


def _gpu_bench_flags(tmp_path, experiment):
  """The t2t-bench flags launch/gpu_bench.sh passes for `experiment`, from its dry run."""
  proc = subprocess.run(
    [
      "bash",
      os.path.join(REPO, "launch", "gpu_bench.sh"),
      "--dry-run",
      "--no-check",  # the configuration is under test here, not the installed packages
      str(tmp_path / "out"),
    ],
    env=dict(os.environ, T2T_SHARED_DATA=str(tmp_path)),
    capture_output=True,
    text=True,
    timeout=60,
  )
  assert proc.returncode == 0, proc.stderr
  for line in proc.stdout.splitlines():
    args = shlex.split(line.removeprefix("+ "))
    if args[0] == "t2t-bench" and f"--experiment={experiment}" in args:
      return dict(a[2:].split("=", 1) for a in args[1:] if a.startswith("--") and "=" in a)
  raise AssertionError(f"no --experiment={experiment} run in:\n{proc.stdout}")


def test_gpu_bench_configuration_trains(tmp_path):
  """The base model as launch/gpu_bench.sh times it (its batch, dtype and attention): two
  steps of bench.py's train step, the second without compiling anything."""
  flags = _gpu_bench_flags(tmp_path, "base")
  config = importlib.import_module(f"t2t_jax.experiments.{flags['experiment']}").get_config()
  for key, value in flags.items():
    if key.startswith("config.model."):
      field = key.removeprefix("config.model.")
      config.model[field] = type(config.model[field])(value)
  cfg = TransformerConfig.from_dict(
    config.model.to_dict(), vocab_size=int(flags.get("vocab_size", 0)) or config.data.vocab_size
  )
  if cfg.attention_impl == "cudnn":
    device = jax.devices()[0]
    if device.platform != "gpu":
      pytest.skip(f"gpu_bench.sh asks for cuDNN attention; JAX runs on {device.device_kind}")
  seq_len = int(flags["seq_len"])
  rows = bench.train_rows(int(flags["batch_tokens"]), seq_len, jax.local_device_count())
  setup = bench.setup_train(cfg, config.warmup_steps, config.label_smoothing, rows, seq_len)
  state, metrics = setup.step(setup.state, setup.batch)
  counter = timing.CompileCounter()
  state, metrics = setup.step(state, setup.batch)
  jax.block_until_ready(metrics)
  assert counter.count == 0
  host = parallel.host_metrics(metrics)
  assert host["denominator"] == rows * seq_len
  nll = host["nll"] / host["denominator"]
  assert np.isfinite(host["loss"]) and abs(nll - np.log(cfg.vocab_size)) < 1.5, nll
  params = parallel.unreplicate(state.params)
  assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(params))
