"""Host memory for the command-line tools: transparent huge pages under malloc.

XLA:CPU allocates each execution's buffers with malloc, and glibc serves large requests
with fresh mmap'd memory in 4 KiB pages, so every training step faults its working memory
in again, page by page, and walks it through 4 KiB TLB entries. glibc (2.35+) can back
malloc with transparent huge pages instead (GLIBC_TUNABLES=glibc.malloc.hugetlb=1), which
removes most of those page faults (docs/performance.md has the figures).

glibc reads tunables once, at process start, so `use_huge_pages()` re-executes the tool once
with the tunable added. It does nothing when T2T_HUGE_PAGES=0, off Linux, when the kernel's
transparent huge pages are 'never', or when glibc.malloc.hugetlb is already set (by the
user, or by the first execution). Library use (notebooks, tests) is never re-executed.

The console scripts of the tools that re-execute enter through this module (`translate`,
`train`, ...), which imports nothing heavy: the re-execution happens before the tool's
module imports jax, so a start pays those imports once, not twice.
"""

import gc
import importlib
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

ENV = "T2T_HUGE_PAGES"
TUNABLE = "glibc.malloc.hugetlb"
THP_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"


def _thp_mode(path: str = THP_SETTING) -> str:
  """The kernel's transparent-huge-page mode ('always', 'madvise', 'never'), or ''."""
  try:
    with open(path, encoding="ascii") as f:
      text = f.read()  # e.g. "always [madvise] never"
  except OSError:
    return ""
  start, end = text.find("["), text.find("]")
  return text[start + 1 : end] if 0 <= start < end else ""


def huge_pages_env(environ: Mapping[str, str]) -> dict[str, str]:
  """The environment to re-execute with, or {} when nothing should change."""
  if environ.get(ENV, "1") == "0" or not sys.platform.startswith("linux"):
    return {}
  tunables = environ.get("GLIBC_TUNABLES", "")
  if TUNABLE in tunables or _thp_mode() in ("", "never"):
    return {}
  return dict(environ, GLIBC_TUNABLES=":".join(filter(None, [tunables, f"{TUNABLE}=1"])))


def use_huge_pages(execv: Callable[[str, list[str]], object] = os.execv) -> None:
  """Re-executes this process (same interpreter and arguments) with huge pages for malloc.

  Call it first thing in a command-line tool, before threads or JAX devices exist.
  """
  env = huge_pages_env(os.environ)
  if not env:
    return
  os.environ["GLIBC_TUNABLES"] = env["GLIBC_TUNABLES"]
  sys.stdout.flush()
  sys.stderr.flush()
  # sys.orig_argv is the command line as typed (`python -m mod ...` or a console script).
  execv(sys.executable, list(sys.orig_argv))


def _import_frozen(module: str) -> Any:
  """Imports `module` with the cyclic garbage collector off, then freezes what the imports
  made (gc.freeze): jax, flax and the rest create about a million objects that live as long
  as the process, and the collector would walk them again and again while they are made, and
  once more when the interpreter exits - about a quarter of a second of a one-line
  t2t-translate. Objects made later are collected as usual."""
  enabled = gc.isenabled()
  gc.disable()
  try:
    return importlib.import_module(module)
  finally:
    gc.freeze()
    if enabled:
      gc.enable()


def _entry(module: str) -> Callable[[], None]:
  """A console-script entry point: re-executes with huge pages, then imports `module` (and
  with it jax; `_import_frozen`) and calls its run()."""

  def run() -> None:
    use_huge_pages()
    _import_frozen(module).run()

  run.__qualname__ = run.__name__ = module.rsplit(".", 1)[-1]
  return run


train = _entry("t2t_jax.cli.train")
translate = _entry("t2t_jax.cli.translate")
score = _entry("t2t_jax.cli.score")
bench = _entry("t2t_jax.cli.bench")
