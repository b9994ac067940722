"""t2t-compare: is system B really better than system A? Paired significance tests on one test set.

    t2t-compare --reference=REF BASELINE SYSTEM [SYSTEM ...] [--paired=bs|ar] [--samples=N]
                [--lang=de]

Each file holds one translation per line of REF. For each metric (sacreBLEU, chrF, and the
paper-style tokenized BLEU when the target language is known) prints the baseline's and each
system's score with the bootstrap mean and 95% confidence interval, the difference from the
baseline and its p-value: sacreBLEU's own paired bootstrap resampling (default, 1000
resamples) or approximate randomization (--paired=ar, 10000 trials), seed 12345, the figures
`sacrebleu REF -i BASELINE SYSTEM ... --paired-bs` prints, with its signatures. The target
language comes from --lang, else from REF's extension when it is a two-letter code
(test2016.de); without one, tokenized BLEU is left out.
"""

import logging
import os
import re
from collections.abc import Sequence

from absl import flags

from t2t_jax.cli import common
from t2t_jax.evaluation import significance


def _define_flags() -> flags.FlagValues:
  flags.DEFINE_string("reference", None, "the reference translations, one per line")
  flags.DEFINE_enum(
    "paired",
    "bs",
    list(significance.METHODS),
    "bs: paired bootstrap resampling (scores with 95% confidence intervals and p-values); "
    "ar: approximate randomization (p-values)",
  )
  flags.DEFINE_integer(
    "samples", 0, "bootstrap resamples or randomization trials (0: sacreBLEU's 1000 or 10000)"
  )
  flags.DEFINE_string(
    "lang",
    None,
    "target language of the Moses tokenizer for tokenized BLEU (default: REF's extension "
    "when it is a two-letter code; 'none': leave tokenized BLEU out)",
  )
  return flags.FLAGS


def read_translations(path: str, label: str) -> list[str]:
  """The lines of `path` without their newlines; a missing or unreadable file is one line
  naming it by `label` (SystemExit)."""
  try:
    with open(path, encoding="utf-8") as f:
      return f.read().splitlines()
  except (OSError, UnicodeDecodeError) as e:
    reason = e.strerror if isinstance(e, OSError) else f"not UTF-8 text ({e.reason})"
    raise SystemExit(f"t2t-compare: {label}: cannot read ({reason})") from None


def target_language(reference: str, lang: str | None) -> str | None:
  """--lang, else REF's two-letter extension; None for 'none' or no such extension."""
  if lang is not None:
    return None if lang.lower() == "none" else lang
  extension = os.path.splitext(reference)[1].lstrip(".")
  return extension.lower() if re.fullmatch(r"[A-Za-z]{2}", extension) else None


def main(argv: Sequence[str]) -> None:
  common.quiet_library_logs()
  logging.getLogger("sacrebleu").setLevel(logging.WARNING)  # its progress lines
  args = _define_flags.flags
  files = list(argv[1:])
  if not args.reference:
    common.refuse("t2t-compare", "--reference is required (the reference translations)")
  if len(files) < 2:
    common.refuse(
      "t2t-compare",
      "give a baseline and at least one system: t2t-compare --reference=REF "
      "BASELINE SYSTEM [SYSTEM ...]",
    )
  if args.samples < 0:
    common.refuse("t2t-compare", f"--samples={args.samples} must be >= 0")
  references = read_translations(args.reference, f"--reference={args.reference}")
  named = [(path, read_translations(path, f"system file {path}")) for path in files]
  try:
    comparisons = significance.compare(
      named[0],
      named[1:],
      references,
      target_language(args.reference, args.lang),
      args.paired,
      args.samples,
    )
  except ValueError as e:
    raise SystemExit(f"t2t-compare: {e}") from None
  print(significance.format_comparisons(comparisons, args.paired))


def run() -> None:
  _define_flags.flags = _define_flags()
  common.run(main, __doc__)


if __name__ == "__main__":
  run()
