"""Scoring given translations: decoding.scoring against the training loss's log-likelihood,
t2t-score's TSV in input order, and its bad input refused in one line."""

import functools
import subprocess
import sys

import numpy as np
import pytest
from absl import flags

from t2t_jax.cli import score as score_cli
from t2t_jax.decoding import scoring
from t2t_jax.decoding.translator import TranslateError, Translator
from t2t_jax.tokens import EOS_ID
from t2t_jax.training import losses
from tests import support

SUBPROCESS_ENV = support.cpu_env(T2T_HUGE_PAGES="0")
SOURCES = ["1 2 3", "4 5 6 7 1 2", "", "7", "3 3 3 3 3 3 3 3", "2 1"]
TARGETS = ["1 2 3", "7 7", "5", "", "3 3 3 3 3 3 3 3 3 3 3 3", "4 5 6"]


@pytest.fixture(scope="module")
def workdir():
  return support.small_trained_workdir()


@pytest.fixture(scope="module")
def translator(workdir):
  return Translator.from_workdir(workdir, batch_tokens=32)  # several batches of SOURCES


class _IdTokenizer:
  """Words are token ids: '5 6 7' -> [5, 6, 7]."""

  vocab_size = support.SMALL_MODEL["vocab_size"]

  def encode(self, text):
    return [int(w) for w in text.split()]

  def decode(self, ids):
    return " ".join(str(i) for i in ids if i > EOS_ID)


def _training_log_likelihood(t: Translator, sources, targets) -> list[np.ndarray]:
  """-nll per target token from the training loss (no label smoothing), all pairs in one
  padded batch in input order."""
  src = [t.source_ids([s])[0] for s in sources]
  tgt = [list(t.tokenizer.encode(s)) + [EOS_ID] for s in targets]
  pad = lambda rows: np.array([r + [0] * (max(map(len, rows)) - len(r)) for r in rows], np.int32)
  logits = support.jit_apply(t.model, {"params": t.params}, pad(src), pad(tgt))
  _, nll = losses.token_losses(logits, pad(tgt), label_smoothing=0.0)
  return [-np.asarray(row[: len(ids)], np.float64) for row, ids in zip(nll, tgt)]


@pytest.mark.slow
def test_scores_equal_the_training_log_likelihood():
  model, params = support.small_model(seed=3)
  translator = Translator(model, params, _IdTokenizer(), batch_tokens=8)
  sources = ["5 6 7", "4 5 6 7 11 12", "", "7"]
  targets = ["5 6 7", "9 9", "5", ""]
  scorer = scoring.Scorer(translator)
  got = scorer.score(sources, targets)
  batches = scorer._batches(translator.source_ids(sources), scorer.target_ids(targets))
  assert len(list(batches)) > 1  # so that input order is restored across batches
  alpha = translator.search.alpha
  for want, score in zip(_training_log_likelihood(translator, sources, targets), got):
    np.testing.assert_allclose(score.tokens, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(score.log_prob, want.sum(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(score.mean, want.mean(), rtol=1e-5, atol=1e-5)
    penalty = ((5 + len(want)) / 6) ** alpha  # GNMT, eq. 14, length with EOS
    np.testing.assert_allclose(score.normalised, want.sum() / penalty, rtol=1e-5, atol=1e-5)
  assert scoring.Scorer(translator, alpha=0.0).score(sources[:1], targets[:1])[0].normalised == (
    pytest.approx(got[0].log_prob)
  )


@pytest.mark.slow
def test_a_translations_score_is_the_searchs_score(translator):
  """Beam search's n-best score and log-probability of its own output, scored again."""
  best = [
    h[0]
    for h in translator.translate(SOURCES, nbest=1, search=translator.search.override(beam_size=2))
  ]
  got = scoring.Scorer(translator).score(SOURCES, [h.text for h in best])
  for h, score in zip(best, got):
    assert score.log_prob == pytest.approx(h.log_prob, abs=1e-4)
    assert score.normalised == pytest.approx(h.score, abs=1e-4)


def test_a_target_longer_than_max_len_is_refused_naming_its_line():
  model, params = support.small_model()
  translator = Translator(model, params, _IdTokenizer())
  with pytest.raises(
    TranslateError,
    match=r"^refs: 1 target\(s\) have more tokens \(with EOS\) than the model's max_len=16 "
    r"\(lines 2\)$",
  ):
    scoring.Scorer(translator).score(["1", "2"], ["1", " ".join(["3"] * 20)], target_name="refs")


# --- the values, in the quick loop: float64 numpy from the model's teacher-forced logits -----


def _numpy_token_log_probs(model, params, sources, targets) -> list[np.ndarray]:
  """float64 log p(target[t] | target[:t], source) of each pair: log-softmax in numpy of the
  model's teacher-forced logits (one padded batch: padding changes no real position)."""
  pad = lambda rows: np.array([r + [0] * (max(map(len, rows)) - len(r)) for r in rows], np.int32)
  logits = np.asarray(support.jit_apply(model, {"params": params}, pad(sources), pad(targets)))
  x = logits.astype(np.float64)
  log_probs = x - x.max(-1, keepdims=True)
  log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
  return [lp[np.arange(len(ids)), ids] for lp, ids in zip(log_probs, targets)]


def test_sequence_scores_are_the_sum_mean_and_gnmt_normalised_sum():
  rng = np.random.default_rng(4)
  for length in (1, 2, 7, 30):
    tokens = np.log(rng.uniform(0.01, 1.0, length)).astype(np.float32)
    total = np.sum(tokens.astype(np.float64))
    for alpha in (0.0, 0.6, 1.0, 2.0):
      got = scoring.sequence_scores(tokens, alpha)
      penalty = ((5.0 + length) / 6.0) ** alpha  # GNMT eq. 14, EOS counted
      assert got.log_prob == pytest.approx(total, rel=1e-12)
      assert got.mean == pytest.approx(total / length, rel=1e-12)
      assert got.normalised == pytest.approx(total / penalty, rel=1e-6)
      np.testing.assert_array_equal(got.tokens, tokens)


QUICK_SOURCES = ["5 6 7", "4 5 6 7 11 12", "", "7 8"]
QUICK_TARGETS = ["5 6 7", "9 9", "5", ""]


@pytest.fixture(scope="module")
def quick_translator():
  model, params = support.small_model(seed=3)
  return Translator(model, params, _IdTokenizer(), batch_tokens=16)


def test_score_command_values_equal_numpy_from_the_teacher_forced_logits(
  quick_translator, tmp_path, monkeypatch
):
  """t2t-score's three columns (and --per_token) for pairs in several batches, with and
  without --alpha, against float64 numpy from the model's logits."""
  t = quick_translator
  source, target = tmp_path / "src.txt", tmp_path / "tgt.txt"
  source.write_text("".join(s + "\n" for s in QUICK_SOURCES))
  target.write_text("".join(s + "\n" for s in QUICK_TARGETS))
  monkeypatch.setattr(score_cli.Translator, "from_workdirs", lambda *a, **k: t)
  scorer = scoring.Scorer(t)
  batches = list(scorer._batches(t.source_ids(QUICK_SOURCES), scorer.target_ids(QUICK_TARGETS)))
  assert len(batches) > 1  # input order is restored across batches
  want = _numpy_token_log_probs(
    t.model,
    t.params,
    t.source_ids(QUICK_SOURCES),
    [t.tokenizer.encode(g) + [EOS_ID] for g in QUICK_TARGETS],
  )
  for flags_alpha, alpha in (([], t.search.alpha), (["--alpha=1.5"], 1.5), (["--alpha=0"], 0.0)):
    output = tmp_path / f"out{alpha}.tsv"
    args = [f"--workdir={tmp_path}", f"--source={source}", f"--target={target}"]
    _score(monkeypatch, *args, f"--output={output}", "--per_token", *flags_alpha)
    lines = output.read_text().splitlines()
    assert len(lines) == len(want)
    for line, tokens in zip(lines, want):
      total, mean, normalised, per_token = line.split("\t")
      np.testing.assert_allclose([float(x) for x in per_token.split()], tokens, atol=2e-6)
      penalty = ((5 + len(tokens)) / 6) ** alpha
      assert float(total) == pytest.approx(tokens.sum(), abs=1e-5)
      assert float(mean) == pytest.approx(tokens.sum() / len(tokens), abs=1e-5)
      assert float(normalised) == pytest.approx(tokens.sum() / penalty, abs=1e-5), alpha


class _OwnFlags:
  """absl.flags aimed at a private FlagValues, so that each run defines t2t-score's flags
  afresh."""

  def __init__(self) -> None:
    self.FLAGS = flags.FlagValues()

  def __getattr__(self, name):
    value = getattr(flags, name)
    if name.startswith("DEFINE"):
      return functools.partial(value, flag_values=self.FLAGS)
    return value


def _score(monkeypatch, *args):
  monkeypatch.setattr(score_cli, "flags", _OwnFlags())
  parsed = score_cli._define_flags()
  parsed(["t2t-score", *args])
  monkeypatch.setattr(score_cli._define_flags, "flags", parsed, raising=False)
  score_cli.main(["t2t-score"])


def test_a_line_count_mismatch_names_both_files_and_counts(tmp_path, monkeypatch):
  source, target = tmp_path / "src.txt", tmp_path / "tgt.txt"
  source.write_text("1 2\n3\n4\n")
  target.write_text("1 2\n3\n")
  loaded = []
  monkeypatch.setattr(score_cli.Translator, "from_workdir", lambda *a, **k: loaded.append(a))
  with pytest.raises(SystemExit) as e:
    _score(monkeypatch, f"--workdir={tmp_path}", f"--source={source}", f"--target={target}")
  assert str(e.value) == (f"t2t-score: --source={source} has 3 lines but --target={target} has 2")
  with pytest.raises(SystemExit, match="^t2t-score: --target is required: "):
    _score(monkeypatch, f"--workdir={tmp_path}", f"--source={source}")
  assert not loaded


@pytest.mark.slow
def test_score_command_prints_tsv_in_input_order(workdir, translator, tmp_path):
  source, target, output = tmp_path / "src.txt", tmp_path / "tgt.txt", tmp_path / "out.tsv"
  source.write_text("".join(s + "\n" for s in SOURCES))
  target.write_text("".join(t + "\n" for t in TARGETS))
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "t2t_jax.cli.score",
      f"--workdir={workdir}",
      f"--source={source}",
      f"--target={target}",
      f"--output={output}",
      "--per_token",
      "--checkpoint=latest",
      "--batch_tokens=32",
    ],
    env=SUBPROCESS_ENV,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  lines = output.read_text().splitlines()
  want = scoring.Scorer(translator).score(SOURCES, TARGETS)
  expected = [score_cli.format_score(s, per_token=True).rstrip("\n") for s in want]
  # The command batched them otherwise (--batch_tokens=32): the same values in input order,
  # up to float32 rounding in the last printed digit.
  assert len(lines) == len(expected)
  for line, expected_line in zip(lines, expected, strict=True):
    got, wanted = line.replace("\t", " ").split(), expected_line.replace("\t", " ").split()
    np.testing.assert_allclose(np.asarray(got, float), np.asarray(wanted, float), atol=2e-6)
  reference = _training_log_likelihood(translator, SOURCES, TARGETS)
  for line, target_text, want_tokens in zip(lines, TARGETS, reference):
    total, mean, _, tokens = line.split("\t")
    tokens = [float(x) for x in tokens.split()]
    assert len(tokens) == len(translator.tokenizer.encode(target_text)) + 1
    assert float(total) == pytest.approx(sum(tokens), abs=1e-4)
    assert float(mean) == pytest.approx(sum(tokens) / len(tokens), abs=1e-4)
    assert float(total) == pytest.approx(want_tokens.sum(), abs=1e-4)
