"""The exponential moving average of the parameters (config.ema_decay): its arithmetic against a
float64 numpy recurrence over the parameters each step produced, the same average on 8
devices as on 1, an exact resume, and its reading as the checkpoint spec 'ema'."""

import functools

import jax
import numpy as np
import optax
import pytest

from t2t_jax.decoding.config import SearchConfig
from t2t_jax.run import checkpoint
from t2t_jax.training import checks, evaluation, optim, parallel, steps
from t2t_jax.training import trainer as train
from tests import support
from tests.test_quick_equivalences import _tiny_run
from tests.test_train import _random_global_batch, _split

DECAY = 0.5  # reached by the warmup (1 + t) / (10 + t) at t = 8: both regimes in 10 steps
LABEL_SMOOTHING = 0.1
NUM_STEPS = 10


def _reference_decay(decay: float, t: int) -> float:
  """min(decay, (1 + t) / (10 + t)) for the update numbered t from 0, in float64."""
  return min(decay, (1.0 + t) / (10.0 + t))


@pytest.fixture(scope="module")
def ema_training():
  """(model, host state with SGD and an EMA, schedule, the 8-device step, 10 global batches)."""
  model, params = support.small_model()
  state = steps.TrainState.create(params, optax.sgd(0.5), jax.random.PRNGKey(1), DECAY)
  schedule = optim.optimizer_schedule(model.config.d_model, 4)
  fused = parallel.pmap_train_step(model, LABEL_SMOOTHING, schedule)
  batches = [_random_global_batch(rows=16, seed=seed) for seed in range(NUM_STEPS)]
  return model, jax.device_get(state), schedule, fused, batches


def _leaves(tree) -> list[np.ndarray]:
  return [np.asarray(x) for x in jax.tree.leaves(tree)]


def test_ema_equals_a_float64_recurrence_over_the_parameters(ema_training):
  """Ten 8-device steps: after each, the kept average equals
  ema_t = d_t ema_{t-1} + (1 - d_t) params_t (d_t = min(0.5, (1+t)/(10+t)), ema_0 = the
  initial parameters) computed in float64 from the parameters the steps produced, and every
  device holds the same average, bit for bit."""
  _, state, _, fused, batches = ema_training
  assert state.ema is not None and state.ema_decay == DECAY
  reference = [x.astype(np.float64) for x in _leaves(state.params)]
  p_state = parallel.replicate(state)
  for t, batch in enumerate(batches):
    p_state, _ = fused(p_state, parallel.shard(_split(batch, 8)))
    params = _leaves(parallel.unreplicate(p_state.params))
    d = _reference_decay(DECAY, t)
    reference = [d * e + (1.0 - d) * p.astype(np.float64) for e, p in zip(reference, params)]
    got = _leaves(parallel.unreplicate(p_state.ema))
    for g, r in zip(got, reference, strict=True):
      np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-7, err_msg=f"step {t + 1}")
  apart = max(float(np.max(np.abs(g - p))) for g, p in zip(got, params))
  assert apart > 1e-3  # the average lags the parameters: it is not a copy of them
  for leaf in jax.tree.leaves(jax.device_get(p_state.ema)):
    for device in range(1, 8):
      np.testing.assert_array_equal(leaf[device], leaf[0])


def test_ema_on_eight_devices_equals_one_device(ema_training):
  """Three steps of a global batch split over 8 devices give the average that the whole
  batch on one device gives."""
  model, state, schedule, fused, batches = ema_training
  p8 = parallel.replicate(state)
  step1 = jax.pmap(
    functools.partial(
      steps.train_step, model=model, label_smoothing=LABEL_SMOOTHING, schedule=schedule
    ),
    axis_name=parallel.AXIS,
    devices=jax.local_devices()[:1],
  )
  s1 = jax.tree.map(lambda x: np.asarray(x)[None], state)
  for batch in batches[:3]:
    p8, _ = fused(p8, parallel.shard(_split(batch, 8)))
    s1, _ = step1(s1, _split(batch, 1))
    s1 = jax.device_get(s1)
  ema8 = _leaves(parallel.unreplicate(p8.ema))
  ema1 = [x[0] for x in _leaves(s1.ema)]
  moved = max(float(np.max(np.abs(a - b))) for a, b in zip(ema1, _leaves(state.params)))
  assert moved > 1e-4
  for a, b in zip(ema8, ema1, strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_ema_off_keeps_no_average():
  """ema_decay 0 (the default) adds nothing to the state, so checkpoints hold what runs
  without the option always held."""
  _, params = support.small_model()
  state = steps.TrainState.create(params, optax.sgd(0.1), jax.random.PRNGKey(1))
  assert state.ema is None
  assert "ema" not in checkpoint.state_tree(state)


def _config(num_train_steps: int):
  config = _tiny_run(num_train_steps)
  config.ema_decay = 0.9
  return config


@pytest.fixture(scope="module")
def ema_workdirs(tmp_path_factory):
  """(straight, split): 4 steps straight, and 2 steps then a resume to 4, with an EMA."""
  root = tmp_path_factory.mktemp("ema")
  straight, split = str(root / "straight"), str(root / "split")
  train.train_and_evaluate(_config(4), straight)
  train.train_and_evaluate(_config(2), split)
  train.train_and_evaluate(_config(4), split)
  return straight, split


def test_resume_with_ema_is_bit_identical(ema_workdirs):
  """2 steps, saved, resumed to 4 == 4 steps straight: the average and the parameters, bit
  for bit (the average is saved and restored, not restarted from the parameters)."""
  straight, split = ema_workdirs
  for item in ("params", checkpoint.EMA):
    ref = checkpoint.Checkpoints(straight).restore_params(4, item=item)
    got = checkpoint.Checkpoints(split).restore_params(4, item=item)
    for x, y in zip(jax.tree.leaves(ref), jax.tree.leaves(got), strict=True):
      np.testing.assert_array_equal(x, y)


def test_checkpoint_spec_ema_reads_the_average(ema_workdirs):
  """--checkpoint=ema reads the latest checkpoint's average, which differs from its
  parameters; the dev selection takes 'ema' as a candidate."""
  straight, _ = ema_workdirs
  ema, steps_used = checkpoint.load_params(straight, "ema", None)
  latest, _ = checkpoint.load_params(straight, "latest", None)
  assert steps_used == [4]
  assert any(not np.array_equal(a, b) for a, b in zip(_leaves(ema), _leaves(latest)))
  ckpts = checkpoint.Checkpoints(straight)
  scores = {"latest": 1.0, "ema": 2.0}
  selection = evaluation.select_checkpoint(
    ckpts,
    "latest,ema",
    [],
    lambda spec: spec,
    SearchConfig(beam_size=1),
    lambda spec, *_: scores[spec],
  )
  assert selection.best == "ema" and selection.steps["ema"] == [4]


def test_the_commands_take_checkpoint_ema_and_translate_with_the_average(
  ema_workdirs, tmp_path, monkeypatch
):
  """The commands' early --checkpoint check lets 'ema' through (a pattern without it once
  refused it before any workdir was read), and `t2t-translate --checkpoint=ema` writes the
  moving average's translations, not the latest parameters'."""
  from t2t_jax import data
  from t2t_jax.cli import common
  from t2t_jax.decoding.translator import Translator, load_config
  from tests.test_sampling import _translate

  for tool in ("t2t-translate", "t2t-score", "t2t-export", "t2t-average", "t2t-bench"):
    common.check_checkpoint_flag(tool, "ema")
  straight, _ = ema_workdirs
  pairs = data.get_datasets(load_config(straight).data, straight).test_pairs[:16]
  source, output = tmp_path / "test.src", tmp_path / "test.out"
  source.write_text("".join(s + "\n" for s, _ in pairs))
  _translate(
    monkeypatch,
    f"--workdir={straight}",
    "--checkpoint=ema",
    "--scores",
    f"--input={source}",
    f"--output={output}",
  )
  lines = [s for s, _ in pairs]

  def scores(spec: str) -> list[float]:
    found = Translator.from_workdir(straight, spec).translate(lines, nbest=1)
    return [hyps[0].score for hyps in found]

  written = [float(line.split("\t")[0]) for line in output.read_text().splitlines()]
  np.testing.assert_allclose(written, scores("ema"), rtol=1e-4)
  # A 4-step model's outputs are all empty: their scores tell the parameters apart.
  assert not np.allclose(written, scores("latest"), rtol=1e-4)


def test_t2t_average_of_ema_writes_the_average(ema_workdirs, tmp_path):
  """t2t-average --checkpoint=ema writes the moving average as the new workdir's parameters."""
  straight, _ = ema_workdirs
  out = str(tmp_path / "ema_out")
  checkpoint.write_averaged_workdir(straight, [4], out, checkpoint.spec_item("ema"))
  written, _ = checkpoint.load_params(out, "latest", None)
  ema, _ = checkpoint.load_params(straight, "ema", None)
  for a, b in zip(_leaves(written), _leaves(ema), strict=True):
    np.testing.assert_array_equal(a, b)


def test_checkpoint_spec_ema_without_an_average_says_so():
  """A run trained without an EMA: --checkpoint=ema is a one-line CheckpointSpecError naming
  the checkpoint and the config field."""
  workdir = support.small_trained_workdir()
  with pytest.raises(checkpoint.CheckpointSpecError, match=r"no moving average.*ema_decay"):
    checkpoint.load_params(workdir, "ema", None)


def test_a_checkpoint_without_ema_restores_into_a_run_with_one(ema_workdirs):
  """A checkpoint saved without an average (an older run) restores into a state that keeps
  one (the average starts at its parameters), and one saved with an average restores into
  a state that keeps none."""
  straight, _ = ema_workdirs
  workdir = support.small_trained_workdir()
  ckpts = checkpoint.Checkpoints(workdir)
  step = ckpts.steps()[-1]
  restored, _ = ckpts.restore(step, _host_state(ckpts, step, ema_decay=0.9))
  for e, p in zip(_leaves(restored.ema), _leaves(restored.params), strict=True):
    np.testing.assert_array_equal(e, p)
  assert int(restored.step) == step
  ema_ckpts = checkpoint.Checkpoints(straight)
  restored, _ = ema_ckpts.restore(4, _host_state(ema_ckpts, 4, ema_decay=0.0))
  assert restored.ema is None and int(restored.step) == 4


def _host_state(ckpts: checkpoint.Checkpoints, step: int, ema_decay: float) -> steps.TrainState:
  """A fresh Adam state shaped like checkpoint `step`'s parameters."""
  params = ckpts.restore_params(step)
  tx = optim.make_optimizer(32, 10)  # the optimizer state's structure is all that matters
  return steps.TrainState.create(params, tx, jax.random.PRNGKey(0), ema_decay)


def test_ema_decay_outside_zero_one_is_refused():
  config = _config(2)
  config.ema_decay = 1.0
  with pytest.raises(train.ConfigError, match=r"config\.ema_decay=1\.0 must be in \[0, 1\)"):
    checks.check(config)
