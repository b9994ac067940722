"""Ensembles: the combined step against numpy (the normalised mean of the members'
log-softmax), an ensemble of a model with itself against the model for beam, greedy and
sampling, ensemble scores against a hand combination, and incompatible members refused in one
line before any checkpoint is read."""

import functools
import json
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from t2t_jax import data as data_lib
from t2t_jax.decoding import SearchConfig, scoring, search_batch
from t2t_jax.decoding.model_view import ensemble_log_probs
from t2t_jax.decoding.translator import TranslateError, Translator, load_config
from t2t_jax.run.workdir import Workdir
from t2t_jax.tokens import EOS_ID
from tests import support
from tests.test_score import _IdTokenizer
from tests.test_train import small_config

SOURCES = ["5 6 7", "9 8 7 6 5 4", "12", "20 21 22 23 24 25 26"]


def np_log_softmax(x: np.ndarray) -> np.ndarray:
  x = np.asarray(x, np.float64)
  shifted = x - x.max(axis=-1, keepdims=True)
  return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def np_ensemble(logits: list[np.ndarray]) -> np.ndarray:
  """log of the normalised geometric mean of the members' softmax, float64."""
  return np_log_softmax(np.mean([np_log_softmax(x) for x in logits], axis=0))


@pytest.fixture(scope="module")
def pair():
  """Two different small models (seeds 3 and 4) as Translators, and their ensemble."""
  a, b = (Translator(*support.small_model(seed=s), _IdTokenizer(), batch_tokens=32) for s in (3, 4))
  return a, b, Translator.ensemble([a, b])


def test_ensemble_log_probs_is_the_normalised_mean_of_the_log_softmax():
  rng = np.random.default_rng(0)
  logits = [rng.normal(size=(3, 2, 11)) * s for s in (1.0, 4.0, 0.3)]
  got = np.asarray(ensemble_log_probs([np.float32(x) for x in logits]))
  np.testing.assert_allclose(got, np_ensemble(logits), atol=1e-5)
  np.testing.assert_allclose(np.exp(got).sum(-1), 1.0, atol=1e-5)
  # Not the arithmetic mean of the probabilities (fairseq's): the two differ here.
  mixture = np.log(np.mean([np.exp(np_log_softmax(x)) for x in logits], axis=0))
  assert np.abs(got - mixture).max() > 0.1
  one = np.asarray(ensemble_log_probs([np.float32(logits[0])]))
  np.testing.assert_allclose(one, np_log_softmax(logits[0]), atol=1e-6)


@pytest.mark.parametrize(
  "settings",
  [
    SearchConfig(beam_size=1),
    SearchConfig(beam_size=4),
    SearchConfig(beam_size=1, sampling=True, num_samples=3, sampling_topk=10, sampling_seed=2),
  ],
  ids=["greedy", "beam", "sampling"],
)
def test_an_ensemble_of_a_model_with_itself_is_the_model(pair, settings):
  one = pair[0]
  both = Translator.ensemble([one, one])
  nbest = settings.hypotheses
  want = one.translate(SOURCES, nbest=nbest, search=settings)
  got = both.translate(SOURCES, nbest=nbest, search=settings)
  assert [[h.text for h in hyps] for hyps in got] == [[h.text for h in hyps] for hyps in want]
  for got_hyps, want_hyps in zip(got, want):
    for g, w in zip(got_hyps, want_hyps):
      assert g.score == pytest.approx(w.score, abs=1e-5)
      assert g.log_prob == pytest.approx(w.log_prob, abs=1e-5)


def _np_greedy(members, inputs: np.ndarray, limits: np.ndarray, length: int):
  """Greedy decoding from full teacher-forced passes of each member at every step (no
  cache), the step distributions combined in numpy: (tokens [batch, length], log p)."""
  batch = inputs.shape[0]
  passes = [jax.jit(functools.partial(m.apply, {"params": p})) for m, p in members]
  # The decoder sees BOS + targets[:-1], causally: position `step` reads only the tokens
  # chosen before it, whatever fills the rest (here token 5, also after a row's EOS).
  out = np.full((batch, length), 5, np.int32)
  total, done = np.zeros(batch), np.zeros(batch, bool)
  for step in range(length):
    log_probs = np_ensemble([np.asarray(f(inputs, out))[:, step] for f in passes])
    at_limit = step + 1 >= limits
    not_eos = np.arange(log_probs.shape[-1]) != EOS_ID
    log_probs[at_limit[:, None] & not_eos] = -np.inf
    token = np.argmax(log_probs, axis=-1)
    total += np.where(done, 0.0, log_probs[np.arange(batch), token])
    out[:, step] = np.where(done, 5, token)
    done |= token == EOS_ID
  ended = np.cumsum(out == EOS_ID, axis=1) - (out == EOS_ID) > 0
  return np.where(ended, 0, out), total


def test_ensemble_greedy_search_equals_greedy_over_the_hand_combined_steps(pair):
  a, b, ensemble = pair
  inputs = np.array(
    [[5, 6, 7, 1, 0, 0, 0, 0], [9, 8, 7, 6, 5, 4, 1, 0], [12, 1] + [0] * 6], np.int32
  )
  limits = np.array([9, 12, 6], np.int32)
  params, model = ensemble.decoder()
  seqs, log_probs = search_batch(
    params,
    inputs,
    limits,
    model=model,
    max_decode_len=12,
    search=SearchConfig(beam_size=1),
    nbest=1,
  )
  want_seqs, want_log_probs = _np_greedy(ensemble.members, inputs, limits, 12)
  np.testing.assert_array_equal(np.asarray(seqs)[:, 0], want_seqs)
  np.testing.assert_allclose(np.asarray(log_probs)[:, 0], want_log_probs, atol=1e-4)
  # The two members disagree, so the combination is no member's own search.
  alone = [_np_greedy(t.members, inputs, limits, 12)[1] for t in (a, b)]
  assert all(np.abs(x - want_log_probs).max() > 1e-2 for x in alone)


def test_ensemble_scores_are_the_hand_combined_token_log_probs(pair):
  a, b, ensemble = pair
  targets = ["5 6 7", "9 9", "5", ""]
  got = scoring.Scorer(ensemble).score(SOURCES, targets)
  pad = lambda rows: np.array([r + [0] * (8 - len(r)) for r in rows], np.int32)
  inputs = pad([a.source_ids([source])[0] for source in SOURCES])
  tgt = pad([list(a.tokenizer.encode(t)) + [EOS_ID] for t in targets])
  members = (*a.members, *b.members)
  logits = [np.asarray(support.jit_apply(m, {"params": p}, inputs, tgt)) for m, p in members]
  combined = np_ensemble(logits)
  for row, score in enumerate(got):
    n = len(score.tokens)
    want = combined[row, np.arange(n), tgt[row, :n]]
    np.testing.assert_allclose(score.tokens, want, atol=1e-5)
  # and an ensemble's beam search scores its outputs as its scorer does
  best = [
    h[0] for h in ensemble.translate(SOURCES, nbest=1, search=ensemble.search.override(beam_size=3))
  ]
  rescored = scoring.Scorer(ensemble).score(SOURCES, [h.text for h in best])
  for h, s in zip(best, rescored):
    assert s.log_prob == pytest.approx(h.log_prob, abs=1e-4)
    assert s.normalised == pytest.approx(h.score, abs=1e-4)


def test_ensemble_of_members_with_other_vocabulary_sizes_is_refused(pair):
  other = Translator(*support.small_model(seed=3, vocab_size=48), _IdTokenizer())
  with pytest.raises(
    TranslateError, match="^ensemble: a model has vocabulary size 48 but a model has 40$"
  ):
    Translator.ensemble([pair[0], other])


def _copy_without_checkpoints(workdir: str, to) -> str:
  """config.json and the vocabulary of `workdir` in a new directory: enough for the checks
  an ensemble makes before it reads a checkpoint."""
  os.makedirs(to)
  shutil.copy(Workdir(workdir).config_file, Workdir(to).config_file)
  config = load_config(workdir)
  shutil.copy(data_lib.vocab_path(config.data, workdir), data_lib.vocab_path(config.data, str(to)))
  return str(to)


@pytest.mark.slow
def test_incompatible_members_are_refused_naming_both_before_any_checkpoint(tmp_path):
  base = _copy_without_checkpoints(support.small_trained_workdir(), tmp_path / "a")
  other = _copy_without_checkpoints(base, tmp_path / "b")
  vocab = data_lib.vocab_path(load_config(base).data, other)
  vocab.write_text(vocab.read_text() + "extra\n")
  with pytest.raises(TranslateError) as e:
    Translator.from_workdirs([base, other])
  text = str(e.value)
  first_vocab = data_lib.vocab_path(load_config(base).data, base)
  assert (
    text.startswith(f"ensemble: vocabulary {vocab} (sha256 ")
    and f"differs from {first_vocab}" in text
  )
  assert "\n" not in text
  longer = _copy_without_checkpoints(base, tmp_path / "c")
  config = Workdir(longer).config_values()
  config["model"]["max_len"] = 32
  with open(Workdir(longer).config_file, "w") as f:
    json.dump(config, f)
  with pytest.raises(
    TranslateError, match=f"^ensemble: {longer} has model max_len=32 but {base} has 16$"
  ):
    Translator.from_workdirs([base, longer])


def second_trained_workdir() -> str:
  """small_trained_workdir's config trained from another seed (made once per run)."""

  def make(path: str) -> None:
    from t2t_jax.training import trainer

    trainer.train_and_evaluate(small_config(eval_every_steps=100, seed=1), path)

  return support.made_once("small_trained_workdir_seed1", make)


@pytest.mark.slow
def test_translate_and_score_commands_decode_with_the_ensemble(tmp_path):
  a, b = support.small_trained_workdir(), second_trained_workdir()
  ensemble = Translator.from_workdirs([a, b], "latest")
  assert len(ensemble.members) == 2
  sources = ["1 2 3", "4 5", "7 7 7"]
  source = tmp_path / "src.txt"
  source.write_text("".join(s + "\n" for s in sources))
  env = support.cpu_env(T2T_HUGE_PAGES="0")
  common = [f"--workdir={a},{b}", "--checkpoint=latest"]
  proc = subprocess.run(
    [sys.executable, "-m", "t2t_jax.cli.translate", *common, f"--input={source}", "--scores"],
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  want = ensemble.translate(sources, nbest=1)
  assert proc.stdout.splitlines() == [
    f"{h[0].score:.6f}\t{h[0].log_prob:.6f}\t{h[0].text}" for h in want
  ]
  target = tmp_path / "tgt.txt"
  target.write_text("".join(h[0].text + "\n" for h in want))
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "t2t_jax.cli.score",
      *common,
      f"--source={source}",
      f"--target={target}",
    ],
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  for line, hyps in zip(proc.stdout.splitlines(), want):
    total, _, normalised = (float(x) for x in line.split("\t"))
    assert total == pytest.approx(hyps[0].log_prob, abs=1e-4)
    assert normalised == pytest.approx(hyps[0].score, abs=1e-4)
  # the ensemble is neither member alone
  alone = [Translator.from_workdir(w, "latest").translate(sources, nbest=1) for w in (a, b)]
  assert all(
    [h[0].log_prob for h in x] != pytest.approx([h[0].log_prob for h in want]) for x in alone
  )
