"""Times the start of t2t-translate from two source trees, each with its own compilation
cache: one run that fills it (cold), then warm runs alternating between the trees, and
whether the outputs are the same:

    python tools/warm_start_ab.py OLD_TREE NEW_TREE WORKDIR INPUT [RUNS]

A tree is a checkout of t2t_jax (a git worktree of an older commit, say); each run is a new
process (`python -m t2t_jax.cli.translate --workdir=WORKDIR --input=INPUT`) with the tree
first on PYTHONPATH and $T2T_COMPILATION_CACHE a fresh directory per tree. Prints one JSON
line per tree: cold seconds, warm seconds (each run), their median, and whether every run's
output equals the first tree's cold output.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def _translate(tree: str, cache: str, workdir: str, input_path: str) -> tuple[float, str]:
  env = dict(os.environ, PYTHONPATH=os.path.abspath(tree), T2T_COMPILATION_CACHE=cache)
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  start = time.perf_counter()
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "t2t_jax.cli.translate",
      f"--workdir={workdir}",
      f"--input={input_path}",
    ],
    env=env,
    capture_output=True,
    text=True,
    check=False,
  )
  seconds = time.perf_counter() - start
  if proc.returncode:
    raise SystemExit(f"{tree}: t2t-translate failed:\n{proc.stderr[-2000:]}")
  return seconds, proc.stdout


def main(old: str, new: str, workdir: str, input_path: str, runs: int = 3) -> None:
  trees = {"old": old, "new": new}
  with tempfile.TemporaryDirectory() as root:
    caches = {name: os.path.join(root, name) for name in trees}
    cold, outputs, warm = {}, {}, {name: [] for name in trees}
    for name, tree in trees.items():
      cold[name], outputs[name] = _translate(tree, caches[name], workdir, input_path)
    same = {name: outputs[name] == outputs["old"] for name in trees}
    for _ in range(runs):
      for name, tree in trees.items():
        seconds, out = _translate(tree, caches[name], workdir, input_path)
        warm[name].append(seconds)
        same[name] = same[name] and out == outputs["old"]
  for name, tree in trees.items():
    row = dict(
      tree=tree,
      cold_s=round(cold[name], 2),
      warm_s=[round(s, 2) for s in warm[name]],
      warm_median_s=round(statistics.median(warm[name]), 2),
      same_output=same[name],
    )
    print(json.dumps(row))


if __name__ == "__main__":
  if len(sys.argv) not in (5, 6):
    raise SystemExit(__doc__)
  main(*sys.argv[1:5], *(int(a) for a in sys.argv[5:]))
