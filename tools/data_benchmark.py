"""Throughput of the whole input pipeline on multi30k, next to what a trainer consumes.

    python -m tools.data_benchmark                       # both batching modes, one epoch
    python -m tools.data_benchmark --trainer_steps=20    # also time the model's train step

Prints, per batching mode: the setup time by stage (TFDS prepare and vocabulary training
happen on first use of a workdir only; reading + tokenizing every pair on every run), then
pairs/s and tokens/s (non-pad, source + target) of iterating the training batches, and of
setup + iteration together. With --trainer_steps, it also times a jitted train step
(forward, backward, Adam) of the core Transformer on the same batches, so the two rates can
be compared on the same machine.
"""

import argparse
import sys
import tempfile
import time

import numpy as np

from t2t_jax.data import pipeline
from tests import support as testing


def pairs_in(batch: dict[str, np.ndarray]) -> int:
  """Number of (source, target) pairs in a batch of either layout."""
  if "targets_segmentation" in batch:
    return int(np.sum((batch["targets_position"] == 0) & (batch["targets_segmentation"] > 0)))
  return int(np.sum(batch["targets"][..., 0] > 0))


def tokens_in(batch: dict[str, np.ndarray]) -> int:
  return int(np.count_nonzero(batch["inputs"]) + np.count_nonzero(batch["targets"]))


def _config(args, batching: str):
  return testing.textfiles_config(
    args.corpus,
    vocab_size=args.vocab_size,
    max_len=args.max_len,
    pack_len=args.max_len,
    tokens_per_batch=args.tokens_per_batch,
    batching=batching,
    train_max_pairs=args.max_pairs,
  )


def run_pipeline(args, batching: str, workdir: str):
  """Returns (datasets, batches of one pass, figures) for one batching mode."""
  start = time.perf_counter()
  data = pipeline.get_datasets(_config(args, batching), workdir, num_local_devices=args.devices)
  setup_s = time.perf_counter() - start
  want = len(data.train_pairs) * args.epochs
  it = data.train_iter()
  batches, pairs, tokens = [], 0, 0
  start = time.perf_counter()
  while pairs < want:
    batch = next(it)
    pairs += pairs_in(batch)
    tokens += tokens_in(batch)
    batches.append(batch)
  iterate_s = time.perf_counter() - start
  it.close()
  figures = dict(
    setup_s=setup_s,
    iterate_s=iterate_s,
    pairs=pairs,
    tokens=tokens,
    batches=len(batches),
    read=data.stats.train.read,
    kept=len(data.train_pairs),
    padding=data.stats.padding_fraction,
    stages=dict(data.stats.setup_seconds),
  )
  return data, batches, figures


def report(batching: str, f: dict) -> str:
  total = f["setup_s"] + f["iterate_s"]
  return "\n".join(
    [
      f"[{batching}] setup {f['setup_s']:.2f}s for {f['read']} pairs: "
      + ", ".join(f"{stage} {seconds:.2f}s" for stage, seconds in f["stages"].items()),
      f"[{batching}] batches: {f['batches']} batches, {f['pairs']} pairs, {f['tokens']} tokens "
      f"in {f['iterate_s']:.2f}s = {f['pairs'] / f['iterate_s']:,.0f} pairs/s, "
      f"{f['tokens'] / f['iterate_s']:,.0f} tokens/s (padding fraction {f['padding']:.3f})",
      f"[{batching}] whole pipeline (setup + batches): {f['pairs'] / total:,.0f} pairs/s, "
      f"{f['tokens'] / total:,.0f} tokens/s",
    ]
  )


MODELS = {
  "tiny": dict(d_model=64, d_ff=128, num_heads=4, num_layers=2),  # experiments/tiny.py
  "small": dict(d_model=128, d_ff=512, num_heads=4, num_layers=2),
  "base": dict(d_model=512, d_ff=2048, num_heads=8, num_layers=6),  # the paper's base
}


def time_trainer(batches, vocab_size: int, model: str, steps: int) -> tuple[float, float]:
  """Steady-state (pairs/s, tokens/s) of a jitted train step on device 0's share of batches.

  Each new shape is compiled first, untimed, as a trainer pays that once per bucket.
  """
  import jax
  import optax

  from t2t_jax.model import Transformer, TransformerConfig
  from t2t_jax.training import losses

  net = Transformer(
    TransformerConfig(vocab_size=vocab_size, dropout_rate=0.0, max_len=512, **MODELS[model])
  )
  first = {k: v[0] for k, v in batches[0].items()}
  params = net.init(jax.random.PRNGKey(0), first["inputs"], first["targets"])["params"]
  tx = optax.adam(1e-4)

  @jax.jit
  def step(params, opt_state, batch):
    def loss_fn(p):
      logits = net.apply({"params": p}, **batch)
      loss_sum, weight_sum = losses.label_smoothed_cross_entropy(logits, batch["targets"])
      return loss_sum / weight_sum

    grads = jax.grad(loss_fn)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  opt_state, seen, elapsed, pairs, tokens = tx.init(params), set(), 0.0, 0, 0
  for batch in batches[:steps]:
    batch = {k: v[0] for k, v in batch.items()}  # one device's rows
    key = tuple(v.shape for v in batch.values())
    if key not in seen:
      seen.add(key)
      jax.block_until_ready(step(params, opt_state, batch))
    start = time.perf_counter()
    params, opt_state = jax.block_until_ready(step(params, opt_state, batch))
    elapsed += time.perf_counter() - start
    pairs, tokens = pairs + pairs_in(batch), tokens + tokens_in(batch)
  return pairs / elapsed, tokens / elapsed


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument(
    "--corpus",
    default=str(testing.shared_data_dir() / "multi30k"),
    help="directory with train/val/test2016 .en/.de files",
  )
  parser.add_argument("--batching", default="both", choices=("bucket", "pack", "both"))
  parser.add_argument("--tokens_per_batch", type=int, default=8192)
  parser.add_argument("--max_len", type=int, default=128)
  parser.add_argument("--vocab_size", type=int, default=8000)
  parser.add_argument("--devices", type=int, default=1, help="num_local_devices layout")
  parser.add_argument("--epochs", type=float, default=1.0)
  parser.add_argument("--max_pairs", type=int, default=0, help="0 = all training pairs")
  parser.add_argument("--workdir", default="", help="'' = a temporary directory")
  parser.add_argument("--trainer_steps", type=int, default=0, help="0 = skip the model")
  parser.add_argument("--model", default="tiny", choices=sorted(MODELS))
  args = parser.parse_args(argv)
  results = {}
  with tempfile.TemporaryDirectory() as tmp:
    workdir = args.workdir or tmp
    for batching in ("bucket", "pack") if args.batching == "both" else (args.batching,):
      data, batches, figures = run_pipeline(args, batching, workdir)
      print(report(batching, figures), flush=True)
      if args.trainer_steps:
        pairs_s, tokens_s = time_trainer(
          batches, data.tokenizer.vocab_size, args.model, args.trainer_steps
        )
        figures.update(trainer_pairs_s=pairs_s, trainer_tokens_s=tokens_s)
        print(
          f"[{batching}] trainer ({args.model} model, jitted step, 1 device): "
          f"{pairs_s:,.0f} pairs/s, {tokens_s:,.0f} tokens/s; pipeline batches are "
          f"{figures['tokens'] / figures['iterate_s'] / tokens_s:,.1f}x faster",
          flush=True,
        )
      results[batching] = figures
  return results


if __name__ == "__main__":
  main(sys.argv[1:])
