"""Sentence segmenters compared on paragraphs with known boundaries (newstest2014 en and de).

    python -m tools.segment_benchmark                 # 5 lines a paragraph, every installed one
    python -m tools.segment_benchmark --lines=3 --only=sentencex,pysbd

newstest2014's lines are sentences (a few are headlines without a full stop, a few hold two
sentences), so joining `--lines` consecutive lines with one space gives a paragraph whose
sentence starts are known. For each segmenter and language the table gives boundary
precision and recall over all paragraphs, recall of the boundaries after a line that ends in
. ! ? or a quote (the ones a segmenter can see), the share of paragraphs whose sentences are
the text as it was, in order, every character but whitespace in one ("kept": the layout can
be put back), how many of a few hand-made hard cases it gets exactly right (abbreviations,
initials, decimals, ellipses, quotes, ordinals), the speed, and the time of one
100,000-character paragraph (a segmenter worse than linear shows there). Candidates that are
not installed are left out; without the data it prints why and exits 0.
"""

import argparse
import sys
import time
from collections.abc import Callable

from tests import support

LANGUAGES = ("en", "de")
TERMINAL = tuple('.!?"“”»«')
# Hard cases: the sentences of each text, joined by one space.
CASES = {
  "en": (
    ("Dr. Smith went to Washington.", "He arrived at 5 p.m. on Monday."),
    ("The U.S. economy grew 3.14 percent.", "Mr. J. R. Jones disagreed."),
    ("I waited...", "Nobody came.", '"Why?" she asked.', "Then she left!"),
    ("It costs $2.50 at e.g. the shop in St. Louis.", "Prices rose."),
  ),
  "de": (
    ("Das ist z. B. ein Test.", "Er kam am 3. Oktober an."),
    ("Dr. Müller wohnt in der Str. 5.", "Sie ist ca. 30 Jahre alt."),
    ("Er sagte: „Ich komme.“", "Dann ging er."),
    ("Die Inflation lag bei 2,5 Prozent usw.", "Das reicht."),
  ),
}


Spans = list[tuple[int, int]]


def _locate(pieces: list[str], text: str) -> Spans:
  """(start, end) of sentences a segmenter gave as strings, some stripped; a piece that is not
  in the text as it was (a segmenter that changed it) is left out."""
  spans, cursor = [], 0
  for piece in pieces:
    core = piece.strip()
    found = text.find(core, cursor) if core else -1
    if found >= 0:
      spans.append((found, found + len(core)))
      cursor = found + len(core)
  return spans


def _sentencex() -> Callable[[str, str], Spans]:
  import sentencex

  def run(text: str, language: str) -> Spans:
    found = sentencex.get_sentence_boundaries(language, text)
    return [(b["start_index"], b["end_index"]) for b in found]

  return run


def _pysbd() -> Callable[[str, str], Spans]:
  import pysbd

  segmenters = {lang: pysbd.Segmenter(language=lang, clean=False) for lang in LANGUAGES}
  return lambda text, language: _locate(segmenters[language].segment(text), text)


def _blingfire() -> Callable[[str, str], Spans]:
  import blingfire

  def run(text: str, language: str) -> Spans:
    return list(blingfire.text_to_sentences_and_offsets(text)[1])

  return run


def _sentence_splitter() -> Callable[[str, str], Spans]:
  from sentence_splitter import SentenceSplitter

  splitters = {lang: SentenceSplitter(language=lang) for lang in LANGUAGES}
  return lambda text, language: _locate(splitters[language].split(text), text)


def _syntok() -> Callable[[str, str], Spans]:
  from syntok import segmenter

  def run(text: str, language: str) -> Spans:
    sentences = [s for p in segmenter.analyze(text) for s in p if s]
    return [(s[0].offset, s[-1].offset + len(s[-1].value)) for s in sentences]

  return run


CANDIDATES = {
  "sentencex": _sentencex,
  "pysbd": _pysbd,
  "blingfire": _blingfire,
  "sentence-splitter": _sentence_splitter,
  "syntok": _syntok,
}


def _skip_space(text: str, i: int) -> int:
  while i < len(text) and text[i].isspace():
    i += 1
  return i


def paragraphs(lines: list[str], k: int) -> list[tuple[str, set[int], set[int]]]:
  """(paragraph, every sentence start after the first, the starts after a line ending in
  terminal punctuation) of each k consecutive lines."""
  out = []
  for i in range(0, len(lines) - k + 1, k):
    group = lines[i : i + k]
    starts, visible, offset = set(), set(), 0
    for j, line in enumerate(group):
      if j:
        starts.add(offset)
        if group[j - 1].endswith(TERMINAL):
          visible.add(offset)
      offset += len(line) + 1
    out.append((" ".join(group), starts, visible))
  return out


def kept(text: str, spans: Spans) -> bool:
  """Whether the spans are in order and cover every character but whitespace: the text can be
  put back from them."""
  covered, end = 0, 0
  for start, stop in spans:
    if start < end or stop < start:
      return False
    covered += len(text[start:stop]) - sum(c.isspace() for c in text[start:stop])
    end = stop
  return covered == sum(not c.isspace() for c in text)


def cases_right(run: Callable, language: str) -> int:
  right = 0
  for sentences in CASES[language]:
    text = " ".join(sentences)
    spans = run(text, language)
    right += [text[a:b].strip() for a, b in spans] == list(sentences)
  return right


def measure(run: Callable, paras: list, language: str) -> dict[str, float]:
  true_pos = predicted = gold = visible_found = visible = whole = 0
  chars = sum(len(p) for p, _, _ in paras)
  start = time.perf_counter()
  results = [run(p, language) for p, _, _ in paras]
  seconds = time.perf_counter() - start
  for (text, starts, seen), spans in zip(paras, results):
    found = {_skip_space(text, s) for s, _ in spans} - {0, len(text)}
    true_pos += len(found & starts)
    predicted += len(found)
    gold += len(starts)
    visible_found += len(found & seen)
    visible += len(seen)
    whole += kept(text, spans)
  long_text = " ".join(p for p, _, _ in paras)
  while len(long_text) < 100_000:
    long_text += " " + long_text
  long_text = long_text[:100_000]
  start = time.perf_counter()
  run(long_text, language)
  long_s = time.perf_counter() - start
  return dict(
    precision=true_pos / max(predicted, 1),
    recall=true_pos / max(gold, 1),
    visible_recall=visible_found / max(visible, 1),
    kept=whole / max(len(paras), 1),
    cases=cases_right(run, language),
    chars_s=chars / seconds,
    long_s=long_s,
  )


def main(argv: list[str] | None = None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--data", default=str(support.shared_data_dir() / "wmt14"))
  parser.add_argument("--lines", type=int, default=5, help="sentences a paragraph")
  parser.add_argument("--only", default="", help="comma-separated candidates ('' = all)")
  args = parser.parse_args(argv)
  files = {lang: f"{args.data}/newstest2014.{lang}" for lang in LANGUAGES}
  texts = {}
  try:
    for lang, path in files.items():
      with open(path, encoding="utf-8") as f:
        texts[lang] = f.read().splitlines()
  except OSError as e:
    print(f"skipped: no newstest2014 ({e})")
    return {}
  paras = {
    lang: paragraphs([t.strip() for t in texts[lang] if t.strip()], args.lines) for lang in texts
  }
  names = args.only.split(",") if args.only else list(CANDIDATES)
  print(f"{sum(map(len, paras.values()))} paragraphs of {args.lines} lines (newstest2014 en, de)\n")
  print(
    '| segmenter | lang | precision | recall | recall after . ! ? " | kept | hard cases '
    "| chars/s | 100k chars |"
  )
  print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
  table = {}
  for name in names:
    try:
      run = CANDIDATES[name]()
    except ImportError as e:
      print(f"| {name} | not installed ({e.name}) | | | | | | | |")
      continue
    for lang in LANGUAGES:
      r = measure(run, paras[lang], lang)
      table[name, lang] = r
      print(
        f"| {name} | {lang} | {r['precision']:.3f} | {r['recall']:.3f} | "
        f"{r['visible_recall']:.3f} | {r['kept']:.0%} | {r['cases']}/{len(CASES[lang])} | "
        f"{r['chars_s']:,.0f} | "
        f"{r['long_s']:.2f} s |",
        flush=True,
      )
  return table


if __name__ == "__main__":
  main(sys.argv[1:])
