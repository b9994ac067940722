"""Every t2t-bench result as the lines of text it prints."""

from typing import Any

from t2t_jax.bench import ctranslate2, peers, real_text


def _peak_lines(results: dict[str, Any]) -> list[str]:
  p = results["peak"]
  others = ", ".join(f"{k} {v / 1e9:.1f}" for k, v in p.get("library_flops", {}).items())
  return [
    f"matmul peak ({p['platform']}, {p['dtype']}, n={p['n']}): {p['peak_flops'] / 1e9:.1f} "
    f"GFLOP/s by {p.get('peak_library', 'jax')} ({others})"
  ]


def _train_lines(t: dict[str, Any], peak: float | None) -> list[str]:
  mfu = f"{100 * t['achieved_flops'] / peak:.1f}%" if peak else "n/a"
  memory = t.get("peak_device_memory_bytes", t.get("peak_host_rss_bytes", 0)) / 2**20
  return [
    f"train: {t['params']:,} params, {t['devices']} device(s), {t['rows']} x {t['seq_len']}"
    f" tokens per side, dropout {t['dropout_rate']}, {t['dtype']}",
    f"  step {1e3 * t['step_time_s']:.1f} ms (median of {len(t['step_times_s'])}), "
    f"{t['target_tokens_per_s']:,.0f} target tokens/s",
    f"  {t['model_flops_per_target_token'] / 1e6:.1f} MFLOP per target token, "
    f"{t['achieved_flops'] / 1e9:.1f} GFLOP/s achieved, MFU {mfu}",
    f"  compile {t['compile_s']:.1f} s, compilations after warm-up: "
    f"{t['compiles_after_warmup']}, peak memory {memory:,.0f} MiB",
  ]


def _decode_lines(d: dict[str, Any]) -> list[str]:
  lines = [f"decode ({d['inputs']}; mean source {d['mean_source_tokens']:.1f} tokens):"]
  for name in ("beam", "greedy", "sampling"):
    if name not in d:
      continue
    r = d[name]
    lines.append(
      f"  {name} {r['beam_size']}: {r['sentences_per_s']:.1f} sentences/s, "
      f"{r['target_tokens_per_s']:,.0f} target tokens/s "
      f"({r['mean_output_tokens']:.1f} tokens per output, compile "
      f"{r['compile_s']:.1f} s)"
    )
  return lines


def _decode_vs_lines(d: dict[str, Any]) -> list[str]:
  m = d["model"]
  return [
    f"model d_model {m['d_model']}, {m['layers'][0]}+{m['layers'][1]} layers, vocab "
    f"{m['vocab_size']:,}; {d['inputs']}",
    ctranslate2.table(d),
  ]


def _pipeline_lines(p: dict[str, Any]) -> list[str]:
  if "skipped" in p:
    return [f"pipeline: skipped ({p['skipped']})"]
  return [
    f"pipeline ({p['source']}, {p['batching']}): {p['pairs_per_s']:,.0f} "
    f"pairs/s, {p['tokens_per_s']:,.0f} tokens/s (setup {p['setup_s']:.1f} s)"
  ]


def table(results: dict[str, Any]) -> str:
  """The parts present in `results` (t2t-bench's JSON), in the order they ran."""
  peak = results.get("peak", {}).get("peak_flops")
  lines = []
  if peak:
    lines += _peak_lines(results)
  if "train" in results:
    lines += _train_lines(results["train"], peak)
  if "train_vs" in results:
    lines.append(peers.table(results["train_vs"]))
  if "decode" in results:
    lines += _decode_lines(results["decode"])
  if "decode_vs" in results:
    lines += _decode_vs_lines(results["decode_vs"])
  if "decode_text" in results:
    lines.append(real_text.table(results["decode_text"]))
  if "pipeline" in results:
    lines += _pipeline_lines(results["pipeline"])
  return "\n".join(lines)
