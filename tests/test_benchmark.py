"""t2t-bench: the model-FLOPs count by hand, and one small run of every part."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from t2t_jax.bench import inputs, train
from t2t_jax.model import Transformer, TransformerConfig
from tests import support


def test_model_flops_by_hand():
  cfg = TransformerConfig(vocab_size=10, d_model=8, d_ff=16, num_heads=2, num_layers=1, max_len=8)
  x = jnp.ones((1, 4), jnp.int32)
  params = jax.eval_shape(lambda: Transformer(cfg).init(jax.random.PRNGKey(0), x, x))["params"]
  attention = 4 * 8 * 8 + 3 * 8  # W^Q, W^K, W^V, W^O + biases (none on W^K)
  ffn = 8 * 16 + 16 + 16 * 8 + 8
  encoder, decoder = attention + ffn + 2 * 16, 2 * attention + ffn + 3 * 16
  rows, length = 2, 4
  dense = 6 * (encoder + decoder) * rows * length
  softmax = 6 * 8 * 10 * rows * length
  per_pair = 2 * length * length * 2 * (4 + 4)  # QK^T and AV, 2 heads of d_k = d_v = 4
  attn = 3 * rows * 3 * per_pair  # encoder self, decoder self, cross
  assert train.model_flops_per_step(cfg, params, rows, length, length) == (dense + softmax + attn)


def test_decode_corpus_choice(tmp_path, monkeypatch):
  import pytest
  from absl import app

  (tmp_path / "wmt14").mkdir()
  (tmp_path / "wmt14" / "newstest2014.en").write_text("one two\nthree\n")
  monkeypatch.setenv("T2T_SHARED_DATA", str(tmp_path))
  assert inputs.real_sentences(5) == (["one two", "three"], "wmt14/newstest2014.en")
  assert inputs.real_sentences(1, "newstest2014") == (["one two"], "wmt14/newstest2014.en")
  with pytest.raises(app.UsageError, match="--decode_corpus=multi30k: .*not found"):
    inputs.real_sentences(5, "multi30k")
  (tmp_path / "multi30k").mkdir()
  (tmp_path / "multi30k" / "test2016.en").write_text("a b c\n")
  assert inputs.real_sentences(5) == (["a b c"], "multi30k/test2016.en")
  assert inputs.real_sentences(5, "newstest2014")[1] == "wmt14/newstest2014.en"


@pytest.mark.slow
def test_bench_runs_every_part(tmp_path):
  out = tmp_path / "bench.json"
  env = support.cpu_env()
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "t2t_jax.cli.bench",
      "--experiment=tiny",
      "--steps=3",
      "--config.model.d_model=32",
      "--config.model.d_ff=64",
      "--config.model.num_layers=1",
      "--batch_tokens=256",
      "--seq_len=16",
      "--decode_sentences=8",
      "--pipeline_batches=5",
      f"--json={out}",
    ],
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  for text in (
    "matmul peak (cpu, float32",
    "MFU",
    "compilations after warm-up: 0",
    "beam 4:",
    "greedy 1:",
    "pipeline (synthetic, bucket)",
  ):
    assert text in proc.stdout, proc.stdout
  results = json.loads(out.read_text())
  train = results["train"]
  assert train["target_tokens_per_step"] == 256 and len(train["step_times_s"]) == 3
  assert 0 < train["mfu"] == train["achieved_flops"] / results["peak"]["peak_flops"]
  assert results["decode"]["beam"]["target_tokens"] > 0


@pytest.mark.slow
def test_paired_ab_runs_two_copies_of_a_checkout_side_by_side():

  from tools import paired_ab

  repo = os.path.dirname(os.path.dirname(os.path.abspath(paired_ab.__file__)))
  r = paired_ab.compare(repo, repo, "tiny", num_steps=2, overrides_b=dict(dropout_rate=0.0))
  assert len(r["step_times_a"]) == len(r["step_times_b"]) == 2
  assert r["flops_a"] == r["flops_b"] > 0 and r["ratio"] > 0
  assert paired_ab._parse_override("dropout_rate=0.3") == ("dropout_rate", 0.3)
  assert paired_ab._parse_override("norm=pre") == ("norm", "pre")
