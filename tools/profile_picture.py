"""Draws the training steps of a jax.profiler trace (its perfetto_trace.json.gz) as a picture:
a timeline of one step's XLA operations per thread, coloured by the part of the model they
belong to, and each part's time, the median over the traced steps.

    python tools/profile_picture.py TRACE_DIR_OR_FILE [--hlo=HLO_TEXT] \
        --output=docs/profile_base_step.png

TRACE_DIR_OR_FILE: a perfetto_trace.json.gz, or a directory searched for the newest one
(what `--config.profile_steps` or `t2t-bench --profile` wrote); steps are its
StepTraceAnnotations 'train'. The trace names each operation by its HLO name
('ynn_fusion.467'); --hlo, the optimized HLO text of the same program (XLA_FLAGS=
"--xla_dump_to=DIR --xla_dump_hlo_as_text", the *after_optimizations.txt file), gives each
its source (op_name: 'decoder/layer_5/ffn/wi/dot_general'), from which the part is read.
Without it, operations are grouped by HLO kind ('ynn_fusion'). The timeline shows the step
of median wall time; a preempted thread makes one step's operations look long, the median
over steps does not.
"""

import argparse
import collections
import glob
import gzip
import json
import os
import re

import numpy as np

# An XLA operation's kind: its HLO name without the instance number ('fusion.12' -> 'fusion').
_KIND = re.compile(r"^([A-Za-z_-]+?)(?:[._]\d+)*$")
COLOURS = (
  "#4878d0",
  "#ee854a",
  "#6acc64",
  "#d65f5f",
  "#956cb4",
  "#8c613c",
  "#dc7ec0",
  "#797979",
  "#d5bb67",
  "#82c6e2",
)


def find_trace(path: str) -> str:
  if os.path.isfile(path):
    return path
  found = glob.glob(os.path.join(path, "**", "perfetto_trace.json.gz"), recursive=True)
  if not found:
    raise SystemExit(f"{path}: no perfetto_trace.json.gz under it")
  return max(found, key=os.path.getmtime)


def load(path: str) -> tuple[list[dict], dict[tuple[int, int], str]]:
  """(complete events, {(pid, tid): thread name})."""
  with gzip.open(path, "rt", encoding="utf-8") as f:
    events = json.load(f)["traceEvents"]
  names = {
    (e["pid"], e.get("tid")): e["args"]["name"]
    for e in events
    if e.get("ph") == "M" and e.get("name") == "thread_name"
  }
  return [e for e in events if e.get("ph") == "X"], names


def kind(name: str) -> str:
  m = _KIND.match(name)
  return m.group(1) if m else name


# (substring of op_name, part), first match wins: the trainer's module names.
PARTS = (
  ("psum", "gradient psum"),
  ("/cond/", "Adam update (+ EMA)"),
  ("Dropout", "dropout"),
  ("norm_", "layer norm"),
  ("attention", "attention"),
  ("/ffn/", "feed-forward"),
  ("while/body/closed_call", "output layer + loss"),
  ("embed", "embedding"),
)


def op_sources(hlo_text: str) -> dict[str, str]:
  """{HLO instruction name: its op_name metadata} of an HLO text dump."""
  pattern = re.compile(r"^\s*(?:ROOT )?%?([\w.-]+) = .*?op_name=\"([^\"]+)\"", re.M)
  return {m.group(1): "/" + m.group(2) for m in pattern.finditer(hlo_text)}


def part(name: str, sources: dict[str, str] | None) -> str:
  if sources is None:
    return kind(name)
  source = sources.get(name)
  if source is None:
    return "other"
  return next((label for key, label in PARTS if key in source), "other")


def draw(trace: str, output: str, hlo: str | None = None, top: int = 9) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  events, names = load(trace)
  sources = None
  if hlo:
    with open(hlo, encoding="utf-8") as f:
      sources = op_sources(f.read())
  steps = sorted(
    (e for e in events if e["name"] == "train" and "step_num" in e.get("args", {})),
    key=lambda e: e["dur"],
  )
  if not steps:
    raise SystemExit(f"{trace}: no 'train' step annotations")
  # XLA's operations (events naming their HLO op), not the runtime's regions around them.
  ops = [e for e in events if "hlo_op" in e.get("args", {})]
  per_step = []
  for s in steps:
    totals = collections.Counter()
    for e in ops:
      if s["ts"] <= e["ts"] <= s["ts"] + s["dur"]:
        totals[part(e["name"], sources)] += e["dur"] / 1e6
    per_step.append(totals)
  labels = {k for t in per_step for k in t}
  median = {k: float(np.median([t.get(k, 0.0) for t in per_step])) for k in labels}
  parts = sorted(labels, key=median.get, reverse=True)[:top]
  colour = {k: COLOURS[i % len(COLOURS)] for i, k in enumerate(parts)}
  shown = steps[len(steps) // 2]  # the step of median wall time
  start, end = shown["ts"], shown["ts"] + shown["dur"]
  inside = [e for e in ops if start <= e["ts"] <= end]
  threads = sorted({(e["pid"], e.get("tid")) for e in inside}, key=lambda t: names.get(t, ""))
  fig, (ax, bx) = plt.subplots(2, 1, figsize=(11, 3.2 + 0.3 * len(threads) + 0.25 * len(parts)))
  for row, thread in enumerate(threads):
    bars = collections.defaultdict(list)
    for e in inside:
      if (e["pid"], e.get("tid")) == thread:
        bars[part(e["name"], sources)].append(((e["ts"] - start) / 1e3, e["dur"] / 1e3))
    for label, spans in bars.items():
      ax.broken_barh(spans, (row - 0.4, 0.8), color=colour.get(label, "#cccccc"), linewidth=0)
  ax.set_yticks(range(len(threads)), [names.get(t, str(t))[:24] for t in threads], fontsize=7)
  ax.set_xlim(0, (end - start) / 1e3)
  ax.set_xlabel("milliseconds into the step")
  ax.set_title(
    f"training step {shown['args']['step_num']} (median wall time of {len(steps)} traced steps: "
    f"{(end - start) / 1e6:.2f} s): XLA operations per thread"
  )
  handles = [plt.Rectangle((0, 0), 1, 1, color=colour[k]) for k in parts]
  ax.legend(handles, parts, fontsize=7, ncol=5, loc="upper center", bbox_to_anchor=(0.5, -0.25))
  bx.barh(range(len(parts)), [median[k] for k in parts], color=[colour[k] for k in parts])
  bx.set_yticks(range(len(parts)), parts, fontsize=8)
  bx.invert_yaxis()
  bx.set_xlabel("seconds per step, summed over the XLA threads (median over the traced steps)")
  fig.tight_layout()
  fig.savefig(output, dpi=110)
  print(f"wrote {output}; per step: " + ", ".join(f"{k} {median[k]:.3f}s" for k in parts))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("trace")
  parser.add_argument("--hlo", help="the program's optimized HLO text (module docstring)")
  parser.add_argument("--output", default="profile_step.png")
  args = parser.parse_args()
  draw(find_trace(args.trace), args.output, args.hlo)


if __name__ == "__main__":
  main()
