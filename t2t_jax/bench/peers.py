"""The training step side by side with peer implementations of the same model (`--vs=peers`).

    t2t-bench --experiment=tiny --config.model.d_model=128 --config.model.d_ff=512 \
        --config.model.dropout_rate=0.1 --vocab_size=8000 --batch_tokens=4096 --seq_len=32 \
        --parts=peak,train --vs=peers
    t2t-bench --experiment=base --vocab_size=32000 --batch_tokens=2048 --seq_len=32 \
        --parts=peak,train --vs=peers

A figure of tokens/s says little until the same model on the same machine has been timed in
the libraries people would otherwise use. Four systems train the same model size on the same
workload:

- t2t_jax: train.setup_train (the pmapped train step of t2t_jax.training.parallel);
- torch: `torch.nn.Transformer` (batch_first, post-LN, relu), embedding scaled by
  sqrt(d_model) plus the sinusoidal table, output projection tied to the embedding,
  `F.cross_entropy(label_smoothing=...)` ignoring padding, torch.optim.Adam + LambdaLR;
- flax: a plain flax.linen Transformer written the way flax's examples/wmt writes one
  (nn.MultiHeadDotProductAttention, nn.Dense, nn.LayerNorm, post-LN, one-hot smoothed labels
  into optax.softmax_cross_entropy), one jax.jit train step with optax.adam;
- marian: Hugging Face's MarianMTModel from a MarianConfig of the same size (relu, scaled
  embeddings, static sinusoidal positions, tied embeddings, pad id 0), the loss computed
  from its logits with label smoothing, torch.optim.Adam + LambdaLR.

The same on every system: rows x seq_len random ids on both sides (inputs.synthetic_batch,
repeated every step), vocabulary, float32, Adam(0.9, 0.98, 1e-9) with the paper's
warmup / inverse-square-root rate, the config's label smoothing, and the same dropout:
P_drop on the embeddings and on each sub-layer's output, the config's attention dropout on
the attention weights, none inside the feed-forward layer (torch.nn.Transformer also drops
the attention weights and the feed-forward hidden layer at P_drop unless told otherwise; it
is told, so that no system does more or less dropout work than the others). Peers get
padding masks as their users pass them (t2t_jax always builds its own); the batch has no
padding, so the masks change no value.

Each system is built and runs one warm-up step (compilation for the jax ones), then the
repetitions are interleaved (t2t_jax, torch, flax, marian, t2t_jax, ...) so that machine
noise hits all of them; a repetition is `steps` steps and yields its median step time, and
a system's figure is the median of those. Achieved FLOP/s use train.model_flops_per_step
for every system (the same model maths), MFU the peak of `--parts=peak`. torch and
transformers are optional (the `export` extra): a system whose import fails gets a
"not installed" row. torch runs on as many threads as XLA uses (timing.cpu_threads);
its OpenMP regions wait for their slowest thread, so a job sharing the cores slows torch (and
Marian) far more than XLA: on 2 busy cores a torch step of the tiny command took 3.7 s on 2
threads and 0.73 s on 1. Compare on a quiet machine.

Parameter counts differ by design in one place: every peer puts a bias on each attention's
key projection, which t2t_jax leaves out (the softmax cancels it: layers.MultiHeadAttention),
d_model x (encoder layers + 2 x decoder layers) parameters in all. Marian's
final_logits_bias is a buffer (zeros, not trained) and its sinusoidal tables are frozen, so
they are not counted.
"""

import dataclasses
import functools
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.typing import VariableDict

from t2t_jax.bench import timing
from t2t_jax.bench.train import (
  TrainSetup,
  model_config,
  model_flops_per_step,
  setup_train,
  train_rows,
)
from t2t_jax.model import TransformerConfig, positional
from t2t_jax.tokens import BOS_ID, PAD_ID
from t2t_jax.training import optim

SYSTEMS = ("t2t_jax", "torch", "flax", "marian")
xavier = nn.initializers.xavier_uniform()


@dataclasses.dataclass(frozen=True)
class Workload:
  """One model size and one batch of rows x seq_len ids per side, the same for every system."""

  model: TransformerConfig
  rows: int
  seq_len: int
  label_smoothing: float = 0.1
  warmup_steps: int = 4000


@dataclasses.dataclass
class System:
  """A built system: run() takes one training step and returns its mean loss (a host sync,
  so the step has finished when it returns)."""

  run: Callable[[], float]
  params: int  # trained parameters, shared ones once
  device: str
  version: str


def paper_rate(d_model: int, warmup_steps: int) -> Callable[[int], float]:
  """optim.optimizer_schedule in plain Python for torch's LambdaLR (update count from 0)."""

  def rate(count: int) -> float:
    step = count + 1
    return d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)

  return rate


def key_bias_params(cfg: TransformerConfig) -> int:
  """Parameters every peer has beyond t2t_jax: a d_model bias on each attention's keys."""
  return cfg.d_model * (cfg.encoder_layers + 2 * cfg.decoder_layers)


def _count(tree: VariableDict) -> int:
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree))


def check_comparable(cfg: TransformerConfig) -> None:
  """The peers are written for the paper's model; refuse configurations they do not build."""
  paper = dict(norm="post", positional="sinusoidal", share_embeddings=True)
  different = {k: getattr(cfg, k) for k, v in paper.items() if getattr(cfg, k) != v}
  if cfg.key_dim * cfg.num_heads != cfg.d_model or cfg.value_dim != cfg.key_dim:
    different["d_k, d_v"] = (cfg.key_dim, cfg.value_dim)
  if cfg.dtype != jnp.float32:
    different["dtype"] = cfg.dtype.name
  if different:
    raise ValueError(
      f"--vs=peers times the paper's model (post-LN, sinusoidal, shared embeddings, "
      f"d_k = d_v = d_model / h, float32); this config differs in {different}"
    )


# t2t_jax ---------------------------------------------------------------------------------


def t2t_jax_system(setup: TrainSetup) -> System:
  """train.setup_train's pmapped train step on its replicated state (donated step by step)."""
  state = setup.state

  def run() -> float:
    nonlocal state
    state, metrics = setup.step(state, setup.batch)
    return float(np.asarray(metrics["loss"])[0] / np.asarray(metrics["denominator"])[0])

  platform = jax.devices()[0].platform
  return System(run, _count(setup.params), f"{platform} x{setup.devices}", f"jax {jax.__version__}")


# flax: the straightforward way -------------------------------------------------------------


class FlaxLayer(nn.Module):
  """A post-LN encoder layer, or a decoder layer when `cross`, as flax's examples/wmt."""

  config: TransformerConfig
  cross: bool = False

  @nn.compact
  def __call__(
    self,
    x: jax.Array,
    mask: jax.Array,
    encoded: jax.Array | None = None,
    cross_mask: jax.Array | None = None,
    *,
    train: bool = False,
  ) -> jax.Array:
    cfg = self.config
    attention = lambda: nn.MultiHeadDotProductAttention(
      cfg.num_heads,
      dropout_rate=cfg.attention_dropout_rate,
      deterministic=not train,
      kernel_init=xavier,
    )
    block = lambda x, sublayer: nn.LayerNorm(epsilon=1e-6)(
      x + nn.Dropout(cfg.dropout_rate)(sublayer(x), deterministic=not train)
    )
    x = block(x, lambda y: attention()(y, y, mask=mask))
    if self.cross:
      x = block(x, lambda y: attention()(y, encoded, mask=cross_mask))
    ffn = lambda y: nn.Dense(cfg.d_model, kernel_init=xavier)(
      nn.relu(nn.Dense(cfg.d_ff, kernel_init=xavier)(y))
    )
    return block(x, ffn)


class FlaxTransformer(nn.Module):
  """Encoder-decoder with one shared embedding (inputs, targets, pre-softmax), as examples/wmt."""

  config: TransformerConfig

  @nn.compact
  def __call__(self, inputs: jax.Array, targets: jax.Array, *, train: bool = False) -> jax.Array:
    cfg = self.config
    embed = nn.Embed(
      cfg.vocab_size, cfg.d_model, embedding_init=nn.initializers.normal(cfg.d_model**-0.5)
    )
    table = positional.sinusoidal(cfg.max_len, cfg.d_model)

    def embed_with_positions(ids: jax.Array) -> jax.Array:
      x = embed(ids) * jnp.sqrt(cfg.d_model) + table[None, : ids.shape[1]]
      return nn.Dropout(cfg.dropout_rate)(x, deterministic=not train)

    x = embed_with_positions(inputs)
    for _ in range(cfg.encoder_layers):
      x = FlaxLayer(cfg)(x, nn.make_attention_mask(inputs > 0, inputs > 0), train=train)
    decoder_inputs = jnp.pad(targets, ((0, 0), (1, 0)), constant_values=BOS_ID)[:, :-1]
    self_mask = nn.combine_masks(
      nn.make_attention_mask(targets > 0, targets > 0), nn.make_causal_mask(targets)
    )
    cross_mask = nn.make_attention_mask(targets > 0, inputs > 0)
    y = embed_with_positions(decoder_inputs)
    for _ in range(cfg.decoder_layers):
      y = FlaxLayer(cfg, cross=True)(y, self_mask, x, cross_mask, train=train)
    return embed.attend(y)


def flax_system(workload: Workload, inputs: np.ndarray, targets: np.ndarray) -> System:
  """One jax.jit step: smoothed one-hot labels, optax.softmax_cross_entropy, optax.adam."""
  cfg = workload.model
  model = FlaxTransformer(cfg)
  inputs, targets = jnp.asarray(inputs), jnp.asarray(targets)
  params = jax.jit(model.init)(jax.random.PRNGKey(0), inputs[:1], targets[:1])["params"]
  schedule = optim.optimizer_schedule(cfg.d_model, workload.warmup_steps)
  tx = optax.adam(schedule, b1=optim.ADAM_B1, b2=optim.ADAM_B2, eps=optim.ADAM_EPS)
  rng = jax.random.PRNGKey(1)

  def loss_fn(params: VariableDict, inputs: jax.Array, targets: jax.Array, key: jax.Array):
    logits = model.apply({"params": params}, inputs, targets, train=True, rngs={"dropout": key})
    labels = optax.smooth_labels(jax.nn.one_hot(targets, cfg.vocab_size), workload.label_smoothing)
    weights = (targets != PAD_ID).astype(jnp.float32)
    return jnp.sum(optax.softmax_cross_entropy(logits, labels) * weights) / jnp.sum(weights)

  @functools.partial(jax.jit, donate_argnums=(0,))
  def train_step(state: tuple, inputs: jax.Array, targets: jax.Array):
    params, opt_state, step = state
    key = jax.random.fold_in(rng, step)
    loss, grads = jax.value_and_grad(loss_fn)(params, inputs, targets, key)
    updates, opt_state = tx.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state, step + 1), loss

  state = (params, tx.init(params), jnp.zeros((), jnp.int32))
  count = _count(params)

  def run() -> float:
    nonlocal state
    state, loss = train_step(state, inputs, targets)
    return float(loss)

  return System(run, count, jax.devices()[0].platform, f"flax {flax.__version__}")


# torch and Marian --------------------------------------------------------------------------


def _torch_trainer(
  model: Any,
  logits_fn: Callable[[Any, Any], Any],
  workload: Workload,
  inputs: np.ndarray,
  targets: np.ndarray,
  version: str,
) -> System:
  """torch.optim.Adam + LambdaLR on `model`; the loss is cross-entropy of logits_fn(src, tgt)
  with label smoothing, padding ignored."""
  import torch
  from torch.nn import functional

  device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
  model.to(device).train()
  src = torch.from_numpy(inputs).long().to(device)
  tgt = torch.from_numpy(targets).long().to(device)
  trained = [p for p in model.parameters() if p.requires_grad]
  adam = torch.optim.Adam(trained, lr=1.0, betas=(optim.ADAM_B1, optim.ADAM_B2), eps=optim.ADAM_EPS)
  rate = paper_rate(workload.model.d_model, workload.warmup_steps)
  schedule = torch.optim.lr_scheduler.LambdaLR(adam, rate)

  def run() -> float:
    adam.zero_grad(set_to_none=True)
    logits = logits_fn(src, tgt)
    loss = functional.cross_entropy(
      logits.reshape(-1, logits.shape[-1]),
      tgt.reshape(-1),
      ignore_index=PAD_ID,
      label_smoothing=workload.label_smoothing,
    )
    loss.backward()
    adam.step()
    schedule.step()
    return loss.item()

  return System(run, sum(p.numel() for p in trained), device.type, version)


def _decoder_inputs(tgt: Any) -> Any:
  """Targets shifted right behind BOS, as t2t_jax's shift_right."""
  from torch.nn import functional

  return functional.pad(tgt, (1, 0), value=BOS_ID)[:, :-1]


def torch_system(workload: Workload, inputs: np.ndarray, targets: np.ndarray) -> System:
  """torch.nn.Transformer with the paper's embeddings, positions and tied output layer."""
  import torch
  from torch import nn as tnn
  from torch.nn import functional

  cfg = workload.model
  torch.manual_seed(0)

  def paper_dropout(layer: tnn.Module) -> tnn.Module:
    """Dropout on sub-layer outputs only: none in the feed-forward hidden layer, the config's
    attention dropout on the attention weights (as t2t_jax and Marian here)."""
    layer.dropout = tnn.Identity()
    for attention in (layer.self_attn, getattr(layer, "multihead_attn", None)):
      if attention is not None:
        attention.dropout = cfg.attention_dropout_rate
    return layer

  layer = dict(
    d_model=cfg.d_model,
    nhead=cfg.num_heads,
    dim_feedforward=cfg.d_ff,
    dropout=cfg.dropout_rate,
    activation="relu",
    batch_first=True,
    norm_first=False,
  )

  class PaperTransformer(tnn.Module):
    def __init__(self) -> None:
      super().__init__()
      self.embed = tnn.Embedding(cfg.vocab_size, cfg.d_model)
      tnn.init.normal_(self.embed.weight, std=cfg.d_model**-0.5)
      table = np.array(positional.sinusoidal(cfg.max_len, cfg.d_model))  # writable copy
      self.register_buffer("positions", torch.from_numpy(table))
      self.drop = tnn.Dropout(cfg.dropout_rate)
      # Post-LN layers end in a norm already: no extra final norm on either stack (the
      # default nn.Transformer adds one).
      encoder = tnn.TransformerEncoder(
        paper_dropout(tnn.TransformerEncoderLayer(**layer)),
        cfg.encoder_layers,
        enable_nested_tensor=False,
      )
      decoder = tnn.TransformerDecoder(
        paper_dropout(tnn.TransformerDecoderLayer(**layer)), cfg.decoder_layers
      )
      self.transformer = tnn.Transformer(
        d_model=cfg.d_model,
        nhead=cfg.num_heads,
        custom_encoder=encoder,
        custom_decoder=decoder,
        batch_first=True,
      )

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
      x = self.embed(ids) * cfg.d_model**0.5 + self.positions[: ids.shape[1]]
      return self.drop(x)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
      length = tgt.shape[1]
      causal = torch.triu(torch.ones(length, length, dtype=torch.bool, device=tgt.device), 1)
      y = self.transformer(
        self._embed(src),
        self._embed(_decoder_inputs(tgt)),
        tgt_mask=causal,
        src_key_padding_mask=src == PAD_ID,
        tgt_key_padding_mask=tgt == PAD_ID,
        memory_key_padding_mask=src == PAD_ID,
        tgt_is_causal=True,
      )
      return functional.linear(y, self.embed.weight)

  model = PaperTransformer()
  return _torch_trainer(model, model, workload, inputs, targets, f"torch {torch.__version__}")


def marian_system(workload: Workload, inputs: np.ndarray, targets: np.ndarray) -> System:
  """MarianMTModel from the MarianConfig the Hugging Face export writes, dropout as t2t_jax's."""
  import torch
  import transformers

  from t2t_jax.export import to_huggingface

  cfg = workload.model
  torch.manual_seed(0)
  config = transformers.MarianConfig(
    **dict(
      to_huggingface.marian_config(cfg),
      dropout=cfg.dropout_rate,
      attention_dropout=cfg.attention_dropout_rate,
      activation_dropout=0.0,
      use_cache=False,
    )
  )
  model = transformers.MarianMTModel(config)

  def logits_fn(src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
    # As Hugging Face seq2seq training passes it: the source mask, causal decoder.
    return model(
      input_ids=src, attention_mask=src != PAD_ID, decoder_input_ids=_decoder_inputs(tgt)
    ).logits

  version = f"transformers {transformers.__version__}"
  return _torch_trainer(model, logits_fn, workload, inputs, targets, version)


def compare_experiment(
  config: Any,
  vocab_size: int,
  batch_tokens: int,
  seq_len: int,
  *,
  steps: int,
  repeats: int,
  counter: timing.CompileCounter | None = None,
  peak: dict[str, Any] | None = None,
) -> dict[str, Any]:
  """`compare` on an experiment config's model, label smoothing and warmup, with t2t-bench's
  synthetic batch of batch_tokens / seq_len rows."""
  workload = Workload(
    model=model_config(config, vocab_size),
    rows=train_rows(batch_tokens, seq_len, jax.local_device_count()),
    seq_len=seq_len,
    label_smoothing=config.label_smoothing,
    warmup_steps=config.warmup_steps,
  )
  return compare(workload, steps=steps, repeats=repeats, peak=peak, counter=counter)


# The comparison ------------------------------------------------------------------------------


def _build(name: str, workload: Workload, setup: TrainSetup, threads: int) -> System | str:
  """The system, or why not ("not installed (...)") when an optional import fails."""
  inputs = setup.host_batch["inputs"].reshape(setup.rows, workload.seq_len)
  targets = setup.host_batch["targets"].reshape(setup.rows, workload.seq_len)
  if name == "t2t_jax":
    return t2t_jax_system(setup)
  if name == "flax":
    return flax_system(workload, inputs, targets)
  if name not in ("torch", "marian"):
    raise ValueError(f"unknown system {name!r}; known: {', '.join(SYSTEMS)}")
  try:  # the optional ones (the `export` extra)
    import torch

    torch.set_num_threads(threads)
    if name == "torch":
      return torch_system(workload, inputs, targets)
    return marian_system(workload, inputs, targets)
  except ImportError as e:
    return f"not installed ({e.name or e})"


def _interleaved(
  systems: dict[str, System], steps: int, repeats: int, losses: dict[str, list[float]]
) -> dict[str, list[float]]:
  """Per system, the median step time of each repetition; every system in turn per repetition
  so machine noise hits all. Appends each step's loss to `losses`."""
  medians = {name: [] for name in systems}
  for _ in range(repeats):
    for name, system in systems.items():
      times = []
      for _ in range(steps):
        start = time.perf_counter()
        losses[name].append(system.run())
        times.append(time.perf_counter() - start)
      medians[name].append(statistics.median(times))
  return medians


def _param_note(name: str, diff: int, expected: int) -> str:
  if name == "t2t_jax":
    return ""
  if diff == expected:
    note = "attention key biases"
  else:
    note = f"{expected:+,} from attention key biases, {diff - expected:+,} unexplained"
  if name == "marian":
    note += "; final_logits_bias (buffer) and frozen position tables not counted"
  return note


def compare(
  workload: Workload,
  *,
  steps: int,
  repeats: int,
  systems: Sequence[str] = SYSTEMS,
  threads: int | None = None,
  peak: dict[str, Any] | None = None,
  counter: timing.CompileCounter | None = None,
) -> dict[str, Any]:
  """Times one training step of every system on the same model and batch (module doc).

  Returns per system its status, parameter count (and difference to t2t_jax's), first-step
  seconds, per-repetition median step times, their median, target tokens/s, achieved FLOP/s,
  MFU (with `peak`: timing.measure_peak's result), t2t_jax's speed-up over it and every loss
  (warm-up step first); plus the best peer and the set-up.
  """
  cfg = workload.model
  check_comparable(cfg)
  threads = threads or timing.cpu_threads()
  setup = setup_train(
    cfg, workload.warmup_steps, workload.label_smoothing, workload.rows, workload.seq_len
  )
  rows, built, first = {}, {}, {}
  losses = {}
  for name in systems:
    start = time.perf_counter()
    system = _build(name, workload, setup, threads)
    if isinstance(system, str):
      rows[name] = dict(status=system)
      continue
    built[name] = system
    build_s = time.perf_counter() - start
    start = time.perf_counter()
    losses[name] = [system.run()]
    first[name] = time.perf_counter() - start
    rows[name] = dict(status="ok", build_s=build_s)
  compiles_before = counter.count if counter else 0
  medians = _interleaved(built, steps, repeats, losses)
  flops = model_flops_per_step(cfg, setup.params, workload.rows, workload.seq_len, workload.seq_len)
  tokens = workload.rows * workload.seq_len
  base_params = built["t2t_jax"].params if "t2t_jax" in built else None
  for name, system in built.items():
    median = statistics.median(medians[name])
    diff = system.params - base_params if base_params is not None else 0
    rows[name].update(
      device=system.device,
      version=system.version,
      params=system.params,
      params_vs_t2t_jax=diff,
      params_note=_param_note(name, diff, key_bias_params(cfg)),
      first_step_s=first[name],
      compile_s=first[name] - median,
      repetition_medians_s=medians[name],
      step_time_s=median,
      target_tokens_per_s=tokens / median,
      achieved_flops=flops / median,
      mfu=flops / median / peak["peak_flops"] if peak else None,
      losses=losses[name],
    )
  if "t2t_jax" in built:
    ours = rows["t2t_jax"]["target_tokens_per_s"]
    for name in built:
      rows[name]["t2t_jax_speedup"] = ours / rows[name]["target_tokens_per_s"]
  peers = [name for name in built if name != "t2t_jax"]
  best = max(peers, key=lambda n: rows[n]["target_tokens_per_s"]) if peers else None
  return dict(
    systems=rows,
    best_peer=best,
    model=dict(
      d_model=cfg.d_model,
      d_ff=cfg.d_ff,
      num_heads=cfg.num_heads,
      layers=[cfg.encoder_layers, cfg.decoder_layers],
      vocab_size=cfg.vocab_size,
      dropout_rate=cfg.dropout_rate,
      attention_dropout_rate=cfg.attention_dropout_rate,
    ),
    rows=workload.rows,
    seq_len=workload.seq_len,
    target_tokens_per_step=tokens,
    label_smoothing=workload.label_smoothing,
    warmup_steps=workload.warmup_steps,
    dtype="float32",
    model_flops_per_step=flops,
    threads=threads,
    steps=steps,
    repeats=repeats,
    jax_compiles_during_timing=counter.count - compiles_before if counter else None,
    peak_flops=peak["peak_flops"] if peak else None,
    peak_library=peak.get("peak_library", "jax") if peak else None,
  )


def table(result: dict[str, Any]) -> str:
  """The comparison as lines of text (medians; speed-up = t2t_jax tokens/s over the system's)."""
  m = result["model"]
  lines = [
    f"train vs peers: d_model {m['d_model']}, d_ff {m['d_ff']}, {m['num_heads']} heads, "
    f"{m['layers'][0]}+{m['layers'][1]} layers, vocab {m['vocab_size']:,}; "
    f"{result['rows']} x {result['seq_len']} random ids per side, dropout {m['dropout_rate']}, "
    f"label smoothing {result['label_smoothing']}, {result['dtype']}, Adam + warmup "
    f"{result['warmup_steps']}; {result['threads']} torch thread(s); medians of "
    f"{result['repeats']} interleaved repetitions of {result['steps']} steps",
    "| system | device | params (vs t2t_jax) | warm-up s | step ms | target tokens/s | "
    "GFLOP/s | MFU | t2t_jax speed-up |",
    "|---|---|---:|---:|---:|---:|---:|---:|---:|",
  ]
  for name, row in result["systems"].items():
    if row["status"] != "ok":
      lines.append(f"| {name} | {row['status']} | | | | | | | |")
      continue
    mfu = f"{100 * row['mfu']:.1f}%" if row["mfu"] is not None else "n/a"
    diff = f" ({row['params_vs_t2t_jax']:+,})" if name != "t2t_jax" else ""
    speedup = row.get("t2t_jax_speedup")
    lines.append(
      f"| {name} ({row['version']}) | {row['device']} | {row['params']:,}{diff} | "
      f"{row['first_step_s']:.1f} | {1e3 * row['step_time_s']:.1f} | "
      f"{row['target_tokens_per_s']:,.0f} | {row['achieved_flops'] / 1e9:.1f} | {mfu} | "
      f"{f'{speedup:.2f}x' if speedup else 'n/a'} |"
    )
  rows = result["systems"]
  best = result["best_peer"]
  if best and rows.get("t2t_jax", {}).get("status") == "ok":
    lines.append(
      f"best peer: {best}, {rows[best]['target_tokens_per_s']:,.0f} target tokens/s; "
      f"t2t_jax {rows[best]['t2t_jax_speedup']:.2f}x its speed"
    )
  if result["peak_flops"]:
    lines.append(
      f"MFU against the matmul peak of {result['peak_flops'] / 1e9:.1f} GFLOP/s reached by "
      f"{result['peak_library']}; model FLOPs per step {result['model_flops_per_step'] / 1e9:.2f}"
      " G for every system (train.model_flops_per_step)"
    )
  notes = [f"{n}: {r['params_note']}" for n, r in rows.items() if r.get("params_note")]
  if notes:
    lines.append("params vs t2t_jax: " + "; ".join(notes))
  if result["jax_compiles_during_timing"] is not None:
    lines.append(f"jax compilations during the timed steps: {result['jax_compiles_during_timing']}")
  return "\n".join(lines)
