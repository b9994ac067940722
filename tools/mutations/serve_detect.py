"""t2t-serve's language detection (source=auto, /detect): the served languages only, the
order of the candidates, the answer for text with nothing to go on, LibreTranslate's scale."""

from tools.mutations import Mutation

M = Mutation
DETECT = "t2t_jax/serve/detect.py"
FIRST = ("tests/test_serve_detect.py",)
MUTATIONS = (
  M(
    "detect_unrestricted",
    "detection chooses among all the library's languages, not only the served ones",
    DETECT,
    "identifier.set_languages(list(codes))",
    "identifier.set_languages(None)",
    FIRST,
  ),
  M(
    "detect_least_likely_first",
    "the candidates come least likely first: best() answers the least likely language",
    DETECT,
    "key=lambda pair: (-pair[1], self._order[pair[0]])",
    "key=lambda pair: (pair[1], self._order[pair[0]])",
    FIRST,
  ),
  M(
    "detect_ties_in_reverse_order",
    "equal confidences (no evidence) go to the last served language, not the first",
    DETECT,
    "key=lambda pair: (-pair[1], self._order[pair[0]])",
    "key=lambda pair: (-pair[1], -self._order[pair[0]])",
    FIRST,
  ),
  M(
    "detect_no_letter_confident",
    "a text with no letter (empty, digits, emoji) is answered with full confidence",
    DETECT,
    "if not has_letter(text):\n      return [(self.languages[0], 0.0)]",
    "if not has_letter(text):\n      return [(self.languages[0], 1.0)]",
    FIRST,
  ),
  M(
    "detect_percent_as_fraction",
    "LibreTranslate's confidence goes out as a fraction (0.9), not a percentage (90.0)",
    DETECT,
    "return float(round(confidence * 100))",
    "return float(round(confidence, 2))",
    FIRST,
  ),
)
