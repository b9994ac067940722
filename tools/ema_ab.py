"""Paired A/B of the training step without and with the moving average of the parameters
(config.ema_decay), in one process: the steps alternate, so both see the same noise.

    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 python -m tools.ema_ab [--experiment=multi30k]
        [--decay=0.999] [--pairs=20] [--seq_len=32]

The batch is the experiment's tokens_per_batch of synthetic full-length rows (t2t-bench's
train figure); prints both medians, the median of the per-pair ratios B/A and the bytes of
each train state (parameters, Adam's two moments, the average).
"""

import argparse
import importlib
import statistics
import time

import jax
import numpy as np

from t2t_jax.bench import train


def _bytes(tree) -> int:
  return sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(tree))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--experiment", default="multi30k")
  parser.add_argument("--decay", type=float, default=0.999)
  parser.add_argument("--pairs", type=int, default=20)
  parser.add_argument("--seq_len", type=int, default=32)
  args = parser.parse_args()
  config = importlib.import_module(f"t2t_jax.experiments.{args.experiment}").get_config()
  cfg = train.model_config(config, config.data.vocab_size)
  devices = jax.local_device_count()
  rows = train.train_rows(config.data.tokens_per_batch, args.seq_len, devices)
  setups = [
    train.setup_train(cfg, config.warmup_steps, config.label_smoothing, rows, args.seq_len, d)
    for d in (0.0, args.decay)
  ]
  states = [s.state for s in setups]
  times: list[list[float]] = [[], []]
  for pair in range(args.pairs + 1):  # the first pair compiles
    for i, setup in enumerate(setups):
      t0 = time.perf_counter()
      states[i], metrics = setup.step(states[i], setup.batch)
      jax.block_until_ready(metrics)
      if pair:
        times[i].append(time.perf_counter() - t0)
  ratios = [b / a for a, b in zip(*times)]
  print(f"{args.experiment}: {rows} x {args.seq_len} tokens, {devices} device(s)")
  for name, t, state in zip(("A ema off", f"B ema {args.decay}"), times, states):
    print(
      f"  {name:14s} median step {1e3 * statistics.median(t):8.1f} ms; "
      f"state {_bytes(state) / 2**20:7.1f} MiB"
    )
  print(
    f"  median B/A over {len(ratios)} pairs: {statistics.median(ratios):.3f} "
    f"(quartiles {np.percentile(ratios, 25):.3f}-{np.percentile(ratios, 75):.3f})"
  )


if __name__ == "__main__":
  main()
