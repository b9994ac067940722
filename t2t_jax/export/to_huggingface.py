"""A trained Transformer as a Hugging Face MarianMT directory (`MarianMTModel.from_pretrained`).

MarianMT in transformers is the paper's post-norm encoder-decoder with sinusoidal positions
and scaled embeddings, so a t2t_jax post-norm model maps onto it weight by weight, with two
differences bridged here:

- Marian's sinusoidal table puts all sines before all cosines (dimension i < d/2 is
  sin(pos w_i), d/2 + i is cos(pos w_i)), ours interleaves them (2i sin, 2i + 1 cos), and
  transformers rebuilds its table when it loads a model. Permuting the d_model dimensions of
  the residual stream by `residual_permutation` turns our table into Marian's exactly; applied
  to every weight that reads or writes the residual stream (embeddings, each projection's
  input or output side, the layer norms, whose statistics do not depend on the order), the
  permuted model computes the same function. Head dimensions and d_ff are left alone.
- our decoder starts from BOS (id 2), Marian's default from pad: decoder_start_token_id=2.

Not expressible in MarianMT, so refused: pre-norm models (Marian's layers are post-norm),
learned positions (transformers rebuilds the sinusoidal table at load time), and d_k or d_v
other than d_model / h. One difference remains: transformers' Marian layer norms use epsilon
1e-5 (not configurable), ours 1e-6; the logits differ by far less than 1e-4
(tests/test_export_huggingface.py measures it).
"""

import json
import os
import shutil
from typing import Any

import numpy as np
from flax.typing import VariableDict
from numpy.typing import ArrayLike

from t2t_jax.decoding.config import SearchConfig
from t2t_jax.export import ExportError, ParamTree, Trained, check_output_dir
from t2t_jax.model import TransformerConfig, positional
from t2t_jax.tokens import BOS_ID, EOS_ID, PAD_ID


def residual_permutation(d_model: int) -> np.ndarray:
  """perm such that marian_vector = our_vector[..., perm]: even dimensions (sines), then odd
  (cosines). int [d_model]."""
  return np.concatenate([np.arange(0, d_model, 2), np.arange(1, d_model, 2)])


def check_supported(cfg: TransformerConfig) -> None:
  """Raises ExportError with the reason when MarianMT cannot express the model."""
  if cfg.norm != "post":
    raise ExportError(
      "--format=huggingface: the model is pre-norm (norm='pre'); MarianMT "
      "layers are post-norm (use --format=ctranslate2)"
    )
  if cfg.positional != "sinusoidal":
    raise ExportError(
      "--format=huggingface: the model has learned positions; MarianMT "
      "rebuilds a fixed sinusoidal table when it loads (use "
      "--format=ctranslate2)"
    )
  head = cfg.d_model // cfg.num_heads
  if cfg.key_dim != head or cfg.value_dim != head or cfg.d_model % cfg.num_heads:
    raise ExportError(
      f"--format=huggingface: d_k={cfg.key_dim}, d_v={cfg.value_dim}; MarianMT "
      f"heads have d_model / h = {cfg.d_model / cfg.num_heads:g} dimensions"
    )


class _Weights:
  """Our parameters as a transformers MarianMTModel state dict, residual stream permuted."""

  def __init__(self, cfg: TransformerConfig) -> None:
    self.perm = residual_permutation(cfg.d_model)
    self.tensors: dict[str, np.ndarray] = {}

  def put(self, name: str, value: ArrayLike) -> None:
    self.tensors[name] = np.ascontiguousarray(np.asarray(value, np.float32))

  def reads(self, name: str, kernel: ArrayLike, bias: ArrayLike | None) -> None:
    """A linear layer reading the residual stream: kernel [d_model, ...] -> weight [out,
    d_model] with permuted input columns."""
    kernel = np.asarray(kernel)
    weight = kernel.reshape(kernel.shape[0], -1)[self.perm].T
    self.put(f"{name}.weight", weight)
    self.put(
      f"{name}.bias", np.zeros(weight.shape[0]) if bias is None else np.asarray(bias).reshape(-1)
    )

  def writes(self, name: str, kernel: ArrayLike, bias: ArrayLike) -> None:
    """A linear layer writing the residual stream: kernel [..., d_model] -> weight [d_model,
    in] with permuted output rows."""
    kernel = np.asarray(kernel)
    self.put(f"{name}.weight", kernel.reshape(-1, kernel.shape[-1]).T[self.perm])
    self.put(f"{name}.bias", np.asarray(bias)[self.perm])

  def norm(self, name: str, norm: ParamTree) -> None:
    self.put(f"{name}.weight", np.asarray(norm["scale"])[self.perm])
    self.put(f"{name}.bias", np.asarray(norm["bias"])[self.perm])

  def attention(self, name: str, attention: ParamTree) -> None:
    for ours, theirs in (("query", "q_proj"), ("key", "k_proj"), ("value", "v_proj")):
      self.reads(f"{name}.{theirs}", attention[ours]["kernel"], attention[ours].get("bias"))
    self.writes(f"{name}.out_proj", attention["out"]["kernel"], attention["out"]["bias"])

  def ffn(self, name: str, ffn: ParamTree) -> None:
    self.reads(f"{name}.fc1", ffn["wi"]["kernel"], ffn["wi"]["bias"])
    self.writes(f"{name}.fc2", ffn["wo"]["kernel"], ffn["wo"]["bias"])


def state_dict(cfg: TransformerConfig, params: VariableDict) -> dict[str, np.ndarray]:
  """MarianMTModel parameter names -> float32 numpy arrays (residual stream permuted)."""
  w = _Weights(cfg)
  table = np.asarray(positional.sinusoidal(cfg.max_len, cfg.d_model))[:, w.perm]
  for side in ("encoder", "decoder"):
    w.put(f"model.{side}.embed_positions.weight", table)
  for i in range(cfg.encoder_layers):
    layer, name = params["encoder"][f"layer_{i}"], f"model.encoder.layers.{i}"
    w.attention(f"{name}.self_attn", layer["self_attention"])
    w.norm(f"{name}.self_attn_layer_norm", layer["norm_attention"])
    w.ffn(name, layer["ffn"])
    w.norm(f"{name}.final_layer_norm", layer["norm_ffn"])
  for i in range(cfg.decoder_layers):
    layer, name = params["decoder"][f"layer_{i}"], f"model.decoder.layers.{i}"
    w.attention(f"{name}.self_attn", layer["self_attention"])
    w.norm(f"{name}.self_attn_layer_norm", layer["norm_self_attention"])
    w.attention(f"{name}.encoder_attn", layer["cross_attention"])
    w.norm(f"{name}.encoder_attn_layer_norm", layer["norm_cross_attention"])
    w.ffn(name, layer["ffn"])
    w.norm(f"{name}.final_layer_norm", layer["norm_ffn"])
  _embeddings(w, cfg, params)
  return w.tensors


def _embeddings(w: _Weights, cfg: TransformerConfig, params: VariableDict) -> None:
  """Token embeddings, the pre-softmax layer and its bias (zeros when shared, paper 3.4).

  A shared matrix is stored once, as model.shared; transformers ties the encoder's, the
  decoder's and the pre-softmax weights to it (share_encoder_decoder_embeddings and
  tie_word_embeddings in the config).
  """
  if cfg.share_embeddings:
    w.put("model.shared.weight", np.asarray(params["embed"]["embedding"])[:, w.perm])
    w.put("final_logits_bias", np.zeros((1, cfg.vocab_size)))
    return
  w.put(
    "model.encoder.embed_tokens.weight", np.asarray(params["source_embed"]["embedding"])[:, w.perm]
  )
  w.put(
    "model.decoder.embed_tokens.weight", np.asarray(params["target_embed"]["embedding"])[:, w.perm]
  )
  logits = params["decoder"]["logits"]
  w.put("lm_head.weight", np.asarray(logits["kernel"])[w.perm].T)
  w.put("final_logits_bias", np.asarray(logits["bias"])[None])


def marian_config(cfg: TransformerConfig) -> dict[str, Any]:
  """The MarianConfig fields of a t2t_jax model (dropout off: an inference export)."""
  return dict(
    architectures=["MarianMTModel"],
    model_type="marian",
    vocab_size=cfg.vocab_size,
    decoder_vocab_size=cfg.vocab_size,
    d_model=cfg.d_model,
    encoder_layers=cfg.encoder_layers,
    decoder_layers=cfg.decoder_layers,
    encoder_attention_heads=cfg.num_heads,
    decoder_attention_heads=cfg.num_heads,
    encoder_ffn_dim=cfg.d_ff,
    decoder_ffn_dim=cfg.d_ff,
    activation_function="relu",
    max_position_embeddings=cfg.max_len,
    scale_embedding=True,
    dropout=0.0,
    attention_dropout=0.0,
    activation_dropout=0.0,
    pad_token_id=PAD_ID,
    eos_token_id=EOS_ID,
    bos_token_id=BOS_ID,
    decoder_start_token_id=BOS_ID,
    forced_eos_token_id=EOS_ID,
    share_encoder_decoder_embeddings=cfg.share_embeddings,
    tie_word_embeddings=cfg.share_embeddings,
    is_encoder_decoder=True,
  )


def generation_config(cfg: TransformerConfig, search: SearchConfig) -> dict[str, Any]:
  """What `generate` and pipeline("translation") use by default: the search's beam and alpha
  (HF's length penalty is length^alpha, not GNMT's; see docs/export.md), outputs up to
  max_len."""
  return dict(
    decoder_start_token_id=BOS_ID,
    bos_token_id=BOS_ID,
    eos_token_id=EOS_ID,
    pad_token_id=PAD_ID,
    forced_eos_token_id=EOS_ID,
    num_beams=search.beam_size,
    length_penalty=search.alpha,
    max_length=cfg.max_len,
  )


def _write_json(path: str, value: dict[str, Any]) -> None:
  with open(path, "w", encoding="utf-8") as f:
    json.dump(value, f, indent=2, sort_keys=True)
    f.write("\n")


def write_tokenizer(trained: Trained, output: str) -> None:
  """MarianTokenizer files: the shared SentencePiece model as source.spm and target.spm, and
  vocab.json (piece -> id, our ids), so tokenizer ids are the model's ids."""
  from transformers import MarianTokenizer

  for name in ("source.spm", "target.spm"):
    shutil.copyfile(trained.vocab_file, os.path.join(output, name))
  _write_json(
    os.path.join(output, "vocab.json"), {piece: i for i, piece in enumerate(trained.vocabulary)}
  )
  tokenizer = MarianTokenizer(
    os.path.join(output, "source.spm"),
    os.path.join(output, "target.spm"),
    os.path.join(output, "vocab.json"),
    source_lang=trained.source_lang or None,
    target_lang=trained.target_lang or None,
    bos_token="<s>",
    model_max_length=trained.config.max_len,
  )
  tokenizer.save_pretrained(output)


def export(trained: Trained, output: str, search: SearchConfig | None = None) -> str:
  """Writes model.safetensors, config.json, generation_config.json (decoding with `search`,
  default: the workdir's, trained.search) and (for a SentencePiece vocabulary) the
  MarianTokenizer files to `output`; returns its path.

  A symbol or word vocabulary (synthetic tasks, parsing's vocab.words) has no SentencePiece
  model for MarianTokenizer: the model is written without tokenizer files and is used with
  token ids.
  """
  from safetensors.numpy import save_file

  cfg = trained.config
  check_supported(cfg)
  check_output_dir(output)
  tensors = state_dict(cfg, trained.params)
  os.makedirs(output, exist_ok=True)
  save_file(tensors, os.path.join(output, "model.safetensors"), metadata={"format": "pt"})
  _write_json(os.path.join(output, "config.json"), marian_config(cfg))
  _write_json(
    os.path.join(output, "generation_config.json"), generation_config(cfg, search or trained.search)
  )
  if trained.is_sentencepiece:
    write_tokenizer(trained, output)
  return output
