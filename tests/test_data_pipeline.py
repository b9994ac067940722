"""Batches: layout, token budget, packing fill, determinism, per-host shards, exact resume."""

import itertools
import json

import numpy as np
import pytest

from t2t_jax import data
from t2t_jax.data import batching
from t2t_jax.tokens import BOS_ID, EOS_ID

BUDGET = 1024  # global tokens per side per step


def _config(mode, **overrides):
  c = data.default_config()  # synthetic 'reverse'
  c.synthetic_train_size = 1500
  c.synthetic_eval_size = 100
  c.synthetic_max_len = 30
  c.max_len = 24  # drops the longest synthetic pairs
  c.pack_len = 32
  c.batching = mode
  c.tokens_per_batch = BUDGET
  c.update(overrides)
  return c


def _datasets(tmp_path, mode, **kwargs):
  overrides = {
    k: kwargs.pop(k)
    for k in list(kwargs)
    if k not in ("process_index", "process_count", "num_local_devices")
  }
  return data.get_datasets(_config(mode, **overrides), str(tmp_path), **kwargs)


def _take(it, n):
  return [next(it) for _ in range(n)]


def _pairs_of_row(batch, d, r):
  """The (source ids, target ids) pairs held in row r of device d."""
  if "inputs_segmentation" not in batch:
    return [
      (
        tuple(batch["inputs"][d, r][batch["inputs"][d, r] > 0]),
        tuple(batch["targets"][d, r][batch["targets"][d, r] > 0]),
      )
    ]
  out = []
  for seg in range(1, batch["inputs_segmentation"][d, r].max() + 1):
    src = batch["inputs"][d, r][batch["inputs_segmentation"][d, r] == seg]
    tgt = batch["targets"][d, r][batch["targets_segmentation"][d, r] == seg]
    out.append((tuple(src), tuple(tgt)))
  return out


def _all_pairs(d):
  return {
    (tuple(p["inputs"]), tuple(p["targets"]))
    for p in map(d.train_pairs.pair, range(len(d.train_pairs)))
  }


@pytest.mark.parametrize("mode", ["bucket", "pack"])
def test_layout_and_token_budget(tmp_path, mode):
  d = _datasets(tmp_path, mode, num_local_devices=2)
  known = _all_pairs(d)
  per_device = BUDGET // 2
  for batch in _take(d.train_iter(), 40):
    expected = {"inputs", "targets"} | (set(batching.PACK_KEYS) if mode == "pack" else set())
    assert set(batch) == expected
    shape = batch["inputs"].shape
    assert shape[0] == 2 and all(v.shape == shape and v.dtype == np.int32 for v in batch.values())
    assert shape[1] * shape[2] <= per_device  # at most the budget, pad included
    if mode == "bucket":
      assert shape in d.bucket_plan.shapes()  # one of a fixed set of shapes
    else:
      assert shape == (2, per_device // 32, 32)
    for dev, row in itertools.product(range(2), range(shape[1])):
      for src, tgt in _pairs_of_row(batch, dev, row):
        if not src:
          continue
        assert src[-1] == EOS_ID and tgt[-1] == EOS_ID and BOS_ID not in tgt
        assert (src, tgt) in known


def test_packed_segments_and_positions(tmp_path):
  d = _datasets(tmp_path, "pack")
  batch = next(d.train_iter())
  for side in ("inputs", "targets"):
    tokens, seg, pos = (batch[k][0] for k in (side, f"{side}_segmentation", f"{side}_position"))
    assert np.all((tokens > 0) == (seg > 0)) and np.all(pos[seg == 0] == 0)
    for row in range(tokens.shape[0]):
      for s in range(1, seg[row].max() + 1):
        where = np.flatnonzero(seg[row] == s)
        assert np.all(np.diff(where) == 1)  # contiguous
        assert np.array_equal(pos[row, where], np.arange(len(where)))
        assert tokens[row, where[-1]] == EOS_ID
  assert batch["inputs_segmentation"].max() > 1  # rows really hold several pairs


def _fill_over_epoch(d, mode):
  it, pairs, real, steps = d.train_iter(), 0, 0, 0
  while pairs < len(d.train_pairs):
    batch = next(it)
    real += np.count_nonzero(batch["inputs"]) + np.count_nonzero(batch["targets"])
    steps += 1
    pairs += sum(
      len(_pairs_of_row(batch, 0, r))
      for r in range(batch["inputs"].shape[1])
      if batch["inputs"][0, r, 0] > 0
    )
  it.close()
  return real / (2 * BUDGET * steps)


def test_packing_fills_at_least_85_percent_of_the_budget(tmp_path):
  fill = _fill_over_epoch(_datasets(tmp_path, "pack"), "pack")
  print(f"packing: real tokens = {fill:.3f} of the budget over one epoch")
  assert fill >= 0.85


def test_bucket_fill_is_reported(tmp_path):
  d = _datasets(tmp_path, "bucket")
  fill = _fill_over_epoch(d, "bucket")
  print(f"bucketing: real tokens = {fill:.3f} of the budget over one epoch")
  assert fill > 0.5
  assert f"padding fraction {d.stats.padding_fraction:.3f}" in d.stats.summary()
  assert 0 < d.stats.padding_fraction < 0.5


def test_length_filter_applies_to_train_only(tmp_path):
  d = _datasets(tmp_path, "bucket")
  s = d.stats.train
  assert s.dropped_too_long > 0 and s.kept == s.read - s.dropped_too_long == len(d.train_pairs)
  assert max(d.train_pairs.inputs_lengths.max(), d.train_pairs.targets_lengths.max()) <= 24
  assert len(d.dev_pairs) == 100 and max(len(p[0].split()) for p in d.dev_pairs) > 24


@pytest.mark.parametrize("mode", ["bucket", "pack"])
def test_same_seed_same_batches_other_seed_other_batches(tmp_path, mode):
  a = _take(_datasets(tmp_path, mode).train_iter(), 8)
  b = _take(_datasets(tmp_path, mode).train_iter(), 8)
  c = _take(_datasets(tmp_path, mode, shuffle_seed=1).train_iter(), 8)
  assert all(_equal(x, y) for x, y in zip(a, b))
  assert not all(_equal(x, y) for x, y in zip(a, c))


def _equal(x, y):
  return x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x)


@pytest.mark.parametrize("mode", ["bucket", "pack"])
def test_resume_equals_uninterrupted_run(tmp_path, mode):
  d = _datasets(tmp_path, mode)
  steps = 3 * len(d.train_pairs) // 40  # crosses at least one epoch end
  uninterrupted = _take(d.train_iter(), steps)
  it = d.train_iter()
  _take(it, steps // 2)
  state = json.loads(json.dumps(it.get_state()))  # as a checkpoint stores it
  it.close()
  restarted = _datasets(tmp_path, mode).train_iter()  # a new process
  restarted.set_state(state)
  rest = _take(restarted, steps - steps // 2)
  assert all(_equal(x, y) for x, y in zip(uninterrupted[steps // 2 :], rest))


def test_bucket_hosts_split_each_global_batch_and_cover_every_epoch(tmp_path):
  hosts = [
    _datasets(tmp_path, "bucket", process_index=p, process_count=2, num_local_devices=2)
    for p in range(2)
  ]
  plan = hosts[0].bucket_plan
  steps = plan.steps_before(2)
  iters = [h.train_iter() for h in hosts]
  seen = []
  for step in range(steps):
    b0, b1 = next(iters[0]), next(iters[1])
    assert b0["inputs"].shape == b1["inputs"].shape  # same program on every host
    rows = [
      _pairs_of_row(b, dev, r)[0]
      for b in (b0, b1)
      for dev in range(2)
      for r in range(b["inputs"].shape[1])
    ]
    bucket, members = plan.global_members(step)
    assert rows == [tuple(map(tuple, hosts[0].train_pairs.pair(i).values())) for i in members]
    seen.append((bucket, members))
  # Each bucket's batches, in order, are epoch 0's members of that bucket and then epoch 1's:
  # every pair once per epoch, across hosts.
  for b in np.flatnonzero(plan.counts):
    stream = np.concatenate([m for bucket, m in seen if bucket == b])
    count = plan.counts[b]
    full_epochs = len(stream) // count
    assert full_epochs >= 1
    for e in range(full_epochs):
      epoch = stream[e * count : (e + 1) * count]
      assert np.array_equal(np.sort(epoch), np.flatnonzero(plan.bucket_of == b))


def test_pack_shards_are_disjoint_and_cover_the_data_every_epoch():
  n = 103
  for count in (1, 2, 3):
    shards = [
      batching.shard_indices(n, batching.Sharding(p, count, 1), seed=0) for p in range(count)
    ]
    sizes = [len(range(p, n, count)) for p in range(count)]
    for epoch in range(3):
      parts = [list(s[epoch * k : (epoch + 1) * k]) for s, k in zip(shards, sizes)]
      assert sorted(itertools.chain(*parts)) == list(range(n))
    assert list(shards[0][: sizes[0]]) != list(shards[0][sizes[0] : 2 * sizes[0]])  # reshuffled


def test_pack_hosts_feed_disjoint_pairs(tmp_path):
  d = [_datasets(tmp_path, "pack", process_index=p, process_count=2) for p in range(2)]
  seen = []
  for host in d:
    pairs = set()
    for batch in _take(host.train_iter(), 10):
      for r in range(batch["inputs"].shape[1]):
        pairs.update(_pairs_of_row(batch, 0, r))
    seen.append(pairs)
  assert seen[0] and seen[1] and not seen[0] & seen[1]


@pytest.mark.parametrize("mode", ["bucket", "pack"])
def test_eval_batches_hold_every_dev_pair_once(tmp_path, mode):
  hosts = [
    _datasets(tmp_path, mode, process_index=p, process_count=2, num_local_devices=2)
    for p in range(2)
  ]
  per_host = [list(h.eval_batches()) for h in hosts]
  assert len(per_host[0]) == len(per_host[1])
  got = []
  for b0, b1 in zip(*per_host):
    assert b0["inputs"].shape == b1["inputs"].shape
    for b in (b0, b1):
      assert b["inputs"].shape[0] == 2
      if mode == "pack":
        assert set(batching.PACK_KEYS) <= set(b)
        assert np.array_equal(b["targets_segmentation"], (b["targets"] > 0).astype(np.int32))
      for dev, r in itertools.product(range(2), range(b["inputs"].shape[1])):
        pairs = _pairs_of_row(b, dev, r)
        if pairs and pairs[0][0]:
          ((src, tgt),) = pairs  # one pair per eval row
          got.append((hosts[0].tokenizer.decode(src), hosts[0].tokenizer.decode(tgt)))
        else:  # a padding row is pad on both sides
          assert not b["inputs"][dev, r].any() and not b["targets"][dev, r].any()
  assert sorted(got) == sorted(hosts[0].dev_pairs)
  assert len(hosts[0].test_pairs) == 100 and list(hosts[0].eval_batches("test"))


def test_stats_report(tmp_path):
  d = _datasets(tmp_path, "pack")
  _take(d.train_iter(), 5)
  s = d.stats
  assert s.batches == 5 and s.mean_input_tokens_per_batch > 0.85 * BUDGET
  text = s.summary()
  for needle in (
    "1500 pairs read",
    "0 empty skipped",
    f"{s.train.dropped_too_long} dropped by length",
    "mean tokens/batch",
    "padding fraction",
    "shapes [1,32,32]",
  ):
    assert needle in text
