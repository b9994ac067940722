"""Where (source, target) text pairs come from: one module per source, each registering a
`Source` (the interface and the registry are in `base`) under its `config.data.source`.

    source = sources.get_source(config.data)   # DataError for an unknown name
    splits = sources.open_splits(config.data, workdir)

Adding a source is one module here with one `base.register(...)` call, imported below.
"""

import ml_collections

from t2t_jax.data import config as config_lib
from t2t_jax.data.errors import DataError
from t2t_jax.data.sources import synthetic, textfiles, treebank, wmt  # noqa: F401 (register)
from t2t_jax.data.sources.base import (
  SPLITS,
  CorporaPairs,
  HeadPairs,
  ListPairs,
  PairSource,
  Source,
  Splits,
  find,
  get_source,
  names,
  register,
  registered,
  wait_for,
)

__all__ = [
  "SPLITS",
  "CorporaPairs",
  "HeadPairs",
  "ListPairs",
  "PairSource",
  "Source",
  "Splits",
  "find",
  "get_source",
  "head",
  "names",
  "open_splits",
  "register",
  "registered",
  "validate",
  "wait_for",
]


def validate(c: ml_collections.ConfigDict) -> Source:
  """Checks data config `c`: its source name, the generic fields, every source's fields'
  values, then the chosen source's rules; returns the source. DataError names the
  `config.data.*` flag."""
  source = get_source(c)
  config_lib.validate(c)
  for each in registered():
    each.check_values(c)
  if c.get("train_corpora") and not source.takes_train_corpora:
    raise DataError(
      f"config.data.train_corpora={c.train_corpora!r} is set, but config.data.source="
      f"{source.name!r} reads its "
      "own training data; several weighted corpora are read by the textfiles source"
    )
  source.validate(c)
  return source


def head(splits: Splits, c: ml_collections.ConfigDict) -> Splits:
  """The splits with training cut to config.data.train_max_pairs (0: all; several corpora:
  the first N pairs of each)."""
  if c.train_max_pairs:
    train = splits["train"]
    if isinstance(train, CorporaPairs):
      train = train.head(c.train_max_pairs)
    else:
      train = HeadPairs(train, c.train_max_pairs)
    splits = dict(splits, train=train)
  return splits


def open_splits(c: ml_collections.ConfigDict, workdir: str, *, process_index: int = 0) -> Splits:
  """{'train', 'dev', 'test'} -> PairSource (None where the source has no such split)."""
  return head(get_source(c).open_splits(c, workdir, process_index), c)
