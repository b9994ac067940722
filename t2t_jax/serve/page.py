"""The page's attention answers as pure functions (tests/test_serve_page.py): which lines of a
request get a map, and each map cut to a size a browser can draw.

A model's attention is `cross` [layers][heads][target pieces][source pieces] with the pieces
that label its axes (serve.worker.Model.attention). The page gets, for each of the first
`attention_lines` lines, every layer's mean over its heads, each axis cut at MAX_PIECES
pieces; one layer's heads come on demand (POST /api/attention). So an answer holds at most
attention_lines x layers x MAX_PIECES^2 weights, whatever the length of the lines.

The maps are shaped in a batching thread, alone (the Batcher's `call`) and the answer
is written as JSON in a worker thread (`json_body`), never on the event loop.
"""

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from t2t_jax.serve import api

MAX_PIECES = 64  # each axis of a map the page gets: the first pieces of longer lines


def lines_note(translated: int, mapped: int) -> str | None:
  """The answer's note when some translated lines have no map."""
  if translated <= mapped:
    return None
  if mapped == 0:
    return f"no attention shown ({translated} lines translated)"
  return f"attention shown for the first {mapped} lines ({translated} lines translated)"


def _cut(cross: Sequence[Any], targets: int, sources: int) -> np.ndarray:
  """cross's first `targets` x `sources` cells of every layer and head, as an array (the
  nested lists are cut before they are converted, so a long line costs little)."""
  return np.asarray(
    [[[row[:sources] for row in head[:targets]] for head in layer] for layer in cross],
    np.float64,
  ).reshape(len(cross), len(cross[0]) if len(cross) else 0, targets, sources)


def _size_note(targets: int, sources: int, max_pieces: int) -> str | None:
  cut = []
  if targets > max_pieces:
    cut.append(f"the first {max_pieces} of {targets} target pieces")
  if sources > max_pieces:
    cut.append(f"the first {max_pieces} of {sources} source pieces")
  return "attention shown for " + " and ".join(cut) if cut else None


def line_attention(
  found: dict[str, Any], max_pieces: int = MAX_PIECES, layer: int | None = None
) -> dict[str, Any]:
  """A line's map for the page from a model's attention: `layers` [layer][target][source]
  the mean of each layer's heads (4 decimals), `heads` how many each layer has, `pieces`
  the line's [target, source] piece counts, the pieces of the axes shown and a `note` when
  they are cut; with `layer`, also that layer's heads as `layer_heads` [head][target][source]."""
  source, target = list(found["source_tokens"]), list(found["target_tokens"])
  cross = found["cross"]
  t, s = min(len(target), max_pieces), min(len(source), max_pieces)
  weights = _cut(cross, t, s)
  layers, heads = weights.shape[:2]
  answer: dict[str, Any] = dict(
    source_tokens=source[:s],
    target_tokens=target[:t],
    layers=np.round(weights.mean(axis=1), 4).tolist() if heads else [],
    heads=heads,
    pieces=[len(target), len(source)],
    note=_size_note(len(target), len(source), max_pieces),
  )
  if layer is not None:
    if not 0 <= layer < layers:
      raise api.ApiError(400, f"Invalid request: layer {layer} (the model has {layers} layers)")
    answer["layer"] = layer
    answer["layer_heads"] = np.round(weights[layer], 4).tolist()
  return answer


def json_body(content: Any) -> bytes:
  """The JSON of an answer, as Starlette's JSONResponse writes it."""
  return json.dumps(
    content, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")
  ).encode("utf-8")
