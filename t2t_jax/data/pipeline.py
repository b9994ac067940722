"""get_datasets: source -> vocabulary -> tokenize/filter -> token-budget batches per host.

By default the tokenized splits come from the prepared store (prepare.py: made once, then
memory-mapped at every start); with config.data.prepared_store=False they are tokenized into
memory at every start instead. Both give the same batches.

    datasets = get_datasets(config.data, workdir, process_index=jax.process_index(),
                            process_count=jax.process_count(),
                            num_local_devices=jax.local_device_count())
    it = datasets.train_iter()          # grain DatasetIterator: get_state()/set_state()
    batch = next(it)                    # {'inputs': int32 [devices, rows, L], 'targets': ...}
    for batch in datasets.eval_batches(): ...
    print(datasets.stats.summary())
"""

import atexit
import contextlib
import dataclasses
import logging
import time
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import grain
import ml_collections
import numpy as np

from t2t_jax.data import batching, mixture, prepare, sources, tokenized
from t2t_jax.data import config as config_lib
from t2t_jax.data import tokenizer as tokenizer_lib
from t2t_jax.data.errors import DataError
from t2t_jax.data.sources import PairSource
from t2t_jax.data.tokenized import SplitCounts, TokenizedPairs
from t2t_jax.data.tokenizer import Tokenizer


@dataclasses.dataclass
class DataStats:
  """The per-run data report. Batch figures are this process's, over the batches yielded."""

  train: SplitCounts = dataclasses.field(default_factory=SplitCounts)
  dev: SplitCounts = dataclasses.field(default_factory=SplitCounts)
  test: SplitCounts = dataclasses.field(default_factory=SplitCounts)
  batching: str = ""
  tokens_per_batch_budget: int = 0  # global, per side
  budget_per_device: int = 0  # per side
  shapes: str = ""
  batches: int = 0
  input_tokens: int = 0  # non-pad tokens yielded
  target_tokens: int = 0
  input_slots: int = 0  # array elements yielded (pad included)
  target_slots: int = 0
  setup_seconds: dict = dataclasses.field(default_factory=dict)  # stage -> wall time
  # With config.data.train_corpora, one line per corpus: its counts and expected shares.
  corpora: list = dataclasses.field(default_factory=list)

  def record(self, batch: dict[str, np.ndarray]) -> None:
    self.batches += 1
    self.input_tokens += int(np.count_nonzero(batch["inputs"]))
    self.target_tokens += int(np.count_nonzero(batch["targets"]))
    self.input_slots += batch["inputs"].size
    self.target_slots += batch["targets"].size

  @property
  def mean_input_tokens_per_batch(self) -> float:
    return self.input_tokens / max(1, self.batches)

  @property
  def mean_target_tokens_per_batch(self) -> float:
    return self.target_tokens / max(1, self.batches)

  @property
  def padding_fraction(self) -> float:
    """Share of yielded input+target elements that are padding."""
    slots = self.input_slots + self.target_slots
    return 1.0 - (self.input_tokens + self.target_tokens) / max(1, slots)

  def summary(self) -> str:
    t = self.train
    lines = [
      f"train: {t.read} pairs read, {t.empty_skipped} empty skipped, "
      f"{t.dropped_too_long} dropped by length, "
      + (f"{t.dropped_by_ratio} dropped by length ratio, " if t.dropped_by_ratio else "")
      + f"{t.kept} kept",
      *self.corpora,
      f"dev: {self.dev.read} pairs read, {self.dev.empty_skipped} empty skipped; "
      f"test: {self.test.read} pairs read, {self.test.empty_skipped} empty skipped",
      f"batching: {self.batching}, budget {self.tokens_per_batch_budget} tokens/side/step "
      f"global, {self.budget_per_device} per device; shapes {self.shapes}",
      "setup: " + ", ".join(f"{k} {v:.2f}s" for k, v in self.setup_seconds.items()),
    ]
    if self.batches:
      lines.append(
        f"over {self.batches} batches (this process): mean tokens/batch "
        f"{self.mean_input_tokens_per_batch:.1f} source + "
        f"{self.mean_target_tokens_per_batch:.1f} target, padding fraction "
        f"{self.padding_fraction:.3f}"
      )
    return "\n".join(lines)


_LIVE_ITERATORS = weakref.WeakSet()


@atexit.register
def _close_live_iterators():
  # A prefetch thread still running while the interpreter finalizes can abort the process
  # ("terminate called without an active exception"), so stop them first.
  for it in list(_LIVE_ITERATORS):
    it.close()


class TrainIterator(grain.DatasetIterator):
  """The training stream with the run's batch figures recorded; state is the parent's.

  Call `close()` (or rely on exit) to stop its background prefetch thread.
  """

  def __init__(self, parent: grain.DatasetIterator, stats: DataStats):
    super().__init__(parent)
    self._stats = stats
    _LIVE_ITERATORS.add(self)

  def __next__(self) -> dict[str, np.ndarray]:
    batch = next(self._parent)
    self._stats.record(batch)
    return batch

  def get_state(self) -> dict[str, Any]:
    return self._parent.get_state()

  def set_state(self, state: dict[str, Any]) -> None:
    self._parent.set_state(state)

  def close(self) -> None:
    super().close()
    # Drop the stopped pipeline now, while modules are alive: grain's own __del__ would
    # otherwise run during interpreter teardown and print spurious errors.
    self._parents = ()


class Datasets:
  """What the trainer and evaluators use; built by `get_datasets`."""

  def __init__(
    self,
    c: ml_collections.ConfigDict,
    tokenizer: Tokenizer,
    train: TokenizedPairs,
    dev_pairs: Sequence[tuple[str, str]],
    test_pairs: Sequence[tuple[str, str]],
    stats: DataStats,
    sharding: batching.Sharding,
    scratch_dir: str | None = None,
    corpus_counts: Sequence[SplitCounts] | None = None,
  ) -> None:
    """`scratch_dir` (a local directory, e.g. the workdir) holds the bucket plan's per-pair
    arrays of a large corpus as unnamed files, off the heap; None keeps them in memory.
    `corpus_counts` are the counts of each training corpus, whose kept pairs `train` holds
    one after the other (None: one corpus)."""
    self.config = c
    self.tokenizer = tokenizer
    self.train_pairs = train  # tokenized, filtered training pairs (all processes' data)
    self.dev_pairs = dev_pairs  # [(source_text, target_text)], empty lines skipped
    self.test_pairs = test_pairs
    self.stats = stats
    self.sharding = sharding
    self.boundaries = config_lib.bucket_boundaries(c)  # target lengths
    self.source_boundaries = config_lib.source_bucket_boundaries(c)
    self.budget_per_device = config_lib.per_device_budget(c, sharding.num_devices)
    self.corpora = mixture.corpora(c)
    self.corpus_counts = list(corpus_counts or [stats.train])
    # [slots] pair of each slot of an epoch (None: every pair once): the weighted mixture.
    self.sample = _mixture_sample(self.corpora, self.corpus_counts, len(train), c.shuffle_seed)
    if mixture.given(c):
      stats.corpora = _describe_corpora(self.corpora, self.corpus_counts, self.sample, train)
    self.bucket_plan = None
    if c.batching == "bucket":
      self.bucket_plan = batching.BucketPlan(
        train,
        self.boundaries,
        self.budget_per_device,
        sharding,
        c.shuffle_seed,
        scratch_dir=scratch_dir,
        sample=self.sample,
        source_boundaries=self.source_boundaries,
      )
    self._tokenized = {}
    self._warned = set()
    self.store_path = None  # the prepared store the arrays are mapped from, if any
    # What names the training data in a checkpoint's fingerprint (Source.train_identity).
    self.train_identity: dict[str, Any] | None = None

  @property
  def pack_rows_per_device(self) -> int:
    return self.budget_per_device // self.config.pack_len

  @property
  def steps_per_epoch(self) -> float | None:
    """Mean training steps per epoch in bucket mode; None for packing (data-dependent)."""
    if self.bucket_plan is not None:
      return self.bucket_plan.steps_per_epoch
    return None

  def train_dataset(self) -> grain.IterDataset:
    """The grain pipeline behind train_iter() (infinite, deterministic from shuffle_seed)."""
    c = self.config
    if self.bucket_plan is not None:
      return batching.bucket_dataset(self.bucket_plan, c.prefetch_batches)
    return batching.pack_dataset(
      self.train_pairs,
      c.pack_len,
      self.pack_rows_per_device,
      c.pack_bins,
      self.sharding,
      c.shuffle_seed,
      c.prefetch_batches,
      sample=self.sample,
    )

  def train_iter(self) -> TrainIterator:
    """A fresh iterator from step 0; restore a checkpoint with `.set_state(state)`."""
    return TrainIterator(iter(self.train_dataset()), self.stats)

  def eval_batches(
    self, split: str = "dev", max_len: int | None = None
  ) -> Iterator[dict[str, np.ndarray]]:
    """Every pair of `split` ('dev' | 'test') once, in static-shaped padded batches.

    With `max_len` (the model's), longer pairs are truncated to it (one warning per split):
    evaluation never drops a pair and never fails on one.
    """
    pairs = self._tokenized_split(split)
    if max_len is not None:
      pairs, cut = tokenized.truncate(pairs, max_len)
      if cut and (split, max_len) not in self._warned:
        self._warned.add((split, max_len))
        logging.warning(
          "%s: %d of %d pairs longer than the model's max_len=%d tokens truncated to it for "
          "the %s loss",
          self.split_name(split),
          cut,
          len(pairs),
          max_len,
          split,
        )
    return batching.eval_batches(
      pairs,
      self.boundaries,
      self.budget_per_device,
      self.sharding,
      pack_keys=self.config.batching == "pack",
      max_padded=max_len,
      source_boundaries=self.source_boundaries,
    )

  def split_name(self, split: str) -> str:
    """The files of a split ('dev' | 'test'), or the source and split, for messages."""
    return sources.get_source(self.config).split_name(self.config, split)

  def _tokenized_split(self, split: str) -> TokenizedPairs:
    if split not in self._tokenized:
      raw = {"dev": self.dev_pairs, "test": self.test_pairs}[split]
      self._tokenized[split] = tokenized.tokenize_pairs(raw, self.tokenizer)
    return self._tokenized[split]


def _mixture_sample(
  corpora: Sequence[mixture.Corpus], counts: Sequence[SplitCounts], num_pairs: int, seed: int
) -> np.ndarray | None:
  """The weighted multiset of an epoch (mixture.sample); DataError names a corpus that has
  no pair left, whose weight could not be honoured."""
  if len(counts) != len(corpora) or sum(k.kept for k in counts) != num_pairs:
    raise DataError(
      f"the training pairs ({num_pairs}) do not match the counts of the "
      f"{len(corpora)} configured corpora ({[k.kept for k in counts]}): the prepared data "
      "was made for another list of corpora; delete it to prepare again"
    )
  for corpus, k in zip(corpora, counts):
    if not k.kept:
      raise DataError(
        f"config.data.{corpus.flag} ({corpus.name}): no training pairs left ({k}); check "
        "its files, config.data.max_len and max_length_ratio"
      )
  return mixture.sample([k.kept for k in counts], [k.weight for k in corpora], seed)


def _describe_corpora(
  corpora: Sequence[mixture.Corpus],
  counts: Sequence[SplitCounts],
  sample: np.ndarray | None,
  train: TokenizedPairs,
) -> list[str]:
  """One summary line per corpus: its counts and its expected shares of an epoch."""
  tokens = np.asarray(train.inputs_lengths) + np.asarray(train.targets_lengths)
  pair_share, token_share = mixture.shares([k.kept for k in counts], sample, tokens)
  return [
    f"  corpus {corpus.flag} ({corpus.name}, weight {corpus.weight:g}"
    + (f", tag {corpus.tag!r}" if corpus.tag else "")
    + f"): {k.read} pairs read, {k.empty_skipped} empty skipped, {k.dropped_too_long} "
    f"dropped by length, {k.dropped_by_ratio} dropped by length ratio, {k.kept} kept; "
    f"expected share of an epoch: {100 * p:.1f}% of pairs, {100 * q:.1f}% of tokens"
    for corpus, k, p, q in zip(corpora, counts, pair_share, token_share)
  ]


def get_datasets(
  data_config: ml_collections.ConfigDict,
  workdir: str,
  *,
  process_index: int = 0,
  process_count: int = 1,
  num_local_devices: int = 1,
) -> Datasets:
  """Builds the data of one run (see the module docstring). Bad input raises DataError."""
  c = data_config
  sources.validate(c)
  sharding = batching.Sharding(process_index, process_count, num_local_devices)
  config_lib.per_device_budget(c, sharding.num_devices)  # fail before any expensive work
  stats = DataStats(batching=c.batching, tokens_per_batch_budget=c.tokens_per_batch)
  if c.prepared_store:
    return _from_store(c, workdir, sharding, stats)
  with _timed(stats, "open/prepare source"):
    source = sources.get_source(c)
    whole = source.open_splits(c, workdir, process_index)
    # Named before train_max_pairs cuts it, as the store's manifest names it.
    train_identity = source.train_identity(c, source.identity(c, whole))
    splits = sources.head(whole, c)
  with _timed(stats, "vocabulary"):
    tokenizer = tokenizer_lib.load_or_train_tokenizer(
      c,
      workdir,
      process_index=process_index,
      train_sentences=lambda: tokenizer_lib.sample_sentences(
        splits["train"], c.vocab_max_sentences, c.vocab_seed
      ),
    )
  with _timed(stats, "read+tokenize train"):
    train, stats.train, corpus_counts = tokenized.tokenize_source(
      splits["train"],
      tokenizer,
      max_len=c.max_len,
      max_ratio=c.max_length_ratio,
      tag_ids=tokenizer_lib.tag_ids(tokenizer, c),
    )
  if not len(train):
    raise DataError(
      f"no training pairs left ({stats.train}); check the training files and config.data.max_len"
    )
  with _timed(stats, "read dev+test"):
    dev_pairs = _read_all(splits["dev"], stats.dev)
    test_pairs = _read_all(splits["test"], stats.test)
  data = Datasets(
    c,
    tokenizer,
    train,
    dev_pairs,
    test_pairs,
    stats,
    sharding,
    _scratch_dir(workdir),
    corpus_counts,
  )
  data.train_identity = train_identity
  return _finish(data)


def _scratch_dir(workdir: str) -> str | None:
  """The workdir when it is a local path, for the bucket plan's scratch files; None for a
  remote one (gs://...)."""
  if not workdir or "://" in workdir:
    return None
  return workdir


def _from_store(
  c: ml_collections.ConfigDict, workdir: str, sharding: batching.Sharding, stats: DataStats
) -> Datasets:
  """The run's data from its prepared store (prepared first if absent): nothing is tokenized
  when the store exists, and the arrays are memory-mapped."""
  with _timed(stats, "open (or prepare) the store"):
    store = prepare.ensure_store(c, workdir, process_index=sharding.process_index)
  for split in ("train", "dev", "test"):
    setattr(stats, split, store.counts(split))
  data = Datasets(
    c,
    store.tokenizer,
    store.pairs("train"),
    store.text_pairs("dev"),
    store.text_pairs("test"),
    stats,
    sharding,
    _scratch_dir(workdir),
    store.corpus_counts(),
  )
  data.store_path = store.path
  # The manifest's identity was checked against the configured files: no file is hashed.
  data.train_identity = sources.get_source(c).train_identity(c, store.manifest["source"])
  data._tokenized = {split: store.pairs(split) for split in ("dev", "test")}
  return _finish(data)


def _finish(data: Datasets) -> Datasets:
  data.stats.budget_per_device = data.budget_per_device
  data.stats.shapes = _describe_shapes(data)
  logging.info("Data:\n%s", data.stats.summary())
  return data


@contextlib.contextmanager
def _timed(stats: DataStats, stage: str) -> Iterator[None]:
  start = time.perf_counter()
  yield
  stats.setup_seconds[stage] = time.perf_counter() - start


def _read_all(source: PairSource | None, counts: SplitCounts) -> list[tuple[str, str]]:
  if source is None:
    return []
  pairs = tokenized.non_empty(source.read(range(len(source))), counts)
  counts.kept = len(pairs)
  return pairs


def _describe_shapes(data: Datasets) -> str:
  d = data.sharding.num_local_devices
  if data.bucket_plan is not None:
    plan = data.bucket_plan
    return " ".join(
      f"[{d},{r},{n}]" if s == n else f"[{d},{r},{s}/{n}]"  # source/target lengths
      for (_, r, n), (_, _, s) in zip(plan.shapes(), plan.shapes("inputs"))
    )
  return f"[{d},{data.pack_rows_per_device},{data.config.pack_len}]"
