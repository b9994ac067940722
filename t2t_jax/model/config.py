"""The model's hyperparameters: one frozen dataclass whose defaults are the base model.

Its own module so that the layers can type their `config` without importing the modules
built from them, and so that experiments/base.py takes its `config.model` from these
defaults instead of writing them a second time.
"""

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax.numpy as jnp

NORMS = ("post", "pre")
POSITIONALS = ("sinusoidal", "learned")
ATTENTION_IMPLS = ("reference", "xla", "cudnn")


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
  """Model hyperparameters, named as in the paper (Table 3 columns).

  Every default is the base model of Table 3 (N=6, d_model=512, d_ff=2048, h=8,
  d_k=d_v=64, P_drop=0.1); `vocab_size` has none: it comes from the trained vocabulary.
  """

  vocab_size: int
  d_model: int = 512
  d_ff: int = 2048
  num_heads: int = 8  # h
  d_k: int = 0  # query/key size per head; 0: d_model / h (64 in the base model)
  d_v: int = 0  # value size per head; 0: d_model / h
  num_layers: int = 6  # N, for encoder and decoder unless given separately
  num_encoder_layers: int | None = 0  # 0 (or None): num_layers
  num_decoder_layers: int | None = 0  # 0 (or None): num_layers
  dropout_rate: float = 0.1  # P_drop: residual and embedding dropout (5.4)
  # The paper drops only sub-layer outputs and embeddings, not attention weights.
  attention_dropout_rate: float = 0.0
  norm: str = "post"  # 'post' (paper) or 'pre'
  positional: str = "sinusoidal"  # 'sinusoidal' (paper) or 'learned' (Table 3 row E)
  share_embeddings: bool = True  # one matrix for source, target and pre-softmax (3.4)
  # Computation dtype: 'float32', or 'bfloat16' on accelerators; parameters stay float32.
  dtype: Any = "float32"
  max_len: int = 512  # longest sequence (position table size)
  attention_impl: str = "reference"  # 'reference', 'xla' or 'cudnn' (NVIDIA GPUs)
  # Training/eval loss: the pre-softmax layer and the loss run over chunks of this many
  # target tokens, never holding all logits (losses.output_loss_sums); 0: whole logits.
  loss_chunk_tokens: int = 512

  def __post_init__(self) -> None:
    try:
      object.__setattr__(self, "dtype", jnp.dtype(self.dtype))
    except TypeError as e:
      raise ValueError(
        f"TransformerConfig.dtype={self.dtype!r} is not a dtype (use 'float32' or 'bfloat16')"
      ) from e
    for name in ("vocab_size", "d_model", "d_ff", "num_heads", "num_layers", "max_len"):
      _check_positive(name, getattr(self, name))
    for name in ("num_encoder_layers", "num_decoder_layers"):
      if getattr(self, name):  # None or 0 mean "num_layers"
        _check_positive(name, getattr(self, name))
    if self.loss_chunk_tokens < 0:
      raise ValueError(
        f"TransformerConfig.loss_chunk_tokens={self.loss_chunk_tokens}: must "
        "be >= 0 (0: whole logits)"
      )
    for name in ("d_k", "d_v"):
      if getattr(self, name):
        _check_positive(name, getattr(self, name))
      elif self.d_model % self.num_heads:
        raise ValueError(
          f"TransformerConfig.d_model={self.d_model} is not divisible by "
          f"TransformerConfig.num_heads={self.num_heads} ({name} = d_model / h must be whole; "
          f"or set {name})"
        )
    if self.d_model % 2:
      raise ValueError(
        f"TransformerConfig.d_model={self.d_model} must be even "
        "(sin/cos pairs of the positional encoding)"
      )
    _check_choice("norm", self.norm, NORMS)
    _check_choice("positional", self.positional, POSITIONALS)
    _check_choice("attention_impl", self.attention_impl, ATTENTION_IMPLS)
    for name in ("dropout_rate", "attention_dropout_rate"):
      rate = getattr(self, name)
      if not 0.0 <= rate < 1.0:
        raise ValueError(f"TransformerConfig.{name}={rate}: must be in [0, 1)")

  @property
  def key_dim(self) -> int:
    return self.d_k or self.d_model // self.num_heads

  @property
  def value_dim(self) -> int:
    return self.d_v or self.d_model // self.num_heads

  @property
  def encoder_layers(self) -> int:
    return self.num_encoder_layers or self.num_layers

  @property
  def decoder_layers(self) -> int:
    return self.num_decoder_layers or self.num_layers

  def parameter_fields(self) -> dict[str, Any]:
    """{field: resolved value} of every field that decides the parameter tree and its shapes
    (d_k=0 resolved to d_model / h, layer counts 0 to num_layers; max_len only names a
    parameter with learned positions). Two configs with equal values can load each other's
    parameters; dropout, dtype or the attention implementation may differ."""
    fields = dict(
      vocab_size=self.vocab_size,
      d_model=self.d_model,
      d_ff=self.d_ff,
      num_heads=self.num_heads,
      d_k=self.key_dim,
      d_v=self.value_dim,
      num_encoder_layers=self.encoder_layers,
      num_decoder_layers=self.decoder_layers,
      norm=self.norm,
      positional=self.positional,
      share_embeddings=self.share_embeddings,
    )
    if self.positional == "learned":
      fields["max_len"] = self.max_len
    return fields

  def replace(self, **changes: Any) -> "TransformerConfig":
    return dataclasses.replace(self, **changes)

  @classmethod
  def defaults(cls) -> dict[str, Any]:
    """{field: default} as written above (dtype by name), every field but vocab_size: the
    `config.model` of an experiment, so that each default is written only here."""
    return {
      f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING
    }

  @classmethod
  def from_dict(cls, fields: Mapping[str, Any], **overrides: Any) -> "TransformerConfig":
    """Builds a config from a mapping (e.g. an ml_collections `config.model`); a field the
    class does not have is an error naming its --config.model flag, never silently unused."""
    fields = dict(fields, **overrides)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(fields) - known)
    if unknown:
      flags = ", ".join(f"--config.model.{name}" for name in unknown)
      raise ValueError(f"unknown model config field(s) {unknown} ({flags}); known: {sorted(known)}")
    return cls(**fields)


def _check_positive(name: str, value: object) -> None:
  if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
    raise ValueError(f"TransformerConfig.{name}={value!r}: must be a positive integer")


def _check_choice(name: str, value: object, allowed: Sequence[str]) -> None:
  if value not in allowed:
    raise ValueError(
      f"TransformerConfig.{name}={value!r}: allowed values are "
      f"{', '.join(repr(a) for a in allowed)}"
    )
