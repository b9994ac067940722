"""The best checkpoints by a dev metric (kept apart from the newest, `--checkpoint=best`) and
early stopping after `patience` evaluations without improvement (also across a resume)."""

import dataclasses
import json
import logging
import os
import shutil

import jax
import ml_collections
import numpy as np
import pytest

from t2t_jax.cli import average as average_cli
from t2t_jax.run import checkpoint
from t2t_jax.run.workdir import Workdir
from t2t_jax.training import best
from t2t_jax.training import trainer as train
from tests.test_train import small_config

# --- the decision: a pure fold over the evaluations ------------------------------------------


def test_patience_counts_evaluations_without_an_improvement_of_min_delta():
  # Dev losses; improvements on the reference: 2.0 (by 1.0), then 1.95 and 1.92 by < 0.1.
  history = [(10, 3.0), (20, 2.0), (30, 1.95), (40, 2.5), (50, 1.92), (60, 1.99)]
  # min_delta 0: 1.95 and 1.92 improve; after 1.92 at 50, one evaluation without (60).
  s = best.standing(history, "min", keep=2, patience=2, min_delta=0.0)
  assert s.reference == (50, 1.92) and s.since == 1 and s.stopped_at is None
  assert s.best == ((50, 1.92), (30, 1.95))
  # min_delta 0.1: 1.95 and 1.92 are not enough on 2.0 -> 30, 40 without: stop at 40.
  s = best.standing(history, "min", keep=2, patience=2, min_delta=0.1)
  assert s.reference == (20, 2.0) and s.stopped_at == 40
  # The best ranking is by value whatever min_delta says, over every evaluation seen.
  assert s.best_steps == [50, 30]
  # patience 4: 30, 40, 50, 60 without an improvement of 0.1 -> stop at 60.
  assert best.standing(history, "min", 1, 4, 0.1).stopped_at == 60
  # patience 0: never stops.
  assert best.standing(history, "min", 1, 0, 0.1).stopped_at is None


def test_higher_is_better_for_bleu_and_ties_go_to_the_earlier_step():
  history = [(1, 10.0), (2, 12.0), (3, 12.0), (4, 11.0), (5, 9.0)]
  s = best.standing(history, "max", keep=3, patience=3, min_delta=0.0)
  # An equal score is no improvement: 3, 4, 5 count -> stop at 5.
  assert s.reference == (2, 12.0) and s.stopped_at == 5
  assert s.best == ((2, 12.0), (3, 12.0), (4, 11.0))
  assert best.standing([], "max", 1, 1, 0.0) == best.Standing((), None, 0, None)
  # An improvement of exactly min_delta counts.
  assert best.standing([(1, 1.0), (2, 1.5)], "max", 1, 1, 0.5).stopped_at is None
  assert best.standing([(1, 1.0), (2, 1.25)], "max", 1, 1, 0.5).stopped_at == 2


def _reference_standing(history, mode, keep, patience, min_delta):
  """`best.standing` by enumeration, written apart from it: an evaluation's rank is the
  number of evaluations strictly better, or as good and earlier; the reference after each
  evaluation is found by scanning back; the stop is the first evaluation that is the
  `patience`-th since the reference."""
  better = (lambda a, b: a < b) if mode == "min" else (lambda a, b: a > b)
  rank = [sum(better(w, v) or (w == v and t < s) for t, w in history) for s, v in history]
  kept = tuple(history[i] for i in sorted(range(len(history)), key=rank.__getitem__)[:keep])
  ref, stop = None, None
  for i, (_, v) in enumerate(history):
    gain = None if ref is None else (v - history[ref][1] if mode == "max" else history[ref][1] - v)
    if ref is None or (gain > 0 and gain >= min_delta):
      ref = i
    elif patience and i - ref == patience:
      stop = i
      break
  last = len(history) - 1 if stop is None else stop
  since = 0 if ref is None else last - ref
  return best.Standing(
    kept,
    None if ref is None else history[ref],
    since,
    None if stop is None else history[stop][0],
  )


@pytest.mark.parametrize("mode", ["min", "max"])
def test_standing_equals_the_enumeration_on_random_histories_with_ties(mode):
  rng = np.random.default_rng(0 if mode == "min" else 1)
  for _ in range(300):
    n = int(rng.integers(0, 9))
    # Values on a grid of quarters: exact ties, and gains of exactly min_delta, are common.
    values = rng.integers(0, 6, n) * 0.25
    history = [(10 * (i + 1), float(v)) for i, v in enumerate(values)]
    keep, patience = int(rng.integers(0, 4)), int(rng.integers(0, 4))
    min_delta = float(rng.choice([0.0, 0.25, 0.5]))
    got = best.standing(history, mode, keep, patience, min_delta)
    want = _reference_standing(history, mode, keep, patience, min_delta)
    assert got == want, (history, keep, patience, min_delta)


def test_patience_changes_nothing_but_where_the_run_stops():
  """The early stop only ends the run: the evaluations up to the stop rank and count as they
  do without patience, so a run stopped at S holds what an unstopped run held at S."""
  rng = np.random.default_rng(5)
  for _ in range(100):
    history = [(i + 1, float(v)) for i, v in enumerate(rng.integers(0, 5, 10))]
    for mode in ("min", "max"):
      stop = best.standing(history, mode, keep=3, patience=2, min_delta=0.0).stopped_at
      if stop is None:
        continue
      upto = [e for e in history if e[0] <= stop]  # a stopped run evaluates no further
      stopped = best.standing(upto, mode, keep=3, patience=2, min_delta=0.0)
      free = best.standing(upto, mode, keep=3, patience=0, min_delta=0.0)
      assert free.stopped_at is None and stopped.stopped_at == stop == upto[-1][0]
      assert dataclasses.replace(free, stopped_at=stop) == stopped


@pytest.mark.parametrize(
  "metric, mode, overrides",
  [
    ("dev_bleu", "max", dict(bleu_every_steps=2)),
    ("dev_f1", "max", dict(best_metric="dev_f1")),
    ("eval_loss", "min", dict()),
  ],
)
def test_best_json_keeps_the_best_by_the_metrics_direction(tmp_path, metric, mode, overrides):
  """A tracker ranked by dev BLEU or F1 keeps the highest scores, by dev loss the lowest;
  best.json lists them best first (ties: the earlier step) with the whole history."""
  workdir = str(tmp_path / "w")
  os.makedirs(workdir)
  scores = {1: 20.0, 2: 25.5, 3: 18.0, 4: 25.5, 5: 30.25, 6: 10.0}
  tracker = best.Tracker(_config(keep_best_checkpoints=3, **overrides), workdir)
  assert tracker.metric == metric and tracker.mode == mode
  for step, score in scores.items():
    tracker.add(step, {metric: score, "other": -1.0})
  record = Workdir(workdir).read_best()
  want = [(5, 30.25), (2, 25.5), (4, 25.5)] if mode == "max" else [(6, 10.0), (3, 18.0), (1, 20.0)]
  assert record["best"] == [dict(step=s, value=v) for s, v in want]
  assert record["metric"] == metric and record["mode"] == mode
  assert record["history"] == [[s, v] for s, v in scores.items()]
  assert tracker.standing.best_steps == [s for s, _ in want]
  # The reader ranks the same way: --checkpoint=best:2 averages the two best.
  assert best.Tracker(_config(keep_best_checkpoints=3, **overrides), workdir).standing == (
    tracker.standing
  )


def test_the_training_loop_protects_the_best_by_bleu_and_stops_where_the_fold_says(tmp_path):
  """trainer._rank, the loop's use of the tracker: after each dev BLEU the highest `keep`
  steps are protected from pruning, an evaluation entering them is saved, and the stop is
  the fold's."""
  import types

  workdir = str(tmp_path / "w")
  os.makedirs(workdir)
  config = _config(bleu_every_steps=2, keep_best_checkpoints=2, patience=3)
  protected = []
  fake = types.SimpleNamespace(
    best=best.Tracker(config, workdir),
    ckpts=types.SimpleNamespace(protect=lambda steps: protected.append(list(steps))),
  )
  bleu = {2: 10.0, 4: 15.0, 6: 12.0, 8: 14.0, 10: 11.0}  # 6, 8, 10: not above 15
  got = [train._rank(fake, step, dict(dev_bleu=score)) for step, score in bleu.items()]
  assert got == [(True, None)] * 4 + [(False, 10)]
  assert protected == [[2], [4, 2], [4, 6], [4, 8], [4, 8]]
  assert train._rank(fake, 12, dict(eval_loss=0.5)) == (False, None)  # no dev BLEU here
  assert len(protected) == 5


def _config(**overrides) -> ml_collections.ConfigDict:
  return small_config(**overrides)


@pytest.mark.parametrize(
  "overrides, message",
  [
    (
      dict(best_metric="bleu"),
      "config.best_metric='bleu' is not one of auto, eval_loss, dev_bleu, dev_f1",
    ),
    (dict(patience=-1), r"config.patience=-1 must be an integer >= 0"),
    (dict(min_delta=-0.5), r"config.min_delta=-0.5 must be a number >= 0"),
    (dict(keep_best_checkpoints=-1), r"config.keep_best_checkpoints=-1 must be"),
    (
      dict(best_metric="dev_bleu"),
      r"config.best_metric=dev_bleu is computed every config.bleu_every_steps",
    ),
    (dict(best_metric="dev_f1", bleu_every_steps=2), r"dev score is dev_bleu"),
  ],
)
def test_bad_best_metric_patience_or_min_delta_is_one_line_naming_the_field(
  overrides, message, tmp_path
):
  with pytest.raises(train.ConfigError, match=message):
    train.train_and_evaluate(_config(**overrides), str(tmp_path / "w"))
  assert not os.path.exists(tmp_path / "w")  # refused before the workdir was made


def test_auto_ranks_by_the_task_dev_score_when_computed_else_the_dev_loss():
  assert best.resolve_metric(_config()) == "eval_loss"
  assert best.resolve_metric(_config(bleu_every_steps=5)) == "dev_bleu"
  assert best.resolve_metric(_config(bleu_every_steps=5, best_metric="eval_loss")) == "eval_loss"


# --- pruning, the record and --checkpoint=best ------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _State:
  """What a checkpoint saves of a TrainState, with small numpy leaves (no model to build)."""

  step: int = 0
  params: dict = dataclasses.field(default_factory=lambda: dict(w=np.zeros((2, 3), np.float32)))
  opt_state: dict = dataclasses.field(default_factory=lambda: dict(mu=np.zeros(3, np.float32)))
  rng: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(2, np.uint32))
  bad_step: int = -1

  def replace(self, **changes):
    return dataclasses.replace(self, **changes)


def _saved_steps(workdir, steps, keep, losses):
  """Saves `steps` with keep_checkpoints=`keep`, recording `losses[step]` as the dev loss
  of the evaluated ones, as the trainer does (rewind on start; record, protect, save); the
  parameters of step s are all s."""
  tracker = best.Tracker(_config(keep_best_checkpoints=1), workdir)
  ckpts = checkpoint.Checkpoints(workdir, keep, owner=True)
  ckpts.protect(tracker.rewind(ckpts.latest_step() or 0).best_steps)
  params = {}
  for step in steps:
    params[step] = dict(w=np.full((2, 3), step, np.float32))
    if step in losses:
      ckpts.protect(tracker.add(step, dict(eval_loss=losses[step])).best_steps)
    ckpts.save(step, _State(step=step, params=params[step]), None)
  ckpts.wait()
  ckpts.close()
  return params


def test_best_checkpoint_survives_pruning_by_recency_and_a_resume(tmp_path):
  workdir = str(tmp_path / "w")
  _saved_steps(workdir, [1, 2, 3, 4], keep=1, losses={2: 1.0, 4: 2.0})
  assert checkpoint.Checkpoints(workdir).steps() == [2, 4]  # the newest and the best
  # A new start reads the best from best.json before its first save, which prunes.
  _saved_steps(workdir, [5, 6], keep=1, losses={6: 1.5})
  assert checkpoint.Checkpoints(workdir).steps() == [2, 6]
  record = Workdir(workdir).read_best()
  assert record["metric"] == "eval_loss" and record["best"] == [dict(step=2, value=1.0)]
  assert record["history"] == [[2, 1.0], [4, 2.0], [6, 1.5]]


def test_checkpoint_best_in_choose_steps_load_params_and_t2t_average(tmp_path):
  workdir = str(tmp_path / "w")
  losses = {1: 2.0, 2: 1.0, 3: 1.5, 4: 3.0}
  config = _config(keep_best_checkpoints=2)
  with pytest.raises(checkpoint.CheckpointSpecError, match="no checkpoint to translate"):
    checkpoint.choose_steps(checkpoint.Checkpoints(str(tmp_path / "empty")), "best")
  params = _saved_steps(workdir, [1, 2, 3, 4], keep=5, losses={})
  ckpts = checkpoint.Checkpoints(workdir)
  with pytest.raises(checkpoint.CheckpointSpecError, match="best.json does not exist"):
    checkpoint.choose_steps(ckpts, "best")
  tracker = best.Tracker(config, workdir)
  for step, loss in losses.items():
    tracker.add(step, dict(eval_loss=loss))
  assert checkpoint.choose_steps(ckpts, "best") == [2]
  assert checkpoint.choose_steps(ckpts, "best:2") == [2, 3]
  got, steps = checkpoint.load_params(workdir, "best", None)
  assert steps == [2]
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(params[2]), strict=True):
    np.testing.assert_array_equal(a, b)
  with pytest.raises(checkpoint.CheckpointSpecError, match=r"records 2 best .* fewer than 3"):
    checkpoint.choose_steps(ckpts, "best:3")
  with pytest.raises(checkpoint.CheckpointSpecError, match="N of best:N must be a positive"):
    checkpoint.choose_steps(ckpts, "best:0")
  # t2t-average --checkpoint=best:2: the float64 mean of steps 2 and 3, as a new workdir.
  Workdir(workdir).write_start(ml_collections.ConfigDict(dict(seed=0)))
  steps, path = average_cli.average(workdir, "best:2", str(tmp_path / "avg"))
  assert steps == [2, 3] and path.endswith(os.path.join("checkpoints", "3"))
  mean = checkpoint.Checkpoints(str(tmp_path / "avg")).restore_params(3)
  for m, a, b in zip(*(jax.tree.leaves(t) for t in (mean, params[2], params[3])), strict=True):
    np.testing.assert_allclose(m, (np.float64(a) + b) / 2, rtol=1e-6)
  # The best step gone (deleted by hand): named, not silently replaced.
  shutil.rmtree(ckpts.path(2))
  with pytest.raises(checkpoint.CheckpointSpecError, match=r"best step\(s\) \[2\] by eval_loss"):
    checkpoint.choose_steps(checkpoint.Checkpoints(workdir), "best")
  # keep_best_checkpoints=0 records none.
  best.Tracker(_config(keep_best_checkpoints=0), workdir).add(9, dict(eval_loss=0.1))
  with pytest.raises(checkpoint.CheckpointSpecError, match="keep_best_checkpoints=0"):
    checkpoint.choose_steps(checkpoint.Checkpoints(workdir), "best")


def test_a_changed_best_metric_is_refused_naming_the_file(tmp_path):
  workdir = str(tmp_path / "w")
  os.makedirs(workdir)
  best.Tracker(_config(), workdir).add(2, dict(eval_loss=1.0))
  with pytest.raises(best.MetricChangedError, match=r"best.json ranks .* by 'eval_loss'"):
    best.Tracker(_config(bleu_every_steps=2), workdir)


# --- real runs ---------------------------------------------------------------------------------

# Evaluations at 2, 4, 6, ...: no dev loss improves on the first by min_delta=10, so the
# second and third count against patience=2: the run stops at step 6 of 20.
EARLY = dict(
  num_train_steps=20,
  eval_every_steps=2,
  checkpoint_every_steps=3,
  patience=2,
  min_delta=10.0,
  **{"data.synthetic_eval_size": 16},
)


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("early") / "w")
  config = small_config(test_at_end=True, beam_size=1, **EARLY)  # greedy: compiles faster
  return workdir, train.train_and_evaluate(config, workdir)


@pytest.mark.slow
def test_early_stop_ends_the_run_normally_and_a_second_start_says_so(stopped, caplog):
  workdir, out = stopped
  assert out["step"] == 6 and out["early_stopped_at"] == 6 and out["stopped_by"] is None
  assert "test_bleu" in out  # the normal end: the test split translated
  record = Workdir(workdir).read_best()
  assert [step for step, _ in record["history"]] == [2, 4, 6]
  assert record["stopped"]["step"] == 6 and record["stopped"]["best_step"] == 2
  assert checkpoint.Checkpoints(workdir).latest_step() == 6
  starts = len(open(Workdir(workdir).starts_file).readlines())
  with caplog.at_level(logging.INFO):
    again = train.train_and_evaluate(small_config(test_at_end=True, **EARLY), workdir)
  assert again["step"] == 6 and again["early_stopped_at"] == 6 and again["stopped_by"] is None
  assert "has stopped: early stop at step 6: eval_loss has not improved" in caplog.text
  assert len(open(Workdir(workdir).starts_file).readlines()) == starts  # nothing trained
  assert checkpoint.Checkpoints(workdir).latest_step() == 6
  # More patience on resume trains on (patience may change on resume).
  more = train.train_and_evaluate(small_config(**{**EARLY, "patience": 3}), workdir)
  assert more["step"] == 8 and more["early_stopped_at"] == 8


@pytest.mark.slow
def test_an_early_stop_ends_the_run_where_an_unstopped_run_of_that_length_ends(stopped, tmp_path):
  """Patience changes nothing but where the run ends: the run stopped at step 6 has the
  parameters, dev losses and test scores of the same run told to train 6 steps."""
  workdir, out = stopped
  config = small_config(test_at_end=True, beam_size=1, **{**EARLY, "patience": 0})
  config.num_train_steps = out["step"]
  plain = str(tmp_path / "plain")
  same = train.train_and_evaluate(config, plain)
  assert same["early_stopped_at"] is None and same["step"] == out["step"] == 6
  for key in ("loss", "eval_loss", "test_bleu", "test_exact_match"):
    assert same[key] == out[key], key
  a, b = checkpoint.Checkpoints(workdir), checkpoint.Checkpoints(plain)
  for x, y in zip(jax.tree.leaves(a.restore_params(6)), jax.tree.leaves(b.restore_params(6))):
    np.testing.assert_array_equal(x, y)
  history = Workdir(workdir).read_best()["history"]
  assert Workdir(plain).read_best()["history"] == history[:3]


@pytest.mark.slow
def test_killed_and_resumed_run_stops_at_the_same_step(stopped, tmp_path):
  """A run that wrote best.json up to its stop at step 6 and was killed before checkpoints 4
  and 6 were committed resumes from 3, forgets the evaluations after 3 (it has not stopped
  yet), does them again and stops at 6 with the uninterrupted run's evaluations, bit for
  bit."""
  straight, _ = stopped
  split = str(tmp_path / "split")
  train.train_and_evaluate(small_config(**EARLY), split)
  assert Workdir(split).read_best()["stopped"]["step"] == 6
  ckpts = checkpoint.Checkpoints(split)
  assert ckpts.steps() == [2, 3, 4, 6]  # 2 and 4 entered the best, 3 is due, 6 is the last
  for step in (4, 6):  # the kill: neither was committed
    shutil.rmtree(ckpts.path(step))
  out = train.train_and_evaluate(small_config(**EARLY), split)
  with open(Workdir(split).starts_file, encoding="utf-8") as f:
    assert [json.loads(line)["step"] for line in f] == [0, 3]
  assert out["step"] == 6 and out["early_stopped_at"] == 6
  # The straight run's first three evaluations (another test may have trained it on).
  assert Workdir(split).read_best()["history"] == Workdir(straight).read_best()["history"][:3]
