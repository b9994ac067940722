"""The bucket plan's own memory and time on a corpus of N pairs, without the rest of training.

    nice -n 5 python tools/bucket_plan_memory.py --pairs=2000000,10000000 --dir=/work/bench
    PYTHONPATH=/path/to/other/checkout nice -n 5 python tools/bucket_plan_memory.py ...

For each size: writes random pair lengths (log-normal, mean ~25 tokens, up to 256) as int64
offset files under --dir and memory-maps them, as a prepared store does; then builds the
BucketPlan of the paper's buckets (4,096 tokens, 8 devices) with the workdir's scratch
files under --dir, and asks for the first step of epochs 0, 1 and 2. Prints the time of
each stage and the peak growth of the process's anonymous memory over the mapped corpus
(RssAnon of /proc/self/status sampled every 10 ms, minus its value before the plan), in
bytes per pair. Checkouts whose BucketPlan takes no scratch directory run it on the heap.

    python tools/bucket_plan_memory.py --experiment=bench.py --data_dir=DIR --dir=/work/bench

instead opens a prepared store (an experiment file and its data_dir, e.g. those that
tools/prepare_benchmark.py --keep_data leaves) through get_datasets, with a fresh workdir
under --dir, takes three training batches, and prints RssAnon/RssFile before and after.
"""

import argparse
import importlib.util
import inspect
import json
import os
import re
import tempfile
import threading
import time

import numpy as np

from t2t_jax.data import batching
from t2t_jax.data.tokenized import TokenizedPairs

BOUNDARIES = tuple(range(8, 64, 8)) + tuple(range(64, 257, 16))


def _rss_kib(field: str = "RssAnon") -> int:
  with open("/proc/self/status", encoding="ascii") as f:
    return int(re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.M).group(1))


def _rss_anon_kib() -> int:
  return _rss_kib("RssAnon")


def measure_store(experiment: str, data_dir: str, workdir: str, batches: int = 3) -> dict:
  """RssAnon and RssFile (MiB) before get_datasets, after it, and after `batches` batches."""
  from t2t_jax.data import pipeline

  spec = importlib.util.spec_from_file_location("experiment", experiment)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config().data
  c.data_dir = data_dir

  def now() -> dict:
    return {f: round(_rss_kib(f) / 1024, 1) for f in ("RssAnon", "RssFile")}

  result = dict(before=now())
  data = pipeline.get_datasets(c, workdir)
  result["datasets"] = now()
  it = data.train_iter()
  for _ in range(batches):
    next(it)
  result[f"{batches}_batches"] = now()
  return result


class PeakAnon:
  """The maximum RssAnon (KiB) seen while the `with` block runs."""

  def __enter__(self) -> "PeakAnon":
    self.peak, self._stop = _rss_anon_kib(), threading.Event()
    self._thread = threading.Thread(target=self._sample, daemon=True)
    self._thread.start()
    return self

  def _sample(self) -> None:
    while not self._stop.wait(0.01):
      self.peak = max(self.peak, _rss_anon_kib())

  def __exit__(self, *exc) -> None:
    self._stop.set()
    self._thread.join()
    self.peak = max(self.peak, _rss_anon_kib())


def mapped_pairs(directory: str, n: int, seed: int = 0) -> TokenizedPairs:
  """Pairs with random lengths whose offsets are memory-mapped .npy files (no tokens)."""
  rng = np.random.default_rng(seed)
  sides = []
  for side in ("inputs", "targets"):
    path = os.path.join(directory, f"{side}_offsets.npy")
    out = np.lib.format.open_memmap(path, "w+", np.int64, (n + 1,))
    out[0], total = 0, 0
    for start in range(0, n, 1 << 20):
      stop = min(start + (1 << 20), n)
      lengths = np.clip(rng.lognormal(np.log(22), 0.55, stop - start).astype(np.int64), 1, 256)
      out[start + 1 : stop + 1] = total + np.cumsum(lengths)
      total = int(out[stop])
    out.flush()
    del out
    sides.append(np.load(path, mmap_mode="r"))
  flat = np.zeros(1, np.uint16)
  return TokenizedPairs(flat, sides[0], flat, sides[1])


def measure(directory: str, n: int) -> dict:
  pairs = mapped_pairs(directory, n)
  sharding = batching.Sharding(0, 1, 8)
  kwargs = {}
  if "scratch_dir" in inspect.signature(batching.BucketPlan).parameters:
    kwargs["scratch_dir"] = directory
  result = dict(pairs=n)
  before = _rss_anon_kib()
  with PeakAnon() as peak:
    t0 = time.perf_counter()
    plan = batching.BucketPlan(pairs, BOUNDARIES, 4096 // 8, sharding, 0, **kwargs)
    result["build_s"] = round(time.perf_counter() - t0, 2)
    result["on_disk"] = getattr(getattr(plan, "scratch", None), "directory", None) is not None
    for epoch in range(3):
      t0 = time.perf_counter()
      plan.global_members(plan.steps_before(epoch))
      result[f"epoch{epoch}_first_step_s"] = round(time.perf_counter() - t0, 2)
  result["peak_anon_growth_mib"] = round((peak.peak - before) / 1024, 1)
  result["peak_anon_bytes_per_pair"] = round((peak.peak - before) * 1024 / n, 1)
  return result


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--pairs", default="2000000,10000000", help="corpus sizes, comma-separated")
  parser.add_argument("--dir", default=".", help="a directory on disk for the files")
  parser.add_argument("--experiment", default="", help="measure get_datasets on this store")
  parser.add_argument("--data_dir", default="", help="the store's config.data.data_dir")
  args = parser.parse_args()
  print(f"BucketPlan from {batching.__file__}", flush=True)
  if args.experiment:
    with tempfile.TemporaryDirectory(prefix="workdir_", dir=args.dir) as workdir:
      print(json.dumps(measure_store(args.experiment, args.data_dir, workdir)), flush=True)
    return
  for n in (int(p) for p in args.pairs.split(",")):
    with tempfile.TemporaryDirectory(prefix="bucket_plan_", dir=args.dir) as directory:
      print(json.dumps(measure(directory, n)), flush=True)


if __name__ == "__main__":
  main()
