"""Why self-attention (paper section 4, Table 1), measured on one layer of each kind.

Every layer maps [batch, n, d_model] -> [batch, n, d_model] causally (output t sees inputs
<= t), so the same layer can be trained on a whole sequence and decoded one position at a
time, and the two agree:

  self_attention  `t2t_jax.model.layers.MultiHeadAttention` with a causal mask; decodes with its
                  key/value cache (n positions long).
  recurrent       an LSTM (flax `OptimizedLSTMCell`) under `lax.scan`; decodes carrying (c, h).
  convolutional   a causal 1-D convolution, kernel k, optional dilation; decodes carrying the
                  last (k-1)*dilation+1 inputs.
  restricted      self-attention over the r most recent positions. Blocked so that it costs
                  O(r n d) and not the O(n^2 d) of a banded mask over full attention: each
                  block of r queries scores its own and the previous block's keys (2r),
                  masked to the window. Decodes carrying the last r keys and values.

A layer is four pure functions (`Layer`), so timing, decoding and the path-length probe
treat all kinds alike. FLOPs are counted from the shapes, as computed (a masked product
still counts in full), multiply-add = 2.
"""

import dataclasses
import functools
import math
import statistics
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from t2t_jax.model import TransformerConfig, attention, layers, masks

KINDS = ("self_attention", "recurrent", "convolutional", "restricted")
LABELS = dict(
  self_attention="self-attention",
  recurrent="recurrent (LSTM)",
  convolutional="convolutional",
  restricted="restricted self-attention",
  dilated="dilated convolutional",
)

# The paper's Table 1, and the exponent of n each complexity has as n grows (d, k, r fixed).
TABLE1 = dict(
  self_attention=dict(complexity="O(n^2 d)", sequential="O(1)", path="O(1)", exponent=2),
  recurrent=dict(complexity="O(n d^2)", sequential="O(n)", path="O(n)", exponent=1),
  convolutional=dict(complexity="O(k n d^2)", sequential="O(1)", path="O(log_k(n))", exponent=1),
  restricted=dict(complexity="O(r n d)", sequential="O(1)", path="O(n/r)", exponent=1),
)


@dataclasses.dataclass(frozen=True)
class LayerSpec:
  """The sizes every layer kind shares (equal d_model) and the kind-specific ones."""

  d_model: int = 512
  num_heads: int = 8
  kernel: int = 3  # k
  dilation: int = 1
  window: int = 32  # r
  attention_impl: str = "reference"

  def attention_config(self) -> TransformerConfig:
    return TransformerConfig(
      vocab_size=1,
      d_model=self.d_model,
      d_ff=self.d_model,
      num_heads=self.num_heads,
      dropout_rate=0.0,
      attention_impl=self.attention_impl,
    )


class Layer(NamedTuple):
  init: Callable  # (rng, x [b, n, d]) -> params
  forward: Callable  # (params, x [b, n, d]) -> y [b, n, d]
  init_state: Callable  # (params, x [b, n, d]) -> decoding state for n positions
  step: Callable  # (params, state, x_t [b, d]) -> (state, y_t [b, d])


def make_layer(kind: str, spec: LayerSpec) -> Layer:
  makers = dict(
    self_attention=_self_attention,
    recurrent=_recurrent,
    convolutional=_convolutional,
    restricted=_restricted,
  )
  if kind not in makers:
    raise ValueError(f"layer kind {kind!r}: known kinds are {', '.join(makers)}")
  return makers[kind](spec)


# ---------------------------------------------------------------------------- layer kinds


class _CausalSelfAttention(nn.Module):
  config: Any

  @nn.compact
  def __call__(self, x, decode: bool = False):
    mask = None if decode else masks.causal_mask(x.shape[1])
    return layers.MultiHeadAttention(self.config, name="attention")(x, x, mask, decode=decode)


def _zeros_like_shapes(tree):
  return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), tree)


def _self_attention(spec: LayerSpec) -> Layer:
  module = _CausalSelfAttention(spec.attention_config())

  def init_state(params, x):
    # The cache MultiHeadAttention allocates for x's length: zeros, so no need to run init.
    del params
    shapes = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), x, decode=True))
    return _zeros_like_shapes(shapes["cache"])

  def step(params, cache, x_t):
    y, mutated = module.apply(
      {"params": params, "cache": cache}, x_t[:, None], decode=True, mutable=["cache"]
    )
    return mutated["cache"], y[:, 0]

  return Layer(
    init=lambda rng, x: module.init(rng, x)["params"],
    forward=lambda params, x: module.apply({"params": params}, x),
    init_state=init_state,
    step=step,
  )


def _recurrent(spec: LayerSpec) -> Layer:
  cell = nn.OptimizedLSTMCell(spec.d_model)

  def init_state(params, x):
    del params
    return cell.initialize_carry(jax.random.PRNGKey(0), x[:, 0].shape)

  def step(params, carry, x_t):
    return cell.apply({"params": params}, carry, x_t)

  def forward(params, x):
    # Training an RNN is its decoding loop: n sequential steps whatever the hardware.
    _, ys = jax.lax.scan(
      lambda c, x_t: step(params, c, x_t), init_state(params, x), jnp.swapaxes(x, 0, 1)
    )
    return jnp.swapaxes(ys, 0, 1)

  def init(rng, x):
    return cell.init(rng, init_state(None, x), x[:, 0])["params"]

  return Layer(init=init, forward=forward, init_state=init_state, step=step)


def _convolutional(spec: LayerSpec) -> Layer:
  k, dilation = spec.kernel, spec.dilation
  span = (k - 1) * dilation + 1  # inputs one output sees
  conv = nn.Conv(spec.d_model, (k,), kernel_dilation=dilation, padding=[(span - 1, 0)])

  def init_state(params, x):
    del params
    return jnp.zeros((x.shape[0], span, x.shape[2]), x.dtype)

  def step(params, window, x_t):
    window = jnp.concatenate([window[:, 1:], x_t[:, None]], axis=1)
    taps = window[:, ::dilation]  # oldest first, as the kernel's first tap
    return window, jnp.einsum("bkd,kde->be", taps, params["kernel"]) + params["bias"]

  return Layer(
    init=lambda rng, x: conv.init(rng, x)["params"],
    forward=lambda params, x: conv.apply({"params": params}, x),
    init_state=init_state,
    step=step,
  )


class RestrictedSelfAttention(nn.Module):
  """Multi-head self-attention where position t sees positions t-r+1..t only (r = window)."""

  config: Any
  window: int

  def setup(self):
    # The projections exactly as MultiHeadAttention builds them (no key bias, xavier init).
    cfg, dense = self.config, layers._dense
    self.query = dense(cfg, (cfg.num_heads, cfg.key_dim))
    self.key = dense(cfg, (cfg.num_heads, cfg.key_dim), use_bias=False)
    self.value = dense(cfg, (cfg.num_heads, cfg.value_dim))
    self.out = dense(cfg, cfg.d_model, axis=(-2, -1))

  def _attend(self, q, k, v, mask):
    return attention.dot_product_attention(q, k, v, mask, implementation=self.config.attention_impl)

  def __call__(self, x):
    batch, n, _ = x.shape
    r = self.window
    q, k, v = self.query(x), self.key(x), self.value(x)
    if n <= r:  # one block: the window covers everything, plain causal attention
      return self.out(self._attend(q, k, v, masks.causal_mask(n)))
    pad = (-n) % r  # padding at the end changes no earlier output (causal)
    q, k, v = (jnp.pad(t, ((0, 0), (0, pad), (0, 0), (0, 0))) for t in (q, k, v))
    blocks = (n + pad) // r
    q = q.reshape(batch * blocks, r, *q.shape[2:])
    k, v = _with_previous_block(k, blocks, r), _with_previous_block(v, blocks, r)
    mask = jnp.tile(_block_window_mask(blocks, r), (batch, 1, 1, 1))
    y = self._attend(q, k, v, mask).reshape(batch, blocks * r, *v.shape[2:])
    return self.out(y[:, :n])

  def step(self, state, x_t):
    """One position: state (last r keys, last r values, positions seen) -> (state, y_t)."""
    keys, values, seen = state
    x = x_t[:, None]
    keys = jnp.concatenate([keys[:, 1:], self.key(x)], axis=1)
    values = jnp.concatenate([values[:, 1:], self.value(x)], axis=1)
    filled = jnp.arange(self.window) >= self.window - 1 - seen  # slots written so far
    y = self._attend(self.query(x), keys, values, filled[None, None, None, :])
    return (keys, values, seen + 1), self.out(y)[:, 0]


def _with_previous_block(t, blocks: int, r: int):
  """[b, blocks*r, h, d] -> [b*blocks, 2r, h, d]: each block preceded by the one before."""
  t = t.reshape(t.shape[0], blocks, r, *t.shape[2:])
  previous = jnp.concatenate([jnp.zeros_like(t[:, :1]), t[:, :-1]], axis=1)
  both = jnp.concatenate([previous, t], axis=2)
  return both.reshape(-1, 2 * r, *t.shape[3:])


def _block_window_mask(blocks: int, r: int):
  """[blocks, 1, r, 2r]: query i of a block sees keys j (previous block then its own) with
  i < j <= i + r, i.e. absolute positions t-r+1..t; block 0 has no previous block."""
  i = jnp.arange(r)[:, None]
  j = jnp.arange(2 * r)[None, :]
  window = (j > i) & (j <= i + r)
  has_previous = (jnp.arange(blocks) > 0)[:, None, None] | (j >= r)[None]
  return (window[None] & has_previous)[:, None]


def _restricted(spec: LayerSpec) -> Layer:
  cfg = spec.attention_config()
  module = RestrictedSelfAttention(cfg, spec.window)

  def init_state(params, x):
    del params
    shape = (x.shape[0], spec.window, cfg.num_heads)
    return (
      jnp.zeros(shape + (cfg.key_dim,), x.dtype),
      jnp.zeros(shape + (cfg.value_dim,), x.dtype),
      jnp.array(0, jnp.int32),
    )

  def step(params, state, x_t):
    return module.apply({"params": params}, state, x_t, method=RestrictedSelfAttention.step)

  return Layer(
    init=lambda rng, x: module.init(rng, x)["params"],
    forward=lambda params, x: module.apply({"params": params}, x),
    init_state=init_state,
    step=step,
  )


def decode_all(layer: Layer, params, x):
  """Runs `layer.step` over every position of x (lax.scan, one jitted loop): [b, n, d]."""
  _, ys = jax.lax.scan(
    lambda s, x_t: layer.step(params, s, x_t), layer.init_state(params, x), jnp.swapaxes(x, 0, 1)
  )
  return jnp.swapaxes(ys, 0, 1)


# ---------------------------------------------------------------------------------- FLOPs


def forward_flops(kind: str, n: int, spec: LayerSpec, batch: int = 1, decode: bool = False) -> int:
  """FLOPs of one layer over n positions (multiply-add = 2), counted from the shapes.

  self-attention: 8 n d^2 (Q, K, V, output projections) + 4 n^2 d (QK^T and AV over the full
    n x n; the causal mask is applied, not skipped; decoding scores each new query against
    the n-long cache, the same total).
  restricted: the projections + 4 n w d with w the keys a query is scored against: 2r in the
    blocked training pass (n when n <= r: one causal block), r when decoding (the window).
  recurrent: 16 n d^2 (4 gates, each from the input and the previous h).
  convolutional: 2 k n d^2.
  Biases, softmax, layer activations are not counted.
  """
  cfg = spec.attention_config()
  d = spec.d_model
  qk, v = cfg.num_heads * cfg.key_dim, cfg.num_heads * cfg.value_dim
  projections = 2 * n * d * (2 * qk + v) + 2 * n * v * d
  if kind == "self_attention":
    flops = projections + 2 * n * n * (qk + v)
  elif kind == "restricted":
    keys = spec.window if decode else (n if n <= spec.window else 2 * spec.window)
    flops = projections + 2 * n * keys * (qk + v)
  elif kind == "recurrent":
    flops = 2 * n * (d * 4 * d + d * 4 * d)
  elif kind == "convolutional":
    flops = 2 * spec.kernel * n * d * d
  else:
    raise ValueError(f"layer kind {kind!r}: known kinds are {', '.join(KINDS)}")
  return batch * flops


def train_flops(kind: str, n: int, spec: LayerSpec, batch: int = 1) -> int:
  """Forward + backward: 3 x forward (the backward pass computes gradients for both the
  inputs and the weights, each as costly as the forward product)."""
  return 3 * forward_flops(kind, n, spec, batch)


# -------------------------------------------------------------------------------- timing


def _median_time(fn, args, repeats: int) -> tuple:
  """(median seconds of `repeats` calls after a first, compiling one; compile seconds)."""
  t0 = time.perf_counter()
  jax.block_until_ready(fn(*args))
  first = time.perf_counter() - t0
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t0)
  median = statistics.median(times)
  return median, max(first - median, 0.0)


def init_params(kind: str, spec: LayerSpec, seed: int = 0):
  """A layer's parameters; they do not depend on n, so one set serves every length."""
  layer = make_layer(kind, spec)
  return jax.jit(layer.init)(jax.random.PRNGKey(seed), jnp.zeros((1, 1, spec.d_model)))


def time_layer(
  kind: str, n: int, spec: LayerSpec, batch: int = 1, repeats: int = 5, params=None, seed: int = 0
) -> dict:
  """Times one layer: training (forward + backward over the whole sequence, gradients for
  the parameters and the input) and decoding (all n positions one at a time)."""
  layer = make_layer(kind, spec)
  params = init_params(kind, spec, seed) if params is None else params
  rng = np.random.default_rng(seed)  # numpy: no per-shape compilation for random inputs
  x = jnp.asarray(rng.standard_normal((batch, n, spec.d_model), np.float32))
  cotangent = jnp.asarray(rng.standard_normal(x.shape, np.float32))

  def loss(params, x):
    # A fixed random cotangent: every output position gets a gradient, as in a stack.
    return jnp.sum(layer.forward(params, x) * cotangent)

  train = jax.jit(jax.grad(loss, argnums=(0, 1)))
  decode = jax.jit(lambda params, x: decode_all(layer, params, x))
  train_s, train_compile = _median_time(train, (params, x), repeats)
  decode_s, decode_compile = _median_time(decode, (params, x), repeats)
  return dict(
    n=n,
    train_s=train_s,
    decode_s=decode_s,
    decode_per_token_s=decode_s / n,
    train_compile_s=train_compile,
    decode_compile_s=decode_compile,
    train_flops=train_flops(kind, n, spec, batch),
    decode_flops=forward_flops(kind, n, spec, batch, decode=True),
  )


def fit_exponent(ns, values, n_min: int = 0) -> float:
  """Slope of log(value) against log(n) (least squares) over the points with n >= n_min."""
  ns, values = np.asarray(ns, float), np.asarray(values, float)
  keep = ns >= n_min
  if keep.sum() < 2:
    raise ValueError(f"fit_exponent: need >= 2 points with n >= {n_min}, have {keep.sum()}")
  slope, _ = np.polyfit(np.log(ns[keep]), np.log(values[keep]), 1)
  return float(slope)


def powers_of_two(lo: int, hi: int) -> list:
  return [2**e for e in range(int(math.log2(lo)), int(math.log2(hi)) + 1)]


# ----------------------------------------------------------------------- maximum path length


def expected_min_layers(kind: str, n: int, spec: LayerSpec) -> int:
  """Fewest stacked layers for output n-1 to depend on input 0, from the receptive field."""
  k, r = spec.kernel, spec.window
  if kind in ("self_attention", "recurrent") or n == 1:
    return 1
  if kind == "convolutional":  # each layer reaches k-1 positions further back
    return -(-(n - 1) // (k - 1))
  if kind == "dilated":  # dilations 1, k, k^2, ...: L layers see k^L positions
    layers_, field = 0, 1
    while field < n:
      layers_, field = layers_ + 1, field * k
    return layers_
  if kind == "restricted":  # each layer reaches r-1 positions further back
    return -(-(n - 1) // (r - 1))
  raise ValueError(f"layer kind {kind!r}")


def measure_min_layers(
  kind: str, ns, spec: LayerSpec, max_layers: int = 0, seed: int = 0, threshold: float = 1e-30
) -> list:
  """For each n in ns: the fewest stacked random layers for output n-1 to depend on input 0.

  Forward-mode (jax.jvp) with the input tangent on position 0 only gives, after layer l,
  the column d y_l / d x_0 of the Jacobian at every position, so one pass through a deep
  stack answers every depth, and (the layers being causal, output n-1 is the same function
  of inputs 0..n-1 in any longer sequence) every distance up to the longest. Positions
  outside the receptive field get exact zeros (causal padding; masked softmax weights are
  set to 0), so |d y_l[n-1] / d x_0| above a tiny threshold means reached. The tangent is
  renormalised after each layer so a long product of small factors cannot underflow into a
  false zero. `kind` 'dilated' is the convolution with dilations 1, k, k^2, ...
  An entry is 0 if max_layers (default: the longest n, or for 'dilated' its bit count) is
  not enough.
  """
  n = max(ns)
  if kind == "dilated":
    reach = _dilated_reach(n, spec, max_layers or n.bit_length(), seed)  # k^L >= n by log2 n
  else:
    reach = _stack_reach(kind, n, spec, max_layers or n, seed)
  reached = np.asarray(reach) > threshold  # [depth, n]
  out = []
  for m in ns:
    hits = np.flatnonzero(reached[:, m - 1])
    out.append(int(hits[0]) + 1 if hits.size else 0)
  return out


def _probe(n: int, d: int, rng):
  """Random input [1, n, d] and a tangent that is nonzero at position 0 only."""
  rng_x, rng_t = jax.random.split(rng)
  x = jax.random.normal(rng_x, (1, n, d), jnp.float32)
  tangent = jnp.zeros_like(x).at[0, 0].set(jax.random.normal(rng_t, (d,), jnp.float32))
  return x, tangent


def _jvp_layer(layer: Layer, params, x, tangent):
  """(y, tangent of y normalised, |tangent| per position [n])."""
  y, t = jax.jvp(lambda x: layer.forward(params, x), (x,), (tangent,))
  t = t / jnp.maximum(jnp.max(jnp.abs(t)), 1e-30)
  return y, t, jnp.max(jnp.abs(t[0]), axis=-1)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3, 4))
def _stack_reach(kind: str, n: int, spec: LayerSpec, depth: int, seed: int):
  """[depth, n]: |d y_l / d x_0| (normalised) per layer l and position; one scan over
  stacked parameters."""
  layer = make_layer(kind, spec)
  rng_probe, rng_params = jax.random.split(jax.random.PRNGKey(seed))
  x, tangent = _probe(n, spec.d_model, rng_probe)
  params = jax.vmap(lambda r: layer.init(r, x))(jax.random.split(rng_params, depth))

  def body(carry, p):
    y, t, reach = _jvp_layer(layer, p, *carry)
    return (y, t), reach

  return jax.lax.scan(body, (x, tangent), params)[1]


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _dilated_reach(n: int, spec: LayerSpec, depth: int, seed: int):
  """As _stack_reach for convolutions with dilation k^(l-1) at layer l (unrolled)."""
  rng_probe, rng_params = jax.random.split(jax.random.PRNGKey(seed))
  x, tangent = _probe(n, spec.d_model, rng_probe)
  reach = []
  for index, rng in enumerate(jax.random.split(rng_params, depth)):
    layer = make_layer("convolutional", dataclasses.replace(spec, dilation=spec.kernel**index))
    x, tangent, r = _jvp_layer(layer, layer.init(rng, x), x, tangent)
    reach.append(r)
  return jnp.stack(reach)


def path_lengths(ns, spec: LayerSpec, seed: int = 0) -> dict:
  """Per kind and distance: layers needed (measured), the receptive-field prediction, the
  path length in operations (a recurrent layer's path runs through n-1 sequential steps)
  and the sequential operations of a training pass."""
  out = dict(n=list(ns))
  # Which inputs reach which outputs does not depend on the width: a narrow stack answers
  # the same question far more cheaply.
  spec = dataclasses.replace(spec, d_model=min(spec.d_model, 64), num_heads=min(spec.num_heads, 4))
  for kind in ("self_attention", "recurrent", "convolutional", "dilated", "restricted"):
    # One LSTM layer already connects every pair (through n-1 sequential steps); a stack of
    # 4 shows it, and a 128-deep stack of scanned LSTMs under jvp stalls XLA:CPU here.
    depth = 4 if kind == "recurrent" else 0
    measured = measure_min_layers(kind, ns, spec, max_layers=depth, seed=seed)
    out[kind] = dict(
      min_layers=measured,
      expected_layers=[expected_min_layers(kind, n, spec) for n in ns],
      path_length=[n - 1 if kind == "recurrent" else m for n, m in zip(ns, measured)],
      sequential_ops=[n if kind == "recurrent" else 1 for n in ns],
    )
  return out
