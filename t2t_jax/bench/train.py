"""t2t_jax's training step: step time, target tokens/s, model FLOPs and MFU.

Model FLOPs (per training step, on full-length synthetic batches, so every token is real):
  6 * (encoder non-embedding params * source tokens + decoder non-embedding params * target
  tokens)  [forward 2, backward 4 per parameter and token]
  + 6 * d_model * vocab * target tokens  [pre-softmax layer; shared with the embedding]
  + 3 * sum over attention layers of 4 * q_len * kv_len * h * d_k  [QK^T and AV, full
  matrices, as computed]. Embedding lookups, layer norms, softmax and the optimizer are not
  counted (standard MFU practice).
"""

import dataclasses
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax.typing import VariableDict

from t2t_jax.bench import inputs, timing
from t2t_jax.model import Transformer, TransformerConfig
from t2t_jax.training import optim, parallel, profile, steps


def _non_embedding(params: VariableDict) -> tuple[int, int]:
  """(encoder, decoder) parameter counts without embeddings and position tables."""
  count = lambda tree: sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree))
  strip = lambda tree: {k: v for k, v in tree.items() if k != "positions"}
  return count(strip(params["encoder"])), count(strip(params["decoder"]))


def model_flops_per_step(
  cfg: TransformerConfig, params: VariableDict, rows: int, src_len: int, tgt_len: int
) -> float:
  """The model FLOPs of one training step on rows x (src_len, tgt_len) tokens (module doc)."""
  enc, dec = _non_embedding(params)
  src_tokens, tgt_tokens = rows * src_len, rows * tgt_len
  dense = 6 * (enc * src_tokens + dec * tgt_tokens)
  softmax = 6 * cfg.d_model * cfg.vocab_size * tgt_tokens
  per_pair = lambda q, k: 2 * q * k * cfg.num_heads * (cfg.key_dim + cfg.value_dim)
  attention = rows * (
    cfg.encoder_layers * per_pair(src_len, src_len)
    + cfg.decoder_layers * (per_pair(tgt_len, tgt_len) + per_pair(tgt_len, src_len))
  )
  return dense + softmax + 3 * attention


def train_rows(batch_tokens: int, seq_len: int, devices: int) -> int:
  """Rows of the synthetic batch: batch_tokens / seq_len, a multiple of the devices."""
  return max(devices, batch_tokens // seq_len // devices * devices)


def model_config(config: ml_collections.ConfigDict, vocab_size: int) -> TransformerConfig:
  """The experiment's model at the benchmark's vocabulary size."""
  return TransformerConfig.from_dict(config.model.to_dict(), vocab_size=vocab_size)


@dataclasses.dataclass
class TrainSetup:
  """t2t_jax's training step as measure_train times it, for reuse by the peer comparison."""

  cfg: TransformerConfig
  params: VariableDict  # the initial parameters (counts, FLOPs); the state holds copies
  state: steps.TrainState  # replicated on the local devices; donated by `step`
  step: Callable[..., tuple[steps.TrainState, dict[str, jax.Array]]]
  host_batch: dict[str, np.ndarray]  # int32 [devices, rows / devices, seq_len]
  batch: dict[str, jax.Array]  # host_batch on the devices
  rows: int
  devices: int


def setup_train(
  cfg: TransformerConfig,
  warmup_steps: int,
  label_smoothing: float,
  rows: int,
  seq_len: int,
  ema_decay: float = 0.0,
) -> TrainSetup:
  """Initial parameters, replicated Adam state (with a moving average of the parameters when
  `ema_decay` > 0), the pmapped train step and a synthetic batch of rows x seq_len random ids
  on both sides (no padding: every token is real)."""
  model = Transformer(cfg)
  devices = jax.local_device_count()
  dummy = jnp.ones((1, 8), jnp.int32)
  params = jax.jit(model.init)(jax.random.PRNGKey(0), dummy, dummy)["params"]
  tx = optim.make_optimizer(cfg.d_model, warmup_steps)
  state = parallel.replicate(steps.TrainState.create(params, tx, jax.random.PRNGKey(1), ema_decay))
  schedule = optim.optimizer_schedule(cfg.d_model, warmup_steps)
  step = parallel.pmap_train_step(model, label_smoothing, schedule)
  host_batch = inputs.synthetic_batch(rows, seq_len, seq_len, cfg.vocab_size, devices)
  batch = parallel.shard(host_batch)
  return TrainSetup(cfg, params, state, step, host_batch, batch, rows, devices)


def measure_train(
  config: ml_collections.ConfigDict,
  vocab_size: int,
  batch_tokens: int,
  seq_len: int,
  num_steps: int,
  counter: timing.CompileCounter,
  profile_dir: str | None = None,
) -> dict[str, Any]:
  """The train figure of t2t-bench: median step time of `num_steps` after a warm-up step,
  tokens/s, model FLOPs, achieved FLOP/s, compilations after warm-up and peak memory. With
  `profile_dir`, the timed steps are traced there (jax.profiler; training/profile.py)."""
  cfg = model_config(config, vocab_size)
  rows = train_rows(batch_tokens, seq_len, jax.local_device_count())
  setup = setup_train(
    cfg, config.warmup_steps, config.label_smoothing, rows, seq_len, config.ema_decay
  )
  state, step, batch = setup.state, setup.step, setup.batch
  t0 = time.perf_counter()
  state, metrics = step(state, batch)
  jax.block_until_ready(metrics)
  first = time.perf_counter() - t0
  compiles_before = counter.count
  times = []
  profiler = profile.StepProfiler((1, num_steps), profile_dir or "", bool(profile_dir))
  for i in range(1, num_steps + 1):
    t0 = time.perf_counter()
    with profiler.step(i):
      state, metrics = step(state, batch)
      jax.block_until_ready(metrics)
    times.append(time.perf_counter() - t0)
    profiler.finished(i, metrics)
  median = statistics.median(times)
  flops = model_flops_per_step(cfg, setup.params, rows, seq_len, seq_len)
  tgt_tokens = rows * seq_len
  return dict(
    params=sum(int(np.prod(x.shape)) for x in jax.tree.leaves(setup.params)),
    devices=setup.devices,
    rows=rows,
    seq_len=seq_len,
    target_tokens_per_step=tgt_tokens,
    dropout_rate=cfg.dropout_rate,
    ema_decay=config.ema_decay,
    profiled=bool(profile_dir),
    dtype=cfg.dtype.name,
    step_time_s=median,
    step_times_s=times,
    compile_s=first - median,
    compiles_after_warmup=counter.count - compiles_before,
    target_tokens_per_s=tgt_tokens / median,
    model_flops_per_step=flops,
    model_flops_per_target_token=flops / tgt_tokens,
    achieved_flops=flops / median,
    **timing.peak_memory(),
  )
