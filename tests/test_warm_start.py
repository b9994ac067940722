"""Warm start (config.init_from): a child run begins at step 0 from a parent workdir's
checkpoint, with the parent's vocabulary; its own checkpoint wins on a restart; bad input is
refused before anything compiles.

The parent is one 3-step run (checkpoints 1, 2, 3) made once per test run. Most tests stop the
child at the start of its training loop (the state it would train from) instead of training.
"""

import json
import os
import shutil

import jax
import ml_collections
import numpy as np
import optax
import pytest

from t2t_jax.model import TransformerConfig
from t2t_jax.run import checkpoint
from t2t_jax.run.files import sha256_file
from t2t_jax.training import config as config_lib
from t2t_jax.training import trainer as train
from t2t_jax.training import warm_start
from tests import support
from tests.test_train import small_config


def _make_parent(path: str) -> None:
  train.train_and_evaluate(small_config(num_train_steps=3, checkpoint_every_steps=1), path)


@pytest.fixture(scope="module")
def parent() -> str:
  """A finished 3-step workdir (read only: the tests copy it before changing anything)."""
  return support.made_once("warm_start_parent", _make_parent)


class _AtLoopStartError(Exception):
  pass


def _start_state(monkeypatch, config, workdir):
  """(host state, fingerprint) the trainer would begin its loop with, stopping there."""
  seen = {}

  def loop(trainer, state, train_iter, *_):
    seen["state"], seen["fingerprint"] = jax.device_get(state), trainer.fingerprint
    raise _AtLoopStartError

  monkeypatch.setattr(train, "_loop", loop)
  with pytest.raises(_AtLoopStartError):
    train.train_and_evaluate(config, workdir)
  return seen["state"], seen["fingerprint"]


def _assert_trees_equal(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _adam(opt_state):
  (adam,) = [s for s in opt_state if isinstance(s, optax.ScaleByAdamState)]
  (schedule,) = [s for s in opt_state if isinstance(s, optax.ScaleByScheduleState)]
  return adam, schedule


@pytest.mark.slow
def test_child_starts_from_the_parents_latest_parameters_with_a_fresh_optimizer(
  parent, tmp_path, monkeypatch
):
  child = str(tmp_path / "child")
  # Dropout, label smoothing and the warmup may change; the shapes stay.
  config = small_config(
    init_from=parent,
    label_smoothing=0.2,
    warmup_steps=50,
    **{"model.dropout_rate": 0.3},
  )
  state, fp = _start_state(monkeypatch, config, child)
  wanted = checkpoint.Checkpoints(parent).restore_params(3)  # no selection: latest
  _assert_trees_equal(state.params, wanted)
  first = checkpoint.Checkpoints(parent).restore_params(1)
  assert not np.array_equal(  # the parent trained: step 3 is not its step 1, nor a fresh init
    jax.tree.leaves(wanted)[0], jax.tree.leaves(first)[0]
  )
  assert int(state.step) == 0 and int(state.bad_step) == -1
  adam, schedule = _adam(state.opt_state)
  assert int(adam.count) == 0 and int(schedule.count) == 0
  assert all(not np.any(x) for x in jax.tree.leaves((adam.mu, adam.nu)))
  # The parent's vocabulary, byte for byte, in the child's workdir.
  vocab = os.path.join(child, "vocab.symbols")
  assert sha256_file(vocab) == sha256_file(os.path.join(parent, "vocab.symbols"))
  assert fp["parent"] == dict(
    workdir=os.path.abspath(parent),
    spec="latest",
    steps=[3],
    vocab=os.path.join(os.path.abspath(parent), "vocab.symbols"),
    vocab_sha256=sha256_file(vocab),
    keep_optimizer=False,
  )
  with open(os.path.join(child, "starts.jsonl")) as f:
    (start,) = [json.loads(line) for line in f]
  assert start["parent"]["steps"] == [3] and start["step"] == 0


@pytest.mark.slow
def test_kept_optimizer_state_is_the_parents_with_the_schedule_restarted(
  parent, tmp_path, monkeypatch
):
  config = small_config(init_from=f"{parent}:2", init_keep_optimizer=True)
  state, fp = _start_state(monkeypatch, config, str(tmp_path / "child"))
  ckpts = checkpoint.Checkpoints(parent)
  saved, _ = ckpts.restore(2, state)  # the whole saved state of step 2, into the same tree
  _assert_trees_equal(state.params, saved.params)
  adam, schedule = _adam(state.opt_state)
  saved_adam, saved_schedule = _adam(saved.opt_state)
  _assert_trees_equal((adam.mu, adam.nu), (saved_adam.mu, saved_adam.nu))
  assert any(np.any(x) for x in jax.tree.leaves(adam.mu))
  assert int(adam.count) == int(saved_adam.count) == 2  # bias correction of those moments
  assert int(saved_schedule.count) == 2 and int(schedule.count) == 0  # warmup from 0
  assert int(state.step) == 0
  assert fp["parent"]["steps"] == [2] and fp["parent"]["keep_optimizer"] is True


@pytest.mark.slow
def test_average_spec_starts_from_the_mean_of_the_parents_checkpoints(
  parent, tmp_path, monkeypatch
):
  config = small_config(init_from=f"{parent}:average:2")
  state, fp = _start_state(monkeypatch, config, str(tmp_path / "child"))
  ckpts = checkpoint.Checkpoints(parent)
  two, three = ckpts.restore_params(2), ckpts.restore_params(3)
  mean = jax.tree.map(
    lambda a, b: ((np.float64(a) + np.float64(b)) / 2).astype(np.float32), two, three
  )
  _assert_trees_equal(state.params, mean)
  assert fp["parent"]["spec"] == "average:2" and fp["parent"]["steps"] == [2, 3]


@pytest.mark.slow
def test_selected_checkpoint_is_the_default(parent, tmp_path, monkeypatch):
  copy = str(tmp_path / "parent")
  shutil.copytree(parent, copy)
  with open(os.path.join(copy, "selected.json"), "w") as f:
    json.dump(dict(checkpoint="1"), f)
  state, fp = _start_state(monkeypatch, small_config(init_from=copy), str(tmp_path / "child"))
  _assert_trees_equal(state.params, checkpoint.Checkpoints(copy).restore_params(1))
  assert fp["parent"]["spec"] == "1"


@pytest.mark.slow
def test_changed_shape_field_is_refused_naming_it(parent, tmp_path):
  child = str(tmp_path / "child")
  with pytest.raises(
    warm_start.WarmStartError,
    match=r"checkpoints/3 was trained with config.model.d_ff=64, but this run has "
    r"config.model.d_ff=128",
  ):
    train.train_and_evaluate(small_config(init_from=parent, **{"model.d_ff": 128}), child)
  assert not os.path.exists(os.path.join(child, "vocab.symbols"))  # refused before the copy
  with pytest.raises(warm_start.WarmStartError, match=r"config.model.num_decoder_layers=1, .*=2"):
    train.train_and_evaluate(
      small_config(init_from=parent, **{"model.num_decoder_layers": 2}), child
    )


@pytest.mark.slow
def test_another_vocabulary_in_the_child_is_refused_naming_both_files(parent, tmp_path):
  child = tmp_path / "child"
  child.mkdir()
  mine = child / "vocab.symbols"
  mine.write_text("a\nb\n")
  with pytest.raises(warm_start.WarmStartError) as e:
    train.train_and_evaluate(small_config(init_from=parent), str(child))
  assert str(mine) in str(e.value) and os.path.join(parent, "vocab.symbols") in str(e.value)
  assert mine.read_text() == "a\nb\n"  # never overwritten


@pytest.mark.slow
@pytest.mark.parametrize(
  "suffix, message",
  [
    (":foo", r"SPEC 'foo' is not one of latest, average:N, STEP, selected"),
    (
      ":99",
      r":99: not 'latest', 'average:N', 'best', 'best:N', 'ema' or one of the steps \[1, 2, 3\]",
    ),
    (":average:9", r"holds 3 checkpoint\(s\) \[1, 2, 3\], fewer than 9"),
    (":average:0", r"N of average:N must be a positive integer"),
    (":selected", r"selected.json does not exist"),
  ],
)
def test_bad_spec_is_refused_naming_init_from(parent, tmp_path, suffix, message):
  with pytest.raises(warm_start.WarmStartError, match=r"^config.init_from=.*" + message):
    train.train_and_evaluate(small_config(init_from=parent + suffix), str(tmp_path / "c"))


def _refused(tmp_path, init_from, message, **overrides):
  with pytest.raises((warm_start.WarmStartError, train.ConfigError), match=message) as e:
    config = small_config(init_from=init_from, **overrides)
    train.train_and_evaluate(config, str(tmp_path / "child"))
  assert "\n" not in str(e.value)
  assert not os.path.exists(tmp_path / "child" / "vocab.symbols")  # refused before any data


def test_init_from_naming_no_parent_is_refused_in_one_line(tmp_path):
  missing = str(tmp_path / "nowhere")
  _refused(tmp_path, missing, rf"^config.init_from='{missing}': no directory '{missing}'")
  _refused(tmp_path, missing + ":latest", rf"no directory '{missing}' \(expected WORKDIR")
  empty = tmp_path / "empty"
  empty.mkdir()
  _refused(tmp_path, str(empty), rf"^config.init_from={empty}: {empty} holds no checkpoints")
  _refused(tmp_path, str(tmp_path / "child"), "names this run's own workdir")
  _refused(
    tmp_path,
    "",
    r"config.init_keep_optimizer=True needs config.init_from",
    init_keep_optimizer=True,
  )


@pytest.mark.slow
def test_keeping_the_optimizer_of_an_average_is_refused(parent, tmp_path):
  _refused(
    tmp_path,
    f"{parent}:average:2",
    r"init_keep_optimizer=True needs one checkpoint, but average:2 averages steps \[2, 3\]",
    init_keep_optimizer=True,
  )


def test_parameter_fields_are_resolved_and_ignore_dropout():
  base = TransformerConfig(**support.SMALL_MODEL)
  same = base.replace(d_k=8, d_v=8, num_encoder_layers=1, dropout_rate=0.3, dtype="bfloat16")
  assert base.parameter_fields() == same.parameter_fields()
  for change in (dict(d_ff=128), dict(num_heads=2), dict(num_decoder_layers=2), dict(norm="pre")):
    assert base.replace(**change).parameter_fields() != base.parameter_fields(), change
  assert "max_len" not in base.parameter_fields()  # a sinusoidal table holds no parameter
  learned = base.replace(positional="learned")
  assert learned.parameter_fields() != learned.replace(max_len=32).parameter_fields()


def test_restart_schedule_zeroes_only_the_schedule_count():
  tx = optax.adam(lambda count: 0.1)
  params = dict(w=np.ones(3, np.float32))
  state = tx.init(params)
  for _ in range(2):
    _, state = tx.update(dict(w=np.full(3, 0.5, np.float32)), state, params)
  restarted = warm_start.restart_schedule(state)
  adam, schedule = _adam(restarted)
  assert int(_adam(state)[1].count) == 2 and int(schedule.count) == 0
  assert int(adam.count) == 2
  _assert_trees_equal((adam.mu, adam.nu), (_adam(state)[0].mu, _adam(state)[0].nu))


def test_an_older_config_lacks_the_warm_start_fields():
  old = small_config().to_dict()
  del old["init_from"], old["init_keep_optimizer"]
  filled = config_lib.with_defaults(ml_collections.ConfigDict(old))
  assert filled.init_from == "" and filled.init_keep_optimizer is False


@pytest.mark.slow
def test_restarted_child_resumes_its_own_checkpoint_not_the_parents(parent, tmp_path, monkeypatch):
  """The order: own checkpoint, then init_from. The restart even finds the parent gone."""
  copy, child = str(tmp_path / "parent"), str(tmp_path / "child")
  shutil.copytree(parent, copy)
  train.train_and_evaluate(small_config(init_from=copy, num_train_steps=3), child)
  own = checkpoint.Checkpoints(child)
  assert own.fingerprint(3)["parent"]["workdir"] == os.path.abspath(copy)
  assert own.fingerprint(3)["parent"]["steps"] == [3]
  shutil.rmtree(copy)
  state, fp = _start_state(monkeypatch, small_config(init_from=copy, num_train_steps=6), child)
  assert int(state.step) == 3
  _assert_trees_equal(state.params, own.restore_params(3))
  parents = checkpoint.Checkpoints(parent).restore_params(3)
  assert not np.array_equal(jax.tree.leaves(state.params)[0], jax.tree.leaves(parents)[0])
  assert fp["parent"]["workdir"] == os.path.abspath(copy)  # later checkpoints keep naming it


# --- a parent written without training: the values a warm start reads, in the quick loop ------

PARENT_STEPS = (1, 2, 3, 4)


def _fake_state(seed: int):
  """A TrainState of two small float32 leaves with Adam moments, schedule and step counts
  of `seed` updates (distinct per seed), as the trainer's host state holds them."""
  from t2t_jax.training import optim, steps

  rng = np.random.default_rng(seed)
  params = dict(
    dense=dict(kernel=rng.normal(size=(3, 4)).astype(np.float32)),
    bias=(rng.normal(size=(5,)) + 1e3).astype(np.float32),  # float32 sums would round here
  )
  tx = optim.make_optimizer(32, warmup_steps=10)
  state = steps.TrainState.create(params, tx, jax.random.PRNGKey(seed))
  opt_state = state.opt_state
  for _ in range(seed):
    grads = jax.tree.map(lambda x: rng.normal(size=x.shape).astype(np.float32), params)
    _, opt_state = tx.update(grads, opt_state, params)
  return jax.device_get(state.replace(step=np.int32(seed), opt_state=opt_state))


def _fake_parent(path: str, with_fingerprint: bool = False) -> dict[int, object]:
  """A parent workdir holding config.json, vocab.symbols and checkpoints PARENT_STEPS, each
  of `_fake_state(step)`: no data is read, nothing trained or compiled. The states by step."""
  from t2t_jax.run import fingerprint
  from t2t_jax.run.workdir import Workdir

  config = small_config()
  os.makedirs(path)
  Workdir(path).write_start(config)
  vocab = os.path.join(path, "vocab.symbols")
  with open(vocab, "w") as f:
    f.write("a\nb\nc\n")
  ckpts = checkpoint.Checkpoints(path, max_to_keep=10, create=True, owner=True)
  states = {}
  for step in PARENT_STEPS:
    states[step] = _fake_state(step)
    fp = fingerprint.make(config, sha256_file(vocab)) if with_fingerprint else None
    ckpts.save(step, states[step], None, fp)
  ckpts.wait()
  ckpts.close()
  return states


def _warm(tmp_path, states, init_from: str, **overrides):
  """(Parent, the child's initial host state) for `init_from`, from a fresh state of 9."""
  config = small_config(init_from=init_from, **overrides)
  parent = warm_start.resolve(config, str(tmp_path / "child"))
  return parent, warm_start.initial_state(_fake_state(9), parent)


@pytest.fixture
def fake_parent(tmp_path):
  path = str(tmp_path / "parent")
  return path, _fake_parent(path)


def test_warm_start_from_an_average_is_the_float64_mean_of_the_last_n(fake_parent, tmp_path):
  path, states = fake_parent
  # average:2 of 4 checkpoints: the newest two, 3 and 4, not the first two.
  parent, state = _warm(tmp_path, states, f"{path}:average:2")
  assert parent.steps == (3, 4) and parent.spec == "average:2"
  for got, a, b in zip(*(jax.tree.leaves(t) for t in (state.params, states[3].params,
                                                     states[4].params))):  # fmt: skip
    want = ((np.float64(a) + np.float64(b)) / 2).astype(np.float32)
    np.testing.assert_array_equal(got, want)
  parent, state = _warm(tmp_path, states, f"{path}:average:3")
  assert parent.steps == (2, 3, 4)
  for got, *leaves in zip(*(jax.tree.leaves(t) for t in
                            (state.params, *(states[s].params for s in (2, 3, 4))))):  # fmt: skip
    want = np.mean(np.stack([np.float64(x) for x in leaves]), axis=0).astype(np.float32)
    np.testing.assert_array_equal(got, want)
  # A fresh optimizer: the child's own (zero moments, counts 0), not any parent's.
  _assert_trees_equal(state.opt_state, _fake_state(9).opt_state)
  assert int(state.step) == 9  # the child's step as given (the trainer's is 0)


def test_warm_start_takes_the_latest_the_named_step_or_the_selected_one(fake_parent, tmp_path):
  path, states = fake_parent
  for init_from, step in ((path, 4), (f"{path}:latest", 4), (f"{path}:2", 2)):
    parent, state = _warm(tmp_path, states, init_from)
    assert parent.steps == (step,), init_from
    _assert_trees_equal(state.params, states[step].params)
  with open(os.path.join(path, "selected.json"), "w") as f:
    json.dump(dict(checkpoint="average:2"), f)
  parent, state = _warm(tmp_path, states, path)  # the selection is the default
  assert parent.spec == "average:2" and parent.steps == (3, 4)


def test_kept_optimizer_is_the_named_checkpoints_with_the_schedule_at_zero(fake_parent, tmp_path):
  path, states = fake_parent
  parent, state = _warm(tmp_path, states, f"{path}:3", init_keep_optimizer=True)
  assert parent.keep_optimizer and parent.steps == (3,)
  _assert_trees_equal(state.params, states[3].params)
  adam, schedule = _adam(state.opt_state)
  saved_adam, saved_schedule = _adam(states[3].opt_state)
  _assert_trees_equal((adam.mu, adam.nu), (saved_adam.mu, saved_adam.nu))
  assert any(np.any(x) for x in jax.tree.leaves(adam.nu))
  assert int(adam.count) == int(saved_adam.count) == 3  # the moments' bias correction
  assert int(saved_schedule.count) == 3 and int(schedule.count) == 0  # a new warmup
  with pytest.raises(warm_start.WarmStartError, match=r"average:2 averages steps \[3, 4\]"):
    _warm(tmp_path, states, f"{path}:average:2", init_keep_optimizer=True)


def test_the_vocabulary_check_refuses_a_changed_parent_vocabulary_or_size(tmp_path):
  path = str(tmp_path / "parent")
  states = _fake_parent(path, with_fingerprint=True)
  parent, _ = _warm(tmp_path, states, path)  # the vocabulary its checkpoints were trained with
  assert parent.vocab_sha256 == sha256_file(os.path.join(path, "vocab.symbols"))
  # The child copies it; a child vocabulary of other bytes is refused and left as it was.
  config = small_config(init_from=path)
  child = str(tmp_path / "child")
  copied = warm_start.adopt_vocabulary(config, child, parent, 0)
  assert sha256_file(copied) == parent.vocab_sha256
  assert warm_start.adopt_vocabulary(config, child, parent, 0) == copied  # same bytes: fine
  with open(copied, "w") as f:
    f.write("a\nb\nx\n")
  with pytest.raises(warm_start.WarmStartError, match=r"is not the parent's"):
    warm_start.adopt_vocabulary(config, child, parent, 0)
  # The parent's vocabulary edited since its checkpoints were written.
  with open(os.path.join(path, "vocab.symbols"), "a") as f:
    f.write("d\n")
  with pytest.raises(warm_start.WarmStartError, match=r"was trained with a vocabulary of sha256"):
    _warm(tmp_path, states, path)
  # A SentencePiece vocabulary's size is the parameters' size: another one is refused.
  sp_parent = small_config(**{"data.vocab_path": "/v/spm.model", "data.vocab_size": 100})
  for size, refused in ((100, False), (101, True)):
    sp_child = small_config(**{"data.vocab_path": "/v/spm.model", "data.vocab_size": size})
    if refused:
      with pytest.raises(warm_start.WarmStartError, match=r"vocab_size=100, but .*=101"):
        warm_start.check_architecture(sp_parent, sp_child, "here")
    else:
      warm_start.check_architecture(sp_parent, sp_child, "here")
