"""t2t_jax.serve.detect: which served language a text is in (source=auto, /detect).

Checked: the right language on unambiguous sentences, answers only among the served languages,
the one-language and no-letter answers, odd text (lone surrogates, NULs, 10,000 characters,
emoji) that never raises, confidences sorted and in [0, 1], concurrent calls, LibreTranslate's
percentages, and accuracy on a held-out sample of ../shared/data (tools/detect_benchmark.py
measures the same sample, larger). Tests that need the library skip without py3langid.
"""

import math
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from t2t_jax.serve import detect
from tests import support
from tools import detect_benchmark

NEEDS = "language detection needs py3langid (the serve extra: pip install 't2t_jax[serve]')"

SENTENCES = {
  "en": (
    "The weather is lovely today, so we are going for a walk in the park.",
    "Where is the nearest train station?",
    "She has been working at the hospital for three years.",
  ),
  "de": (
    "Das Wetter ist heute schön, deshalb gehen wir im Park spazieren.",
    "Wo ist der nächste Bahnhof?",
    "Sie arbeitet seit drei Jahren im Krankenhaus.",
  ),
  "fr": (
    "Il fait beau aujourd'hui, alors nous allons nous promener dans le parc.",
    "Où se trouve la gare la plus proche ?",
    "Elle travaille à l'hôpital depuis trois ans.",
  ),
}
NO_LETTER = ("", " ", " \n\t ", "123 456", "3.14, 2.71!", "?!…", "😀🎉👍", "\x00\x00", "\ud800")
ODD = (
  *NO_LETTER,
  "a\ud800b",
  "\udfff Hallo",
  "Hallo\x00Welt",
  "x" * 10_000,
  "Das ist ein langer Satz. " * 400,
  "\u200b\u200bok",
  "e\u0301\u0301\u0301",
  "ÄÖÜ" * 50,
  "日本語のテキスト",
  "ok",
)


def _load(languages):
  pytest.importorskip("py3langid", reason=NEEDS)
  return detect.Detector(languages)


@pytest.fixture(scope="module")
def en_de():
  return _load(["en", "de"])


@pytest.fixture(scope="module")
def en_de_fr():
  return _load(["en", "de", "fr"])


def _well_formed(found, served):
  codes = [code for code, _ in found]
  confidences = [c for _, c in found]
  assert set(codes) <= set(served) and len(set(codes)) == len(codes), found
  assert all(isinstance(c, float) and 0.0 <= c <= 1.0 for c in confidences), found
  assert confidences == sorted(confidences, reverse=True), found
  assert math.fsum(confidences) <= 1.0 + 1e-9, found


def test_one_language_answers_it_without_the_library():
  # 'tlh' is unknown to any detection library: nothing is loaded, nothing is checked.
  d = detect.Detector(["tlh"])
  for text in ("Hello, how are you?", "Wo ist der Bahnhof?", "", "123", "\ud800"):
    assert d.detect(text) == [("tlh", 1.0)]
  assert d.best("Bonjour") == ("tlh", 1.0)
  assert detect.as_libretranslate(d.detect("x")) == [{"confidence": 100.0, "language": "tlh"}]


def test_repeats_dropped_and_none_refused():
  assert detect.Detector(["de", "de"]).languages == ("de",)
  with pytest.raises(ValueError, match="at least one"):
    detect.Detector([])


def test_unknown_code_named():
  pytest.importorskip("py3langid", reason=NEEDS)
  with pytest.raises(ValueError, match=r"'xx', 'zt'.*it knows .*\ben\b"):
    detect.Detector(["en", "xx", "zt"])


@pytest.mark.parametrize("language", ["en", "de"])
def test_right_language_among_en_de(en_de, language):
  for text in SENTENCES[language]:
    found = en_de.detect(text)
    assert found[0][0] == language and found[0][1] > 0.9, (text, found)
    assert en_de.best(text) == found[0]
    _well_formed(found, en_de.languages)
    assert {code for code, _ in found} == {"en", "de"}


@pytest.mark.parametrize("language", ["en", "de", "fr"])
def test_right_language_among_en_de_fr(en_de_fr, language):
  for text in SENTENCES[language]:
    assert en_de_fr.best(text)[0] == language, (text, en_de_fr.detect(text))


def test_answers_only_among_the_served_languages(en_de):
  for text in SENTENCES["fr"]:
    found = en_de.detect(text)
    assert {code for code, _ in found} == {"en", "de"}, found
    assert en_de.best(text)[0] in ("en", "de")
    _well_formed(found, en_de.languages)


def test_no_letter_is_the_first_language_with_confidence_0(en_de):
  for text in NO_LETTER:
    assert en_de.detect(text) == [("en", 0.0)], repr(text)
  assert detect.as_libretranslate(en_de.detect("")) == [{"confidence": 0.0, "language": "en"}]


def test_no_letter_answer_follows_the_served_order():
  d = _load(["de", "en"])
  assert d.best("  42 ") == ("de", 0.0)
  # Text with letters the model has no feature for: uniform, the tie in served order.
  assert d.best("ok") == ("de", 0.5)


def test_odd_text_never_raises(en_de):
  for text in ODD:
    _well_formed(en_de.detect(text), en_de.languages)
  assert en_de.best("Das ist ein langer Satz. " * 400)[0] == "de"


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60))
def test_any_text_gives_sorted_confidences_in_range(en_de_fr, text):
  found = en_de_fr.detect(text)
  _well_formed(found, en_de_fr.languages)
  assert found[0] == en_de_fr.best(text)


def test_concurrent_calls_agree_with_one_at_a_time(en_de_fr):
  texts = [t for group in SENTENCES.values() for t in group] + list(ODD)
  expected = [en_de_fr.detect(t) for t in texts]
  got, errors = {}, []

  def run(k):
    try:
      for _ in range(20):
        got[k] = [en_de_fr.detect(t) for t in texts]
    except Exception as e:  # a thread's exception would be lost: kept for the assert
      errors.append((k, e))

  threads = [threading.Thread(target=run, args=(k,)) for k in range(8)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert not errors
  assert all(got[k] == expected for k in range(8))


def test_as_libretranslate_percentages():
  found = [("de", 0.904), ("en", 0.09), ("fr", 0.004), ("es", 0.002)]
  assert detect.as_libretranslate(found) == [
    {"confidence": 90.0, "language": "de"},
    {"confidence": 9.0, "language": "en"},
  ]
  four = [("en", 0.4), ("de", 0.3), ("fr", 0.2), ("es", 0.1)]
  assert [d["language"] for d in detect.as_libretranslate(four)] == ["en", "de", "fr"]
  assert detect.percent(0.995) == 100.0 and isinstance(detect.percent(0.5), float)


# Measured on this sample (tools/detect_benchmark.sample, 100 lines a cell, py3langid 0.4.0):
# {en, de}: short 97.2%, medium and long 100%, prefix 98.5%; {en, de, fr}: short 96.7%,
# prefix 98.0%. The thresholds leave room for another py3langid release, not for a broken one.
THRESHOLDS = {"short": 94.0, "medium": 99.0, "long": 99.0, "prefix": 95.0}


@pytest.mark.parametrize("served", ["en_de", "en_de_fr"])
def test_accuracy_on_held_out_text(served, request):
  shared = support.shared_data_dir()
  if not (shared / "tatoeba_deu_eng").is_dir():
    pytest.skip(f"offline corpora not found at {shared}")
  d = request.getfixturevalue(served)
  right = {}
  for _, language, cell, text in detect_benchmark.sample(str(shared), 100):
    counts = right.setdefault(cell, [0, 0])
    counts[0] += d.best(text)[0] == language
    counts[1] += 1
  assert set(right) == set(THRESHOLDS)
  accuracy = {cell: 100 * r / n for cell, (r, n) in right.items()}
  assert all(accuracy[cell] >= THRESHOLDS[cell] for cell in THRESHOLDS), accuracy
