"""Command-line paths no other test walks: gradient accumulation through the trainer,
t2t-translate's --alpha, --beam_stop, numeric --checkpoint and an unwritable --output,
t2t-export's --beam_size/--alpha, t2t-bench --vs, and t2t-train's multi-process flags.

One briefly trained workdir serves the whole module; the tools run in this process where
their flags allow it (t2t-translate defines its flags when it starts, t2t-bench's are
global), t2t-export and t2t-train in a subprocess (their module-level flags would collide
with t2t-bench's)."""

import functools
import inspect
import json
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from absl import flags

from t2t_jax import data
from t2t_jax.cli import bench, common
from t2t_jax.cli import translate as translate_cli
from t2t_jax.decoding.config import STOP_RULES
from t2t_jax.decoding.translator import Translator
from t2t_jax.run import checkpoint
from t2t_jax.run.workdir import read_metrics
from t2t_jax.tokens import EOS_ID
from t2t_jax.training import distributed, optim, steps
from t2t_jax.training import trainer as train
from tests import support
from tests.test_train import small_config

# One bucket, so every microbatch has the same shape: the run compiles each step once and
# the two microbatches of an update concatenate into one batch without padding.
ACCUM_CONFIG = dict(
  grad_accum_steps=2,
  num_train_steps=3,
  checkpoint_every_steps=1,
  eval_every_steps=100,
  **{"data.bucket_boundaries": (16,)},
)
SOURCES = ["1 2 3", "4 5 6 7", "2"]
SUBPROCESS_ENV = support.cpu_env(T2T_HUGE_PAGES="0")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """(config, workdir, initial state): three updates of two microbatches each, a checkpoint
  after each; the state the run started from, kept on the host."""
  config = small_config(**ACCUM_CONFIG)
  workdir = str(tmp_path_factory.mktemp("cli_coverage") / "w")
  initial = []

  def init_state(*args, **kwargs):
    state = real_init_state(*args, **kwargs)
    initial.append(jax.tree.map(np.array, state))  # a copy: the run may donate buffers
    return state

  real_init_state = train.init_state
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(train, "init_state", init_state)
    train.train_and_evaluate(config, workdir)
  return config, workdir, initial[0]


# ----------------------------------------------------------------------------- trainer


@pytest.mark.slow
def test_gradient_accumulation_update_equals_one_batch_of_both_microbatches(trained, tmp_path):
  config, workdir, fresh = trained
  logged = [r for r in read_metrics(workdir) if "loss" in r]
  assert [r["step"] for r in logged] == [1, 2, 3]
  assert checkpoint.Checkpoints(workdir).steps() == [1, 2, 3]
  # The same pipeline again: update k consumed batches 2k - 2 and 2k - 1.
  ds = data.get_datasets(config.data, str(tmp_path), num_local_devices=jax.local_device_count())
  it = ds.train_iter()
  batches = [next(it) for _ in range(6)]
  target_tokens = [float((b["targets"] != 0).sum()) for b in batches]
  assert [r["tokens"] for r in logged] == [
    target_tokens[2 * k] + target_tokens[2 * k + 1] for k in range(3)
  ]
  assert target_tokens[0] != target_tokens[1]  # so a per-microbatch mean would differ

  # Reference: one gradient over all rows of both microbatches, divided once by their tokens.
  assert {k: v.shape for k, v in batches[0].items()} == {k: v.shape for k, v in batches[1].items()}
  both = {
    k: np.concatenate([b[k].reshape(-1, b[k].shape[-1]) for b in batches[:2]]) for k in batches[0]
  }
  model, _ = train.build_model(config, ds.tokenizer.vocab_size)

  def loss_sum(params):
    sums = steps.batch_loss_sums(params, both, model=model, label_smoothing=config.label_smoothing)
    return sums["loss"], sums

  grads, sums = jax.jit(jax.grad(loss_sum, has_aux=True))(fresh.params)
  tokens = float(sums["denominator"])
  assert tokens == logged[0]["tokens"]
  grads = jax.tree.map(lambda g: np.asarray(g) / tokens, grads)
  np.testing.assert_allclose(logged[0]["loss"], float(sums["loss"]) / tokens, rtol=1e-5)
  np.testing.assert_allclose(logged[0]["grad_norm"], float(optax.tree.norm(grads)), rtol=1e-4)
  # Adam's first moment after one update is (1 - b1) times that gradient.
  saved, _ = checkpoint.Checkpoints(workdir).restore(1, fresh)
  assert int(saved.step) == 1
  for got, want in zip(jax.tree.leaves(saved.opt_state[0].mu), jax.tree.leaves(grads)):
    np.testing.assert_allclose(got, (1 - optim.ADAM_B1) * want, rtol=1e-4, atol=1e-9)


# ----------------------------------------------------------------------------- t2t-translate


class _OwnFlags:
  """absl.flags with every DEFINE_* aimed at one private FlagValues, so that t2t-translate's
  flags (workdir, beam_size, ...) do not collide with t2t-bench's global ones."""

  def __init__(self) -> None:
    self.FLAGS = flags.FlagValues()

  def __getattr__(self, name):
    value = getattr(flags, name)
    if name.startswith("DEFINE"):
      return functools.partial(value, flag_values=self.FLAGS)
    return value


@pytest.fixture
def run_translate(monkeypatch):
  """Runs t2t-translate's main() on argv; returns the Translators it built (also in
  `run.built`, for a run that exits)."""
  built = []

  class Recorded(Translator):
    @classmethod
    def from_workdir(cls, *args, **kwargs):
      built.append(super().from_workdir(*args, **kwargs))
      return built[-1]

  monkeypatch.setattr(translate_cli, "Translator", Recorded)

  def run(*args):
    built.clear()
    monkeypatch.setattr(translate_cli, "flags", _OwnFlags())
    parsed = translate_cli._define_flags()
    parsed(["t2t-translate", *args])
    monkeypatch.setattr(translate_cli._define_flags, "flags", parsed, raising=False)
    translate_cli.main(["t2t-translate"])
    return list(built)

  run.built = built
  return run


def _source_file(tmp_path):
  path = tmp_path / "src.txt"
  path.write_text("".join(s + "\n" for s in SOURCES))
  return path


def _nbest_rows(path):
  rows = [line.split("\t") for line in path.read_text().splitlines()]
  return [(int(i), int(rank), float(score), float(lp), text) for i, rank, score, lp, text in rows]


def _forced_log_probs(t2t, pairs):
  """log p(target + EOS | source) of each (source, target) by teacher forcing, independent of
  beam search: one padded batch, so one compilation (padding changes no real position)."""
  width = t2t.model.config.max_len
  inputs, targets = (np.zeros((len(pairs), width), np.int32) for _ in range(2))
  for row, (source, target) in enumerate(pairs):
    for ids, text in ((inputs, source), (targets, target)):
      tokens = t2t.tokenizer.encode(text) + [EOS_ID]
      ids[row, : len(tokens)] = tokens

  @jax.jit
  def log_probs(params, inputs, targets):
    logits = t2t.model.apply({"params": params}, inputs, targets)
    picked = jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], axis=-1)
    return jnp.where(targets != 0, picked[..., 0], 0.0).sum(-1)

  return dict(zip(pairs, np.asarray(log_probs(t2t.params, inputs, targets)).tolist()))


@pytest.mark.slow
def test_translate_alpha_is_the_length_penalty_of_the_scores(trained, tmp_path, run_translate):
  _, workdir, _ = trained
  src = _source_file(tmp_path)
  rows = {}
  for alpha in (0.0, 1.5):
    out = tmp_path / f"alpha{alpha}.tsv"
    (t2t,) = run_translate(
      f"--workdir={workdir}",
      f"--input={src}",
      f"--output={out}",
      "--beam_size=2",
      "--nbest=2",
      f"--alpha={alpha}",
    )
    rows[alpha] = _nbest_rows(out)
    assert {i for i, *_ in rows[alpha]} == set(range(len(SOURCES)))
    for i in range(len(SOURCES)):
      scores = [score for j, _, score, _, _ in rows[alpha] if j == i]
      assert scores == sorted(scores, reverse=True)
  pairs = sorted({(SOURCES[i], text) for r in rows.values() for i, *_, text in r})
  forced = _forced_log_probs(t2t, pairs)
  for alpha, alpha_rows in rows.items():
    for i, _, score, log_prob, text in alpha_rows:
      length = len(t2t.tokenizer.encode(text)) + 1  # EOS counts
      want = forced[SOURCES[i], text]
      np.testing.assert_allclose(log_prob, want, atol=2e-4)
      np.testing.assert_allclose(score, want / ((5 + length) / 6) ** alpha, atol=2e-4)


@pytest.mark.slow
def test_translate_beam_stop_values_and_a_bad_one(trained, tmp_path, run_translate):
  _, workdir, _ = trained
  src = _source_file(tmp_path)
  for rule in STOP_RULES:
    out = tmp_path / f"{rule}.tsv"
    (t2t,) = run_translate(
      f"--workdir={workdir}",
      f"--input={src}",
      f"--output={out}",
      "--beam_size=2",
      "--nbest=2",
      f"--beam_stop={rule}",
    )
    assert t2t.search.beam_stop == rule
    assert {i for i, *_ in _nbest_rows(out)} == set(range(len(SOURCES)))
  with pytest.raises(flags.IllegalFlagValueError, match=r"--beam_stop=never.*exact\|heuristic"):
    run_translate(f"--workdir={workdir}", f"--input={src}", "--beam_stop=never")


@pytest.mark.slow
def test_translate_checkpoint_step(trained, tmp_path, run_translate):
  _, workdir, _ = trained
  src, out = _source_file(tmp_path), tmp_path / "out.tsv"
  (t2t,) = run_translate(
    f"--workdir={workdir}",
    f"--input={src}",
    f"--output={out}",
    "--beam_size=2",
    "--nbest=2",
    "--checkpoint=2",
  )
  assert t2t.checkpoint_steps == [2]
  step2 = checkpoint.Checkpoints(workdir).restore_params(2)
  for got, want in zip(jax.tree.leaves(t2t.params), jax.tree.leaves(step2)):
    np.testing.assert_array_equal(got, want)
  assert len(out.read_text().splitlines()) >= len(SOURCES)
  with pytest.raises(SystemExit) as exit_info:
    run_translate(f"--workdir={workdir}", f"--input={src}", "--checkpoint=7")
  assert str(exit_info.value.code) == (
    "t2t-translate: --checkpoint=7: not 'latest', 'average:N', 'best', 'best:N', 'ema' or one of "
    f"the steps [1, 2, 3] in {workdir}/checkpoints"
  )


@pytest.mark.slow
def test_translate_unwritable_output_fails_first_in_one_line(trained, tmp_path, run_translate):
  _, workdir, _ = trained
  src = _source_file(tmp_path)
  in_the_way = tmp_path / "a_directory"
  in_the_way.mkdir()
  (in_the_way / "kept.txt").write_text("kept\n")
  before = sorted(os.listdir(tmp_path))
  for output, reason in (
    (tmp_path / "missing" / "out.txt", "No such file or directory"),
    (in_the_way, "Is a directory"),
  ):
    with pytest.raises(SystemExit) as exit_info:
      run_translate(f"--workdir={workdir}", f"--input={src}", f"--output={output}")
    assert str(exit_info.value.code) == f"t2t-translate: --output={output}: cannot write ({reason})"
    assert run_translate.built == []  # refused before the model loads: no work thrown away
  assert sorted(os.listdir(tmp_path)) == before  # and nothing left behind
  assert os.listdir(in_the_way) == ["kept.txt"]


# ----------------------------------------------------------------------------- t2t-export


def _export(*args):
  return subprocess.run(
    [sys.executable, "-m", "t2t_jax.cli.export", *args],
    env=SUBPROCESS_ENV,
    capture_output=True,
    text=True,
    timeout=600,
  )


@pytest.mark.slow
def test_export_beam_size_and_alpha_reach_the_generation_config(trained, tmp_path):
  transformers = pytest.importorskip("transformers")
  pytest.importorskip("safetensors")  # the exporter writes model.safetensors with it
  _, workdir, _ = trained
  out = tmp_path / "hf"
  proc = _export(
    f"--workdir={workdir}",
    "--format=huggingface",
    f"--output={out}",
    "--checkpoint=2",
    "--beam_size=6",
    "--alpha=1.1",
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert f"t2t-export: checkpoint(s) [2] -> {out} (huggingface)" in proc.stdout
  generation = transformers.GenerationConfig.from_pretrained(out)
  assert (generation.num_beams, generation.length_penalty) == (6, 1.1)


@pytest.mark.slow
def test_export_refuses_a_decoding_flag_ctranslate2_has_no_place_for(trained, tmp_path):
  _, workdir, _ = trained
  out = tmp_path / "ct2"
  proc = _export(f"--workdir={workdir}", "--format=ctranslate2", f"--output={out}", "--alpha=1.1")
  assert proc.returncode == 2  # a wrong command line
  assert "--alpha=1.1 is for --format=huggingface" in proc.stderr
  assert "Traceback" not in proc.stderr and not out.exists()


# ----------------------------------------------------------------------------- t2t-bench --vs


@pytest.fixture
def run_bench(monkeypatch, capsys):
  """Runs t2t-bench's main() on argv with its global flags, reset afterwards; returns stdout."""
  if "config" not in bench.FLAGS:
    monkeypatch.setattr(sys, "argv", ["t2t-bench"])
    common.define_config_flag("t2t-bench")

  def run(*args):
    argv = ["t2t-bench", "--experiment=tiny", *args]
    capsys.readouterr()
    try:
      bench.main(bench.FLAGS(argv))  # main gets what flag parsing leaves, as from app.run
    finally:
      bench.FLAGS.unparse_flags()
    return capsys.readouterr().out

  return run


def _table_rows(text, first_cell):
  """The cells of the markdown rows whose first cell starts with `first_cell`."""
  lines = [line for line in text.splitlines() if line.startswith("|")]
  rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
  return [r for r in rows if r[0].startswith(first_cell)]


def _number(cell):
  return float(re.sub(r"[,x%]", "", cell))


@pytest.mark.slow
def test_bench_vs_ctranslate2_prints_one_row_per_system(run_bench):
  pytest.importorskip("ctranslate2")
  text = run_bench(
    "--parts=decode",
    "--vs=ctranslate2",
    "--decode_sentences=4",
    "--seq_len=8",
    "--beam_size=2",
    "--repeats=1",
  )
  assert "decode vs CTranslate2: 4 sentences, beam 2" in text
  rows = {r[0]: r for r in _table_rows(text, "t2t_jax") + _table_rows(text, "ctranslate2")}
  assert list(rows) == ["t2t_jax", "ctranslate2 float32", "ctranslate2 int8"]
  for name, (_, tokens_per_s, sentences_per_s, speedup, same) in rows.items():
    assert _number(tokens_per_s) > 0 and _number(sentences_per_s) > 0, name
    assert _number(speedup) > 0 and same.endswith("/4"), name
  assert rows["t2t_jax"][3] == "1.00x" and rows["t2t_jax"][4] == "4/4"


@pytest.mark.slow  # builds and trains four systems (torch, plain flax and Marian too)
def test_bench_vs_peers_prints_one_row_per_system(run_bench):
  pytest.importorskip("torch")
  pytest.importorskip("transformers")
  text = run_bench(
    "--parts=train",
    "--vs=peers",
    "--steps=1",
    "--repeats=1",
    "--batch_tokens=64",
    "--seq_len=8",
  )
  assert "train vs peers: d_model 64, d_ff 128" in text
  rows = _table_rows(text, "")
  systems = [r[0].split(" (")[0] for r in rows if " (" in r[0]]
  assert systems == ["t2t_jax", "torch", "flax", "marian"]
  for row in rows:
    if " (" not in row[0]:
      continue
    params, warm_up_s, step_ms, tokens_per_s = row[2].split(" (")[0], row[3], row[4], row[5]
    assert min(_number(params), _number(step_ms), _number(tokens_per_s)) > 0, row
    assert _number(warm_up_s) >= 0, row  # printed to 0.1 s: a fast first step shows 0.0
  assert "best peer: " in text


def test_bench_refuses_an_unknown_vs(run_bench):
  with pytest.raises(flags.IllegalFlagValueError, match=r"--vs=torch.*ctranslate2\|peers"):
    run_bench("--vs=torch")


# ----------------------------------------------------------------------------- t2t-train hosts


def _train_flags(*args):
  """t2t-train's multi-process flags, parsed from argv as the command parses them."""
  values = flags.FlagValues()
  distributed.define_flags(values)
  values(["t2t-train", *args])
  return values


@pytest.fixture
def initialize_calls(monkeypatch):
  """The keyword arguments of every jax.distributed.initialize call (none is made)."""
  calls = []

  @functools.wraps(jax.distributed.initialize)  # keeps the signature setup() inspects
  def record(*args, **kwargs):
    assert not args
    calls.append(kwargs)

  monkeypatch.setattr(jax.distributed, "initialize", record)
  return calls


def _expected_initialize(**kwargs):
  """What this jax's initialize accepts of `kwargs` (older ones lack some arguments)."""
  accepted = inspect.signature(jax.distributed.initialize).parameters
  return {k: v for k, v in kwargs.items() if k in accepted}


def test_distributed_flags_reach_jax_distributed_initialize(initialize_calls):
  values = _train_flags(
    "--coordinator_address=10.1.2.3:8476",
    "--num_processes=4",
    "--process_id=0",
    "--local_device_ids=0,1",
    "--distributed_init_timeout_s=20",
    "--heartbeat_timeout_s=7",
    "--shutdown_timeout_s=9",
  )
  plan = distributed.setup(values, environ={})
  assert initialize_calls == [
    _expected_initialize(
      coordinator_address="10.1.2.3:8476",
      num_processes=4,
      process_id=0,
      local_device_ids=[0, 1],
      initialization_timeout=50,
      heartbeat_timeout_seconds=7,
      shutdown_timeout_seconds=9,
      cluster_detection_method="deactivate",
    )
  ]
  assert plan.source == "flags" and plan.coordinator_address == "10.1.2.3:8476"
  # --distributed=off wins over every other flag: one process, no initialize.
  off = _train_flags("--distributed=off", "--coordinator_address=h:1", "--num_processes=4")
  assert not distributed.setup(off, environ={}).multi_process
  assert len(initialize_calls) == 1


@pytest.mark.parametrize(
  "args, environ, message",
  [
    (["--num_processes=-2"], {}, "--num_processes=-2 must be >= 1"),
    (["--num_processes=1", "--process_id=3"], {}, "--process_id=3 with a single process"),
    (
      ["--coordinator_address=h:1", "--num_processes=2", "--local_device_ids=0,x"],
      {},
      "--local_device_ids='0,x': comma-separated integers expected",
    ),
    (
      ["--coordinator_address=h:1", "--process_id=0"],
      {"JAX_NUM_PROCESSES": "two"},
      "JAX_NUM_PROCESSES='two' (for --num_processes) is not an integer",
    ),
    (
      ["--process_id=1"],
      {},
      "--coordinator_address/--process_id given without --num_processes",
    ),
  ],
)
def test_distributed_bad_combinations_name_the_flag(initialize_calls, args, environ, message):
  with pytest.raises(distributed.DistributedSetupError) as error:
    distributed.setup(_train_flags(*args), environ=environ)
  assert message in str(error.value)
  assert initialize_calls == []


def test_distributed_unknown_mode_is_a_flag_error():
  with pytest.raises(flags.IllegalFlagValueError, match=r"--distributed=bogus.*auto\|off"):
    _train_flags("--distributed=bogus")


# t2t-train as typed, with jax.distributed.initialize replaced by one that prints its
# arguments and fails as an unreachable coordinator would.
_TRAIN_WITH_FAILING_JOIN = """
import functools, json, sys
import jax
@functools.wraps(jax.distributed.initialize)
def fail(**kwargs):
  print(json.dumps(kwargs, sort_keys=True), flush=True)
  raise RuntimeError("coordinator unreachable")
jax.distributed.initialize = fail
from t2t_jax.cli import train
sys.argv[0] = "t2t-train"
train.run()
"""


def test_t2t_train_passes_its_flags_to_initialize_and_reports_a_failed_join(tmp_path):
  env = {
    k: v
    for k, v in SUBPROCESS_ENV.items()
    if not k.startswith(("SLURM_", "JAX_COORDINATOR", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"))
  }
  workdir = tmp_path / "w"
  proc = subprocess.run(
    [
      sys.executable,
      "-c",
      _TRAIN_WITH_FAILING_JOIN,
      f"--workdir={workdir}",
      "--coordinator_address=127.0.0.1:29500",
      "--num_processes=2",
      "--process_id=1",
      "--distributed_init_timeout_s=60",
    ],
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 1, proc.stderr[-3000:]
  assert json.loads(proc.stdout.strip().splitlines()[-1]) == _expected_initialize(
    coordinator_address="127.0.0.1:29500",
    num_processes=2,
    process_id=1,
    local_device_ids=None,
    initialization_timeout=90,
    heartbeat_timeout_seconds=100,
    shutdown_timeout_seconds=1800,
    cluster_detection_method="deactivate",
  )
  assert proc.stderr.strip().splitlines()[-1] == (
    "t2t-train: process 1 of 2: jax.distributed.initialize failed: coordinator unreachable"
  )
  assert "Traceback" not in proc.stderr and not workdir.exists()
