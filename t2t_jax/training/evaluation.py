"""What the trainer does with the scores: dev loss over the pmapped eval step, the checkpoint
chosen on dev, and the test split translated (or parsed) once, at the end.

Only dev is read to choose a checkpoint (the paper's practice, section 6.2: "selected on the
development set"). The scores themselves are evaluation.evaluate's, shared with t2t-translate.
"""

import dataclasses
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

import jax
import numpy as np
from absl import logging
from flax.typing import VariableDict

from t2t_jax.data import trees
from t2t_jax.evaluation import evaluate
from t2t_jax.run import checkpoint, files
from t2t_jax.run.workdir import Workdir
from t2t_jax.training import parallel

if TYPE_CHECKING:  # the translator's module is loaded by whoever builds one
  from t2t_jax.decoding.config import SearchConfig
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


@dataclasses.dataclass
class Selection:
  """The outcome of `select_checkpoint`: the best spec, every candidate's dev score (of
  `metric`: 'dev_bleu', or 'dev_f1' for parsing) and steps."""

  best: str
  scores: dict[str, float]
  steps: dict[str, list[int]]
  num_sentences: int
  metric: str = "dev_bleu"

  def table(self) -> str:
    return "\n".join(
      f"  {spec:12s} {score:6.2f}  steps {self.steps[spec]}"
      + ("  <- selected" if spec == self.best else "")
      for spec, score in self.scores.items()
    )


def select_checkpoint(
  ckpts: checkpoint.Checkpoints,
  candidates: str,
  pairs: Pairs,
  translator_for: Callable[[str], "Translator"],
  search: "SearchConfig",
  metric: Callable[["Translator", Pairs, "SearchConfig"], float] = evaluate.bleu,
  metric_name: str = "dev_bleu",
) -> Selection:
  """Scores each candidate of `candidates` ('latest,average:3,best,...') by dev sacreBLEU (or by
  `metric(translator, pairs, search)`, higher is better, named `metric_name` in what is
  written), decoding with `search`.

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
        f"config.select_checkpoints: candidate {spec!r} is not 'latest', 'average:N', "
        f"'best', 'best:N', 'ema' or a kept step ({e})"
      ) from None
    scores[spec] = metric(translator_for(spec), pairs, search)
  if not scores:
    raise ValueError(
      f"config.select_checkpoints={candidates!r}: no candidate can be built from the "
      f"{available} checkpoint(s) kept"
    )
  best = max(scores, key=scores.get)
  return Selection(best, scores, steps_of, len(pairs), metric_name)


def write_selection(workdir: str, selection: Selection, search: "SearchConfig") -> str:
  """Writes <workdir>/selected.json (read by t2t-translate --checkpoint=selected|auto): the
  scores under their metric's name ('metric' says which; `Workdir.selection_scores`) and
  the beam_size and alpha they were decoded with."""
  path = Workdir(workdir).selected_file
  if jax.process_index() == 0:
    record = dict(
      checkpoint=selection.best,
      steps=selection.steps[selection.best],
      metric=selection.metric,
      **{selection.metric: selection.scores},
      dev_sentences=selection.num_sentences,
      beam_size=search.beam_size,
      alpha=search.alpha,
    )
    Workdir(workdir).write_selection(record)
  return path


def dev_search(bleu_beam_size: int, search: "SearchConfig") -> "SearchConfig":
  """The search of the trainer's dev decodings (dev scores and checkpoint selection):
  `search` with a beam of `bleu_beam_size` (0: its own). Selection scores several
  candidates on dev, so it decodes as cheaply as the periodic dev scores do."""
  return search.override(beam_size=bleu_beam_size or None)


def translate_test(
  translator: "Translator",
  pairs: Pairs,
  lang: str,
  search: "SearchConfig",
  output: str,
  source_name: str = "test",
) -> tuple[dict[str, float], str]:
  """Translates the test split, writes the translations to `output` (process 0) and returns
  the test_* metrics with a printable report (examples, exact match, the four scores)."""
  sources, refs = [s for s, _ in pairs], [r for _, r in pairs]
  t0 = time.time()
  hyps = translator.translate(sources, search=search, source_name=source_name)
  seconds = time.time() - t0
  metrics, scores_text = evaluate.score_report(hyps, refs, lang)
  if jax.process_index() == 0:
    files.atomic_write_text(output, "".join(h + "\n" for h in hyps))
  examples = "\n".join(
    f"  source:    {s}\n  output:    {h}\n  reference: {r}"
    for s, h, r in list(zip(sources, hyps, refs))[:3]
  )
  report = (
    f"test split: {len(pairs)} sentences translated in {seconds:.1f}s "
    f"(beam {search.beam_size}, alpha {search.alpha})\n{examples}\n"
    f"exact match {100 * metrics['test_exact_match']:.2f}%\n{scores_text}"
  )
  return metrics, report


def parse_test(
  translator: "Translator",
  pairs: Pairs,
  golds: Sequence[trees.Tree],
  search: "SearchConfig",
  workdir: str,
  source_name: str = "test",
  leaves: str = "xx",
) -> tuple[dict[str, float], str]:
  """Parses the test split; writes <workdir>/test.words (inputs), test.gold (gold trees) and
  test.trees (the outputs rebuilt as trees), one per line (process 0); returns the test_*
  metrics and a printable report with examples. `leaves`: the targets' leaf form."""
  sources = [s for s, _ in pairs]
  t0 = time.time()
  outputs = translator.translate(sources, search=search, source_name=source_name)
  seconds = time.time() - t0
  metrics, text = evaluate.parse_report(outputs, sources, golds, leaves)
  parsed = [str(trees.rebuild(o, g.leaves(), leaves)[0]) for o, g in zip(outputs, golds)]
  if jax.process_index() == 0:
    for name, lines in (("words", sources), ("gold", map(str, golds)), ("trees", parsed)):
      content = "".join(line + "\n" for line in lines)
      files.atomic_write_text(Workdir(workdir).test_file(name), content)
  examples = "\n".join(
    f"  input:  {s}\n  output: {o}\n  gold:   {r}"
    for s, o, (_, r) in list(zip(sources, outputs, pairs))[:2]
  )
  report = (
    f"test split: {len(pairs)} sentences parsed in {seconds:.1f}s (beam {search.beam_size}, "
    f"alpha {search.alpha})\n{examples}\n{text}"
  )
  return metrics, report
