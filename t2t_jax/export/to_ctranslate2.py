"""A trained Transformer as a CTranslate2 model directory (`ctranslate2.Translator(OUT)`).

CTranslate2's `TransformerSpec` describes the same encoder-decoder as the paper's; what
differs from its defaults is set explicitly here:

- positions: the paper's interleaved sin/cos table (t2t_jax.model.positional), or the learned table,
  is stored as a weight; CTranslate2's built-in table puts all sines before all cosines.
- the key projection has no bias in t2t_jax (a softmax cancels it); the fused Q/K/V
  projection CTranslate2 uses gets zeros in its key part.
- layer norm epsilon 1e-6, embeddings scaled by sqrt(d_model) (paper 3.4), ReLU.
- the source gets EOS appended (add_source_eos) and the decoder starts from `<s>` (BOS, id
  2), as in t2t_jax; the vocabulary is the shared one, in id order, so ids agree.

Beam search in CTranslate2 normalises scores by length^length_penalty, not the GNMT
((5 + length) / 6)^alpha of t2t_jax.decoding.beam (see docs/export.md).
"""

import os
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike

from t2t_jax.export import ExportError, ParamTree, Trained, check_output_dir
from t2t_jax.model import TransformerConfig, positional

if TYPE_CHECKING:  # ctranslate2 (the `export` extra) is imported when an export runs
  from ctranslate2.specs import attention_spec, common_spec, transformer_spec

QUANTIZATIONS = (
  "float32",
  "int8",
  "int8_float32",
  "int8_float16",
  "int8_bfloat16",
  "int16",
  "float16",
  "bfloat16",
)
LAYER_NORM_EPSILON = 1e-6  # t2t_jax.model.layers._layer_norm


def _f32(x: ArrayLike) -> np.ndarray:
  return np.ascontiguousarray(np.asarray(x, np.float32))


def _projection(dense: ParamTree) -> tuple[np.ndarray, np.ndarray]:
  """A DenseGeneral from d_model to (heads, d) as CTranslate2's [heads * d, d_model] weight
  and [heads * d] bias (zeros where the layer has none, the key)."""
  kernel = np.asarray(dense["kernel"])
  weight = kernel.reshape(kernel.shape[0], -1).T
  bias = dense["bias"].reshape(-1) if "bias" in dense else np.zeros(weight.shape[0])
  return _f32(weight), _f32(bias)


def _set_linear(spec: "common_spec.LinearSpec", weight: ArrayLike, bias: ArrayLike) -> None:
  spec.weight, spec.bias = _f32(weight), _f32(bias)


def _set_output(spec: "common_spec.LinearSpec", dense: ParamTree) -> None:
  """The attention output projection: kernel [heads, d_v, d_model] -> [d_model, heads * d_v]."""
  kernel = np.asarray(dense["kernel"])
  _set_linear(spec, kernel.reshape(-1, kernel.shape[-1]).T, dense["bias"])


def _set_norm(spec: "common_spec.LayerNormSpec", norm: ParamTree) -> None:
  spec.gamma, spec.beta = _f32(norm["scale"]), _f32(norm["bias"])


def _set_ffn(spec: "transformer_spec.FeedForwardSpec", ffn: ParamTree, norm: ParamTree) -> None:
  _set_norm(spec.layer_norm, norm)
  _set_linear(spec.linear_0, np.asarray(ffn["wi"]["kernel"]).T, ffn["wi"]["bias"])
  _set_linear(spec.linear_1, np.asarray(ffn["wo"]["kernel"]).T, ffn["wo"]["bias"])


def _set_self_attention(
  spec: "attention_spec.MultiHeadAttentionSpec", attention: ParamTree, norm: ParamTree
) -> None:
  """Self-attention: one fused [Q; K; V] projection, then the output projection."""
  parts = [_projection(attention[name]) for name in ("query", "key", "value")]
  _set_linear(
    spec.linear[0], np.concatenate([w for w, _ in parts]), np.concatenate([b for _, b in parts])
  )
  _set_output(spec.linear[1], attention["out"])
  _set_norm(spec.layer_norm, norm)


def _set_cross_attention(
  spec: "attention_spec.MultiHeadAttentionSpec", attention: ParamTree, norm: ParamTree
) -> None:
  """Encoder-decoder attention: the query, a fused [K; V] projection, the output."""
  _set_linear(spec.linear[0], *_projection(attention["query"]))
  (wk, bk), (wv, bv) = (_projection(attention[name]) for name in ("key", "value"))
  _set_linear(spec.linear[1], np.concatenate([wk, wv]), np.concatenate([bk, bv]))
  _set_output(spec.linear[2], attention["out"])
  _set_norm(spec.layer_norm, norm)


def _positions(cfg: TransformerConfig, stack: ParamTree) -> np.ndarray:
  if cfg.positional == "learned":
    return _f32(stack["positions"]["position_embedding"])
  return _f32(positional.sinusoidal(cfg.max_len, cfg.d_model))


def _head_dim(cfg: TransformerConfig) -> int | None:
  if cfg.key_dim != cfg.value_dim:
    raise ExportError(
      f"d_k={cfg.key_dim} differs from d_v={cfg.value_dim}: CTranslate2 "
      "attention has one head size for queries, keys and values"
    )
  return None if cfg.key_dim * cfg.num_heads == cfg.d_model else cfg.key_dim


def build_spec(trained: Trained) -> "transformer_spec.TransformerSpec":
  """The `ctranslate2.specs.TransformerSpec` of a trained model, every weight set."""
  from ctranslate2.specs import transformer_spec

  cfg, params = trained.config, trained.params
  pre_norm, head_dim = cfg.norm == "pre", _head_dim(cfg)
  encoder = transformer_spec.TransformerEncoderSpec(
    cfg.encoder_layers, cfg.num_heads, pre_norm=pre_norm, head_dim=head_dim
  )
  decoder = transformer_spec.TransformerDecoderSpec(
    cfg.decoder_layers, cfg.num_heads, pre_norm=pre_norm, head_dim=head_dim
  )
  spec = transformer_spec.TransformerSpec(encoder, decoder)
  source = params["embed" if cfg.share_embeddings else "source_embed"]["embedding"]
  target = params["embed" if cfg.share_embeddings else "target_embed"]["embedding"]
  _set_encoder(spec.encoder, cfg, params["encoder"], _f32(source))
  _set_decoder(spec.decoder, cfg, params["decoder"], _f32(target))
  if cfg.share_embeddings:
    spec.decoder.projection.weight = spec.decoder.embeddings.weight
  else:
    logits = params["decoder"]["logits"]
    _set_linear(spec.decoder.projection, np.asarray(logits["kernel"]).T, logits["bias"])
  spec.config.layer_norm_epsilon = LAYER_NORM_EPSILON
  spec.config.add_source_eos = True  # t2t_jax's sources end with EOS
  spec.register_source_vocabulary(trained.vocabulary)
  spec.register_target_vocabulary(trained.vocabulary)
  return spec


def _set_encoder(
  spec: "transformer_spec.TransformerEncoderSpec",
  cfg: TransformerConfig,
  stack: ParamTree,
  embedding: np.ndarray,
) -> None:
  spec.embeddings[0].weight = embedding
  spec.position_encodings.encodings = _positions(cfg, stack)
  for i, layer_spec in enumerate(spec.layer):
    layer = stack[f"layer_{i}"]
    _set_self_attention(layer_spec.self_attention, layer["self_attention"], layer["norm_attention"])
    _set_ffn(layer_spec.ffn, layer["ffn"], layer["norm_ffn"])
  if cfg.norm == "pre":
    _set_norm(spec.layer_norm, stack["final_norm"])


def _set_decoder(
  spec: "transformer_spec.TransformerDecoderSpec",
  cfg: TransformerConfig,
  stack: ParamTree,
  embedding: np.ndarray,
) -> None:
  spec.embeddings.weight = embedding
  spec.position_encodings.encodings = _positions(cfg, stack)
  for i, layer_spec in enumerate(spec.layer):
    layer = stack[f"layer_{i}"]
    _set_self_attention(
      layer_spec.self_attention, layer["self_attention"], layer["norm_self_attention"]
    )
    _set_cross_attention(
      layer_spec.attention, layer["cross_attention"], layer["norm_cross_attention"]
    )
    _set_ffn(layer_spec.ffn, layer["ffn"], layer["norm_ffn"])
  if cfg.norm == "pre":
    _set_norm(spec.layer_norm, stack["final_norm"])


def check_quantization(quantization: str) -> None:
  if quantization not in QUANTIZATIONS:
    raise ExportError(
      f"--quantization={quantization}: allowed values are {', '.join(QUANTIZATIONS)}"
    )


def export(trained: Trained, output: str, quantization: str = "float32") -> str:
  """Writes the CTranslate2 model directory `output` (model.bin, config.json,
  shared_vocabulary.json and the workdir's vocabulary file); returns its path.

  quantization: the stored weight type (QUANTIZATIONS); CTranslate2 can still convert at
  load time with `compute_type`.
  """
  check_quantization(quantization)
  check_output_dir(output)
  spec = build_spec(trained)
  spec.register_file(trained.vocab_file)
  spec.validate()
  spec.optimize(quantization=quantization)
  os.makedirs(output, exist_ok=True)
  spec.save(output)
  return output
