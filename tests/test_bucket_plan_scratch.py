"""The bucket plan's chunked, off-heap computation gives the batches of the whole-array one."""

import gc
import itertools
import os

import numpy as np
import pytest

from t2t_jax import data
from t2t_jax.data import batching
from t2t_jax.data.tokenized import TokenizedPairs

BOUNDARIES = (8, 16, 24, 32, 48, 64)


class ReferencePlan:
  """The plan as computed before the chunked version: whole-array numpy on the heap
  (permutation, stable argsort by bucket), kept here to compare against."""

  def __init__(self, pairs, boundaries, budget_per_device, sharding, seed):
    boundaries = np.asarray(boundaries)
    lengths = np.maximum(pairs.inputs_lengths, pairs.targets_lengths)
    self.bucket_of = np.searchsorted(boundaries, lengths)
    self.counts = np.bincount(self.bucket_of, minlength=len(boundaries))
    self.starts = np.concatenate([[0], np.cumsum(self.counts)])
    self.global_rows = budget_per_device // boundaries * sharding.num_devices
    self.seed = seed
    self.orders, self.plans = {}, {}

  def steps_before(self, epoch):
    return int(np.sum(epoch * self.counts // self.global_rows))

  def shuffle(self, epoch):
    perm = np.random.default_rng([self.seed, epoch]).permutation(len(self.bucket_of))
    positions = np.argsort(self.bucket_of[perm], kind="stable")
    return perm[positions], positions

  def members(self, b, first, num):
    count, out = int(self.counts[b]), []
    while num > 0:
      epoch, rank = divmod(first, count)
      if epoch not in self.orders:
        self.orders[epoch] = self.shuffle(epoch)[0]
      take = min(num, count - rank)
      out.append(self.orders[epoch][self.starts[b] + rank : self.starts[b] + rank + take])
      first, num = first + take, num - take
    return np.concatenate(out)

  def plan_epoch(self, epoch):
    members, positions = self.shuffle(epoch)
    self.orders[epoch] = members
    done, buckets, numbers = [], [], []
    for b in np.flatnonzero(self.counts):
      rows, count = int(self.global_rows[b]), int(self.counts[b])
      j = np.arange(epoch * count // rows, (epoch + 1) * count // rows)
      done.append(positions[self.starts[b] + (j + 1) * rows - 1 - epoch * count])
      buckets.append(np.full(len(j), b))
      numbers.append(j)
    order = np.argsort(np.concatenate(done), kind="stable")
    return np.concatenate(buckets)[order], np.concatenate(numbers)[order]

  def global_members(self, step):
    epoch = 0
    while self.steps_before(epoch + 1) <= step:
      epoch += 1
    if epoch not in self.plans:
      self.plans[epoch] = self.plan_epoch(epoch)
    buckets, numbers = self.plans[epoch]
    k = step - self.steps_before(epoch)
    b, j = int(buckets[k]), int(numbers[k])
    rows = int(self.global_rows[b])
    return b, self.members(b, j * rows, rows)


def _random_pairs(n, seed=0):
  rng = np.random.default_rng(seed)
  offsets = []
  for _ in range(2):
    lengths = np.clip(rng.lognormal(np.log(14), 0.6, n).astype(np.int64), 1, BOUNDARIES[-1])
    offsets.append(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))
  flat = [np.ones(int(o[-1]), np.int32) for o in offsets]
  return TokenizedPairs(flat[0], offsets[0], flat[1], offsets[1])


def _scratch_mappings(directory):
  """Lines of /proc/self/maps that map a file under `directory` (none without /proc)."""
  if not os.path.exists("/proc/self/maps"):
    return []
  with open("/proc/self/maps", encoding="utf-8") as f:
    return [line for line in f if str(directory) in line]


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint32])
@pytest.mark.parametrize("n", [1, 2, 1000, 4097])
def test_permutation_is_shuffle_of_arange_of_any_integer_type(tmp_path, dtype, n):
  expected = np.random.default_rng([5, 3]).permutation(n)
  in_place = np.arange(n, dtype=dtype)
  np.random.default_rng([5, 3]).shuffle(in_place)
  assert np.array_equal(in_place, expected)
  for scratch in (batching.Scratch(), batching.Scratch(str(tmp_path))):
    got = batching.shuffled_range(n, 5, 3, dtype, scratch, chunk=97)
    assert got.dtype == dtype
    assert np.array_equal(got, expected)


@pytest.mark.parametrize("chunk", [1, 7, 100, 10_000])
def test_group_by_bucket_is_a_stable_argsort_by_bucket(tmp_path, chunk):
  rng = np.random.default_rng(chunk)
  bucket = rng.integers(0, 5, 3001).astype(np.uint8)
  bucket[bucket == 3] = 2  # an empty bucket
  order = rng.permutation(len(bucket)).astype(np.int32)
  positions = np.argsort(bucket[order], kind="stable")
  counts = np.bincount(bucket, minlength=6)
  for scratch in (batching.Scratch(), batching.Scratch(str(tmp_path))):
    members, got = batching.group_by_bucket(order, bucket, counts, scratch, True, chunk)
    assert np.array_equal(got, positions)
    assert np.array_equal(members, order[positions])
    assert members.dtype == np.int32
    alone, none = batching.group_by_bucket(order, bucket, counts, scratch, False, chunk)
    assert none is None and np.array_equal(alone, members)


def test_bucket_counts_and_bucket_of_in_chunks():
  pairs = _random_pairs(2500)
  boundaries = np.asarray(BOUNDARIES)
  expected = np.searchsorted(boundaries, np.maximum(pairs.inputs_lengths, pairs.targets_lengths))
  got = batching.bucket_of(pairs, boundaries, chunk=333)
  assert got.dtype == np.uint8 and np.array_equal(got, expected)
  counts = batching.bucket_counts(got, len(boundaries), chunk=100)
  assert np.array_equal(counts, np.bincount(expected, minlength=len(boundaries)))


def test_plan_gives_the_reference_batches_in_memory_and_on_disk(tmp_path):
  """Same global members at every step of four epochs (steps straddling epoch ends
  included), with the arrays on the heap and in scratch files walked in small chunks."""
  pairs = _random_pairs(3000)
  sharding = batching.Sharding(0, 1, 2)
  args = (pairs, BOUNDARIES, 256, sharding, 11)
  reference = ReferencePlan(*args)
  in_memory = batching.BucketPlan(*args)
  on_disk = batching.BucketPlan(*args, scratch_dir=str(tmp_path), scratch_min_pairs=0, chunk=97)
  assert in_memory.scratch.directory is None and on_disk.scratch.directory == str(tmp_path)
  assert np.array_equal(on_disk.counts, reference.counts)
  steps = reference.steps_before(4) + 3
  assert steps > 4 * len(pairs) / 256  # several epochs of many batches
  for step in range(steps):
    b, expected = reference.global_members(step)
    for plan in (in_memory, on_disk):
      got_b, got = plan.global_members(step)
      assert got_b == b and np.array_equal(got, expected), step
  for plan in (in_memory, on_disk):  # random access after the caches have moved on
    for step in (0, reference.steps_before(1) - 1, reference.steps_before(1), 5):
      assert np.array_equal(plan.global_members(step)[1], reference.global_members(step)[1])


def test_processes_sharing_a_scratch_dir_plan_alike_and_leave_no_files(tmp_path):
  pairs = _random_pairs(1500, seed=1)
  plans = [
    batching.BucketPlan(
      pairs,
      BOUNDARIES,
      128,
      batching.Sharding(p, 2, 2),
      seed=3,
      scratch_dir=str(tmp_path),
      scratch_min_pairs=1000,
      chunk=64,
    )
    for p in range(2)
  ]
  steps = plans[0].steps_before(2) + 1
  for step in range(steps):
    (b0, m0), (b1, m1) = (plan.global_members(step) for plan in plans)
    assert b0 == b1 and np.array_equal(m0, m1)
  assert os.listdir(tmp_path) == []  # the scratch files have no names
  if not os.path.exists("/proc/self/maps"):
    return
  assert _scratch_mappings(tmp_path)  # but they are mapped while the plans hold them
  for plan in plans:
    plan.close()
  del plans, plan
  gc.collect()
  assert _scratch_mappings(tmp_path) == []  # and gone with the plans


def test_small_corpora_stay_on_the_heap(tmp_path):
  pairs = _random_pairs(500)
  plan = batching.BucketPlan(
    pairs, BOUNDARIES, 256, batching.Sharding(0, 1, 1), 0, scratch_dir=str(tmp_path)
  )
  assert plan.scratch.directory is None
  plan.global_members(0)
  assert _scratch_mappings(tmp_path) == []


def test_release_keeps_the_data_of_a_scratch_array(tmp_path):
  scratch = batching.Scratch(str(tmp_path))
  a = scratch.empty(1 << 16, np.int32)
  a[:] = np.arange(len(a))
  batching.Scratch.release(a)
  assert np.array_equal(a, np.arange(len(a)))
  b = np.arange(10)
  batching.Scratch.release(b)  # a heap array is left alone
  assert np.array_equal(b, np.arange(10))


def test_a_full_scratch_disk_falls_back_to_the_heap(tmp_path, monkeypatch, caplog):
  def no_room(fd, offset, size):
    raise OSError(28, "No space left on device")

  monkeypatch.setattr(os, "posix_fallocate", no_room)
  pairs = _random_pairs(800, seed=2)
  args = (pairs, BOUNDARIES, 256, batching.Sharding(0, 1, 1), 4)
  plan = batching.BucketPlan(*args, scratch_dir=str(tmp_path), scratch_min_pairs=0, chunk=50)
  reference = ReferencePlan(*args)
  for step in range(reference.steps_before(2) + 1):
    assert np.array_equal(plan.global_members(step)[1], reference.global_members(step)[1])
  assert "no room" in caplog.text and str(tmp_path) in caplog.text
  assert _scratch_mappings(tmp_path) == [] and os.listdir(tmp_path) == []


def test_training_batches_from_scratch_files_equal_those_from_the_heap(tmp_path, monkeypatch):
  """get_datasets puts a large corpus's plan in the workdir; the batches do not change."""
  c = data.default_config()  # synthetic 'reverse'
  c.update(synthetic_train_size=1200, max_len=24, tokens_per_batch=512, prefetch_batches=0)
  heap = data.get_datasets(c, str(tmp_path / "heap"), num_local_devices=2)
  monkeypatch.setattr(batching, "SCRATCH_MIN_PAIRS", 100)
  disk = data.get_datasets(c, str(tmp_path / "disk"), num_local_devices=2)
  assert heap.bucket_plan.scratch.directory is None
  assert disk.bucket_plan.scratch.directory == str(tmp_path / "disk")
  steps = heap.bucket_plan.steps_before(2) + 2
  for a, b in zip(itertools.islice(heap.train_iter(), steps), disk.train_iter()):
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
