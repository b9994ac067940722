"""Scoring given translations: log p(target | source) under a trained model, teacher-forced.

One forward pass per batch gives every target token's log-probability (`target_log_probs`);
`sequence_scores` turns a pair's token log-probabilities into the three figures t2t-score
prints: their sum (log p of the whole target, EOS included), their mean per token, and the
sum divided by the GNMT length penalty, the number beam search ranks by
(beam.length_penalty), so that a given translation's score compares with the search's.

The model enters only through the token log-probabilities of one batch
(`Scorer.token_log_probs`). An ensemble (a Translator of several members) scores each target
token with the distribution its search decodes with, `model_view.ensemble_log_probs` of the
members' logits at that position, so an ensemble's score of its own translation is its
search's score.
"""

import functools
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax.typing import VariableDict

from t2t_jax import compilation
from t2t_jax.decoding.beam import length_penalty
from t2t_jax.decoding.model_view import ensemble_log_probs
from t2t_jax.decoding.translator import TranslateError, Translator
from t2t_jax.model import Transformer
from t2t_jax.tokens import EOS_ID, PAD_ID


@compilation.stored
@functools.partial(jax.jit, static_argnames=("model",))
def target_log_probs(
  params: VariableDict, inputs: jax.Array, targets: jax.Array, *, model: Transformer
) -> jax.Array:
  """log p(targets[b, t] | targets[b, :t], inputs[b]) as float32 [batch, target length], 0
  at padding: the decoder sees BOS + targets[:, :-1] (the teacher forcing of training)."""
  logits = model.apply({"params": params}, inputs, targets)
  log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  picked = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
  return jnp.where(targets != PAD_ID, picked, 0.0)


@compilation.stored
@functools.partial(jax.jit, static_argnames=("models",))
def ensemble_target_log_probs(
  params: tuple[VariableDict, ...],
  inputs: jax.Array,
  targets: jax.Array,
  *,
  models: tuple[Transformer, ...],
) -> jax.Array:
  """`target_log_probs` of an ensemble: each position's distribution is
  `model_view.ensemble_log_probs` of the members' logits (one teacher-forced pass each)."""
  logits = [m.apply({"params": p}, inputs, targets) for m, p in zip(models, params)]
  log_probs = ensemble_log_probs(logits)
  picked = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
  return jnp.where(targets != PAD_ID, picked, 0.0)


class PairScore(NamedTuple):
  """The scores of one (source, target) pair; the target's tokens include EOS."""

  log_prob: float  # log p(target | source): the sum of `tokens`
  mean: float  # log_prob / number of tokens
  normalised: float  # log_prob / ((5 + number of tokens) / 6) ** alpha, as beam search ranks
  tokens: np.ndarray  # float32 [number of tokens]: each token's log-probability


def sequence_scores(token_log_probs: np.ndarray, alpha: float) -> PairScore:
  """A pair's scores from its token log-probabilities (float [length], EOS included)."""
  tokens = np.asarray(token_log_probs, np.float32)
  total = float(np.sum(tokens, dtype=np.float64))
  length = tokens.shape[0]
  return PairScore(
    log_prob=total,
    mean=total / length,
    normalised=total / float(length_penalty(length, alpha)),
    tokens=tokens,
  )


class Scorer:
  """Scores given translations with a Translator's model, parameters and vocabulary.

  Pairs are sorted by length and batched to about `batch_tokens` tokens per side (rows
  rounded up to a power of two, lengths to multiples of 8, so that few shapes compile); the
  scores come back in input order.
  """

  def __init__(self, translator: Translator, alpha: float | None = None) -> None:
    self.translator = translator
    self.alpha = translator.search.alpha if alpha is None else alpha

  def token_log_probs(self, inputs: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Each target token's log-probability, float32 [batch, target length] (0 at PAD)."""
    params, model = self.translator.decoder()
    if isinstance(model, tuple):
      return np.asarray(ensemble_target_log_probs(params, inputs, targets, models=model))
    return np.asarray(target_log_probs(params, inputs, targets, model=model))

  def target_ids(self, targets: Sequence[str], target_name: str = "target") -> list[list[int]]:
    """Token ids + EOS per target. A target longer than the model's max_len cannot be
    scored whole (the model has no positions for it): refused, naming its lines."""
    max_len = self.translator.model.config.max_len
    tokenizer = self.translator.tokenizer
    ids = [list(tokenizer.encode(text)) + [EOS_ID] for text in targets]
    long = [i + 1 for i, t in enumerate(ids) if len(t) > max_len]
    if long:
      lines = ", ".join(map(str, long[:10])) + (", ..." if len(long) > 10 else "")
      raise TranslateError(
        f"{target_name}: {len(long)} target(s) have more tokens (with EOS) than the "
        f"model's max_len={max_len} (lines {lines})"
      )
    return ids

  def score(
    self,
    sources: Sequence[str],
    targets: Sequence[str],
    source_name: str = "source",
    target_name: str = "target",
  ) -> list[PairScore]:
    """The scores of each (sources[i], targets[i]), in input order. Sources longer than
    max_len are cut as translate() cuts them (with a warning naming `source_name`)."""
    if len(sources) != len(targets):
      raise TranslateError(
        f"{source_name} has {len(sources)} lines but {target_name} has {len(targets)}"
      )
    target_ids = self.target_ids(targets, target_name)
    source_ids = self.translator.source_ids(sources, source_name)
    out: list[PairScore | None] = [None] * len(sources)
    for batch in self._batches(source_ids, target_ids):
      inputs = self._padded([source_ids[i] for i in batch])
      padded_targets = self._padded([target_ids[i] for i in batch])
      found = self.token_log_probs(inputs, padded_targets)
      for row, i in enumerate(batch):
        out[i] = sequence_scores(found[row, : len(target_ids[i])], self.alpha)
    return out

  def _batches(
    self, sources: Sequence[Sequence[int]], targets: Sequence[Sequence[int]]
  ) -> Iterator[list[int]]:
    """Indices of pairs in batches of similar length, each of at most batch_tokens tokens
    per side (a longer pair alone)."""
    length = [max(len(s), len(t)) for s, t in zip(sources, targets)]
    batch, longest = [], 0
    for i in sorted(range(len(length)), key=length.__getitem__):
      longest = max(longest, length[i])
      if batch and (len(batch) + 1) * longest > self.translator.batch_tokens:
        yield batch
        batch, longest = [], length[i]
      batch.append(i)
    if batch:
      yield batch

  def _padded(self, rows: Sequence[Sequence[int]]) -> np.ndarray:
    """int32 [rows rounded up to a power of two, longest rounded up to 8 (<= max_len)]."""
    max_len = self.translator.model.config.max_len
    length = min(-(-max(len(r) for r in rows) // 8) * 8, max_len)
    out = np.full((1 << (len(rows) - 1).bit_length(), length), PAD_ID, np.int32)
    for r, ids in enumerate(rows):
      out[r, : len(ids)] = ids
    return out
