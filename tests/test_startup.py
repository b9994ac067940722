"""What a command pays before its first step: the TensorBoard writer must not import torch
(tensorboardX imports it, where installed, only to accept torch tensors: seconds per start)."""

import importlib.util
import subprocess
import sys

import pytest


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_the_metrics_writer_leaves_torch_unimported(tmp_path):
  code = (
    "import sys; from t2t_jax.training import summary; "
    f"s = summary.MetricsWriter({str(tmp_path)!r}); s.write(1, dict(loss=2.0)); s.close(); "
    "print('torch' in sys.modules)"
  )
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert proc.stdout.split()[-1] == "False"
  assert list((tmp_path / "tensorboard").iterdir())  # the event file is still written
