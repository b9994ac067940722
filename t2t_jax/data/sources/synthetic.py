"""The `synthetic` source: transduction tasks in the spirit of tensor2tensor's algorithmic
problems.

Pairs are whitespace-separated symbol strings ("3 0 12" -> "12 0 3"), so they flow through the
same text pipeline as real corpora, tokenized by a `SymbolTokenizer` over `symbols(config)`.
Generation is deterministic from (synthetic_seed, split) and needs no files or downloads; the
pairs are generated in memory because writing a generated set to disk would only add a step.
"""

import pathlib
from collections.abc import Mapping
from typing import Any

import ml_collections
import numpy as np

from t2t_jax.data.errors import DataError
from t2t_jax.data.sources import base
from t2t_jax.data.symbols import SYMBOLS_FILE

TASKS = ("copy", "reverse", "sort", "shift", "addition")
# The fields that decide the generated pairs: a prepared store records and checks them.
FIELDS = (
  "task",
  "synthetic_num_symbols",
  "synthetic_min_len",
  "synthetic_max_len",
  "synthetic_train_size",
  "synthetic_eval_size",
  "synthetic_seed",
)
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


class Synthetic(base.Source):
  """Generated pairs; the vocabulary is the task's alphabet, known from the config alone."""

  name = "synthetic"
  vocab_file = SYMBOLS_FILE
  vocab_size_from_task = True

  def check_values(self, c: ml_collections.ConfigDict) -> None:
    if c.task not in TASKS:
      raise DataError(f"config.data.task={c.task!r} must be one of {TASKS}")
    for field in (
      "synthetic_num_symbols",
      "synthetic_min_len",
      "synthetic_max_len",
      "synthetic_train_size",
      "synthetic_eval_size",
    ):
      if c[field] < 1:
        raise DataError(f"config.data.{field}={c[field]} must be >= 1")
    if c.synthetic_seed < 0:
      raise DataError(f"config.data.synthetic_seed={c.synthetic_seed} must be >= 0")
    if not 1 <= c.synthetic_min_len <= c.synthetic_max_len:
      raise DataError(
        f"config.data.synthetic_min_len={c.synthetic_min_len} must be in "
        f"[1, synthetic_max_len={c.synthetic_max_len}]"
      )

  def validate(self, c: ml_collections.ConfigDict) -> None:
    # The shortest source ('a+b' for addition) with its EOS: longer than max_len, every
    # training pair would be dropped, found only once the data is read.
    shortest = 2 * c.synthetic_min_len + 2 if c.task == "addition" else c.synthetic_min_len + 1
    if shortest > c.max_len:
      raise DataError(
        f"config.data.synthetic_min_len={c.synthetic_min_len} and max_len={c.max_len}: the "
        f"shortest {c.task!r} source has {shortest} tokens with its EOS, so every training "
        "pair would be dropped; raise max_len or lower synthetic_min_len"
      )

  def open_splits(
    self, c: ml_collections.ConfigDict, workdir: str, process_index: int
  ) -> base.Splits:
    return {split: base.ListPairs(pairs(c, split)) for split in base.SPLITS}

  def identity(self, c: ml_collections.ConfigDict, splits: base.Splits) -> dict[str, Any]:
    return dict(name=self.name, **{field: c[field] for field in FIELDS})

  def check_identity(
    self, path: pathlib.Path, recorded: dict[str, Any], c: ml_collections.ConfigDict
  ) -> None:
    base.check_fields(path, recorded, {field: c[field] for field in FIELDS})

  def symbols(self, c: ml_collections.ConfigDict) -> list[str]:
    return symbols(c)

  def symbols_description(self, c: ml_collections.ConfigDict) -> str:
    return f"synthetic task {c.task!r}"

  def describe_test_set(self, data: Mapping[str, Any], pair: str) -> tuple[str, str]:
    return f"synthetic {data.get('task', '')}".strip(), "synthetic"


base.register(Synthetic())
