"""The parsing experiment end to end on a handful of trees: t2t-train reports dev and test F1,
and t2t-translate --reference on the files it wrote reports the same test F1 (a nonzero one:
the model is trained until its greedy parses match some gold brackets)."""

import json
import re
import subprocess
import sys

import pytest

from t2t_jax.data import trees
from t2t_jax.evaluation import evaluate, parseval
from t2t_jax.experiments import parsing
from t2t_jax.run.workdir import read_metrics
from tests import support

PTB = support.shared_data_dir() / "ptb_sample"


def test_config_carries_the_paper_decoding_settings():
  config = parsing.get_config()
  assert (config.beam_size, config.alpha, config.max_output_extra) == (21, 0.3, 300)
  big = parsing.get_config("big")
  assert (big.model.num_layers, big.model.d_model) == (4, 1024)
  with pytest.raises(ValueError, match="'huge'"):
    parsing.get_config("huge")


def _f1(matched, gold, test):
  """Bracket F1 in percent from the counts, as EVALB defines it."""
  precision, recall = matched / test, matched / gold
  return 200 * precision * recall / (precision + recall)


def _relabel_first_phrase(tree):
  """`tree` with the label of its first phrase below the root changed to one no tree has."""
  done = False

  def walk(node, depth):
    nonlocal done
    if node.is_preterminal:
      return node
    label = node.label
    if depth > 0 and not done:
      label, done = "XP", True
    return trees.Tree(label, tuple(walk(child, depth + 1) for child in node.children))

  return walk(tree, 0)


# The run: 60 steps at a high rate on one CPU device, as a user runs it (the 8 simulated
# devices of the test process split the batch otherwise). Greedy parses then open an S over
# the sentence (repaired into nested S brackets), enough to match some gold brackets; an
# untrained model emits flat trees, which score 0 whatever the reference.
TRAIN = """
import json, sys
from t2t_jax.experiments import parsing
from t2t_jax.training import trainer
config = parsing.get_config()
config.data.update(
  treebank_dir=sys.argv[1], treebank_train="1-4", treebank_dev="180", treebank_test="190",
  bucket_boundaries=(), source_bucket_boundaries=(), max_len=96, bucket_min=96,
)
config.model.update(d_model=32, d_ff=64, num_heads=2, num_layers=1, max_len=128)
config.update(
  num_train_steps=60, warmup_steps=20, learning_rate_factor=2.0, eval_every_steps=30,
  bleu_every_steps=30, checkpoint_every_steps=30, log_every_steps=30, beam_size=1,
  max_output_extra=20,
)
last = trainer.train_and_evaluate(config, sys.argv[2])
print(json.dumps({k: v for k, v in last.items() if isinstance(v, int | float)}))
"""


@pytest.mark.slow
@pytest.mark.skipif(not PTB.is_dir(), reason="no ../shared/data/ptb_sample")
def test_parsing_trains_and_reports_f1(tmp_path):
  workdir = str(tmp_path / "w")
  env = support.cpu_env()
  proc = subprocess.run(
    [sys.executable, "-c", TRAIN, str(PTB), workdir],
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  last = json.loads(proc.stdout.splitlines()[-1])
  assert "dev_f1" in last and last["step"] == 60
  assert 0 < last["test_f1"] < 100 and min(last["test_precision"], last["test_recall"]) > 0
  records = read_metrics(workdir)
  assert sum("dev_f1" in r for r in records) == 2
  for name in ("words", "gold", "trees"):
    lines = (tmp_path / "w" / f"test.{name}").read_text().splitlines()
    assert len(lines) == 5  # wsj_0190 holds 5 trees
  # The files written are the ones scored: the parses against the gold trees give the
  # reported F1, which is 2PR / (P + R) of their bracket counts; the gold trees score 100
  # against themselves, and 100 (G - 1) / G with one of their G brackets relabelled.
  golds = evaluate.read_gold_trees(f"{workdir}/test.gold")
  parses = evaluate.read_gold_trees(f"{workdir}/test.trees")
  score = parseval.corpus_score(parses, golds)
  counts = (score.matched, score.gold_brackets, score.test_brackets)
  assert score.f1 == pytest.approx(last["test_f1"]) == _f1(*counts)
  assert parseval.corpus_score(golds, golds).f1 == 100.0
  changed = [_relabel_first_phrase(golds[0])] + golds[1:]
  g = score.gold_brackets
  assert parseval.corpus_score(changed, golds).f1 == pytest.approx(100 * (g - 1) / g)

  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "t2t_jax.cli.translate",
      f"--workdir={workdir}",
      f"--input={workdir}/test.words",
      f"--reference={workdir}/test.gold",
      f"--output={tmp_path}/out",
    ],
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "beam 1, alpha 0.3" in proc.stderr  # the workdir's settings
  f1 = float(re.search(r"bracket F1 ([\d.]+)", proc.stderr).group(1))
  assert f1 == pytest.approx(last["test_f1"], abs=0.006)  # printed with 2 decimals
  printed = re.search(r"(\d+) of (\d+) gold / (\d+) test brackets matched", proc.stderr)
  assert tuple(map(int, printed.groups())) == counts
  outputs = (tmp_path / "out").read_text().splitlines()
  assert parseval.score_outputs(outputs, golds).f1 == pytest.approx(last["test_f1"])

  (tmp_path / "bad").write_text("(S (NN a)\n")
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "t2t_jax.cli.translate",
      f"--workdir={workdir}",
      f"--input={workdir}/test.words",
      f"--reference={tmp_path}/bad",
    ],
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert proc.returncode != 0 and "bad: tree 1: line 1: bracket opened here" in proc.stderr
