"""t2t-bench: speed of an experiment against the device's measured matmul peak.

    t2t-bench --experiment=tiny --parts=peak,train,decode --batch_tokens=4096 --seq_len=32

Prints a table and, with --json, writes every figure:
  peak      the measured FLOP/s of a large matrix product (float32 on CPU, bf16 on GPU/TPU);
  train     train-step time (median of --steps after compile), target tokens/s, model FLOPs
            per target token (t2t_jax.bench.train), achieved FLOP/s, MFU against the peak,
            compile time, compilations after warm-up (should be 0), peak memory;
  decode    beam search (the experiment's search; --beam_size) and greedy: sentences/s and
            generated tokens/s on real sentences (multi30k or newstest2014 from
            ../shared/data when present, else synthetic), with a trained --workdir or random
            parameters;
  pipeline  the input pipeline's pairs/s and tokens/s;
  serve     t2t-serve under load (--workdir): requests/s and p50/p95/p99 latency for
            --serve_clients concurrent clients, batched and unbatched, over --serve_pairs
            pair names, requests/s at 16 clients against 1, the batching gain at 16
            clients, the server's memory after its first 100 requests and after
            --serve_memory_requests, against the model called directly (t2t_jax.bench.serve;
            JSON `serve`).

With --vs=peers, train times the same model and batch in t2t_jax, torch.nn.Transformer, a
plain flax.linen Transformer and Hugging Face's MarianMTModel, interleaved
(t2t_jax.bench.peers; JSON `train_vs`); --vs=ctranslate2 does the same for decode
(t2t_jax.bench.ctranslate2: random parameters, outputs forced to --seq_len; JSON
`decode_vs`). With a trained --workdir, --vs=ctranslate2 translates a text file instead,
as t2t-translate and CTranslate2's translate_batch do, beam and greedy, and prints speed,
sacreBLEU, identical lines and the search statistics (t2t_jax.bench.real_text; JSON
`decode_text`):

    t2t-bench --parts=decode --vs=ctranslate2 --workdir=W --decode_input=test2016.en \\
        --decode_reference=test2016.de [--decode_sentences=0] [--repeats=3] [--cold]
"""

import json
from collections.abc import Sequence

import jax
import ml_collections
from absl import flags

from t2t_jax.bench import decode, peers, pipeline, report, timing, train
from t2t_jax.cli import common, host
from t2t_jax.data import sources as data_sources
from t2t_jax.decoding import SearchConfig, precision

flags.DEFINE_string("experiment", "tiny", "experiment (as for t2t-train), optionally NAME:ARG")
PARTS = ("peak", "train", "decode", "pipeline")  # the default: all of them
KNOWN_PARTS = (*PARTS, "serve")  # serve starts servers: only when asked
flags.DEFINE_list("parts", list(PARTS), "what to measure")
flags.DEFINE_integer("batch_tokens", 0, "target tokens per training step (0: the config's)")
flags.DEFINE_integer("seq_len", 32, "source and target length of the synthetic batch")
flags.DEFINE_integer("vocab_size", 0, "vocabulary size (0: the config's data.vocab_size)")
flags.DEFINE_integer("steps", 10, "timed training steps after warm-up")
flags.DEFINE_string("workdir", None, "trained workdir for decoding (else random parameters)")
flags.DEFINE_integer(
  "decode_sentences",
  None,
  "sentences to decode (default 128; with --vs=ctranslate2 --workdir every line; 0: all)",
)
flags.DEFINE_enum(
  "decode_corpus",
  "",
  ["", "multi30k", "newstest2014"],
  "source sentences for the decode figure, from ../shared/data "
  "($T2T_SHARED_DATA); empty: multi30k test2016, else newstest2014, else "
  "synthetic",
)
flags.DEFINE_integer(
  "beam_size", None, "beam width for the decoding figure (default: the config's beam_size)"
)
flags.DEFINE_enum(
  "beam_stop",
  None,
  ["exact", "heuristic"],
  "real-text decoding (--workdir with --vs=ctranslate2): t2t_jax's stopping rule "
  "(default: the workdir's config.beam_stop)",
)
flags.DEFINE_list(
  "decode_dtypes",
  ["float32"],
  "real-text decoding (--workdir with --vs=ctranslate2): t2t_jax in each of these dtypes "
  "(float32, bfloat16, auto: t2t-translate --dtype), the first the baseline of identical lines",
)
flags.DEFINE_boolean(
  "sampling",
  False,
  "decoding figure: also time sampling (beam 1, the config's sampling_temperature, "
  "sampling_topk, sampling_topp and num_samples)",
)
flags.DEFINE_enum(
  "vs",
  "",
  ["", "ctranslate2", "peers"],
  "ctranslate2: decode the same parameters and sources in CTranslate2 too, interleaved "
  "(random parameters: sources of --seq_len tokens, outputs forced to that length); peers: "
  "train the same model on the same batch in torch, plain flax and Marian too, interleaved",
)
flags.DEFINE_integer("repeats", 3, "interleaved repetitions per system for --vs")
flags.DEFINE_string(
  "decode_input",
  None,
  "--vs=ctranslate2 --workdir: the text to translate, one sentence a line (default: the "
  "--decode_corpus test set)",
)
flags.DEFINE_string(
  "decode_reference",
  None,
  "--vs=ctranslate2 --workdir: its reference translations, for sacreBLEU (default: the "
  "test set's own when the text is one)",
)
flags.DEFINE_integer(
  "decode_batch_tokens",
  4096,
  "--vs=ctranslate2 --workdir: source tokens per batch, every system (t2t-translate's "
  "--batch_tokens, CTranslate2's max_batch_size)",
)
flags.DEFINE_string(
  "checkpoint",
  "auto",
  "--vs=ctranslate2 --workdir: the parameters: " + common.CHECKPOINT_HELP,
)
flags.DEFINE_boolean(
  "cold",
  False,
  "--vs=ctranslate2 --workdir: also time fresh processes end to end: t2t-translate of the "
  "text with an empty and then a filled compilation cache, and CTranslate2 load + translate",
)
flags.DEFINE_integer("pipeline_batches", 200, "batches drawn from the input pipeline")
flags.DEFINE_list("serve_clients", ["1", "4", "16", "64"], "--parts=serve: concurrent clients")
flags.DEFINE_integer("serve_requests", 256, "--parts=serve: one-sentence requests per row")
flags.DEFINE_integer(
  "serve_pairs",
  1,
  "--parts=serve: the servers serve the workdir under this many pair names, 1 (its own) or 2 "
  "(also the reverse: two models, two batching threads), the requests alternating",
)
flags.DEFINE_integer(
  "serve_memory_requests",
  10000,
  "--parts=serve: the batched server's resident memory after this many requests in all (the "
  "rest from 16 clients) against after its first 100",
)
flags.DEFINE_boolean(
  "serve_fresh",
  False,
  "--parts=serve: instead, each client count against a new t2t-serve process with an empty "
  "compilation cache, from /ready on: the time to /ready and the compilations after it",
)
flags.DEFINE_string("json", None, "write the results here as JSON")
flags.DEFINE_string(
  "profile",
  None,
  "train: write a jax.profiler trace of the timed steps under this directory "
  "(plugins/profile/<time>/: TensorBoard's profiler, or perfetto_trace.json.gz at "
  "ui.perfetto.dev); the traced step times include the tracer's cost",
)
FLAGS = flags.FLAGS


def _vocab_size(config: ml_collections.ConfigDict) -> int:
  """--vocab_size, else the config's; a synthetic task's symbol vocabulary is smaller."""
  if FLAGS.vocab_size:
    return FLAGS.vocab_size
  if data_sources.get_source(config.data).vocab_size_from_task:
    return config.data.synthetic_num_symbols + 4 + 12
  return config.data.vocab_size


def _train_part(
  config: ml_collections.ConfigDict, vocab: int, results: dict, counter: timing.CompileCounter
) -> None:
  """The train figure, or with --vs=peers the comparison, into `results`."""
  batch_tokens = FLAGS.batch_tokens or config.data.tokens_per_batch
  if FLAGS.vs == "peers":
    results["train_vs"] = peers.compare_experiment(
      config,
      vocab,
      batch_tokens,
      FLAGS.seq_len,
      steps=FLAGS.steps,
      repeats=FLAGS.repeats,
      counter=counter,
      peak=results.get("peak"),
    )
    return
  result = train.measure_train(
    config, vocab, batch_tokens, FLAGS.seq_len, FLAGS.steps, counter, FLAGS.profile
  )
  if "peak" in results:
    result["mfu"] = result["achieved_flops"] / results["peak"]["peak_flops"]
  results["train"] = result


REAL_TEXT_FLAGS = (
  "decode_input",
  "decode_reference",
  "decode_batch_tokens",
  "checkpoint",
  "cold",
  "decode_dtypes",
)
SERVE_FLAGS = ("decode_input", "checkpoint")  # also --parts=serve's


def _real_text() -> bool:
  """Whether this run is the real-text comparison; its flags given elsewhere are refused."""
  real = "decode" in FLAGS.parts and FLAGS.vs == "ctranslate2" and bool(FLAGS.workdir)
  for name in REAL_TEXT_FLAGS:
    if name in SERVE_FLAGS and "serve" in FLAGS.parts:
      continue
    if FLAGS[name].present and not real:
      raise _usage(
        f"--{name} is for the real-text comparison: add --parts=decode --vs=ctranslate2 --workdir=W"
      )
  if real:
    if FLAGS.decode_batch_tokens < 1:
      raise _usage(f"--decode_batch_tokens={FLAGS.decode_batch_tokens} must be >= 1")
    if FLAGS.repeats < 1:
      raise _usage(f"--repeats={FLAGS.repeats} must be >= 1")
    common.check_checkpoint_flag("t2t-bench", FLAGS.checkpoint)
    if not FLAGS.decode_dtypes or set(FLAGS.decode_dtypes) - set(precision.DTYPES):
      raise _usage(
        f"--decode_dtypes={','.join(FLAGS.decode_dtypes)}: each is one of "
        f"{', '.join(precision.DTYPES)}"
      )
  if FLAGS.decode_sentences is not None and FLAGS.decode_sentences < (0 if real else 1):
    raise _usage(f"--decode_sentences={FLAGS.decode_sentences} must be >= {0 if real else 1}")
  return real


def _usage(problem: str) -> common.UsageExit:
  return common.UsageExit(f"t2t-bench: {problem}")


def _check_flags(argv: Sequence[str]) -> None:
  """UsageExit for arguments that are not flags and for unknown --parts, before any work."""
  if len(argv) > 1:
    raise _usage(
      f"unexpected arguments {argv[1:]}: flags are written --name=value (t2t-bench --help)"
    )
  unknown = [part for part in FLAGS.parts if part not in KNOWN_PARTS]
  if unknown or not FLAGS.parts:
    raise _usage(f"--parts={','.join(FLAGS.parts)}: each part is one of {', '.join(KNOWN_PARTS)}")
  for name in ("steps", "seq_len", "pipeline_batches"):
    if FLAGS[name].value < 1:
      raise _usage(f"--{name}={FLAGS[name].value} must be >= 1")


def _real_text_part(results: dict, counter: timing.CompileCounter) -> None:
  """t2t_jax against CTranslate2 on a text file through --workdir (bench.real_text)."""
  from t2t_jax import data
  from t2t_jax.bench import real_text
  from t2t_jax.decoding.translator import TranslateError, load_config
  from t2t_jax.run.checkpoint import CheckpointSpecError

  try:
    target_lang = data.target_language(load_config(FLAGS.workdir).data)
    text = real_text.read_text(
      FLAGS.decode_input,
      FLAGS.decode_reference,
      FLAGS.decode_sentences or 0,
      FLAGS.decode_corpus,
      target_lang,
    )
    results["decode_text"] = real_text.compare(
      FLAGS.workdir,
      text,
      beam_size=FLAGS.beam_size,
      repeats=FLAGS.repeats,
      batch_tokens=FLAGS.decode_batch_tokens,
      checkpoint=FLAGS.checkpoint,
      cold=FLAGS.cold,
      counter=counter,
      beam_stop=FLAGS.beam_stop,
      dtypes=FLAGS.decode_dtypes,
    )
  except (real_text.TextError, TranslateError, CheckpointSpecError) as e:
    raise SystemExit(f"t2t-bench: {e}") from None


def _decode_part(config: ml_collections.ConfigDict, vocab: int, results: dict) -> None:
  """The decode figure, or with --vs=ctranslate2 the comparison, into `results`."""
  search = SearchConfig.from_config(config).override(beam_size=FLAGS.beam_size)
  where = dict(workdir=FLAGS.workdir, corpus=FLAGS.decode_corpus)
  sentences = FLAGS.decode_sentences or 128
  if FLAGS.vs == "ctranslate2":
    results["decode_vs"] = decode.measure_decode_vs(
      config,
      vocab,
      search,
      sentences=sentences,
      seq_len=FLAGS.seq_len,
      repeats=FLAGS.repeats,
    )
    return
  results["decode"] = decode.measure_decode(
    config, vocab, sentences, search, sampling=FLAGS.sampling, **where
  )


def _serve_part(results: dict) -> None:
  """t2t-serve under load (bench.serve); the compilation cache is this command's choice."""
  from t2t_jax import compilation
  from t2t_jax.bench import serve

  if not FLAGS.workdir:
    common.refuse("t2t-bench", "--parts=serve needs --workdir (a trained workdir)")
  try:
    clients = [int(c) for c in FLAGS.serve_clients]
  except ValueError:
    common.refuse("t2t-bench", f"--serve_clients={FLAGS.serve_clients}: integers")
  if any(c < 1 for c in clients) or FLAGS.serve_requests < 1:
    common.refuse("t2t-bench", "--serve_clients and --serve_requests must be >= 1")
  if FLAGS.serve_pairs not in serve.PAIRS:
    common.refuse("t2t-bench", f"--serve_pairs={FLAGS.serve_pairs}: 1 or 2")
  if FLAGS.serve_memory_requests < 0:
    common.refuse("t2t-bench", f"--serve_memory_requests={FLAGS.serve_memory_requests} is < 0")
  if FLAGS.serve_fresh:  # each server its own empty cache: this process compiles nothing
    from t2t_jax.bench import serve_fresh

    results["serve_fresh"] = serve_fresh.measure_fresh(
      FLAGS.workdir, clients, FLAGS.serve_requests, FLAGS.checkpoint, FLAGS.decode_input
    )
    print(serve_fresh.table(results["serve_fresh"]))
    return
  compilation.enable("default")
  results["serve"] = serve.measure_serve(
    FLAGS.workdir,
    clients,
    FLAGS.serve_requests,
    checkpoint=FLAGS.checkpoint,
    beam_size=FLAGS.beam_size,
    input_path=FLAGS.decode_input,
    pairs=FLAGS.serve_pairs,
    memory_requests=FLAGS.serve_memory_requests,
  )
  print(serve.table(results["serve"]))


def main(argv: Sequence[str]) -> None:
  _check_flags(argv)
  common.quiet_library_logs()
  config = FLAGS.config
  real_text = _real_text()
  if {"train", "pipeline"} & set(FLAGS.parts) or ("decode" in FLAGS.parts and not real_text):
    common.check_config("t2t-bench", config, FLAGS.experiment)  # the parts that read it
  vocab = _vocab_size(config)
  counter = timing.CompileCounter()
  results = dict(
    experiment=FLAGS.experiment, devices=[str(d) for d in jax.devices()], jax=jax.__version__
  )
  if "peak" in FLAGS.parts:
    results["peak"] = timing.measure_peak()
  if "train" in FLAGS.parts:
    _train_part(config, vocab, results, counter)
  if real_text:
    _real_text_part(results, counter)
  elif "decode" in FLAGS.parts:
    _decode_part(config, vocab, results)
  if "pipeline" in FLAGS.parts:
    results["pipeline"] = pipeline.measure_pipeline(config, FLAGS.pipeline_batches)
  if "serve" in FLAGS.parts:
    _serve_part(results)
  print(report.table(results))
  if FLAGS.json:
    with open(FLAGS.json, "w", encoding="utf-8") as f:
      json.dump(results, f, indent=2)


def run() -> None:
  host.use_huge_pages()
  common.define_config_flag("t2t-bench")
  common.run(main, __doc__)


if __name__ == "__main__":
  run()
