"""Flax (linen) building blocks of the Transformer (paper section 3).

Modules own parameters; the maths lives in `attention`, `masks` and `positional`. Each
module takes the frozen `t2t_jax.model.TransformerConfig` as `config`.
"""

import functools
import math
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.typing import DTypeLike

from t2t_jax.model import attention, dropout, masks, positional
from t2t_jax.model.config import TransformerConfig

Array = jnp.ndarray
xavier = nn.initializers.xavier_uniform()


def flat_dot_general(
  lhs: jax.Array,
  rhs: jax.Array,
  dimension_numbers: jax.lax.DotDimensionNumbers,
  precision: jax.lax.PrecisionLike = None,
  preferred_element_type: DTypeLike | None = None,
) -> jax.Array:
  """`lax.dot_general` for Dense layers, as one [tokens, k] x [k, n] matrix product.

  For inputs [batch, length, k], JAX's gradient of the kernel contracts batch and length
  of two 3-D arrays, which XLA:CPU runs with a transpose in memory and both operands
  transposed. Flattened first, the forward product and both gradient products are plain
  2-D ones (docs/performance.md). Same values and the same autodiff (forward and reverse
  mode); anything but "trailing axes of lhs x leading axes of rhs" goes to lax.dot_general.
  """
  (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = dimension_numbers
  n = len(lhs_contract)
  plain = (
    not lhs_batch
    and not rhs_batch
    and precision is None
    and preferred_element_type is None
    and tuple(lhs_contract) == tuple(range(lhs.ndim - n, lhs.ndim))
    and tuple(rhs_contract) == tuple(range(n))
  )
  if not plain:
    return jax.lax.dot_general(
      lhs,
      rhs,
      dimension_numbers,
      precision=precision,
      preferred_element_type=preferred_element_type,
    )
  k = math.prod(rhs.shape[:n])
  out = jax.lax.dot_general(
    lhs.reshape(-1, k),
    rhs.reshape(k, -1),
    (((1,), (0,)), ((), ())),
    preferred_element_type=_cpu_accumulation(lhs.dtype),
  )
  return out.astype(lhs.dtype).reshape(lhs.shape[: lhs.ndim - n] + rhs.shape[n:])


def _on_cpu() -> bool:
  return jax.default_backend() == "cpu"


def _cpu_accumulation(dtype: DTypeLike) -> DTypeLike | None:
  """float32 for a bfloat16 product on a CPU, else None (the inputs' dtype). XLA:CPU runs a
  bfloat16 x bfloat16 -> bfloat16 product in float32, slower than float32 itself, but hands
  one with a float32 output to its bfloat16 kernels (AVX512-BF16, AMX: about twice float32's
  speed, docs/performance.md). The values are the same (both accumulate in float32 and round
  once); on an accelerator the bfloat16 output is what the kernel writes anyway."""
  return jnp.float32 if jnp.dtype(dtype) == jnp.bfloat16 and _on_cpu() else None


def _dense(
  config: TransformerConfig,
  features: int | tuple[int, ...],
  axis: int | tuple[int, ...] = -1,
  name: str | None = None,
  use_bias: bool = True,
) -> nn.DenseGeneral:
  return nn.DenseGeneral(
    features=features,
    axis=axis,
    dtype=config.dtype,
    use_bias=use_bias,
    param_dtype=jnp.float32,
    kernel_init=xavier,
    name=name,
    dot_general=flat_dot_general,
  )


class Dropout(nn.Module):
  """`dropout.dropout` with the module's 'dropout' rng: four decisions per random hash where
  flax's nn.Dropout spends one hash per element (see model/dropout.py)."""

  rate: float

  @nn.compact
  def __call__(self, x: Array, deterministic: bool) -> Array:
    if deterministic or self.rate == 0.0:
      return x
    return dropout.dropout(self.make_rng("dropout"), x, self.rate)


def _to_cache_layout(x: Array) -> Array:
  """[batch, length, heads, d] -> [batch, heads, d, length], how decode caches keep keys
  (and the encoder's values): the layout XLA's batched attention matmuls read in place (in
  [batch, length, heads, d], XLA would transpose every cache in full at every decode step)."""
  return jnp.transpose(x, (0, 2, 3, 1))


def _from_cache_layout(x: Array) -> Array:
  """[batch, heads, d, length] -> [batch, length, heads, d] (XLA folds it into the matmul)."""
  return jnp.transpose(x, (0, 3, 1, 2))


def _to_value_cache_layout(x: Array) -> Array:
  """[batch, length, heads, d] -> [batch, heads, length, d], how the self-attention cache
  keeps values. A decode step writes one position: here d adjacent numbers per head, where
  [batch, heads, d, length] puts each of them on a cache line of its own, so that a step's
  write touched lines all over the cache; the weights-times-values product reads this
  layout in place too. Keys stay in `_to_cache_layout`'s: the product with the query reads
  that one faster, which outweighs the cost of their write."""
  return jnp.transpose(x, (0, 2, 1, 3))


def _from_value_cache_layout(x: Array) -> Array:
  """[batch, heads, length, d] -> [batch, length, heads, d] (folded into the matmul)."""
  return jnp.transpose(x, (0, 2, 1, 3))


# The position (slot) axis of each self-attention cache, for code that resizes them.
SELF_CACHE_POSITION_AXIS = {"cached_key": 3, "cached_value": 2}


class MultiHeadAttention(nn.Module):
  """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O (paper section 3.2.2),
  head_i = Attention(Q W^Q_i, K W^K_i, V W^V_i).

  d_k = d_v = d_model / h unless the config sets them (Table 3 row B). W^K has no bias: a
  key bias adds the same q.b to every logit of a query row, which the softmax cancels, so its
  gradient is exactly zero and Adam would turn rounding noise in it into full-size random
  updates. In decode mode the module keeps a key/value cache: for
  self-attention the keys/values of the positions generated so far (written one position
  per call at `cache_index`), for encoder-decoder attention the projected encoder output,
  computed once when the cache is created and only read afterwards. Cached keys and the
  encoder's values are [batch, heads, d, length] (`_to_cache_layout`), cached values of the
  output [batch, heads, length, d] (`_to_value_cache_layout`).
  """

  config: TransformerConfig
  cross: bool = False  # encoder-decoder attention (keys/values from the encoder)

  @nn.compact
  def __call__(
    self,
    inputs_q: Array,
    inputs_kv: Array | None,
    mask: Array | None = None,
    *,
    deterministic: bool = True,
    decode: bool = False,
  ) -> Array:
    """inputs_q [batch, q_len, d_model], inputs_kv [batch, kv_len, d_model]
    -> [batch, q_len, d_model]."""
    cfg = self.config
    proj_k = functools.partial(_dense, cfg, (cfg.num_heads, cfg.key_dim))
    proj_v = functools.partial(_dense, cfg, (cfg.num_heads, cfg.value_dim))
    query = proj_k(name="query")(inputs_q)
    if decode and self.cross:
      key, value = self._cross_cache(inputs_kv, proj_k, proj_v)
    else:
      key = proj_k(name="key", use_bias=False)(inputs_kv)
      value = proj_v(name="value")(inputs_kv)
      if decode:
        key, value, mask = self._self_cache(key, value, mask)
    dropout_rng = None
    if not deterministic and cfg.attention_dropout_rate > 0.0:
      dropout_rng = self.make_rng("dropout")
    x = attention.dot_product_attention(
      query,
      key,
      value,
      mask,
      dropout_rng=dropout_rng,
      dropout_rate=cfg.attention_dropout_rate,
      deterministic=deterministic,
      implementation=cfg.attention_impl,
    )
    if self.is_mutable_collection("intermediates"):
      # For inspection (attention maps): the same function the reference path uses.
      self.sow("intermediates", "attention_weights", attention.attention_weights(query, key, mask))
    return _dense(cfg, cfg.d_model, axis=(-2, -1), name="out")(x)

  def _cross_cache(
    self,
    inputs_kv: Array | None,
    proj_k: Callable[..., nn.DenseGeneral],
    proj_v: Callable[..., nn.DenseGeneral],
  ) -> tuple[Array, Array]:
    """Encoder keys/values: projected when the cache is built, read at every step."""
    have_cache = self.has_variable("cache", "cross_key")
    if not have_cache and inputs_kv is None:
      raise ValueError("encoder-decoder attention: no cache yet and no encoder output given")
    key = self.variable(
      "cache", "cross_key", lambda: _to_cache_layout(proj_k(name="key", use_bias=False)(inputs_kv))
    )
    value = self.variable(
      "cache", "cross_value", lambda: _to_cache_layout(proj_v(name="value")(inputs_kv))
    )
    return _from_cache_layout(key.value), _from_cache_layout(value.value)

  def _self_cache(
    self, key: Array, value: Array, mask: Array | None
  ) -> tuple[Array, Array, Array | None]:
    """Writes this step's key/value at cache_index and attends over the slots written so far.

    A step is one target position. Normally it has one query (q_len 1) and writes slot
    `index`. In beam search (`Transformer.decode_beam_step`) it has one query per
    hypothesis, all at the same position, and writes the q_len slots
    [index * q_len, (index + 1) * q_len) in place (the cache holds max_len * q_len slots,
    position-major); the caller's `mask` then says which slots each hypothesis reads, so
    the cache is never reordered.

    When the cache does not exist yet (it is being created from a [batch, max_len] dummy
    target), this only allocates zeros of that shape; the caller discards the output. On a
    CPU the cache is float32 whatever the compute dtype (bfloat16 keys and values are exact
    in it): XLA:CPU would update a bfloat16 cache by converting all of it to float32 and
    back at every step.
    """
    have_cache = self.has_variable("cache", "cached_key")
    dtype = jnp.float32 if _on_cpu() else key.dtype
    cached_key = self.variable(
      "cache", "cached_key", lambda: _to_cache_layout(jnp.zeros_like(key, dtype))
    )
    cached_value = self.variable(
      "cache", "cached_value", lambda: _to_value_cache_layout(jnp.zeros_like(value, dtype))
    )
    cache_index = self.variable("cache", "cache_index", lambda: jnp.array(0, jnp.int32))
    if not have_cache:
      return key, value, mask
    q_len, max_len = key.shape[1], cached_key.value.shape[-1]
    if max_len % q_len:
      raise ValueError(
        f"decode step of {q_len} queries on a cache of {max_len} slots "
        "(not a multiple): one query per step unless the cache was made for "
        "beams (model.beam_search_cache)"
      )
    index = cache_index.value
    dtype = cached_key.value.dtype
    cached_key.value = jax.lax.dynamic_update_slice(
      cached_key.value, _to_cache_layout(key).astype(dtype), (0, 0, 0, index * q_len)
    )
    cached_value.value = jax.lax.dynamic_update_slice(
      cached_value.value, _to_value_cache_layout(value).astype(dtype), (0, 0, index * q_len, 0)
    )
    cache_index.value = index + 1
    seen = (jnp.arange(max_len) < (index + 1) * q_len)[None, None, None, :]
    return (
      _from_cache_layout(cached_key.value),
      _from_value_cache_layout(cached_value.value),
      masks.combine_masks(mask, seen),
    )


class FeedForward(nn.Module):
  """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2 (eq. 2)."""

  config: TransformerConfig

  @nn.compact
  def __call__(self, x: Array) -> Array:
    cfg = self.config
    x = nn.relu(_dense(cfg, cfg.d_ff, name="wi")(x))
    return _dense(cfg, cfg.d_model, name="wo")(x)


def _layer_norm(cfg: TransformerConfig, name: str | None = None) -> nn.LayerNorm:
  return nn.LayerNorm(epsilon=1e-6, dtype=cfg.dtype, param_dtype=jnp.float32, name=name)


def residual(
  cfg: TransformerConfig,
  x: Array,
  sublayer: Callable[[Array], Array],
  norm: Callable[[Array], Array],
  deterministic: bool,
) -> Array:
  """The residual connection around a sub-layer, with dropout on the sub-layer output.

  'post' (the paper): LayerNorm(x + Dropout(Sublayer(x))).
  'pre': x + Dropout(Sublayer(LayerNorm(x))) (needs a final LayerNorm on the stack).
  """
  drop = lambda y: Dropout(cfg.dropout_rate)(y, deterministic)
  if cfg.norm == "pre":
    return x + drop(sublayer(norm(x)))
  return norm(x + drop(sublayer(x)))


class EncoderLayer(nn.Module):
  """Self-attention then feed-forward, each in a residual block."""

  config: TransformerConfig

  @nn.compact
  def __call__(self, x: Array, mask: Array | None, *, deterministic: bool = True) -> Array:
    cfg = self.config
    attn = MultiHeadAttention(cfg, name="self_attention")
    x = residual(
      cfg,
      x,
      lambda y: attn(y, y, mask, deterministic=deterministic),
      _layer_norm(cfg, "norm_attention"),
      deterministic,
    )
    return residual(
      cfg, x, FeedForward(cfg, name="ffn"), _layer_norm(cfg, "norm_ffn"), deterministic
    )


class DecoderLayer(nn.Module):
  """Masked self-attention, encoder-decoder attention, feed-forward (paper 3.1)."""

  config: TransformerConfig

  @nn.compact
  def __call__(
    self,
    x: Array,
    encoded: Array | None,
    self_mask: Array | None,
    cross_mask: Array | None,
    *,
    deterministic: bool = True,
    decode: bool = False,
  ) -> Array:
    cfg = self.config
    self_attn = MultiHeadAttention(cfg, name="self_attention")
    cross_attn = MultiHeadAttention(cfg, cross=True, name="cross_attention")
    kw = dict(deterministic=deterministic, decode=decode)
    x = residual(
      cfg,
      x,
      lambda y: self_attn(y, y, self_mask, **kw),
      _layer_norm(cfg, "norm_self_attention"),
      deterministic,
    )
    x = residual(
      cfg,
      x,
      lambda y: cross_attn(y, encoded, cross_mask, **kw),
      _layer_norm(cfg, "norm_cross_attention"),
      deterministic,
    )
    return residual(
      cfg, x, FeedForward(cfg, name="ffn"), _layer_norm(cfg, "norm_ffn"), deterministic
    )


# Embed's optional second copy of the shared matrix for the pre-softmax product, [d_model,
# vocab] (`transformer.decoding_params`).
OUTPUT_KERNEL = "output_kernel"


class Embed(nn.Module):
  """Token embedding scaled by sqrt(d_model) (paper 3.4), with `attend` for the output layer."""

  config: TransformerConfig

  def setup(self) -> None:
    cfg = self.config
    # std d_model^-0.5: after the sqrt(d_model) scaling the inputs have unit variance.
    self.embedding = self.param(
      "embedding",
      nn.initializers.normal(stddev=cfg.d_model**-0.5),
      (cfg.vocab_size, cfg.d_model),
      jnp.float32,
    )

  def __call__(self, tokens: Array) -> Array:
    cfg = self.config
    x = jnp.take(self.embedding, tokens, axis=0).astype(cfg.dtype)
    return x * jnp.sqrt(cfg.d_model).astype(cfg.dtype)

  def attend(self, x: Array) -> Array:
    """Pre-softmax linear transformation sharing this matrix: [.., d_model] -> float32
    [.., vocab]. Products in the compute dtype, accumulated in float32: the logits that the
    loss and the searches rank keep float32 precision in a bfloat16 model. Parameters made
    by `transformer.decoding_params` carry the matrix a second time as OUTPUT_KERNEL,
    [d_model, vocab] in the compute dtype, which this product then reads instead."""
    if self.has_variable("params", OUTPUT_KERNEL):
      kernel = self.get_variable("params", OUTPUT_KERNEL)
      return jnp.matmul(x, kernel.astype(x.dtype), preferred_element_type=jnp.float32)
    return jnp.einsum(
      "...d,vd->...v", x, self.embedding.astype(x.dtype), preferred_element_type=jnp.float32
    )


class AddPositions(nn.Module):
  """Adds sinusoidal or learned position encodings, then dropout (paper 3.5, 5.4).

  `positions` [batch, length] gives each token's position (per packed segment); None
  means 0..length-1. In decode mode the position is a cached counter.
  """

  config: TransformerConfig

  @nn.compact
  def __call__(
    self,
    x: Array,
    positions: Array | None = None,
    *,
    deterministic: bool = True,
    decode: bool = False,
  ) -> Array:
    cfg = self.config
    length = x.shape[1]
    # A decode step's second axis is the beam (one position per hypothesis), not a length.
    if length > cfg.max_len and not (decode and self.has_variable("cache", "position")):
      raise ValueError(
        f"sequence length {length} exceeds TransformerConfig.max_len={cfg.max_len}; raise max_len"
      )
    if cfg.positional == "learned":
      table = self.param(
        "position_embedding",
        nn.initializers.normal(stddev=0.02),
        (cfg.max_len, cfg.d_model),
        jnp.float32,
      )
    else:
      table = positional.sinusoidal(cfg.max_len, cfg.d_model)
    if decode:
      have_cache = self.has_variable("cache", "position")
      counter = self.variable("cache", "position", lambda: jnp.array(0, jnp.int32))
      if have_cache:
        positions = jnp.full(x.shape[:2], counter.value)
        counter.value = counter.value + 1
    if positions is None:
      pe = table[None, :length]
    else:
      pe = jnp.take(table, positions, axis=0)
    x = x + pe.astype(x.dtype)
    return Dropout(cfg.dropout_rate)(x, deterministic)
