"""t2t_jax.evaluation.scoring against the sacrebleu command line and hand-counted BLEU."""

import math
import subprocess
import sys

import pytest

from t2t_jax.evaluation import scoring

HYPS = [
  "Die Katze saß auf der Matte.",
  "Das ist ein state-of-the-art System, sagte er.",
  "Sie sagte: «Das kostet 1.000,50 €!»",
  "Im Jahr 2017 kamen 2-3 Besucher.",
]
REFS = [
  "Die Katze saß auf einer Matte.",
  "Das ist ein State-of-the-Art-System, sagte er.",
  "Sie sagte: «Das kostet 1.000,50 Euro!»",
  "2017 kamen zwei bis drei Besucher.",
]


def test_references_score_100_against_themselves():
  scores = scoring.score_all(REFS, REFS)
  assert scores["sacrebleu"].score == pytest.approx(100.0)
  assert scores["tokenized_bleu"].score == pytest.approx(100.0)
  assert scores["lowercased_bleu"].score == pytest.approx(100.0)
  assert scores["chrf"].score == pytest.approx(100.0)


def test_sacrebleu_figure_and_signature_equal_the_command_line_tool(tmp_path):
  (tmp_path / "hyp.txt").write_text("\n".join(HYPS) + "\n", encoding="utf-8")
  (tmp_path / "ref.txt").write_text("\n".join(REFS) + "\n", encoding="utf-8")
  out = subprocess.run(
    [
      sys.executable,
      "-m",
      "sacrebleu",
      str(tmp_path / "ref.txt"),
      "-i",
      str(tmp_path / "hyp.txt"),
      "-m",
      "bleu",
      "chrf",
      "-f",
      "text",
      "-w",
      "4",
    ],
    check=True,
    capture_output=True,
    text=True,
    encoding="utf-8",
  ).stdout.splitlines()
  cli = {}
  for line in out:  # "BLEU|nrefs:1|...|version:2.6.0 = 40.0162 84.6/63.6/..."
    signature, rest = line.split(" = ", 1)
    signature = signature.strip()  # the tool right-aligns the signatures
    cli[signature.split("|")[0]] = (signature, float(rest.split()[0]))
  bleu, chrf = scoring.sacrebleu_score(HYPS, REFS), scoring.chrf_score(HYPS, REFS)
  assert 10 < bleu.score < 90  # a non-trivial test pair
  assert (bleu.signature, float(f"{bleu.score:.4f}")) == cli["BLEU"]
  assert (chrf.signature, float(f"{chrf.score:.4f}")) == cli["chrF2"]
  assert "tok:13a" in bleu.signature and "case:mixed" in bleu.signature


def test_tokenized_bleu_equals_hand_counted_corpus_bleu():
  """Counts written out from the tokens below; BLEU = BP * (p1 p2 p3 p4)^(1/4), no smoothing.

  hyp 1: Das ist ein Top ##AT##-##AT## Modell .               (7 tokens)
  ref 1: Das ist das Top ##AT##-##AT## Modell .               (7)
    1-grams 6/7 (not "ein"); 2-grams 4/6 (Das ist, Top AT, AT Modell, Modell .);
    3-grams 2/5 (Top AT Modell, AT Modell .); 4-grams 1/4 (Top AT Modell .).
  hyp 2: Er kam 2 ##AT##-##AT## 3 Mal .                       (7)
  ref 2: Er kam 2 ##AT##-##AT## 3 Mal , sagt sie .            (10)
    1-grams 7/7; 2-grams 5/6 (not "Mal ."); 3-grams 4/5; 4-grams 3/4.
  Corpus: 13/14, 9/12, 6/10, 4/8; hyp length 14 < ref length 17: BP = exp(1 - 17/14).
  (Without the compound split "2-3" would be one token, the counts different.)
  """
  hyps = ["Das ist ein Top-Modell.", "Er kam 2-3 Mal."]
  refs = ["Das ist das Top-Modell.", "Er kam 2-3 Mal, sagt sie."]
  expected = 100 * math.exp(1 - 17 / 14) * (13 / 14 * 9 / 12 * 6 / 10 * 4 / 8) ** 0.25
  assert scoring.tokenized_bleu(hyps, refs).score == pytest.approx(expected, rel=1e-9)


def test_tokenized_bleu_is_not_smoothed():
  """1-3-gram precisions 3/4, 2/3, 1/2 but no 4-gram match: unsmoothed BLEU is 0."""
  assert scoring.tokenized_bleu(["a b c d"], ["a b c e"]).score == 0.0
  assert scoring.sacrebleu_score(["a b c d"], ["a b c e"]).score > 0.0  # exp smoothing


def test_lowercased_bleu_equals_hand_counted_corpus_bleu():
  """Case is ignored (DAS/Das, Top/top, Er/er count as matches), hyphenated words stay
  whole, no smoothing.

  hyp 1: das ist ein top-modell .       ref 1: das ist das top-modell .      (5 tokens each)
    1-grams 4/5 (not "ein"); 2-grams 2/4 (das ist, top-modell .); 3-grams 0/3; 4-grams 0/2.
  hyp 2: er kam 2-3 mal .               ref 2: er kam 2-3 mal , sagt sie .   (5 vs 8)
    1-grams 5/5; 2-grams 3/4 (not "mal ."); 3-grams 2/3; 4-grams 1/2.
  Corpus: 9/10, 5/8, 2/6, 1/4; hyp length 10 < ref length 13: BP = exp(1 - 13/10).
  """
  hyps = ["DAS ist ein Top-Modell.", "Er kam 2-3 Mal."]
  refs = ["Das ist das top-Modell.", "er kam 2-3 Mal, sagt sie."]
  expected = 100 * math.exp(1 - 13 / 10) * (9 / 10 * 5 / 8 * 2 / 6 * 1 / 4) ** 0.25
  score = scoring.lowercased_bleu(hyps, refs)
  assert score.score == pytest.approx(expected, rel=1e-9)
  assert "case:lc|eff:no|tok:moses-de|smooth:none" in score.signature


def test_split_compounds():
  mark = " ##AT##-##AT## "
  assert (
    scoring.split_compounds("state-of-the-art")
    == "state" + mark + "of" + mark + "the" + mark + "art"
  )
  assert scoring.split_compounds("2-3 Mal") == "2" + mark + "3 Mal"
  # Only hyphens between two non-spaces; free-standing dashes stay.
  assert scoring.split_compounds("so - und -so") == "so - und -so"
  # Like the perl one-liner, matches do not overlap: a one-character part keeps its 2nd hyphen.
  assert scoring.split_compounds("a-b-c") == "a" + mark + "b-c"


@pytest.mark.parametrize(
  "text, tokens",
  [
    (
      "A state-of-the-art system, really!",
      [
        "A",
        "state",
        "##AT##-##AT##",
        "of",
        "##AT##-##AT##",
        "the",
        "##AT##-##AT##",
        "art",
        "system",
        ",",
        "really",
        "!",
      ],
    ),
    # Punctuation inside numbers stays; symbols and quotes are split off.
    (
      "Sie sagte: «Das kostet 1.000,50 €!»",
      ["Sie", "sagte", ":", "«", "Das", "kostet", "1.000,50", "€", "!", "»"],
    ),
    ("Im Jahr 2017.", ["Im", "Jahr", "2017", "."]),
    # tokenizer.perl escapes XML characters by default (get_ende_bleu.sh keeps that).
    ("(x) $5 don't & co", ["(", "x", ")", "$", "5", "don", "&apos;", "t", "&amp;", "co"]),
  ],
)
def test_tokenize_for_bleu(text, tokens):
  assert scoring.tokenize_for_bleu(text) == tokens


def test_count_mismatch_names_both_counts():
  for fn in [
    scoring.sacrebleu_score,
    scoring.tokenized_bleu,
    scoring.lowercased_bleu,
    scoring.chrf_score,
    scoring.score_all,
  ]:
    with pytest.raises(ValueError, match="3 hypotheses but 2 references"):
      fn(["a", "b", "c"], ["a", "b"])


def test_format_scores_lists_the_labelled_figures_in_order():
  text = scoring.format_scores(scoring.score_all(REFS, REFS))
  lines = text.splitlines()
  assert [line.split("  ")[0] for line in lines] == [
    "sacreBLEU (cased, 13a)",
    "tokenized BLEU (Moses, compound-split)",
    "lowercased BLEU (Moses tokens)",
    "chrF",
  ]
  assert all(" 100.00  " in line for line in lines)
  assert "BLEU|nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:" in lines[0]
  assert "tok:moses-de+compound-split|smooth:none" in lines[1]
  assert "case:lc|eff:no|tok:moses-de|smooth:none" in lines[2]
  assert lines[3].split()[-1].startswith("chrF2|")
