"""Where a test run's XLA compile time goes, from the file tests/conftest.py appends to.

    T2T_TEST_COMPILE_REPORT=/tmp/compiles.jsonl T2T_TEST_COMPILATION_CACHE=run \
        python -m pytest -q -n 2
    python tools/compile_report.py /tmp/compiles.jsonl [--top=20]

Prints, per test module and for the tests that compile most, the programs compiled in the
test processes and the seconds spent tracing, lowering and compiling them (the commands the
tests start are not counted). With a fresh cache (T2T_TEST_COMPILATION_CACHE=run) this is
what a clean clone pays; with the kept cache, what a change costs.
"""

import argparse
import collections
import json

PARTS = ("jaxpr_trace_duration", "jaxpr_to_mlir_module_duration", "backend_compile_duration")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("report")
  parser.add_argument("--top", type=int, default=20)
  args = parser.parse_args()
  with open(args.report) as f:
    rows = [json.loads(line) for line in f if line.strip()]
  seconds = lambda r: sum(r.get(p, [0, 0.0])[1] for p in PARTS)
  programs = lambda r: r.get("backend_compile_duration", [0, 0.0])[0]
  modules = collections.defaultdict(lambda: [0, 0.0, 0])
  for r in rows:
    m = modules[r["test"].split("::")[0]]
    m[0] += programs(r)
    m[1] += seconds(r)
    m[2] += 1
  total = sum(seconds(r) for r in rows)
  print(f"{len(rows)} tests, {sum(map(programs, rows))} programs, {total:.1f} s compiling")
  print(f"\n{'seconds':>8} {'programs':>8} {'tests':>5}  module")
  for name, (count, secs, tests) in sorted(modules.items(), key=lambda kv: -kv[1][1]):
    print(f"{secs:8.1f} {count:8d} {tests:5d}  {name}")
  print(f"\n{'seconds':>8} {'programs':>8}  test")
  for r in sorted(rows, key=seconds, reverse=True)[: args.top]:
    print(f"{seconds(r):8.1f} {programs(r):8d}  {r['test']}")


if __name__ == "__main__":
  main()
