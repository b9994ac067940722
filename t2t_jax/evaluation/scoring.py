r"""Corpus scores of detokenized translations against one reference each.

Four figures, reported side by side because they are not comparable with each other:

- sacreBLEU (cased, 13a tokenizer, sacrebleu defaults), with its signature: the number to
  compare with other papers' sacreBLEU.
- tokenized BLEU in the style of the paper's numbers (tensor2tensor's get_ende_bleu.sh):
  hyphenated compounds split as `##AT##-##AT##`, text tokenized, then corpus BLEU with
  uniform 4-gram weights, brevity penalty and no smoothing (multi-bleu.perl). It usually
  comes out higher than sacreBLEU.
- lowercased BLEU on Moses tokens (tokenizer.perl -l LANG -no-escape, lowercased, no
  compound split, multi-bleu.perl -lc): the convention of most Multi30k papers, whose
  tokenized, lowercased test data they score.
- chrF (sacrebleu defaults), with its signature.

The tokenized BLEU follows get_ende_bleu.sh step by step: Moses tokenizer.perl -l LANG (here
sacremoses, the Python port, with the same default escaping of & < > ' " as the script),
then the compound split perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g', then
multi-bleu.perl, computed as sacrebleu's BLEU on the tokenized text (tokenize='none',
smooth_method='none', cased), which gives multi-bleu.perl's figure.
"""

import dataclasses
import functools
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.metrics.base import Metric

COMPOUND_MARK = "##AT##-##AT##"
SACREBLEU_LABEL = "sacreBLEU (cased, 13a)"
TOKENIZED_BLEU_LABEL = "tokenized BLEU (Moses, compound-split)"
LOWERCASED_BLEU_LABEL = "lowercased BLEU (Moses tokens)"
CHRF_LABEL = "chrF"

# get_ende_bleu.sh: perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g'. Matches do not overlap,
# as in perl, so a one-character part between two hyphens ("a-b-c") keeps its second hyphen.
_COMPOUND_RE = re.compile(r"(\S)-(\S)")


@dataclasses.dataclass(frozen=True)
class CorpusScore:
  label: str  # what the figure is, e.g. "sacreBLEU (cased, 13a)"
  score: float  # 0-100
  signature: str  # how it was computed (sacrebleu signature, plus the tokenization used)
  details: str  # sacrebleu's one-line result (for BLEU: n-gram precisions, brevity penalty)


def split_compounds(text: str) -> str:
  """'state-of-the-art' -> 'state ##AT##-##AT## of ##AT##-##AT## the ##AT##-##AT## art'."""
  return _COMPOUND_RE.sub(r"\1 " + COMPOUND_MARK + r" \2", text)


@functools.cache
def _moses(lang: str) -> Any:
  """sacremoses.MosesTokenizer, imported here: it is slow to import and only tokenized BLEU
  needs it, not every process that scores."""
  import sacremoses

  return sacremoses.MosesTokenizer(lang=lang)


def tokenize_for_bleu(text: str, lang: str = "de") -> list[str]:
  """Moses tokenization (tokenizer.perl -l lang, escaping on), then the compound split."""
  return split_compounds(_moses(lang).tokenize(text, escape=True, return_str=True)).split()


def _check(hyps: Sequence[str], refs: Sequence[str]) -> tuple[list[str], list[str]]:
  if isinstance(hyps, str) or isinstance(refs, str):
    raise TypeError("hyps and refs are lists of sentences, not single strings")
  hyps, refs = list(hyps), list(refs)
  if len(hyps) != len(refs):
    raise ValueError(
      f"{len(hyps)} hypotheses but {len(refs)} references: "
      "need exactly one reference per hypothesis"
    )
  return hyps, refs


def _score(metric: Metric, label: str, hyps: list[str], refs: list[str]) -> CorpusScore:
  result = metric.corpus_score(hyps, [refs])
  return CorpusScore(
    label=label,
    score=float(result.score),
    signature=f"{result.name}|{metric.get_signature()}",
    details=str(result),
  )


def sacrebleu_score(hyps: Sequence[str], refs: Sequence[str]) -> CorpusScore:
  """sacreBLEU with sacrebleu's defaults: cased, 13a tokenizer, exp smoothing."""
  hyps, refs = _check(hyps, refs)
  return _score(BLEU(), SACREBLEU_LABEL, hyps, refs)


def chrf_score(hyps: Sequence[str], refs: Sequence[str]) -> CorpusScore:
  """chrF with sacrebleu's defaults (character 6-grams, beta 2)."""
  hyps, refs = _check(hyps, refs)
  return _score(CHRF(), CHRF_LABEL, hyps, refs)


def _bleu_on_tokens(
  hyps: Sequence[str],
  refs: Sequence[str],
  label: str,
  tokenize_line: Callable[[str], str],
  tok_name: str,
  lowercase: bool = False,
) -> CorpusScore:
  """multi-bleu.perl on our own tokenization: unsmoothed corpus BLEU of space-split tokens,
  with the tokenization named in the signature."""
  hyps, refs = _check(hyps, refs)
  tokenize = lambda lines: [tokenize_line(line) for line in lines]
  metric = BLEU(tokenize="none", smooth_method="none", lowercase=lowercase, force=True)
  score = _score(metric, label, tokenize(hyps), tokenize(refs))
  return dataclasses.replace(
    score, signature=score.signature.replace("tok:none", f"tok:{tok_name}")
  )


def tokenized_bleu(hyps: Sequence[str], refs: Sequence[str], lang: str = "de") -> CorpusScore:
  """The paper-style figure: `tokenize_for_bleu`, then unsmoothed 4-gram corpus BLEU."""
  return _bleu_on_tokens(
    hyps,
    refs,
    TOKENIZED_BLEU_LABEL,
    lambda line: " ".join(tokenize_for_bleu(line, lang)),
    f"moses-{lang}+compound-split",
  )


def lowercased_bleu(hyps: Sequence[str], refs: Sequence[str], lang: str = "de") -> CorpusScore:
  """Moses tokens (no XML escaping, no compound split), lowercased, unsmoothed corpus BLEU."""
  return _bleu_on_tokens(
    hyps,
    refs,
    LOWERCASED_BLEU_LABEL,
    lambda line: _moses(lang).tokenize(line, escape=False, return_str=True),
    f"moses-{lang}",
    lowercase=True,
  )


def exact_match(hyps: Sequence[str], refs: Sequence[str]) -> float:
  """Fraction of hypotheses identical to their reference (after stripping outer spaces)."""
  hyps, refs = _check(hyps, refs)
  if not hyps:
    return 0.0
  return sum(h.strip() == r.strip() for h, r in zip(hyps, refs)) / len(hyps)


def score_all(hyps: Sequence[str], refs: Sequence[str], lang: str = "de") -> dict[str, CorpusScore]:
  """{'sacrebleu', 'tokenized_bleu', 'lowercased_bleu', 'chrf'} -> CorpusScore; `lang` is
  the target language."""
  hyps, refs = _check(hyps, refs)
  return {
    "sacrebleu": sacrebleu_score(hyps, refs),
    "tokenized_bleu": tokenized_bleu(hyps, refs, lang),
    "lowercased_bleu": lowercased_bleu(hyps, refs, lang),
    "chrf": chrf_score(hyps, refs),
  }


def format_scores(scores: Mapping[str, CorpusScore]) -> str:
  """One aligned line per figure: label, score, signature."""
  width = max(len(s.label) for s in scores.values())
  return "\n".join(f"{s.label:<{width}}  {s.score:6.2f}  {s.signature}" for s in scores.values())
