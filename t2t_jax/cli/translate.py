"""t2t-translate: translate a file (or stdin) with a trained workdir, and score it.

    t2t-translate --workdir=DIR [--input=FILE] [--output=FILE] [--reference=FILE]
                  [--beam_size=4] [--alpha=0.6] [--checkpoint=auto|latest|average:N|STEP|selected]

Reads stdin and writes stdout by default: one output line per input line, in input order.
With --reference it prints sacreBLEU (with its signature), the paper-style tokenized BLEU,
lowercased BLEU and chrF to stderr.
"""

import sys

from absl import app, flags

from t2t_jax.cli import common, host
from t2t_jax.decoding.translator import TranslateError, Translator
from t2t_jax.evaluation import evaluate
from t2t_jax.training.checkpoint import CheckpointSpecError
from t2t_jax.training.workdir import atomic_write_text


def read_lines(path: str | None) -> list[str]:
  """Lines of a UTF-8 file (or stdin), without line ends; bad bytes name the line."""
  try:
    if path in (None, "", "-"):
      raw = sys.stdin.buffer.read()
    else:
      with open(path, "rb") as f:
        raw = f.read()
  except OSError as e:
    raise TranslateError(f"{path}: cannot read ({e.strerror})") from e
  name = path or "<stdin>"
  lines = raw.split(b"\n")
  if lines and lines[-1] == b"":
    lines.pop()
  out = []
  for number, line in enumerate(lines, start=1):
    try:
      out.append(line.rstrip(b"\r").decode("utf-8"))
    except UnicodeDecodeError as e:
      raise TranslateError(f"{name}:{number}: not UTF-8 ({e.reason} at byte {e.start})") from e
  return out


def _define_flags():
  flags.DEFINE_string("workdir", None, "a t2t-train workdir (config.json, vocabulary, checkpoints)")
  flags.DEFINE_string("input", None, "source sentences, one per line (default: stdin)")
  flags.DEFINE_string("output", None, "where translations go (default: stdout)")
  flags.DEFINE_string("reference", None, "reference translations: prints BLEU and chrF")
  flags.DEFINE_integer("beam_size", 4, "beam width; 1 = greedy decoding")
  flags.DEFINE_float("alpha", 0.6, "length penalty exponent")
  flags.DEFINE_string(
    "checkpoint",
    "auto",
    "'latest', 'average:N' (last N), a step, "
    "'selected' (the choice t2t-train made on dev), or 'auto': 'selected' "
    "when the workdir has one, else 'latest'",
  )
  flags.DEFINE_integer("batch_tokens", 4096, "source tokens per decoding batch")
  return flags.FLAGS


def main(argv):
  common.quiet_library_logs()
  args = _define_flags.flags
  if len(argv) > 1:
    raise SystemExit(f"t2t-translate: unexpected arguments {argv[1:]}")
  if not args.workdir:
    raise SystemExit("t2t-translate: --workdir is required")
  if args.beam_size < 1:
    raise SystemExit(f"t2t-translate: --beam_size={args.beam_size} must be >= 1 (1: greedy)")
  try:
    sources = read_lines(args.input)
    references = read_lines(args.reference) if args.reference else None
    if references is not None and len(references) != len(sources):
      raise TranslateError(
        f"--reference={args.reference} has {len(references)} lines but "
        f"--input={args.input or '<stdin>'} has {len(sources)}"
      )
    translator = Translator.from_workdir(
      args.workdir, args.checkpoint, batch_tokens=args.batch_tokens
    )
  except (TranslateError, CheckpointSpecError) as e:
    raise SystemExit(f"t2t-translate: {e}") from None
  hyps = translator.translate(sources, beam_size=args.beam_size, alpha=args.alpha)
  text = "".join(h + "\n" for h in hyps)
  if args.output:  # a reader never sees half a file
    atomic_write_text(args.output, text)
  else:
    sys.stdout.write(text)
  if references is not None:
    print(
      f"checkpoint(s) {translator.checkpoint_steps}, beam {args.beam_size}, alpha {args.alpha}",
      file=sys.stderr,
    )
    _, report = evaluate.score_report(hyps, references, translator.target_lang)
    print(report, file=sys.stderr)


def run():
  host.use_huge_pages()
  _define_flags.flags = _define_flags()
  app.run(main)


if __name__ == "__main__":
  run()
