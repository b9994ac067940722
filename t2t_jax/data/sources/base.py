"""What the pipeline asks of a corpus source, and the registry of sources by config name.

A source turns a data config into (source_text, target_text) pairs per split and says how it
is named in a prepared store, how its vocabulary is built and how its fields are checked.
Each source lives in one module of this package and registers one `Source` object under the
string of `config.data.source`; the pipeline, the store, the tokenizer, the trainer and the
pictures look the object up with `get_source(config.data)` instead of comparing names.
"""

import abc
import logging
import pathlib
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Protocol

import ml_collections
import numpy as np

from t2t_jax.data.errors import DataError

SPLITS = ("train", "dev", "test")
SENTENCEPIECE_FILE = "vocab.model"


class PairSource(Protocol):
  """Random access to the (source_text, target_text) pairs of one split."""

  def __len__(self) -> int: ...

  def read(self, indices: Sequence[int]) -> list[tuple[str, str]]: ...


# {'train', 'dev', 'test'} -> the split's pairs, None where the source has no such split.
Splits = dict[str, PairSource | None]


class ListPairs:
  """Pairs held in memory (generated or parsed corpora)."""

  def __init__(self, pairs: list[tuple[str, str]]):
    self._pairs = pairs

  def __len__(self) -> int:
    return len(self._pairs)

  def read(self, indices: Sequence[int]) -> list[tuple[str, str]]:
    return [self._pairs[i] for i in indices]


class HeadPairs:
  """The first `n` pairs of another source (config.data.train_max_pairs)."""

  def __init__(self, source: PairSource, n: int):
    self._source = source
    self._n = min(n, len(source))

  def __len__(self) -> int:
    return self._n

  def read(self, indices: Sequence[int]) -> list[tuple[str, str]]:
    return self._source.read(indices)


class CorporaPairs:
  """The training pairs of several corpora, one after the other: `parts` holds each
  corpus (a `mixture.Corpus`) with its pairs, so tokenization can tag and count each."""

  def __init__(self, parts: Sequence[tuple[Any, PairSource]]):
    self.parts = list(parts)
    self._starts = np.cumsum([0] + [len(pairs) for _, pairs in self.parts])

  def __len__(self) -> int:
    return int(self._starts[-1])

  def read(self, indices: Sequence[int]) -> list[tuple[str, str]]:
    indices = np.asarray(indices, np.int64)
    part = np.searchsorted(self._starts, indices, side="right") - 1
    out = [None] * len(indices)
    for k in np.unique(part):
      where = np.flatnonzero(part == k)
      pairs = self.parts[k][1].read((indices[where] - self._starts[k]).tolist())
      for i, pair in zip(where, pairs):
        out[i] = pair
    return out

  def head(self, n: int) -> "CorporaPairs":
    """The first `n` pairs of EACH corpus (config.data.train_max_pairs)."""
    return CorporaPairs([(corpus, HeadPairs(pairs, n)) for corpus, pairs in self.parts])


class Source(abc.ABC):
  """One kind of corpus, registered under its `config.data.source` string.

  Class attributes answer the yes/no questions of the callers: `vocab_file` is the name of
  the stored vocabulary (its suffix picks the tokenizer kind), `vocab_size_from_task` says
  that the config alone fixes the vocabulary size (the benchmark needs no data for it),
  `needs_download` that opening it may fetch archives, `scores_trees` that its dev and
  test sets are scored by bracket F1 rather than BLEU, and `takes_train_corpora` that it
  reads config.data.train_corpora (its training split is then a `CorporaPairs`).
  """

  name: str
  vocab_file: ClassVar[str] = SENTENCEPIECE_FILE
  vocab_size_from_task: ClassVar[bool] = False
  needs_download: ClassVar[bool] = False
  scores_trees: ClassVar[bool] = False
  takes_train_corpora: ClassVar[bool] = False

  def check_values(self, c: ml_collections.ConfigDict) -> None:  # noqa: B027 (optional)
    """Raises DataError naming the `config.data.*` flag of one of this source's own fields
    whose value no config could use (an unknown task, a range that runs backwards). Called
    for every registered source, chosen or not, so that such a value is refused whatever
    config.data.source is."""

  def validate(self, c: ml_collections.ConfigDict) -> None:  # noqa: B027 (optional)
    """Raises DataError naming the `config.data.*` flag of a bad source field, when this
    is the chosen source (a field it needs and the config lacks, fields that disagree)."""

  def check_inputs(self, c: ml_collections.ConfigDict) -> None:  # noqa: B027 (optional)
    """Raises DataError for a local input that is missing, unreadable or misaligned, before
    anything is written (a workdir, a lock, a store); sources that download check nothing."""

  @abc.abstractmethod
  def open_splits(self, c: ml_collections.ConfigDict, workdir: str, process_index: int) -> Splits:
    """Every split, ready to read (downloading or preparing first where needed: process 0
    does it, the others wait for it); train_max_pairs is applied by the caller."""

  @abc.abstractmethod
  def identity(self, c: ml_collections.ConfigDict, splits: Splits) -> dict[str, Any]:
    """What names the corpus in a prepared store's manifest ('name' included), from the
    splits `open_for_store` opened."""

  @abc.abstractmethod
  def check_identity(
    self, path: pathlib.Path, recorded: dict[str, Any], c: ml_collections.ConfigDict
  ) -> None:
    """Raises DataError naming the first field where the store at `path`, made from the
    corpus `recorded` names, differs from config `c` (the names already agree)."""

  def train_identity(
    self, c: ml_collections.ConfigDict, identity: dict[str, Any]
  ) -> dict[str, Any]:
    """What names the TRAINING data in a checkpoint's fingerprint, from `identity` (as
    `identity` gives it, or a checked store's manifest recorded it): content, never paths,
    so a moved copy resumes and an edited corpus is refused; dev and test are left out,
    since they change what is measured, not what is trained."""
    return dict(identity)

  def open_for_store(
    self, c: ml_collections.ConfigDict, workdir: str
  ) -> tuple[Splits, dict[str, Any]]:
    """(splits, identity) for preparing the store; a source may read its files differently
    here (in place, in chunks) as long as the pairs are the same as `open_splits` gives."""
    splits = self.open_splits(c, workdir, 0)
    return splits, self.identity(c, splits)

  def symbols(self, c: ml_collections.ConfigDict) -> list[str] | None:
    """The symbol vocabulary, in id order; None: a SentencePiece model is trained instead."""
    return None

  def symbols_description(self, c: ml_collections.ConfigDict) -> str:
    """What the symbols of `symbols(c)` belong to, for the message of a stale vocabulary."""
    return f"this {self.name} config"

  def split_name(self, c: ml_collections.ConfigDict, split: str) -> str:
    """The split ('dev' | 'test') as messages name it."""
    return f"{self.name} {split} split"

  def describe_test_set(self, data: Mapping[str, Any], pair: str) -> tuple[str, str] | None:
    """(test set name, language pair) for the BLEU chart, from the `data` section of a
    run's config.json; None when the source has no name for it."""
    return None


_REGISTRY: dict[str, Source] = {}


def register(source: Source) -> Source:
  """Makes `source` the one chosen by `config.data.source=<source.name>`."""
  if source.name in _REGISTRY:
    raise ValueError(f"a data source named {source.name!r} is already registered")
  _REGISTRY[source.name] = source
  return source


def registered() -> tuple[Source, ...]:
  """Every registered source, in the order of their names."""
  return tuple(_REGISTRY[name] for name in names())


def names() -> tuple[str, ...]:
  """The registered source strings, sorted."""
  return tuple(sorted(_REGISTRY))


def find(name: str) -> Source | None:
  """The source registered as `name`, or None (a run's config from elsewhere)."""
  return _REGISTRY.get(name)


def get_source(c: Mapping[str, Any] | ml_collections.ConfigDict) -> Source:
  """The source of data config `c`; DataError names the flag and the known sources."""
  name = c.get("source", "")
  source = find(name)
  if source is None:
    raise DataError(
      f"config.data.source={name!r} is not a known data source: set "
      f"--config.data.source to one of {', '.join(names())}"
    )
  return source


def prepare_once(
  ready: Callable[[], bool],
  make: Callable[[], None],
  what: str,
  process_index: int,
  timeout_s: float,
) -> None:
  """Process 0 makes what is not ready yet; the others wait for it (shared directories)."""
  if ready():
    return
  if process_index == 0:
    make()
    return
  wait_for(ready, what, timeout_s)


def wait_for(ready: Callable[[], bool], what: str, timeout_s: float) -> None:
  """Polls `ready()` until true; raises DataError after `timeout_s`."""
  deadline = time.monotonic() + timeout_s
  logging.info("Waiting for process 0 to write %s", what)
  while not ready():
    if time.monotonic() > deadline:
      raise DataError(
        f"gave up after {timeout_s}s waiting for process 0 to write {what}; "
        "the workdir (or config.data.data_dir) and tfds_data_dir must be shared by all "
        "processes"
      )
    time.sleep(1.0)


def store_mismatch(path: pathlib.Path, field: str, recorded: Any, current: Any) -> DataError:
  """The refusal of a prepared store made for another value of `config.data.<field>`."""
  return DataError(
    f"{path}: prepared for config.data.{field}={recorded!r}, but this run has "
    f"{current!r}; set that value, point config.data.data_dir elsewhere, or delete {path} "
    "to prepare the data again"
  )


def check_fields(
  path: pathlib.Path, recorded: Mapping[str, Any], current: Mapping[str, Any]
) -> None:
  """Raises `store_mismatch` for the first field of `current` whose recorded value differs."""
  for field, value in current.items():
    if recorded.get(field) != value:
      raise store_mismatch(path, field, recorded.get(field), value)
