"""The measuring tools every benchmark shares: compilations, the matmul peak, memory, threads."""

import os
import resource
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import DTypeLike

from t2t_jax.compilation import CompileCounter

__all__ = ["CompileCounter"]  # the benchmarks count compilations with compilation's counter


def best_time(run: Callable[[], object], repeats: int) -> float:
  """The fastest of `repeats` calls of run() after one warm-up call, in seconds."""
  run()
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    run()
    times.append(time.perf_counter() - t0)
  return min(times)


def _host_library_peaks(n: int, repeats: int) -> dict[str, float]:
  """float32 FLOP/s of the same n x n product in numpy (its BLAS) and torch (MKL/oneDNN on
  x86), where installed: the machine's large-product rate is the best any library reaches."""
  peaks = {}
  a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
  peaks["numpy"] = 2 * n**3 / best_time(lambda: a @ a, repeats)
  try:
    import torch
  except ImportError:
    return peaks
  t = torch.from_numpy(a)
  peaks["torch"] = 2 * n**3 / best_time(lambda: t @ t, repeats)
  return peaks


def measure_peak(dtype: DTypeLike | None = None, n: int = 0, repeats: int = 5) -> dict[str, Any]:
  """FLOP/s of an n x n matrix product, best of `repeats` (float32 CPU, bf16 elsewhere).

  On a CPU the same product also runs in numpy and torch; `peak_flops` is the best rate of
  any of them and `peak_library` says which reached it (MFU is reported against that), with
  every library's rate in `library_flops`.
  """
  platform = jax.devices()[0].platform
  dtype = dtype or (jnp.float32 if platform == "cpu" else jnp.bfloat16)
  n = n or (2048 if platform == "cpu" else 8192)
  a = jax.random.normal(jax.random.PRNGKey(0), (n, n), dtype)
  matmul = jax.jit(lambda x, y: x @ y)
  rates = {"jax": 2 * n**3 / best_time(lambda: matmul(a, a).block_until_ready(), repeats)}
  if platform == "cpu":
    rates.update(_host_library_peaks(n, repeats))
  library = max(rates, key=rates.get)
  return dict(
    platform=platform,
    dtype=jnp.dtype(dtype).name,
    n=n,
    peak_flops=rates[library],
    peak_library=library,
    library_flops=rates,
  )


def peak_memory() -> dict[str, int]:
  """The first device's peak bytes in use, or on a CPU the process's peak resident memory."""
  stats = jax.devices()[0].memory_stats() or {}
  if "peak_bytes_in_use" in stats:
    return dict(peak_device_memory_bytes=int(stats["peak_bytes_in_use"]))
  return dict(peak_host_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)


def cpu_threads() -> int:
  """The cores this process may run on: what XLA's CPU thread pool uses."""
  return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
