"""Does the quick loop catch a one-token bug in the maths, the training step or a feature?

Each mutation (tools/mutations/, one module per feature area) changes one token of the
library (a sign, an operator, a constant, a name). For each, the script copies the working
tree to a scratch directory, applies the change there (the checkout is never touched), and
runs the quick loop (`pytest -m "not slow" -x`) against the copy. A mutation is *caught*
when some test fails. To keep a run short, the tests most likely to catch a mutation (its
`first` files) run first; only if they all pass does the whole quick loop run, so a
"missed" verdict always means the whole quick loop passed.

    python tools/mutation_check.py                  # every mutation, a table at the end
    python tools/mutation_check.py --only=adam_b2,causal_mask
    python tools/mutation_check.py --list           # the mutations, checked to apply
    python tools/mutation_check.py --markdown=FILE  # also write the table as markdown

It first runs the quick loop on the unchanged copy and stops if that fails (--no_baseline
skips it).
"""

import argparse
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tools.mutations import Mutation, all_mutations  # noqa: E402

MUTATIONS = all_mutations()


def _check(m: Mutation) -> str:
  text = (REPO / m.path).read_text()
  count = text.count(m.old)
  if count != 1:
    raise SystemExit(f"mutation {m.name}: {m.old!r} occurs {count} times in {m.path} (need 1)")
  return text.replace(m.old, m.new)


def _copy_tree(dest: pathlib.Path) -> None:
  """Tracked and untracked-but-not-ignored files: what the quick loop would see in CI."""
  listed = subprocess.run(
    ["git", "ls-files", "-co", "--exclude-standard", "-z"],
    cwd=REPO,
    check=True,
    capture_output=True,
  ).stdout.split(b"\0")
  for rel in filter(None, listed):
    src = REPO / os.fsdecode(rel)
    if src.is_file():
      (dest / os.fsdecode(rel)).parent.mkdir(parents=True, exist_ok=True)
      shutil.copy2(src, dest / os.fsdecode(rel))


def _pytest(tree: pathlib.Path, targets: list[str], workers: int) -> tuple[bool, str]:
  """(some test failed, the first failing test id or the tail of the output)."""
  # The checkout's kept compilation cache (tests/conftest.py), not an empty one per copy:
  # entries are keyed by program, so a mutated program compiles anew and nothing stale is read.
  cache = os.environ.get("T2T_TEST_COMPILATION_CACHE") or str(REPO / ".cache" / "xla-tests")
  env = dict(os.environ, PYTHONPATH=str(tree), T2T_TEST_COMPILATION_CACHE=cache)
  cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-m", "not slow", "-p", "no:cacheprovider"]
  cmd += ["-n", str(workers)] if workers > 1 else []
  proc = subprocess.run(cmd + targets, cwd=tree, env=env, capture_output=True, text=True)
  lines = proc.stdout.splitlines()
  # "FAILED tests/x.py::test[a b] - message": test ids may hold spaces, the message follows " - ".
  marks = ("FAILED ", "ERROR ")
  failed = [line.split(" ", 1)[1].split(" - ")[0] for line in lines if line.startswith(marks)]
  # Status 1: tests failed; 2: xdist interrupted by -x after a failure; 5: none collected
  # (every target deselected as slow). Anything else, or 2 without a failure, is no verdict.
  if proc.returncode not in (0, 1, 2, 5) or (proc.returncode == 2 and not failed):
    raise SystemExit(f"pytest could not run (status {proc.returncode}):\n{proc.stdout[-3000:]}")
  return bool(failed), (failed[0] if failed else "")


def _verify_import(tree: pathlib.Path) -> None:
  """The copy, not the editable install, must be what the tests import."""
  out = subprocess.run(
    [sys.executable, "-c", "import t2t_jax; print(t2t_jax.__file__)"],
    cwd=tree,
    env=dict(os.environ, PYTHONPATH=str(tree)),
    check=True,
    capture_output=True,
    text=True,
  ).stdout.strip()
  if not out.startswith(str(tree)):
    raise SystemExit(f"the scratch copy is not imported (t2t_jax from {out})")


def baseline(workers: int) -> None:
  """The unchanged tree must pass the quick loop, or every mutation would look caught."""
  with tempfile.TemporaryDirectory(prefix="mutation-baseline-") as tmp:
    tree = pathlib.Path(tmp)
    _copy_tree(tree)
    _verify_import(tree)
    failed, by = _pytest(tree, [], workers)
  if failed:
    raise SystemExit(f"the quick loop fails without any mutation ({by}); fix that first")


def run_one(m: Mutation, workers: int) -> dict:
  mutated = _check(m)
  start = time.perf_counter()
  with tempfile.TemporaryDirectory(prefix=f"mutation-{m.name}-") as tmp:
    tree = pathlib.Path(tmp)
    _copy_tree(tree)
    _verify_import(tree)
    (tree / m.path).write_text(mutated)
    first = [f for f in m.first if (tree / f).exists()]
    caught, by = _pytest(tree, first, workers) if first else (False, "")
    stage = "targeted"
    if not caught:
      caught, by = _pytest(tree, [], workers)
      stage = "quick loop"
  return dict(
    name=m.name, what=m.what, path=m.path, caught=caught, by=by, stage=stage,
    seconds=time.perf_counter() - start,
  )  # fmt: skip


def _table(rows: list[dict]) -> str:
  lines = ["| mutation | file | change | caught | first failing test | s |", "|---" * 6 + "|"]
  for r in rows:
    verdict = "yes" if r["caught"] else "**MISSED**"
    lines.append(
      f"| {r['name']} | {r['path']} | {r['what']} | {verdict} | {r['by'] or '-'} "
      f"| {r['seconds']:.0f} |"
    )
  return "\n".join(lines)


def main() -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--only", default="", help="comma-separated mutation names")
  p.add_argument("--list", action="store_true", help="list the mutations and check they apply")
  p.add_argument("--workers", type=int, default=2, help="pytest-xdist workers (1: none)")
  p.add_argument("--no_baseline", action="store_true", help="skip the unmutated quick loop")
  p.add_argument("--markdown", default="", help="also write the table to this file")
  args = p.parse_args()
  chosen = MUTATIONS
  if args.only:
    names = args.only.split(",")
    unknown = sorted(set(names) - {m.name for m in MUTATIONS})
    if unknown:
      p.error(f"--only: unknown mutation(s) {unknown}; known: {[m.name for m in MUTATIONS]}")
    chosen = tuple(m for m in MUTATIONS if m.name in names)
  if args.list:
    for m in chosen:
      _check(m)
      print(f"{m.name:24} {m.path:34} {m.what}")
    return 0
  if not args.no_baseline:
    baseline(args.workers)
  rows = []
  for m in chosen:
    rows.append(run_one(m, args.workers))
    r = rows[-1]
    verdict = "caught" if r["caught"] else "MISSED"
    print(f"{r['name']:24} {verdict:7} {r['by']} ({r['seconds']:.0f} s)", flush=True)
  table = _table(rows)
  print(table)
  if args.markdown:
    pathlib.Path(args.markdown).write_text(table + "\n")
  return 0 if all(r["caught"] for r in rows) else 1


if __name__ == "__main__":
  sys.exit(main())
