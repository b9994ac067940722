"""Token-budget batches with static shapes: length buckets, or packing with segment ids.

Layout of every batch: a dict of int32 arrays shaped [num_local_devices, rows_per_device, L],
ready for pmap. 'inputs'/'targets' end each pair with EOS and are 0-padded; packing adds
'{inputs,targets}_segmentation' (1, 2, ... per packed pair, 0 on pad) and
'{inputs,targets}_position' (0-based within each pair, 0 on pad).

Multi-host: bucket batches come from one GLOBAL plan that every process computes identically
(same data, seed and vocabulary), each taking its own rows, so all processes run the same
bucket shape at every step, and their rows are disjoint parts of one global batch. Packed rows
have one fixed shape, so each process simply packs its own shard of the pairs.
"""

import collections
import logging
import mmap
import os
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence

import grain
import numpy as np
import numpy.typing as npt

from t2t_jax.data.tokenized import TokenizedPairs

PACK_KEYS = ("inputs_segmentation", "targets_segmentation", "inputs_position", "targets_position")


class Sharding:
  """Which slice of the global batch this process feeds, and how many devices it has."""

  def __init__(self, process_index: int, process_count: int, num_local_devices: int):
    if not 0 <= process_index < process_count:
      raise ValueError(f"process_index={process_index} not in [0, {process_count})")
    self.process_index = process_index
    self.process_count = process_count
    self.num_local_devices = num_local_devices

  @property
  def num_devices(self) -> int:
    return self.process_count * self.num_local_devices


def _rows(pairs: TokenizedPairs, members: np.ndarray, length: int, side: str) -> np.ndarray:
  """int32 [len(members), length], one pair per row, 0-padded; member -1 is an all-pad row."""
  out = np.zeros((len(members), length), np.int32)
  flat, offsets = getattr(pairs, f"{side}_flat"), getattr(pairs, f"{side}_offsets")
  for row, i in enumerate(members):
    if i >= 0:
      out[row, : offsets[i + 1] - offsets[i]] = flat[offsets[i] : offsets[i + 1]]
  return out


def _device_layout(batch: dict[str, np.ndarray], num_devices: int) -> dict[str, np.ndarray]:
  """[rows, L] -> [num_devices, rows // num_devices, L], int32."""
  return {k: v.astype(np.int32).reshape(num_devices, -1, v.shape[-1]) for k, v in batch.items()}


def _add_single_pair_segments(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """Packing-layout keys for rows holding one pair each (segment 1, positions 0..n-1)."""
  for side in ("inputs", "targets"):
    real = batch[side] > 0
    batch[f"{side}_segmentation"] = real.astype(np.int32)
    batch[f"{side}_position"] = np.where(real, np.arange(real.shape[-1]), 0).astype(np.int32)
  return batch


def _global_rows(rows_per_device: int, sharding: Sharding) -> int:
  return rows_per_device * sharding.num_devices


def _host_slice(members: np.ndarray, sharding: Sharding) -> np.ndarray:
  per_host = len(members) // sharding.process_count
  return members[sharding.process_index * per_host : (sharding.process_index + 1) * per_host]


SCRATCH_MIN_PAIRS = 1 << 20  # corpora this large keep their per-pair plan arrays on disk
CHUNK_PAIRS = 1 << 18  # pairs per step of the chunked passes (their temporaries are O(chunk))


class Scratch:
  """Allocates the plan's per-pair arrays: on the heap, or in unnamed files under a directory.

  A file-backed array is a shared mapping of a file that has no name (O_TMPFILE, or unlinked at
  once), so its pages are page cache that the kernel writes back under pressure rather than
  anonymous memory, and the file disappears when the array is freed or the process ends,
  however it ends; processes sharing the directory never see each other's files.
  """

  def __init__(self, directory: str | None = None) -> None:
    self.directory = directory

  def empty(self, n: int, dtype: npt.DTypeLike) -> np.ndarray:
    """An uninitialised [n] array of `dtype`; on the heap when the directory has no room."""
    if self.directory is None:
      return np.empty(n, dtype)
    size = max(1, n * np.dtype(dtype).itemsize)
    os.makedirs(self.directory, exist_ok=True)
    with tempfile.TemporaryFile(dir=self.directory) as f:
      try:  # reserve the blocks: writing a mapped page of a full disk would kill with SIGBUS
        os.posix_fallocate(f.fileno(), 0, size)
      except OSError as e:
        logging.warning(
          "bucket plan: no room for %d bytes of scratch in %s (%s); kept in memory",
          size,
          self.directory,
          e,
        )
        return np.empty(n, dtype)
      buffer = mmap.mmap(f.fileno(), size)  # keeps its own handle on the file
    return np.frombuffer(buffer, dtype, count=n)

  @staticmethod
  def release(array: np.ndarray) -> None:
    """Drops a file-backed array's pages from this process's resident set (the data stays
    in the file and is read back on access); a heap array is left as it is."""
    base = array.base
    if isinstance(base, memoryview) and isinstance(base.obj, mmap.mmap):
      base.obj.madvise(mmap.MADV_DONTNEED)


def bucket_of(
  pairs: TokenizedPairs,
  boundaries: np.ndarray,
  chunk: int = CHUNK_PAIRS,
  scratch: Scratch | None = None,
  sample: np.ndarray | None = None,
  source_boundaries: np.ndarray | None = None,
) -> np.ndarray:
  """[pairs] index of each pair's bucket: the first bucket whose target length (`boundaries`)
  and source length (`source_boundaries`, default the same) both hold the pair's sides (EOS
  included); with `sample` ([slots] pair indices), [slots] the bucket of each slot's pair.
  Read in chunks, so a memory-mapped corpus is not copied whole."""
  if source_boundaries is None:
    source_boundaries = boundaries
  dtype = np.uint8 if len(boundaries) <= 256 else np.int32
  n = len(pairs) if sample is None else len(sample)
  out = (scratch or Scratch()).empty(n, dtype)
  for start in range(0, n, chunk):
    stop = min(start + chunk, n)
    if sample is None:
      inputs = np.diff(pairs.inputs_offsets[start : stop + 1])
      targets = np.diff(pairs.targets_offsets[start : stop + 1])
    else:
      ids = np.asarray(sample[start:stop], np.int64)
      inputs = pairs.inputs_offsets[ids + 1] - pairs.inputs_offsets[ids]
      targets = pairs.targets_offsets[ids + 1] - pairs.targets_offsets[ids]
    # Both boundary lists grow, so the first bucket holding both sides is the later of the
    # first holding each.
    out[start:stop] = np.maximum(
      np.searchsorted(source_boundaries, inputs), np.searchsorted(boundaries, targets)
    )
  return out


def bucket_counts(bucket: np.ndarray, num_buckets: int, chunk: int = CHUNK_PAIRS) -> np.ndarray:
  """int64 [num_buckets] pairs per bucket (bincount in chunks: it widens its input to intp)."""
  counts = np.zeros(num_buckets, np.int64)
  for start in range(0, len(bucket), chunk):
    counts += np.bincount(bucket[start : start + chunk], minlength=num_buckets)
  return counts


def shuffled_range(
  n: int,
  seed: int,
  epoch: int,
  dtype: npt.DTypeLike,
  scratch: Scratch,
  chunk: int = CHUNK_PAIRS,
) -> np.ndarray:
  """[n] `np.random.default_rng([seed, epoch]).permutation(n)`, built in place in an array of
  `dtype` from `scratch`: permutation(n) is Generator.shuffle of arange(n), whose draws do not
  depend on the element type."""
  order = scratch.empty(n, dtype)
  for start in range(0, n, chunk):
    stop = min(start + chunk, n)
    order[start:stop] = np.arange(start, stop, dtype=dtype)
  np.random.default_rng([seed, epoch]).shuffle(order)
  return order


def group_by_bucket(
  order: np.ndarray,
  bucket: np.ndarray,
  counts: np.ndarray,
  scratch: Scratch,
  with_positions: bool,
  chunk: int = CHUNK_PAIRS,
) -> tuple[np.ndarray, np.ndarray | None]:
  """(members, positions), each [pairs] like `order`, grouped by bucket: bucket b's pairs in
  the order they appear in `order`, and those appearances' indices (None unless
  `with_positions`). A stable counting sort: the bucket sizes are known, so `order` is walked
  chunk by chunk and each pair goes to its bucket's next free slot; equal to
  `positions = argsort(bucket[order], kind='stable'); members = order[positions]`."""
  members = scratch.empty(len(order), order.dtype)
  positions = scratch.empty(len(order), order.dtype) if with_positions else None
  free = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)  # next slot per bucket
  for start in range(0, len(order), chunk):
    ids = np.asarray(order[start : start + chunk])
    b = bucket[ids]
    within = np.argsort(b, kind="stable")
    sorted_b = b[within]
    here = np.bincount(b, minlength=len(counts))
    first = np.cumsum(here) - here  # where each bucket starts in the sorted chunk
    dest = free[sorted_b] + (np.arange(len(ids)) - first[sorted_b])
    members[dest] = ids[within]
    if positions is not None:
      positions[dest] = start + within
    free += here
  return members, positions


class BucketPlan:
  """The global order of training batches: step -> (bucket, pair indices).

  Each epoch k shuffles all pairs with (seed, k) and streams them into their length buckets;
  a bucket emits a batch whenever it has collected its rows, as a streaming bucketer would, so
  lengths interleave and no batch is partial. Bucket b therefore sees the endless sequence
  "epoch 0's members of b in shuffled order, then epoch 1's, ..." cut into batches of r_b rows;
  a batch that straddles an epoch end takes its first rows from the old epoch. Everything is
  computed from counts and per-epoch permutations, so any step is random-access and the
  iterator state is just the next step.

  Memory: the per-pair arrays (each pair's bucket, an epoch's order) are computed in chunks
  of `chunk` pairs and, when the corpus has at least `scratch_min_pairs` pairs (default
  SCRATCH_MIN_PAIRS), live in unnamed scratch files under `scratch_dir`, so the heap does
  not grow with the corpus; smaller corpora, or no `scratch_dir`, keep them on the heap.
  Both give the same batches.

  With `sample` ([slots] pair indices: a weighted mixture of corpora, data.mixture), the plan
  runs over the slots instead of the pairs, each epoch being the same multiset of pairs, and
  a batch's rows are the slots' pairs; the state is still just the next step, which fixes
  every corpus's position.
  """

  def __init__(
    self,
    pairs: TokenizedPairs,
    boundaries: Sequence[int],
    budget_per_device: int,
    sharding: Sharding,
    seed: int,
    scratch_dir: str | None = None,
    scratch_min_pairs: int | None = None,
    chunk: int = CHUNK_PAIRS,
    sample: np.ndarray | None = None,
    source_boundaries: Sequence[int] | None = None,
  ) -> None:
    self.pairs = pairs
    self.sample = sample
    slots = len(pairs) if sample is None else len(sample)
    self.boundaries = np.asarray(boundaries)  # each bucket's target length
    # Each bucket's source length (parsing's targets are ~3x their sources); default the same.
    self.source_boundaries = np.asarray(
      boundaries if source_boundaries is None else source_boundaries
    )
    if self.source_boundaries.shape != self.boundaries.shape:
      raise ValueError(
        f"{len(self.source_boundaries)} source bucket lengths for {len(self.boundaries)} buckets"
      )
    self.sharding = sharding
    self.seed = seed
    self.chunk = chunk
    if scratch_min_pairs is None:
      scratch_min_pairs = SCRATCH_MIN_PAIRS
    on_disk = scratch_dir is not None and slots >= scratch_min_pairs
    self.scratch = Scratch(scratch_dir if on_disk else None)
    self.bucket_of = bucket_of(  # [slots]
      pairs, self.boundaries, chunk, self.scratch, sample, self.source_boundaries
    )
    self.counts = bucket_counts(self.bucket_of, len(self.boundaries), chunk)
    Scratch.release(self.bucket_of)
    self._starts = np.concatenate([[0], np.cumsum(self.counts)])
    # The budget is per side: the longer padded side sets the rows.
    self.rows_per_device = budget_per_device // np.maximum(self.boundaries, self.source_boundaries)
    self.global_rows = self.rows_per_device * sharding.num_devices
    # A slot index per slot and cached epoch (4 bytes per slot below 2**31 slots).
    self._index_dtype = np.int32 if slots < 2**31 else np.int64
    self._lock = threading.Lock()
    self._orders = collections.OrderedDict()  # epoch -> members, grouped by bucket
    self._plans = collections.OrderedDict()  # epoch -> (bucket, batch number) per step

  def close(self) -> None:
    """Frees the cached epochs (their scratch files go with them); they are recomputed if
    the plan is used again."""
    with self._lock:
      self._orders.clear()
      self._plans.clear()

  def shapes(self, side: str = "targets") -> list[tuple[int, int, int]]:
    """The static [devices, rows_per_device, length] shape of each bucket's `side`
    ('targets' or 'inputs')."""
    lengths = self.boundaries if side == "targets" else self.source_boundaries
    return [
      (self.sharding.num_local_devices, int(r), int(b))
      for r, b in zip(self.rows_per_device, lengths)
    ]

  @property
  def steps_per_epoch(self) -> float:
    """Mean steps per epoch (epochs differ by at most one batch per bucket)."""
    return float(np.sum(self.counts / self.global_rows))

  def steps_before(self, epoch: int) -> int:
    """Steps whose batch completes before epoch `epoch` starts."""
    return int(np.sum(epoch * self.counts // self.global_rows))

  def _epoch_of(self, step: int) -> int:
    epoch = int(step // self.steps_per_epoch)
    while self.steps_before(epoch + 1) <= step:
      epoch += 1
    while epoch > 0 and self.steps_before(epoch) > step:
      epoch -= 1
    return epoch

  def _shuffle(self, epoch: int, with_positions: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """(members, positions) of epoch `epoch`, each [pairs] and grouped by bucket: bucket b's
    pairs in epoch order, and their positions in the epoch's shuffled stream."""
    n = len(self.bucket_of)
    order = shuffled_range(n, self.seed, epoch, self._index_dtype, self.scratch, self.chunk)
    members, positions = group_by_bucket(
      order, self.bucket_of, self.counts, self.scratch, with_positions, self.chunk
    )
    Scratch.release(members)  # read back a batch at a time
    return members, positions

  def _remember(self, epoch: int, members: np.ndarray) -> None:
    self._orders[epoch] = members
    while len(self._orders) > 3:  # a plan reads its epoch and the one before
      self._orders.popitem(last=False)

  def _members(self, b: int, first: int, num: int) -> np.ndarray:
    """Members [first, first + num) of bucket b's endless epoch-after-epoch sequence."""
    count, out = int(self.counts[b]), []
    while num > 0:
      epoch, rank = divmod(first, count)
      if epoch not in self._orders:
        self._remember(epoch, self._shuffle(epoch, with_positions=False)[0])
      start = self._starts[b] + rank
      take = min(num, count - rank)
      out.append(self._orders[epoch][start : start + take])
      first, num = first + take, num - take
    return np.concatenate(out)

  def _plan_epoch(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
    """(bucket, batch number within the bucket) of each batch completing in `epoch`, in
    completion order."""
    members, positions = self._shuffle(epoch, with_positions=True)
    self._remember(epoch, members)
    done, buckets, numbers = [], [], []
    for b in np.flatnonzero(self.counts):
      rows, count = int(self.global_rows[b]), int(self.counts[b])
      j = np.arange(epoch * count // rows, (epoch + 1) * count // rows)
      last = (j + 1) * rows - 1 - epoch * count  # a batch is emitted when its last pair arrives
      done.append(positions[self._starts[b] + last])
      buckets.append(np.full(len(j), b))
      numbers.append(j)
    order = np.argsort(np.concatenate(done), kind="stable")
    return np.concatenate(buckets)[order], np.concatenate(numbers)[order]

  def global_members(self, step: int) -> tuple[int, np.ndarray]:
    """(bucket, pair indices of all processes' rows) of training step `step`."""
    with self._lock:  # plans are computed once per epoch, by whichever thread asks first
      epoch = self._epoch_of(step)
      if epoch not in self._plans:
        self._plans[epoch] = self._plan_epoch(epoch)
        while len(self._plans) > 2:
          self._plans.popitem(last=False)
      buckets, numbers = self._plans[epoch]
      k = step - self.steps_before(epoch)
      b, j = int(buckets[k]), int(numbers[k])
      rows = int(self.global_rows[b])
      return b, self._members(b, j * rows, rows)

  def __call__(self, step: int) -> dict[str, np.ndarray]:
    """This process's batch of `step`: 'inputs' [devices, rows, bucket's source length],
    'targets' [devices, rows, bucket's target length]."""
    bucket, members = self.global_members(step)
    mine = _host_slice(members, self.sharding)
    if self.sample is not None:
      mine = self.sample[mine]
    lengths = dict(inputs=int(self.source_boundaries[bucket]), targets=int(self.boundaries[bucket]))
    batch = {side: _rows(self.pairs, mine, n, side) for side, n in lengths.items()}
    return _device_layout(batch, self.sharding.num_local_devices)


def bucket_dataset(plan: BucketPlan, prefetch: int) -> grain.IterDataset:
  """An infinite, checkpointable stream of bucket batches (state: the next step)."""
  ds = grain.MapDataset.range(sys.maxsize).map(plan)
  ds = ds.to_iter_dataset(grain.ReadOptions(num_threads=0))
  return _prefetch(ds, prefetch)


def _prefetch(ds: grain.IterDataset, prefetch: int) -> grain.IterDataset:
  if prefetch <= 0:
    return ds
  return grain.experimental.ThreadPrefetchIterDataset(ds, prefetch_buffer_size=prefetch)


def shard_indices(num_pairs: int, sharding: Sharding, seed: int) -> grain.MapDataset:
  """This process's pair indices: a 1/process_count shard, reshuffled every epoch.

  Shards of different processes are disjoint and together hold every pair; element
  [e * len : (e + 1) * len] is epoch e of this shard.
  """
  ds = grain.MapDataset.range(num_pairs)[sharding.process_index :: sharding.process_count]
  return ds.shuffle(seed=seed).repeat()


def pack_dataset(
  pairs: TokenizedPairs,
  pack_len: int,
  rows_per_device: int,
  num_bins: int,
  sharding: Sharding,
  seed: int,
  prefetch: int,
  sample: np.ndarray | None = None,
) -> grain.IterDataset:
  """Infinite, checkpointable stream of packed batches [devices, rows_per_device, pack_len].

  grain's first-fit packer fills `num_bins` rows at a time (a pair goes into the first row
  where both sides fit) and yields segment ids and positions, which are renamed here. With
  `sample` ([slots] pair indices, a weighted mixture) the epochs are shuffles of the slots.
  """
  rows = rows_per_device * sharding.num_local_devices
  if sample is None:
    ds = shard_indices(len(pairs), sharding, seed).map(pairs.pair)
  else:
    ds = shard_indices(len(sample), sharding, seed).map(lambda i: pairs.pair(sample[i]))
  ds = ds.to_iter_dataset(grain.ReadOptions(num_threads=0))
  ds = grain.experimental.FirstFitPackIterDataset(
    ds,
    length_struct={"inputs": pack_len, "targets": pack_len},
    num_packing_bins=num_bins or rows,
    seed=seed,
    shuffle_bins=True,
  )
  ds = ds.batch(rows, drop_remainder=True)
  ds = ds.map(lambda b: _device_layout(_rename_packed(b), sharding.num_local_devices))
  return _prefetch(ds, prefetch)


def _rename_packed(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  out = {}
  for side in ("inputs", "targets"):
    out[side] = batch[side]
    out[f"{side}_segmentation"] = batch[f"{side}_segment_ids"]
    out[f"{side}_position"] = batch[f"{side}_positions"]
  return out


def eval_length(length: int, boundaries: Sequence[int]) -> int:
  """Padded length for an eval pair: its bucket, or a multiple of the longest bucket.

  Dev/test pairs are never dropped, so pairs longer than max_len get longer (still static)
  shapes.
  """
  boundaries = np.asarray(boundaries)
  if length <= boundaries[-1]:
    return int(boundaries[np.searchsorted(boundaries, length)])
  return int(-(-length // boundaries[-1]) * boundaries[-1])


def eval_lengths(
  source: int, target: int, boundaries: Sequence[int], source_boundaries: Sequence[int]
) -> tuple[int, int]:
  """(source, target) padded lengths of an eval pair: the first bucket holding both sides
  (as `bucket_of`), or, beyond the last, that bucket's lengths times the smallest factor
  holding both (with equal boundaries: `eval_length` of the longer side, on both sides)."""
  t, s = np.asarray(boundaries), np.asarray(source_boundaries)
  b = max(int(np.searchsorted(s, source)), int(np.searchsorted(t, target)))
  if b < len(t):
    return int(s[b]), int(t[b])
  k = max(-(-source // int(s[-1])), -(-target // int(t[-1])))
  return k * int(s[-1]), k * int(t[-1])


def eval_batches(
  pairs: TokenizedPairs,
  boundaries: Sequence[int],
  budget_per_device: int,
  sharding: Sharding,
  pack_keys: bool,
  max_padded: int | None = None,
  source_boundaries: Sequence[int] | None = None,
) -> Iterator[dict[str, np.ndarray]]:
  """Yields every pair once, grouped by padded lengths, as this process's share of batches.

  Each process gets the same number of batches with the same shapes; a length group's last
  batch is completed with all-pad rows (loss weights are 0 there), so nothing is dropped.
  `max_padded` caps the padded lengths (the model's position table); pairs must fit it.
  `source_boundaries`: the buckets' source lengths (default `boundaries`).
  """
  if source_boundaries is None:
    source_boundaries = boundaries
  padded = np.array(
    [
      eval_lengths(int(s), int(t), boundaries, source_boundaries)
      for s, t in zip(pairs.inputs_lengths, pairs.targets_lengths)
    ],
    np.int64,
  ).reshape(-1, 2)
  if max_padded is not None:
    padded = np.minimum(padded, max_padded)
  for lengths in np.unique(padded, axis=0):
    group = np.flatnonzero((padded == lengths).all(axis=1))
    rows = _global_rows(max(1, budget_per_device // int(lengths.max())), sharding)
    for start in range(0, len(group), rows):
      members = np.full(rows, -1, np.int64)
      chunk = group[start : start + rows]
      members[: len(chunk)] = chunk
      mine = _host_slice(members, sharding)
      sides = dict(inputs=int(lengths[0]), targets=int(lengths[1]))
      batch = {side: _rows(pairs, mine, n, side) for side, n in sides.items()}
      if pack_keys:
        batch = _add_single_pair_segments(batch)
      yield _device_layout(batch, sharding.num_local_devices)
