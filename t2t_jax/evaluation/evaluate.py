"""What a run is judged by: dev loss, dev BLEU (parsing: dev F1), the checkpoint chosen on
dev, the test split.

The trainer calls these during and after training; t2t-translate prints `score_report`.
Only dev is read to choose a checkpoint (the paper's practice, section 6.2: "selected on the
development set"); the test split is translated once, at the end.
"""

import dataclasses
import json
import os
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

import jax
import ml_collections
import numpy as np
from absl import logging
from flax.typing import VariableDict

from t2t_jax.data import sources, trees
from t2t_jax.data.sources import treebank
from t2t_jax.evaluation import parseval, scoring
from t2t_jax.training import checkpoint, parallel
from t2t_jax.training import workdir as workdir_lib

if TYPE_CHECKING:  # the translator's module is loaded by whoever builds one
  from t2t_jax.decoding.translator import Translator

Pairs = Sequence[tuple[str, str]]


def dev_loss(
  p_eval: Callable[..., dict[str, jax.Array]],
  p_params: VariableDict,
  batches: Iterable[dict[str, np.ndarray]],
) -> dict[str, float]:
  """Teacher-forced loss, NLL, accuracy and perplexity per target token over `batches`.

  `p_eval` is the pmapped eval step (returns per-device sums); the sums of all devices and
  batches are divided once, so every target token weighs the same.
  """
  totals = None
  for batch in batches:
    sums = parallel.host_metrics(p_eval(p_params, parallel.shard(batch)))
    totals = sums if totals is None else {k: totals[k] + sums[k] for k in totals}
  if not totals:
    return {}
  denom = max(totals["denominator"], 1.0)
  return dict(
    eval_loss=totals["loss"] / denom,
    eval_nll=totals["nll"] / denom,
    eval_accuracy=totals["correct"] / denom,
    eval_perplexity=float(np.exp(min(totals["nll"] / denom, 50.0))),
  )


def bleu(
  translator: "Translator", pairs: Pairs, beam_size: int, alpha: float, source_name: str = "dev"
) -> float:
  """sacreBLEU of `translator` on (source, reference) pairs (`source_name` labels warnings)."""
  hyps = translator.translate([s for s, _ in pairs], beam_size, alpha, source_name=source_name)
  return scoring.sacrebleu_score(hyps, [r for _, r in pairs]).score


def is_parsing(data_config: ml_collections.ConfigDict) -> bool:
  """A parsing experiment is scored by bracket F1 (paper 6.3), not BLEU."""
  source = sources.find(data_config.get("source", ""))
  return source is not None and source.scores_trees


def gold_trees(
  data_config: ml_collections.ConfigDict, split: str, pairs: Pairs
) -> list[trees.Tree]:
  """The gold trees (tags kept) of the first len(pairs) pairs of a treebank split; raises if
  their words are not the pairs' sources."""
  golds = treebank.gold_trees(data_config, split)[: len(pairs)]
  for i, (gold, (source, _)) in enumerate(zip(golds, pairs)):
    if " ".join(gold.leaves()) != source:
      raise ValueError(f"{split} pair {i + 1}: source {source!r} is not its gold tree's words")
  return golds


def f1(
  translator: "Translator",
  pairs: Pairs,
  golds: Sequence[trees.Tree],
  beam_size: int,
  alpha: float,
  source_name: str = "dev",
) -> parseval.ParseScore:
  """EVALB bracket F1 (`parseval.ParseScore`) of parsing the pairs' sources."""
  outputs = translator.translate([s for s, _ in pairs], beam_size, alpha, source_name=source_name)
  return parseval.score_outputs(outputs, golds)


def dev_metrics(
  translator: "Translator",
  pairs: Pairs,
  beam_size: int,
  alpha: float,
  data_config: ml_collections.ConfigDict,
  source_name: str = "dev",
) -> dict[str, float]:
  """{'dev_bleu': sacreBLEU} or, for parsing, {'dev_f1': bracket F1} of `pairs`."""
  if is_parsing(data_config):
    golds = gold_trees(data_config, "dev", pairs)
    return dict(dev_f1=f1(translator, pairs, golds, beam_size, alpha, source_name).f1)
  return dict(dev_bleu=bleu(translator, pairs, beam_size, alpha, source_name))


def read_gold_trees(path: str) -> list[trees.Tree]:
  """Bracketed gold trees (treebank .mrg layout, or one per line), cleaned like the training
  trees; ValueError names the file, the tree and the line."""
  with open(path, encoding="utf-8") as f:
    text = f.read()
  out = []
  try:
    for tree, line in trees.parse_brackets(text):
      cleaned = trees.clean(tree)
      if cleaned is None:
        raise trees.BracketError(f"line {line}: a tree without words")
      out.append(cleaned)
  except trees.BracketError as e:
    raise ValueError(f"{path}: tree {len(out) + 1}: {e}") from None
  return out


def parse_report(
  outputs: Sequence[str], sources: Sequence[str], golds: Sequence[trees.Tree]
) -> tuple[dict[str, float], str]:
  """test_* metrics and the printable F1 line of linearized outputs against gold trees."""
  for i, (source, gold) in enumerate(zip(sources, golds)):
    if source.split() != gold.leaves():
      raise ValueError(f"input line {i + 1}: {source!r} is not the words of gold tree {i + 1}")
  score = parseval.score_outputs(outputs, golds)
  metrics = dict(
    test_f1=score.f1,
    test_precision=score.precision,
    test_recall=score.recall,
    test_exact_match=score.exact / 100,
    test_rebalanced=score.rebalanced,
    test_wrong_leaf_count=score.wrong_leaf_count,
  )
  return metrics, score.summary()


def parse_test(
  translator: "Translator",
  pairs: Pairs,
  golds: Sequence[trees.Tree],
  beam_size: int,
  alpha: float,
  workdir: str,
  source_name: str = "test",
) -> tuple[dict[str, float], str]:
  """Parses the test split; writes <workdir>/test.words (inputs), test.gold (gold trees) and
  test.trees (the outputs rebuilt as trees), one per line (process 0); returns the test_*
  metrics and a printable report with examples."""
  sources = [s for s, _ in pairs]
  t0 = time.time()
  outputs = translator.translate(sources, beam_size, alpha, source_name=source_name)
  seconds = time.time() - t0
  metrics, text = parse_report(outputs, sources, golds)
  parsed = [str(trees.rebuild(o, g.leaves())[0]) for o, g in zip(outputs, golds)]
  if jax.process_index() == 0:
    for name, lines in (("words", sources), ("gold", map(str, golds)), ("trees", parsed)):
      text = "".join(line + "\n" for line in lines)
      workdir_lib.atomic_write_text(os.path.join(workdir, f"test.{name}"), text)
  examples = "\n".join(
    f"  input:  {s}\n  output: {o}\n  gold:   {r}"
    for s, o, (_, r) in list(zip(sources, outputs, pairs))[:2]
  )
  report = (
    f"test split: {len(pairs)} sentences parsed in {seconds:.1f}s (beam {beam_size}, alpha "
    f"{alpha})\n{examples}\n{text}"
  )
  return metrics, report


def score_report(
  hyps: Sequence[str], refs: Sequence[str], lang: str
) -> tuple[dict[str, float], str]:
  """Every score of `scoring.score_all` as test_* metrics, and the labelled text to print."""
  scores = scoring.score_all(hyps, refs, lang)
  metrics = dict(
    test_exact_match=scoring.exact_match(hyps, refs),
    test_bleu=scores["sacrebleu"].score,
    test_tokenized_bleu=scores["tokenized_bleu"].score,
    test_lowercased_bleu=scores["lowercased_bleu"].score,
    test_chrf=scores["chrf"].score,
  )
  return metrics, scoring.format_scores(scores)


@dataclasses.dataclass
class Selection:
  """The outcome of `select_checkpoint`: the best spec, every candidate's dev BLEU and steps."""

  best: str
  dev_bleu: dict[str, float]
  steps: dict[str, list[int]]
  num_sentences: int

  def table(self) -> str:
    return "\n".join(
      f"  {spec:12s} {score:6.2f}  steps {self.steps[spec]}"
      + ("  <- selected" if spec == self.best else "")
      for spec, score in self.dev_bleu.items()
    )


def select_checkpoint(
  ckpts: checkpoint.Checkpoints,
  candidates: str,
  pairs: Pairs,
  translator_for: Callable[[str], "Translator"],
  beam_size: int,
  alpha: float,
  metric: Callable[["Translator", Pairs, int, float], float] = bleu,
) -> Selection:
  """Scores each candidate of `candidates` ('latest,average:3,...') by dev sacreBLEU (or by
  `metric(translator, pairs, beam_size, alpha)`, higher is better).

  `translator_for(spec)` builds a Translator on that checkpoint spec. Averages of more
  checkpoints than are kept are skipped with a warning; ties go to the first listed.
  """
  specs = [s.strip() for s in candidates.split(",") if s.strip()]
  available = len(ckpts.steps())
  scores, steps_of = {}, {}
  for spec in specs:
    if spec.startswith("average:") and spec[8:].isdigit() and int(spec[8:]) > available:
      logging.warning("select: %s skipped, only %d checkpoints kept", spec, available)
      continue
    try:
      steps_of[spec] = checkpoint.choose_steps(ckpts, spec)
    except checkpoint.CheckpointSpecError as e:  # name the config field, not a flag
      raise ValueError(
        f"config.select_checkpoints: candidate {spec!r} is not 'latest', 'average:N' or a "
        f"kept step ({e})"
      ) from None
    scores[spec] = metric(translator_for(spec), pairs, beam_size, alpha)
  if not scores:
    raise ValueError(
      f"config.select_checkpoints={candidates!r}: no candidate can be built from the "
      f"{available} checkpoint(s) kept"
    )
  best = max(scores, key=scores.get)
  return Selection(best, scores, steps_of, len(pairs))


def write_selection(workdir: str, selection: Selection, beam_size: int, alpha: float) -> str:
  """Writes <workdir>/selected.json (read by t2t-translate --checkpoint=selected|auto)."""
  path = os.path.join(workdir, checkpoint.SELECTED_FILE)
  if jax.process_index() == 0:
    record = dict(
      checkpoint=selection.best,
      steps=selection.steps[selection.best],
      dev_bleu=selection.dev_bleu,
      dev_sentences=selection.num_sentences,
      beam_size=beam_size,
      alpha=alpha,
    )
    workdir_lib.atomic_write_text(path, json.dumps(record, indent=1))
  return path


def translate_test(
  translator: "Translator",
  pairs: Pairs,
  lang: str,
  beam_size: int,
  alpha: float,
  output: str,
  source_name: str = "test",
) -> tuple[dict[str, float], str]:
  """Translates the test split, writes the translations to `output` (process 0) and returns
  the test_* metrics with a printable report (examples, exact match, the four scores)."""
  sources, refs = [s for s, _ in pairs], [r for _, r in pairs]
  t0 = time.time()
  hyps = translator.translate(sources, beam_size, alpha, source_name=source_name)
  seconds = time.time() - t0
  metrics, scores_text = score_report(hyps, refs, lang)
  if jax.process_index() == 0:
    workdir_lib.atomic_write_text(output, "".join(h + "\n" for h in hyps))
  examples = "\n".join(
    f"  source:    {s}\n  output:    {h}\n  reference: {r}"
    for s, h, r in list(zip(sources, hyps, refs))[:3]
  )
  report = (
    f"test split: {len(pairs)} sentences translated in {seconds:.1f}s "
    f"(beam {beam_size}, alpha {alpha})\n{examples}\n"
    f"exact match {100 * metrics['test_exact_match']:.2f}%\n{scores_text}"
  )
  return metrics, report
