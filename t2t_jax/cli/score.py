"""t2t-score: the log-probability a trained workdir's model gives each given translation.

    t2t-score --workdir=DIR[,DIR...] --source=FILE --target=FILE [--output=FILE] [--per_token]
              [--checkpoint=auto|latest|average:N|best[:N]|ema|STEP|selected] [--alpha=A]

Line i of --target is scored as the translation of line i of --source, teacher-forced (no
search). One TSV line per pair, in input order: log p(target | source) summed over the
target's tokens (EOS included), its mean per token, and the sum divided by the GNMT length
penalty ((5 + tokens) / 6)^alpha with the workdir's alpha (or --alpha), the score beam search
ranks by and t2t-translate --scores prints. --per_token adds a fourth column: each token's
log-probability, space-separated. Pairs are batched by length; the two files must have the
same number of lines.

--workdir=A,B scores with the ensemble of the workdirs' models, as t2t-translate decodes with
it: each token's log-probability under the normalised mean of the members' log-probabilities.
"""

import sys
from collections.abc import Sequence

from absl import flags

from t2t_jax.cli import common, host
from t2t_jax.cli.translate import check_output, workdirs
from t2t_jax.decoding.lines import read_lines
from t2t_jax.decoding.scoring import PairScore, Scorer
from t2t_jax.decoding.translator import TranslateError, Translator
from t2t_jax.run.checkpoint import CheckpointSpecError
from t2t_jax.run.files import atomic_write_text


def _define_flags() -> flags.FlagValues:
  flags.DEFINE_string(
    "workdir",
    None,
    "a t2t-train workdir (config.json, vocabulary, checkpoints); several, comma-separated: "
    "their ensemble",
  )
  flags.DEFINE_string("source", None, "source sentences, one per line")
  flags.DEFINE_string("target", None, "their translations to score, one per line")
  flags.DEFINE_string("output", None, "where the scores go (default: stdout)")
  flags.DEFINE_boolean(
    "per_token", False, "add a column of each target token's log-probability (EOS last)"
  )
  flags.DEFINE_string(
    "checkpoint",
    "auto",
    common.CHECKPOINT_HELP,
  )
  flags.DEFINE_float(
    "alpha", None, "length penalty exponent of the third column (default: the workdir's alpha)"
  )
  flags.DEFINE_integer("batch_tokens", 4096, "tokens per side of a scoring batch")
  return flags.FLAGS


def format_score(score: PairScore, per_token: bool) -> str:
  """'log_prob<TAB>mean<TAB>normalised[<TAB>token log-probs]' and a newline."""
  line = f"{score.log_prob:.6f}\t{score.mean:.6f}\t{score.normalised:.6f}"
  if per_token:
    line += "\t" + " ".join(f"{x:.6f}" for x in score.tokens)
  return line + "\n"


REQUIRED = {
  "workdir": "a t2t-train workdir, e.g. --workdir=workdirs/NAME",
  "source": "the source sentences, one per line",
  "target": "their translations to score, one per line",
}


def _check_flags(args: flags.FlagValues, argv: Sequence[str]) -> None:
  """UsageExit (one line, exit status 2) for a wrong command line, before any file is read."""

  def usage(problem: str) -> common.UsageExit:
    return common.UsageExit(f"t2t-score: {problem}")

  if len(argv) > 1:
    raise usage(
      f"unexpected arguments {argv[1:]}: flags are written --name=value (t2t-score --help)"
    )
  for name, what in REQUIRED.items():
    if not args[name].value:
      raise usage(f"--{name} is required: {what}")
  common.check_checkpoint_flag("t2t-score", args.checkpoint)
  if args.batch_tokens < 1:
    raise usage(f"--batch_tokens={args.batch_tokens} must be >= 1")


def main(argv: Sequence[str]) -> None:
  common.quiet_library_logs()
  args = _define_flags.flags
  _check_flags(args, argv)
  from t2t_jax import compilation

  compilation.enable()  # a command's choice for its process (library code leaves it alone)
  try:
    sources, targets = read_lines(args.source), read_lines(args.target)
    if len(sources) != len(targets):
      raise TranslateError(
        f"--source={args.source} has {len(sources)} lines but --target={args.target} has "
        f"{len(targets)}"
      )
    check_output(args.output)
    translator = Translator.from_workdirs(
      workdirs(args.workdir), args.checkpoint, batch_tokens=args.batch_tokens
    )
    scorer = Scorer(translator, alpha=args.alpha)
    scores = scorer.score(sources, targets, f"--source={args.source}", f"--target={args.target}")
  except (TranslateError, CheckpointSpecError) as e:
    raise SystemExit(f"t2t-score: {e}") from None
  text = "".join(format_score(s, args.per_token) for s in scores)
  if args.output:  # a reader never sees half a file
    try:
      atomic_write_text(args.output, text)
    except OSError as e:
      raise SystemExit(f"t2t-score: --output={args.output}: cannot write ({e.strerror})") from None
  else:
    sys.stdout.write(text)
    sys.stdout.flush()


def run() -> None:
  host.use_huge_pages()
  _define_flags.flags = _define_flags()
  common.run(main, __doc__)


if __name__ == "__main__":
  run()
