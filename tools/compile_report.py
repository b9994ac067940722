"""Where a test run's time goes, from the file tests/conftest.py appends to.

    T2T_TEST_COMPILE_REPORT=/tmp/compiles.jsonl T2T_TEST_COMPILATION_CACHE=run \
        python -m pytest -q -n 2
    python tools/compile_report.py /tmp/compiles.jsonl [--top=20]

Prints, per test module and for the tests that take most, the CPU seconds (the test
process's and those of the commands it started, which hardly change when other work shares
the cores), the wall seconds, and the programs compiled in the test processes with the
seconds spent tracing, lowering and compiling them. With a fresh cache
(T2T_TEST_COMPILATION_CACHE=run) this is what a clean clone pays; with the kept cache, what a
change costs. On two idle cores with balanced workers, a run's wall time is about its CPU
seconds over two.
"""

import argparse
import collections
import json

PARTS = ("jaxpr_trace_duration", "jaxpr_to_mlir_module_duration", "backend_compile_duration")
COLUMNS = ("cpu", "command cpu", "wall", "compiling", "programs", "tests")


def _figures(row: dict) -> tuple:
  """One test's (cpu, command cpu, wall, compile seconds, programs, 1)."""
  compiling = sum(row.get(p, [0, 0.0])[1] for p in PARTS)
  programs = row.get("backend_compile_duration", [0, 0.0])[0]
  cpu, children = row.get("cpu", 0.0), row.get("children_cpu", 0.0)
  return (cpu + children, children, row.get("wall", 0.0), compiling, programs, 1)


def _line(figures: tuple, name: str) -> str:
  cpu, children, wall, compiling, programs, tests = figures
  return (
    f"{cpu:8.1f} {children:11.1f} {wall:8.1f} {compiling:9.1f} {programs:8d} {tests:5d}  {name}"
  )


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("report")
  parser.add_argument("--top", type=int, default=20)
  args = parser.parse_args()
  with open(args.report) as f:
    rows = [json.loads(line) for line in f if line.strip()]
  tests = {r["test"]: _figures(r) for r in rows}
  modules = collections.defaultdict(lambda: (0.0, 0.0, 0.0, 0.0, 0, 0))
  for name, figures in tests.items():
    module = name.split("::")[0]
    modules[module] = tuple(a + b for a, b in zip(modules[module], figures))
  total = tuple(sum(column) for column in zip(*tests.values()))
  header = " ".join(f"{c:>{w}}" for c, w in zip(COLUMNS, (8, 11, 8, 9, 8, 5)))
  print(f"{header}  module")
  print(_line(total, "(all)"))
  for name, figures in sorted(modules.items(), key=lambda kv: -kv[1][0]):
    print(_line(figures, name))
  print(f"\n{header}  test")
  for name, figures in sorted(tests.items(), key=lambda kv: -kv[1][0])[: args.top]:
    print(_line(figures, name))


if __name__ == "__main__":
  main()
