"""t2t-bench: speed of an experiment against the device's measured matmul peak.

    t2t-bench --experiment=tiny [--config.FIELD=VALUE ...] [--parts=peak,train,decode,pipeline]
              [--batch_tokens=4096] [--seq_len=32] [--json=bench.json]

Prints a table and writes JSON with:
  peak      the measured FLOP/s of a large matrix product (float32 on CPU, bf16 on GPU/TPU);
  train     train-step time (median of --steps after compile), target tokens/s, model FLOPs
            per target token, achieved FLOP/s, MFU against the peak, compile time and the
            number of compilations after warm-up (should be 0), peak memory;
  decode    beam search (--beam_size, alpha 0.6) and greedy: sentences/s and generated
            tokens/s on real sentences (multi30k or newstest2014 from ../shared/data when
            present, else synthetic), with a trained --workdir or random parameters;
  pipeline  the input pipeline's pairs/s and tokens/s.

With --vs=peers, train times the same model and batch in t2t_jax, torch.nn.Transformer, a
plain flax.linen Transformer and Hugging Face's MarianMTModel, interleaved
(cli/bench_peers.py; JSON `train_vs`); --vs=ctranslate2 does the same for decode.

Model FLOPs (per training step, on full-length synthetic batches, so every token is real):
  6 * (encoder non-embedding params * source tokens + decoder non-embedding params * target
  tokens)  [forward 2, backward 4 per parameter and token]
  + 6 * d_model * vocab * target tokens  [pre-softmax layer; shared with the embedding]
  + 3 * sum over attention layers of 4 * q_len * kv_len * h * d_k  [QK^T and AV, full
  matrices, as computed]. Embedding lookups, layer norms, softmax and the optimizer are not
  counted (standard MFU practice).
"""

import dataclasses
import json
import os
import pathlib
import resource
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import app, flags
from flax.typing import VariableDict
from jax.typing import DTypeLike

from t2t_jax.cli import common, host
from t2t_jax.data import sources as data_sources
from t2t_jax.decoding import translator as translator_lib
from t2t_jax.model import Transformer, TransformerConfig
from t2t_jax.training import optim, parallel, steps

flags.DEFINE_string("experiment", "tiny", "experiment (as for t2t-train), optionally NAME:ARG")
flags.DEFINE_list("parts", ["peak", "train", "decode", "pipeline"], "what to measure")
flags.DEFINE_integer("batch_tokens", 0, "target tokens per training step (0: the config's)")
flags.DEFINE_integer("seq_len", 32, "source and target length of the synthetic batch")
flags.DEFINE_integer("vocab_size", 0, "vocabulary size (0: the config's data.vocab_size)")
flags.DEFINE_integer("steps", 10, "timed training steps after warm-up")
flags.DEFINE_string("workdir", None, "trained workdir for decoding (else random parameters)")
flags.DEFINE_integer("decode_sentences", 128, "sentences to decode")
flags.DEFINE_enum(
  "decode_corpus",
  "",
  ["", "multi30k", "newstest2014"],
  "source sentences for the decode figure, from ../shared/data "
  "($T2T_SHARED_DATA); empty: multi30k test2016, else newstest2014, else "
  "synthetic",
)
flags.DEFINE_integer("beam_size", 4, "beam width for the decoding figure")
flags.DEFINE_enum(
  "vs",
  "",
  ["", "ctranslate2", "peers"],
  "ctranslate2: decode the same parameters and sources in CTranslate2 too, interleaved "
  "(random parameters: sources of --seq_len tokens, outputs forced to that length); peers: "
  "train the same model on the same batch in torch, plain flax and Marian too, interleaved",
)
flags.DEFINE_integer("repeats", 3, "interleaved repetitions per system for --vs")
flags.DEFINE_integer("pipeline_batches", 200, "batches drawn from the input pipeline")
flags.DEFINE_string("json", None, "write the results here as JSON")
FLAGS = flags.FLAGS


class CompileCounter:
  """Counts XLA compilations (jax's backend-compile events)."""

  def __init__(self) -> None:
    self.count = 0
    jax.monitoring.register_event_duration_secs_listener(self._listen)

  def _listen(self, event: str, duration: float, **kwargs: Any) -> None:
    del duration, kwargs
    if event == "/jax/core/compile/backend_compile_duration":
      self.count += 1


def _best_time(run: Callable[[], object], repeats: int) -> float:
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
  peaks["numpy"] = 2 * n**3 / _best_time(lambda: a @ a, repeats)
  try:
    import torch
  except ImportError:
    return peaks
  t = torch.from_numpy(a)
  peaks["torch"] = 2 * n**3 / _best_time(lambda: t @ t, repeats)
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
  rates = {"jax": 2 * n**3 / _best_time(lambda: matmul(a, a).block_until_ready(), repeats)}
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


def _non_embedding(params: VariableDict) -> tuple[int, int]:
  """(encoder, decoder) parameter counts without embeddings and position tables."""
  count = lambda tree: sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree))
  strip = lambda tree: {k: v for k, v in tree.items() if k != "positions"}
  return count(strip(params["encoder"])), count(strip(params["decoder"]))


def model_flops_per_step(
  cfg: TransformerConfig, params: VariableDict, rows: int, src_len: int, tgt_len: int
) -> float:
  enc, dec = _non_embedding(params)
  src_tokens, tgt_tokens = rows * src_len, rows * tgt_len
  dense = 6 * (enc * src_tokens + dec * tgt_tokens)
  softmax = 6 * cfg.d_model * cfg.vocab_size * tgt_tokens
  per_pair = lambda q, k: 2 * q * k * cfg.num_heads * (cfg.key_dim + cfg.value_dim)
  attention = rows * (
    cfg.encoder_layers * per_pair(src_len, src_len)
    + cfg.decoder_layers * (per_pair(tgt_len, tgt_len) + per_pair(tgt_len, src_len))
  )
  return dense + softmax + 3 * attention


def _synthetic_batch(rows: int, src_len: int, tgt_len: int, vocab: int, devices: int):
  rng = np.random.default_rng(0)
  batch = dict(
    inputs=rng.integers(4, vocab, (devices, rows // devices, src_len)),
    targets=rng.integers(4, vocab, (devices, rows // devices, tgt_len)),
  )
  return {k: v.astype(np.int32) for k, v in batch.items()}


def _peak_memory() -> dict[str, int]:
  stats = jax.devices()[0].memory_stats() or {}
  if "peak_bytes_in_use" in stats:
    return dict(peak_device_memory_bytes=int(stats["peak_bytes_in_use"]))
  # CPU: the process's peak resident memory stands in for device memory.
  return dict(peak_host_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)


def train_rows(batch_tokens: int, seq_len: int, devices: int) -> int:
  """Rows of the synthetic batch: batch_tokens / seq_len, a multiple of the devices."""
  return max(devices, batch_tokens // seq_len // devices * devices)


@dataclasses.dataclass
class TrainSetup:
  """t2t_jax's training step as bench_train times it, for reuse by the peer comparison."""

  cfg: TransformerConfig
  params: VariableDict  # the initial parameters (counts, FLOPs); the state holds copies
  state: steps.TrainState  # replicated on the local devices; donated by `step`
  step: Callable[..., tuple[steps.TrainState, dict[str, jax.Array]]]
  host_batch: dict[str, np.ndarray]  # int32 [devices, rows / devices, seq_len]
  batch: dict[str, jax.Array]  # host_batch on the devices
  rows: int
  devices: int


def setup_train(
  cfg: TransformerConfig, warmup_steps: int, label_smoothing: float, rows: int, seq_len: int
) -> TrainSetup:
  """Initial parameters, replicated Adam state, the pmapped train step and a synthetic batch
  of rows x seq_len random ids on both sides (no padding: every token is real)."""
  model = Transformer(cfg)
  devices = jax.local_device_count()
  dummy = jnp.ones((1, 8), jnp.int32)
  params = jax.jit(model.init)(jax.random.PRNGKey(0), dummy, dummy)["params"]
  tx = optim.make_optimizer(cfg.d_model, warmup_steps)
  state = parallel.replicate(steps.TrainState.create(params, tx, jax.random.PRNGKey(1)))
  schedule = optim.optimizer_schedule(cfg.d_model, warmup_steps)
  step = parallel.pmap_train_step(model, label_smoothing, schedule)
  host_batch = _synthetic_batch(rows, seq_len, seq_len, cfg.vocab_size, devices)
  batch = parallel.shard(host_batch)
  return TrainSetup(cfg, params, state, step, host_batch, batch, rows, devices)


def bench_train(
  config: ml_collections.ConfigDict,
  vocab_size: int,
  batch_tokens: int,
  seq_len: int,
  num_steps: int,
  counter: CompileCounter,
) -> dict[str, Any]:
  cfg = TransformerConfig.from_dict(config.model.to_dict(), vocab_size=vocab_size)
  rows = train_rows(batch_tokens, seq_len, jax.local_device_count())
  setup = setup_train(cfg, config.warmup_steps, config.label_smoothing, rows, seq_len)
  state, step, batch, params = setup.state, setup.step, setup.batch, setup.params
  t0 = time.perf_counter()
  state, metrics = step(state, batch)
  jax.block_until_ready(metrics)
  first = time.perf_counter() - t0
  compiles_before = counter.count
  times = []
  for _ in range(num_steps):
    t0 = time.perf_counter()
    state, metrics = step(state, batch)
    jax.block_until_ready(metrics)
    times.append(time.perf_counter() - t0)
  median = statistics.median(times)
  flops = model_flops_per_step(cfg, params, rows, seq_len, seq_len)
  tgt_tokens = rows * seq_len
  return dict(
    params=sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params)),
    devices=setup.devices,
    rows=rows,
    seq_len=seq_len,
    target_tokens_per_step=tgt_tokens,
    dropout_rate=cfg.dropout_rate,
    dtype=cfg.dtype.name,
    step_time_s=median,
    step_times_s=times,
    compile_s=first - median,
    compiles_after_warmup=counter.count - compiles_before,
    target_tokens_per_s=tgt_tokens / median,
    model_flops_per_step=flops,
    model_flops_per_target_token=flops / tgt_tokens,
    achieved_flops=flops / median,
    **_peak_memory(),
  )


def bench_train_vs(
  config: ml_collections.ConfigDict,
  vocab_size: int,
  batch_tokens: int,
  seq_len: int,
  counter: CompileCounter,
  peak: dict[str, Any] | None,
) -> dict[str, Any]:
  """The training step against torch, plain flax and Marian (see cli/bench_peers.py)."""
  from t2t_jax.cli import bench_peers

  cfg = TransformerConfig.from_dict(config.model.to_dict(), vocab_size=vocab_size)
  workload = bench_peers.Workload(
    model=cfg,
    rows=train_rows(batch_tokens, seq_len, jax.local_device_count()),
    seq_len=seq_len,
    label_smoothing=config.label_smoothing,
    warmup_steps=config.warmup_steps,
  )
  return bench_peers.compare(
    workload, steps=FLAGS.steps, repeats=FLAGS.repeats, peak=peak, counter=counter
  )


def shared_data_dir() -> pathlib.Path:
  """The offline corpora: $T2T_SHARED_DATA, else `shared/data` beside the repository."""
  if os.environ.get("T2T_SHARED_DATA"):
    return pathlib.Path(os.environ["T2T_SHARED_DATA"])
  return pathlib.Path(__file__).resolve().parents[3] / "shared" / "data"


def _multi30k_data_config(
  directory: pathlib.Path, like: ml_collections.ConfigDict
) -> ml_collections.ConfigDict:
  """Multi30k en-de as text files, batched like `like` (the stand-in for WMT's pipeline)."""
  from t2t_jax import data

  c = data.default_config()
  c.update(source="textfiles", source_lang="en", target_lang="de", vocab_size=8000)
  for split, stem in (("train", "train"), ("dev", "val"), ("test", "test2016")):
    c[f"{split}_source"] = str(directory / f"{stem}.en")
    c[f"{split}_target"] = str(directory / f"{stem}.de")
  c.update(max_len=like.max_len, tokens_per_batch=like.tokens_per_batch, batching=like.batching)
  return c


CORPORA = {"multi30k": "multi30k/test2016.en", "newstest2014": "wmt14/newstest2014.en"}


def _real_sentences(n: int, corpus: str = ""):
  """English sources from ../shared/data: `corpus` (an error if absent), or the first of
  multi30k test2016 and newstest2014 present, or (None, None)."""
  root = str(shared_data_dir())
  for name in [corpus] if corpus else CORPORA:
    path = os.path.join(root, CORPORA[name])
    if os.path.isfile(path):
      with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f][:n], CORPORA[name]
  if corpus:
    raise app.UsageError(
      f"--decode_corpus={corpus}: {path} not found "
      f"(set T2T_SHARED_DATA to the folder holding {CORPORA[corpus]})"
    )
  return None, None


def _decode_inputs(
  config: ml_collections.ConfigDict, vocab_size: int, n: int
) -> tuple[list[list[int]], str, VariableDict, Transformer]:
  """(source id lists, description, params, model) for the decode figure."""
  sentences, origin = _real_sentences(n, FLAGS.decode_corpus)
  if FLAGS.workdir:
    tr = translator_lib.Translator.from_workdir(FLAGS.workdir)
    if sentences is None:
      raise app.UsageError("--workdir given but no real sentences under ../shared/data")
    ids = tr._source_ids(sentences)
    return ids, f"{origin} through {FLAGS.workdir}'s model", tr.params, tr.model
  rng = np.random.default_rng(0)
  if sentences is not None:
    # Random parameters and ids, with the lengths of real sentences (~1.3 subwords a word).
    lengths = [max(2, int(round(1.3 * len(s.split())))) + 1 for s in sentences]
    what = f"random ids with the lengths of {origin} (1.3 subwords per word)"
  else:
    lengths = [30] * n
    what = "synthetic: random ids, 30 tokens each"
  ids = [list(rng.integers(4, vocab_size, size=n - 1)) + [1] for n in lengths]
  cfg = TransformerConfig.from_dict(config.model.to_dict(), vocab_size=vocab_size)
  model = Transformer(cfg)
  dummy = jnp.ones((1, 8), jnp.int32)
  params = jax.jit(model.init)(jax.random.PRNGKey(0), dummy, dummy)["params"]
  return ids, what + ", random parameters, outputs as long as sources", params, model


def bench_decode(
  config: ml_collections.ConfigDict, vocab_size: int, n: int, beam_size: int
) -> dict[str, Any]:
  ids, what, params, model = _decode_inputs(config, vocab_size, n)
  extra = config.get("max_output_extra", 50)
  max_len = model.config.max_len
  src_len = min(max(len(s) for s in ids), max_len)
  inputs = np.zeros((len(ids), src_len), np.int32)
  for r, s in enumerate(ids):
    inputs[r, : min(len(s), src_len)] = s[:src_len]
  # A trained model stops where it wants (limit: source + 50, as in the paper); random
  # parameters would stop at once, so there EOS is suppressed until the source length.
  trained = FLAGS.workdir is not None
  limits = np.array([len(s) + (extra if trained else 0) for s in ids], np.int32)
  limits = np.minimum(limits, max_len)
  max_decode_len = int(min(-(-limits.max() // 8) * 8, max_len))
  out = {}
  for name, beam in (("beam", beam_size), ("greedy", 1)):
    run = lambda beam=beam: np.asarray(
      translator_lib._search(
        params,
        jnp.asarray(inputs),
        jnp.asarray(limits),
        jnp.float32(0.6),
        model=model,
        max_decode_len=max_decode_len,
        beam_size=beam,
        suppress_eos=not trained,
      )
    )
    t0 = time.perf_counter()
    run()
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    seqs = run()
    elapsed = time.perf_counter() - t0
    generated = int(np.sum(seqs != 0))  # tokens up to and including EOS
    out[name] = dict(
      beam_size=beam,
      sentences=len(ids),
      seconds=elapsed,
      compile_s=first - elapsed,
      sentences_per_s=len(ids) / elapsed,
      target_tokens=generated,
      target_tokens_per_s=generated / elapsed,
      mean_output_tokens=generated / len(ids),
    )
  out["inputs"] = what
  out["mean_source_tokens"] = float(np.mean([len(s) for s in ids]))
  return out


def bench_decode_vs(config: ml_collections.ConfigDict, vocab_size: int) -> dict[str, Any]:
  """Beam search against CTranslate2 on the same parameters (see cli/bench_ctranslate2.py)."""
  from t2t_jax.cli import bench_ctranslate2 as vs
  from t2t_jax.export import load_trained

  alpha = 0.6
  if FLAGS.workdir:
    trained = load_trained(FLAGS.workdir)
    sentences, origin = _real_sentences(FLAGS.decode_sentences, FLAGS.decode_corpus)
    if sentences is None:
      raise app.UsageError("--workdir given but no real sentences under ../shared/data")
    tr = translator_lib.Translator.from_workdir(FLAGS.workdir)
    ids = tr._source_ids(sentences)
    extra = config.get("max_output_extra", 50)
    limits = [min(len(s) + extra, trained.config.max_len) for s in ids]
    forced, what = False, f"{origin} through {FLAGS.workdir}'s model"
  else:
    cfg = TransformerConfig.from_dict(config.model.to_dict(), vocab_size=vocab_size)
    trained = vs.random_trained(cfg)
    ids = vs.synthetic_sources(FLAGS.decode_sentences, FLAGS.seq_len, vocab_size)
    limits = [FLAGS.seq_len] * len(ids)
    forced, what = True, f"random parameters and ids, {FLAGS.seq_len} tokens"
  result = vs.compare(
    trained,
    ids,
    limits,
    beam_size=FLAGS.beam_size,
    alpha=alpha,
    forced=forced,
    repeats=FLAGS.repeats,
    stop=config.get("beam_stop", "exact"),
  )
  result["inputs"] = what
  result["model"] = dict(
    d_model=trained.config.d_model,
    layers=[trained.config.encoder_layers, trained.config.decoder_layers],
    vocab_size=trained.config.vocab_size,
  )
  return result


def bench_pipeline(config: ml_collections.ConfigDict, num_batches: int) -> dict[str, Any]:
  import tempfile

  from t2t_jax import data

  data_config = config.data
  note = config.data.source
  if data_config.source not in ("synthetic", "textfiles"):
    # WMT needs a download: measure the same pipeline on multi30k instead.
    root = shared_data_dir()
    if not (root / "multi30k" / "train.en").exists():
      return dict(skipped=f"{data_config.source} needs a download and multi30k is absent")
    data_config = _multi30k_data_config(root / "multi30k", data_config)
    note = "multi30k (stand-in for WMT)"
  with tempfile.TemporaryDirectory() as workdir:
    t0 = time.perf_counter()
    ds = data.get_datasets(data_config, workdir, num_local_devices=jax.local_device_count())
    setup = time.perf_counter() - t0
    it = ds.train_iter()
    pairs = tokens = 0
    t0 = time.perf_counter()
    for _ in range(num_batches):
      batch = next(it)
      tokens += int(np.sum(batch["targets"] != 0) + np.sum(batch["inputs"] != 0))
      seg = batch.get("targets_segmentation")
      pairs += int(
        np.sum(batch["targets"][..., 0] != 0)
        if seg is None
        else sum(len(np.unique(r[r > 0])) for r in seg.reshape(-1, seg.shape[-1]))
      )
    elapsed = time.perf_counter() - t0
    it.close()
  return dict(
    source=note,
    batching=data_config.batching,
    setup_s=setup,
    batches=num_batches,
    pairs_per_s=pairs / elapsed,
    tokens_per_s=tokens / elapsed,
  )


def _table(results: dict[str, Any]) -> str:
  lines = []
  peak = results.get("peak", {}).get("peak_flops")
  if peak:
    p = results["peak"]
    others = ", ".join(f"{k} {v / 1e9:.1f}" for k, v in p.get("library_flops", {}).items())
    lines.append(
      f"matmul peak ({p['platform']}, {p['dtype']}, n={p['n']}): {peak / 1e9:.1f} GFLOP/s "
      f"by {p.get('peak_library', 'jax')} ({others})"
    )
  if "train" in results:
    t = results["train"]
    mfu = f"{100 * t['achieved_flops'] / peak:.1f}%" if peak else "n/a"
    memory = t.get("peak_device_memory_bytes", t.get("peak_host_rss_bytes", 0)) / 2**20
    lines += [
      f"train: {t['params']:,} params, {t['devices']} device(s), {t['rows']} x {t['seq_len']}"
      f" tokens per side, dropout {t['dropout_rate']}, {t['dtype']}",
      f"  step {1e3 * t['step_time_s']:.1f} ms (median of {len(t['step_times_s'])}), "
      f"{t['target_tokens_per_s']:,.0f} target tokens/s",
      f"  {t['model_flops_per_target_token'] / 1e6:.1f} MFLOP per target token, "
      f"{t['achieved_flops'] / 1e9:.1f} GFLOP/s achieved, MFU {mfu}",
      f"  compile {t['compile_s']:.1f} s, compilations after warm-up: "
      f"{t['compiles_after_warmup']}, peak memory {memory:,.0f} MiB",
    ]
  if "train_vs" in results:
    from t2t_jax.cli import bench_peers

    lines.append(bench_peers.table(results["train_vs"]))
  if "decode" in results:
    d = results["decode"]
    lines.append(f"decode ({d['inputs']}; mean source {d['mean_source_tokens']:.1f} tokens):")
    for name in ("beam", "greedy"):
      r = d[name]
      lines.append(
        f"  {name} {r['beam_size']}: {r['sentences_per_s']:.1f} sentences/s, "
        f"{r['target_tokens_per_s']:,.0f} target tokens/s "
        f"({r['mean_output_tokens']:.1f} tokens per output, compile "
        f"{r['compile_s']:.1f} s)"
      )
  if "decode_vs" in results:
    from t2t_jax.cli import bench_ctranslate2 as vs

    d = results["decode_vs"]
    m = d["model"]
    lines.append(
      f"model d_model {m['d_model']}, {m['layers'][0]}+{m['layers'][1]} layers, vocab "
      f"{m['vocab_size']:,}; {d['inputs']}"
    )
    lines.append(vs.table(d))
  if "pipeline" in results:
    p = results["pipeline"]
    if "skipped" in p:
      lines.append(f"pipeline: skipped ({p['skipped']})")
    else:
      lines.append(
        f"pipeline ({p['source']}, {p['batching']}): {p['pairs_per_s']:,.0f} "
        f"pairs/s, {p['tokens_per_s']:,.0f} tokens/s (setup {p['setup_s']:.1f} s)"
      )
  return "\n".join(lines)


def main(argv: Sequence[str]) -> None:
  del argv
  common.quiet_library_logs()
  config = FLAGS.config
  vocab = FLAGS.vocab_size or config.data.vocab_size
  if data_sources.get_source(config.data).vocab_size_from_task and not FLAGS.vocab_size:
    vocab = config.data.synthetic_num_symbols + 4 + 12  # the symbol vocabulary's size
  counter = CompileCounter()
  results = dict(
    experiment=FLAGS.experiment, devices=[str(d) for d in jax.devices()], jax=jax.__version__
  )
  if "peak" in FLAGS.parts:
    results["peak"] = measure_peak()
  batch_tokens = FLAGS.batch_tokens or config.data.tokens_per_batch
  if "train" in FLAGS.parts and FLAGS.vs == "peers":
    results["train_vs"] = bench_train_vs(
      config, vocab, batch_tokens, FLAGS.seq_len, counter, results.get("peak")
    )
  elif "train" in FLAGS.parts:
    results["train"] = bench_train(config, vocab, batch_tokens, FLAGS.seq_len, FLAGS.steps, counter)
    if "peak" in results:
      results["train"]["mfu"] = results["train"]["achieved_flops"] / results["peak"]["peak_flops"]
  if "decode" in FLAGS.parts and FLAGS.vs == "ctranslate2":
    results["decode_vs"] = bench_decode_vs(config, vocab)
  elif "decode" in FLAGS.parts:
    results["decode"] = bench_decode(config, vocab, FLAGS.decode_sentences, FLAGS.beam_size)
  if "pipeline" in FLAGS.parts:
    results["pipeline"] = bench_pipeline(config, FLAGS.pipeline_batches)
  print(_table(results))
  if FLAGS.json:
    with open(FLAGS.json, "w", encoding="utf-8") as f:
      json.dump(results, f, indent=2)


def run() -> None:
  host.use_huge_pages()
  common.define_config_flag("t2t-bench")
  app.run(main)


if __name__ == "__main__":
  run()
