"""The Transformer (paper section 3): encoder, decoder, and the full model.

`Transformer.__call__` is the teacher-forced forward pass used in training;
`encode`/`decode` split it; `init_cache`/`decode_step` run the decoder one position at a
time for search (see `t2t_jax.decoding`), with the encoder's keys/values computed once.
"""

from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax.core.scope import VariableDict

from t2t_jax.model import masks
from t2t_jax.model.config import TransformerConfig
from t2t_jax.model.layers import (
  OUTPUT_KERNEL,
  SELF_CACHE_POSITION_AXIS,
  AddPositions,
  DecoderLayer,
  Embed,
  EncoderLayer,
  _layer_norm,
  xavier,
)
from t2t_jax.tokens import BOS_ID, PAD_ID

Array = jnp.ndarray
# (decoder outputs [batch, tgt_len, d_model], W [vocab, d_model], bias [vocab] or None): the
# output layer as logits = outputs W^T + bias, for losses.output_loss_sums.
OutputFeatures = tuple[Array, Array, Array | None]


def shift_right(targets: Array, segmentation: Array | None = None, bos_id: int = BOS_ID) -> Array:
  """Decoder inputs: targets moved one position right, BOS at the start of every sequence.

  With packing (`segmentation` given) every packed pair starts with BOS rather than the
  previous pair's last token. [batch, length] -> [batch, length].
  """
  shifted = jnp.pad(targets, ((0, 0), (1, 0)), constant_values=bos_id)[:, :-1]
  if segmentation is not None:
    previous = jnp.pad(segmentation, ((0, 0), (1, 0)))[:, :-1]
    shifted = jnp.where(segmentation != previous, bos_id, shifted)
  return shifted


class Encoder(nn.Module):
  """N identical layers of self-attention + feed-forward over the embedded source."""

  config: TransformerConfig
  embed: nn.Module

  @nn.compact
  def __call__(
    self,
    inputs: Array,
    inputs_segmentation: Array | None = None,
    inputs_position: Array | None = None,
    *,
    deterministic: bool = True,
  ) -> Array:
    """inputs int [batch, src_len] -> [batch, src_len, d_model]."""
    cfg = self.config
    x = AddPositions(cfg, name="positions")(
      self.embed(inputs), inputs_position, deterministic=deterministic
    )
    mask = masks.padding_mask(inputs, inputs)
    if inputs_segmentation is not None:
      mask = masks.combine_masks(mask, masks.segment_mask(inputs_segmentation, inputs_segmentation))
    for i in range(cfg.encoder_layers):
      x = EncoderLayer(cfg, name=f"layer_{i}")(x, mask, deterministic=deterministic)
    if cfg.norm == "pre":
      x = _layer_norm(cfg, "final_norm")(x)
    return x


class OutputLayer(nn.Module):
  """The pre-softmax linear layer when it does not share the embedding matrix."""

  config: TransformerConfig

  def setup(self) -> None:
    cfg = self.config
    self.kernel = self.param("kernel", xavier, (cfg.d_model, cfg.vocab_size), jnp.float32)
    self.bias = self.param("bias", nn.initializers.zeros, (cfg.vocab_size,), jnp.float32)

  def __call__(self, y: Array) -> Array:
    """[.., d_model] -> float32 [.., vocab], accumulated in float32 (see Embed.attend)."""
    logits = jnp.matmul(y, self.kernel.astype(y.dtype), preferred_element_type=jnp.float32)
    return logits + self.bias

  def weights(self, y: Array) -> OutputFeatures:
    return y, self.kernel.T, self.bias


class Decoder(nn.Module):
  """N identical layers of masked self-attention, encoder-decoder attention, feed-forward."""

  config: TransformerConfig
  embed: nn.Module

  @nn.compact
  def __call__(
    self,
    encoded: Array | None,
    decoder_inputs: Array,
    self_mask: Array | None,
    cross_mask: Array | None,
    decoder_position: Array | None = None,
    *,
    deterministic: bool = True,
    decode: bool = False,
    features: bool = False,
  ) -> Array | OutputFeatures:
    """decoder_inputs int [batch, tgt_len] -> float32 logits [batch, tgt_len, vocab]; with
    `features`, (outputs [batch, tgt_len, d_model], W [vocab, d_model], bias or None) such
    that logits = outputs W^T + bias (for losses.output_loss_sums)."""
    cfg = self.config
    if decode:
      cross_mask = self._cached_cross_mask(cross_mask)
    y = AddPositions(cfg, name="positions")(
      self.embed(decoder_inputs), decoder_position, deterministic=deterministic, decode=decode
    )
    for i in range(cfg.decoder_layers):
      y = DecoderLayer(cfg, name=f"layer_{i}")(
        y, encoded, self_mask, cross_mask, deterministic=deterministic, decode=decode
      )
    if cfg.norm == "pre":
      y = _layer_norm(cfg, "final_norm")(y)
    if cfg.share_embeddings:
      if features:
        return y, self.embed.embedding, None
      return self.embed.attend(y)
    output = OutputLayer(cfg, name="logits")
    return output.weights(y) if features else output(y)

  def _cached_cross_mask(self, cross_mask: Array | None) -> Array:
    """The source padding mask [batch, 1, 1, src_len], stored when the cache is built."""
    if cross_mask is None and not self.has_variable("cache", "cross_mask"):
      raise ValueError("decode step before init_cache: build the cache first")
    return self.variable("cache", "cross_mask", lambda: cross_mask).value


class Transformer(nn.Module):
  """The encoder-decoder Transformer of "Attention Is All You Need"."""

  config: TransformerConfig

  def setup(self) -> None:
    cfg = self.config
    if cfg.share_embeddings:
      source_embed = target_embed = Embed(cfg, name="embed")
    else:
      source_embed = Embed(cfg, name="source_embed")
      target_embed = Embed(cfg, name="target_embed")
    self.encoder = Encoder(cfg, source_embed)
    self.decoder = Decoder(cfg, target_embed)

  def encode(
    self,
    inputs: Array,
    inputs_segmentation: Array | None = None,
    inputs_position: Array | None = None,
    *,
    deterministic: bool = True,
  ) -> Array:
    """inputs int [batch, src_len] -> encoder output [batch, src_len, d_model]."""
    return self.encoder(inputs, inputs_segmentation, inputs_position, deterministic=deterministic)

  def decode(
    self,
    encoded: Array,
    inputs: Array,
    targets: Array,
    inputs_segmentation: Array | None = None,
    targets_segmentation: Array | None = None,
    targets_position: Array | None = None,
    *,
    deterministic: bool = True,
    features: bool = False,
  ) -> Array | OutputFeatures:
    """Teacher-forced decoder: logits float32 [batch, tgt_len, vocab] for predicting `targets`
    (with `features`: the decoder outputs and output layer, see Decoder)."""
    self_mask = masks.combine_masks(
      masks.padding_mask(targets, targets), masks.causal_mask(targets.shape[1])
    )
    cross_mask = masks.padding_mask(targets, inputs)
    if targets_segmentation is not None:
      self_mask = masks.combine_masks(
        self_mask, masks.segment_mask(targets_segmentation, targets_segmentation)
      )
      cross_mask = masks.combine_masks(
        cross_mask, masks.segment_mask(targets_segmentation, inputs_segmentation)
      )
    decoder_inputs = shift_right(targets, targets_segmentation)
    return self.decoder(
      encoded,
      decoder_inputs,
      self_mask,
      cross_mask,
      targets_position,
      deterministic=deterministic,
      features=features,
    )

  def __call__(
    self,
    inputs: Array,
    targets: Array,
    inputs_segmentation: Array | None = None,
    targets_segmentation: Array | None = None,
    inputs_position: Array | None = None,
    targets_position: Array | None = None,
    *,
    deterministic: bool = True,
    features: bool = False,
  ) -> Array | OutputFeatures:
    """Teacher-forced forward pass.

    Args:
      inputs: int [batch, src_len] source ids, 0 = pad.
      targets: int [batch, tgt_len] target ids ending with EOS, 0 = pad (no BOS: the
        decoder input is `shift_right(targets)`).
      inputs_segmentation, targets_segmentation: int [batch, len] packed-pair ids, or None.
      inputs_position, targets_position: int [batch, len] per-pair positions, or None.
      deterministic: False enables dropout (needs a 'dropout' rng).
      features: return (decoder outputs, W, bias) instead of logits = outputs W^T + bias.

    Returns:
      float32 logits [batch, tgt_len, vocab_size]; with `features`, the triple
      (outputs [batch, tgt_len, d_model], W [vocab, d_model], bias [vocab] or None).
    """
    if (inputs_segmentation is None) != (targets_segmentation is None):
      raise ValueError("packed batches need both inputs_segmentation and targets_segmentation")
    encoded = self.encode(inputs, inputs_segmentation, inputs_position, deterministic=deterministic)
    return self.decode(
      encoded,
      inputs,
      targets,
      inputs_segmentation,
      targets_segmentation,
      targets_position,
      deterministic=deterministic,
      features=features,
    )

  def init_cache(self, encoded: Array, inputs: Array, max_decode_len: int) -> None:
    """Creates the decoding cache (apply with mutable=['cache']).

    Stores the source padding mask, each decoder layer's projected encoder keys/values
    (computed here, once per sentence), and zeroed self-attention caches of
    `max_decode_len` positions. The dummy decoder pass that sizes them is discarded (and
    removed by XLA under jit, since nothing returned depends on it).
    """
    cross_mask = (inputs != PAD_ID)[:, None, None, :]
    dummy = jnp.zeros((inputs.shape[0], max_decode_len), jnp.int32)
    self.decoder(encoded, dummy, None, cross_mask, deterministic=True, decode=True)

  def decode_step(self, ids: Array) -> Array:
    """One decoder position: ids int [batch, 1] -> logits float32 [batch, vocab].

    Needs a cache from `init_cache` (apply with mutable=['cache']); the encoder output is
    not needed again.
    """
    if ids.shape[1] != 1:
      raise ValueError(f"decode step takes one position at a time, got length {ids.shape[1]}")
    logits = self.decoder(None, ids, None, None, deterministic=True, decode=True)
    return logits[:, -1]

  def decode_beam_step(self, ids: Array, self_mask: Array) -> Array:
    """One position for `beam` hypotheses per sentence: ids int [batch, beam] -> logits
    float32 [batch, beam, vocab].

    Needs `beam_search_cache(cache, beam)` of an `init_cache` cache. The hypotheses share
    the sentence's encoder keys/values (never copied per hypothesis); each writes its
    self-attention key/value into its own slot of this position, in place. `self_mask` bool
    [batch, 1, beam, max_decode_len * beam] says which slots each hypothesis attends to
    (slot position * beam + b holds hypothesis b's entry at that position; see
    `t2t_jax.decoding.model_view.BeamSlots`), so reordering hypotheses never moves the cache.
    """
    return self.decoder(None, ids, self_mask, None, deterministic=True, decode=True)


def map_self_attention_cache(
  cache: VariableDict, fn: Callable[[Array, int], Array]
) -> VariableDict:
  """`cache` with fn(x, the slot axis) applied to every decoder self-attention key/value
  cache (keys [batch, heads, d, slots], values [batch, heads, slots, d]); the encoder
  keys/values, source mask and counters are kept as they are."""

  def apply(path: jax.tree_util.KeyPath, x: Array) -> Array:
    name = getattr(path[-1], "key", None)
    return fn(x, SELF_CACHE_POSITION_AXIS[name]) if name in SELF_CACHE_POSITION_AXIS else x

  return jax.tree_util.tree_map_with_path(apply, cache)


def pad_memory(cache: VariableDict, length: int) -> VariableDict:
  """`cache` with the encoder keys/values ([batch, heads, d, source]) and the source mask
  ([batch, 1, 1, source]) padded to `length` source positions, masked: the decoder's
  outputs are those of the unpadded cache, while caches of several source lengths take
  one shape."""

  def pad(path: jax.tree_util.KeyPath, x: Array) -> Array:
    if getattr(path[-1], "key", None) not in ("cross_key", "cross_value", "cross_mask"):
      return x
    extra = length - x.shape[-1]
    if extra < 0:
      raise ValueError(f"cannot pad a memory of {x.shape[-1]} positions to {length}")
    return jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, extra)])  # zeros; False in the mask

  return jax.tree_util.tree_map_with_path(pad, cache)


def beam_search_cache(cache: VariableDict, beam_size: int) -> VariableDict:
  """An `init_cache` cache made ready for `Transformer.decode_beam_step` with beam_size
  hypotheses per sentence: each self-attention cache gets beam_size slots per position
  (max_decode_len * beam_size slots); the encoder keys/values, source mask
  and counters are kept as they are ([batch, ...], shared by the hypotheses)."""
  return map_self_attention_cache(
    cache,
    lambda x, axis: jnp.zeros(
      x.shape[:axis] + (x.shape[axis] * beam_size,) + x.shape[axis + 1 :], x.dtype
    ),
  )


def decoding_params(params: VariableDict, config: TransformerConfig) -> VariableDict:
  """`params` as a search reads them: every product's kernel (the leaves named "kernel") in
  the compute dtype, and with shared embeddings the pre-softmax product's own copy of the
  table, [d_model, vocab] in the compute dtype (`Embed.attend`'s OUTPUT_KERNEL). The
  products compute the same values: each rounds its kernel to the compute dtype anyway,
  and the copy is the table transposed. What changes is the work per program call: given
  float32 kernels, XLA:CPU converts a bfloat16 model's kernels and transposes the table
  inside every call of a search program, and its product of a few rows reads [d_model,
  vocab] faster than [vocab, d_model] (docs/performance.md). Costs a second copy of the
  kernels in a bfloat16 model and of the table in any, beside `params`, which training
  keeps."""
  dtype = jnp.dtype(config.dtype)

  def cast(path: tuple, x: jax.Array) -> jax.Array:
    is_kernel = getattr(path[-1], "key", None) == "kernel"
    return x.astype(dtype) if is_kernel and x.dtype != dtype else x

  out = jax.tree_util.tree_map_with_path(cast, params)
  if config.share_embeddings:
    embed = dict(out["embed"])
    embed[OUTPUT_KERNEL] = jnp.asarray(params["embed"]["embedding"].T, dtype)
    out = {**out, "embed": embed}
  return out
