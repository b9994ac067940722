"""The parsing run's bookkeeping: checkpoint selection decodes with the dev beam and names its
metric, the run summary reports test F1, and the exporters take a word vocabulary for what
it is."""

import json
import types

import ml_collections

from t2t_jax.data.symbols import WordTokenizer
from t2t_jax.decoding.config import SearchConfig
from t2t_jax.export import Trained, vocabulary_tokens
from t2t_jax.model import TransformerConfig
from t2t_jax.run.workdir import Workdir
from t2t_jax.training import evaluation, summary
from t2t_jax.training import trainer as train


def _fake_trainer(tmp_path, bleu_beam_size, source="synthetic"):
  config = ml_collections.ConfigDict(
    dict(
      select_num_sentences=0,
      select_checkpoints="latest,average:2",
      bleu_beam_size=bleu_beam_size,
      data=dict(source=source, tree_leaves="xx"),
    )
  )
  written = []
  fake = types.SimpleNamespace(
    config=config,
    data=types.SimpleNamespace(dev_pairs=[("a b", "b a")]),
    ckpts=None,
    search=SearchConfig(beam_size=21, alpha=0.3),
    workdir=str(tmp_path),
    step_reached=7,
    writer=types.SimpleNamespace(write=lambda step, metrics: written.append(metrics)),
    translator=lambda params, spec: spec,
  )
  return fake, written


def test_selection_decodes_with_the_dev_beam_and_names_its_metric(tmp_path, monkeypatch):
  seen = []

  def select(ckpts, candidates, pairs, translator_for, search, metric, metric_name):
    seen.append((search.beam_size, metric_name))
    return evaluation.Selection(
      "latest",
      {"latest": 3.0, "average:2": 2.0},
      {"latest": [7], "average:2": [6, 7]},
      1,
      metric_name,
    )

  monkeypatch.setattr(evaluation, "select_checkpoint", select)
  for bleu_beam, beam in ((1, 1), (0, 21)):  # 0: the test beam
    fake, written = _fake_trainer(tmp_path, bleu_beam)
    assert train.Trainer.select(fake) == "latest"
    assert seen[-1] == (beam, "dev_bleu") and written == [{"selected_dev_bleu": 3.0}]
    record = json.loads((tmp_path / "selected.json").read_text())
    assert record["beam_size"] == beam and record["metric"] == "dev_bleu"
    assert record["dev_bleu"] == {"latest": 3.0, "average:2": 2.0}


def test_a_parsing_selection_is_written_as_dev_f1_and_older_files_still_read(tmp_path):
  selection = evaluation.Selection("latest", {"latest": 40.0}, {"latest": [5]}, 3, "dev_f1")
  evaluation.write_selection(str(tmp_path), selection, SearchConfig(beam_size=1, alpha=0.3))
  record = Workdir(str(tmp_path)).read_selection()
  assert "dev_bleu" not in record and record["dev_f1"] == {"latest": 40.0}
  assert Workdir.selection_scores(record) == ("dev_f1", {"latest": 40.0})
  row = summary._row(dict(workdir="w", steps=5, selected=record))
  assert "latest (dev F1 40.00)" in row
  older = dict(checkpoint="latest", steps=[5], dev_bleu={"latest": 12.5})
  assert Workdir.selection_scores(older) == ("dev_bleu", {"latest": 12.5})
  assert "latest (dev BLEU 12.50)" in summary._row(dict(workdir="w", steps=5, selected=older))


def test_run_summary_reports_a_parsing_runs_test_f1(tmp_path):
  records = [
    dict(step=0, time=0.0, train_start=True),
    dict(step=10, time=60.0, loss=1.0),
    dict(step=10, time=70.0, test_f1=22.5, test_precision=25.0, test_recall=20.0),
  ]
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
  report = summary.run_summary(str(tmp_path))
  assert report["test_f1"] == 22.5 and report["test_recall"] == 20.0
  assert summary._row(report).endswith("| - | - | - | - | 22.50 |")


def test_a_word_vocabulary_is_not_taken_for_sentencepiece(tmp_path):
  tokenizer = WordTokenizer(["(S", ")S", "XX", "the"])
  vocab = tmp_path / "vocab.words"
  vocab.write_text("".join(s + "\n" for s in tokenizer.symbols))
  cfg = TransformerConfig(vocab_size=8, d_model=8, d_ff=16, num_heads=2, num_layers=1)
  trained = Trained(cfg, {}, tokenizer, vocabulary_tokens(tokenizer), str(vocab), [0])
  assert not trained.is_sentencepiece
  assert trained.vocabulary[4:] == ["(S", ")S", "XX", "the"]


def test_the_pictured_parse_is_the_median_one_not_the_best():
  from t2t_jax.data import trees
  from tools import parsing_figures

  words = list("abcdefghij")
  gold = trees.Tree(
    "S",
    (
      trees.Tree("NP", tuple(trees.Tree("XX", (w,)) for w in words[:5])),
      trees.Tree("VP", tuple(trees.Tree("XX", (w,)) for w in words[5:])),
    ),
  )
  flat = trees.Tree("S", tuple(trees.Tree("XX", (w,)) for w in words))
  half = trees.Tree("S", (gold.children[0], *gold.children[1].children))
  short = trees.Tree("S", (trees.Tree("XX", ("a",)),))
  # F1 by sentence: 100 (exact), 0 (flat), 66.7 (one of two phrases), and a 1-word sentence
  # that is not among the 10-20 word ones.
  parsed, golds = [gold, flat, half, short], [gold, gold, gold, short]
  assert parsing_figures.pick_example(parsed, golds) == 2
  assert parsing_figures.pick_example([flat, gold], [gold, gold]) == 0  # ties: the lower one


def test_the_task_constraint_takes_the_configs_tree_bounds():
  from t2t_jax.decoding.translator import task_constraint

  c = ml_collections.ConfigDict(dict(source="treebank", tree_leaves="xx"))
  tokenizer = WordTokenizer(["(S", ")S", "(NP", ")NP", "XX", "dog"])
  built = task_constraint(c, tokenizer)  # a workdir written before the fields: no bounds
  assert (built.max_depth, built.max_opens) == (64, 0)
  c.tree_max_depth, c.tree_max_opens = 9, 3
  built = task_constraint(c, tokenizer)
  assert (built.max_depth, built.max_opens) == (9, 3)
