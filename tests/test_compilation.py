"""t2t_jax.compilation: the persistent compilation cache's directory, its bound, its switch."""

import json
import os
import subprocess
import sys

from t2t_jax import compilation
from tests import support


def _entry(directory, name: str, size: int, mtime: float) -> None:
  for suffix, data in (("-cache", b"x" * size), ("-atime", b"0" * 8)):
    path = os.path.join(directory, name + suffix)
    with open(path, "wb") as f:
      f.write(data)
    os.utime(path, (mtime, mtime))


def test_trim_removes_the_oldest_entries_down_to_the_bound(tmp_path):
  for i, mtime in enumerate([300, 100, 400, 200]):
    _entry(tmp_path, f"e{i}", 1000, mtime)
  (tmp_path / "unrelated.txt").write_text("kept")
  assert compilation.trim(str(tmp_path), 4000) == 0
  assert compilation.trim(str(tmp_path), 2500) == 2  # e1 (100) and e3 (200) go
  assert sorted(os.listdir(tmp_path)) == [
    "e0-atime",
    "e0-cache",
    "e2-atime",
    "e2-cache",
    "unrelated.txt",
  ]
  assert compilation.trim(str(tmp_path / "missing"), 0) == 0


PROBE = r"""
import json, os, sys
import jax
from t2t_jax import compilation
used = compilation.enable(sys.argv[1])
print(json.dumps(dict(used=used, dir=jax.config.jax_compilation_cache_dir,
                      max_size=jax.config.jax_compilation_cache_max_size,
                      min_time=jax.config.jax_persistent_cache_min_compile_time_secs)))
"""


def _probe(directory: str, **env: str) -> dict:
  environ = support.cpu_env(**env)
  environ.pop("JAX_COMPILATION_CACHE_DIR", None)  # the suite's own cache
  proc = subprocess.run(
    [sys.executable, "-c", PROBE, directory],
    env=environ,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


def test_enable_uses_the_directory_without_jax_s_per_write_bound(tmp_path):
  chosen = str(tmp_path / "xla")
  got = _probe(chosen)
  assert got == dict(used=chosen, dir=chosen, max_size=-1, min_time=0.0)
  assert os.path.isdir(chosen)
  # 'default' follows $T2T_COMPILATION_CACHE; 'off' there turns the cache off.
  assert _probe("default", T2T_COMPILATION_CACHE=chosen)["used"] == chosen
  assert _probe("default", T2T_COMPILATION_CACHE="off")["used"] is None
  assert _probe("off")["used"] is None
