"""A minimum output length relative to the source (fairseq's and CTranslate2's minimum
decoding length, scaled by each sentence's own source): EOS may not be taken before an
output, EOS included, holds `ratio` times its source's tokens (EOS included), rounded up
and never beyond the output's limit. A decoding rule (decoding/rules.py) whose state is
each sentence's minimum, computed once from the sources."""

import dataclasses

import jax
import jax.numpy as jnp

from t2t_jax.decoding.rules import Choice, PyTree, View
from t2t_jax.tokens import PAD_ID


@dataclasses.dataclass(frozen=True)
class MinLengthRatio:
  """EOS banned until step + 1 >= min(ceil(ratio * source length), limit): a search can
  no longer stop at a short fragment of a long sentence. Every other token stays allowed,
  so the row's log-probabilities are the model's."""

  ratio: float

  def __post_init__(self) -> None:
    if not self.ratio > 0:
      raise ValueError(f"min_length_ratio={self.ratio} must be > 0 (0: no rule)")

  def init(self, sources: jax.Array, limits: jax.Array, prefix: jax.Array | None) -> PyTree:
    """int32 [batch]: each sentence's minimum output length, EOS included."""
    if sources is None:
      raise ValueError("min_length_ratio needs the sources its minimum lengths start from")
    source_len = jnp.sum(sources != PAD_ID, axis=-1).astype(jnp.float32)
    minimum = jnp.ceil(self.ratio * source_len).astype(jnp.int32)
    return jnp.minimum(minimum, limits.astype(jnp.int32))

  def choice(self, view: View, state: PyTree) -> Choice:
    return Choice(eos=view.step + 1 >= state)

  def advance(self, state: PyTree, tokens: jax.Array) -> PyTree:
    return state
