"""The parsing experiment end to end on a handful of trees: t2t-train reports dev and test F1,
and t2t-translate --reference on the files it wrote reports the same test F1."""

import os
import re
import subprocess
import sys

import pytest

from t2t_jax.experiments import parsing
from t2t_jax.training import summary
from t2t_jax.training import trainer as train
from tests import support

PTB = support.shared_data_dir() / "ptb_sample"


def test_config_carries_the_paper_decoding_settings():
  config = parsing.get_config()
  assert (config.beam_size, config.alpha, config.max_output_extra) == (21, 0.3, 300)
  big = parsing.get_config("big")
  assert (big.model.num_layers, big.model.d_model) == (4, 1024)
  with pytest.raises(ValueError, match="'huge'"):
    parsing.get_config("huge")


@pytest.mark.slow
@pytest.mark.skipif(not PTB.is_dir(), reason="no ../shared/data/ptb_sample")
def test_parsing_trains_and_reports_f1(tmp_path):
  config = parsing.get_config()
  config.data.update(
    treebank_dir=str(PTB),
    treebank_train="1-4",
    treebank_dev="180",
    treebank_test="190",
    bucket_boundaries=(),
    max_len=96,
    bucket_min=96,
  )
  config.model.update(d_model=32, d_ff=64, num_heads=2, num_layers=1, max_len=128)
  config.update(
    num_train_steps=4,
    eval_every_steps=2,
    bleu_every_steps=2,
    checkpoint_every_steps=2,
    log_every_steps=2,
    beam_size=3,
    max_output_extra=20,
  )
  workdir = str(tmp_path / "w")
  last = train.train_and_evaluate(config, workdir)
  assert "dev_f1" in last and "test_f1" in last and last["step"] == 4
  records = summary.read_metrics(workdir)
  assert sum("dev_f1" in r for r in records) == 2
  for name in ("words", "gold", "trees"):
    lines = (tmp_path / "w" / f"test.{name}").read_text().splitlines()
    assert len(lines) == 5  # wsj_0190 holds 5 trees

  env = dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu")
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "t2t_jax.cli.translate",
      f"--workdir={workdir}",
      f"--input={workdir}/test.words",
      f"--reference={workdir}/test.gold",
      f"--output={tmp_path}/out",
    ],
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "beam 3, alpha 0.3" in proc.stderr  # the workdir's settings
  f1 = float(re.search(r"bracket F1 ([\d.]+)", proc.stderr).group(1))
  assert f1 == pytest.approx(last["test_f1"], abs=0.006)  # printed with 2 decimals

  (tmp_path / "bad").write_text("(S (NN a)\n")
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "t2t_jax.cli.translate",
      f"--workdir={workdir}",
      f"--input={workdir}/test.words",
      f"--reference={tmp_path}/bad",
    ],
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert proc.returncode != 0 and "bad: tree 1: line 1: bracket opened here" in proc.stderr
