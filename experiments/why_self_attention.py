"""Why self-attention (paper section 4, Table 1), measured on the device JAX sees.

    python -m t2t_jax.experiments.why_self_attention --out=DIR [--d_model=512] [--max_n=2048]
        [--kernel=3] [--window=32] [--batch=1] [--repeats=5] [--quick]

Not a training experiment (no get_config): a measurement. One layer of each kind at equal
d_model (self-attention, an LSTM, a causal convolution of kernel k, self-attention restricted
to the r latest positions; see `t2t_jax.experiments.layer_timing`) is timed at sequence
lengths n = 8, 16, ..., max_n:
  training  forward + backward over the whole sequence (jitted; median of --repeats runs
            after the compiling one);
  decoding  all n positions one at a time with a cache / carried state (one jitted
            lax.scan), total and per token.
The growth exponent in n is fitted (least squares on log time against log n) over the top
four lengths (max_n/8 .. max_n, where fixed per-call overheads no longer dominate; --fit_min
to change), beside the exponent of the FLOP count over the same range and the paper's
asymptotic one. The maximum path length is measured too: the fewest stacked layers for
output n-1 to depend on input 0 (forward-mode derivative), for n = 8 .. --path_max_n.

Writes DIR/why_self_attention.json (every figure), DIR/time_vs_n.png (training and decoding
panels, log-log, fitted exponents in the legend) and DIR/path_length.png, and prints the
paper's Table 1 beside the measured exponents. --quick: d_model 16, n = 8..32, r = 4 (a
smoke test of the whole pipeline in well under a minute; its timings mean nothing).
"""

import json
import os
import platform

import jax
import numpy as np
from absl import app, flags

from t2t_jax.experiments import layer_timing as lt

FLAGS = flags.FLAGS
JSON_NAME = "why_self_attention.json"
QUICK = dict(d_model=16, num_heads=2, max_n=32, window=4, repeats=3, path_max_n=32)
COLORS = dict(
  self_attention="tab:orange",
  recurrent="tab:blue",
  convolutional="tab:green",
  dilated="tab:olive",
  restricted="tab:purple",
)


def measure(
  spec: lt.LayerSpec, ns, path_ns, batch: int = 1, repeats: int = 5, fit_min: int = 0, log=print
) -> dict:
  """Times every layer kind at every n, fits exponents, measures path lengths."""
  fit_min = fit_min or max(ns[0], ns[-1] // 8)
  results = dict(
    device=_device(),
    spec=vars(spec),
    batch=batch,
    repeats=repeats,
    n=list(ns),
    fit_range=[fit_min, ns[-1]],
    timing={},
    exponents={},
    table1=lt.TABLE1,
  )
  for kind in lt.KINDS:
    rows, params = [], lt.init_params(kind, spec)
    for n in ns:
      rows.append(lt.time_layer(kind, n, spec, batch, repeats, params))
      log(
        f"{lt.LABELS[kind]:27s} n={n:5d}  train {1e3 * rows[-1]['train_s']:9.3f} ms  "
        f"decode {1e3 * rows[-1]['decode_s']:9.3f} ms "
        f"({1e6 * rows[-1]['decode_per_token_s']:.1f} us/token)"
      )
    results["timing"][kind] = {key: [r[key] for r in rows] for key in rows[0]}
    results["exponents"][kind] = _exponents(results["timing"][kind], fit_min)
  results["crossover"] = _crossover(results)
  results["path"] = lt.path_lengths(path_ns, spec)
  return results


def _device() -> dict:
  d = jax.devices()[0]
  return dict(
    platform=d.platform,
    kind=d.device_kind,
    count=jax.device_count(),
    jax=jax.__version__,
    cpu_count=os.cpu_count(),
    machine=platform.machine(),
  )


def _exponents(timing: dict, fit_min: int) -> dict:
  fit = lambda key: lt.fit_exponent(timing["n"], timing[key], fit_min)
  return dict(
    train=fit("train_s"),
    decode=fit("decode_s"),
    train_flops=fit("train_flops"),
    decode_flops=fit("decode_flops"),
  )


def _crossover(results: dict) -> dict:
  """First n where self-attention is slower than the LSTM (the paper: when n > d)."""
  out = {}
  for mode in ("train_s", "decode_s"):
    sa, rnn = (np.asarray(results["timing"][k][mode]) for k in ("self_attention", "recurrent"))
    slower = [n for n, a, b in zip(results["n"], sa, rnn) if a > b]
    out[mode[:-2]] = slower[0] if slower else None
  return out


def table(results: dict) -> str:
  """The paper's Table 1 beside the measured exponents and path lengths."""
  lo, hi = results["fit_range"]
  path, spec = results["path"], results["spec"]
  lines = [
    f"Table 1 of the paper beside this run ({results['device']['kind']}, d_model "
    f"{spec['d_model']}, k {spec['kernel']}, r {spec['window']}, batch {results['batch']}).",
    f"Exponent of n: paper's asymptotic one; measured, fitted over n = {lo}..{hi} "
    f"(the FLOP count's over the same range in brackets).",
    f"Path: layers for output n-1 to see input 0, n = {'/'.join(map(str, path['n']))}.",
    "",
  ]
  row = "{:27s} {:11s} {:8s} {:14s}| {:>5s} {:>14s} {:>14s} | {}"
  lines.append(
    row.format(
      "layer type", "complexity", "seq. ops", "max path", "paper", "train", "decode", "path"
    )
  )
  lines.append("-" * (len(lines[-1]) + 12))
  for kind in ("self_attention", "recurrent", "convolutional", "dilated", "restricted"):
    p = path[kind]
    layers_ = "/".join(map(str, p["min_layers"]))
    if kind == "recurrent":
      layers_ += f" ({'/'.join(map(str, p['path_length']))} sequential steps)"
    if kind == "dilated":
      lines.append(
        row.format(lt.LABELS[kind], "", "", lt.TABLE1["convolutional"]["path"], "", "", "", layers_)
      )
      continue
    paper, e = lt.TABLE1[kind], results["exponents"][kind]
    lines.append(
      row.format(
        lt.LABELS[kind],
        paper["complexity"],
        paper["sequential"],
        "O(n/k) plain" if kind == "convolutional" else paper["path"],
        str(paper["exponent"]),
        f"{e['train']:.2f} ({e['train_flops']:.2f})",
        f"{e['decode']:.2f} ({e['decode_flops']:.2f})",
        layers_,
      )
    )
  cross = {mode: n or f"none up to {hi}" for mode, n in results["crossover"].items()}
  lines.append(
    f"\nSelf-attention slower than the LSTM from n = {cross['train']} (training), "
    f"{cross['decode']} (decoding); the paper: when n > d = {spec['d_model']}."
  )
  return "\n".join(lines)


def plot_times(results: dict):
  """Two log-log panels (training, decoding) of time per layer against n, with fits."""
  import matplotlib.ticker
  from matplotlib.figure import Figure

  fig = Figure(figsize=(12, 5.2), layout="constrained")
  axes = fig.subplots(1, 2)
  lo, hi = results["fit_range"]
  titles = dict(
    train="training: forward + backward, whole sequence",
    decode="decoding: n positions one at a time (cache / state)",
  )
  for ax, mode in zip(axes, ("train", "decode")):
    ax.axvspan(lo, hi, color="0.93", zorder=0, label=f"fit range n = {lo}..{hi}")
    for kind in lt.KINDS:
      _plot_kind(ax, results, kind, mode)
    ax.set(
      xscale="log",
      yscale="log",
      title=titles[mode],
      xlabel="sequence length n",
      ylabel=("time per layer (s)" if mode == "train" else "time to decode all n positions (s)"),
    )
    ax.set_xticks(results["n"], [str(n) for n in results["n"]])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
  spec = results["spec"]
  fig.suptitle(
    f"One layer, d_model {spec['d_model']}, batch {results['batch']}, "
    f"{results['device']['kind']}: exponent of n (FLOP-count exponent)"
  )
  return fig


def _plot_kind(ax, results, kind, mode):
  timing = results["timing"][kind]
  e = results["exponents"][kind]
  ns, times = np.asarray(timing["n"], float), np.asarray(timing[f"{mode}_s"])
  label = f"{lt.LABELS[kind]}: n^{e[mode]:.2f} (FLOPs n^{e[mode + '_flops']:.2f})"
  ax.plot(ns, times, "o-", color=COLORS[kind], label=label)
  lo, _ = results["fit_range"]
  keep = ns >= lo
  slope, icpt = np.polyfit(np.log(ns[keep]), np.log(times[keep]), 1)
  ax.plot(ns[keep], np.exp(icpt) * ns[keep] ** slope, "--", color=COLORS[kind], lw=3, alpha=0.35)


def plot_path_lengths(results: dict):
  """Maximum path length against distance: measured (markers) and predicted (dashed)."""
  import matplotlib.ticker
  from matplotlib.figure import Figure

  path, spec = results["path"], results["spec"]
  fig = Figure(figsize=(7, 5), layout="constrained")
  ax = fig.subplots()
  ns = path["n"]
  names = dict(
    self_attention="self-attention: layers",
    recurrent="recurrent: sequential steps",
    convolutional=f"convolutional k={spec['kernel']}: layers",
    dilated=f"dilated conv k={spec['kernel']}: layers",
    restricted=f"restricted r={spec['window']}: layers",
  )
  for kind, name in names.items():
    p = path[kind]
    expected = [n - 1 for n in ns] if kind == "recurrent" else p["expected_layers"]
    ax.plot(ns, p["path_length"], "o", color=COLORS[kind], ms=7, label=name)
    ax.plot(ns, expected, "--", color=COLORS[kind], alpha=0.6)
  ax.set(
    xscale="log",
    yscale="log",
    xlabel="distance: output position n-1 from input 0",
    ylabel="path length (layers, or steps for the LSTM)",
    title="Maximum path length: measured (dots), receptive field (dashed)",
  )
  ax.set_xticks(ns, [str(n) for n in ns])
  ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
  ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
  ax.grid(True, alpha=0.3)
  ax.legend(fontsize=8)
  return fig


def run(
  out_dir: str,
  spec: lt.LayerSpec,
  ns,
  path_ns,
  batch: int = 1,
  repeats: int = 5,
  fit_min: int = 0,
  log=print,
) -> tuple:
  """Measures, prints the table, writes the JSON and PNGs; returns (results, figures)."""
  results = measure(spec, ns, path_ns, batch, repeats, fit_min, log)
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, JSON_NAME), "w", encoding="utf-8") as f:
    json.dump(results, f, indent=1)
  return results, report(results, out_dir, log)


def report(results: dict, out_dir: str, log=print) -> dict:
  """Prints the table and writes the PNGs; returns the figures by file name."""
  log(table(results))
  figures = dict(time_vs_n=plot_times(results), path_length=plot_path_lengths(results))
  for name, fig in figures.items():
    fig.savefig(os.path.join(out_dir, f"{name}.png"), dpi=120)
  log(f"wrote {out_dir}/{JSON_NAME}, time_vs_n.png, path_length.png")
  return figures


def _define_flags():
  # Defined only when run as a program, so importing this module (tests, tools that load
  # every experiment file) defines no flags.
  flags.DEFINE_string("out", None, "output directory", required=True)
  flags.DEFINE_integer("d_model", 512, "model width shared by every layer kind")
  flags.DEFINE_integer("num_heads", 8, "attention heads (d_model must divide)")
  flags.DEFINE_integer("min_n", 8, "shortest sequence (a power of 2)")
  flags.DEFINE_integer("max_n", 2048, "longest sequence (a power of 2)")
  flags.DEFINE_integer("kernel", 3, "convolution kernel k")
  flags.DEFINE_integer("window", 32, "restricted self-attention neighbourhood r")
  flags.DEFINE_integer("batch", 1, "sequences per call")
  flags.DEFINE_integer("repeats", 5, "timed runs after the compiling one (median)")
  flags.DEFINE_integer("fit_min", 0, "fit exponents over n >= this (0: max_n / 8)")
  flags.DEFINE_integer("path_max_n", 128, "longest distance for the path-length probe")
  flags.DEFINE_string("attention_impl", "reference", "reference, xla or cudnn")
  flags.DEFINE_bool("quick", False, f"smoke test: {QUICK} unless given")
  flags.DEFINE_bool("replot", False, f"only redraw the table and PNGs from --out's {JSON_NAME}")


def main(argv):
  del argv
  if FLAGS.replot:
    with open(os.path.join(FLAGS.out, JSON_NAME), encoding="utf-8") as f:
      report(json.load(f), FLAGS.out)
    return
  values = {name: FLAGS[name].value for name in QUICK}
  if FLAGS.quick:
    values.update({k: v for k, v in QUICK.items() if not FLAGS[k].present})
  spec = lt.LayerSpec(
    d_model=values["d_model"],
    num_heads=values["num_heads"],
    kernel=FLAGS.kernel,
    window=values["window"],
    attention_impl=FLAGS.attention_impl,
  )
  ns = lt.powers_of_two(FLAGS.min_n, values["max_n"])
  path_ns = lt.powers_of_two(FLAGS.min_n, values["path_max_n"])
  run(FLAGS.out, spec, ns, path_ns, FLAGS.batch, values["repeats"], FLAGS.fit_min)


if __name__ == "__main__":
  _define_flags()
  app.run(main)
