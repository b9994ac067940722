"""Paired A/B timing of the train step (or beam search) of two checkouts, in one process.

    python -m tools.paired_ab OLD_CHECKOUT NEW_CHECKOUT [--size=tiny|base] [--steps=40]
        [--part=train|decode] [--b=FIELD=VALUE ...]

On a shared or noisy machine, two `t2t-bench` runs one after the other differ by 10% with
the same code. Here both versions are compiled in one process (each checkout's `t2t_jax`
copied under its own package name) and their steps alternate, so they see the same noise:
the median of the per-pair ratios B/A is stable to about 1%. Shapes are those of the
README's `t2t-bench` commands (tiny-sized: d_model 128, 2+2 layers, 8k vocab, 128 x 32
tokens; base-sized: d_model 512, 6+6 layers, 32k vocab, 64 x 32 tokens), dropout 0.1.
`--part=decode` times beam-4 decoding instead (random parameters; 128 tiny-sized or 64
base-sized sources of 30 tokens, outputs forced to 30 tokens, as `t2t-bench --vs`): one
"step" is one whole decode. `--b=FIELD=VALUE` overrides a TransformerConfig field of B only
(an ablation of one code).
Run it with `GLIBC_TUNABLES=glibc.malloc.hugetlb=1` to match what t2t-bench sets.
"""

import argparse
import ast
import dataclasses
import functools
import importlib
import inspect
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
import types
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from t2t_jax.bench import inputs, train
from t2t_jax.decoding import SearchConfig

SIZES = dict(
  tiny=(dict(vocab_size=8000, d_model=128, d_ff=512, num_heads=4, num_layers=2), 128),
  base=(dict(vocab_size=32000, d_model=512, d_ff=2048, num_heads=8, num_layers=6), 64),
)


def _copy_package(checkout: str, name: str, root: str) -> None:
  """checkout/t2t_jax (+ experiments) -> root/name, with every `t2t_jax` import renamed."""
  target = os.path.join(root, name)
  shutil.copytree(
    os.path.join(checkout, "t2t_jax"), target, ignore=shutil.ignore_patterns("__pycache__")
  )
  shutil.copytree(
    os.path.join(checkout, "experiments"),
    os.path.join(target, "experiments"),
    ignore=shutil.ignore_patterns("__pycache__"),
  )
  for folder, _, files in os.walk(target):
    for f in files:
      if f.endswith(".py"):
        path = os.path.join(folder, f)
        with open(path) as src:
          text = re.sub(r"\bt2t_jax\b", name, src.read())
        with open(path, "w") as dst:
          dst.write(text)


def _module(package: str, name: str):
  """package.training.NAME, or package.NAME in checkouts of the flat layout."""
  try:
    return importlib.import_module(f"{package}.training.{name}")
  except ModuleNotFoundError:
    return importlib.import_module(f"{package}.{name}")


def _build(name: str, size: str, overrides: dict):
  """(step, state, batch, model FLOPs per step) of package `name`, compiled and run once."""
  model_lib = importlib.import_module(f"{name}.model")
  steps, optim, parallel = (_module(name, m) for m in ("steps", "optim", "parallel"))
  fields, rows = SIZES[size]
  cfg = model_lib.TransformerConfig(**{**dict(dropout_rate=0.1, max_len=64), **fields, **overrides})
  model = model_lib.Transformer(cfg)
  dummy = jnp.ones((1, 8), jnp.int32)
  params = jax.jit(model.init)(jax.random.PRNGKey(0), dummy, dummy)["params"]
  tx = optim.make_optimizer(cfg.d_model, 4000)
  state = parallel.replicate(steps.TrainState.create(params, tx, jax.random.PRNGKey(1)))
  step = parallel.pmap_train_step(model, 0.1, optim.optimizer_schedule(cfg.d_model, 4000))
  batch = parallel.shard(
    inputs.synthetic_batch(rows, 32, 32, cfg.vocab_size, jax.local_device_count())
  )
  state, metrics = step(state, batch)
  jax.block_until_ready(metrics)
  return [step, state, batch, train.model_flops_per_step(cfg, params, rows, 32, 32)]


DECODE_LENGTH = 30


def _batch_search(name: str, translator: types.ModuleType) -> Callable:
  """search(params, inputs, limits, model) of package `name`: its public search_batch with
  the paper's search (SearchConfig's defaults) and EOS suppressed, or, in a checkout without that
  entry, its private jitted search with the same settings."""
  settings = dict(max_decode_len=32, suppress_eos=True)
  if hasattr(translator, "search_batch"):
    if "eos_only_at_limit" in inspect.signature(translator.search_batch).parameters:
      settings = dict(max_decode_len=32, eos_only_at_limit=True)
    paper = importlib.import_module(f"{name}.decoding.config").SearchConfig()
    return functools.partial(translator.search_batch, search=paper, **settings)
  paper = SearchConfig()
  alpha, beam = jnp.float32(paper.alpha), paper.beam_size
  return lambda *args, model: translator._search(
    *args, alpha, model=model, beam_size=beam, **settings
  )


def _build_decode(name: str, size: str, overrides: dict):
  """[run, None, None, 0]: run() decodes the synthetic sources once (compiled here)."""
  model_lib = importlib.import_module(f"{name}.model")
  # The translator imports the data package only for vocabularies; a second copy of its
  # __init__ would register the TFDS builders twice, which TFDS refuses. So the package is
  # entered without its __init__ (its submodules still import).
  data = types.ModuleType(f"{name}.data")
  data.__path__ = [os.path.join(importlib.import_module(name).__path__[0], "data")]
  sys.modules.setdefault(f"{name}.data", data)
  try:
    translator = importlib.import_module(f"{name}.decoding.translator")
  except ModuleNotFoundError:
    translator = importlib.import_module(f"{name}.translate")
  fields, rows = SIZES[size]
  cfg = model_lib.TransformerConfig(**{**dict(dropout_rate=0.0, max_len=64), **fields, **overrides})
  model = model_lib.Transformer(cfg)
  dummy = jnp.ones((1, 8), jnp.int32)
  params = jax.jit(model.init)(jax.random.PRNGKey(0), dummy, dummy)["params"]
  ids = np.random.default_rng(0).integers(4, cfg.vocab_size, (rows, DECODE_LENGTH))
  ids[:, -1] = 1  # EOS
  sources = jnp.asarray(ids, jnp.int32)
  limits = jnp.full((rows,), DECODE_LENGTH, jnp.int32)
  search = _batch_search(name, translator)

  def run():
    return search(params, sources, limits, model=model)

  jax.block_until_ready(run())
  return [run, None, None, 0]


def _parse_override(text: str) -> tuple:
  field, _, value = text.partition("=")
  if not field or not value:
    raise SystemExit(f"--b={text!r}: expected FIELD=VALUE")
  try:
    return field, ast.literal_eval(value)
  except (ValueError, SyntaxError):
    return field, value


def compare(
  checkout_a: str,
  checkout_b: str,
  size: str = "tiny",
  num_steps: int = 40,
  overrides_b: dict = None,
  part: str = "train",
) -> dict:
  """Alternates train steps (or whole decodes) of A and B (order swapped every pair);
  per-step times and the median B/A ratio with its quartiles."""
  root = tempfile.mkdtemp(prefix="t2t_ab_")
  try:
    _copy_package(checkout_a, "t2t_jax_ab_a", root)
    _copy_package(checkout_b, "t2t_jax_ab_b", root)
    sys.path.insert(0, root)
    build = _build_decode if part == "decode" else _build
    runs = [
      build("t2t_jax_ab_a", size, {}),
      build("t2t_jax_ab_b", size, overrides_b or {}),
    ]
    times = ([], [])
    for i in range(num_steps):
      for which in (0, 1) if i % 2 == 0 else (1, 0):
        run = runs[which]
        start = time.perf_counter()
        if part == "decode":
          jax.block_until_ready(run[0]())
        else:
          run[1], metrics = run[0](run[1], run[2])
          jax.block_until_ready(metrics)
        times[which].append(time.perf_counter() - start)
  finally:
    if root in sys.path:
      sys.path.remove(root)
    shutil.rmtree(root, ignore_errors=True)
  ratios = [b / a for a, b in zip(*times)]
  return dict(
    step_times_a=times[0],
    step_times_b=times[1],
    median_a=statistics.median(times[0]),
    median_b=statistics.median(times[1]),
    ratio=statistics.median(ratios),
    ratio_q25=float(np.quantile(ratios, 0.25)),
    ratio_q75=float(np.quantile(ratios, 0.75)),
    flops_a=runs[0][3],
    flops_b=runs[1][3],
  )


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("checkout_a")
  parser.add_argument("checkout_b")
  parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
  parser.add_argument("--steps", type=int, default=40)
  parser.add_argument("--part", choices=("train", "decode"), default="train")
  parser.add_argument("--b", action="append", default=[], metavar="FIELD=VALUE")
  args = parser.parse_args(argv)
  for path in (args.checkout_a, args.checkout_b):
    if not os.path.isdir(os.path.join(path, "t2t_jax")):
      raise SystemExit(f"{path}: not a checkout (no t2t_jax/ folder)")
  overrides = dict(_parse_override(o) for o in args.b)
  from t2t_jax.model import TransformerConfig

  known = {f.name for f in dataclasses.fields(TransformerConfig)}
  for field in overrides:
    if field not in known:
      raise SystemExit(f"--b={field}=...: TransformerConfig has no field {field!r}")
  r = compare(args.checkout_a, args.checkout_b, args.size, args.steps, overrides, args.part)
  ms = lambda t: f"min {1e3 * min(t):.1f} ms, median {1e3 * statistics.median(t):.1f} ms"
  rate = lambda flops, t: f", {flops / t / 1e9:.1f} GFLOP/s" if flops else ""
  print(f"A {args.checkout_a}: {ms(r['step_times_a'])}{rate(r['flops_a'], r['median_a'])}")
  print(f"B {args.checkout_b}: {ms(r['step_times_b'])}{rate(r['flops_b'], r['median_b'])}")
  what = "decode time" if args.part == "decode" else "step time"
  print(
    f"B/A {what}: median ratio {r['ratio']:.3f} "
    f"(quartiles {r['ratio_q25']:.3f}-{r['ratio_q75']:.3f}) over {args.steps} pairs"
  )


if __name__ == "__main__":
  main()
