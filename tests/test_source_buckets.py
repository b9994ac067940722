"""Separate source and target bucket lengths (config.data.source_bucket_boundaries): each pair
goes to the first bucket holding both its sides, batches have each side's own length, and
the training step gives the same numbers whatever the sources are padded to."""

import jax
import numpy as np
import pytest

from t2t_jax import data
from t2t_jax.data import batching, tokenized
from t2t_jax.data import config as config_lib
from t2t_jax.tokens import EOS_ID
from t2t_jax.training import optim, parallel
from tests import support

TARGETS = (8, 16, 24)
SOURCES = (4, 8, 24)


def _pairs(rng, n=300):
  """Random pairs whose targets are about twice their sources (EOS included)."""
  src = rng.integers(1, 12, n)
  tgt = np.minimum(2 * src + rng.integers(-1, 3, n), 24).clip(1)
  ins = [np.append(rng.integers(4, 40, k - 1), EOS_ID) for k in src]
  outs = [np.append(rng.integers(4, 40, k - 1), EOS_ID) for k in tgt]
  offsets = lambda xs: np.concatenate([[0], np.cumsum([len(x) for x in xs])])
  return tokenized.TokenizedPairs(
    np.concatenate(ins).astype(np.int32),
    offsets(ins),
    np.concatenate(outs).astype(np.int32),
    offsets(outs),
  )


def _reference_bucket(s, t):
  return next(b for b in range(len(TARGETS)) if s <= SOURCES[b] and t <= TARGETS[b])


def test_each_pair_takes_the_first_bucket_holding_both_sides():
  pairs = _pairs(np.random.default_rng(0))
  sharding = batching.Sharding(0, 1, 2)
  plan = batching.BucketPlan(pairs, TARGETS, 96, sharding, seed=0, source_boundaries=SOURCES)
  expected = [_reference_bucket(s, t) for s, t in zip(pairs.inputs_lengths, pairs.targets_lengths)]
  assert list(plan.bucket_of) == expected
  # Rows from the longer padded side of each bucket: 96 // (8, 16, 24).
  assert plan.shapes() == [(2, 12, 8), (2, 6, 16), (2, 4, 24)]
  assert plan.shapes("inputs") == [(2, 12, 4), (2, 6, 8), (2, 4, 24)]
  seen = []
  for step in range(plan.steps_before(1)):
    batch = plan(step)
    bucket, members = plan.global_members(step)
    assert batch["inputs"].shape == plan.shapes("inputs")[bucket]
    assert batch["targets"].shape == plan.shapes()[bucket]
    for row, i in enumerate(members):
      pair = pairs.pair(i)
      got = batch["inputs"].reshape(-1, SOURCES[bucket])[row]
      np.testing.assert_array_equal(got[: len(pair["inputs"])], pair["inputs"])
      assert not got[len(pair["inputs"]) :].any()
    seen.extend(members)
  assert len(seen) == len(set(seen))  # an epoch holds each pair at most once
  # The same boundaries on both sides: the buckets of the longer side, as before.
  same = batching.BucketPlan(pairs, TARGETS, 96, sharding, seed=0)
  longer = np.maximum(pairs.inputs_lengths, pairs.targets_lengths)
  assert list(same.bucket_of) == list(np.searchsorted(TARGETS, longer))


def test_eval_lengths_hold_both_sides_and_equal_the_old_rule_for_equal_boundaries():
  rng = np.random.default_rng(1)
  for s, t in rng.integers(1, 80, (300, 2)):
    src, tgt = batching.eval_lengths(int(s), int(t), TARGETS, SOURCES)
    assert src >= s and tgt >= t
    if s <= 24 and t <= 24:
      b = _reference_bucket(s, t)
      assert (src, tgt) == (SOURCES[b], TARGETS[b])
    else:  # beyond the buckets: the last bucket's lengths times one factor
      assert src // SOURCES[-1] == tgt // TARGETS[-1]
    same = batching.eval_length(int(max(s, t)), TARGETS)
    assert batching.eval_lengths(int(s), int(t), TARGETS, TARGETS) == (same, same)


def test_eval_batches_pad_each_side_to_its_own_length():
  pairs = _pairs(np.random.default_rng(2), n=80)
  sharding = batching.Sharding(0, 1, 1)
  count = 0
  for batch in batching.eval_batches(pairs, TARGETS, 96, sharding, False, None, SOURCES):
    s, t = batch["inputs"].shape[-1], batch["targets"].shape[-1]
    assert (s, t) in list(zip(SOURCES, TARGETS))
    count += int((batch["targets"][..., 0] > 0).sum())
  assert count == len(pairs)


def test_bad_source_bucket_lengths_name_the_flag():
  c = data.default_config()
  c.update(max_len=24, bucket_boundaries=TARGETS)
  c.source_bucket_boundaries = (4, 8)
  with pytest.raises(data.DataError, match=r"source_bucket_boundaries=\(4, 8\): needs one source"):
    config_lib.validate(c)
  c.source_bucket_boundaries = (8, 4, 24)
  with pytest.raises(data.DataError, match="non-decreasing and end at max_len=24"):
    config_lib.validate(c)
  c.source_bucket_boundaries = (4, 8, 16)
  with pytest.raises(data.DataError, match="end at max_len=24"):
    config_lib.validate(c)
  c.source_bucket_boundaries = SOURCES
  config_lib.validate(c)
  assert config_lib.source_bucket_boundaries(c) == SOURCES
  c.source_bucket_boundaries = ()
  assert config_lib.source_bucket_boundaries(c) == config_lib.bucket_boundaries(c)


@pytest.mark.slow
def test_the_train_step_takes_sources_shorter_than_targets():
  """Padding the sources to 8 or to the targets' 16 gives the same loss and update."""
  model, state = support.small_state()
  step = parallel.pmap_train_step(model, 0.1, optim.optimizer_schedule(32, 4))
  rng = np.random.default_rng(0)
  n = jax.local_device_count()
  inputs = np.zeros((n, 2, 8), np.int32)
  targets = np.zeros((n, 2, 16), np.int32)
  for d in range(n):
    for r in range(2):
      k, m = rng.integers(2, 9), rng.integers(2, 17)
      inputs[d, r, :k] = np.append(rng.integers(4, 40, k - 1), EOS_ID)
      targets[d, r, :m] = np.append(rng.integers(4, 40, m - 1), EOS_ID)
  wide = np.concatenate([inputs, np.zeros_like(inputs)], axis=-1)
  results = []
  for src in (inputs, wide):
    batch = parallel.shard(dict(inputs=src, targets=targets))
    new, metrics = step(parallel.replicate(state), batch)
    results.append((parallel.unreplicate(new.params), parallel.host_metrics(metrics)))
  (p_short, m_short), (p_wide, m_wide) = results
  np.testing.assert_allclose(m_short["loss"], m_wide["loss"], rtol=1e-5)
  for a, b in zip(jax.tree.leaves(p_short), jax.tree.leaves(p_wide)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-5)


def test_the_parsing_experiment_pads_sources_to_their_own_lengths():
  from t2t_jax.experiments import parsing

  c = parsing.get_config().data
  config_lib.validate(c)
  sources, targets = config_lib.source_bucket_boundaries(c), config_lib.bucket_boundaries(c)
  assert len(sources) == len(targets) and all(s * 2 <= t for s, t in zip(sources[:-1], targets))
