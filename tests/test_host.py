"""t2t_jax.cli.host: the tools re-execute once with glibc's huge-page malloc, and it
takes effect."""

import os
import subprocess
import sys

import pytest

from t2t_jax.cli import host

LINUX = sys.platform.startswith("linux")

# Allocates, touches and frees a 64 MiB buffer six times; prints the minor page faults of
# rounds 2-6 and the GLIBC_TUNABLES it ran with.
CHILD = r"""
import ctypes, os, resource
from t2t_jax.cli import host
host.use_huge_pages()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
size = 64 << 20
def round_trip():
  p = libc.malloc(size)
  ctypes.memset(p, 1, size)  # touch every page
  libc.free(p)
round_trip()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
  round_trip()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before,
      os.environ.get("GLIBC_TUNABLES", "-"))
"""


def _run_child(**env):
  env = {k: v for k, v in dict(os.environ, **env).items() if k != "GLIBC_TUNABLES"}
  out = subprocess.run(
    [sys.executable, "-c", CHILD], env=env, check=True, capture_output=True, text=True
  ).stdout.split()
  return int(out[0]), out[1]


@pytest.mark.skipif(
  not LINUX or host._thp_mode() in ("", "never"), reason="needs Linux with transparent huge pages"
)
def test_reexecuted_tool_faults_far_fewer_pages():
  faults, tunables = _run_child(T2T_HUGE_PAGES="1")
  default_faults, default_tunables = _run_child(T2T_HUGE_PAGES="0")
  assert tunables == "glibc.malloc.hugetlb=1" and default_tunables == "-"
  pages = 5 * (64 << 20) // 4096
  # glibc's default: mmap/munmap every round, each 4 KiB page faulted in again.
  assert default_faults >= 0.9 * pages
  # Huge pages: 2 MiB at a time (the exact count depends on alignment and khugepaged).
  assert faults < 0.1 * default_faults


def test_environment_rules(monkeypatch):
  monkeypatch.setattr(host, "_thp_mode", lambda: "madvise")
  monkeypatch.setattr(sys, "platform", "linux")
  env = host.huge_pages_env({"PATH": "/bin"})
  assert env == {"PATH": "/bin", "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
  # Other tunables are kept; a tunable already set (by the user, or by the first
  # execution) means no re-execution, so there is no loop.
  assert (
    host.huge_pages_env({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"})["GLIBC_TUNABLES"]
    == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
  )
  assert host.huge_pages_env({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}) == {}
  assert host.huge_pages_env({"T2T_HUGE_PAGES": "0"}) == {}
  monkeypatch.setattr(host, "_thp_mode", lambda: "never")
  assert host.huge_pages_env({}) == {}
  monkeypatch.setattr(host, "_thp_mode", lambda: "always")
  monkeypatch.setattr(sys, "platform", "darwin")
  assert host.huge_pages_env({}) == {}


def test_use_huge_pages_reexecutes_the_same_command_line(monkeypatch):
  monkeypatch.setattr(host, "_thp_mode", lambda: "madvise")
  monkeypatch.setattr(sys, "platform", "linux")
  monkeypatch.setattr(sys, "orig_argv", ["python", "-m", "t2t_jax.cli.train", "--experiment=tiny"])
  monkeypatch.setenv("GLIBC_TUNABLES", "")  # restored (removed) after the test
  monkeypatch.delenv("T2T_HUGE_PAGES", raising=False)
  calls = []
  host.use_huge_pages(execv=lambda path, argv: calls.append((path, argv)))
  assert calls == [(sys.executable, ["python", "-m", "t2t_jax.cli.train", "--experiment=tiny"])]
  assert os.environ["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1"
  calls.clear()
  host.use_huge_pages(execv=lambda path, argv: calls.append((path, argv)))  # now set: no-op
  assert calls == []


def test_thp_mode_parses_the_kernel_setting(tmp_path):
  path = tmp_path / "enabled"
  path.write_text("always [madvise] never\n")
  assert host._thp_mode(str(path)) == "madvise"
  assert host._thp_mode(str(tmp_path / "missing")) == ""


# Calls host's entry point for a module with use_huge_pages replaced by a stand-in that
# stops the process and prints which of jax and the tool's module were imported by then.
ENTRY_CHECK = r"""
import json, sys
from t2t_jax.cli import host
module = sys.argv[1]
class Reexecuted(Exception):
  pass
def reexecute():
  raise Reexecuted([m for m in ("jax", module) if m in sys.modules])
host.use_huge_pages = reexecute
try:
  getattr(host, module.rsplit(".", 1)[-1])()
except Reexecuted as e:
  print(json.dumps(e.args[0]))
"""


def test_console_scripts_reexecute_before_importing_jax():
  """The tools that re-execute enter through host, which re-executes before the tool's
  module (and jax) is imported: a start pays those imports once."""
  from tests.test_cli_help import console_scripts

  modules = [
    "t2t_jax.cli." + target.split(":")[1]
    for target in console_scripts().values()
    if target.startswith("t2t_jax.cli.host:")
  ]
  assert sorted(modules) == [f"t2t_jax.cli.{n}" for n in ("bench", "score", "train", "translate")]
  for module in modules:
    out = subprocess.run(
      [sys.executable, "-c", ENTRY_CHECK, module], check=True, capture_output=True, text=True
    ).stdout
    assert out.split() == ["[]"], (module, out)


def test_a_tool_is_imported_with_the_collector_off_and_its_objects_frozen(monkeypatch):
  """`_import_frozen`: the tool's imports run with the collector off, what they made is
  frozen (not walked by the collector again, nor at exit), and the collector is on again
  afterwards."""
  import gc

  seen = []
  real = host.importlib.import_module

  def import_module(name):
    seen.append(gc.isenabled())
    return real(name)

  monkeypatch.setattr(host.importlib, "import_module", import_module)
  gc.unfreeze()
  try:
    assert host._import_frozen("tests.support") is sys.modules["tests.support"]
    assert seen == [False]
    assert gc.isenabled()
    assert gc.get_freeze_count() > 0
  finally:
    gc.unfreeze()
