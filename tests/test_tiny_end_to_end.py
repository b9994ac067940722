"""The main job: `t2t-train --experiment=tiny` trains, translates its test split, and scores."""

import os
import re
import subprocess
import sys

from t2t_jax import summary


def test_tiny_reaches_99_percent_exact_match(tmp_path):
  workdir = str(tmp_path / "tiny")
  env = dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu")  # one CPU device, as a user has
  proc = subprocess.run([sys.executable, "-m", "t2t_jax.main", "--experiment=tiny",
                         f"--workdir={workdir}"], env=env, capture_output=True, text=True,
                        timeout=1200)
  assert proc.returncode == 0, proc.stderr[-3000:]
  match = re.search(r"exact match ([\d.]+)%", proc.stderr)
  assert match, proc.stderr[-3000:]
  exact = float(match.group(1))
  test = [r for r in summary.read_metrics(workdir) if "test_exact_match" in r][-1]
  print(f"\ntiny: test exact match {exact:.2f}%, sacreBLEU {test['test_bleu']:.2f}")
  assert abs(100 * test["test_exact_match"] - exact) < 0.01  # printed with 2 decimals
  assert exact >= 99.0
