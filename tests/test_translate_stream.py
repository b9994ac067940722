"""t2t-translate's n-best lists and scores, and interactive (streaming) translation."""

import select
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t_jax.decoding.beam import length_penalty
from t2t_jax.decoding.translator import TranslateError, Translator
from t2t_jax.tokens import EOS_ID
from t2t_jax.training import trainer
from tests import support
from tests.test_train import small_config

SOURCES = ["1 2 3", "4 5 6 7 1 2", "7", "", "3 3 2 1 0 5 6"]
ENV = support.cpu_env()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  """A briefly trained model whose position table allows three streaming buckets."""
  path = str(tmp_path_factory.mktemp("stream") / "w")
  trainer.train_and_evaluate(small_config(**{"model.max_len": 40}), path)
  return path


def _forced_log_prob(t2t, source: str, target: str) -> float:
  """log p(target + EOS | source) by teacher forcing: an independent reference. Both sides
  are padded to the model's max_len (padding is masked), so that one program serves all."""
  width = t2t.model.config.max_len
  pad = lambda ids: jnp.array([ids + [0] * (width - len(ids))], jnp.int32)
  target = t2t.tokenizer.encode(target) + [EOS_ID]
  inputs, targets = pad(t2t.tokenizer.encode(source) + [EOS_ID]), pad(target)
  logits = support.jit_apply(t2t.model, {"params": t2t.params}, inputs, targets)
  log_probs = jax.nn.log_softmax(logits[0, : len(target)], axis=-1)
  return float(jnp.take_along_axis(log_probs, targets[0, : len(target), None], axis=-1).sum())


@pytest.mark.slow
@pytest.mark.parametrize("beam_size", [1, 4])
def test_nbest_first_is_the_plain_output_scores_sorted_and_exact(workdir, beam_size):
  t2t = Translator.from_workdir(workdir)
  plain = t2t.translate(SOURCES, search=t2t.search.override(beam_size=beam_size))
  nbest = t2t.translate(SOURCES, nbest=beam_size, search=t2t.search.override(beam_size=beam_size))
  assert [hyps[0].text for hyps in nbest] == plain
  for source, hyps in zip(SOURCES, nbest):
    assert 1 <= len(hyps) <= beam_size
    scores = [h.score for h in hyps]
    assert scores == sorted(scores, reverse=True)
    for h in hyps:
      length = len(t2t.tokenizer.encode(h.text)) + 1
      np.testing.assert_allclose(h.score, h.log_prob / length_penalty(length, 0.6), rtol=1e-5)
      np.testing.assert_allclose(h.log_prob, _forced_log_prob(t2t, source, h.text), atol=1e-4)
  with pytest.raises(TranslateError, match="nbest=5: must be between 1 and beam_size=4"):
    t2t.translate(SOURCES, nbest=5, search=t2t.search.override(beam_size=4))


@pytest.mark.slow
def test_stream_gives_the_batch_translations(workdir):
  t2t = Translator.from_workdir(workdir)
  assert t2t.buckets() == [16, 32, 40]
  lines = SOURCES + [" ".join(["5"] * 20)]  # the second bucket
  assert list(
    t2t.translate_stream(iter(lines), search=t2t.search.override(beam_size=2))
  ) == t2t.translate(lines, search=t2t.search.override(beam_size=2))


def _cli(*args, stdin=None):
  return subprocess.run(
    [sys.executable, "-m", "t2t_jax.cli.translate", *args],
    env=ENV,
    input=stdin,
    capture_output=True,
    text=True,
    timeout=600,
  )


@pytest.mark.slow
def test_cli_nbest_and_scores(workdir):
  text = "".join(s + "\n" for s in SOURCES)
  t = Translator.from_workdir(workdir)
  plain = t.translate(SOURCES, search=t.search.override(beam_size=3))
  nbest = _cli(f"--workdir={workdir}", "--beam_size=3", "--nbest=3", stdin=text)
  scores = _cli(f"--workdir={workdir}", "--beam_size=3", "--scores", stdin=text)
  for proc in (nbest, scores):
    assert proc.returncode == 0, proc.stderr[-2000:]
  rows = [line.split("\t") for line in nbest.stdout.splitlines()]
  best = [r[4] for r in rows if r[1] == "1"]
  assert best == plain
  assert sorted({int(r[0]) for r in rows}) == list(range(len(SOURCES)))
  for index in range(len(SOURCES)):
    mine = [float(r[2]) for r in rows if int(r[0]) == index]
    assert mine == sorted(mine, reverse=True)
    assert [int(r[1]) for r in rows if int(r[0]) == index] == list(range(1, len(mine) + 1))
  one = [line.split("\t") for line in scores.stdout.splitlines()]
  assert [r[2] for r in one] == best and [r[0] for r in one] == [r[2] for r in rows if r[1] == "1"]
  bad = _cli(f"--workdir={workdir}", "--beam_size=2", "--nbest=3", stdin=text)
  assert bad.returncode != 0
  assert bad.stderr.strip().splitlines()[-1] == (
    "t2t-translate: --nbest=3: must be between 1 and beam_size=2 (0: off)"
  )


def _read_line(stream, timeout: float = 300.0) -> str:
  ready, _, _ = select.select([stream], [], [], timeout)
  assert ready, "no translation within the timeout"
  return stream.readline()


@pytest.mark.slow
def test_interactive_translates_each_line_before_the_next_arrives(workdir):
  t = Translator.from_workdir(workdir)
  expected = t.translate(SOURCES, search=t.search.override(beam_size=4))
  proc = subprocess.Popen(
    [sys.executable, "-m", "t2t_jax.cli.translate", f"--workdir={workdir}", "--interactive"],
    env=ENV,
    stdin=subprocess.PIPE,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
    bufsize=1,
  )
  try:
    for source, want in zip(SOURCES, expected):
      proc.stdin.write(source + "\n")
      proc.stdin.flush()  # the pipe stays open: the answer must come before more input
      assert _read_line(proc.stdout) == want + "\n"
    proc.stdin.close()
    assert proc.wait(timeout=60) == 0
    assert "t2t-translate: ready" in proc.stderr.read()
  finally:
    proc.kill()
