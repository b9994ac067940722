"""Synthetic transduction tasks, in the spirit of tensor2tensor's algorithmic problems.

Pairs are whitespace-separated symbol strings ("3 0 12" -> "12 0 3"), so they flow through the
same text pipeline as real corpora, tokenized by a `SymbolTokenizer` over `symbols(config)`.
Generation is deterministic from (synthetic_seed, split) and needs no files or downloads.
"""

import ml_collections
import numpy as np

_SPLIT_STREAMS = {"train": 0, "dev": 1, "test": 2}


def symbols(c: ml_collections.ConfigDict) -> list[str]:
  """The task's alphabet, in vocabulary order."""
  if c.task == "addition":
    return [str(d) for d in range(10)] + ["+"]
  return [str(i) for i in range(c.synthetic_num_symbols)]


def _target(task: str, x: np.ndarray, num_symbols: int) -> np.ndarray:
  if task == "copy":
    return x
  if task == "reverse":
    return x[::-1]
  if task == "sort":
    return np.sort(x)
  if task == "shift":
    return (x + 1) % num_symbols
  raise ValueError(f"unknown synthetic task {task!r}")


def _addition_pair(rng: np.random.Generator, lo: int, hi: int) -> tuple[str, str]:
  a, b = (_random_number(rng, int(rng.integers(lo, hi + 1))) for _ in range(2))
  return " ".join(str(a) + "+" + str(b)), " ".join(str(a + b))


def _random_number(rng: np.random.Generator, digits: int) -> int:
  first = int(rng.integers(1, 10))  # no leading zero: the number has exactly `digits` digits
  rest = rng.integers(0, 10, digits - 1)
  return int("".join([str(first)] + [str(d) for d in rest]))


def pairs(c: ml_collections.ConfigDict, split: str) -> list[tuple[str, str]]:
  """Returns the (source, target) text pairs of `split` ('train' | 'dev' | 'test')."""
  size = c.synthetic_train_size if split == "train" else c.synthetic_eval_size
  rng = np.random.default_rng([c.synthetic_seed, _SPLIT_STREAMS[split]])
  lo, hi = c.synthetic_min_len, c.synthetic_max_len
  if c.task == "addition":
    return [_addition_pair(rng, lo, hi) for _ in range(size)]
  out = []
  for length in rng.integers(lo, hi + 1, size):
    x = rng.integers(0, c.synthetic_num_symbols, length)
    y = _target(c.task, x, c.synthetic_num_symbols)
    out.append((" ".join(map(str, x)), " ".join(map(str, y))))
  return out
