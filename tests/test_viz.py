"""Pictures (t2t_jax.viz) and the attention weights they show.

The weights returned for plotting are checked against the forward pass itself: every
attention module's call is intercepted during `Translator.attention_weights`, and its output
must equal (returned weights) x (its V projection) x W^O; the weights must also equal an
independent float64 softmax(Q K^T / sqrt(d_k)) with the masks, for one sentence and for a
padded batch. Only the tests that draw need matplotlib (the `viz` extra).
"""

import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t_jax import viz
from t2t_jax.data.tokenizer import SymbolTokenizer
from t2t_jax.experiments import tiny
from t2t_jax.model import (
  layers,
  positional,
)
from t2t_jax.schedule import rsqrt_schedule
from t2t_jax.translate import Translator
from tests import numpy_reference, support

SYMBOLS = [str(i) for i in range(12)]
SOURCE, TARGET = "1 2 3 4 5 6", "6 5 4 3 2 1"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def needs_matplotlib():
  pytest.importorskip("matplotlib", reason="drawing needs matplotlib (the 'viz' extra)")


draws = pytest.mark.usefixtures("needs_matplotlib")


def _translator(impl="reference", seed=0):
  model, params = support.small_model(
    seed, vocab_size=4 + len(SYMBOLS), num_layers=2, max_len=32, attention_impl=impl
  )
  # Sharper attention than at initialisation, so a wrong weight shows as a large error.
  params = jax.tree_util.tree_map_with_path(
    lambda p, x: x * 4.0 if any(getattr(k, "key", None) == "query" for k in p) else x, params
  )
  return Translator(model, params, SymbolTokenizer(SYMBOLS))


@pytest.fixture(scope="module")
def translator():
  return _translator()


@pytest.fixture(scope="module")
def weights(translator):
  return translator.attention_weights(SOURCE, TARGET)


def _intercepted(run):
  """run()'s result, plus each attention module's (inputs, output) during it, by module path."""
  calls = {}

  def interceptor(next_fun, args, kwargs, context):
    out = next_fun(*args, **kwargs)
    if isinstance(context.module, layers.MultiHeadAttention) and context.method_name == "__call__":
      calls[context.module.path] = (args, out)
    return out

  with nn.intercept_methods(interceptor):
    result = run()
  return result, calls


def _attention_calls(translator, source, target):
  """Translator.attention_weights, plus each attention module's (inputs, output) in that pass."""
  return _intercepted(lambda: translator.attention_weights(source, target))


def _f64(x):
  return np.asarray(x, np.float64)


def _dense(p, x):
  """DenseGeneral [..., d_model] -> [..., heads, dim] in float64."""
  out = np.einsum("...d,dhe->...he", _f64(x), _f64(p["kernel"]))
  return out + _f64(p["bias"]) if "bias" in p else out


def _output_from_weights(p, weights, inputs_kv):
  """MultiHead output recomputed from given weights: (w V) W^O + b^O, float64."""
  heads = np.einsum("hqk,khe->qhe", _f64(weights), _dense(p["value"], inputs_kv))
  return np.einsum("qhe,hem->qm", heads, _f64(p["out"]["kernel"])) + _f64(p["out"]["bias"])


MODULES = {
  "encoder_self": ("encoder", "self_attention"),
  "decoder_self": ("decoder", "self_attention"),
  "cross": ("decoder", "cross_attention"),
}


@pytest.mark.parametrize("impl", ["reference", "xla"])
def test_weights_are_the_ones_the_forward_pass_uses(impl):
  t = _translator(impl)
  w, calls = _attention_calls(t, SOURCE, TARGET)
  assert len(calls) == 2 + 2 * 2  # every attention module of the 2+2 layers was seen
  n_src, n_tgt = 7, 7  # six symbols + EOS
  for kind, (part, name) in MODULES.items():
    for layer in range(2):
      (inputs_q, inputs_kv, _), out = calls[(part, f"layer_{layer}", name)]
      p = t.params[part][f"layer_{layer}"][name]
      got = w[kind][layer]
      # The module's own output, from the plotted weights.
      np.testing.assert_allclose(
        _output_from_weights(p, got, inputs_kv[0]),
        _f64(out[0]),
        atol=2e-5,
        err_msg=f"{kind} layer {layer}",
      )
      # An independent softmax(Q K^T / sqrt(d_k)) in float64, masked as the paper says.
      q, k = _dense(p["query"], inputs_q[0]), _dense(p["key"], inputs_kv[0])
      logits = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(q.shape[-1])
      if kind == "decoder_self":
        logits = np.where(np.tril(np.ones((n_tgt, n_tgt), bool)), logits, -np.inf)
      want = np.exp(logits - logits.max(-1, keepdims=True))
      want /= want.sum(-1, keepdims=True)
      np.testing.assert_allclose(got, want, atol=1e-5, err_msg=f"{kind} layer {layer}")
      assert got.shape == (
        4,
        n_tgt if kind != "encoder_self" else n_src,
        n_src if kind != "decoder_self" else n_tgt,
      )
      np.testing.assert_allclose(got.sum(-1), 1.0, rtol=1e-5)
  # Causal: a decoder position never attends ahead, and the first only to itself.
  assert np.all(np.triu(w["decoder_self"], k=1) == 0)
  np.testing.assert_allclose(w["decoder_self"][..., 0, 0], 1.0, rtol=1e-6)


def test_the_output_check_catches_wrong_weights():
  """The recomputation above fails for swapped layers, swapped heads or transposed maps."""
  t = _translator()
  w, calls = _attention_calls(t, SOURCE, TARGET)
  (_, kv, _), out = calls[("encoder", "layer_0", "self_attention")]
  p = t.params["encoder"]["layer_0"]["self_attention"]
  right = w["encoder_self"][0]
  for wrong in (w["encoder_self"][1], right[::-1], np.swapaxes(right, -1, -2)):
    err = np.abs(_output_from_weights(p, wrong, kv[0]) - _f64(out[0])).max()
    assert err > 1e-2, err
  assert np.abs(_output_from_weights(p, right, kv[0]) - _f64(out[0])).max() < 2e-5


def test_padded_batch_weights_are_the_masked_softmax(translator):
  """In a padded batch (as training sees), each module's weights are an independent float64
  softmax(Q K^T / sqrt(d_k)) over the keys allowed by masks built here from the token ids
  (padded queries and keys out, and future positions in the decoder), and its output is
  those weights x V x W^O; pad keys get exactly 0 and real rows sum to 1."""
  inputs = jnp.array([[5, 6, 7, 8, 1, 0, 0], [5, 6, 1, 0, 0, 0, 0]])
  targets = jnp.array([[8, 7, 6, 5, 1, 0], [6, 5, 1, 0, 0, 0]])
  (_, state), calls = _intercepted(
    lambda: translator.model.apply(
      {"params": translator.params}, inputs, targets, mutable=["intermediates"]
    )
  )
  inter = state["intermediates"]
  src_ok, tgt_ok = np.asarray(inputs) > 0, np.asarray(targets) > 0
  pair = lambda q_ok, k_ok: q_ok[:, None, :, None] & k_ok[:, None, None, :]  # [batch, 1, q, k]
  allowed = {
    "encoder_self": pair(src_ok, src_ok),
    "decoder_self": pair(tgt_ok, tgt_ok) & np.tril(np.ones((6, 6), bool)),
    "cross": pair(tgt_ok, src_ok),
  }
  for kind, (part, name) in MODULES.items():
    for layer in range(2):
      where = f"{kind} layer {layer}"
      (inputs_q, inputs_kv, _), out = calls[(part, f"layer_{layer}", name)]
      p = translator.params[part][f"layer_{layer}"][name]
      q, k, v = (
        _dense(p["query"], inputs_q),
        _dense(p["key"], inputs_kv),
        _dense(p["value"], inputs_kv),
      )
      heads, want = numpy_reference.attention(q, k, v, allowed[kind])
      got = np.asarray(inter[part][f"layer_{layer}"][name]["attention_weights"][0])
      np.testing.assert_allclose(got, want, atol=1e-5, err_msg=where)
      mask = np.broadcast_to(allowed[kind], got.shape)
      assert np.all(got[~mask] == 0), where
      real_rows = mask.any(-1)
      np.testing.assert_allclose(got.sum(-1)[real_rows], 1.0, rtol=1e-5, err_msg=where)
      assert real_rows.sum() < real_rows.size  # the batch does have padded query rows
      output = np.einsum("bqhe,hem->bqm", heads, _f64(p["out"]["kernel"])) + _f64(p["out"]["bias"])
      np.testing.assert_allclose(output, _f64(out), atol=2e-5, err_msg=where)


def _labels(fig):
  texts = set()
  for ax in fig.axes:
    for tick in ax.get_xticklabels() + ax.get_yticklabels():
      texts.add(tick.get_text())
  return texts


def _check_png(fig, path):
  from matplotlib.figure import Figure

  assert isinstance(fig, Figure)
  data = path.read_bytes()
  assert data[:8] == PNG_MAGIC and len(data) > 5000


def _labelled(ax):
  return ax.get_xlabel() and ax.get_ylabel() and ax.get_title()


@draws
@pytest.mark.parametrize("kind", ["encoder_self", "decoder_self", "cross"])
def test_attention_map_shows_the_weights_with_tokens(weights, kind, tmp_path):
  path = tmp_path / "map.png"
  fig = viz.attention_map(weights, kind, layer=1, head=2, path=str(path))
  _check_png(fig, path)
  ax, bar = fig.axes  # the map and its colour bar
  np.testing.assert_array_equal(ax.images[0].get_array(), weights[kind][1, 2])
  assert ax.images[0].get_clim() == (0.0, 1.0) and bar.get_ylabel() == "attention weight"
  rows = [t.get_text() for t in ax.get_yticklabels()]
  cols = [t.get_text() for t in ax.get_xticklabels()]
  src, tgt = SOURCE.split() + ["</s>"], TARGET.split() + ["</s>"]
  assert (rows, cols) == {
    "encoder_self": (src, src),
    "cross": (tgt, src),
    "decoder_self": (tgt, ["<s>"] + tgt[:-1]),
  }[kind]
  assert all(t.get_rotation() == 90 for t in ax.get_xticklabels())
  assert _labelled(ax) and "layer 1, head 2" in ax.get_title()
  assert viz.KINDS[kind] in ax.get_title()


@draws
def test_attention_map_from_a_translator_and_bad_indices(translator, weights):
  fig = viz.attention_map(translator, "cross", 0, 3, source=SOURCE, target=TARGET)
  np.testing.assert_allclose(fig.axes[0].images[0].get_array(), weights["cross"][0, 3])
  with pytest.raises(ValueError, match="layer 2 out of range, the model has 2"):
    viz.attention_map(weights, "cross", layer=2)
  with pytest.raises(ValueError, match="head 4 out of range"):
    viz.attention_map(weights, "cross", head=4)
  with pytest.raises(ValueError, match="attention kind 'decoder'"):
    viz.attention_map(weights, "decoder")
  with pytest.raises(ValueError, match="needs source= and target="):
    viz.attention_map(translator, "cross")
  with pytest.raises(ValueError, match="head 5 out of range, the model has 4"):
    viz.attention_lines(weights, "cross", head=[0, 5])
  with pytest.raises(ValueError, match="attention kind 'self'"):
    viz.attention_lines(weights, "self", head=None)


@draws
def test_attention_heads_grid(weights, tmp_path):
  path = tmp_path / "heads.png"
  fig = viz.attention_heads(weights, "encoder_self", layer=0, columns=2, path=str(path))
  _check_png(fig, path)
  maps = [ax for ax in fig.axes if ax.images]
  assert len(maps) == 4 and [ax.get_title() for ax in maps] == [f"head {h}" for h in range(4)]
  for h, ax in enumerate(maps):
    np.testing.assert_array_equal(ax.images[0].get_array(), weights["encoder_self"][0, h])
  assert "layer 0: all 4 heads" in fig.get_suptitle()
  assert maps[0].get_ylabel() and maps[2].get_xlabel()  # 2 x 2: left column, bottom row
  assert set(SOURCE.split()) <= _labels(fig)


@draws
def test_attention_lines_alpha_is_the_weight(weights, tmp_path):
  path = tmp_path / "lines.png"
  fig = viz.attention_lines(weights, "cross", layer=1, head=0, threshold=0.0, path=str(path))
  _check_png(fig, path)
  ax = fig.axes[0]
  (lines,) = ax.collections
  w = weights["cross"][1, 0]
  assert len(lines.get_segments()) == w.size
  np.testing.assert_allclose(lines.get_colors()[:, 3], w.ravel(), rtol=1e-6)
  (q0, k0), (q1, k1) = lines.get_segments()[1]  # query 0 -> key 1
  assert (q0, k0, q1, k1) == (0, 0, 1, -1)
  assert {"6", "1", "</s>"} <= _labels(fig) and "layer 1, head 0" in ax.get_title()
  assert [t.get_text() for t in fig.axes[1].get_yticklabels()] == SOURCE.split() + ["</s>"]
  fig = viz.attention_lines(weights, "encoder_self", layer=0, head=None)
  assert len(fig.axes[0].collections) == 4 and "heads 0, 1, 2, 3" in fig.axes[0].get_title()


@draws
def test_positional_encoding_picture(tmp_path):
  path = tmp_path / "pe.png"
  fig = viz.positional_encoding(length=50, d_model=32, dims=(0, 1, 10), path=str(path))
  _check_png(fig, path)
  heat, curves = fig.axes[:2]
  table = np.asarray(positional.sinusoidal(50, 32))
  np.testing.assert_array_equal(heat.images[0].get_array(), table)
  assert heat.get_xlabel().startswith("dimension") and heat.get_ylabel() == "position"
  np.testing.assert_array_equal(curves.lines[2].get_ydata(), table[:, 10])
  assert "dim 1 (cos" in curves.get_legend().get_texts()[1].get_text()


@draws
def test_learning_rate_schedule_picture(tmp_path):
  config = tiny.get_config()
  path = tmp_path / "lr.png"
  fig = viz.learning_rate_schedule(config, path=str(path))
  _check_png(fig, path)
  ax = fig.axes[0]
  curve, warmup = ax.lines
  steps, rates = curve.get_xdata(), curve.get_ydata()
  assert steps[0] == 1 and steps[-1] == config.num_train_steps
  schedule = rsqrt_schedule(64, config.warmup_steps, config.learning_rate_factor)
  np.testing.assert_allclose(rates, np.asarray(schedule(steps)), rtol=1e-6)
  assert steps[np.argmax(rates)] == config.warmup_steps == warmup.get_xdata()[0]
  assert _labelled(ax) and "warmup_steps = 200" in ax.get_legend().get_texts()[0].get_text()


def _metrics_workdir(tmp_path):
  records = [
    dict(step=100, time=1000.0, loss=3.0),
    dict(step=200, time=1030.0, loss=2.0, eval_loss=2.5, dev_bleu=10.0),
    dict(step=300, loss=1.5),  # no time
    dict(step=400, time=1150.0, loss=1.0, eval_loss=1.2, dev_bleu=30.0),
    dict(step=400, time=1160.0, test_bleu=31.0),
  ]  # the test record: no loss
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
  return str(tmp_path)


@draws
def test_training_curves(tmp_path):
  workdir = _metrics_workdir(tmp_path)
  path = tmp_path / "curves.png"
  fig = viz.training_curves(workdir, title="run", path=str(path))
  _check_png(fig, path)
  loss_ax, step_ax, time_ax = fig.axes
  train, dev = loss_ax.lines
  np.testing.assert_array_equal(train.get_xdata(), [100, 200, 300, 400])
  np.testing.assert_array_equal(dev.get_ydata(), [2.5, 1.2])
  np.testing.assert_array_equal(step_ax.lines[0].get_xydata(), [[200, 10], [400, 30]])
  np.testing.assert_allclose(time_ax.lines[0].get_xydata(), [[0.5, 10], [2.5, 30]])
  for ax in fig.axes:
    assert _labelled(ax)
  # Records without BLEU, loss or time: empty panels say so instead of failing.
  fig = viz.training_curves([dict(step=1, time=0.0, loss=2.0), dict(step=2)])
  notes = [t.get_text() for ax in fig.axes for t in ax.texts]
  assert notes == ["no dev_bleu in the metrics", "no dev_bleu with time in the metrics"]
  fig = viz.training_curves([])
  assert len([t for ax in fig.axes for t in ax.texts]) == 3


@draws
def test_learning_curve(tmp_path):
  workdir = _metrics_workdir(tmp_path)
  path = tmp_path / "bleu.png"
  fig = viz.learning_curve(workdir, path=str(path))
  _check_png(fig, path)
  ax = fig.axes[0]
  np.testing.assert_allclose(ax.lines[0].get_xydata(), [[0.5, 10], [2.5, 30]])
  assert _labelled(ax) and ax.get_legend() is None
  runs = {"a": workdir, "b": [dict(step=1, time=0.0, dev_bleu=5.0)]}
  fig = viz.learning_curve(runs)
  assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == ["a", "b"]
  fig = viz.learning_curve([dict(step=1, time=0.0, loss=1.0)])
  assert fig.axes[0].texts[0].get_text() == "no dev_bleu with time in the metrics"
  # Parsing's dev F1: the same curve of another record field, labelled as F1.
  records = [dict(step=1, time=0.0, dev_f1=5.0, dev_bleu=1.0), dict(step=2, time=60.0, dev_f1=9.0)]
  fig = viz.learning_curve(records, metric="dev_f1")
  np.testing.assert_allclose(fig.axes[0].lines[0].get_xydata(), [[0, 5], [1, 9]])
  assert fig.axes[0].get_ylabel() == "dev bracket F1"
