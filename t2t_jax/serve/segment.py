"""A text as the sentences a model translates, and the translations put back in its layout.

The model is trained on sentences and reads at most max_len tokens, so a paragraph sent whole
is translated worse and a long one is cut. `split_text` takes a text apart: paragraphs (blank
lines) -> lines -> sentences (sentencex, rule-based, for the text's language) -> pieces (a
sentence over the token budget, cut at spaces, `split_long`). `join` puts translations back
in the same places: every line end, blank line and line's leading and trailing whitespace as
in the text, sentences joined by the whitespace that separated them. No HTTP and no model here
(tests/test_serve_segment.py); tools/segment_benchmark.py measures the segmenters compared.

    >>> segments = split_text("Dr. Smith came. He left.\\n\\n  Bye!", "en")
    >>> segments.sentences
    ('Dr. Smith came.', 'He left.', 'Bye!')
    >>> join(segments, ["Dr. Smith kam.", "Er ging.", "Tschüss!"])
    'Dr. Smith kam. Er ging.\\n\\n  Tschüss!'
"""

import dataclasses
import re
import unicodedata
from collections.abc import Callable, Sequence
from typing import Any

import sentencex

from t2t_jax.serve import api

__all__ = ["NO_SPACE", "Gap", "Segments", "Split", "join", "split_long", "split_text"]

# Languages whose script puts no space between sentences (primary subtags): a translation into
# one drops the spaces between sentences, a translation out of one puts a space there.
NO_SPACE = frozenset({"zh", "ja", "yue", "lzh", "wuu", "gan", "hak"})

_WORD = re.compile(r"\S+")  # Python's \s is str.isspace, the whitespace str.strip removes
_SURROGATE = re.compile("[\ud800-\udfff]")
_JOINERS = frozenset("\u200d\u034f")  # zero-width joiner, combining grapheme joiner


@dataclasses.dataclass(frozen=True)
class Gap:
  """The source's whitespace between two sentences of a line or two pieces of a sentence.
  glue: a cut inside a word (no whitespace there), whose pieces' translations are joined with
  nothing whatever the target language."""

  text: str
  glue: bool = False


@dataclasses.dataclass(frozen=True)
class Split:
  """A sentence as pieces within a token budget: pieces[0] + gaps[0].text + pieces[1] + ... is
  the sentence exactly. split: whether it was cut (the count the server logs)."""

  pieces: tuple[str, ...]
  gaps: tuple[Gap, ...] = ()

  @property
  def split(self) -> bool:
    return len(self.pieces) > 1

  def join(self, translations: Sequence[str], target: str | None = None) -> str:
    """The pieces' translations joined as the pieces were (`join`'s rule for `target`)."""
    if len(translations) != len(self.pieces):
      raise ValueError(f"{len(translations)} translations for {len(self.pieces)} pieces")
    out = [translations[0]]
    for gap, text in zip(self.gaps, translations[1:]):
      out += [_gap_text(gap, target), text]
    return "".join(out)


@dataclasses.dataclass(frozen=True)
class Segments:
  """A text taken apart by `split_text`.

  sentences: what goes to the model, in order (an over-long sentence as its pieces); layout:
  the text as its parts, in order: an int i is the translation of sentences[i], a str is kept
  as it is (a line end, a blank line, a line's leading or trailing whitespace), a Gap is the
  whitespace between two sentences or pieces; split: how many sentences were cut into pieces
  to fit the token budget; language: the code whose rules segmented it."""

  sentences: tuple[str, ...]
  layout: tuple[str | int | Gap, ...]
  split: int = 0
  language: str = "en"


def _rules(language: str) -> str:
  """sentencex's code for a language: its primary subtag, lower case (sentencex knows 'de'
  but not 'de-AT' or 'DE', and would read those with English rules)."""
  return re.split(r"[-_]", language.strip().lower(), maxsplit=1)[0] or "en"


def _gap_text(gap: Gap, target: str | None) -> str:
  """A gap as a translation into `target` writes it: as in the source (target None); without
  its spaces in a language that puts none between sentences; a space where the source, such a
  language, had none and the target puts one; other whitespace (a tab) as it was."""
  if target is None or gap.glue:
    return gap.text
  if _rules(target) in NO_SPACE:
    return "" if gap.text.strip(" ") == "" else gap.text
  return gap.text or " "


def _sentence_spans(line: str, rules: str) -> list[tuple[int, int]]:
  """(start, end) of each sentence of a line without its leading and trailing whitespace: the
  text between two consecutive starts sentencex found, stripped. A line sentencex cannot read
  (it refuses lone surrogates) or answers in a shape other than consecutive spans is one
  sentence: nothing is ever dropped."""
  # sentencex takes UTF-8 only: a lone surrogate (JSON's "\ud800") becomes U+FFFD, one code
  # point for one, so that its offsets stay the line's.
  readable = _SURROGATE.sub("\ufffd", line)
  try:
    found = sentencex.get_sentence_boundaries(rules, readable)
    starts = sorted({int(b["start_index"]) for b in found} | {0})
  except Exception:  # a segmenter's failure costs the line its sentence split, not the request
    starts = [0]
  if starts[0] < 0 or starts[-1] > len(line):
    starts = [0]
  ends = starts[1:] + [len(line)]
  spans = []
  for start, end in zip(starts, ends):
    piece = line[start:end]
    lead = len(piece) - len(piece.lstrip())
    core = piece.strip()
    if core:
      spans.append((start + lead, start + lead + len(core)))
  return spans


def _keeps_together(before: str, c: str, run: int) -> bool:
  """Whether a cut between `before` and `c` would break a grapheme: before a combining or
  enclosing mark, a variation selector, an emoji modifier or tag, around a joiner, or inside
  a flag (two regional indicators; run: how many stand just before c)."""
  if unicodedata.category(c) in ("Mn", "Mc", "Me") or c in _JOINERS or before in _JOINERS:
    return True
  if (
    "\ufe00" <= c <= "\ufe0f"
    or "\U0001f3fb" <= c <= "\U0001f3ff"
    or "\U000e0020" <= c <= "\U000e007f"
  ):
    return True
  return _regional(c) and run % 2 == 1


def _regional(c: str) -> bool:
  return "\U0001f1e6" <= c <= "\U0001f1ff"


def _cuts(word: str, graphemes: bool) -> list[int]:
  """Where a word may be cut, ascending, ending with len(word): between any two code points,
  or (graphemes) only where `_keeps_together` allows, so that an accented letter or an emoji
  sequence stays whole."""
  if not graphemes:
    return list(range(1, len(word) + 1))
  cuts, run = [], int(_regional(word[0])) if word else 0
  for i in range(1, len(word)):
    if not _keeps_together(word[i - 1], word[i], run):
      cuts.append(i)
    run = run + 1 if _regional(word[i]) else 0
  return cuts + [len(word)]


def _longest(
  fits: Callable[[str], bool], text: str, start: int, ends: Sequence[int], first: int
) -> int:
  """The largest k with fits(text[start:ends[first + k - 1]]), ends ascending, searched by
  doubling then halving (a few calls of count_tokens a piece, not one per word); 0 when not
  even ends[first] fits. Only a k that fits is returned, so a count_tokens that is not
  monotonic costs pieces, never the budget."""
  count = len(ends) - first
  if count < 1 or not fits(text[start : ends[first]]):
    return 0
  lo, hi = 1, 2
  while hi <= count and fits(text[start : ends[first + hi - 1]]):
    lo, hi = hi, hi * 2
  hi = min(hi, count + 1)
  while hi - lo > 1:
    mid = (lo + hi) // 2
    if fits(text[start : ends[first + mid - 1]]):
      lo = mid
    else:
      hi = mid
  return lo


def _cut_word(word: str, fits: Callable[[str], bool], graphemes: bool = True) -> list[str]:
  """A word too long for the budget as consecutive pieces that each fit; a grapheme that does
  not fit is cut between its code points, a code point that does not fit is a piece alone (the
  model cuts it, as it would have cut the sentence)."""
  cuts = _cuts(word, graphemes)
  pieces, start, p = [], 0, 0  # cuts[p] is the first cut after start
  while p < len(cuts):
    k = _longest(fits, word, start, cuts, p)
    if k:
      pieces.append(word[start : cuts[p + k - 1]])
    elif graphemes:
      pieces += _cut_word(word[start : cuts[p]], fits, graphemes=False)
    else:
      pieces.append(word[start : cuts[p]])
    start, p = cuts[p + max(k, 1) - 1], p + max(k, 1)
  return pieces


def split_long(sentence: str, count_tokens: Callable[[str], int], max_tokens: int) -> Split:
  """A sentence as pieces of at most max_tokens tokens by count_tokens: itself when it fits,
  else cut at whitespace (as few pieces as the greedy choice gives), and a word that alone is
  over the budget cut between characters (never inside an accented letter or an emoji
  sequence unless one of those alone is over it). The pieces and gaps give back the sentence
  exactly; whitespace at its ends stays on the first and last pieces. A single code point
  over the budget is a piece of its own, the only piece that can be over it.

  For the server: count_tokens is the tokenizer's len(encode(s)) and max_tokens the model's
  max_len - 1 (the source's EOS)."""
  if max_tokens < 1:
    raise ValueError(f"max_tokens={max_tokens}: at least 1 token a piece")
  fits = lambda text: count_tokens(text) <= max_tokens
  if fits(sentence):
    return Split((sentence,))
  words = [m.span() for m in _WORD.finditer(sentence)]
  if not words:  # whitespace alone over the budget: cut as one word
    words = [(0, len(sentence))]
  # A word's text runs from the end of the gap before it (the sentence's start for the first)
  # to its end (the sentence's end for the last), so that pieces and gaps tile the sentence.
  starts = [0] + [start for start, _ in words[1:]]
  ends = [end for _, end in words[:-1]] + [len(sentence)]
  pieces: list[str] = []
  gaps: list[Gap] = []
  i = 0
  while i < len(words):
    if i:
      gaps.append(Gap(sentence[ends[i - 1] : starts[i]]))
    k = _longest(fits, sentence, starts[i], ends, i)
    if k:
      pieces.append(sentence[starts[i] : ends[i + k - 1]])
      i += k
      continue
    cut = _cut_word(sentence[starts[i] : ends[i]], fits)
    pieces += cut
    gaps += [Gap("", glue=True)] * (len(cut) - 1)
    i += 1
  return Split(tuple(pieces), tuple(gaps))


def split_text(
  text: str,
  language: str,
  count_tokens: Callable[[str], int] | None = None,
  max_tokens: int | None = None,
) -> Segments:
  """A text's sentences and layout. Lines are api.split_lines's (LF; the server normalises
  CR and CRLF in form bodies first, and a CR left in a JSON text stays at its line's end);
  a blank or whitespace-only line is not translated and comes back as it was, and no sentence
  runs across a line end. Sentences follow sentencex's rules for `language` (its primary
  subtag: 'de-AT' reads as 'de'); a language sentencex has no rules for is read through its
  fallback chain, and with English rules when that has none. Chinese and Japanese sentences
  end at 。！？ with nothing between them.

  With count_tokens and max_tokens, each sentence over the budget is cut by `split_long`
  (Segments.split counts them); without, sentences go whole."""
  if (count_tokens is None) != (max_tokens is None):
    raise ValueError("count_tokens and max_tokens go together")
  rules = _rules(language)
  sentences: list[str] = []
  layout: list[str | int | Gap] = []
  split = 0
  for number, line in enumerate(api.split_lines(text)):
    if number:
      layout.append("\n")
    if not api.translatable(line):
      if line:
        layout.append(line)
      continue
    spans = _sentence_spans(line, rules)
    if spans[0][0]:
      layout.append(line[: spans[0][0]])
    for j, (start, end) in enumerate(spans):
      if j:
        layout.append(Gap(line[spans[j - 1][1] : start]))
      cut = (
        split_long(line[start:end], count_tokens, max_tokens)
        if count_tokens is not None and max_tokens is not None
        else Split((line[start:end],))
      )
      split += cut.split
      for k, piece in enumerate(cut.pieces):
        if k:
          gap = cut.gaps[k - 1]
          # Cut between characters of a script without spaces is cut between its words: a
          # translation into a language with spaces puts one there.
          layout.append(Gap("") if gap.glue and rules in NO_SPACE else gap)
        layout.append(len(sentences))
        sentences.append(piece)
    if spans[-1][1] < len(line):
      layout.append(line[spans[-1][1] :])
  return Segments(tuple(sentences), tuple(layout), split, rules)


def join(segments: Segments, translations: Sequence[str], target: str | None = None) -> str:
  """The text of `segments` with translations[i] in place of sentences[i]: line ends, blank
  lines and each line's leading and trailing whitespace as in the text. Between sentences
  (and the pieces of a cut one) the source's whitespace; with `target`, the target language's
  custom where the source's differs: no space between sentences in Chinese or Japanese, one
  space in the others after a source in one of those. Without target, identity translations
  give back the text exactly."""
  if len(translations) != len(segments.sentences):
    raise ValueError(f"{len(translations)} translations for {len(segments.sentences)} sentences")
  out = []
  for part in segments.layout:
    if isinstance(part, int):
      out.append(translations[part])
    elif isinstance(part, Gap):
      out.append(_gap_text(part, target))
    else:
      out.append(part)
  return "".join(out)


def put_back(
  segments: Sequence[Segments],
  results: Sequence[Any],
  alternatives: int = 0,
  target: str | None = None,
) -> tuple[list[str], list[list[str]]]:
  """(translation per text, alternatives per text) from the results of every text's
  sentences in order (strings, or with alternatives lists of hypotheses with .text), each
  text in its own layout (`join`)."""
  count = sum(len(s.sentences) for s in segments)
  if len(results) != count:
    raise ValueError(f"{len(results)} results for {count} sentences")
  it = iter(results)
  best, alts = [], []
  for one in segments:
    found = [next(it) for _ in one.sentences]
    text, others = api.assemble(
      found, alternatives, lambda parts, one=one: join(one, parts, target)
    )
    best.append(text)
    alts.append(others)
  return best, alts
