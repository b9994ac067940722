"""The main job: `t2t-train --experiment=tiny` trains, translates its test split, and scores;
then `t2t-translate` on the same split reproduces the exact-match figure training reported.

Selected with `-m main_job` (conftest leaves it out otherwise): CI runs it as its own step.
"""

import os
import re
import subprocess
import sys

import pytest

from t2t_jax import data
from t2t_jax.decoding import translator as translate
from t2t_jax.run.workdir import read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.main_job]  # trains a model end to end

ENV = dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu")  # one CPU device, as a user has


def test_tiny_reaches_99_percent_exact_match(tmp_path):
  workdir = str(tmp_path / "tiny")
  proc = subprocess.run(
    [sys.executable, "-m", "t2t_jax.cli.train", "--experiment=tiny", f"--workdir={workdir}"],
    env=ENV,
    capture_output=True,
    text=True,
    timeout=1200,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  match = re.search(r"exact match ([\d.]+)%", proc.stderr)
  assert match, proc.stderr[-3000:]
  exact = float(match.group(1))
  test = [r for r in read_metrics(workdir) if "test_exact_match" in r][-1]
  print(f"\ntiny: test exact match {exact:.2f}%, sacreBLEU {test['test_bleu']:.2f}")
  assert abs(100 * test["test_exact_match"] - exact) < 0.01  # printed with 2 decimals
  assert exact >= 99.0

  # The same split through the command-line translator, from the saved checkpoint.
  pairs = data.get_datasets(translate.load_config(workdir).data, workdir).test_pairs
  src, out = tmp_path / "test.src", tmp_path / "test.out"
  src.write_text("".join(s + "\n" for s, _ in pairs))
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "t2t_jax.cli.translate",
      f"--workdir={workdir}",
      f"--input={src}",
      f"--output={out}",
    ],
    env=ENV,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  hyps = out.read_text().split("\n")[:-1]
  assert len(hyps) == len(pairs)
  again = sum(h == r for h, (_, r) in zip(hyps, pairs)) / len(pairs)
  assert again == test["test_exact_match"]
