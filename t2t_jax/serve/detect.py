"""Which of the served languages a text is in: for `source=auto` and LibreTranslate's /detect.

Pure (no HTTP, no model): a `Detector` is built once for the served languages (the source
languages of the server's models) and answers only among them, whatever language the text is
really in. The library is py3langid, chosen over lingua-language-detector by measurement
(tools/detect_benchmark.py): on held-out Tatoeba, Multi30k and newstest text it was as accurate
or more at every length, short text included, at a twentieth of the installed size, with less
memory and less time per call.

Confidences are fractions in [0, 1]; LibreTranslate answers percentages, which
`as_libretranslate` gives. Two answers come without asking the library:
- one served language: that language, confidence 1 (nothing to choose between); the library
  is then not loaded, nor needed installed;
- a text with no letter (empty, spaces, digits, punctuation, emoji): the first served
  language, confidence 0. LibreTranslate answers ("en", 0) there, whether or not it serves
  English; the first served language is the same answer for a server that does.
"""

import math
import threading
from collections.abc import Sequence
from typing import Any

# Enough to tell languages apart (text of 100 characters or more was detected right 99.9% of
# the time), and a bound on the time of one call: py3langid walks the text's bytes in Python,
# holding the GIL, so a text of a megabyte would stall every other thread of the server.
MAX_CHARS = 1000
# LibreTranslate's /detect lists at most this many candidates (libretranslate/detect.py).
LIBRETRANSLATE_CANDIDATES = 3


def has_letter(text: str) -> bool:
  return any(ch.isalpha() for ch in text)


class Detector:
  """Language detection restricted to `languages` (codes as the library names them: ISO 639-1
  where there is one); the first is the answer when a text gives nothing to go on."""

  def __init__(self, languages: Sequence[str]) -> None:
    codes = tuple(dict.fromkeys(languages))  # order kept, repeats dropped
    if not codes:
      raise ValueError("language detection needs at least one language")
    self.languages = codes
    self._order = {code: i for i, code in enumerate(codes)}
    self._identifier = None if len(codes) == 1 else _identifier(codes)
    # py3langid says nothing about threads. Its 0.4.0 classify only reads the identifier, but
    # set_languages rewrites it in place; the lock keeps concurrent calls safe whatever a later
    # version does inside, and costs little: the byte walk holds the GIL anyway.
    self._lock = threading.Lock()

  def detect(self, text: str) -> list[tuple[str, float]]:
    """Every served language with its confidence, most likely first (ties in served order);
    confidences in [0, 1], summing to 1. A text with no letter in its first MAX_CHARS
    characters: [(first language, 0.0)]."""
    if self._identifier is None:
      return [(self.languages[0], 1.0)]
    text = text[:MAX_CHARS]
    if not has_letter(text):
      return [(self.languages[0], 0.0)]
    with self._lock:
      ranked = self._identifier.rank(text)
    # The identifier answers only among the served languages (set_languages); its float32
    # probabilities are clipped and summed again in float64 so that they stay within [0, 1].
    found = [(code, min(max(float(score), 0.0), 1.0)) for code, score in ranked]
    total = math.fsum(confidence for _, confidence in found)
    if not total > 0:  # no evidence at all (not seen from py3langid 0.4.0, which is uniform)
      return [(self.languages[0], 0.0)]
    found = [(code, confidence / total) for code, confidence in found]
    return sorted(found, key=lambda pair: (-pair[1], self._order[pair[0]]))

  def best(self, text: str) -> tuple[str, float]:
    """The most likely served language and its confidence."""
    return self.detect(text)[0]


def _identifier(codes: tuple[str, ...]) -> Any:
  """py3langid's identifier with probabilities, restricted to `codes`; ValueError naming any
  code it does not know."""
  from py3langid.langid import MODEL_FILE, LanguageIdentifier

  # An identifier of its own: py3langid.set_languages would restrict the module's shared one.
  identifier = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
  unknown = [code for code in codes if code not in identifier.labels]
  if unknown:
    raise ValueError(
      f"language detection (py3langid) does not know {', '.join(map(repr, unknown))};"
      f" it knows {', '.join(sorted(identifier.labels))}"
    )
  identifier.set_languages(list(codes))
  return identifier


def percent(confidence: float) -> float:
  """LibreTranslate's confidence: a whole percentage, as a float (round(conf * 100))."""
  return float(round(confidence * 100))


def as_libretranslate(found: Sequence[tuple[str, float]]) -> list[dict[str, Any]]:
  """/detect's answer for one text: [{"confidence": 90.0, "language": "en"}, ...], at most
  three, most likely first; candidates that round to 0% are left out after the first, as
  LibreTranslate's detector reports only languages it found some evidence for."""
  out = []
  for i, (code, confidence) in enumerate(found[:LIBRETRANSLATE_CANDIDATES]):
    if i and percent(confidence) == 0:
      break
    out.append({"confidence": percent(confidence), "language": code})
  return out
