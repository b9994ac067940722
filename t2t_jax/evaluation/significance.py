"""Paired significance tests of systems against a baseline on one test set, by sacreBLEU's own
implementation (sacrebleu.significance.PairedTest), with its defaults and signatures.

Paired bootstrap resampling (Koehn 2004; 'bs', 1000 resamples) gives each system's score,
the bootstrap mean and 95% confidence interval, and the p-value of its difference from the
baseline; approximate randomization ('ar', 10000 trials; Riezler and Maxwell 2005) gives the
p-value alone. The resampling seed is sacreBLEU's (12345, or $SACREBLEU_SEED), so the figures
are those `sacrebleu REF -i BASELINE SYSTEM ... --paired-bs` prints.

Three metrics: sacreBLEU and chrF with sacrebleu's defaults, and, given the target language,
the paper-style tokenized BLEU (t2t_jax.evaluation.scoring.tokenized_bleu: Moses tokens,
compounds split, unsmoothed), tested on the tokenized lines.

One departure: a system whose lines are all identical to the baseline's gets p = 1, the
probability of a difference of at least zero. sacreBLEU counts only resampled differences
strictly larger than the observed one, so for a copy of the baseline it reports 1 / (n + 1).
"""

import dataclasses
from collections.abc import Callable, Sequence

from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.metrics.base import Metric
from sacrebleu.significance import PairedTest

from t2t_jax.evaluation import scoring

METHODS = ("bs", "ar")
SIGNIFICANCE_LEVEL = 0.05  # the '*' of sacreBLEU's table


@dataclasses.dataclass(frozen=True)
class SystemResult:
  """One system's figures for one metric (scores 0-100)."""

  name: str
  score: float
  mean: float | None  # bootstrap estimate of the true score ('bs'; None for 'ar')
  ci: float | None  # half width of the 95% confidence interval around `mean`
  p_value: float | None  # against the baseline (None: the baseline itself)


@dataclasses.dataclass(frozen=True)
class MetricComparison:
  """A metric's figures for the baseline (first) and each system, and its signature."""

  label: str
  signature: str
  results: tuple[SystemResult, ...]


@dataclasses.dataclass(frozen=True)
class _Metric:
  label: str
  make: Callable[[], Metric]
  prepare: Callable[[str], str]  # applied to every hypothesis and reference line
  tok_name: str | None = None  # the tokenization named in the signature instead of 'none'


def _metrics(lang: str | None) -> list[_Metric]:
  same = lambda line: line
  chosen = [
    _Metric(scoring.SACREBLEU_LABEL, BLEU, same),
    _Metric(scoring.CHRF_LABEL, CHRF, same),
  ]
  if lang:
    chosen.append(
      _Metric(
        scoring.TOKENIZED_BLEU_LABEL,
        lambda: BLEU(tokenize="none", smooth_method="none", force=True),
        lambda line: " ".join(scoring.tokenize_for_bleu(line, lang)),
        f"moses-{lang}+compound-split",
      )
    )
  return chosen


def compare(
  baseline: tuple[str, Sequence[str]],
  systems: Sequence[tuple[str, Sequence[str]]],
  references: Sequence[str],
  lang: str | None = None,
  method: str = "bs",
  samples: int = 0,
) -> list[MetricComparison]:
  """Each metric's scores of `baseline` and `systems` ((name, lines) pairs, one line per
  reference) and each system's p-value against the baseline. `method`: 'bs' (paired
  bootstrap, with confidence intervals) or 'ar' (approximate randomization); `samples`:
  resamples or trials (0: sacreBLEU's 1000 or 10000); `lang`: the target language, which
  adds tokenized BLEU (None: not computed)."""
  if method not in METHODS:
    raise ValueError(f"method {method!r} is not one of {', '.join(METHODS)}")
  if not systems:
    raise ValueError("nothing to compare the baseline with: give at least one system")
  for name, lines in [baseline, *systems]:
    if len(lines) != len(references):
      raise ValueError(
        f"{name} has {len(lines)} lines but the reference has {len(references)}: need one "
        "translation per reference line"
      )
  return [
    _compare_one(metric, baseline, systems, references, method, samples)
    for metric in _metrics(lang)
  ]


def _compare_one(
  metric: _Metric,
  baseline: tuple[str, Sequence[str]],
  systems: Sequence[tuple[str, Sequence[str]]],
  references: Sequence[str],
  method: str,
  samples: int,
) -> MetricComparison:
  named = [(name, [metric.prepare(line) for line in lines]) for name, lines in [baseline, *systems]]
  refs = [[metric.prepare(line) for line in references]]
  test = PairedTest(named, {metric.label: metric.make()}, refs, test_type=method, n_samples=samples)
  signatures, scores = test()
  (key,) = signatures  # sacrebleu names the metric itself (BLEU, chrF2)
  signature = signatures[key].format()
  if metric.tok_name:
    signature = signature.replace("tok:none", f"tok:{metric.tok_name}")
  results = []
  for i, ((name, lines), result) in enumerate(zip([baseline, *systems], scores[key])):
    p_value = None if i == 0 else result.p_value
    if i > 0 and list(lines) == list(baseline[1]):
      p_value = 1.0  # see the module docstring
    results.append(
      SystemResult(name, float(result.score), _float(result.mean), _float(result.ci), p_value)
    )
  return MetricComparison(metric.label, f"{key}|{signature}", tuple(results))


def _float(value: float | None) -> float | None:
  return None if value is None else float(value)


def format_comparisons(comparisons: Sequence[MetricComparison], method: str = "bs") -> str:
  """One block per metric: its signature, then one line per system with its score, the
  bootstrap mean and 95% CI ('bs'), the difference from the baseline and the p-value, '*'
  below 0.05."""
  blocks = []
  width = max(len(r.name) for c in comparisons for r in c.results)
  for comparison in comparisons:
    lines = [f"{comparison.label}  {comparison.signature}"]
    base = comparison.results[0].score
    for i, r in enumerate(comparison.results):
      text = f"  {'baseline' if i == 0 else '':8s}  {r.name:<{width}}  {r.score:6.2f}"
      if r.mean is not None:
        text += f"  ({r.mean:6.2f} ± {r.ci:5.2f})"
      if r.p_value is not None:
        star = " *" if r.p_value < SIGNIFICANCE_LEVEL else ""
        text += f"  {r.score - base:+6.2f}  p = {r.p_value:.4f}{star}"
      lines.append(text)
    blocks.append("\n".join(lines))
  test = "paired bootstrap resampling" if method == "bs" else "approximate randomization"
  note = (
    f"{test}: p is the probability of a difference at least this large between two systems "
    f"that are the same process; '*': p < {SIGNIFICANCE_LEVEL}"
  )
  return "\n\n".join(blocks) + "\n\n" + note
