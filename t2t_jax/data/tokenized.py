"""Up-front tokenization into a compact ragged store, with the skip/drop counts of the report.

Tokenizing everything once (SentencePiece's multi-threaded batch encoder) makes every later
stage index-based: batch plans, exact per-epoch coverage, exact resume and exact counts of
what was dropped, at a cost of one pass over the corpus at startup.
"""

import dataclasses
import itertools
from collections.abc import Sequence

import numpy as np
from numpy.typing import DTypeLike

from t2t_jax.data.sources.base import PairSource
from t2t_jax.data.tokenizer import Tokenizer
from t2t_jax.tokens import EOS_ID

# (source ids, target ids) of a chunk of pairs, without EOS.
_Encoded = tuple[list[list[int]], list[list[int]]]


@dataclasses.dataclass(frozen=True)
class TokenizedPairs:
  """N pairs of token ids, EOS appended, each side concatenated into one flat array.

  Pair i's source is `inputs_flat[inputs_offsets[i]:inputs_offsets[i + 1]]` (same for
  targets); offsets have shape [N + 1].
  """

  inputs_flat: np.ndarray
  inputs_offsets: np.ndarray
  targets_flat: np.ndarray
  targets_offsets: np.ndarray

  def __len__(self) -> int:
    return len(self.inputs_offsets) - 1

  @property
  def inputs_lengths(self) -> np.ndarray:
    return np.diff(self.inputs_offsets)

  @property
  def targets_lengths(self) -> np.ndarray:
    return np.diff(self.targets_offsets)

  def pair(self, i: int) -> dict[str, np.ndarray]:
    """{'inputs': int32 [len_i], 'targets': int32 [len_t]} of pair i, EOS included."""
    i = int(i)
    return {
      "inputs": self.inputs_flat[self.inputs_offsets[i] : self.inputs_offsets[i + 1]].astype(
        np.int32
      ),
      "targets": self.targets_flat[self.targets_offsets[i] : self.targets_offsets[i + 1]].astype(
        np.int32
      ),
    }


@dataclasses.dataclass
class SplitCounts:
  """What happened to the pairs of one split."""

  read: int = 0  # pairs (lines) read from the source
  empty_skipped: int = 0  # pairs skipped because a side was empty or whitespace
  dropped_too_long: int = 0  # training pairs dropped because a side exceeded max_len
  dropped_by_ratio: int = 0  # training pairs dropped by max_length_ratio (after max_len)
  kept: int = 0

  def add(self, other: "SplitCounts") -> None:
    for field in dataclasses.fields(self):
      setattr(self, field.name, getattr(self, field.name) + getattr(other, field.name))


def is_empty(text: str) -> bool:
  """A line with nothing but whitespace carries no sentence."""
  return not text.strip()


def non_empty(pairs: Sequence[tuple[str, str]], counts: SplitCounts) -> list[tuple[str, str]]:
  """The pairs whose both sides have text; skipped ones are counted, alignment is kept."""
  kept = [p for p in pairs if not (is_empty(p[0]) or is_empty(p[1]))]
  counts.read += len(pairs)
  counts.empty_skipped += len(pairs) - len(kept)
  return kept


def tokenize_source(
  source: PairSource,
  tokenizer: Tokenizer,
  *,
  max_len: int | None,
  chunk: int = 20000,
  max_ratio: float = 0.0,
  tag_ids: Sequence[int] = (),
) -> tuple[TokenizedPairs, SplitCounts, list[SplitCounts]]:
  """Reads and tokenizes every pair of a PairSource; drops pairs over max_len (None: keep
  all) or beyond max_ratio (0: off). A `CorporaPairs` source is tokenized corpus by corpus,
  corpus k's sources starting with tag_ids[k] (-1: none). Returns the pairs, the split's
  counts and each corpus's counts."""
  counts, parts, per_corpus = SplitCounts(), [], []
  for k, part in enumerate(corpus_parts(source)):
    mine = SplitCounts()
    tag = tag_ids[k] if k < len(tag_ids) else -1
    for start in range(0, len(part), chunk):
      pairs = non_empty(part.read(range(start, min(start + chunk, len(part)))), mine)
      parts.append(encode_pairs(pairs, tokenizer, max_len, mine, max_ratio, tag))
    per_corpus.append(mine)
    counts.add(mine)
  dtype = np.uint16 if tokenizer.vocab_size <= 2**16 else np.int32
  return _concatenate(parts, dtype), counts, per_corpus


def corpus_parts(source: PairSource) -> list[PairSource]:
  """The pairs of each training corpus of `source` (itself alone unless a CorporaPairs)."""
  parts = getattr(source, "parts", None)
  return [pairs for _, pairs in parts] if parts is not None else [source]


def empty_pairs() -> TokenizedPairs:
  """No pairs (a split the source does not have)."""
  return _concatenate([], np.int32)


def tokenize_pairs(pairs: Sequence[tuple[str, str]], tokenizer: Tokenizer) -> TokenizedPairs:
  """Tokenizes already-read, non-empty pairs, keeping them all (dev and test sets)."""
  return _concatenate([encode_pairs(pairs, tokenizer, None, SplitCounts())], np.int32)


def truncate(pairs: TokenizedPairs, max_len: int) -> tuple[TokenizedPairs, int]:
  """Pairs with no side longer than `max_len` tokens, and how many pairs had to be cut.

  A side that is too long keeps its first max_len - 1 tokens and its EOS, as t2t-translate
  cuts a source; pairs that fit are unchanged.
  """
  too_long = (pairs.inputs_lengths > max_len) | (pairs.targets_lengths > max_len)
  if not too_long.any():
    return pairs, 0
  sides = ([], [])
  for i in range(len(pairs)):
    pair = pairs.pair(i)
    for side, key in zip(sides, ("inputs", "targets")):
      side.append(pair[key][:-1][: max_len - 1].tolist())  # without EOS; flatten adds it
  return _concatenate([sides], np.int32), int(too_long.sum())


def encode_pairs(
  pairs: Sequence[tuple[str, str]],
  tokenizer: Tokenizer,
  max_len: int | None,
  counts: SplitCounts,
  max_ratio: float = 0.0,
  tag_id: int = -1,
) -> tuple[list[list[int]], list[list[int]]]:
  """Token ids (no EOS) of non-empty pairs. With a tag (tag_id >= 0) each source starts
  with it. Pairs with a side of max_len or more tokens (max_len counts the EOS to come, and
  the source its tag) are dropped and counted, then, with max_ratio > 0, pairs whose longer
  side has more than max_ratio times the tokens of the shorter (text tokens: no tag, no
  EOS); max_len None keeps all."""
  sources = tokenizer.encode_batch([p[0] for p in pairs])
  targets = tokenizer.encode_batch([p[1] for p in pairs])
  in_ratio = [
    not max_ratio or not beyond_ratio(len(s), len(t), max_ratio) for s, t in zip(sources, targets)
  ]
  if tag_id >= 0:
    sources = [[tag_id, *s] for s in sources]
  if max_len is not None or max_ratio:
    fits = [
      max_len is None or (len(s) < max_len and len(t) < max_len)  # + EOS
      for s, t in zip(sources, targets)
    ]
    counts.dropped_too_long += len(fits) - sum(fits)
    counts.dropped_by_ratio += sum(f and not r for f, r in zip(fits, in_ratio))
    keep = [f and r for f, r in zip(fits, in_ratio)]
    sources = list(itertools.compress(sources, keep))
    targets = list(itertools.compress(targets, keep))
  counts.kept += len(sources)
  return sources, targets


def beyond_ratio(source_tokens: int, target_tokens: int, max_ratio: float) -> bool:
  """Whether a pair's longer side has more than `max_ratio` times the tokens of its shorter
  side, in either direction as Moses' clean-corpus-n.perl checks it."""
  longer, shorter = max(source_tokens, target_tokens), min(source_tokens, target_tokens)
  return longer > max_ratio * max(1, shorter)


def flatten(seqs: list[list[int]], dtype: DTypeLike) -> tuple[np.ndarray, np.ndarray]:
  """(flat ids with an EOS after each sequence, int64 [len(seqs)] lengths with the EOS)."""
  lengths = np.fromiter((len(s) + 1 for s in seqs), np.int64, len(seqs))
  flat = np.fromiter(
    itertools.chain.from_iterable(s + [EOS_ID] for s in seqs), dtype, int(lengths.sum())
  )
  return flat, lengths


def _concatenate(parts: Sequence[_Encoded], dtype: DTypeLike) -> TokenizedPairs:
  sides = []
  for side in (0, 1):
    flats, lengths = (
      zip(*[flatten(part[side], dtype) for part in parts])
      if parts
      else ([np.zeros(0, dtype)], [np.zeros(0, np.int64)])
    )
    offsets = np.concatenate([[0], np.cumsum(np.concatenate(lengths))]).astype(np.int64)
    sides += [np.concatenate(flats), offsets]
  return TokenizedPairs(*sides)
