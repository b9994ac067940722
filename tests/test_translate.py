"""Translation of a trained workdir: Translator, t2t-translate, checkpoint averaging."""

import functools
import json
import os
import subprocess
import sys
import types

import flax.linen as nn
import jax
import numpy as np
import pytest

from t2t_jax.decoding import batching
from t2t_jax.decoding import translator as translate
from t2t_jax.model import layers
from t2t_jax.run import checkpoint
from t2t_jax.training import trainer as train
from tests import numpy_reference, support
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
  out = t.translate(sources, search=t.search.override(beam_size=2))
  assert len(out) == len(sources) and all(isinstance(o, str) for o in out)
  # Each output is the translation of its own line: translating lines one at a time agrees.
  for src, got in zip(sources, out):
    assert t.translate([src], search=t.search.override(beam_size=2)) == [got]
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


def _attention_inputs(run):
  """run()'s result, plus (inputs_q, inputs_kv, output) of each attention module's call in
  it, by module path."""
  calls = {}

  def interceptor(next_fun, args, kwargs, context):
    out = next_fun(*args, **kwargs)
    if isinstance(context.module, layers.MultiHeadAttention) and context.method_name == "__call__":
      calls[context.module.path] = tuple(np.asarray(x[0], np.float64) for x in (*args[:2], out))
    return out

  with nn.intercept_methods(interceptor):
    result = run()
  return result, calls


@pytest.mark.slow
def test_attention_weights_match_forward_and_sum_to_one(workdir):
  """The trained model's weights are an independent float64 softmax(Q K^T / sqrt(d_k)) of the
  queries and keys the forward pass projects (causal in the decoder), and the module
  outputs are those weights x V x W^O."""
  t = translate.Translator.from_workdir(workdir)
  w, calls = _attention_inputs(lambda: t.attention_weights("1 2 3 4", "4 3 2 1"))
  assert w["encoder_self"].shape == (1, 4, 5, 5)
  assert w["decoder_self"].shape == (1, 4, 5, 5) and w["cross"].shape == (1, 4, 5, 5)
  assert len(w["source_tokens"]) == 5 and w["source_tokens"][-1] == "</s>"
  f64 = lambda x: np.asarray(x, np.float64)
  dense = lambda p, x: np.einsum("ld,dhe->lhe", x, f64(p["kernel"])) + f64(p.get("bias", 0.0))
  modules = dict(
    encoder_self=("encoder", "self_attention", None),
    decoder_self=("decoder", "self_attention", np.tril(np.ones((5, 5), bool))),
    cross=("decoder", "cross_attention", None),
  )
  for kind, (part, name, mask) in modules.items():
    for layer in range(len(w[kind])):
      inputs_q, inputs_kv, out = calls[(part, f"layer_{layer}", name)]
      p = t.params[part][f"layer_{layer}"][name]
      q, k, v = (
        dense(p[n], x) for n, x in zip(("query", "key", "value"), (inputs_q,) + 2 * (inputs_kv,))
      )
      heads, want = numpy_reference.attention(q[None], k[None], v[None], mask)
      np.testing.assert_allclose(w[kind][layer], want[0], atol=1e-5, err_msg=kind)
      output = np.einsum("qhe,hem->qm", heads[0], f64(p["out"]["kernel"])) + f64(p["out"]["bias"])
      np.testing.assert_allclose(output, out, atol=2e-5, err_msg=kind)
    np.testing.assert_allclose(w[kind].sum(-1), 1.0, rtol=1e-5)
  assert np.all(np.triu(w["decoder_self"][0, 0], k=1) == 0)  # causal


def _cli(*args, stdin=None):
  env = support.cpu_env()
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
  """Each refused in one line (exit status 1, no traceback), all in forked children of one
  interpreter (tests.support.forked_commands)."""
  src, ref, bad = tmp_path / "src", tmp_path / "ref", tmp_path / "bad"
  src.write_text("1 2\n3 4\n")
  ref.write_text("1\n")
  bad.write_bytes(b"1 2\n3 \xff 4\n")
  empty = tmp_path / "empty_workdir"
  empty.mkdir()
  no_vocab, no_ckpt = tmp_path / "untrained", tmp_path / "untrained_with_vocab"
  for untrained in (no_vocab, no_ckpt):
    untrained.mkdir()
    (untrained / "config.json").write_text(open(os.path.join(workdir, "config.json")).read())
  for name in os.listdir(workdir):
    if name.startswith("vocab."):
      (no_ckpt / name).write_bytes(open(os.path.join(workdir, name), "rb").read())
  w, i = f"--workdir={workdir}", f"--input={src}"
  cases = {
    "reference": ([w, i, f"--reference={ref}"], f"--reference={ref} has 1 lines but {i} has 2"),
    "utf8": ([w, f"--input={bad}"], f"{bad}:2: not UTF-8"),
    "no-config": ([f"--workdir={empty}", i], "no config.json"),
    "average": ([w, i, "--checkpoint=average:9"], "fewer than 9"),
    "no-vocab": ([f"--workdir={no_vocab}", i], f"{no_vocab}: vocabulary"),
    "no-checkpoint": (
      [f"--workdir={no_ckpt}", i],
      f"{no_ckpt}/checkpoints: no checkpoint to translate with",
    ),
    "no-input": ([w, f"--input={tmp_path / 'nope'}"], f"{tmp_path / 'nope'}: cannot read"),
  }
  got = support.forked_commands(
    [[name, "translate", args] for name, (args, _) in cases.items()],
    str(tmp_path),
    str(tmp_path),
  )
  for name, (_, expected) in cases.items():
    err = got[name]["stderr"]
    assert got[name]["status"] == 1 and "Traceback" not in err, (name, err)
    assert expected in err, (name, err)
  assert "is missing" in got["no-vocab"]["stderr"]


@pytest.mark.slow
def test_average_command_writes_a_translatable_workdir(workdir, tmp_path):
  out = tmp_path / "avg"
  env = support.cpu_env()
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
  again = run()  # never overwrites
  assert again.returncode != 0 and "already holds checkpoints" in again.stderr, again.stderr


@pytest.mark.slow
def test_beam_stop_comes_from_the_config_and_is_checked(workdir):
  t = translate.Translator.from_workdir(workdir)
  assert t.search.beam_stop == "exact"  # base config's
  t.search = t.search.override(beam_stop="heuristic")
  out = t.translate(["1 2 3", "4 5 6 7 1 2"], search=t.search.override(beam_size=2))
  assert len(out) == 2 and all(isinstance(o, str) for o in out)
  with pytest.raises(ValueError, match="beam_stop='never'"):
    t.search.override(beam_stop="never")


def test_a_config_json_without_newer_data_fields_reads_with_their_defaults(tmp_path):
  """A workdir written before data_dir and prepared_store existed: the translator reads the
  fields as their defaults (the vocabulary in the workdir, the prepared store on)."""
  values = small_config().to_dict()
  del values["data"]["data_dir"], values["data"]["prepared_store"]
  (tmp_path / "config.json").write_text(json.dumps(values))
  config = translate.load_config(str(tmp_path))
  assert config.data.data_dir == "" and config.data.prepared_store is True
  assert config.data.source == values["data"]["source"]


def test_source_buckets_pad_by_at_most_half_and_batches_of_nearby_lengths_share_a_shape():
  assert translate.source_buckets(128) == [16, 24, 32, 48, 64, 96, 128]
  assert translate.source_buckets(40) == [16, 24, 32, 40]
  buckets = translate.source_buckets(1000)
  assert buckets[-1] == 1000 and buckets == sorted(set(buckets))
  for n in range(16, 1001):  # the bucket of n: at most 1.5 n, never below n
    bucket = next(b for b in buckets if b >= n)
    assert n <= bucket <= 1.5 * n
  t2t = types.SimpleNamespace(_padded_batch=functools.partial(batching.padded_batch, 128))
  shapes = set()
  for longest in (33, 40, 47):
    inputs, limits, max_decode_len, prefix = t2t._padded_batch([[5] * longest, [5] * 3], 50, None)
    shapes.add((inputs.shape, max_decode_len))
    np.testing.assert_array_equal(limits, [longest + 50, 53])
    assert prefix is None and (inputs[0] == 5).sum() == longest
  assert shapes == {((2, 48), 128)}
  # The output length follows the bucket (16 + 50), not the batch's own longest limit (60).
  assert t2t._padded_batch([[5] * 10], 50, None)[2] == 128
  # A long prefix lengthens the output past the bucket's, to a power of two within max_len.
  inputs, limits, max_decode_len, prefix = t2t._padded_batch([[5] * 4], 2, None, [[7] * 40])
  assert inputs.shape == (1, 16) and limits.tolist() == [41] and max_decode_len == 64
  assert prefix.shape == (1, 40)
  # Streaming's fixed shape is kept as given.
  assert t2t._padded_batch([[5] * 4], 2, (32, 40))[2] == 40
