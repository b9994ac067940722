"""Figure 1 from a TransformerConfig and Table 2 beside our runs' BLEU (t2t_jax.viz.diagram)."""

import json
import os

import pytest

from t2t_jax.experiments import base
from t2t_jax.model import TransformerConfig
from t2t_jax.viz import diagram


def _texts(fig) -> str:
  """Every string drawn on the figure: title, figure and axes texts, tick labels, labels."""
  texts = [fig.get_suptitle()] + [t.get_text() for t in fig.texts]
  for ax in fig.axes:
    texts += [t.get_text() for t in ax.texts + ax.get_yticklabels()]
    texts += [ax.get_title(), ax.get_xlabel(), ax.get_ylabel()]
    if ax.get_legend():
      texts += [t.get_text() for t in ax.get_legend().get_texts()]
  return "\n".join(texts)


def base_config():
  return TransformerConfig.from_dict(base.get_config().model.to_dict(), vocab_size=37000)


def test_architecture_diagram_base(tmp_path):
  path = str(tmp_path / "base.png")
  text = _texts(diagram.architecture_diagram(base_config(), path))
  for label in (
    "N = 6 ×",
    "d_model = 512",
    "d_ff = 2048",
    "512 → 2048 → 512",
    "h = 8",
    "d_k = d_v = 64",
    "37,000 × 512",
    "Masked Multi-Head Attention",
    "Multi-Head Attention (enc-dec)",
    "Add & Norm",
    "Positional\nEncoding",
    "Linear 512 → 37,000",
    "Softmax",
    "Output Probabilities",
    "post-norm",
    "P_drop = 0.1",
    "K, V",
  ):
    assert label in text, label
  assert "Layer Norm" not in text
  assert os.path.getsize(path) > 10_000


def test_architecture_diagram_pre_norm_and_uneven_stacks(tmp_path):
  cfg = base_config().replace(
    d_model=256,
    d_ff=1024,
    num_heads=4,
    num_encoder_layers=3,
    num_decoder_layers=2,
    norm="pre",
    positional="learned",
    share_embeddings=False,
    dropout_rate=0.3,
  )
  fig = diagram.architecture_diagram(cfg)
  text = _texts(fig)
  for label in (
    "N = 3 ×",
    "N = 2 ×",
    "N = 3 encoder, 2 decoder",
    "d_model = 256",
    "d_ff = 1024",
    "256 → 1024 → 256",
    "h = 4",
    "d_k = d_v = 64",
    "pre-norm",
    "Layer Norm (final)",
    "learned",
    "P_drop = 0.3",
    "separate",
  ):
    assert label in text, label
  assert "Add & Norm" not in text and "(shared)" not in text
  fig.savefig(str(tmp_path / "pre.png"))


def _workdir(root, name, records, data=None):
  workdir = root / name
  workdir.mkdir()
  with open(workdir / "metrics.jsonl", "w", encoding="utf-8") as f:
    f.writelines(json.dumps(r) + "\n" for r in records)
  if data is not None:
    (workdir / "config.json").write_text(json.dumps(dict(data=data)))
  return str(workdir)


def test_bleu_chart_reads_workdirs_and_marks_other_test_sets(tmp_path):
  multi30k = _workdir(
    tmp_path,
    "multi30k",
    [
      dict(step=400, time=1.0, dev_bleu=20.5),
      dict(step=400, time=1.0, loss=2.0),
      dict(step=800, time=2.0, dev_bleu=30.25),
      dict(step=800, time=3.0, test_bleu=35.22, test_tokenized_bleu=35.27),
    ],
    dict(
      source="textfiles",
      source_lang="en",
      target_lang="de",
      test_source="/data/multi30k/test2016.en",
    ),
  )
  wmt = _workdir(
    tmp_path,
    "wmt_base",
    [dict(step=100, time=1.0, dev_bleu=4.0)],
    dict(source="wmt14_translate", source_lang="en", target_lang="de"),
  )
  bare = _workdir(tmp_path, "bare", [dict(step=5, time=1.0, test_bleu=1.5)])
  run = diagram.read_run(multi30k)
  assert run["test_bleu"] == 35.22 and run["dev_bleu"] == [(400, 20.5), (800, 30.25)]
  assert run["test_set"] == "multi30k/test2016" and run["pair"] == "en-de"
  assert not run["comparable"] and diagram.read_run(wmt)["comparable"]

  path = str(tmp_path / "bleu.png")
  fig = diagram.bleu_chart([multi30k, wmt, bare], path)
  text = _texts(fig)
  for label in (
    "ours: multi30k\nmulti30k/test2016 (en-de), sacreBLEU\ndifferent test set",
    "ours: wmt_base\nnewstest2014 (en-de)",
    "no test BLEU yet",
    "ours: bare",
    "Transformer (big)*",
    "ByteNet",
    "35.22 (tokenized 35.27)",
    "28.4",
    "41.8",
    "multi30k: dev BLEU",
    "multi30k: test 35.22",
  ):
    assert label in text, label
  assert "ours: wmt_base\nnewstest2014 (en-de), sacreBLEU\ndifferent" not in text
  bars, curves = fig.axes
  widths = sorted(p.get_width() for p in bars.patches)
  assert 35.22 in widths and 23.75 in widths and 28.4 in widths
  dev = [line for line in curves.get_lines() if line.get_label() == "multi30k: dev BLEU"]
  assert list(dev[0].get_ydata()) == [20.5, 30.25]
  assert os.path.getsize(path) > 10_000


def test_bleu_chart_labels_and_missing_workdir(tmp_path):
  workdir = _workdir(tmp_path, "w", [dict(step=1, time=0.0, test_bleu=9.0)])
  assert "ours: my label" in _texts(diagram.bleu_chart({"my label": workdir}))
  with pytest.raises(FileNotFoundError):
    diagram.bleu_chart([str(tmp_path / "absent")])


def test_viz_offers_the_diagram_and_chart():
  from t2t_jax import viz

  assert viz.architecture_diagram is diagram.architecture_diagram
  assert viz.bleu_chart is diagram.bleu_chart
