"""t2t-translate against its CTranslate2 exports: speed and BLEU on one test set, same CPU.

    python tools/export_benchmark.py --workdir=DIR --ct2=float32:OUT_F32 --ct2=int8:OUT_I8 \
        --input=test2016.en --reference=test2016.de [--beam_size=4] [--alpha=0.6] \
        [--threads=2] [--rounds=3] [--max_sentences=N]

Each round translates the whole input once with every system, one after the other (A B C A B
C ...); the table gives each system's median time over the rounds (sentences/s, output
subword tokens/s), sacreBLEU of its output, and how many outputs equal t2t-translate's. The
t2t_jax search is compiled in a warm-up pass first (compilation is a one-off cost, reported
separately). CTranslate2 runs with intra_threads=--threads and length_penalty=--alpha, which
it applies as length^alpha (t2t_jax: GNMT ((5 + length) / 6)^alpha); see docs/export.md.
"""

import statistics
import sys
import time

from absl import app, flags

from t2t_jax.cli.translate import read_lines
from t2t_jax.decoding import PAPER_SEARCH
from t2t_jax.decoding.translator import Translator
from t2t_jax.evaluation import scoring

flags.DEFINE_string("workdir", None, "the t2t-train workdir that was exported")
flags.DEFINE_multi_string("ct2", [], "COMPUTE_TYPE:DIR of a CTranslate2 export (repeatable)")
flags.DEFINE_string("input", None, "source sentences, one per line")
flags.DEFINE_string("reference", None, "reference translations")
flags.DEFINE_string("checkpoint", "auto", "t2t-translate's --checkpoint")
flags.DEFINE_integer("beam_size", PAPER_SEARCH.beam_size, "beam width, all systems")
flags.DEFINE_float("alpha", PAPER_SEARCH.alpha, "length penalty exponent, all systems")
flags.DEFINE_integer("threads", 2, "CTranslate2 intra_threads (XLA uses every core)")
flags.DEFINE_integer("rounds", 3, "timed passes per system, interleaved")
flags.DEFINE_integer("max_batch_tokens", 4096, "source tokens per batch, all systems")
flags.DEFINE_integer("max_sentences", 0, "only the first N input lines (0: all)")
FLAGS = flags.FLAGS


def _t2t_system(sources):
  t2t = Translator.from_workdir(
    FLAGS.workdir, FLAGS.checkpoint, batch_tokens=FLAGS.max_batch_tokens
  )
  start = time.perf_counter()
  t2t.translate(sources, beam_size=FLAGS.beam_size, alpha=FLAGS.alpha)
  compile_s = time.perf_counter() - start
  run = lambda: t2t.translate(sources, beam_size=FLAGS.beam_size, alpha=FLAGS.alpha)
  return run, compile_s, t2t


def _ct2_system(spec, sources, sp, max_len):
  import ctranslate2

  compute_type, path = spec.split(":", 1)
  translator = ctranslate2.Translator(
    path, device="cpu", compute_type=compute_type, inter_threads=1, intra_threads=FLAGS.threads
  )
  pieces = [sp.encode(s, out_type=str) for s in sources]
  longest = min(max(map(len, pieces)) + 1 + 50, max_len)

  def run():
    results = translator.translate_batch(
      pieces,
      beam_size=FLAGS.beam_size,
      length_penalty=FLAGS.alpha,
      max_batch_size=FLAGS.max_batch_tokens,
      batch_type="tokens",
      max_decoding_length=longest - 1,
    )
    return [sp.decode_pieces(r.hypotheses[0]) for r in results]

  run()  # warm-up: allocations, int8 packing
  return run


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  sources = read_lines(FLAGS.input)[: FLAGS.max_sentences or None]
  references = read_lines(FLAGS.reference)[: len(sources)]
  t2t_run, compile_s, t2t = _t2t_system(sources)
  sp = t2t.tokenizer._sp
  systems = {"t2t-translate (JAX)": t2t_run}
  for spec in FLAGS.ct2:
    systems[f"CTranslate2 {spec.split(':')[0]}"] = _ct2_system(
      spec, sources, sp, t2t.model.config.max_len
    )
  times = {name: [] for name in systems}
  outputs = {}
  for _ in range(FLAGS.rounds):
    for name, run in systems.items():
      start = time.perf_counter()
      outputs[name] = run()
      times[name].append(time.perf_counter() - start)
  baseline = outputs["t2t-translate (JAX)"]
  print(
    f"{len(sources)} sentences, beam {FLAGS.beam_size}, alpha {FLAGS.alpha}, "
    f"{FLAGS.rounds} interleaved rounds (median); t2t_jax compile+first pass "
    f"{compile_s:.1f} s",
    file=sys.stderr,
  )
  print("| system | sentences/s | tokens/s | sacreBLEU | same output as t2t-translate |")
  print("|---|---:|---:|---:|---:|")
  for name, hyps in outputs.items():
    seconds = statistics.median(times[name])
    tokens = sum(len(sp.encode(h)) + 1 for h in hyps)  # output subwords, EOS included
    bleu = scoring.sacrebleu_score(hyps, references)
    same = sum(a == b for a, b in zip(hyps, baseline))
    print(
      f"| {name} | {len(sources) / seconds:.1f} | {tokens / seconds:.0f} | "
      f"{bleu.score:.2f} | {same}/{len(sources)} |"
    )
  print(
    f"sacreBLEU signature: {scoring.sacrebleu_score(baseline, references).signature}",
    file=sys.stderr,
  )


if __name__ == "__main__":
  app.run(main)
