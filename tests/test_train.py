"""The trainer: pmap equivalence, exact resume, SIGTERM, experiments, and bad input."""

import functools
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from t2t_jax import data
from t2t_jax.cli import common as cli
from t2t_jax.experiments import tiny
from t2t_jax.model import Transformer, TransformerConfig
from t2t_jax.run import checkpoint, fingerprint
from t2t_jax.run.workdir import read_metrics
from t2t_jax.training import config as config_lib
from t2t_jax.training import optim, parallel, steps, summary
from t2t_jax.training import trainer as train
from tests import support

CFG = TransformerConfig(**support.SMALL_MODEL)


def small_config(**overrides):
  config = tiny.get_config()
  config.model.update(d_model=32, d_ff=64, num_layers=1, max_len=16)
  config.data.update(
    synthetic_train_size=2000,
    synthetic_eval_size=64,
    synthetic_max_len=8,
    tokens_per_batch=1024,
    max_len=16,
  )
  config.update(
    num_train_steps=6,
    warmup_steps=10,
    log_every_steps=1,
    eval_every_steps=3,
    checkpoint_every_steps=3,
    test_at_end=False,
  )
  for key, value in overrides.items():
    target = config
    *path, leaf = key.split(".")
    for p in path:
      target = target[p]
    target[leaf] = value
  return config


def _random_global_batch(rows=16, length=8, seed=0):
  rng = np.random.default_rng(seed)
  inputs = rng.integers(4, 40, size=(rows, length)).astype(np.int32)
  targets = rng.integers(4, 40, size=(rows, length)).astype(np.int32)
  for r in range(rows):  # ragged lengths so the token weighting matters
    inputs[r, rng.integers(2, length) :] = 0
    targets[r, rng.integers(2, length) :] = 0
  return dict(inputs=inputs, targets=targets)


def _split(batch, n):
  return {k: v.reshape((n, -1) + v.shape[1:]) for k, v in batch.items()}


@pytest.mark.slow
def test_eight_devices_equal_one_device(small_state):
  assert jax.local_device_count() == 8, "tests run with 8 simulated CPU devices (conftest)"
  model, state = small_state()
  schedule = optim.optimizer_schedule(CFG.d_model, 4)
  batch = _random_global_batch()
  step8 = parallel.pmap_train_step(model, 0.1, schedule)
  step1 = jax.pmap(
    functools.partial(steps.train_step, model=model, label_smoothing=0.1, schedule=schedule),
    axis_name=parallel.AXIS,
    devices=jax.local_devices()[:1],
  )
  s8, m8 = step8(parallel.replicate(state), parallel.shard(_split(batch, 8)))
  s1, m1 = step1(jax.tree.map(lambda x: np.asarray(x)[None], state), _split(batch, 1))
  p8, p1 = parallel.unreplicate(s8.params), jax.tree.map(lambda x: np.asarray(x[0]), s1.params)
  moved = max(
    float(np.max(np.abs(a - b)))
    for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(jax.device_get(state.params)))
  )
  assert moved > 1e-4  # the step did change the parameters
  for a, b in zip(jax.tree.leaves(p8), jax.tree.leaves(p1)):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(m8["loss"])[0], np.asarray(m1["loss"])[0], rtol=1e-5)
  assert float(np.asarray(m8["denominator"])[0]) == float((batch["targets"] != 0).sum())


@pytest.mark.slow
def test_gradient_accumulation_equals_one_big_batch(small_state):
  model, state = small_state()
  schedule = optim.optimizer_schedule(CFG.d_model, 4)
  batch = _split(_random_global_batch(rows=32), 8)  # [8, 4, L]
  halves = [{k: v[:, i * 2 : (i + 1) * 2] for k, v in batch.items()} for i in range(2)]
  fused = parallel.pmap_train_step(model, 0.1, schedule)
  s_big, _ = fused(parallel.replicate(state), parallel.shard(batch))
  accum = parallel.pmap_zero_accumulator()(parallel.replicate(state).params)
  p_state = parallel.replicate(state)
  acc_step = parallel.pmap_accumulate_step(model, 0.1)
  for i, half in enumerate(halves):
    accum = acc_step(p_state, accum, parallel.shard(half), i)
  s_acc, _ = parallel.pmap_apply_step(schedule)(p_state, accum)
  for a, b in zip(
    jax.tree.leaves(parallel.unreplicate(s_acc.params)),
    jax.tree.leaves(parallel.unreplicate(s_big.params)),
  ):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)


def _host_copy(tree):
  return jax.tree.map(lambda x: np.array(x, copy=True), jax.device_get(tree))


def _assert_same_bits(got, want):
  """Equal dtype, shape and bytes leaf by leaf (NaNs included, which == cannot compare)."""
  got_leaves, want_leaves = jax.tree.leaves(got), jax.tree.leaves(want)
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for a, b in zip(got_leaves, want_leaves, strict=True):
    a, b = np.asarray(a), np.asarray(b)
    assert (a.dtype, a.shape) == (b.dtype, b.shape) and a.tobytes() == b.tobytes()


def test_non_finite_loss_skips_update_and_names_step(small_state):
  model, state = small_state()
  schedule = optim.optimizer_schedule(CFG.d_model, 4)
  p_state = parallel.replicate(
    state.replace(
      params=jax.tree.map(
        lambda x: x * jnp.nan if x.ndim == 2 and x.shape == (40, 32) else x, state.params
      )
    )
  )
  before = _host_copy((p_state.params, p_state.opt_state))  # the step donates its input
  batch = parallel.shard(_split(_random_global_batch(), 8))
  step = parallel.pmap_train_step(model, 0.1, schedule)
  new, metrics = step(p_state, batch)
  assert not np.isfinite(np.asarray(metrics["loss"])[0])
  # Neither the parameters nor Adam's moments and update count moved, on any device.
  _assert_same_bits(_host_copy((new.params, new.opt_state)), before)
  # The step counter still advances with the batches (the host loop counts the same steps,
  # and the dropout keys fold it in); bad_step names the first bad step, counted from 1.
  np.testing.assert_array_equal(np.asarray(new.step), np.full(8, 1))
  np.testing.assert_array_equal(np.asarray(new.bad_step), np.full(8, 1))
  assert float(np.asarray(metrics["learning_rate"])[0]) == float(schedule(0))
  again, _ = step(new, batch)
  _assert_same_bits(_host_copy((again.params, again.opt_state)), before)
  np.testing.assert_array_equal(np.asarray(again.step), np.full(8, 2))
  np.testing.assert_array_equal(np.asarray(again.bad_step), np.full(8, 1))  # the first one
  trainer = train.Trainer.__new__(train.Trainer)
  trainer.last_saved, trainer.ckpts = 3, type("C", (), {"directory": "/w/checkpoints"})()
  with pytest.raises(
    train.NonFiniteLossError, match=r"non-finite loss or gradient at step 1.*step 3\) is kept"
  ):
    trainer.check_finite(again)


@pytest.mark.slow
def test_resume_is_exact(tmp_path):
  """2N steps straight == N steps, stop, resume N steps: same params and logged losses."""
  config = small_config(**{"model.dropout_rate": 0.2})
  straight, split = str(tmp_path / "straight"), str(tmp_path / "split")
  train.train_and_evaluate(config, straight)
  half = small_config(**{"model.dropout_rate": 0.2, "num_train_steps": 3})
  train.train_and_evaluate(half, split)
  train.train_and_evaluate(config, split)  # resumes from step 3
  losses = lambda w: [(r["step"], r["loss"]) for r in read_metrics(w) if "loss" in r]
  assert losses(straight) == losses(split)
  assert len(losses(straight)) == 6
  ref = checkpoint.Checkpoints(straight).restore_params(6)
  got = checkpoint.Checkpoints(split).restore_params(6)
  for x, y in zip(jax.tree.leaves(ref), jax.tree.leaves(got)):
    np.testing.assert_array_equal(x, y)
  with open(os.path.join(straight, "config.json")) as f:
    assert json.load(f)["model"]["dropout_rate"] == 0.2


@pytest.mark.slow
def test_checkpoint_of_another_model_is_refused(tmp_path):
  workdir = str(tmp_path / "w")
  train.train_and_evaluate(small_config(num_train_steps=3), workdir)
  before = sorted(os.listdir(os.path.join(workdir, "checkpoints")))
  with pytest.raises(
    fingerprint.FingerprintError,
    match=r"checkpoints/3 was trained with config.model.d_ff=64, but this start has "
    r"config.model.d_ff=128",
  ):
    train.train_and_evaluate(small_config(**{"model.d_ff": 128, "num_train_steps": 6}), workdir)
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == before


def test_unwritable_workdir_fails_before_training(tmp_path):
  blocker = tmp_path / "file"
  blocker.write_text("x")
  with pytest.raises(OSError, match=r"--workdir=.*file/sub is not writable"):
    train.train_and_evaluate(small_config(), str(blocker / "sub"))


SMALL_EXPERIMENT_MODEL = dict(
  d_model=16,
  d_ff=32,
  num_heads=2,
  num_layers=1,
  num_encoder_layers=0,
  num_decoder_layers=0,
  max_len=16,
  dtype="float32",
  attention_impl="reference",
)


@pytest.mark.slow
@pytest.mark.parametrize("name", cli.available_experiments())
def test_every_experiment_builds_and_steps(name, tmp_path, monkeypatch):
  """One step of each experiment, made small: the trainer builds the model, loss and
  schedule the experiment file asks for (its dropout, norm, positions, sharing, d_k/d_v,
  label smoothing, warmup and rate factor), the first loss is an untrained model's, and the
  metrics, config and checkpoint are written."""
  experiment = main_config(name)
  config = main_config(name)
  config.model.update(SMALL_EXPERIMENT_MODEL)
  config.data.update(
    source="synthetic",
    synthetic_train_size=200,
    synthetic_eval_size=16,
    synthetic_max_len=6,
    tokens_per_batch=256,
    max_len=16,
    pack_len=16,
    bucket_boundaries=(8, 16),
    source_bucket_boundaries=(),  # the experiment's own match its bucket_boundaries only
  )
  config.update(num_train_steps=1, checkpoint_every_steps=1, eval_every_steps=1, grad_accum_steps=1)
  built, initial, train_steps = [], [], []
  build_model, init_state = train.build_model, train.init_state
  pmap_train_step = parallel.pmap_train_step
  monkeypatch.setattr(train, "build_model", lambda *a: built.append(build_model(*a)) or built[-1])
  monkeypatch.setattr(train, "init_state", lambda *a: initial.append(init_state(*a)) or initial[-1])
  monkeypatch.setattr(
    parallel,
    "pmap_train_step",
    lambda *a: train_steps.append(a) or pmap_train_step(*a),
  )
  workdir = str(tmp_path / name)
  out = train.train_and_evaluate(config, workdir)
  assert out["step"] == 1 and np.isfinite(out["loss"])

  ((model, cfg),) = built
  assert model.config is cfg
  want = dict(experiment.model.to_dict(), **SMALL_EXPERIMENT_MODEL)
  for field, value in want.items():
    got = getattr(cfg, field)
    assert got == (jnp.dtype(value) if field == "dtype" else value), (field, got, value)
  ((step_model, label_smoothing, schedule),) = train_steps
  assert step_model is model and label_smoothing == experiment.label_smoothing
  # Eq. 3 at step 1, written out: factor * d_model^-0.5 * min(1, 1 * warmup^-1.5), the rate
  # logged and the one Adam applied: its first update is lr * g / (|g| + eps), so parameters
  # that start at 0 (biases) move by lr where their gradient is well above eps = 1e-9.
  rate = experiment.learning_rate_factor * 16**-0.5 * experiment.warmup_steps**-1.5
  assert out["learning_rate"] == pytest.approx(rate, rel=1e-6)
  assert float(schedule(0)) == pytest.approx(rate, rel=1e-6)
  saved = checkpoint.Checkpoints(workdir).restore_params(1)
  before_step = jax.device_get(initial[0].params)
  moved = max(
    float(np.max(np.abs(np.asarray(after) - before)))
    for after, before in zip(jax.tree.leaves(saved), jax.tree.leaves(before_step), strict=True)
    if not np.any(before)
  )
  assert moved == pytest.approx(rate, rel=1e-3)
  # Before its first update the model guesses: per-token NLL near log(vocabulary size).
  assert abs(out["nll"] - np.log(cfg.vocab_size)) < 1.0, (out["nll"], cfg.vocab_size)
  assert 0 < out["tokens"] <= config.data.tokens_per_batch

  records = read_metrics(workdir)
  logged = [r for r in records if "loss" in r]
  assert [r["step"] for r in logged] == [1]
  assert logged[0]["loss"] == pytest.approx(out["loss"]) and "eval_loss" in logged[0]
  assert np.isfinite(logged[0]["eval_loss"])
  with open(os.path.join(workdir, "config.json")) as f:
    assert json.load(f)["model"]["dropout_rate"] == experiment.model.dropout_rate
  # The checkpoint holds the parameters of that model: the tree and every shape.
  expected = Transformer(TransformerConfig(**want, vocab_size=cfg.vocab_size))
  dummy = jnp.ones((1, 8), jnp.int32)
  shapes = jax.eval_shape(lambda: expected.init(jax.random.PRNGKey(0), dummy, dummy)["params"])
  assert jax.tree.map(lambda x: (x.shape, x.dtype), saved) == jax.tree.map(
    lambda x: (x.shape, x.dtype), shapes
  )


def main_config(name):
  path, _, arg = cli.experiment_path(name).partition(":")
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg) if arg else module.get_config()


def test_table3_rows_and_multi30k_directions():
  from t2t_jax.experiments import table3

  for row in table3.VARIANTS:
    config = main_config(f"table3:{row}")
    cfg = TransformerConfig.from_dict(config.model.to_dict(), vocab_size=37000)
    assert config.variant == row and cfg.d_model in (256, 512, 1024)
  assert main_config("table3:B1").model.d_k == 16
  assert main_config("table3:D3").label_smoothing == 0.0
  with pytest.raises(ValueError, match="unknown row 'Z9'"):
    main_config("table3:Z9")
  de_en = main_config("multi30k:de-en")
  assert de_en.data.train_source.endswith("train.de") and de_en.data.test_target.endswith(
    "test2016.en"
  )


def test_base_experiment_takes_the_typed_defaults():
  """experiments/base.py restates no model or training default: each is written once."""
  from t2t_jax.experiments import base

  config = base.get_config()
  assert config.model.to_dict() == TransformerConfig.defaults()
  training = config_lib.TrainConfig.defaults()
  assert {name: config[name] for name in training} == training


def test_fields_an_older_config_lacks_take_the_typed_defaults():
  """A config.json written before a field existed reads as if it had the field's default."""
  config = small_config(test_at_end=True, select_checkpoints="latest")
  assert config_lib.with_defaults(config) is config
  old = config.to_dict()
  for name in ("test_at_end", "select_checkpoints", "train_time_limit_minutes"):
    del old[name]
  del old["model"]["loss_chunk_tokens"]
  del old["data"]["data_dir"], old["data"]["prepared_store"], old["beam_stop"]
  filled = config_lib.with_defaults(ml_collections.ConfigDict(old))
  assert filled.test_at_end is False and filled.select_checkpoints == ""
  assert filled.data.data_dir == "" and filled.data.prepared_store is True
  assert filled.beam_stop == "exact"
  assert filled.train_time_limit_minutes == 0.0 and filled.model.loss_chunk_tokens == 512
  assert filled.model.d_model == 32 and filled.num_train_steps == 6


def _cli(*args, **kw):
  env = support.cpu_env(devices=2)
  return subprocess.Popen(
    [sys.executable, "-m", "t2t_jax.cli.train", *args],
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
    **kw,
  )


@pytest.mark.slow
def test_cli_bad_experiment_and_override(tmp_path):
  workdir = tmp_path / "w"
  workdir.mkdir()
  cases = [
    ["nope", "train", ["--experiment=nope", f"--workdir={workdir}"]],
    ["field", "train", ["--experiment=tiny", f"--workdir={workdir}", "--config.model.d_modle=8"]],
    [
      "value",
      "train",
      ["--experiment=tiny", f"--workdir={workdir}", "--config.num_train_steps=abc"],
    ],
  ]
  out = support.forked_commands(cases, str(workdir), str(tmp_path))  # one interpreter
  assert all(out[name]["status"] == 2 for name, *_ in cases), out  # a wrong command line
  assert "--experiment=nope: unknown experiment; available:" in out["nope"]["stderr"]
  assert "tiny" in out["nope"]["stderr"]
  assert "d_modle" in out["field"]["stderr"] and "num_train_steps" in out["value"]["stderr"]
  assert os.listdir(workdir) == []  # refused before touching the workdir


@pytest.mark.slow
def test_sigterm_saves_and_resumes(tmp_path):
  workdir = str(tmp_path / "w")
  args = [
    "--experiment=tiny",
    f"--workdir={workdir}",
    "--config.num_train_steps=100000",
    "--config.log_every_steps=5",
    "--config.checkpoint_every_steps=100000",
    "--config.eval_every_steps=100000",
    "--config.model.d_model=32",
    "--config.model.d_ff=64",
    "--config.model.num_layers=1",
    "--config.data.synthetic_train_size=2000",
    "--config.data.synthetic_eval_size=16",  # the closing translations are not under test
  ]
  proc = _cli(*args)
  metrics = os.path.join(workdir, "metrics.jsonl")
  deadline = time.time() + 240
  while not (os.path.exists(metrics) and '"loss"' in open(metrics).read()):
    assert proc.poll() is None and time.time() < deadline, proc.communicate()[0]
    time.sleep(0.5)
  proc.send_signal(signal.SIGTERM)
  out, _ = proc.communicate(timeout=120)
  assert proc.returncode == 75, out  # EX_TEMPFAIL: stopped and saved, rerun to resume
  assert "SIGTERM received: saved step" in out
  saved = checkpoint.Checkpoints(workdir).latest_step()
  assert saved is not None and saved >= 5
  resumed = _cli(
    *[a.replace("100000", str(saved + 2), 1) if "num_train_steps" in a else a for a in args]
  )
  out, _ = resumed.communicate(timeout=240)
  assert resumed.returncode == 0, out
  assert "resumed from" in out and checkpoint.Checkpoints(workdir).latest_step() == saved + 2


def test_no_recompilation_after_the_first_step(small_state):
  from t2t_jax.bench.timing import CompileCounter

  model, state = small_state()
  step = parallel.pmap_train_step(model, 0.1, optim.optimizer_schedule(CFG.d_model, 4))
  batch = parallel.shard(_split(_random_global_batch(), 8))
  p_state, _ = step(parallel.replicate(state), batch)
  counter = CompileCounter()
  for _ in range(3):
    p_state, metrics = step(p_state, parallel.shard(_split(_random_global_batch(seed=1), 8)))
  jax.block_until_ready(metrics)
  assert counter.count == 0


@pytest.mark.slow
def test_test_split_is_scored_on_averaged_checkpoints(tmp_path, caplog):
  caplog.set_level("INFO")
  config = small_config(
    num_train_steps=4,
    checkpoint_every_steps=2,
    eval_every_steps=100,
    average_checkpoints=2,
    test_at_end=True,
    select_checkpoints="",
  )
  out = train.train_and_evaluate(config, str(tmp_path / "w"))
  assert "test: parameters from average:2 = checkpoint(s) [2, 4]" in caplog.text
  assert 0.0 <= out["test_exact_match"] <= 1.0 and "test_bleu" in out


@pytest.mark.slow
def test_checkpoint_selected_on_dev_then_used_for_test(tmp_path, caplog):
  caplog.set_level("INFO")
  config = small_config(
    num_train_steps=6,
    checkpoint_every_steps=2,
    eval_every_steps=100,
    test_at_end=True,
    select_checkpoints="latest, average:2,average:9",
  )
  workdir = str(tmp_path / "w")
  out = train.train_and_evaluate(config, workdir)
  with open(os.path.join(workdir, "selected.json")) as f:
    chosen = json.load(f)
  # average:9 cannot be built from 3 checkpoints and is skipped, not an error.
  assert sorted(chosen["dev_bleu"]) == ["average:2", "latest"]
  best = max(chosen["dev_bleu"], key=chosen["dev_bleu"].get)
  assert chosen["checkpoint"] == best
  assert chosen["steps"] == {"latest": [6], "average:2": [4, 6]}[best]
  assert chosen["dev_sentences"] == config.data.synthetic_eval_size
  assert f"test: parameters from {best}" in caplog.text and "test_bleu" in out
  from t2t_jax.decoding import translator as translate

  t = translate.Translator.from_workdir(workdir, "selected")
  assert t.checkpoint_steps == chosen["steps"]
  report = summary.run_summary(workdir)
  assert report["steps"] == 6 and report["train_minutes"] > 0 and not report["resumed"]
  assert report["selected"]["checkpoint"] == best and report["test_bleu"] == out["test_bleu"]
  assert f"| {workdir} | 6 |" in summary._row(report)


@pytest.mark.slow
def test_time_limit_stops_saves_and_tests(tmp_path):
  config = small_config(
    num_train_steps=1000,
    log_every_steps=2,
    checkpoint_every_steps=500,
    train_time_limit_minutes=1e-6,
    test_at_end=True,
  )
  out = train.train_and_evaluate(config, str(tmp_path / "w"))
  # One process checks the limit after every step, not only at logging steps (every 2).
  assert out["step"] == 1 and out["time_limit_reached"] and "test_bleu" in out
  assert "test_lowercased_bleu" in out
  # The test scores are recorded at the step reached, not at num_train_steps.
  records = [json.loads(line) for line in (tmp_path / "w" / "metrics.jsonl").open()]
  assert [r["step"] for r in records if "test_bleu" in r] == [1]
  # The test translations are kept, one line per test pair.
  lines = (tmp_path / "w" / f"test.{data.target_language(config.data)}").read_text().splitlines()
  assert len(lines) == config.data.synthetic_eval_size
  assert checkpoint.Checkpoints(str(tmp_path / "w")).steps() == [1]


@pytest.mark.slow
@pytest.mark.parametrize("share", [True, False])
def test_chunked_output_loss_step_equals_whole_logits_step(share, small_state):
  """The fused, chunked pre-softmax layer + loss gives the update of the plain one."""
  results = []
  for chunk in (0, 5):
    model, state = small_state(loss_chunk_tokens=chunk, share_embeddings=share, dropout_rate=0.1)
    step = parallel.pmap_train_step(model, 0.1, optim.optimizer_schedule(CFG.d_model, 4))
    s, m = step(parallel.replicate(state), parallel.shard(_split(_random_global_batch(), 8)))
    results.append((parallel.unreplicate(s.params), jax.device_get(m)))
  (p0, m0), (p5, m5) = results
  for a, b in zip(jax.tree.leaves(p0), jax.tree.leaves(p5)):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)
  for key in ("loss", "nll", "correct", "denominator", "grad_norm"):
    np.testing.assert_allclose(m0[key][0], m5[key][0], rtol=1e-5)


def test_bad_selection_candidate_names_the_config_field(tmp_path):
  config = small_config(
    num_train_steps=2,
    checkpoint_every_steps=2,
    eval_every_steps=100,
    test_at_end=True,
    select_checkpoints="latest,newest",
  )
  with pytest.raises(
    train.ConfigError, match="config.select_checkpoints='latest,newest': candidate 'newest'"
  ):
    train.train_and_evaluate(config, str(tmp_path / "w"))
  assert not (tmp_path / "w").exists()  # refused before training, not after it
