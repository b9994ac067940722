"""Checkpoint averaging (paper 6.1: the last 5 or 20 checkpoints) against numpy's float64 mean.

The slow translation tests average checkpoints of a trained workdir; this one checks the
arithmetic alone on random trees, in the quick loop.
"""

import jax
import numpy as np
import pytest

from t2t_jax.run import checkpoint


def _tree(rng, scale):
  return {
    "encoder": {"kernel": (rng.normal(size=(3, 4)) * scale).astype(np.float32)},
    "embed": {"embedding": (rng.normal(size=(5, 2)) * scale + 1e3).astype(np.float32)},
    "bias": rng.normal(size=(4,)).astype(np.float32),
  }


@pytest.mark.parametrize("count", [1, 2, 5, 20])
def test_average_params_is_the_float64_mean(count):
  rng = np.random.default_rng(count)
  trees = [_tree(rng, scale) for scale in np.linspace(0.5, 3.0, count)]
  got = checkpoint.average_params(trees)
  for path_and_leaf, *leaves in zip(
    jax.tree_util.tree_leaves_with_path(got), *(jax.tree.leaves(t) for t in trees)
  ):
    path, leaf = path_and_leaf
    want = np.mean(np.stack([np.float64(x) for x in leaves]), axis=0)
    assert leaf.dtype == np.float32, jax.tree_util.keystr(path)
    # One float32 rounding of the float64 mean: a float32 running sum would drift further.
    np.testing.assert_array_equal(leaf, want.astype(np.float32), err_msg=jax.tree_util.keystr(path))


def test_average_of_copies_is_the_tree_and_no_tree_is_an_error():
  rng = np.random.default_rng(0)
  tree = _tree(rng, 1.0)
  for a, b in zip(jax.tree.leaves(checkpoint.average_params([tree] * 3)), jax.tree.leaves(tree)):
    np.testing.assert_array_equal(a, b)
  with pytest.raises(ValueError, match="nothing to average"):
    checkpoint.average_params([])


def test_restore_params_gives_what_a_whole_state_restore_gives(tmp_path):
  """restore_params reads the parameters alone (partial restore of the state item); they
  must be the arrays a restore of the whole saved state (optimizer moments included) holds."""
  import types

  import orbax.checkpoint as ocp

  rng = np.random.default_rng(7)
  params = _tree(rng, 1.0)
  moments = {"mu": _tree(rng, 2.0), "nu": _tree(rng, 3.0)}
  state = types.SimpleNamespace(
    step=np.int32(3), params=params, opt_state=moments, rng=np.zeros(2, np.uint32), bad_step=0
  )
  ckpts = checkpoint.Checkpoints(str(tmp_path), create=True, owner=True)
  ckpts.save(3, state, data_state=None)
  ckpts.wait()
  got = checkpoint.Checkpoints(str(tmp_path)).restore_params(3, params)
  whole = ckpts.manager.restore(
    3, args=ocp.args.Composite(**{checkpoint.STATE: ocp.args.StandardRestore()})
  )[checkpoint.STATE]
  assert jax.tree.structure(got) == jax.tree.structure(params)
  for a, b, c in zip(
    jax.tree.leaves(got), jax.tree.leaves(whole["params"]), jax.tree.leaves(params)
  ):
    assert isinstance(a, np.ndarray) and a.dtype == c.dtype
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, c)
  assert "opt_state" in whole  # the moments were saved, and left unread by restore_params
  wrong = dict(params, bias=np.zeros(5, np.float32))
  with pytest.raises(checkpoint.CheckpointMismatchError, match=r"parameter \['bias'\] is \(4,\)"):
    checkpoint.Checkpoints(str(tmp_path)).restore_params(3, wrong)
