"""t2t-translate against its CTranslate2 exports on a text file (`t2t-bench --vs=ctranslate2
--workdir=W`): speed, BLEU, identical lines and what each search ran.

    t2t-bench --parts=decode --vs=ctranslate2 --workdir=W --decode_input=test2016.en \
        --decode_reference=test2016.de [--decode_sentences=N] [--beam_size=4] [--repeats=3] \
        [--decode_batch_tokens=4096] [--cold]

W's model (the checkpoint t2t-translate would take) is exported to CTranslate2 in float32
and int8 into a temporary directory. For the beam search and for greedy search, every
system translates the whole text once per round, rounds interleaved (t2t_jax, CTranslate2
float32, CTranslate2 int8, t2t_jax, ...) so that machine noise hits all of them; figures
are medians. Each system is run the way its users run it:

- t2t_jax: `Translator.from_workdir(W, batch_tokens=B).translate(lines, search=...)`,
  which is t2t-translate: batches of at most B source tokens (rows padded to a power of two,
  sources to `translator.source_buckets`), each output limited to its source length +
  max_output_extra;
- CTranslate2: `translate_batch` of the same source tokens with batch_type="tokens",
  max_batch_size=B, length_penalty=alpha (CTranslate2 divides by length^alpha where t2t_jax
  uses GNMT's ((5 + length) / 6)^alpha; docs/export.md) and one output limit for all, the
  longest source + max_output_extra, since it takes no per-sentence limit.

Set-up is reported apart: t2t_jax's first pass compiles the search for each batch shape;
CTranslate2 loads its model and runs a first pass. The search statistics say how much work
each search did beside how much the outputs needed: t2t_jax's `Translator.stats` of one
pass, and for CTranslate2 beam x the sum of its output lengths (it drops finished sentences
at every step, so that is what it runs, up to the padding inside a batch); the seconds of a
pass over its hypothesis-steps give each system's cost of a step.

`cold_processes` times what a user waits for in a fresh process: t2t-translate of the file
twice (the second finds JAX's persistent compilation cache the first filled) and a fresh
Python process loading CTranslate2 and translating the file; then the start-up alone, each
system translating the file's first line in a fresh process (t2t-translate once more after
a first run has cached that batch's programs).
"""

import dataclasses
import importlib.metadata
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from t2t_jax import compilation
from t2t_jax.bench import inputs
from t2t_jax.bench.ctranslate2 import COMPUTE_TYPES, interleaved
from t2t_jax.bench.timing import CompileCounter, cpu_threads
from t2t_jax.decoding.lines import read_lines
from t2t_jax.decoding.translator import DecodeStats, TranslateError, Translator
from t2t_jax.tokens import EOS_ID

T2T = "t2t_jax"
ONE_BATCH = "one batch at a time"  # t2t_jax with batch_threads=1, when it runs more
CTRANSLATE2_NOTE = (
  "CTranslate2 hypothesis-steps: beam x the sum of its output lengths (it drops finished "
  "sentences every step, so this is what it runs, up to padding inside a batch); "
  "'N batches at once': inter_threads=N, each batch on threads/N cores (intra_threads), "
  "else inter_threads=1 on all of them"
)
CT2_BATCHES = 2  # CTranslate2's inter_threads in its second configuration


class TextError(ValueError):
  """A text or reference that cannot be used, named by its flag."""


@dataclasses.dataclass
class Text:
  """The sentences to translate, their references (or None) and where they came from."""

  lines: list[str]
  references: list[str] | None
  origin: str


def _read(path: str, flag: str) -> list[str]:
  try:
    return read_lines(path)
  except TranslateError as e:
    raise TextError(f"--{flag}={path}: {e}") from None


def read_text(
  input_path: str | None,
  reference_path: str | None,
  sentences: int,
  corpus: str = "",
  target_lang: str = "de",
) -> Text:
  """The first `sentences` lines (0: all) of `input_path`, else of the shared test set
  (`inputs.real_sentences`, --decode_corpus), with their references: `reference_path`,
  else for a shared test set its .<target_lang> side when present."""
  if input_path:
    lines, origin = _read(input_path, "decode_input"), input_path
  else:
    from absl import app

    try:
      lines, relative = inputs.real_sentences(0, corpus)
    except app.UsageError as e:
      raise TextError(str(e)) from None
    if lines is None:
      raise TextError(
        f"--decode_input: no file given and no test set under {inputs.shared_data_dir()}"
      )
    origin = str(inputs.shared_data_dir() / relative)
    if not reference_path:
      matching = origin[: -len(".en")] + f".{target_lang}"
      reference_path = matching if os.path.isfile(matching) else None
  lines = lines[: sentences or None]
  if not lines:
    raise TextError(f"--decode_input={origin}: no lines to translate")
  references = None
  if reference_path:
    references = _read(reference_path, "decode_reference")
    if len(references) < len(lines):
      raise TextError(
        f"--decode_reference={reference_path}: {len(references)} lines for {len(lines)} sentences"
      )
    references = references[: len(lines)]
  return Text(lines, references, origin)


def _bleu(hyps: Sequence[str], references: Sequence[str] | None) -> float | None:
  if references is None:
    return None
  from t2t_jax.evaluation import scoring

  return scoring.sacrebleu_score(hyps, references).score


@dataclasses.dataclass
class _Ct2:
  """A loaded CTranslate2 model and how long loading took."""

  translator: Any
  load_s: float
  path: str


def _load_ct2(path: str, compute_type: str, threads: int, batches: int = 1) -> _Ct2:
  """CTranslate2 on `threads` cores: `batches` batches translated at once (inter_threads),
  each on threads // batches of them (intra_threads)."""
  import ctranslate2

  start = time.perf_counter()
  translator = ctranslate2.Translator(
    path,
    device="cpu",
    compute_type=compute_type,
    inter_threads=batches,
    intra_threads=max(1, threads // batches),
  )
  return _Ct2(translator, time.perf_counter() - start, path)


def _ct2_run(
  ct2: _Ct2,
  tokens: list[list[str]],
  decode: Callable[[list[str]], str],
  *,
  beam_size: int,
  alpha: float,
  batch_tokens: int,
  max_decoding_length: int,
) -> Callable[[], tuple[list[str], int]]:
  """run() -> (texts, output tokens including the EOS of each output that ended with one)."""

  def run() -> tuple[list[str], int]:
    results = ct2.translator.translate_batch(
      tokens,
      beam_size=beam_size,
      length_penalty=alpha,
      max_batch_size=batch_tokens,
      batch_type="tokens",
      max_decoding_length=max_decoding_length,
      return_end_token=True,
    )
    hyps = [r.hypotheses[0] for r in results]
    return [decode(h) for h in hyps], sum(map(len, hyps))

  return run


def _t2t_run(
  translator: Translator, lines: list[str], beam_size: int
) -> Callable[[], tuple[list[str], int]]:
  """run() -> (texts, output tokens including EOS); each call starts `translator.stats`
  afresh, so afterwards it holds that one pass."""

  def run() -> tuple[list[str], int]:
    translator.reset_stats()
    texts = translator.translate(lines, search=translator.search.override(beam_size=beam_size))
    return texts, translator.stats.needed_row_steps

  return run


def _search_stats(stats: DecodeStats, beam_size: int) -> dict[str, Any]:
  run, needed = stats.row_steps * beam_size, stats.needed_row_steps * beam_size
  return dict(
    batches=stats.batches,
    sentences=stats.sentences,
    rows=stats.rows,
    padding_rows=stats.rows - stats.sentences,
    hypothesis_steps_run=run,
    hypothesis_steps_needed=needed,
    run_over_needed=run / needed if needed else None,
    stages=stats.stages,
    compactions=stats.compactions,
    resizes=stats.resizes,
  )


def _one_search(
  translators: Mapping[str, Translator],
  ct2s: Mapping[str, _Ct2],
  text: Text,
  tokens: list[list[str]],
  decode: Callable[[list[str]], str],
  *,
  beam_size: int,
  batch_tokens: int,
  max_decoding_length: int,
  repeats: int,
  counter: CompileCounter,
) -> dict[str, Any]:
  """Every system on the whole text with one beam size: set-up, then `repeats` rounds.
  `translators`: t2t_jax's systems by name (T2T first, the baseline of identical lines)."""
  translator = translators[T2T]
  alpha = translator.search.alpha
  systems = {name: _t2t_run(t, text.lines, beam_size) for name, t in translators.items()}
  setup: dict[str, float] = {}
  first: dict[str, list[float]] = {}
  for name in translators:
    before = counter.snapshot()
    start = time.perf_counter()
    systems[name]()
    setup[name] = time.perf_counter() - start
    first[name] = [now - then for now, then in zip(counter.snapshot(), before)]
  for name, ct2 in ct2s.items():
    systems[name] = _ct2_run(
      ct2,
      tokens,
      decode,
      beam_size=beam_size,
      alpha=alpha,
      batch_tokens=batch_tokens,
      max_decoding_length=max_decoding_length,
    )
    start = time.perf_counter()
    systems[name]()
    setup[name] = ct2.load_s + time.perf_counter() - start
  before = counter.snapshot()
  times, outputs = interleaved(systems, repeats)
  timed_compiles = counter.snapshot()[0] - before[0]
  baseline = outputs[T2T][0]
  n = len(text.lines)
  rows = {}
  for name, seconds in times.items():
    texts, output_tokens = outputs[name]
    median = statistics.median(seconds)
    rows[name] = dict(
      seconds=seconds,
      median_s=median,
      setup_s=setup[name],
      sentences_per_s=n / median,
      output_tokens=output_tokens,
      tokens_per_s=output_tokens / median,
      bleu=_bleu(texts, text.references),
      same_as_t2t_jax=sum(a == b for a, b in zip(texts, baseline)),
    )
    if name in translators:
      rows[name]["dtype"] = str(translators[name].model.config.dtype)
      rows[name]["batch_threads"] = translators[name].batch_threads
      if name != T2T:
        stats = translators[name].stats
        rows[name]["hypothesis_steps"] = stats.row_steps * beam_size
        rows[name]["first_pass_compiles"] = first[name][0]
    else:
      rows[name]["hypothesis_steps"] = beam_size * output_tokens
  base = rows[T2T]["sentences_per_s"]
  for row in rows.values():
    row["t2t_jax_speedup"] = base / row["sentences_per_s"]
  search = _search_stats(translator.stats, beam_size)
  for row in rows.values():
    row["ms_per_hypothesis_step"] = ms_per_hypothesis_step(row, search)
  search.update(
    first_pass_compiles=first[T2T][0],
    first_pass_compile_s=first[T2T][1],
    timed_compiles=timed_compiles,
  )
  return dict(
    beam_size=beam_size, max_decoding_length=max_decoding_length, systems=rows, t2t_jax=search
  )


def _ct2_exports(workdir: str, checkpoint: str, directory: str, quantizations: Sequence[str]):
  """(the Trained, {quantization: CTranslate2 model directory}) of the workdir."""
  from t2t_jax.export import load_trained, to_ctranslate2

  trained = load_trained(workdir, checkpoint)
  paths = {}
  for quantization in quantizations:
    paths[quantization] = to_ctranslate2.export(
      trained, os.path.join(directory, quantization), quantization
    )
  return trained, paths


def t2t_systems(
  workdir: str,
  checkpoint: str,
  dtypes: Sequence[str],
  batch_tokens: int,
  beam_stop: str | None,
  threads: int,
) -> tuple[dict[str, Translator], float]:
  """(t2t_jax's systems by name, the first one's load seconds): a Translator per dtype, the
  first named T2T and the others "t2t_jax DTYPE"; where the first decodes several batches
  at once and `threads` >= 2, also the first one batch at a time, so that the table shows
  what t2t_jax gains from its second batch beside CTranslate2's gain from its own."""
  translators: dict[str, Translator] = {}
  start = time.perf_counter()
  for i, dtype in enumerate(dtypes):
    try:
      t = Translator.from_workdir(workdir, checkpoint, dtype, batch_tokens=batch_tokens)
    except ValueError as e:
      raise TextError(f"--decode_dtypes: {e}") from None
    t.search = t.search.override(beam_stop=beam_stop)
    translators[T2T if i == 0 else f"{T2T} {t.model.config.dtype}"] = t
    if i == 0:
      load_s = time.perf_counter() - start
  first = translators[T2T]
  if threads >= 2 and first.batch_threads >= 2:
    # The same model, parameters and settings (an ensemble of one), read once.
    one = Translator.ensemble([first], batch_threads=1)
    translators[f"{T2T} {one.model.config.dtype}, {ONE_BATCH}"] = one
  return translators, load_s


def compare(
  workdir: str,
  text: Text,
  *,
  beam_size: int | None = None,
  repeats: int = 3,
  batch_tokens: int = 4096,
  threads: int | None = None,
  checkpoint: str = "auto",
  compute_types: Sequence[str] = COMPUTE_TYPES,
  cold: bool = False,
  cold_env: Mapping[str, str] | None = None,
  counter: CompileCounter | None = None,
  beam_stop: str | None = None,
  dtypes: Sequence[str] = ("float32",),
) -> dict[str, Any]:
  """t2t_jax and CTranslate2 (each of `compute_types`, exported with that quantization) on
  `text` through `workdir`'s model: the beam search (`beam_size`, default the workdir's)
  and greedy search, `repeats` interleaved rounds each; with `cold`, also `cold_processes`
  (run with `cold_env`, default this process's environment). Returns what t2t-bench writes
  under `decode_text` (`table` prints it). beam_stop: t2t_jax's stopping rule (None: the
  workdir's). dtypes: t2t_jax's systems, one per dtype (Translator.from_workdir's dtype),
  the first named T2T and the others "t2t_jax DTYPE" (`t2t_systems`)."""
  threads = threads or cpu_threads()
  counter = counter or CompileCounter()
  if not dtypes:
    raise TextError("--decode_dtypes: no dtype given")
  translators, load_s = t2t_systems(workdir, checkpoint, dtypes, batch_tokens, beam_stop, threads)
  translator = translators[T2T]
  beam_size = beam_size or translator.search.beam_size
  ids = translator.source_ids(text.lines)
  extra, max_len = translator.search.max_output_extra, translator.model.config.max_len
  # t2t_jax's limit counts EOS; CTranslate2's max_decoding_length does not.
  max_decoding_length = min(max(map(len, ids)) + extra, max_len) - 1
  with tempfile.TemporaryDirectory(prefix="t2t-bench-ct2-") as tmp:
    trained, paths = _ct2_exports(workdir, checkpoint, tmp, compute_types)
    index = {token: i for i, token in enumerate(trained.vocabulary)}
    tokens = [[trained.vocabulary[t] for t in seq if t != EOS_ID] for seq in ids]
    decode = lambda pieces: translator.tokenizer.decode([index[p] for p in pieces])
    ct2s = {}
    for c in compute_types:
      ct2s[f"ctranslate2 {c}"] = _load_ct2(paths[c], c, threads)
      if threads >= 2:  # as t2t_jax decodes two batches at once on a CPU (batch_threads)
        ct2s[f"ctranslate2 {c}, {CT2_BATCHES} batches at once"] = _load_ct2(
          paths[c], c, threads, CT2_BATCHES
        )
    searches = {}
    for name, beam in [("beam", beam_size), ("greedy", 1)][1 if beam_size == 1 else 0 :]:
      searches[name] = _one_search(
        translators,
        ct2s,
        text,
        tokens,
        decode,
        beam_size=beam,
        batch_tokens=batch_tokens,
        max_decoding_length=max_decoding_length,
        repeats=repeats,
        counter=counter,
      )
    result = dict(
      workdir=workdir,
      inputs=text.origin,
      sentences=len(text.lines),
      mean_source_tokens=sum(map(len, ids)) / len(ids),
      reference=text.references is not None,
      checkpoint_steps=list(translator.checkpoint_steps),
      batch_tokens=batch_tokens,
      threads=threads,
      repeats=repeats,
      alpha=translator.search.alpha,
      beam_stop=translator.search.beam_stop,
      load_s=load_s,
      dtype=str(translator.model.config.dtype),
      model=dict(
        d_model=trained.config.d_model,
        layers=[trained.config.encoder_layers, trained.config.decoder_layers],
        vocab_size=trained.config.vocab_size,
      ),
      searches=searches,
    )
    if cold:
      result["cold"] = cold_processes(
        workdir,
        text.lines,
        paths,
        beam_size=beam_size,
        alpha=translator.search.alpha,
        batch_tokens=batch_tokens,
        max_decoding_length=max_decoding_length,
        threads=threads,
        checkpoint=checkpoint,
        env=cold_env,
        dtype=dtypes[0],
      )
  return result


# A user's script: load the exported model, read, tokenize, translate and write the file.
CT2_SCRIPT = r"""
import os, sys
import ctranslate2
path, compute_type, source, beam, alpha, batch_tokens, limit, threads = sys.argv[1:]
if os.path.exists(os.path.join(path, "vocab.model")):
    import sentencepiece
    sp = sentencepiece.SentencePieceProcessor(model_file=os.path.join(path, "vocab.model"))
    encode, decode = (lambda s: sp.encode(s, out_type=str)), sp.decode_pieces
else:
    encode, decode = str.split, " ".join
translator = ctranslate2.Translator(path, device="cpu", compute_type=compute_type,
                                    inter_threads=1, intra_threads=int(threads))
with open(source, encoding="utf-8") as f:
    lines = f.read().splitlines()
results = translator.translate_batch(
    [encode(line) for line in lines], beam_size=int(beam), length_penalty=float(alpha),
    max_batch_size=int(batch_tokens), batch_type="tokens", max_decoding_length=int(limit))
with open(os.devnull, "w", encoding="utf-8") as out:
    out.writelines(decode(r.hypotheses[0]) + "\n" for r in results)
"""


def console_script_code(name: str) -> str:
  """Python code that calls what the console script `name` calls (its entry point in
  setup.cfg), so that a process re-executes for huge pages before importing jax, as a
  user's does (`python -m` imports it first)."""
  entries = importlib.metadata.entry_points(group="console_scripts", name=name)
  if not entries:
    raise RuntimeError(f"no console script {name} installed (pip install -e .)")
  (entry,) = entries
  return f"import {entry.module} as tool; tool.{entry.attr}()"


def _timed_process(command: Sequence[str], env: Mapping[str, str]) -> float:
  """Wall seconds of a command run to its end; a failure raises with its stderr's end."""
  start = time.perf_counter()
  proc = subprocess.run(list(command), env=dict(env), capture_output=True, text=True)
  seconds = time.perf_counter() - start
  if proc.returncode != 0:
    raise RuntimeError(f"{' '.join(command[:3])} ... failed:\n{proc.stderr[-2000:]}")
  return seconds


def _files_under(directory: str) -> int:
  return sum(len(files) for _, _, files in os.walk(directory))


def cold_processes(
  workdir: str,
  lines: Sequence[str],
  ct2_paths: Mapping[str, str],
  *,
  beam_size: int,
  alpha: float,
  batch_tokens: int,
  max_decoding_length: int,
  threads: int,
  checkpoint: str = "auto",
  env: Mapping[str, str] | None = None,
  dtype: str = "float32",
) -> dict[str, Any]:
  """End-to-end seconds of fresh processes translating `lines` (written to a file):
  `t2t-translate --output=/dev/null` twice, the compilation cache in a new directory that
  the first fills and the second reads ($T2T_COMPILATION_CACHE; a JAX_COMPILATION_CACHE_DIR
  in `env` is dropped, it would take precedence), and one CTranslate2 process per
  exported model (CT2_SCRIPT: load, tokenize, translate, write). Then the same for the
  first line alone, the start-up a user waits before translation begins: t2t-translate's
  second run of it (the first compiles that batch's shape into the cache) and each
  CTranslate2 process."""
  env = dict(os.environ if env is None else env)
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  with tempfile.TemporaryDirectory(prefix="t2t-bench-cold-") as tmp:
    source = os.path.join(tmp, "input.txt")
    first = os.path.join(tmp, "first.txt")
    for path, text in ((source, lines), (first, lines[:1])):
      with open(path, "w", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in text)
    cache = os.path.join(tmp, "xla-cache")
    env[compilation.ENV] = cache

    t2t_translate = console_script_code("t2t-translate")

    def translate(path: str) -> list[str]:
      return [
        sys.executable,
        "-c",
        t2t_translate,
        f"--workdir={workdir}",
        f"--checkpoint={checkpoint}",
        f"--input={path}",
        "--output=/dev/null",
        f"--beam_size={beam_size}",
        f"--batch_tokens={batch_tokens}",
        f"--dtype={dtype}",
      ]

    def ct2(path: str, compute_type: str, model: str) -> list[str]:
      args = (model, compute_type, path, beam_size, alpha, batch_tokens, max_decoding_length)
      return [sys.executable, "-c", CT2_SCRIPT, *map(str, args), str(threads)]

    out: dict[str, Any] = dict(sentences=len(lines), beam_size=beam_size)
    out["t2t_translate_fresh_cache_s"] = _timed_process(translate(source), env)
    out["cache_files"] = _files_under(cache) if os.path.isdir(cache) else 0
    out["t2t_translate_warm_cache_s"] = _timed_process(translate(source), env)
    for compute_type, model in ct2_paths.items():
      out[f"ctranslate2_{compute_type}_s"] = _timed_process(ct2(source, compute_type, model), env)
    _timed_process(translate(first), env)  # caches the one-line batch's programs
    start_up = dict(t2t_translate_warm_cache_s=_timed_process(translate(first), env))
    for compute_type, model in ct2_paths.items():
      start_up[f"ctranslate2_{compute_type}_s"] = _timed_process(
        ct2(first, compute_type, model), env
      )
    out["first_line"] = start_up
  return out


def _hypothesis_steps(row: dict[str, Any], search: dict[str, Any]) -> int:
  """The hypothesis-steps a system ran: its row's, t2t_jax's from its search statistics."""
  return row.get("hypothesis_steps", search["hypothesis_steps_run"])


def ms_per_hypothesis_step(row: dict[str, Any], search: dict[str, Any]) -> float | None:
  """What a step costs apart from how many a search runs: a system's median pass in
  milliseconds over the hypothesis-steps it ran."""
  steps = _hypothesis_steps(row, search)
  return 1e3 * row["median_s"] / steps if steps else None


def _fmt(value: float | None, spec: str) -> str:
  return "n/a" if value is None else format(value, spec)


def _search_lines(name: str, s: dict[str, Any], sentences: int) -> list[str]:
  lines = [
    f"{name} search, beam {s['beam_size']} (CTranslate2 max_decoding_length "
    f"{s['max_decoding_length']}):",
    "| system | sentences/s | tokens/s | sacreBLEU | same output as t2t_jax | set-up s | "
    "hypothesis-steps | ms per hypothesis-step |",
    "|---|---:|---:|---:|---:|---:|---:|---:|",
  ]
  search = s[T2T]
  for system, row in s["systems"].items():
    steps = _hypothesis_steps(row, search)
    if system == T2T and "dtype" in row:
      system = f"{T2T} {row['dtype']}"
    lines.append(
      f"| {system} | {row['sentences_per_s']:.1f} | {row['tokens_per_s']:,.0f} | "
      f"{_fmt(row['bleu'], '.2f')} | {row['same_as_t2t_jax']}/{sentences} | "
      f"{row['setup_s']:.1f} | {steps:,} | {_fmt(row['ms_per_hypothesis_step'], '.4f')} |"
    )
  lines.append(
    f"t2t_jax search, one pass: {search['batches']} batches, {search['sentences']} sentences "
    f"in {search['rows']} rows ({search['padding_rows']} padding), hypothesis-steps "
    f"{search['hypothesis_steps_run']:,} run / {search['hypothesis_steps_needed']:,} needed "
    f"= {_fmt(search['run_over_needed'], '.2f')}x, {search['stages']} stages, "
    f"{search['compactions']} compactions, {search['resizes']} resizes; first pass "
    f"compiled {search['first_pass_compiles']} programs in {search['first_pass_compile_s']:.1f}"
    f" s, timed passes {search['timed_compiles']}"
  )
  return lines


def _cold_lines(c: dict[str, Any]) -> list[str]:
  lines = [
    f"cold processes ({c['sentences']} sentences, beam {c['beam_size']}, end to end):",
    "| process | seconds |",
    "|---|---:|",
    f"| t2t-translate, empty compilation cache | {c['t2t_translate_fresh_cache_s']:.1f} |",
    f"| t2t-translate, the cache the first filled ({c['cache_files']} files) | "
    f"{c['t2t_translate_warm_cache_s']:.1f} |",
  ]
  lines += _ct2_rows(c, "load + translate")
  first = c.get("first_line", {})
  if first:
    lines.append(
      "| t2t-translate of the first line alone, its programs cached (start-up) | "
      f"{first['t2t_translate_warm_cache_s']:.1f} |"
    )
  return lines + _ct2_rows(first, "the first line alone")


def _ct2_rows(times: dict[str, Any], what: str) -> list[str]:
  """A table row per CTranslate2 process of `times` (keys ctranslate2_<compute type>_s)."""
  return [
    f"| CTranslate2 {key[len('ctranslate2_') : -len('_s')]}, {what} | {seconds:.1f} |"
    for key, seconds in times.items()
    if key.startswith("ctranslate2_")
  ]


def table(result: dict[str, Any]) -> str:
  """The comparison as lines of text: a markdown table per search, then the cold processes."""
  m = result["model"]
  lines = [
    f"decode on real text: {result['sentences']} sentences of {result['inputs']} (mean source "
    f"{result['mean_source_tokens']:.1f} tokens) through {result['workdir']}'s model "
    f"(checkpoints {result['checkpoint_steps']}; d_model {m['d_model']}, "
    f"{m['layers'][0]}+{m['layers'][1]} layers, vocab {m['vocab_size']:,}), batches of "
    f"{result['batch_tokens']} source tokens, {result['threads']} thread(s), alpha "
    f"{result['alpha']}, t2t_jax stop rule {result['beam_stop']}, medians of "
    f"{result['repeats']} interleaved passes; tokens = output subwords, EOS included",
  ]
  for name, search in result["searches"].items():
    lines += _search_lines(name, search, result["sentences"])
  lines.append(CTRANSLATE2_NOTE)
  if "cold" in result:
    lines += _cold_lines(result["cold"])
  return "\n".join(lines)
