"""A translator's scores: dev BLEU (parsing: bracket F1) and the test report of outputs
against references or gold trees.

The trainer's evaluation (training.evaluation) and t2t-translate both score with these;
nothing here needs the trainer, so scoring a finished workdir never loads it.
"""

from collections.abc import Sequence
from typing import TYPE_CHECKING

import ml_collections

from t2t_jax.data import sources, trees
from t2t_jax.data.sources import treebank
from t2t_jax.evaluation import parseval

if TYPE_CHECKING:  # the translator's module is loaded by whoever builds one
  from t2t_jax.decoding.config import SearchConfig
  from t2t_jax.decoding.translator import Translator

Pairs = Sequence[tuple[str, str]]


def bleu(
  translator: "Translator", pairs: Pairs, search: "SearchConfig", source_name: str = "dev"
) -> float:
  """sacreBLEU of `translator` decoding with `search` on (source, reference) pairs
  (`source_name` labels warnings)."""
  from t2t_jax.evaluation import scoring  # sacrebleu: only where text is scored

  sources = [s for s, _ in pairs]
  hyps = translator.translate(sources, search=search, source_name=source_name)
  return scoring.sacrebleu_score(hyps, [r for _, r in pairs]).score


def is_parsing(data_config: ml_collections.ConfigDict) -> bool:
  """A parsing experiment is scored by bracket F1 (paper 6.3), not BLEU."""
  source = sources.find(data_config.source)
  return source is not None and source.scores_trees


def tree_leaves(data_config: ml_collections.ConfigDict) -> str | None:
  """The leaf form of a parsing experiment's targets (trees.TREE_LEAVES; 'xx' for a workdir
  written before there was a choice), or None when it is not a parsing experiment."""
  if not is_parsing(data_config):
    return None
  return data_config.get("tree_leaves", "xx")


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
  search: "SearchConfig",
  source_name: str = "dev",
  leaves: str = "xx",
) -> parseval.ParseScore:
  """EVALB bracket F1 (`parseval.ParseScore`) of parsing the pairs' sources with `search`;
  the outputs' leaf tokens are of the form `leaves` (config.data.tree_leaves)."""
  sources = [s for s, _ in pairs]
  outputs = translator.translate(sources, search=search, source_name=source_name)
  return parseval.score_outputs(outputs, golds, leaves)


def dev_metrics(
  translator: "Translator",
  pairs: Pairs,
  search: "SearchConfig",
  data_config: ml_collections.ConfigDict,
  source_name: str = "dev",
) -> dict[str, float]:
  """{'dev_bleu': sacreBLEU} or, for parsing, {'dev_f1': bracket F1} of `pairs`."""
  if is_parsing(data_config):
    golds = gold_trees(data_config, "dev", pairs)
    score = f1(translator, pairs, golds, search, source_name, data_config.tree_leaves)
    return dict(dev_f1=score.f1)
  return dict(dev_bleu=bleu(translator, pairs, search, source_name))


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
  outputs: Sequence[str],
  sources: Sequence[str],
  golds: Sequence[trees.Tree],
  leaves: str = "xx",
) -> tuple[dict[str, float], str]:
  """test_* metrics and the printable F1 line of linearized outputs (leaf tokens of the form
  `leaves`) against gold trees."""
  for i, (source, gold) in enumerate(zip(sources, golds)):
    if source.split() != gold.leaves():
      raise ValueError(f"input line {i + 1}: {source!r} is not the words of gold tree {i + 1}")
  score = parseval.score_outputs(outputs, golds, leaves)
  metrics = dict(
    test_f1=score.f1,
    test_precision=score.precision,
    test_recall=score.recall,
    test_exact_match=score.exact / 100,
    test_rebalanced=score.rebalanced,
    test_wrong_leaf_count=score.wrong_leaf_count,
  )
  return metrics, score.summary()


def score_report(
  hyps: Sequence[str], refs: Sequence[str], lang: str
) -> tuple[dict[str, float], str]:
  """Every score of `scoring.score_all` as test_* metrics, and the labelled text to print."""
  from t2t_jax.evaluation import scoring  # sacrebleu: only where text is scored

  scores = scoring.score_all(hyps, refs, lang)
  metrics = dict(
    test_exact_match=scoring.exact_match(hyps, refs),
    test_bleu=scores["sacrebleu"].score,
    test_tokenized_bleu=scores["tokenized_bleu"].score,
    test_lowercased_bleu=scores["lowercased_bleu"].score,
    test_chrf=scores["chrf"].score,
  )
  return metrics, scoring.format_scores(scores)
