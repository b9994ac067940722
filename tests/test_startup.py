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


def test_translation_start_up_leaves_the_training_pipeline_and_moses_unimported():
  """t2t-translate and the Translator load neither grain (the training input pipeline),
  sacremoses (tokenized BLEU only) nor tensorflow_datasets (corpus preparation): all are
  slow to import and a translating process uses none; `t2t_jax.data` still offers
  get_datasets, and the text-file source its TFDS builder, on first use."""
  code = (
    "import sys; import t2t_jax.cli.translate, t2t_jax.decoding.translator; "
    "print(*(m in sys.modules for m in ('grain', 'sacremoses', 'tensorflow_datasets'))); "
    "from t2t_jax import data; data.get_datasets; print('grain' in sys.modules); "
    "from t2t_jax.data.sources import textfiles; "
    "print(textfiles.Textfiles.name, 'tensorflow_datasets' in sys.modules)"
  )
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert proc.stdout.split()[-6:] == ["False", "False", "False", "True", "textfiles", "True"]
