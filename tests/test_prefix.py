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

# Inputs of four lengths and their output limits for small_model(seed=3).
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


@pytest.fixture(scope="module")
def translator():
  return Translator(*support.small_model(seed=3), _IdTokenizer(), batch_tokens=32)


@pytest.mark.parametrize("name", list(SEARCHES))
def test_empty_prefixes_take_the_forced_path_and_change_nothing(name):
  """All-PAD prefixes run the forced-token code and give the unconstrained search's outputs
  and scores bit for bit (that search is checked against the reference searches in
  test_decode.py and test_quick_equivalences.py)."""
  model, params = support.small_model(seed=3)
  kw = dict(model=model, max_decode_len=16, search=SEARCHES[name], nbest=True)
  seqs, scores = (np.asarray(x) for x in search_batch(params, INPUTS, LIMITS, **kw))
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
  plain = Translator.from_workdir(workdir)
  want = plain.translate(sources, search=plain.search.override(beam_size=2), prefixes=prefixes)
  assert capsys.readouterr().out.splitlines() == want
  assert want[0].startswith("3 2") and want[2].startswith("1")
