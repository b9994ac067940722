"""How the Translator batches sentences: sorted by length, cut into batches of about
batch_tokens, padded to few shapes (rows to powers of two or to a `Shapes` ladder, sources
to length buckets, outputs to powers of two) so that few programs compile."""

import dataclasses
from collections.abc import Iterator, Sequence

import numpy as np
from absl import logging

from t2t_jax.decoding.model_view import FIRST_SEGMENT
from t2t_jax.decoding.stages import power_of_two_at_least
from t2t_jax.tokens import PAD_ID


def source_buckets(max_len: int) -> list[int]:
  """Padded source lengths of translate()'s batches: 16, 24, 32, 48, 64, 96, ... (powers of
  two and 1.5 times them) up to max_len. A batch is padded by at most half, so the encoder
  and cross-attention do little wasted work, while batches of nearby lengths share a shape
  (and their compiled stages) as multiples of 8 did not."""
  out = [16]
  while out[-1] < max_len:
    is_power_of_two = (out[-1] & (out[-1] - 1)) == 0
    out.append(out[-1] * 3 // 2 if is_power_of_two else out[-1] * 4 // 3)
  return [min(b, max_len) for b in out]


@dataclasses.dataclass(frozen=True)
class Shapes:
  """The padded shapes translate() gives its batches, each shape its own programs.

  rows: the row counts a batch may have, ascending: n sentences are padded to the smallest
  that holds n, the largest bounds a batch, and a batch followed by more sentences holds
  the largest count that its run fills (None: powers of two, max_rows bounding them).
  buckets: the padded source lengths (None: `source_buckets(max_len)`).
  memory: the source positions every batch's encoder keys/values are padded to from its
  first step (None: its own; compacted batches the call's longest bucket), so that every
  program after a search's first stage is shared by all source buckets.
  A server fixes all three to a few values whose programs it compiles before it is ready
  (serve.worker): padding a batch of 3 to 8 rows costs less than the seconds compiling a
  4-row shape would.
  """

  rows: tuple[int, ...] | None = None
  buckets: tuple[int, ...] | None = None
  memory: int | None = None

  def __post_init__(self) -> None:
    for name in ("rows", "buckets"):
      values = getattr(self, name)
      if values is not None and (
        not values or any(v < 1 for v in values) or list(values) != sorted(set(values))
      ):
        raise ValueError(f"Shapes.{name}={values!r}: positive integers, ascending, none twice")

  def source_buckets(self, max_len: int) -> list[int]:
    """The padded source lengths within max_len; the last is max_len itself, so that every
    source fits one."""
    given = source_buckets(max_len) if self.buckets is None else self.buckets
    return sorted({min(b, max_len) for b in given} | {max_len})

  def padded_rows(self, n: int) -> int:
    """Rows of a batch of n sentences."""
    if self.rows is None:
      return 1 << (n - 1).bit_length()
    return next((r for r in self.rows if r >= n), n)

  def largest_rows(self, max_rows: int | None) -> int | None:
    """Sentences per batch at most: max_rows and the largest row count (None: no bound)."""
    bounds = [b for b in (max_rows, self.rows[-1] if self.rows else None) if b is not None]
    return min(bounds) if bounds else None

  def full_rows(self, n: int) -> int:
    """The sentences a batch of a longer run takes when n fit: the largest row count at
    most n (a power of two without `rows`), so that it needs no padding rows."""
    if self.rows is None:
      return 1 << (n.bit_length() - 1)
    return max((r for r in self.rows if r <= n), default=n)


DEFAULT_SHAPES = Shapes()


def source_bucket(max_len: int, source_len: int, buckets: Sequence[int] | None = None) -> int:
  """The smallest of `buckets` (default: `source_buckets(max_len)`) that holds
  `source_len` tokens."""
  return next(b for b in (buckets or source_buckets(max_len)) if b >= source_len)


def _round_up(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple


def stream_buckets(max_len: int) -> list[int]:
  """Padded source lengths of streaming translation: 16, 32, 64, ... up to max_len."""
  out: list[int] = []
  while not out or out[-1] < max_len:
    out.append(min(16 << len(out), max_len))
  return out


def bucket_shape(
  max_len: int, source_len: int, max_output_extra: int, buckets: Sequence[int] | None = None
) -> tuple[int, int]:
  """(padded source length, static output length) of a batch whose longest source has
  `source_len` tokens: the smallest of `buckets` (default: `source_buckets`) at least
  `source_len`, and the power of two (from 16) at least that + max_output_extra, both
  within max_len. Batches of one bucket have one shape and share their compiled stages;
  each output's own limit stays its source + extra."""
  bucket = source_bucket(max_len, source_len, buckets)
  longest = power_of_two_at_least(max(bucket + max_output_extra, FIRST_SEGMENT))
  return bucket, min(longest, max_len)


def batches(
  order: Sequence[int],
  sources: Sequence[Sequence[int]],
  batch_tokens: int,
  max_rows: int | None = None,
  shapes: Shapes = DEFAULT_SHAPES,
) -> Iterator[list[int]]:
  """Consecutive runs of `order` within batch_tokens (rows x longest source) and max_rows
  sentences (None: no bound) and the largest of `shapes.rows`. Every batch but the last
  holds a power of two of sentences, or one of `shapes.rows` (the rest start the next
  batch), so that `padded_batch` adds no padding rows to it."""
  max_rows = shapes.largest_rows(max_rows)
  start = 0
  while start < len(order):
    n, longest = 0, 0
    while start + n < len(order) and (max_rows is None or n < max_rows):
      longer = max(longest, len(sources[order[start + n]]))
      if n and (n + 1) * longer > batch_tokens:
        break
      n, longest = n + 1, longer
    if start + n < len(order):
      n = shapes.full_rows(n)
    yield list(order[start : start + n])
    start += n


def batch_shapes(
  max_len: int,
  batch_tokens: int,
  max_output_extra: int,
  max_rows: int | None = None,
  shapes: Shapes = DEFAULT_SHAPES,
) -> list[tuple[int, int, int]]:
  """Every (rows, padded source length, max_decode_len) that `padded_batch` can give a batch
  of `batches` without prefixes. A batch padded to bucket B has its longest source longer
  than the bucket below (A), so at most max(1, batch_tokens // (A + 1)) sentences, capped
  by max_rows and `shapes.rows`, and its rows are each row count up to that count's
  (`Shapes.padded_rows`)."""
  out, below = [], 0
  buckets = shapes.source_buckets(max_len)
  max_rows = shapes.largest_rows(max_rows)
  for bucket in buckets:
    count = max(1, batch_tokens // (below + 1))
    if max_rows is not None:
      count = min(count, max_rows)
    _, max_decode_len = bucket_shape(max_len, bucket, max_output_extra, buckets)
    top = shapes.padded_rows(count)
    ladder = shapes.rows or [1 << k for k in range(top.bit_length())]
    out += [(r, bucket, max_decode_len) for r in ladder if r <= top]
    below = bucket
  return out


def padded_batch(
  max_len: int,
  sources: Sequence[Sequence[int]],
  extra: int,
  shape: tuple[int, int] | None,
  prefixes: Sequence[Sequence[int]] | None = None,
  shapes: Shapes = DEFAULT_SHAPES,
) -> tuple[np.ndarray, np.ndarray, int, np.ndarray | None]:
  """(inputs, limits, max_decode_len, prefix) of one batch: rows rounded up to a power of
  two (or `shapes.rows`), the source length to its bucket (of `shapes`) and the output
  length to the bucket's (`bucket_shape`: few distinct shapes, few compilations), unless
  `shape` fixes (source length, max_decode_len). A limit is at least its prefix's length
  + 1, which may lengthen max_decode_len to the next power of two; prefix: int32
  [rows, P] PAD-padded, or None when no sentence has one."""
  buckets = shapes.source_buckets(max_len)
  src_len, max_decode_len = shape or bucket_shape(max_len, max(map(len, sources)), extra, buckets)
  rows = shapes.padded_rows(len(sources))
  inputs = np.full((rows, src_len), PAD_ID, np.int32)
  for r, s in enumerate(sources):
    inputs[r, : len(s)] = s
  limits = np.array([len(s) + extra for s in sources] + [1] * (rows - len(sources)), np.int32)
  prefix = None
  if prefixes is not None and any(prefixes):
    prefix = np.full((rows, _round_up(max(map(len, prefixes)), 8)), PAD_ID, np.int32)
    for r, p in enumerate(prefixes):
      prefix[r, : len(p)] = p
      limits[r] = max(limits[r], len(p) + 1)
  if limits.max() > max_len:
    logging.warning(
      "output length limited to the model's max_len=%d (source length + %d exceeds it)",
      max_len,
      extra,
    )
  limits = np.minimum(limits, max_len)
  if shape is None and limits.max() > max_decode_len:  # a long prefix
    max_decode_len = min(power_of_two_at_least(int(limits.max())), max_len)
  return inputs, limits, max_decode_len, prefix
