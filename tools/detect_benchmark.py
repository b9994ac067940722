"""Language detection libraries for t2t-serve's source=auto and /detect, measured on real text.

    python -m tools.detect_benchmark                  # every installed library, tables
    python -m tools.detect_benchmark --per_cell=200   # a smaller sample (quicker)

Candidates, each where installed: lingua-language-detector (high accuracy, its default, and
its low-accuracy mode), py3langid, LibreTranslate's own detector (lexilang under 20
characters, else langdetect), and t2t_jax.serve.detect (py3langid as the server uses it).
Each is restricted to a served set ({en, de}, {en, de, fr}, {en, de, fr, es, it, nl}) and
asked for the one best language of every text of a held-out sample of ../shared/data:
Tatoeba deu-eng, Multi30k test2016 and WMT newstest2014, each side labelled by its file
(.en, .de). The data holds no other language, so French, Spanish, Italian and Dutch are
distractors only: a text detected as one of them counts as wrong. The sample takes up to
--per_cell lines, evenly spaced, of each (corpus, language, length) cell; lengths are short
(< 20 characters), medium (20-99) and long (>= 100). Nearly all short lines are Tatoeba's, and
a library may have been trained on Tatoeba, so "prefix" adds short text from elsewhere: the
first words (two at least, under 20 characters) of Multi30k and newstest lines, such as
"Two young, White" or "Gutach: Noch mehr".

Printed: accuracy by length and by corpus; the mean CPU time of one call by length (one
thread, after warm-up calls; the thread's CPU time, not the clock's, so that other work on a
shared machine does not count: it is the latency of an idle machine); and the costs measured
in a fresh interpreter that already has numpy (as the server does): import time, building the
{en, de, fr} detector with its models loaded, the resident memory that import, build and three
calls add, and the size installed on disk. Without ../shared/data (or $T2T_SHARED_DATA) it
prints why and exits 0.
"""

import argparse
import contextlib
import dataclasses
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

SETS = (("en", "de"), ("en", "de", "fr"), ("en", "de", "fr", "es", "it", "nl"))
COST_SET = ("en", "de", "fr")
BUCKETS = ("short", "medium", "long")
# (corpus name, directory, file stem): each stem has .en and .de or .eng/.deu sides.
CORPORA = (
  ("tatoeba", "tatoeba_deu_eng", "tatoeba-test-v2021-08-07"),
  ("multi30k", "multi30k", "test2016"),
  ("newstest2014", "wmt14", "newstest2014"),
)
COST_TEXTS = (
  "Guten Morgen!",
  "A man in a blue shirt is standing on a ladder cleaning windows.",
  "Le gouvernement a annoncé mardi une série de mesures destinées à soutenir les entreprises "
  "touchées par la hausse des prix de l'énergie.",
)


def bucket(text: str) -> str:
  n = len(text)
  return "short" if n < 20 else "medium" if n < 100 else "long"


# --- the candidates: each builds `best(text) -> code` for a set of ISO 639-1 codes ----------


def _lingua(languages: Sequence[str], low_accuracy: bool = False) -> Callable[[str], str]:
  from lingua import IsoCode639_1, LanguageDetectorBuilder

  codes = [IsoCode639_1.from_str(code) for code in languages]
  builder = LanguageDetectorBuilder.from_iso_codes_639_1(*codes)
  if low_accuracy:
    builder = builder.with_low_accuracy_mode()
  # Loaded now, not on the first call that needs them: a server's first request stays quick.
  detector = builder.with_preloaded_language_models().build()

  def best(text: str) -> str:
    top = detector.compute_language_confidence_values(text)[0]
    return top.language.iso_code_639_1.name.lower()

  return best


def _py3langid(languages: Sequence[str]) -> Callable[[str], str]:
  from py3langid.langid import MODEL_FILE, LanguageIdentifier

  # An identifier of its own: py3langid.set_languages would restrict the module's shared one.
  identifier = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
  identifier.set_languages(list(languages))
  return lambda text: identifier.classify(text)[0]


def _libretranslate(languages: Sequence[str]) -> Callable[[str], str]:
  """libretranslate/detect.py as of 2025: lexilang's word lists for texts under 20
  characters when they find a word, else langdetect's best among the served languages."""
  from langdetect import DetectorFactory, LangDetectException, detect_langs
  from lexilang.detector import detect as lexilang_detect

  DetectorFactory.seed = 0  # as LibreTranslate: the same answer for the same text
  served = list(languages)

  def best(text: str) -> str:
    if len(text) < 20:
      code, confidence = lexilang_detect(text, served)
      if confidence > 0:
        return code
    try:
      found = [lang.lang for lang in detect_langs(text) if lang.lang in served]
    except LangDetectException:
      found = []
    return found[0] if found else "en"

  return best


def _t2t(languages: Sequence[str]) -> Callable[[str], str]:
  """The server's own: t2t_jax.serve.detect (py3langid, the text cut at MAX_CHARS)."""
  from t2t_jax.serve.detect import Detector

  detector = Detector(languages)
  return lambda text: detector.best(text)[0]


@dataclasses.dataclass(frozen=True)
class Candidate:
  name: str
  module: str  # imported to see whether it is installed, and timed
  dists: tuple[str, ...]  # distributions whose installed files are counted
  build: Callable[[Sequence[str]], Callable[[str], str]]


CANDIDATES = (
  Candidate("lingua", "lingua", ("lingua-language-detector",), _lingua),
  Candidate(
    "lingua-low",
    "lingua",
    ("lingua-language-detector",),
    lambda languages: _lingua(languages, low_accuracy=True),
  ),
  Candidate("py3langid", "py3langid", ("py3langid",), _py3langid),
  Candidate("libretranslate", "langdetect", ("langdetect", "lexilang", "six"), _libretranslate),
  Candidate("t2t_jax detect", "py3langid", ("py3langid",), _t2t),
)


def installed(candidate: Candidate) -> bool:
  try:
    importlib.import_module(candidate.module)
  except ImportError:
    return False
  if candidate.name == "libretranslate":
    try:
      importlib.import_module("lexilang")
    except ImportError:
      return False
  return True


def installed_mb(candidate: Candidate) -> float:
  total = 0
  for dist in candidate.dists:
    try:
      files = importlib.metadata.distribution(dist).files or []
    except importlib.metadata.PackageNotFoundError:
      continue
    for f in files:
      path = f.locate()
      if os.path.isfile(path):
        total += os.path.getsize(path)
  return total / 2**20


# --- the data ------------------------------------------------------------------------------


def shared_data_dir() -> str:
  if os.environ.get("T2T_SHARED_DATA"):
    return os.environ["T2T_SHARED_DATA"]
  here = os.path.dirname(os.path.abspath(__file__))
  return os.path.join(os.path.dirname(os.path.dirname(here)), "shared", "data")


def _even(items: list[str], count: int) -> list[str]:
  step = len(items) / count if len(items) > count else 1
  return [items[int(i * step)] for i in range(min(count, len(items)))]


def prefix(line: str) -> str:
  """The longest run of the line's first words (two at least) under 20 characters, or ''."""
  words, out = line.split(), ""
  for n in range(2, len(words) + 1):
    if len(" ".join(words[:n])) >= 20:
      break
    out = " ".join(words[:n])
  return out


def sample(data_dir: str, per_cell: int) -> list[tuple[str, str, str, str]]:
  """(corpus, language, cell, text): up to per_cell lines, evenly spaced, of each (corpus,
  language, length bucket), in file order; and for the corpora other than Tatoeba, cell
  'prefix': the short first words of up to per_cell lines, short text that does not come from
  Tatoeba. Lines are stripped; empty lines are skipped."""
  out = []
  for corpus, directory, stem in CORPORA:
    for language, suffixes in (("en", (".en", ".eng")), ("de", (".de", ".deu"))):
      path = next(
        (p for s in suffixes if os.path.isfile(p := os.path.join(data_dir, directory, stem + s))),
        None,
      )
      if path is None:
        continue
      with open(path, encoding="utf-8") as f:
        lines = [line.strip() for line in f if line.strip()]
      for b in BUCKETS:
        picked = _even([line for line in lines if bucket(line) == b], per_cell)
        out += [(corpus, language, b, text) for text in picked]
      if corpus != "tatoeba":
        starts = [p for line in lines if bucket(line) != "short" and (p := prefix(line))]
        out += [(corpus, language, "prefix", text) for text in _even(starts, per_cell)]
  return out


# --- the measurements ----------------------------------------------------------------------


def accuracy(
  candidate: Candidate, languages: Sequence[str], texts: list[tuple[str, str, str, str]]
):
  """{cell, corpus or 'all': [right, total]} (corpus and 'all' without the prefixes),
  {bucket: mean microseconds per call}."""
  best = candidate.build(languages)
  for text in COST_TEXTS:  # warm-up calls: lazy set-up is not charged to the first texts
    best(text)
  right: dict[str, list[int]] = {}
  spent: dict[str, list[float]] = {b: [0.0, 0] for b in BUCKETS}
  for corpus, language, cell, text in texts:
    start = time.thread_time()
    found = best(text)
    if cell in spent:
      spent[cell][0] += time.thread_time() - start
      spent[cell][1] += 1
    for key in (cell,) if cell == "prefix" else (cell, corpus, "all"):
      cell = right.setdefault(key, [0, 0])
      cell[0] += found == language
      cell[1] += 1
  micros = {b: 1e6 * s / n for b, (s, n) in spent.items() if n}
  return right, micros


def _rss_mb() -> float:
  with open("/proc/self/statm") as f:
    return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _cost_here(name: str) -> None:
  """In a fresh interpreter: prints the costs of one candidate as JSON."""
  import numpy  # noqa: F401  (the server has it loaded before any detector)

  candidate = next(c for c in CANDIDATES if c.name == name)
  before = _rss_mb()
  start = time.perf_counter()
  importlib.import_module(candidate.module)
  import_s = time.perf_counter() - start
  start = time.perf_counter()
  best = candidate.build(COST_SET)
  build_s = time.perf_counter() - start
  start = time.perf_counter()
  best(COST_TEXTS[0])
  first_call_s = time.perf_counter() - start
  for text in COST_TEXTS:
    best(text)
  after = _rss_mb()
  found = dict(import_s=import_s, build_s=build_s, first_s=first_call_s, rss=after - before)
  print(json.dumps(found))


def cost(candidate: Candidate) -> dict:
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  path = os.pathsep.join(filter(None, (repo, os.environ.get("PYTHONPATH"))))
  proc = subprocess.run(
    [sys.executable, "-m", "tools.detect_benchmark", f"--_cost={candidate.name}"],
    cwd=repo,
    env=dict(os.environ, PYTHONPATH=path),
    capture_output=True,
    text=True,
    check=True,
  )
  found = json.loads(proc.stdout.strip().splitlines()[-1])
  found["disk"] = installed_mb(candidate)
  return found


def cpu_model() -> str:
  try:
    out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
  except (OSError, subprocess.CalledProcessError):
    return platform.processor() or "unknown"
  for line in out.splitlines():
    if line.startswith("Model name:"):
      return line.split(":", 1)[1].strip()
  return "unknown"


def _pct(cell: list[int] | None) -> str:
  return f"{100 * cell[0] / cell[1]:.1f}" if cell and cell[1] else "-"


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--per_cell", type=int, default=500, help="lines per (corpus, language, length)")
  p.add_argument("--only", default="", help="comma-separated candidate names (default: all)")
  p.add_argument("--_cost", default="", help=argparse.SUPPRESS)
  args = p.parse_args()
  if args._cost:
    _cost_here(args._cost)
    return

  data_dir = shared_data_dir()
  if not os.path.isdir(data_dir):
    print(f"skipped: no shared data at {data_dir} (set T2T_SHARED_DATA)")
    return
  texts = sample(data_dir, args.per_cell)
  if not texts:
    print(f"skipped: none of {[c[1] for c in CORPORA]} under {data_dir}")
    return
  wanted = set(filter(None, args.only.split(",")))
  candidates = [c for c in CANDIDATES if not wanted or c.name in wanted]
  missing = [c.name for c in candidates if not installed(c)]
  candidates = [c for c in candidates if installed(c)]
  if missing:
    print(f"not installed, left out: {', '.join(missing)}")
  if not candidates:
    return

  counts = {b: sum(t[2] == b for t in texts) for b in (*BUCKETS, "prefix")}
  load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
  print(f"CPU: {cpu_model()}, {os.cpu_count()} cores, load average {load}", end="")
  print(f"; Python {platform.python_version()}; {len(texts)} texts", end="")
  print(" (" + ", ".join(f"{b} {n}" for b, n in counts.items()) + f"), --per_cell={args.per_cell}")
  for c in candidates:
    versions = []
    for dist in c.dists:
      with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        versions.append(f"{dist} {importlib.metadata.version(dist)}")
    print(f"  {c.name}: {', '.join(versions)}")
  print()

  whole = [t for t in texts if t[2] != "prefix"]
  corpora = [name for name, _, _ in CORPORA if any(t[0] == name for t in whole)]
  head = "| library | languages | acc short | acc medium | acc long | acc all | acc prefix |"
  head += "".join(f" {name} |" for name in corpora)
  head += " cpu us/call short | cpu us/call medium | cpu us/call long |"
  print(head)
  print("|" + " --- |" * (head.count("|") - 1))
  for c in candidates:
    for languages in SETS:
      right, micros = accuracy(c, languages, texts)
      row = f"| {c.name} | {','.join(languages)} |"
      row += "".join(f" {_pct(right.get(k))} |" for k in (*BUCKETS, "all", "prefix", *corpora))
      row += "".join(f" {micros.get(b, 0):.0f} |" for b in BUCKETS)
      print(row, flush=True)
  print()
  print(f"Costs, each in a fresh interpreter with numpy loaded; detector for {','.join(COST_SET)}:")
  print("| library | import s | build s | first call s | RSS added MiB | installed MiB |")
  print("| --- | --- | --- | --- | --- | --- |")
  for c in candidates:
    f = cost(c)
    print(
      f"| {c.name} | {f['import_s']:.3f} | {f['build_s']:.3f} | {f['first_s']:.4f} |"
      f" {f['rss']:.0f} | {f['disk']:.1f} |",
      flush=True,
    )


if __name__ == "__main__":
  main()
