"""Text into and out of a search: each sentence's source ids (cut to the model's max_len,
with one warning), the prefixes checked before any decoding, and the n-best `Hypothesis`
lists a search's outputs become, scored as docs/translation.md says (`modes`' `scores`)."""

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
from absl import logging

from t2t_jax.data.tokenizer import Tokenizer
from t2t_jax.decoding import modes
from t2t_jax.decoding.beam import length_penalty
from t2t_jax.decoding.workdirs import TranslateError
from t2t_jax.tokens import EOS_ID, PAD_ID

_LINE_BREAKS = str.maketrans({"\n": " ", "\r": " ", "\t": " "})


def one_line(text: str) -> str:
  """A translation as one line of text: a model whose vocabulary falls back to bytes can
  output the newline, carriage-return or tab byte (sampling draws them now and then), which
  would split one output into two lines of t2t-translate's output or shift the columns of
  its TSV; each becomes a space."""
  return text.translate(_LINE_BREAKS)


class Hypothesis(NamedTuple):
  """One translation of an n-best list.

  score: the search's ranking score, log p / lp with the GNMT length penalty
  lp = ((5 + length) / 6)^alpha (beam.length_penalty; length counts EOS).
  log_prob: log p(translation | source), the sum of its token log-probabilities.
  """

  text: str
  score: float
  log_prob: float


def hypotheses(
  tokenizer: Tokenizer,
  seqs: np.ndarray,
  values: np.ndarray,
  mode: modes.Mode,
  alpha: float,
  nbest: int,
) -> list[Hypothesis]:
  """The `nbest` best of one sentence's search output (seqs [hypotheses, L], their values
  [hypotheses], as `mode` gives them: `modes`' `scores`), best first; empty slots (-inf:
  fewer hypotheses of nonzero probability) are left out."""
  out = []
  for seq, value in zip(seqs[:nbest], values[:nbest]):
    if not np.isfinite(value):
      continue
    ends = np.flatnonzero(seq == EOS_ID)
    length = int(ends[0]) + 1 if ends.size else int(np.count_nonzero(seq != PAD_ID))
    score, log_prob = mode.scores(float(value), float(length_penalty(length, alpha)))
    out.append(Hypothesis(one_line(tokenizer.decode(seq)), score, log_prob))
  return out


def warm_up_hypotheses(alpha: float) -> None:
  """Compiles the jnp operations `hypotheses` runs on the host (the length penalty of a
  Python int and float), which would otherwise compile at the first n-best request."""
  length_penalty(1, alpha)


def _lines(numbers: Sequence[int]) -> str:
  return ", ".join(map(str, numbers[:10])) + (", ..." if len(numbers) > 10 else "")


def source_ids(
  tokenizer: Tokenizer, sentences: Sequence[str], max_len: int, source_name: str = "input"
) -> list[list[int]]:
  """Token ids + EOS per sentence; longer than max_len: cut to it, with one warning for all
  of `source_name`."""
  ids, cut = [], []
  for i, text in enumerate(sentences):
    tokens = list(tokenizer.encode(text)) + [EOS_ID]
    if len(tokens) > max_len:
      cut.append(i + 1)
      tokens = tokens[: max_len - 1] + [EOS_ID]
    ids.append(tokens)
  if cut:
    logging.warning(
      "%s: %d of %d sentences have more source tokens than the model's max_len=%d and "
      "were truncated to it (lines %s)",
      source_name,
      len(cut),
      len(sentences),
      max_len,
      _lines(cut),
    )
  return ids


def prefix_ids(
  tokenizer: Tokenizer,
  prefixes: Sequence[str] | None,
  count: int,
  max_len: int,
  prefix_name: str,
  source_name: str,
) -> list[list[int]] | None:
  """Each prefix's target token ids (no EOS), checked before any decoding: one per source
  sentence, each leaving room for EOS within max_len."""
  if prefixes is None:
    return None
  if len(prefixes) != count:
    raise TranslateError(f"{prefix_name} has {len(prefixes)} lines but {source_name} has {count}")
  ids = [list(tokenizer.encode(text)) for text in prefixes]
  long = [i + 1 for i, p in enumerate(ids) if len(p) + 1 > max_len]
  if long:
    raise TranslateError(
      f"{prefix_name}: {len(long)} prefix(es) leave no room for EOS within the model's "
      f"max_len={max_len} (lines {_lines(long)})"
    )
  return ids
