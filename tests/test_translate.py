"""Translation of a trained workdir: Translator, t2t-translate, checkpoint averaging."""

import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from t2t_jax.decoding import translator as translate
from t2t_jax.training import checkpoint
from t2t_jax.training import trainer as train
from tests.test_train import small_config


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  """A briefly trained tiny model with three checkpoints (steps 2, 4, 6)."""
  path = str(tmp_path_factory.mktemp("translate") / "w")
  config = small_config(checkpoint_every_steps=2, eval_every_steps=100)
  train.train_and_evaluate(config, path)
  return path


@pytest.mark.slow
def test_order_count_empty_and_long_lines(workdir, caplog):
  t = translate.Translator.from_workdir(workdir)
  assert t.checkpoint_steps == [6]
  long_line = " ".join(["3"] * 40)  # 41 tokens > max_len=16
  sources = ["1 2 3", "", "4 5 6 7 1 2", long_line, "7"]
  out = t.translate(sources, beam_size=2)
  assert len(out) == len(sources) and all(isinstance(o, str) for o in out)
  # Each output is the translation of its own line: translating lines one at a time agrees.
  for src, got in zip(sources, out):
    assert t.translate([src], beam_size=2) == [got]
  assert (
    "input: 1 of 5 sentences have more source tokens than the model's max_len=16 and were "
    "truncated to it (lines 4)" in caplog.text
  )


@pytest.mark.slow
def test_average_checkpoints(workdir):
  ckpts = checkpoint.Checkpoints(workdir)
  assert ckpts.steps() == [2, 4, 6]
  p2, p4, p6 = (ckpts.restore_params(s) for s in (2, 4, 6))
  same = checkpoint.average_params([p6, p6, p6])
  for a, b in zip(jax.tree.leaves(same), jax.tree.leaves(p6)):
    np.testing.assert_array_equal(a, b)
  mean = checkpoint.average_params([p2, p4])
  for a, b, c in zip(jax.tree.leaves(mean), jax.tree.leaves(p2), jax.tree.leaves(p4)):
    np.testing.assert_allclose(a, (np.float64(b) + c) / 2, rtol=1e-6)
  t = translate.Translator.from_workdir(workdir, "average:3")
  assert t.checkpoint_steps == [2, 4, 6]
  with pytest.raises(
    checkpoint.CheckpointSpecError, match=r"holds 3 checkpoint\(s\) \[2, 4, 6\], fewer than 5"
  ):
    translate.Translator.from_workdir(workdir, "average:5")
  with pytest.raises(checkpoint.CheckpointSpecError, match="not 'latest', 'average:N'"):
    translate.Translator.from_workdir(workdir, "7")
  with pytest.raises(checkpoint.CheckpointSpecError, match="selected.json does not exist"):
    translate.Translator.from_workdir(workdir, "selected")


def test_attention_weights_match_forward_and_sum_to_one(workdir):
  t = translate.Translator.from_workdir(workdir)
  w = t.attention_weights("1 2 3 4", "4 3 2 1")
  assert w["encoder_self"].shape == (1, 4, 5, 5)
  assert w["decoder_self"].shape == (1, 4, 5, 5) and w["cross"].shape == (1, 4, 5, 5)
  for name in ("encoder_self", "decoder_self", "cross"):
    np.testing.assert_allclose(w[name].sum(-1), 1.0, rtol=1e-5)
  assert np.all(np.triu(w["decoder_self"][0, 0], k=1) == 0)  # causal
  assert len(w["source_tokens"]) == 5 and w["source_tokens"][-1] == "</s>"


def _cli(*args, stdin=None):
  env = dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu")
  return subprocess.run(
    [sys.executable, "-m", "t2t_jax.cli.translate", *args],
    env=env,
    input=stdin,
    capture_output=True,
    timeout=300,
  )


@pytest.mark.slow
def test_cli_files_and_scores(workdir, tmp_path):
  src, ref, out = tmp_path / "src", tmp_path / "ref", tmp_path / "out"
  src.write_text("1 2 3\n\n4 5 6\n")
  ref.write_text("3 2 1\n\n6 5 4\n")
  proc = _cli(
    f"--workdir={workdir}",
    f"--input={src}",
    f"--output={out}",
    f"--reference={ref}",
    "--beam_size=2",
  )
  assert proc.returncode == 0, proc.stderr.decode()
  assert len(out.read_text().split("\n")) == 4  # three lines, final newline
  err = proc.stderr.decode()
  assert "sacreBLEU (cased, 13a)" in err and "BLEU|nrefs:1" in err and "chrF" in err
  proc = _cli(f"--workdir={workdir}", stdin=b"1 2\n3 4\n")
  assert proc.returncode == 0 and len(proc.stdout.decode().splitlines()) == 2


@pytest.mark.slow
def test_cli_bad_input(workdir, tmp_path):
  src, ref, bad = tmp_path / "src", tmp_path / "ref", tmp_path / "bad"
  src.write_text("1 2\n3 4\n")
  ref.write_text("1\n")
  bad.write_bytes(b"1 2\n3 \xff 4\n")
  err = _cli(f"--workdir={workdir}", f"--input={src}", f"--reference={ref}").stderr.decode()
  assert f"--reference={ref} has 1 lines but --input={src} has 2" in err
  err = _cli(f"--workdir={workdir}", f"--input={bad}").stderr.decode()
  assert f"{bad}:2: not UTF-8" in err
  empty = tmp_path / "empty_workdir"
  empty.mkdir()
  err = _cli(f"--workdir={empty}", f"--input={src}").stderr.decode()
  assert "no config.json" in err
  err = _cli(f"--workdir={workdir}", f"--input={src}", "--checkpoint=average:9").stderr.decode()
  assert "fewer than 9" in err
  untrained = tmp_path / "untrained"
  untrained.mkdir()
  (untrained / "config.json").write_text(open(os.path.join(workdir, "config.json")).read())
  err = _cli(f"--workdir={untrained}", f"--input={src}").stderr.decode()
  assert f"{untrained}: vocabulary" in err and "is missing" in err
  for name in os.listdir(workdir):
    if name.startswith("vocab."):
      (untrained / name).write_bytes(open(os.path.join(workdir, name), "rb").read())
  err = _cli(f"--workdir={untrained}", f"--input={src}").stderr.decode()
  assert f"{untrained}/checkpoints: no checkpoint to translate with" in err
  err = _cli(f"--workdir={workdir}", f"--input={tmp_path / 'nope'}").stderr.decode()
  assert f"{tmp_path / 'nope'}: cannot read" in err


@pytest.mark.slow
def test_average_command_writes_a_translatable_workdir(workdir, tmp_path):
  out = tmp_path / "avg"
  env = dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu")
  run = lambda: subprocess.run(
    [
      sys.executable,
      "-m",
      "t2t_jax.cli.average",
      f"--workdir={workdir}",
      "--num=2",
      f"--output={out}",
    ],
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  proc = run()
  assert proc.returncode == 0, proc.stderr
  assert "averaged steps [4, 6]" in proc.stdout
  ckpts = checkpoint.Checkpoints(workdir)
  want = checkpoint.average_params([ckpts.restore_params(4), ckpts.restore_params(6)])
  t = translate.Translator.from_workdir(str(out))
  for a, b in zip(jax.tree.leaves(t.params), jax.tree.leaves(want)):
    np.testing.assert_array_equal(a, b)
  assert "already holds checkpoints" in run().stderr  # never overwrites


@pytest.mark.slow
def test_beam_stop_comes_from_the_config_and_is_checked(workdir):
  assert translate.Translator.from_workdir(workdir).beam_stop == "exact"  # base config's
  t = translate.Translator.from_workdir(workdir, beam_stop="heuristic")
  assert t.beam_stop == "heuristic"
  out = t.translate(["1 2 3", "4 5 6 7 1 2"], beam_size=2)
  assert len(out) == 2 and all(isinstance(o, str) for o in out)
  with pytest.raises(ValueError, match="beam_stop='never'"):
    translate.Translator(t.model, t.params, t.tokenizer, beam_stop="never")
