"""t2t-translate: translate a file (or stdin) with a trained workdir, and score it.

    t2t-translate --workdir=DIR[,DIR...] [--input=FILE] [--output=FILE] [--reference=FILE]
                  [--prefix=FILE]
                  [--beam_size=N] [--alpha=A]
                  [--checkpoint=auto|latest|average:N|best[:N]|ema|STEP|selected]
                  [--interactive] [--nbest=N | --scores]
                  [--sampling [--num_samples=N] [--sampling_temperature=T]
                   [--sampling_topk=K] [--sampling_topp=P] [--sampling_seed=S]]

Reads stdin and writes stdout by default: one output line per input line, in input order.
With --reference it prints sacreBLEU (with its signature), the paper-style tokenized BLEU,
lowercased BLEU and chrF to stderr; for a parsing workdir (a treebank experiment) the
reference is a file of bracketed gold trees and it prints EVALB bracket F1. The beam and
alpha default to the workdir's experiment (decoding.SearchConfig: the paper's settings;
parsing: beam 21, alpha 0.3).

--interactive (the default when stdin is a terminal) translates each line as it arrives and
flushes its translation at once, for a terminal or a pipe that stays open; the search is
compiled once, up front, for a few padded source lengths; the prompt and the ready message go
to stderr. --nbest=N prints the N best hypotheses per input as TSV (input index from 0, rank
from 1, score, log-probability, text); --scores prints the 1-best as score, log-probability,
text. The score is log p / ((5 + length) / 6)^alpha, the number beam search ranks by.

--sampling draws each output token from the model's distribution (divided by
--sampling_temperature, cut to the --sampling_topk most probable tokens and to the
--sampling_topp nucleus) instead of searching; it decodes with beam 1, and --num_samples
outputs are drawn per input (the best-scoring one is printed, or --nbest=N of them). The
samples of the input at line i depend only on --sampling_seed and i, not on the other lines.

--workdir=A,B decodes with the ensemble of the workdirs' models (the same --checkpoint choice
in each): at every step of beam search, greedy decoding and sampling the next-token
distribution is the normalised mean of the members' log-probabilities. The members must
share one vocabulary (the same sha256), vocabulary size and max_len; the search settings
come from the first workdir.

--prefix=FILE gives, line by line, the text each translation starts with (an empty line: no
constraint): the search takes the prefix's target tokens first and continues after them;
scores count the prefix tokens. FILE must have as many lines as the input.
"""

import os
import sys
from collections.abc import Sequence
from typing import NamedTuple, TextIO

from absl import flags

from t2t_jax.cli import common, host
from t2t_jax.data.trees import Tree
from t2t_jax.decoding import SearchConfig, precision
from t2t_jax.decoding.config import STOP_RULES
from t2t_jax.decoding.lines import read_lines, stream_lines
from t2t_jax.decoding.translator import Hypothesis, TranslateError, Translator, load_config
from t2t_jax.evaluation import evaluate
from t2t_jax.run.checkpoint_spec import CheckpointSpecError
from t2t_jax.run.files import atomic_write_text


def format_result(index: int, result: str | list[Hypothesis], nbest: int, scores: bool) -> str:
  """The output lines of one input: its translation; with `scores`,
  'score<TAB>log_prob<TAB>text'; with `nbest`, one 'index<TAB>rank<TAB>score<TAB>log_prob<TAB>
  text' line per hypothesis."""
  if nbest:
    return "".join(
      f"{index}\t{rank}\t{h.score:.6f}\t{h.log_prob:.6f}\t{h.text}\n"
      for rank, h in enumerate(result, start=1)
    )
  if scores:
    best = result[0]
    return f"{best.score:.6f}\t{best.log_prob:.6f}\t{best.text}\n"
  return result + "\n"


def _define_flags() -> flags.FlagValues:
  flags.DEFINE_string(
    "workdir",
    None,
    "a t2t-train workdir (config.json, vocabulary, checkpoints); several, comma-separated: "
    "their ensemble",
  )
  flags.DEFINE_string("input", None, "source sentences, one per line (default: stdin)")
  flags.DEFINE_string(
    "prefix",
    None,
    "the text each translation starts with, one line per input line (empty: no constraint)",
  )
  flags.DEFINE_string("output", None, "where translations go (default: stdout)")
  flags.DEFINE_string("reference", None, "reference translations: prints BLEU and chrF")
  flags.DEFINE_integer(
    "beam_size", None, "beam width; 1 = greedy decoding (default: the workdir's config.beam_size)"
  )
  flags.DEFINE_float("alpha", None, "length penalty exponent (default: the workdir's config.alpha)")
  flags.DEFINE_enum(
    "beam_stop",
    None,
    list(STOP_RULES),
    "when beam search stops a sentence: 'exact' (no live hypothesis can still win) or "
    "'heuristic' (none would if it ended now: faster, may differ) (default: the workdir's "
    "config.beam_stop, else exact)",
  )
  flags.DEFINE_enum(
    "dtype",
    "auto",
    list(precision.DTYPES),
    "the products' dtype (accumulation and logits stay float32): 'auto' is bfloat16 on a CPU "
    "whose flags in /proc/cpuinfo list amx_bf16 or avx512_bf16, float32 on other CPUs, the "
    "model's own on an "
    f"accelerator; ${precision.ENV} overrides what auto picks",
  )
  flags.DEFINE_string(
    "checkpoint",
    "auto",
    common.CHECKPOINT_HELP,
  )
  flags.DEFINE_integer("batch_tokens", 4096, "source tokens per decoding batch")
  flags.DEFINE_boolean(
    "interactive",
    None,
    "translate each input line as it arrives and print its translation at once "
    "(default: when stdin is a terminal)",
  )
  flags.DEFINE_integer(
    "nbest",
    0,
    "print the N best hypotheses per input (N <= beam size) as TSV: input index, rank, "
    "score, log-probability, text (0: off)",
  )
  flags.DEFINE_boolean(
    "scores", False, "print 'score<TAB>log-probability<TAB>text' for each input's translation"
  )
  flags.DEFINE_boolean(
    "sampling",
    None,
    "draw each token from the model's distribution instead of beam search (beam 1) "
    "(default: the workdir's config.sampling, else off)",
  )
  flags.DEFINE_float(
    "sampling_temperature",
    None,
    "with --sampling: divide the log-probabilities by T > 0 (< 1: sharper; default 1)",
  )
  flags.DEFINE_integer(
    "sampling_topk", None, "with --sampling: draw from the K most probable tokens (0: all)"
  )
  flags.DEFINE_float(
    "sampling_topp",
    None,
    "with --sampling: draw from the nucleus, the most probable tokens holding probability "
    "P in (0, 1] (1: all)",
  )
  flags.DEFINE_boolean(
    "constrained",
    None,
    "decode under the task's output grammar (parsing: well-formed trees over the input's "
    "words); --noconstrained decodes the model as it is (default: the workdir's "
    "config.constrained; translation workdirs have none)",
  )
  flags.DEFINE_integer("num_samples", None, "with --sampling: outputs drawn per input (default 1)")
  flags.DEFINE_integer(
    "diverse_groups",
    None,
    "diverse beam search: the beam in G groups choosing in turn, each avoiding the tokens "
    "the groups before it chose at the step; G must divide --beam_size (default: the "
    "workdir's config.diverse_groups, 1: plain beam search)",
  )
  flags.DEFINE_float(
    "diversity_strength",
    None,
    "with --diverse_groups: what each earlier choice of a token costs a group (default: the "
    "workdir's config.diversity_strength, 0.5)",
  )
  flags.DEFINE_integer(
    "no_repeat_ngram",
    None,
    "no output holds the same N tokens twice, in every search mode (0: off; default: the "
    "workdir's config.no_repeat_ngram, 0)",
  )
  flags.DEFINE_float(
    "min_length_ratio",
    None,
    "no output ends before it holds R times its input's tokens (both counting the end "
    "token), within its length limit (0: off; default: the workdir's config.min_length_ratio)",
  )
  flags.DEFINE_integer(
    "sampling_seed",
    None,
    "with --sampling: the random seed (default: the workdir's config.sampling_seed, 0)",
  )
  flags.DEFINE_alias("seed", "sampling_seed")
  flags.DEFINE_string("compilation_cache", "default", common.COMPILATION_CACHE_HELP)
  return flags.FLAGS


# The flags that shape sampling, each a SearchConfig field of its name.
SAMPLING_FLAGS = (
  "sampling_temperature",
  "sampling_topk",
  "sampling_topp",
  "num_samples",
  "sampling_seed",
)
# Every flag that sets a SearchConfig field of its name (checked there: check_field).
SEARCH_FLAGS = (
  "beam_size",
  "alpha",
  "beam_stop",
  "sampling",
  "constrained",
  "no_repeat_ngram",
  "min_length_ratio",
  "diverse_groups",
  "diversity_strength",
  *SAMPLING_FLAGS,
)


def _usage(problem: str) -> common.UsageExit:
  """A wrong command line: one line, exit status 2 (common.UsageExit)."""
  return common.UsageExit(f"t2t-translate: {problem}")


def _check_sampling_flags(args: flags.FlagValues, sampling: bool) -> None:
  """UsageExit naming the flag for a sampling setting that cannot be used."""
  given = [name for name in SAMPLING_FLAGS if args[name].value is not None]
  if given and not sampling:
    raise _usage(f"--{given[0]} shapes sampling: add --sampling")
  if sampling and args.beam_size is not None and args.beam_size != 1:
    raise _usage(
      f"--sampling draws tokens instead of searching: --beam_size={args.beam_size} must be 1"
    )


def _check_flags(args: flags.FlagValues, interactive: bool) -> None:
  """UsageExit for a flag or combination that no workdir could make right: before the
  workdir is read."""
  if not args.workdir:
    raise _usage("--workdir is required: a t2t-train workdir, e.g. --workdir=workdirs/NAME")
  common.check_checkpoint_flag("t2t-translate", args.checkpoint)
  for name in SEARCH_FLAGS:
    if args[name].value is not None:
      try:
        SearchConfig.check_field(name, args[name].value)
      except ValueError as e:
        raise _usage(f"--{e}") from None
  if args.batch_tokens < 1:
    raise _usage(f"--batch_tokens={args.batch_tokens} must be >= 1")
  if args.nbest < 0:
    raise _usage(f"--nbest={args.nbest} must be >= 0 (0: off)")
  if args.reference and (args.nbest or args.scores):
    raise _usage("--reference scores plain translations: drop --nbest and --scores")
  if args.reference and interactive:
    raise _usage("--reference needs every line first: not with --interactive")
  if args.prefix and interactive:
    raise _usage("--prefix needs every line first: not with --interactive")


def _check_search_flags(args: flags.FlagValues, search: SearchConfig) -> None:
  """UsageExit for --nbest beyond what this workdir's search returns."""
  try:
    search.check_nbest(args.nbest or None)
  except ValueError as e:
    raise _usage(f"--{e} (0: off)") from None


def check_output(path: str | None) -> None:
  """Refuses an --output that cannot be written (no such directory, a directory in its
  place, no permission) before the model loads, so that no translating is thrown away."""
  if not path:
    return
  if os.path.isdir(path):
    raise TranslateError(f"--output={path}: cannot write (Is a directory)")
  if os.path.exists(path) and os.access(path, os.W_OK):
    return  # a writable file or device (/dev/null) whose directory may not take a probe
  probe = os.path.join(
    os.path.dirname(os.path.abspath(path)), f".{os.path.basename(path)}.probe-{os.getpid()}"
  )
  try:
    with open(probe, "w", encoding="utf-8"):
      pass
    os.remove(probe)
  except OSError as e:
    raise TranslateError(f"--output={path}: cannot write ({e.strerror})") from None


def _open_output(path: str | None) -> TextIO:
  if not path:
    return sys.stdout
  try:
    return open(path, "w", encoding="utf-8")
  except OSError as e:
    raise TranslateError(f"--output={path}: cannot write ({e.strerror})") from e


def main(argv: Sequence[str]) -> None:
  common.quiet_library_logs()
  args = _define_flags.flags
  if len(argv) > 1:
    raise _usage(
      f"unexpected arguments {argv[1:]}: flags are written --name=value (t2t-translate --help)"
    )
  from_stdin = args.input in (None, "", "-")
  interactive = args.interactive
  if interactive is None:
    interactive = from_stdin and sys.stdin.isatty()
  _check_flags(args, interactive)
  common.use_compilation_cache(args)
  try:
    search, parsing = _decoding_defaults(args)
    _check_search_flags(args, search)
    check_output(args.output)
    inputs = None if interactive else _read_inputs(args, parsing)
    translator = Translator.from_workdirs(
      workdirs(args.workdir),
      args.checkpoint,
      args.dtype,
      batch_tokens=args.batch_tokens,
      search=search,
    )
    nbest = args.nbest or (1 if args.scores else None)
    if interactive:
      _interactive(translator, args, nbest, from_stdin)
    else:
      _all_at_once(translator, args, nbest, parsing, inputs)
  except (TranslateError, CheckpointSpecError) as e:
    raise SystemExit(f"t2t-translate: {e}") from None


def workdirs(flag: str) -> list[str]:
  """--workdir's comma-separated workdirs (one: a single model; several: an ensemble)."""
  out = [w for w in flag.split(",") if w]
  if not out:
    raise TranslateError(f"--workdir={flag}: no workdir given")
  return out


def _decoding_defaults(args: flags.FlagValues) -> tuple[SearchConfig, str | None]:
  """The search of this run: the workdir's (its experiment's, SearchConfig.from_config) with
  the --beam_size, --alpha, --beam_stop and sampling flags given replacing its own (sampling
  decodes with beam 1); and, for a parsing workdir (scored by bracket F1), its targets' leaf
  form (trees.TREE_LEAVES), else None."""
  if not args.workdir:
    return SearchConfig(), None
  first = workdirs(args.workdir)[0]
  config = load_config(first)
  try:
    search = SearchConfig.from_config(config)
  except ValueError as e:
    raise TranslateError(f"{first}/config.json: {e}") from None
  sampling = search.sampling if args.sampling is None else args.sampling
  _check_sampling_flags(args, sampling)
  fields = {name: args[name].value for name in SEARCH_FLAGS}
  fields.update(sampling=sampling, beam_size=1 if sampling else args.beam_size)
  try:
    search = search.override(**fields)
  except ValueError as e:  # each flag's value is checked alone before: here across fields
    field = str(e).split("=", 1)[0]
    if (
      field in SEARCH_FLAGS and args[field].value is not None
    ):  # the flag's value does not fit with the workdir's
      raise TranslateError(f"--{e}") from None
    raise TranslateError(f"{first}/config.json: config.{e}") from None
  return search, evaluate.tree_leaves(config.data)


def _references(path: str, parsing: str | None) -> list[str] | list[Tree]:
  """Reference lines, or for parsing the (cleaned) gold trees of a bracketed file."""
  if not parsing:
    return read_lines(path)
  try:
    return evaluate.read_gold_trees(path)
  except OSError as e:
    raise TranslateError(f"{path}: cannot read ({e.strerror})") from e
  except (ValueError, UnicodeDecodeError) as e:
    raise TranslateError(str(e)) from e


class _Inputs(NamedTuple):
  sources: list[str]
  references: list[str] | list[Tree] | None
  prefixes: list[str] | None


def _read_inputs(args: flags.FlagValues, parsing: str | None) -> _Inputs:
  """The input, reference and prefix lines, their counts checked before the model loads."""
  sources = read_lines(args.input)
  input_name = f"--input={args.input or '<stdin>'}"
  references = _references(args.reference, parsing) if args.reference else None
  if references is not None and len(references) != len(sources):
    raise TranslateError(
      f"--reference={args.reference} has {len(references)} "
      f"{'trees' if parsing else 'lines'} but {input_name} has {len(sources)}"
    )
  prefixes = read_lines(args.prefix) if args.prefix else None
  if prefixes is not None and len(prefixes) != len(sources):
    raise TranslateError(
      f"--prefix={args.prefix} has {len(prefixes)} lines but {input_name} has {len(sources)}"
    )
  return _Inputs(sources, references, prefixes)


def _all_at_once(
  translator: Translator,
  args: flags.FlagValues,
  nbest: int | None,
  parsing: str | None = None,
  inputs: _Inputs | None = None,
) -> None:
  """Translates every line (`_read_inputs`) in length-sorted batches, writes in input order."""
  sources, references, prefixes = inputs or _read_inputs(args, parsing)
  results = translator.translate(
    sources,
    nbest=nbest,
    prefixes=prefixes,
    prefix_name=f"--prefix={args.prefix}",
  )
  text = "".join(format_result(i, r, args.nbest, args.scores) for i, r in enumerate(results))
  if args.output:  # a reader never sees half a file
    try:
      atomic_write_text(args.output, text)
    except OSError as e:
      raise TranslateError(f"--output={args.output}: cannot write ({e.strerror})") from None
  else:
    sys.stdout.write(text)
    sys.stdout.flush()
  if references is not None:
    print(
      f"checkpoint(s) {_steps(translator)}, beam {translator.search.beam_size}, "
      f"alpha {translator.search.alpha}",
      file=sys.stderr,
    )
    if parsing:
      try:
        _, report = evaluate.parse_report(results, sources, references, parsing)
      except ValueError as e:
        raise TranslateError(f"--reference={args.reference}: {e}") from None
    else:
      _, report = evaluate.score_report(results, references, translator.target_lang)
    print(report, file=sys.stderr)


def _steps(translator: Translator) -> list[int] | list[list[int]]:
  """The checkpoint steps decoded with: an ensemble's per member."""
  return translator.member_steps or translator.checkpoint_steps


def _interactive(
  translator: Translator, args: flags.FlagValues, nbest: int | None, from_stdin: bool
) -> None:
  """Translates line by line as input arrives and flushes each result; messages on stderr."""
  tty = from_stdin and sys.stdin.isatty()
  translator.warm_up(nbest=nbest)
  print(
    f"t2t-translate: ready (checkpoint(s) {_steps(translator)}, beam "
    f"{translator.search.beam_size}, compiled for sources of up to {translator.buckets()} tokens)"
    + ("; one sentence per line, Ctrl-D ends" if tty else ""),
    file=sys.stderr,
    flush=True,
  )
  if from_stdin:
    lines = stream_lines(sys.stdin.buffer, prompt="> " if tty else None)
  else:
    try:
      lines = stream_lines(open(args.input, "rb"), args.input)  # noqa: SIM115
    except OSError as e:
      raise TranslateError(f"{args.input}: cannot read ({e.strerror})") from e
  out = _open_output(args.output)
  results = translator.translate_stream(lines, nbest=nbest)
  for index, result in enumerate(results):
    out.write(format_result(index, result, args.nbest, args.scores))
    out.flush()


def run() -> None:
  host.use_huge_pages()
  _define_flags.flags = _define_flags()
  common.run(main, __doc__)


if __name__ == "__main__":
  run()
