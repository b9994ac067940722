"""Checkpoint averaging (paper 6.1: the last 5 or 20 checkpoints) against numpy's float64 mean.

The slow translation tests average checkpoints of a trained workdir; this one checks the
arithmetic alone on random trees, in the quick loop.
"""

import json
import os

import jax
import numpy as np
import pytest

from t2t_jax.decoding.config import SearchConfig
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


# --- which checkpoints a spec names, and the candidate chosen on dev ---------------------------


def _state(step: int, rng: np.random.Generator):
  import types

  return types.SimpleNamespace(
    step=np.int32(step),
    params=_tree(rng, float(step)),
    opt_state={"mu": _tree(rng, 1.0)},
    rng=np.zeros(2, np.uint32),
    bad_step=-1,
  )


@pytest.fixture(scope="module")
def five_steps(tmp_path_factory):
  """A workdir holding checkpoints 10, 20, ..., 50 of random trees; (workdir, params by step)."""
  workdir = str(tmp_path_factory.mktemp("avg") / "w")
  rng = np.random.default_rng(11)
  ckpts = checkpoint.Checkpoints(workdir, max_to_keep=10, create=True, owner=True)
  params = {}
  for step in (10, 20, 30, 40, 50):
    state = _state(step, rng)
    params[step] = state.params
    ckpts.save(step, state, None)
  ckpts.wait()
  ckpts.close()
  return workdir, params


def test_average_n_of_more_checkpoints_is_the_mean_of_the_newest_n(five_steps):
  workdir, params = five_steps
  ckpts = checkpoint.Checkpoints(workdir)
  assert checkpoint.choose_steps(ckpts, "latest") == [50]
  assert checkpoint.choose_steps(ckpts, "30") == [30]
  for n in (1, 2, 3, 5):
    want_steps = [10, 20, 30, 40, 50][5 - n :]
    assert checkpoint.choose_steps(ckpts, f"average:{n}") == want_steps
    got, steps = checkpoint.load_params(workdir, f"average:{n}", params[10])
    assert steps == want_steps
    for leaf, *leaves in zip(jax.tree.leaves(got), *(jax.tree.leaves(params[s]) for s in steps)):
      want = np.mean(np.stack([np.float64(x) for x in leaves]), axis=0).astype(np.float32)
      np.testing.assert_array_equal(leaf, want)
  with pytest.raises(
    checkpoint.CheckpointSpecError, match=r"holds 5 checkpoint\(s\).*fewer than 6"
  ):
    checkpoint.choose_steps(ckpts, "average:6")


def _select(workdir, candidates, dev_scores):
  """select_checkpoint with each candidate's dev score given by `dev_scores[spec]` (the
  translator is the spec itself: no model is built)."""
  from t2t_jax.training import evaluation

  seen = []

  def metric(translator, pairs, search):
    seen.append(translator)
    return dev_scores[translator]

  ckpts = checkpoint.Checkpoints(workdir)
  selection = evaluation.select_checkpoint(
    ckpts, candidates, [("a", "b")] * 3, lambda spec: spec, SearchConfig(), metric, "dev_bleu"
  )
  return selection, seen


def test_selection_chooses_the_highest_dev_score_and_writes_it(five_steps, tmp_path):
  from t2t_jax.run.workdir import Workdir
  from t2t_jax.training import evaluation

  workdir, _ = five_steps
  scores = {"latest": 20.0, "average:2": 24.5, "average:5": 22.0, "30": 24.5, "average:6": 99.0}
  selection, seen = _select(workdir, "latest, average:2,average:5,30,average:6", scores)
  # average:6 cannot be built from 5 checkpoints: skipped, never scored. Ties: the first listed.
  assert seen == ["latest", "average:2", "average:5", "30"]
  assert selection.best == "average:2"
  assert selection.steps["average:5"] == [10, 20, 30, 40, 50] and selection.num_sentences == 3
  out = str(tmp_path / "run")
  os.makedirs(out)
  evaluation.write_selection(out, selection, SearchConfig(beam_size=4, alpha=0.6))
  record = Workdir(out).read_selection()
  assert record["checkpoint"] == "average:2" and record["steps"] == [40, 50]
  assert record["metric"] == "dev_bleu" and record["dev_bleu"] == {k: scores[k] for k in seen}
  assert (record["beam_size"], record["alpha"], record["dev_sentences"]) == (4, 0.6, 3)
  # Lower scores elsewhere: the best is still the highest, wherever it is listed.
  selection, _ = _select(workdir, "average:5,latest", {"average:5": 1.0, "latest": 2.0})
  assert selection.best == "latest"
  selection, _ = _select(workdir, "average:5,latest", {"average:5": 3.0, "latest": 2.0})
  assert selection.best == "average:5"


def test_selected_and_auto_resolve_to_the_written_choice(five_steps, tmp_path):
  import shutil

  workdir, params = five_steps
  copy = str(tmp_path / "w")
  shutil.copytree(workdir, copy)
  assert checkpoint.resolve_spec(copy, "auto") == "latest"
  with open(os.path.join(copy, "selected.json"), "w") as f:
    json.dump(dict(checkpoint="average:2", steps=[40, 50]), f)
  assert checkpoint.resolve_spec(copy, "auto") == "average:2"
  assert checkpoint.resolve_spec(copy, "selected") == "average:2"
  assert checkpoint.resolve_spec(copy, "30") == "30"
  got, steps = checkpoint.load_params(copy, "selected", None)
  assert steps == [40, 50]
  for leaf, a, b in zip(*(jax.tree.leaves(t) for t in (got, params[40], params[50]))):
    np.testing.assert_array_equal(leaf, ((np.float64(a) + b) / 2).astype(np.float32))
