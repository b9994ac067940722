"""Pictures of a Transformer and its training, as matplotlib Figures (the `viz` extra).

Attention maps of any layer and head (encoder self-attention, decoder self-attention and
encoder-decoder attention) with the subword tokens on the axes, the paper's line view of
Figures 3-5, the sinusoidal position table, an experiment's learning-rate schedule, and
training curves from a workdir's metrics.jsonl. Each function returns a
`matplotlib.figure.Figure` (no pyplot state; Jupyter displays it) and also writes a PNG
when given `path=`:

    from t2t_jax import viz
    from t2t_jax.experiments import tiny
    from t2t_jax.decoding.translator import Translator

    translator = Translator.from_workdir("workdirs/tiny")
    weights = translator.attention_weights("1 2 3 4 5", "5 4 3 2 1")
    viz.attention_map(weights, "cross", layer=1, head=0, path="cross.png")
    viz.attention_heads(weights, "encoder_self", layer=0)   # every head of one layer
    viz.attention_lines(weights, "encoder_self", layer=1, head=2)
    viz.positional_encoding(length=100, d_model=64)
    viz.learning_rate_schedule(tiny.get_config())
    viz.training_curves("workdirs/tiny")
    viz.learning_curve("workdirs/multi30k", path="dev_bleu.png")
    viz.architecture_diagram(model_config)   # the paper's Figure 1 with real sizes
    viz.bleu_chart({"ours": "workdirs/multi30k"})  # beside the paper's Table 2

`weights` may also be a Translator, with `source=` and `target=` given. Query tokens label
the rows and key tokens the columns. A decoder position is labelled with the token it
predicts as a query, and with the token it reads (BOS, then the target shifted right) as a
key of decoder self-attention: position i reads target token i-1 and predicts token i.
"""

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import ml_collections
import numpy as np

from t2t_jax.model import positional
from t2t_jax.run.workdir import read_metrics
from t2t_jax.schedule import rsqrt_schedule
from t2t_jax.viz import diagram

if TYPE_CHECKING:  # matplotlib is the optional `viz` extra, imported when drawing
  from matplotlib.axes import Axes
  from matplotlib.figure import Figure
  from matplotlib.image import AxesImage

  from t2t_jax.decoding.translator import Translator

# Translator.attention_weights' dict: per kind [layers, heads, queries, keys], and the tokens.
AttentionWeights = Mapping[str, Any]
Records = list[dict[str, Any]]  # metrics.jsonl lines
MetricsSource = str | os.PathLike | Iterable[dict[str, Any]]  # a workdir, or its records

# The paper's Figure 1 from a TransformerConfig, and our BLEU beside its Table 2.
architecture_diagram = diagram.architecture_diagram
bleu_chart = diagram.bleu_chart

KINDS = {
  "encoder_self": "encoder self-attention",
  "decoder_self": "decoder self-attention (masked)",
  "cross": "encoder-decoder attention",
}
BOS_LABEL = "<s>"
DPI = 130


def _figure(width: float, height: float) -> "Figure":
  from matplotlib.figure import Figure

  return Figure(figsize=(width, height), layout="constrained")


def _save(fig: "Figure", path: str | None) -> "Figure":
  if path:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=DPI)
  return fig


def _weights(
  weights: "AttentionWeights | Translator", source: str | None, target: str | None
) -> AttentionWeights:
  """The attention_weights dict, computing it when given a Translator."""
  if hasattr(weights, "attention_weights"):
    if source is None or target is None:
      raise ValueError("a Translator needs source= and target= to compute attention")
    return weights.attention_weights(source, target)
  return weights


def _check_kind(kind: str) -> None:
  if kind not in KINDS:
    raise ValueError(f"attention kind {kind!r}: one of {', '.join(KINDS)}")


def tokens(weights: AttentionWeights, kind: str) -> tuple[list[str], list[str]]:
  """(query tokens, key tokens): the row and column labels of a `kind` attention map."""
  _check_kind(kind)
  src, tgt = list(weights["source_tokens"]), list(weights["target_tokens"])
  if kind == "encoder_self":
    return src, src
  if kind == "decoder_self":
    return tgt, [BOS_LABEL] + tgt[:-1]
  return tgt, src


def _axis_names(kind: str) -> tuple[str, str]:
  query = "query: source token" if kind == "encoder_self" else "query: target token predicted"
  key = {
    "encoder_self": "key: source token",
    "cross": "key: source token",
    "decoder_self": "key: target token read (shifted right)",
  }[kind]
  return query, key


def _layer(
  weights: AttentionWeights, kind: str, layer: int, heads: Sequence[int] = ()
) -> np.ndarray:
  """[heads, queries, keys] of one layer, with the layer and `heads` indices checked."""
  _check_kind(kind)
  stack = np.asarray(weights[kind])
  if not 0 <= layer < stack.shape[0]:
    raise ValueError(f"{kind}: layer {layer} out of range, the model has {stack.shape[0]}")
  for head in heads:
    if not 0 <= head < stack.shape[1]:
      raise ValueError(f"{kind}: head {head} out of range, the model has {stack.shape[1]}")
  return stack[layer]


def _heatmap(
  ax: "Axes",
  matrix: np.ndarray,
  rows: Sequence[str],
  cols: Sequence[str],
  kind: str,
  label_rows: bool = True,
  label_cols: bool = True,
) -> "AxesImage":
  image = ax.imshow(
    matrix, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest"
  )
  size = max(5, min(10, 240 // max(len(rows), len(cols), 1)))
  query, key = _axis_names(kind)
  ax.set_yticks(range(len(rows)), rows if label_rows else [], fontsize=size)
  ax.set_xticks(range(len(cols)), cols if label_cols else [], fontsize=size, rotation=90)
  if label_rows:
    ax.set_ylabel(query)
  if label_cols:
    ax.set_xlabel(key)
  return image


def attention_map(
  weights: "AttentionWeights | Translator",
  kind: str = "cross",
  layer: int = 0,
  head: int = 0,
  *,
  source: str | None = None,
  target: str | None = None,
  path: str | None = None,
) -> "Figure":
  """One head's attention as a heatmap: query tokens on rows, key tokens on columns."""
  w = _weights(weights, source, target)
  heads = _layer(w, kind, layer, [head])
  rows, cols = tokens(w, kind)
  fig = _figure(1.6 + 0.3 * len(cols) + 1.4, 1.4 + 0.3 * len(rows) + 1.0)
  ax = fig.add_subplot()
  image = _heatmap(ax, heads[head], rows, cols, kind)
  ax.set_title(f"{KINDS[kind]}\nlayer {layer}, head {head}")
  fig.colorbar(image, ax=ax, label="attention weight", shrink=0.8)
  return _save(fig, path)


def attention_heads(
  weights: "AttentionWeights | Translator",
  kind: str = "cross",
  layer: int = 0,
  *,
  columns: int = 4,
  source: str | None = None,
  target: str | None = None,
  path: str | None = None,
) -> "Figure":
  """Every head of one layer side by side, on one colour scale (0 to 1)."""
  w = _weights(weights, source, target)
  heads = _layer(w, kind, layer)
  rows, cols = tokens(w, kind)
  ncols = min(columns, len(heads))
  nrows = math.ceil(len(heads) / ncols)
  cell_w, cell_h = 0.8 + 0.25 * len(cols), 0.6 + 0.25 * len(rows)
  fig = _figure(1.0 + ncols * cell_w + 1.0, 0.8 + nrows * cell_h + 0.8)
  axes = fig.subplots(nrows, ncols, squeeze=False)
  for h, ax in enumerate(axes.flat):
    if h >= len(heads):
      ax.set_visible(False)
      continue
    image = _heatmap(
      ax, heads[h], rows, cols, kind, label_rows=h % ncols == 0, label_cols=h + ncols >= len(heads)
    )
    ax.set_title(f"head {h}")
  fig.suptitle(f"{KINDS[kind]}, layer {layer}: all {len(heads)} heads")
  fig.colorbar(image, ax=axes, label="attention weight", shrink=0.8)
  return _save(fig, path)


def attention_lines(
  weights: "AttentionWeights | Translator",
  kind: str = "encoder_self",
  layer: int = 0,
  head: int | Sequence[int] | None = 0,
  *,
  threshold: float = 0.02,
  source: str | None = None,
  target: str | None = None,
  path: str | None = None,
) -> "Figure":
  """The paper's Figures 3-5: queries on the left, keys on the right, one line per weight.

  A line's opacity and width grow with the weight (weights under `threshold` are not
  drawn). `head` may be a list of heads (or None for all): one colour per head.
  """
  from matplotlib.collections import LineCollection
  from matplotlib.colors import to_rgba
  from matplotlib.lines import Line2D

  w = _weights(weights, source, target)
  _check_kind(kind)
  heads = (
    list(range(np.shape(w[kind])[1]))
    if head is None
    else ([head] if isinstance(head, int) else list(head))
  )
  stack = _layer(w, kind, layer, heads)
  rows, cols = tokens(w, kind)
  fig = _figure(4.8, 1.2 + 0.32 * max(len(rows), len(cols)))
  ax = fig.add_subplot()
  colours = [f"C{i % 10}" for i in range(len(heads))]
  for h, colour in zip(heads, colours):
    q, k = np.nonzero(stack[h] >= threshold)
    alpha = stack[h][q, k]
    segments = [[(0.0, -i), (1.0, -j)] for i, j in zip(q, k)]
    rgba = [to_rgba(colour, a) for a in alpha]
    ax.add_collection(LineCollection(segments, colors=rgba, linewidths=0.5 + 3.5 * alpha))
  n = max(len(rows), len(cols))
  ax.set(xlim=(-0.02, 1.02), ylim=(-n + 0.5, 0.5))
  query, key = _axis_names(kind)
  ax.set_xticks([0, 1], [query.replace(": ", "\n"), key.replace(": ", "\n")], fontsize=8)
  ax.set_yticks([-i for i in range(len(rows))], rows)
  right = ax.twinx()
  right.set_ylim(ax.get_ylim())
  right.set_yticks([-j for j in range(len(cols))], cols)
  for a in (ax, right):
    a.tick_params(length=0)
    for spine in a.spines.values():
      spine.set_visible(False)
  names = ", ".join(str(h) for h in heads)
  ax.set_title(f"{KINDS[kind]}\nlayer {layer}, head{'s' if len(heads) > 1 else ''} {names}")
  if len(heads) > 1:
    fig.legend(
      [Line2D([], [], color=c, lw=2) for c in colours],
      [f"head {h}" for h in heads],
      loc="outside lower center",
      ncol=min(4, len(heads)),
      fontsize=7,
      frameon=False,
    )
  return _save(fig, path)


def positional_encoding(
  length: int = 100,
  d_model: int = 128,
  dims: Sequence[int] = (6, 24, 25, 48),
  *,
  path: str | None = None,
) -> "Figure":
  """The sinusoidal table (eq. 5/6) as a heatmap, and a few of its dimensions as curves."""
  table = np.asarray(positional.sinusoidal(length, d_model))
  fig = _figure(12, 4.2)
  heat, curves = fig.subplots(1, 2, width_ratios=[1.1, 1])
  image = heat.imshow(table, cmap="RdBu_r", vmin=-1, vmax=1, aspect="auto", interpolation="nearest")
  heat.set(
    xlabel="dimension (even: sin, odd: cos)",
    ylabel="position",
    title=f"sinusoidal positional encoding, d_model {d_model}",
  )
  fig.colorbar(image, ax=heat, label="PE(position, dimension)")
  for d in dims:
    wavelength = 2 * math.pi * 10000 ** ((d - d % 2) / d_model)
    curves.plot(
      table[:, d], label=f"dim {d} ({'cos' if d % 2 else 'sin'}, wavelength {wavelength:.0f})"
    )
  curves.set(xlabel="position", ylabel="PE(position, dimension)", title="a few dimensions")
  curves.legend(fontsize=7, loc="lower left")
  return _save(fig, path)


def learning_rate_schedule(
  config: ml_collections.ConfigDict, num_steps: int | None = None, *, path: str | None = None
) -> "Figure":
  """The rate of eq. 3 at each training step of an experiment config (warmup marked)."""
  d_model, warmup = config.model.d_model, config.warmup_steps
  factor = config.learning_rate_factor
  total = num_steps or config.num_train_steps
  steps = np.unique(np.concatenate([np.linspace(1, total, 2000).astype(int), [min(warmup, total)]]))
  rates = np.asarray(rsqrt_schedule(d_model, warmup, factor)(steps))
  fig = _figure(6.4, 4.0)
  ax = fig.add_subplot()
  ax.plot(steps, rates)
  peak = factor * (d_model * warmup) ** -0.5
  ax.axvline(
    warmup, color="grey", linestyle="--", label=f"warmup_steps = {warmup} (peak {peak:.3g})"
  )
  ax.set(
    xlabel="training step",
    ylabel="learning rate",
    title=f"learning rate: d_model {d_model}, warmup {warmup}, factor {factor:g}",
  )
  ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 2))
  ax.legend()
  return _save(fig, path)


def _records(workdir_or_records: MetricsSource) -> Records:
  if isinstance(workdir_or_records, (str, os.PathLike)):
    return read_metrics(os.fspath(workdir_or_records))
  return list(workdir_or_records)


def _with_minutes(records: Records) -> Records:
  """Records with 'minutes' since the first record that has a time."""
  times = [r["time"] for r in records if "time" in r]
  if not times:
    return []
  return [dict(r, minutes=(r["time"] - times[0]) / 60) for r in records if "time" in r]


def _plot(ax: "Axes", records: Records, x: str, y: str, label: str | None, **kw: Any) -> int:
  points = [
    (r[x], r[y])
    for r in records
    if r.get(x) is not None and r.get(y) is not None and np.isfinite(r[y])
  ]
  if points:
    xs, ys = zip(*points)
    ax.plot(xs, ys, label=label, marker="o" if len(points) <= 30 else None, markersize=3, **kw)
  return len(points)


def _nothing(ax: "Axes", what: str) -> None:
  ax.text(
    0.5,
    0.5,
    f"no {what} in the metrics",
    ha="center",
    va="center",
    transform=ax.transAxes,
    color="grey",
  )


def training_curves(
  workdir_or_records: MetricsSource, *, title: str | None = None, path: str | None = None
) -> "Figure":
  """Training and dev loss vs step, dev BLEU vs step and vs wall-clock minutes."""
  records = _records(workdir_or_records)
  fig = _figure(14, 4.0)
  loss_ax, step_ax, time_ax = fig.subplots(1, 3)
  drawn = _plot(loss_ax, records, "step", "loss", "training loss")
  drawn += _plot(loss_ax, records, "step", "eval_loss", "dev loss")
  if drawn:
    losses = [r[k] for r in records for k in ("loss", "eval_loss") if r.get(k)]
    if min(losses) > 0 and max(losses) / min(losses) > 20:
      loss_ax.set_yscale("log")
    loss_ax.legend()
  else:
    _nothing(loss_ax, "loss or eval_loss")
  loss_ax.set(xlabel="step", ylabel="loss (per target token)", title="loss")
  if not _plot(step_ax, records, "step", "dev_bleu", "dev BLEU"):
    _nothing(step_ax, "dev_bleu")
  step_ax.set(xlabel="step", ylabel="dev BLEU", title="dev BLEU vs step")
  if not _plot(time_ax, _with_minutes(records), "minutes", "dev_bleu", "dev BLEU"):
    _nothing(time_ax, "dev_bleu with time")
  time_ax.set(
    xlabel="minutes since the first record", ylabel="dev BLEU", title="dev BLEU vs wall-clock time"
  )
  for ax in fig.axes:
    ax.grid(alpha=0.3)
  if title:
    fig.suptitle(title)
  return _save(fig, path)


def learning_curve(
  runs: MetricsSource | dict[str | None, MetricsSource],
  *,
  title: str = "dev BLEU during training",
  path: str | None = None,
  metric: str = "dev_bleu",
) -> "Figure":
  """A dev score vs wall-clock minutes: a workdir, a list of records, or {label: either}.
  metric: 'dev_bleu' (sacreBLEU) or 'dev_f1' (parsing's bracket F1)."""
  if not isinstance(runs, dict):
    runs = {None: runs}
  fig = _figure(6.4, 4.0)
  ax = fig.add_subplot()
  drawn = 0
  for label, run in runs.items():
    records = _with_minutes(_records(run))
    scored = [r for r in records if r.get(metric) is not None]
    if scored and _plot(ax, records, "minutes", metric, label):
      drawn += 1
      last = scored[-1]
      ax.annotate(
        f"{last[metric]:.1f}",
        (last["minutes"], last[metric]),
        textcoords="offset points",
        xytext=(-6, -6),
        ha="right",
        va="top",
        fontsize=8,
        bbox=dict(facecolor="white", edgecolor="none", alpha=0.8, pad=1),
      )
  if not drawn:
    _nothing(ax, f"{metric} with time")
  elif any(label is not None for label in runs):
    ax.legend()
  ylabel = {"dev_bleu": "dev BLEU (sacreBLEU)", "dev_f1": "dev bracket F1"}.get(metric, metric)
  ax.set(xlabel="minutes since the first record", ylabel=ylabel, title=title)
  ax.grid(alpha=0.3)
  return _save(fig, path)
