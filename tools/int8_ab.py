"""Would int8 products speed up decoding on this CPU? Two measurements, printed:

    python tools/int8_ab.py products [--repeats=50]
    python tools/int8_ab.py output_layer WORKDIR INPUT REFERENCE [--passes=3]

`products`: XLA:CPU's matrix product at the shapes a decoding step of a multi30k-sized
model runs ([rows, 256] x [256, 1024], x [256, 8000], ...) in float32, as an int8 x int8
product accumulated in int32 (`lax.dot(preferred_element_type=int32)`, which VNNI and AMX
can run), and as that product with the float32 activations quantized per row first and the
result scaled back (what an int8 layer pays), milliseconds per product. Each int8 result
is checked against numpy's exact int64 product.

`output_layer`: the pre-softmax product (the largest of a step: [d_model, vocab]) with int8
weights (a scale per vocabulary column) and activations quantized per row, against float32,
on a trained workdir: `Translator.translate` of INPUT with beam 4 and greedy, sentences/s
of each pass (after one untimed pass that compiles) and sacreBLEU against REFERENCE. The
int8 layer is patched into `Embed.attend` and `decoding_params` for this process only (the
model's programs for it are compiled apart: their parameters are int8).
"""

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

# [rows, k] x [k, n] of a step of the 7.6M multi30k model (d_model 256, d_ff 1024, 8k vocab)
SHAPES = (
  (256, 256, 1024),
  (1024, 256, 1024),
  (1024, 1024, 256),
  (256, 256, 8000),
  (1024, 256, 8000),
)


def quantized_product(x: jax.Array, kernel_q: jax.Array, scale: jax.Array) -> jax.Array:
  """x [.., k] float32 times an int8 kernel [k, n] with a float32 scale per column: x
  quantized per row to int8 (max |x| -> 127), the product accumulated in int32, scaled back."""
  row_scale = jnp.maximum(jnp.max(jnp.abs(x), axis=-1, keepdims=True), 1e-12) / 127.0
  xq = jnp.round(x / row_scale).astype(jnp.int8)
  acc = jnp.matmul(xq, kernel_q, preferred_element_type=jnp.int32)
  return acc.astype(jnp.float32) * row_scale * scale


def quantize_columns(kernel: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """An int8 kernel and its float32 scale per column (max |column| -> 127)."""
  scale = np.maximum(np.abs(kernel).max(axis=0, keepdims=True), 1e-12) / 127.0
  return np.clip(np.round(kernel / scale), -127, 127).astype(np.int8), scale.astype(np.float32)


def _ms(fn: Callable[..., Any], *args: Any, repeats: int) -> float:
  jax.block_until_ready(fn(*args))
  start = time.perf_counter()
  for _ in range(repeats):
    out = fn(*args)
  jax.block_until_ready(out)
  return (time.perf_counter() - start) / repeats * 1e3


def products(repeats: int) -> list[dict[str, Any]]:
  rng = np.random.default_rng(0)
  f32 = jax.jit(lambda a, b: a @ b)
  i8 = jax.jit(lambda a, b: jax.lax.dot(a, b, preferred_element_type=jnp.int32))
  quant = jax.jit(quantized_product)
  rows = []
  for m, k, n in SHAPES:
    x, w = rng.standard_normal((m, k), np.float32), rng.standard_normal((k, n), np.float32)
    xi = rng.integers(-127, 128, (m, k)).astype(np.int8)
    wi = rng.integers(-127, 128, (k, n)).astype(np.int8)
    exact = xi.astype(np.int64) @ wi.astype(np.int64)
    if not np.array_equal(np.asarray(i8(xi, wi)), exact):
      raise AssertionError(f"int8 product of {(m, k, n)} is not numpy's")
    wq, scale = quantize_columns(w)
    row = dict(shape=(m, k, n), float32_ms=_ms(f32, x, w, repeats=repeats))
    row.update(int8_ms=_ms(i8, xi, wi, repeats=repeats))
    row.update(quantized_ms=_ms(quant, x, wq, scale, repeats=repeats))
    rows.append(row)
  return rows


def _patch_output_layer() -> None:
  """`decoding_params` adds an int8 copy of the output kernel and its scale; `Embed.attend`
  reads them (this process only)."""
  from t2t_jax.decoding import translator as translator_lib
  from t2t_jax.model import layers, transformer

  made = transformer.decoding_params

  def decoding_params(params: Any, config: Any) -> Any:
    out = made(params, config)
    embed = dict(out["embed"])
    kernel, scale = quantize_columns(np.asarray(embed[layers.OUTPUT_KERNEL], np.float32))
    embed[layers.OUTPUT_KERNEL], embed["output_scale"] = jnp.asarray(kernel), jnp.asarray(scale)
    return {**out, "embed": embed}

  attend = layers.Embed.attend

  def int8_attend(self: Any, x: jax.Array) -> jax.Array:
    if not self.has_variable("params", "output_scale"):
      return attend(self, x)
    kernel = self.get_variable("params", layers.OUTPUT_KERNEL)
    scale = self.get_variable("params", "output_scale")
    return quantized_product(x.astype(jnp.float32), kernel, scale)

  layers.Embed.attend = int8_attend
  for module in (transformer, translator_lib):
    if getattr(module, "decoding_params", None) is made:
      module.decoding_params = decoding_params


def output_layer(workdir: str, source: str, reference: str, passes: int, int8: bool) -> list:
  import sacrebleu

  from t2t_jax import compilation
  from t2t_jax.decoding.translator import Translator

  compilation.enable(tempfile.mkdtemp(prefix="t2t-int8-ab-"))
  if int8:
    _patch_output_layer()
  with open(source, encoding="utf-8") as f:
    lines = f.read().splitlines()
  with open(reference, encoding="utf-8") as f:
    refs = f.read().splitlines()
  translator = Translator.from_workdirs([workdir], dtype="float32")
  rows = []
  for beam in (4, 1):
    search = translator.search.override(beam_size=beam)
    translator.translate(lines, search=search)
    rates = []
    for _ in range(passes):
      start = time.perf_counter()
      out = translator.translate(lines, search=search)
      rates.append(len(lines) / (time.perf_counter() - start))
    bleu = sacrebleu.corpus_bleu(out, [refs]).score
    rows.append(dict(int8=int8, beam=beam, sentences_per_s=rates, bleu=bleu))
  return rows


def main(argv: list[str]) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("what", choices=("products", "output_layer", "_output_layer_one"))
  parser.add_argument("paths", nargs="*")
  parser.add_argument("--repeats", type=int, default=50)
  parser.add_argument("--passes", type=int, default=3)
  parser.add_argument("--int8", action="store_true")
  args = parser.parse_args(argv)
  if args.what == "products":
    print(
      "| rows x k x n | float32 ms | int8 ms | int8 / float32 | quantized ms | quantized / f32 |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for r in products(args.repeats):
      f = r["float32_ms"]
      print(
        f"| {' x '.join(map(str, r['shape']))} | {f:.3f} | {r['int8_ms']:.3f} | "
        f"{r['int8_ms'] / f:.2f} | {r['quantized_ms']:.3f} | {r['quantized_ms'] / f:.2f} |"
      )
    return
  if len(args.paths) != 3:
    parser.error("output_layer needs WORKDIR INPUT REFERENCE")
  if args.what == "_output_layer_one":  # one process per side: the patch stays in it
    for r in output_layer(*args.paths, args.passes, args.int8):
      rates = ", ".join(f"{x:.1f}" for x in r["sentences_per_s"])
      name = "int8 output layer" if r["int8"] else "float32"
      print(f"| {name} | {'greedy' if r['beam'] == 1 else 'beam 4'} | {rates} | {r['bleu']:.2f} |")
    return
  import subprocess

  print("| products | search | sentences/s per pass | sacreBLEU |")
  print("|---|---|---|---:|")
  for flag in ([], ["--int8"]):
    command = [sys.executable, __file__, "_output_layer_one", *args.paths]
    command += [f"--passes={args.passes}", *flag]
    sys.stdout.write(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
    sys.stdout.flush()


if __name__ == "__main__":
  main(sys.argv[1:])
