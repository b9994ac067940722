"""Several weighted training corpora (config.data.train_corpora): the entries, their checks,
and the fixed multiset of training pairs that one epoch of the training stream holds.

A weight is an UPSAMPLING FACTOR (fairseq's upsample_primary, OpenNMT-py's counts per round):
an epoch holds every kept pair of a corpus `floor(weight)` times, plus a seeded sample of
`weight - floor(weight)` of its pairs once more. The length-bucket plan (batching.BucketPlan)
computes the batch of any step from per-bucket counts that are the same in every epoch, which
is what makes its resume exact and random-access; a fixed multiset keeps that true, and a
factor says what happens to each pair (seen twice, seen once) whatever the corpus sizes. A
share of pairs would be the same multiset with factors derived from the sizes: for shares
p_k, weight_k = p_k * total / pairs_k.

The single train_source/train_target pair is the one-corpus list of weight 1 and no tag.
"""

import dataclasses
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from t2t_jax.data.errors import DataError

FIELDS = ("source", "target", "weight", "tag")


@dataclasses.dataclass(frozen=True)
class Corpus:
  """One training corpus: two aligned files, its upsampling factor and its source tag."""

  flag: str  # how messages name it: 'train_corpora[1]', or 'train' for train_source/target
  source: str
  target: str
  weight: float = 1.0
  tag: str = ""

  @property
  def name(self) -> str:
    return f"{self.source} / {self.target}"


def _entries(c: Any) -> list[Any]:
  """The train_corpora entries as plain dicts where they are ConfigDicts."""
  return [e.to_dict() if hasattr(e, "to_dict") else e for e in c.train_corpora]


def given(c: Any) -> bool:
  """Whether the data config lists its training corpora in train_corpora."""
  return bool(c.get("train_corpora"))


def corpora(c: Any) -> list[Corpus]:
  """The training corpora of data config `c`, in order (train_source/train_target as one
  corpus of weight 1 when train_corpora is empty). Entries must have passed `check`."""
  if not given(c):
    return [Corpus("train", c.train_source, c.train_target)]
  return [
    Corpus(
      f"train_corpora[{i}]",
      str(entry["source"]),
      str(entry["target"]),
      float(entry.get("weight", 1.0)),
      str(entry.get("tag", "") or ""),
    )
    for i, entry in enumerate(_entries(c))
  ]


def tags(c: Any) -> list[str]:
  """The distinct non-empty tags of the training corpora, in order of first use."""
  if not given(c):
    return []
  return list(dict.fromkeys(k.tag for k in corpora(c) if k.tag))


def check(c: Any) -> None:
  """Raises DataError naming `config.data.train_corpora[i].<field>` for a bad entry: not a
  mapping, an unknown or missing field, a weight that is not a finite number > 0, a tag that cannot
  be one vocabulary piece (empty or with whitespace: SentencePiece splits pieces there), or
  a file that does not exist."""
  if c.train_source or c.train_target:
    raise DataError(
      f"config.data.train_corpora={c.train_corpora!r} and train_source={c.train_source!r}/"
      f"train_target="
      f"{c.train_target!r} are both set: list the training files in train_corpora only"
    )
  for i, entry in enumerate(_entries(c)):
    flag = f"config.data.train_corpora[{i}]"
    if not isinstance(entry, Mapping):
      raise DataError(
        f"{flag}={entry!r} must be a dict {{'source': path, 'target': path, "
        "'weight': 1.0, 'tag': ''}"
      )
    unknown = sorted(set(entry) - set(FIELDS))
    if unknown:
      raise DataError(f"{flag} has unknown field(s) {unknown}; the fields are {FIELDS}")
    for side in ("source", "target"):
      path = entry.get(side)
      if not path or not isinstance(path, str):
        raise DataError(f"{flag}.{side}={path!r}: give the path of the corpus's {side} file")
      if "://" not in path and not os.path.isfile(path):
        what = "is a directory" if os.path.isdir(path) else "no such file"
        raise DataError(f"{path}: {what} ({flag}.{side})")
    weight = entry.get("weight", 1.0)
    number = isinstance(weight, int | float) and not isinstance(weight, bool)
    if not number or not 0 < weight < math.inf:
      raise DataError(
        f"{flag}.weight={weight!r} must be a finite number > 0 (an upsampling factor: the times "
        "each of its pairs is in an epoch)"
      )
    tag = entry.get("tag", "")
    if tag is not None and not isinstance(tag, str):
      raise DataError(f"{flag}.tag={tag!r} must be a string")
    if tag and (tag != tag.strip() or any(ch.isspace() for ch in tag)):
      raise DataError(
        f"{flag}.tag={tag!r} cannot be one vocabulary piece: SentencePiece splits pieces at "
        "whitespace; use a tag without spaces such as '<bt>'"
      )


def sample(kept: Sequence[int], weights: Sequence[float], seed: int) -> np.ndarray | None:
  """[slots] the training pair index of each slot of an epoch, for corpora of `kept` pairs
  stored one after the other, with upsampling factors `weights`; None when every factor is 1
  (every pair once: the plan over the pairs themselves).

  Corpus k fills floor(w_k) copies of its pairs, then round((w_k - floor(w_k)) * kept_k)
  pairs (at least one when w_k < 1) drawn without replacement from np.random.default_rng
  ([seed, k]); the draw is fixed, so every epoch holds the same multiset.
  """
  if all(w == 1 for w in weights):
    return None
  total = int(np.sum(kept))
  dtype = np.int32 if total < 2**31 else np.int64
  parts, start = [], 0
  for k, (n, w) in enumerate(zip(kept, weights)):
    whole = int(w)
    parts += [np.arange(start, start + n, dtype=dtype)] * whole
    extra = min(n, round((w - whole) * n))
    if whole == 0:
      extra = max(1, extra) if n else 0
    if extra:
      chosen = np.random.default_rng([seed, k]).choice(n, size=extra, replace=False)
      parts.append((start + np.sort(chosen)).astype(dtype))
    start += n
  return np.concatenate(parts)


def shares(
  kept: Sequence[int], sample_: np.ndarray | None, tokens: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
  """(share of the slots of an epoch, share of its tokens) per corpus, each [corpora]:
  what the training stream is expected to draw from each corpus. `tokens` [pairs] is each
  stored pair's source plus target tokens."""
  starts = np.concatenate([[0], np.cumsum(kept)]).astype(np.int64)
  slots = np.arange(starts[-1]) if sample_ is None else sample_
  corpus = np.searchsorted(starts, slots, side="right") - 1
  pairs = np.bincount(corpus, minlength=len(kept)).astype(np.float64)
  toks = np.bincount(corpus, weights=tokens[slots], minlength=len(kept))
  return pairs / max(1.0, pairs.sum()), toks / max(1.0, toks.sum())
