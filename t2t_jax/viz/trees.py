"""Constituency trees drawn side by side: the gold tree of a sentence beside the parser's
(paper section 6.3), as a matplotlib Figure (the `viz` extra).

    from t2t_jax import viz
    from t2t_jax.data import trees
    gold = next(trees.parse_brackets("(S (NP (NNP John)) (VP (VBZ sleeps)) (. .))"))[0]
    parsed, _ = trees.rebuild("(S (NP XX )NP (VP XX )VP XX )S", gold.leaves())
    viz.tree_pair(gold, parsed, path="tree.png")

Leaves sit on one bottom row in sentence order, each constituent is centred over its
children, and brackets the other tree lacks (same label and words) are drawn in red, so the
parser's mistakes stand out.
"""

import os
from typing import TYPE_CHECKING

from t2t_jax.data import trees

if TYPE_CHECKING:  # matplotlib is the optional `viz` extra, imported when drawing
  from matplotlib.axes import Axes
  from matplotlib.figure import Figure

DPI = 130
MATCH, MISS = "#1f4e79", "#c0392b"


def _spans(tree: trees.Tree) -> set[tuple[int, int, str]]:
  out = set()

  def walk(node: trees.Tree, start: int) -> int:
    if node.is_preterminal:
      return start + 1
    end = start
    for child in node.children:
      end = walk(child, end)
    out.add((start, end, node.label))
    return end

  walk(tree, 0)
  return out


def _layout(tree: trees.Tree) -> tuple[list[tuple], list[str]]:
  """(x, depth, label, span, the children's x) of every node, and the leaf words; a
  preterminal's span is None (its tag is drawn over its word, not as a bracket)."""
  nodes, words = [], []

  def walk(node: trees.Tree, depth: int, start: int) -> tuple[float, int]:
    if node.is_preterminal:
      x = float(len(words))
      words.append(node.children[0])
      nodes.append((x, depth, node.label, None, [(x, None)]))
      return x, start + 1
    end, xs = start, []
    for child in node.children:
      cx, end = walk(child, depth + 1, end)
      xs.append(cx)
    x = (xs[0] + xs[-1]) / 2
    nodes.append((x, depth, node.label, (start, end, node.label), xs))
    return x, end

  walk(tree, 0, 0)
  return nodes, words


def _draw(ax: "Axes", tree: trees.Tree, other: set[tuple[int, int, str]], title: str) -> None:
  nodes, words = _layout(tree)
  bottom = max(depth for _, depth, *_ in nodes) + 1.5
  by_x = {}
  for x, depth, *_ in nodes:
    by_x.setdefault(x, []).append(depth)
  for x, depth, label, span, child_xs in nodes:
    if span is None:  # preterminal: tag, then a line down to its word
      ax.plot([x, x], [-depth, -bottom + 0.25], color="#999999", lw=0.8, zorder=1)
      ax.text(
        x,
        -depth,
        label,
        ha="center",
        va="center",
        fontsize=7,
        color="#555555",
        bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none"),
        zorder=3,
      )
      continue
    for cx in child_xs:
      child_depth = min(d for d in by_x[cx] if d > depth)
      ax.plot([x, cx], [-depth, -child_depth], color="#999999", lw=0.8, zorder=1)
    color = MATCH if span in other else MISS
    ax.text(
      x,
      -depth,
      label,
      ha="center",
      va="center",
      fontsize=9,
      color=color,
      fontweight="bold",
      bbox=dict(boxstyle="round,pad=0.2", fc="white", ec=color, lw=0.8),
      zorder=3,
    )
  for i, word in enumerate(words):
    ax.text(
      i, -bottom, word, ha="center", va="top", fontsize=9, rotation=40, rotation_mode="anchor"
    )
  ax.set_xlim(-1, len(words))
  ax.set_ylim(-bottom - 1.5, 0.7)
  ax.set_title(title, fontsize=10)
  ax.axis("off")


def tree_pair(
  gold: trees.Tree,
  predicted: trees.Tree,
  titles: tuple[str, str] = ("gold", "predicted"),
  path: str | None = None,
) -> "Figure":
  """The two trees of one sentence side by side (same words); returns the Figure, and writes
  a PNG when given `path`. Constituents missing from the other tree are red."""
  if gold.leaves() != predicted.leaves():
    raise ValueError("the two trees must have the same words")
  from matplotlib.figure import Figure

  gold_spans, pred_spans = _spans(gold), _spans(predicted)
  n = len(gold.leaves())
  fig = Figure(figsize=(max(8.0, 0.75 * n * 2), 5.5), layout="constrained")
  left, right = fig.subplots(1, 2)
  _draw(left, gold, pred_spans, titles[0])
  _draw(right, predicted, gold_spans, titles[1])
  if path:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=DPI)
  return fig
