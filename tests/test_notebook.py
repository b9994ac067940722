"""experiments/notebooks/explore.ipynb runs end to end on CPU and draws every picture.

The parameter cell reads T2T_NOTEBOOK_WORKDIR / _NUM_STEPS / _OUT_DIR, so the run trains a
short tiny model in tmp_path; the kernel gets one CPU device, as a user's notebook has.
"""

import json
import pathlib

import pytest

from tests import support

pytestmark = pytest.mark.slow  # trains a model end to end

nbformat = pytest.importorskip("nbformat", reason="the notebook test needs nbformat ('dev' extra)")
nbclient = pytest.importorskip("nbclient", reason="the notebook test needs nbclient ('dev' extra)")
pytest.importorskip("ipykernel", reason="the notebook test needs ipykernel ('dev' extra)")
pytest.importorskip("matplotlib", reason="the notebook draws with matplotlib ('viz' extra)")

NOTEBOOK = (
  pathlib.Path(__file__).resolve().parents[1] / "experiments" / "notebooks" / "explore.ipynb"
)
PICTURES = [
  f"{kind}_layer{layer}_heads.png"
  for kind in ("encoder_self", "decoder_self", "cross")
  for layer in (0, 1)
] + [
  "cross_layer1_head0.png",
  "encoder_self_layer1_head1_lines.png",
  "encoder_self_layer1_lines.png",
  "cross_layer1_head0_lines.png",
  "positional_encoding.png",
  "learning_rate.png",
  "learning_rate_base.png",
  "training_curves.png",
  "dev_bleu.png",
]
STEPS = 100  # the notebook evaluates dev BLEU every 100 steps: one point


def _run(nb):
  client = nbclient.NotebookClient(
    nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}
  )
  client.execute()
  return nb


def _text(cell) -> str:
  return "".join(o.get("text", "") for o in cell.get("outputs", []))


def test_notebook_trains_translates_and_saves_every_picture(tmp_path, monkeypatch):
  workdir, out = tmp_path / "workdir", tmp_path / "pictures"
  monkeypatch.setenv("T2T_NOTEBOOK_WORKDIR", str(workdir))
  monkeypatch.setenv("T2T_NOTEBOOK_NUM_STEPS", str(STEPS))
  monkeypatch.setenv("T2T_NOTEBOOK_OUT_DIR", str(out))
  monkeypatch.setenv("XLA_FLAGS", support.cpu_env()["XLA_FLAGS"])  # one device, as a user has
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  nb = nbformat.read(NOTEBOOK, as_version=4)
  code = [c for c in nb.cells if c.cell_type == "code"]
  assert all(not c.outputs and c.execution_count is None for c in code), (
    "commit the notebook with its outputs cleared"
  )

  nb = _run(nb)
  for name in PICTURES:
    data = (out / name).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000, name
  assert sorted(p.name for p in out.iterdir()) == sorted(PICTURES)
  records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert records[-1]["step"] == STEPS and any("dev_bleu" in r for r in records)
  translations = next(_text(c) for c in code if "translator.translate(" in c.source)
  assert translations.count(" -> ") == 3
  images = sum(
    o.get("output_type") in ("display_data", "execute_result") and "image/png" in o.get("data", {})
    for c in code
    for o in c.outputs
  )
  assert images == len(PICTURES)  # every picture is also shown in the notebook

  # Run again on the same workdir: it loads the checkpoint instead of training.
  again = nbformat.read(NOTEBOOK, as_version=4)
  train_cell = next(i for i, c in enumerate(again.cells) if "train_and_evaluate(config" in c.source)
  again.cells = again.cells[: train_cell + 1]
  before = (workdir / "metrics.jsonl").read_text()
  _run(again)
  assert "holds checkpoints: loading them" in _text(again.cells[train_cell])
  assert (workdir / "metrics.jsonl").read_text() == before
