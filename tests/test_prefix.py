"""Target prefixes: outputs start with the prefix for greedy, beam and sampling, a prefix of
the model's own greedy tokens changes nothing, scores count the prefix, unconstrained decoding
is what it was, and a prefix file of another length is refused naming both files."""

import numpy as np
import pytest

from t2t_jax.cli import translate as translate_cli
from t2t_jax.decoding import SearchConfig, scoring, search_batch
from t2t_jax.decoding.translator import TranslateError, Translator
from t2t_jax.run.workdir import Workdir
from tests import support
from tests.test_sampling import _translate
from tests.test_score import _IdTokenizer
from tests.test_train import small_config

SOURCES = ["5 6 7", "9 8 7 6 5 4", "12", "20 21 22 23 24 25 26"]
PREFIXES = ["7 8 9", "", "30", "11 12 13 14 15 16 17 18 19 20 21 22 23 24"]
SEARCHES = {
  "greedy": SearchConfig(beam_size=1),
  "beam": SearchConfig(beam_size=4),
  "sampling": SearchConfig(beam_size=1, sampling=True, num_samples=3, sampling_topk=10),
}

# search_batch's outputs (tokens up to EOS per hypothesis, float32 scores as float.hex) for
# INPUTS, LIMITS and small_model(seed=3), written by the search before it took prefixes.
INPUTS = np.array(
  [
    [5, 6, 7, 1, 0, 0, 0, 0],
    [9, 8, 7, 6, 5, 4, 1, 0],
    [12, 1, 0, 0, 0, 0, 0, 0],
    [20, 21, 22, 23, 24, 25, 26, 1],
  ],
  np.int32,
)
LIMITS = np.array([10, 12, 6, 16], np.int32)
BEFORE = {
  "greedy": (
    [
      [[10, 10, 10, 10, 10, 10, 10, 10, 10, 1]],
      [[1]],
      [[31, 31, 31, 31, 31, 1]],
      [[11, 11, 11, 11, 11, 11, 11, 11, 11, 11, 11, 11, 11, 11, 11, 1]],
    ],
    [
      ["-0x1.a132d80000000p+3"],
      ["-0x1.363fc20000000p+1"],
      ["-0x1.7e10d80000000p+3"],
      ["-0x1.94f4a00000000p+3"],
    ],
  ),
  "beam": (
    [
      [[1], [3, 1], [3, 3, 1], [29, 1]],
      [[1], [3, 1], [3, 3, 1], [3, 3, 3, 1]],
      [[1], [27, 1], [31, 1], [0, 1]],
      [
        [1],
        [11, 11, 11, 11, 11, 11, 11, 11, 1],
        [11, 11, 11, 11, 11, 11, 11, 1],
        [11, 11, 11, 11, 11, 11, 11, 11, 11, 1],
      ],
    ],
    [
      [
        "-0x1.4cb8640000000p+1",
        "-0x1.0ffb800000000p+2",
        "-0x1.3478980000000p+2",
        "-0x1.4a71ca0000000p+2",
      ],
      [
        "-0x1.363fc20000000p+1",
        "-0x1.04b0bc0000000p+2",
        "-0x1.2bee2e0000000p+2",
        "-0x1.4488840000000p+2",
      ],
      [
        "-0x1.dc10c40000000p+1",
        "-0x1.749f100000000p+2",
        "-0x1.7bccb00000000p+2",
        "-0x1.96dafc0000000p+2",
      ],
      [
        "-0x1.a59ad00000000p+1",
        "-0x1.625c880000000p+2",
        "-0x1.63401e0000000p+2",
        "-0x1.63984e0000000p+2",
      ],
    ],
  ),
  "sampling": (
    [
      [
        [29, 3, 3, 3, 3, 3, 3, 3, 29, 1],
        [27, 27, 27, 7, 7, 10, 10, 10, 10, 1],
        [32, 31, 31, 14, 27, 31, 10, 10, 10, 1],
      ],
      [
        [13, 13, 25, 25, 38, 8, 25, 25, 10, 10, 10, 1],
        [29, 25, 34, 34, 10, 14, 27, 27, 27, 27, 27, 1],
        [29, 25, 29, 17, 10, 10, 34, 10, 25, 10, 10, 1],
      ],
      [[31, 31, 31, 11, 11, 1], [32, 16, 27, 27, 8, 1], [31, 10, 32, 10, 37, 1]],
      [
        [31, 11, 11, 11, 32, 16, 31, 31, 1],
        [37, 3, 10, 31, 22, 3, 3, 3, 3, 3, 1],
        [37, 3, 3, 3, 3, 37, 11, 11, 26, 31, 10, 3, 1],
      ],
    ],
    [
      ["-0x1.ed33700000000p+3", "-0x1.4647780000000p+4", "-0x1.824e080000000p+4"],
      ["-0x1.bd25180000000p+4", "-0x1.cc0c420000000p+4", "-0x1.da70380000000p+4"],
      ["-0x1.abfd180000000p+3", "-0x1.0861440000000p+4", "-0x1.0a08dc0000000p+4"],
      ["-0x1.5791180000000p+4", "-0x1.79da3a0000000p+4", "-0x1.bf2c000000000p+4"],
    ],
  ),
}


@pytest.fixture(scope="module")
def translator():
  return Translator(*support.small_model(seed=3), _IdTokenizer(), batch_tokens=32)


def _trimmed(seqs: np.ndarray) -> list:
  return [[[int(t) for t in np.trim_zeros(h, "b")] for h in row] for row in seqs]


@pytest.mark.parametrize("name", list(SEARCHES))
def test_unconstrained_outputs_are_what_they_were(name):
  model, params = support.small_model(seed=3)
  kw = dict(model=model, max_decode_len=16, search=SEARCHES[name], nbest=True)
  seqs, scores = (np.asarray(x) for x in search_batch(params, INPUTS, LIMITS, **kw))
  want_seqs, want_scores = BEFORE[name]
  assert _trimmed(seqs) == want_seqs
  assert [[float(x).hex() for x in row] for row in scores] == want_scores
  # all-PAD prefixes take the forced-token path and change nothing, bit for bit
  empty = np.zeros((INPUTS.shape[0], 8), np.int32)
  forced = search_batch(params, INPUTS, LIMITS, prefix=empty, **kw)
  np.testing.assert_array_equal(np.asarray(forced[0]), seqs)
  np.testing.assert_array_equal(np.asarray(forced[1]), scores)


@pytest.mark.parametrize("name", list(SEARCHES))
def test_outputs_start_with_the_prefix_and_scores_count_it(translator, name):
  settings = SEARCHES[name]
  got = translator.translate(SOURCES, nbest=settings.hypotheses, search=settings, prefixes=PREFIXES)
  plain = translator.translate(SOURCES, nbest=settings.hypotheses, search=settings)
  for prefix, hyps in zip(PREFIXES, got):
    for h in hyps:  # beam search branches only after the prefix: every hypothesis has it
      assert (h.text + " ").startswith(prefix + " " if prefix else ""), (prefix, h.text)
      assert len(h.text.split()) > len(prefix.split()) or h.text == prefix
  assert got[1] == plain[1]  # an empty prefix leaves its sentence alone
  assert got[0] != plain[0]
  # The forced tokens' log-probs are in the score: rescoring the text gives it back. The
  # untrained model may emit PAD, which the text drops: only the rows whose text has every
  # token (length from the penalty: log_prob / score = ((5 + length) / 6) ** alpha).
  alpha = translator.search.alpha
  best = [(s, hyps[0]) for s, hyps in zip(SOURCES, got)]
  whole = [
    (s, h)
    for s, h in best
    if len(h.text.split()) + 1 == round(6 * (h.log_prob / h.score) ** (1 / alpha) - 5)
  ]
  assert len(whole) >= 2 and any(
    p and s == src for src, p in zip(SOURCES, PREFIXES) for s, _ in whole
  )
  rescored = scoring.Scorer(translator).score([s for s, _ in whole], [h.text for _, h in whole])
  for (_, h), score in zip(whole, rescored):
    assert score.log_prob == pytest.approx(h.log_prob, abs=1e-4)


@pytest.mark.parametrize("k", [1, 2, 4])
def test_a_prefix_of_the_greedy_output_gives_the_greedy_output(translator, k):
  greedy = SEARCHES["greedy"]
  want = translator.translate(SOURCES, nbest=1, search=greedy)
  prefixes = [" ".join(h[0].text.split()[:k]) for h in want]
  assert any(prefixes)
  got = translator.translate(SOURCES, nbest=1, search=greedy, prefixes=prefixes)
  assert [h[0].text for h in got] == [h[0].text for h in want]
  assert [h[0].log_prob for h in got] == pytest.approx([h[0].log_prob for h in want], abs=1e-5)


def test_prefix_count_and_length_are_refused_before_decoding(translator):
  with pytest.raises(TranslateError, match="^prefixes has 1 lines but input has 4$"):
    translator.translate(SOURCES, prefixes=["1"])
  too_long = ["", " ".join(["9"] * 16), "", ""]
  with pytest.raises(TranslateError, match=r"^p.txt: 1 prefix\(es\) leave no room .* \(lines 2\)$"):
    translator.translate(SOURCES, prefixes=too_long, prefix_name="p.txt")


def test_a_prefix_file_of_another_length_is_refused_naming_both_files(tmp_path, monkeypatch):
  with open(Workdir(tmp_path).config_file, "w") as f:  # config.json only: nothing to load
    f.write(small_config().to_json())
  source, prefix = tmp_path / "src.txt", tmp_path / "prefix.txt"
  source.write_text("1 2\n3\n4\n")
  prefix.write_text("1\n\n")
  loaded = []
  monkeypatch.setattr(translate_cli.Translator, "from_workdir", lambda *a, **k: loaded.append(a))
  with pytest.raises(SystemExit) as e:
    _translate(monkeypatch, f"--workdir={tmp_path}", f"--input={source}", f"--prefix={prefix}")
  assert str(e.value) == f"t2t-translate: --prefix={prefix} has 2 lines but --input={source} has 3"
  assert not loaded


@pytest.mark.slow
def test_translate_command_with_a_prefix_file(tmp_path, monkeypatch, capsys):
  workdir = support.small_trained_workdir()
  sources, prefixes = ["1 2 3", "4 5", "7 7 7"], ["3 2", "", "1"]
  source, prefix = tmp_path / "src.txt", tmp_path / "prefix.txt"
  source.write_text("".join(s + "\n" for s in sources))
  prefix.write_text("".join(p + "\n" for p in prefixes))
  _translate(
    monkeypatch, f"--workdir={workdir}", f"--input={source}", f"--prefix={prefix}", "--beam_size=2"
  )
  want = Translator.from_workdir(workdir).translate(sources, beam_size=2, prefixes=prefixes)
  assert capsys.readouterr().out.splitlines() == want
  assert want[0].startswith("3 2") and want[2].startswith("1")
