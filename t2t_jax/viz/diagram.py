"""The paper's figures drawn from our own configs and runs (matplotlib, no pyplot state).

  architecture_diagram(config)  Figure 1 (the model architecture) for any TransformerConfig,
                                labelled with its real sizes, post- or pre-norm as set.
  bleu_chart(runs)              Table 2's BLEU scores beside our runs' test and dev BLEU.

Each returns a `matplotlib.figure.Figure` (Agg-safe, no global state) and saves a PNG when
given `path`. Needs matplotlib (the `viz` extra).
"""

import math
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from t2t_jax.data import sources
from t2t_jax.run.workdir import Workdir

if TYPE_CHECKING:  # matplotlib is the optional `viz` extra, imported when drawing
  from matplotlib.axes import Axes
  from matplotlib.figure import Figure

  from t2t_jax.model import TransformerConfig

# One residual block: its boxes bottom to top, each (text, colour, height, role).
Block = list[tuple[str, str, float, str]]
Span = tuple[float, float]  # (bottom, top) of a box
# A workdir, several (labelled by directory name), or {label: workdir}.
RunPaths = str | Sequence[str] | dict[str, str]

# Figure 1's colours.
ATTENTION, ADD_NORM, FEED_FORWARD = "#fbe1bd", "#f4f3bd", "#c6e5f5"
EMBEDDING, LINEAR, SOFTMAX = "#f7cdd6", "#dcd4f0", "#c8e6c1"
EDGE, FRAME = "#555555", "#f1f1f1"
BOX_W, TALL, SHORT = 3.2, 0.8, 0.46  # box width, sub-layer and add/norm heights
GAP, GROUP_GAP = 0.32, 0.22  # between boxes; extra before each residual block
X_ENC, X_DEC = 4.0, 10.4
X_MAX = 14.6  # the axes span 0..X_MAX horizontally


def _figure(**kw: Any) -> "Figure":
  from matplotlib.figure import Figure

  return Figure(**kw)


def _save(fig: "Figure", path: str | None) -> "Figure":
  if path:
    fig.savefig(path, dpi=130)
  return fig


# ------------------------------------------------------------------------- Figure 1


def _attention_sizes(cfg: "TransformerConfig") -> str:
  dk, dv = cfg.key_dim, cfg.value_dim
  return (
    f"h = {cfg.num_heads}, d_k = d_v = {dk}"
    if dk == dv
    else (f"h = {cfg.num_heads}, d_k = {dk}, d_v = {dv}")
  )


def _blocks(cfg: "TransformerConfig", decoder: bool) -> list[Block]:
  """Residual blocks, each a list of (text, colour, height, role), bottom to top."""
  subs = [(f"Multi-Head Attention\n{_attention_sizes(cfg)}", ATTENTION, "self")]
  if decoder:
    subs = [
      (f"Masked Multi-Head Attention\n{_attention_sizes(cfg)}", ATTENTION, "self"),
      (f"Multi-Head Attention (enc-dec)\n{_attention_sizes(cfg)}", ATTENTION, "cross"),
    ]
  subs.append(
    (f"Feed Forward, ReLU\n{cfg.d_model} → {cfg.d_ff} → {cfg.d_model}", FEED_FORWARD, "ffn")
  )
  blocks = []
  for text, colour, role in subs:
    sub = (text, colour, TALL, role)
    if cfg.norm == "pre":  # x + Sublayer(LayerNorm(x))
      blocks.append([("Layer Norm", ADD_NORM, SHORT, "norm"), sub, ("Add", ADD_NORM, SHORT, "add")])
    else:  # LayerNorm(x + Sublayer(x)), the paper
      blocks.append([sub, ("Add & Norm", ADD_NORM, SHORT, "add")])
  return blocks


def _box(
  ax: "Axes",
  x: float,
  bottom: float,
  text: str,
  colour: str,
  height: float,
  fontsize: float = 8.5,
) -> float:
  from matplotlib.patches import FancyBboxPatch

  ax.add_patch(
    FancyBboxPatch(
      (x - BOX_W / 2, bottom),
      BOX_W,
      height,
      boxstyle="round,pad=0,rounding_size=0.12",
      fc=colour,
      ec=EDGE,
      lw=1.1,
      zorder=3,
    )
  )
  ax.text(x, bottom + height / 2, text, ha="center", va="center", fontsize=fontsize, zorder=4)
  return bottom + height


def _arrow(ax: "Axes", start: tuple[float, float], end: tuple[float, float], **kw: Any) -> None:
  ax.annotate(
    "",
    xy=end,
    xytext=start,
    zorder=2,
    arrowprops=dict(
      arrowstyle="-|>", color="0.15", lw=1.1, shrinkA=0, shrinkB=0, mutation_scale=11, **kw
    ),
  )


def _line(ax: "Axes", xs: Sequence[float], ys: Sequence[float]) -> None:
  ax.plot(xs, ys, color="0.15", lw=1.1, zorder=2, solid_capstyle="butt")


def _up(ax: "Axes", x: float, y: float, text: str, colour: str, height: float) -> Span:
  """An arrow up from y to a new box; returns (box bottom, box top)."""
  _arrow(ax, (x, y), (x, y + GAP))
  return y + GAP, _box(ax, x, y + GAP, text, colour, height)


def _stack(
  ax: "Axes", x: float, y: float, blocks: list[Block], side: int
) -> tuple[float, dict[str, Span]]:
  """Draws the residual blocks upwards from y (the stack's input) with their skip lines on
  `side` (-1 left, +1 right); returns (top, {role: (bottom, top)})."""
  where = {}
  for block in blocks:
    y += GROUP_GAP
    _line(ax, [x, x], [y - GROUP_GAP, y])
    branch = y + GAP / 2  # the skip line leaves the main line here
    for text, colour, height, role in block:
      where[role] = _up(ax, x, y, text, colour, height)
      y = where[role][1]
    _residual(ax, x, branch, sum(where["add"]) / 2, side)
  return y, where


def _residual(ax: "Axes", x: float, y_from: float, y_to: float, side: int) -> None:
  edge = x + side * BOX_W / 2
  outer = x + side * (BOX_W / 2 + 0.32)
  _line(ax, [x, outer, outer], [y_from, y_from, y_to])
  _arrow(ax, (outer, y_to), (edge, y_to))
  ax.plot([x], [y_from], "o", color="0.15", ms=3, zorder=3)


def _frame(ax: "Axes", x: float, bottom: float, top: float, layers: int, side: int) -> None:
  """The grey 'N x' frame around the repeated layer, its count outside on `side`."""
  from matplotlib.patches import FancyBboxPatch

  half = BOX_W / 2 + 0.55
  ax.add_patch(
    FancyBboxPatch(
      (x - half, bottom),
      2 * half,
      top - bottom,
      boxstyle="round,pad=0,rounding_size=0.25",
      fc=FRAME,
      ec="0.45",
      lw=1.0,
      zorder=1,
    )
  )
  ax.text(
    x + side * (half + 0.15),
    (bottom + top) / 2,
    f"N = {layers} ×",
    ha="left" if side > 0 else "right",
    va="center",
    fontsize=12,
    fontweight="bold",
  )


def _positions(ax: "Axes", cfg: "TransformerConfig", x: float, y: float, side: int) -> float:
  """The (+) of embeddings and positional encodings, with its label; returns its top."""
  from matplotlib.patches import Circle

  r = 0.2
  _arrow(ax, (x, y), (x, y + GAP))
  cy = y + GAP + r
  ax.add_patch(Circle((x, cy), r, fc="white", ec=EDGE, lw=1.1, zorder=3))
  ax.text(x, cy, "+", ha="center", va="center", fontsize=12, zorder=4)
  icon = x + side * 1.0
  ax.add_patch(Circle((icon, cy), r, fc="white", ec=EDGE, lw=1.1, zorder=3))
  t = np.linspace(-1, 1, 30)
  ax.plot(
    icon + 0.8 * r * t, cy + 0.5 * r * np.sin(math.pi * t * 1.5), color="0.2", lw=0.9, zorder=4
  )
  _line(ax, [icon - side * r, x + side * r], [cy, cy])
  kind = (
    "sinusoidal" if cfg.positional == "sinusoidal" else f"learned, {cfg.max_len} × {cfg.d_model}"
  )
  ax.text(
    icon + side * (r + 0.12),
    cy,
    f"Positional\nEncoding\n({kind})",
    fontsize=8,
    ha="left" if side > 0 else "right",
    va="center",
  )
  if cfg.dropout_rate:
    ax.text(
      x - side * (r + 0.1),
      cy,
      f"dropout\n{cfg.dropout_rate:g}",
      fontsize=7,
      style="italic",
      va="center",
      ha="left" if side < 0 else "right",
      color="0.3",
    )
  return cy + r


def _column(
  ax: "Axes", cfg: "TransformerConfig", x: float, decoder: bool
) -> tuple[float, dict[str, Span]]:
  """One side (inputs to stack output); returns (top, {role: (bottom, top)})."""
  side = 1 if decoder else -1
  name = "Outputs (shifted right)" if decoder else "Inputs"
  ax.text(x, 0.22, name, ha="center", va="center", fontsize=10)
  shared = " (shared)" if cfg.share_embeddings else ""
  embed = (
    f"{'Output' if decoder else 'Input'} Embedding{shared}\n"
    f"{cfg.vocab_size:,} × {cfg.d_model}, × √{cfg.d_model}"
  )
  _, top = _up(ax, x, 0.42, embed, EMBEDDING, TALL)
  y = _positions(ax, cfg, x, top, side)
  bottom = y + 0.12
  layers = cfg.decoder_layers if decoder else cfg.encoder_layers
  y, where = _stack(ax, x, y + 0.15, _blocks(cfg, decoder), side)
  _frame(ax, x, bottom, y + 0.18, layers, side)
  _line(ax, [x, x], [y, y + 0.18])
  y += 0.18
  if cfg.norm == "pre":  # a pre-norm stack ends with its own LayerNorm
    _, y = _up(ax, x, y, "Layer Norm (final)", ADD_NORM, SHORT)
  return y, where


def _output_layers(ax: "Axes", cfg: "TransformerConfig", x: float, y: float) -> float:
  share = "\n(the embedding matrix, shared)" if cfg.share_embeddings else ""
  _, y = _up(ax, x, y, f"Linear {cfg.d_model} → {cfg.vocab_size:,}{share}", LINEAR, TALL)
  _, y = _up(ax, x, y, "Softmax", SOFTMAX, SHORT)
  _arrow(ax, (x, y), (x, y + GAP))
  ax.text(x, y + GAP + 0.22, "Output Probabilities", ha="center", va="center", fontsize=10)
  return y + GAP + 0.45


def _encoder_to_decoder(ax: "Axes", enc_top: float, cross: Span) -> None:
  """The encoder output to the decoder's encoder-decoder attention (keys and values)."""
  bottom, top = cross
  y_cross = (bottom + top) / 2
  rise = enc_top + 0.35
  x_mid = (X_ENC + X_DEC) / 2
  _line(ax, [X_ENC, X_ENC, x_mid, x_mid], [enc_top, rise, rise, y_cross])
  _arrow(ax, (x_mid, y_cross), (X_DEC - BOX_W / 2, y_cross))
  ax.text(x_mid + 0.1, y_cross + 0.08, "K, V", fontsize=8, va="bottom")
  ax.text(x_mid - 0.1, rise + 0.08, "encoder output", fontsize=8, ha="right", va="bottom")


def _title(cfg: "TransformerConfig") -> str:
  layers = (
    f"N = {cfg.encoder_layers}"
    if cfg.encoder_layers == cfg.decoder_layers
    else f"N = {cfg.encoder_layers} encoder, {cfg.decoder_layers} decoder"
  )
  norm = "post-norm (paper)" if cfg.norm == "post" else "pre-norm"
  return (
    f"Transformer: {layers} layers, d_model = {cfg.d_model}, d_ff = {cfg.d_ff}, "
    f"h = {cfg.num_heads}, d_k = {cfg.key_dim}, d_v = {cfg.value_dim}\n"
    f"vocabulary {cfg.vocab_size:,}, P_drop = {cfg.dropout_rate:g}, {norm}, "
    f"{cfg.positional} positions, {np.dtype(cfg.dtype).name}"
  )


def _footnote(cfg: "TransformerConfig") -> str:
  notes = []
  if cfg.norm == "post":
    notes.append("Add & Norm = LayerNorm(x + Dropout(Sublayer(x)))")
  else:
    notes.append("pre-norm: x + Dropout(Sublayer(LayerNorm(x))); a final LayerNorm per stack")
  notes.append(
    f"dropout {cfg.dropout_rate:g} on each sub-layer output and on embeddings + "
    f"positions; attention dropout {cfg.attention_dropout_rate:g}"
  )
  notes.append(
    "one embedding matrix for source, target and the pre-softmax linear"
    if cfg.share_embeddings
    else "separate source, target and output matrices"
  )
  return "\n".join(notes)


def architecture_diagram(config: "TransformerConfig", path: str | None = None) -> "Figure":
  """The paper's Figure 1 for a `t2t_jax.model.TransformerConfig`, with its real sizes."""
  fig = _figure()
  ax = fig.add_axes([0.01, 0.06, 0.98, 0.87])
  ax.set_axis_off()
  enc_top, _ = _column(ax, config, X_ENC, decoder=False)
  dec_top, where = _column(ax, config, X_DEC, decoder=True)
  _encoder_to_decoder(ax, enc_top, where["cross"])
  top = _output_layers(ax, config, X_DEC, dec_top)
  ax.text(X_ENC, enc_top + 0.9, "Encoder", ha="center", fontsize=11, fontweight="bold")
  ax.text(
    X_DEC + BOX_W / 2 + 0.3,
    dec_top + GAP + TALL / 2,
    "Decoder",
    ha="left",
    va="center",
    fontsize=11,
    fontweight="bold",
  )
  ax.set(xlim=(0, X_MAX), ylim=(0, top), aspect="equal")
  # Equal aspect: the axes' height in inches follows from its width and the data's extent.
  width = 9.5
  fig.set_size_inches(width, width * 0.98 * top / X_MAX / 0.87)
  fig.suptitle(_title(config), fontsize=10.5, y=0.985)
  fig.text(0.02, 0.012, _footnote(config), fontsize=7.5, color="0.3", va="bottom")
  return _save(fig, path)


# --------------------------------------------------------------------------- Table 2

# The paper's Table 2: BLEU on newstest2014 (tokenized, compound splitting), (EN-DE, EN-FR).
# Transformer (big) EN-FR is 41.8 in the arXiv v5 text (41.0 in the NIPS 2017 version).
TABLE2 = (
  ("ByteNet", 23.75, None),
  ("Deep-Att + PosUnk", None, 39.2),
  ("GNMT + RL", 24.6, 39.92),
  ("ConvS2S", 25.16, 40.46),
  ("MoE", 26.03, 40.56),
  ("Deep-Att + PosUnk Ensemble", None, 40.4),
  ("GNMT + RL Ensemble", 26.30, 41.16),
  ("ConvS2S Ensemble", 26.36, 41.29),
  ("Transformer (base model)", 27.3, 38.1),
  ("Transformer (big)", 28.4, 41.8),
)
PAIR_COLOURS = {"en-de": "tab:blue", "en-fr": "tab:orange"}
PAPER_TEST_SET = "newstest2014"


def _test_set(config: dict[str, Any]) -> tuple[str, str, bool]:
  """(test set name, language pair 'en-de', comparable with Table 2) from config.json."""
  data = config.get("data", {})
  source = sources.find(data.get("source", ""))
  pair = f"{data['source_lang']}-{data['target_lang']}" if "target_lang" in data else "?"
  named = source.describe_test_set(data, pair) if source is not None else None
  if named is None:
    return "unknown test set", pair, False
  test_set, pair = named
  return test_set, pair, test_set == PAPER_TEST_SET and pair in ("en-de", "en-fr")


def read_run(workdir: str, label: str | None = None) -> dict[str, Any]:
  """A workdir's BLEU figures: the last test_bleu (sacreBLEU) and the dev_bleu series."""
  records = Workdir(workdir).read_metrics()
  tests = [r for r in records if "test_bleu" in r]
  config = Workdir(workdir).config_values() or {}
  test_set, pair, comparable = _test_set(config)
  return dict(
    label=label or os.path.basename(os.path.normpath(workdir)),
    workdir=workdir,
    test_bleu=tests[-1]["test_bleu"] if tests else None,
    test_tokenized_bleu=tests[-1].get("test_tokenized_bleu") if tests else None,
    test_step=tests[-1]["step"] if tests else None,
    dev_bleu=[(r["step"], r["dev_bleu"]) for r in records if "dev_bleu" in r],
    test_set=test_set,
    pair=pair,
    comparable=comparable,
  )


def _runs(runs: RunPaths) -> list[dict[str, Any]]:
  if isinstance(runs, str):
    runs = [runs]
  if isinstance(runs, dict):
    return [read_run(path, label) for label, path in runs.items()]
  return [read_run(path) for path in runs]


def _run_label(run: dict[str, Any]) -> str:
  label = f"ours: {run['label']}\n{run['test_set']} ({run['pair']}), sacreBLEU"
  label = label.replace(" (?)", "")
  if not run["comparable"]:
    label += f"\ndifferent test set, not {PAPER_TEST_SET}"
  if run["test_bleu"] is None:
    label += "\n(no test BLEU yet: last dev BLEU)"
  return label


def _bar(
  ax: "Axes",
  y: float,
  value: float,
  colour: str,
  height: float,
  text: str | None = None,
  **kw: Any,
) -> None:
  ax.barh(y, value, height=height, color=colour, **kw)
  ax.text(value + 0.3, y, text or f"{value:g}", va="center", fontsize=7.5)


def _table2_bars(ax: "Axes", runs: list[dict[str, Any]]) -> None:
  """Horizontal bars: Table 2's rows (EN-DE and EN-FR side by side), ours on top."""
  labels, y = [], 0
  for name, de, fr in TABLE2:
    for value, pair, offset in ((de, "en-de", -0.2), (fr, "en-fr", 0.2)):
      if value is not None:
        _bar(ax, y + offset, value, PAIR_COLOURS[pair], 0.38)
    labels.append(name + ("*" if name == "Transformer (big)" else ""))
    y += 1
  ax.axhline(y - 0.5, color="0.4", ls="--", lw=0.8)
  for run in runs:
    value = run["test_bleu"]
    if value is None and run["dev_bleu"]:
      value = run["dev_bleu"][-1][1]
    if value is not None:
      tokenized = run["test_tokenized_bleu"]
      text = f"{value:.2f}" + (f" (tokenized {tokenized:.2f})" if tokenized else "")
      _bar(
        ax,
        y,
        value,
        PAIR_COLOURS.get(run["pair"], "tab:gray"),
        0.6,
        text,
        hatch="//",
        edgecolor="white",
        alpha=0.9,
      )
    labels.append(_run_label(run))
    y += 1
  ax.set_yticks(range(len(labels)), labels, fontsize=7.5)
  ax.set_xlim(0, 1.25 * max(ax.get_xlim()[1], 1.0))  # room for the value labels
  ax.set(
    xlabel="BLEU\n* EN-FR 41.8 in the arXiv v5 text, 41.0 in the NIPS 2017 version",
    title=f"Paper's Table 2 ({PAPER_TEST_SET}, tokenized BLEU) and ours",
  )
  from matplotlib.patches import Patch

  ax.legend(
    handles=[
      Patch(color=PAIR_COLOURS["en-de"], label="EN-DE"),
      Patch(color=PAIR_COLOURS["en-fr"], label="EN-FR"),
      Patch(fc="tab:gray", hatch="//", ec="white", label="ours (test)"),
    ],
    loc="lower right",
    fontsize=8,
  )
  ax.grid(True, axis="x", alpha=0.3)


def _dev_curves(ax: "Axes", runs: list[dict[str, Any]]) -> None:
  for run in runs:
    colour = PAIR_COLOURS.get(run["pair"], "tab:gray")
    if run["dev_bleu"]:
      steps, bleu = zip(*run["dev_bleu"])
      ax.plot(steps, bleu, "o-", ms=3, color=colour, label=f"{run['label']}: dev BLEU")
    if run["test_bleu"] is not None:
      ax.plot(
        [run["test_step"]],
        [run["test_bleu"]],
        "*",
        ms=12,
        color=colour,
        label=f"{run['label']}: test {run['test_bleu']:.2f} ({run['test_set']})",
      )
  ax.set(
    xlabel="training step", ylabel="BLEU (sacreBLEU)", title="Our runs: dev BLEU during training"
  )
  ax.grid(True, alpha=0.3)
  if runs:
    ax.legend(fontsize=7.5, loc="lower right")


def bleu_chart(runs: RunPaths, path: str | None = None) -> "Figure":
  """Table 2 of the paper beside our runs' BLEU (bars) and their dev BLEU curves.

  `runs`: a workdir, a list of workdirs (labelled by directory name) or {label: workdir};
  each needs metrics.jsonl (test_bleu, dev_bleu records) and ideally config.json, which
  says which test set the run was scored on; runs not scored on newstest2014 in one of the
  paper's directions are marked as not comparable.
  """
  runs = _runs(runs)
  fig = _figure(figsize=(13, 0.42 * (len(TABLE2) + 2 * len(runs)) + 2.2), layout="constrained")
  left, right = fig.subplots(1, 2, width_ratios=(1.5, 1))
  _table2_bars(left, runs)
  _dev_curves(right, runs)
  return _save(fig, path)
