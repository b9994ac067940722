"""Draws one training step of a jax.profiler trace (its perfetto_trace.json.gz) as a picture:
a timeline of the step's events per thread, coloured by kind, and the time each kind of XLA
operation took summed over the threads.

    python tools/profile_picture.py TRACE_DIR_OR_FILE --step=2 --output=docs/profile_base_step.png

TRACE_DIR_OR_FILE: a perfetto_trace.json.gz, or a directory searched for the newest one
(what `--config.profile_steps` or `t2t-bench --profile` wrote). The step is the
StepTraceAnnotation 'train' of that number.
"""

import argparse
import collections
import glob
import gzip
import json
import os
import re

# An XLA operation's kind: its HLO name without the instance number ('fusion.12' -> 'fusion').
_KIND = re.compile(r"^([A-Za-z_-]+?)(?:[._]\d+)*$")
COLOURS = ("#4878d0", "#ee854a", "#6acc64", "#d65f5f", "#956cb4", "#8c613c", "#dc7ec0", "#797979")


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


def step_window(events: list[dict], step: int) -> tuple[float, float]:
  for e in events:
    if e["name"] == "train" and str(e.get("args", {}).get("step_num")) == str(step):
      return e["ts"], e["ts"] + e["dur"]
  raise SystemExit(f"no 'train' step annotation numbered {step} in the trace")


def kind(name: str) -> str:
  m = _KIND.match(name)
  return m.group(1) if m else name


def draw(trace: str, step: int, output: str, top: int = 8) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  events, names = load(trace)
  start, end = step_window(events, step)
  # XLA's operations (events naming their HLO op), not the runtime's regions around them.
  inside = [
    e
    for e in events
    if "hlo_op" in e.get("args", {}) and e["ts"] >= start and e["ts"] + e["dur"] <= end + 1
  ]
  totals = collections.Counter()
  for e in inside:
    totals[kind(e["name"])] += e["dur"]
  kinds = [k for k, _ in totals.most_common(top)]
  colour = {k: COLOURS[i % len(COLOURS)] for i, k in enumerate(kinds)}
  threads = sorted({(e["pid"], e.get("tid")) for e in inside}, key=lambda t: names.get(t, ""))
  fig, (ax, bx) = plt.subplots(
    2, 1, figsize=(11, 2.2 + 0.35 * len(threads) + 0.3 * len(kinds)), height_ratios=(3, 2)
  )
  for row, thread in enumerate(threads):
    for e in inside:
      if (e["pid"], e.get("tid")) != thread:
        continue
      k = kind(e["name"])
      ax.broken_barh(
        [((e["ts"] - start) / 1e3, e["dur"] / 1e3)],
        (row - 0.4, 0.8),
        color=colour.get(k, "#cccccc"),
        linewidth=0,
      )
  ax.set_yticks(range(len(threads)), [names.get(t, str(t))[:28] for t in threads], fontsize=7)
  ax.set_xlim(0, (end - start) / 1e3)
  ax.set_xlabel("milliseconds into the step")
  ax.set_title(f"training step {step}: XLA operations per thread (grey: other kinds)")
  handles = [plt.Rectangle((0, 0), 1, 1, color=colour[k]) for k in kinds]
  ax.legend(handles, kinds, fontsize=7, ncol=4, loc="upper right")
  seconds = [totals[k] / 1e6 for k in kinds]
  bx.barh(range(len(kinds)), seconds, color=[colour[k] for k in kinds])
  bx.set_yticks(range(len(kinds)), kinds, fontsize=8)
  bx.invert_yaxis()
  bx.set_xlabel("seconds, summed over the XLA threads")
  bx.set_title(f"time by kind of XLA operation (step wall time {(end - start) / 1e6:.2f} s)")
  fig.tight_layout()
  fig.savefig(output, dpi=110)
  print(f"wrote {output}; top kinds: " + ", ".join(f"{k} {totals[k] / 1e6:.2f}s" for k in kinds))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("trace")
  parser.add_argument("--step", type=int, default=2)
  parser.add_argument("--output", default="profile_step.png")
  args = parser.parse_args()
  draw(find_trace(args.trace), args.step, args.output)


if __name__ == "__main__":
  main()
