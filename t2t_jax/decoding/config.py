"""How beam search decodes: the paper's settings (section 6.1) as one typed value.

Every caller of the search (the Translator, the trainer's evaluation, t2t-translate,
t2t-export, t2t-bench) and the experiment configs take their decoding defaults from
`SearchConfig`, so that the paper's numbers are written here only. This module imports
nothing heavy: experiment files read it before JAX is needed.
"""

import dataclasses
from collections.abc import Mapping
from typing import Any

# Beam search's stopping rules (`beam.Stop`'s rule).
STOP_RULES = ("exact", "heuristic")


@dataclasses.dataclass(frozen=True)
class SearchConfig:
  """The settings of one beam (or greedy) search.

  Attributes:
    beam_size: hypotheses kept per sentence (paper 6.1: 4; 6.3, parsing: 21); 1 is greedy
      decoding.
    alpha: exponent of the GNMT length penalty ((5 + length) / 6)^alpha that scores are
      divided by (paper 6.1: 0.6; 6.3: 0.3).
    max_output_extra: an output may be this many tokens longer than its source (paper 6.1:
      input length + 50; 6.3: + 300), capped at the model's max_len.
    beam_stop: when a sentence is done: 'exact' (tensor2tensor's rule: no live hypothesis can
      still enter the finished set) or 'heuristic' (none would if it ended at the next step:
      faster, may differ; beam.beam_done).
    sampling: draw each output token from the model's distribution instead of searching
      (`modes.Sample`); needs beam_size 1. The fields below shape that distribution.
    sampling_temperature: the log-probabilities are divided by it (> 0; below 1 sharper,
      towards 0 greedy).
    sampling_topk: only the k most probable tokens of each step can be drawn (0: all).
    sampling_topp: only the nucleus (Holtzman et al. 2020), the most probable tokens whose
      probabilities add up to at least p, can be drawn ((0, 1]; 1: all).
    num_samples: outputs drawn per sentence.
    sampling_seed: sample j of the sentence at input index i uses the key
      fold_in(fold_in(PRNGKey(seed), i), j), so it does not depend on the batch it is in.
    constrained: a task whose outputs have a grammar (parsing: well-formed trees over the
      source's words, decoding/constraints.py) is decoded under it, so that no output is
      malformed; False decodes the model as it is. No effect on translation.
    no_repeat_ngram: no output holds the same n tokens twice (decoding/no_repeat.py;
      fairseq's --no-repeat-ngram-size); 0: off.
    min_length_ratio: no output ends before it holds this many times its source's tokens
      (both counting EOS; decoding/min_length.py), within its limit; 0: off.
    diverse_groups, diversity_strength: diverse beam search (decoding/diverse.py): the beam
      in groups that choose in turn, each lowering by the strength the tokens the groups
      before it chose at the step; 1 group: plain beam search. Must divide beam_size.
  """

  beam_size: int = 4
  alpha: float = 0.6
  max_output_extra: int = 50
  beam_stop: str = "exact"
  sampling: bool = False
  sampling_temperature: float = 1.0
  sampling_topk: int = 0
  sampling_topp: float = 1.0
  num_samples: int = 1
  sampling_seed: int = 0
  constrained: bool = True
  no_repeat_ngram: int = 0
  min_length_ratio: float = 0.0
  diverse_groups: int = 1
  diversity_strength: float = 0.5

  def __post_init__(self) -> None:
    for f in dataclasses.fields(self):
      self.check_field(f.name, getattr(self, f.name))
    if self.beam_size % self.diverse_groups:
      raise ValueError(
        f"diverse_groups={self.diverse_groups} must divide beam_size={self.beam_size}"
      )
    if self.sampling and self.beam_size != 1:
      raise ValueError(
        f"sampling=True draws tokens, it does not search: beam_size={self.beam_size} must be 1"
      )

  @staticmethod
  def check_field(name: str, value: Any) -> None:
    """ValueError 'NAME=VALUE must ...' unless `value` is one field `name` can hold alone
    (the checks across fields are __post_init__'s): the one place each is written, for
    the commands' flags as for configs and calls."""
    if name in _CHECKS and not _CHECKS[name][0](value):
      raise ValueError(f"{name}={value!r} {_CHECKS[name][1]}")

  @property
  def hypotheses(self) -> int:
    """Outputs the search returns per sentence: num_samples when sampling, else beam_size."""
    return self.num_samples if self.sampling else self.beam_size

  def check_nbest(self, nbest: int | None) -> None:
    """ValueError unless an n-best list of `nbest` outputs per sentence (None: the best
    output alone) is one this search returns: 1 to `hypotheses`."""
    if nbest is None or 1 <= nbest <= self.hypotheses:
      return
    most = f"num_samples={self.num_samples}" if self.sampling else f"beam_size={self.beam_size}"
    raise ValueError(f"nbest={nbest}: must be between 1 and {most}")

  @classmethod
  def from_config(cls, config: Mapping[str, Any]) -> "SearchConfig":
    """The search an experiment config (or a workdir's config.json) asks for: its
    beam_size, alpha, max_output_extra, beam_stop and sampling fields, each defaulting to
    the paper's (no sampling).

    A bad value raises ValueError naming the config field (config.beam_stop=...)."""
    values = {f.name: config[f.name] for f in dataclasses.fields(cls) if f.name in config}
    try:
      return cls(**values)
    except ValueError as e:
      raise ValueError(f"config.{e}") from None

  def override(self, **values: Any) -> "SearchConfig":
    """This search with the given fields replaced; None leaves a field as it is (a flag or
    keyword argument the user did not set)."""
    return dataclasses.replace(self, **{k: v for k, v in values.items() if v is not None})

  def config_fields(self) -> dict[str, Any]:
    """The fields as an experiment config holds them (config.beam_size, ...)."""
    return dataclasses.asdict(self)


# Each field's check of its value alone (SearchConfig.check_field): (ok, what it must be).
_CHECKS: dict[str, tuple[Any, str]] = {
  "beam_size": (lambda v: v >= 1, "must be >= 1 (1: greedy)"),
  "beam_stop": (lambda v: v in STOP_RULES, f"must be one of {', '.join(STOP_RULES)}"),
  "sampling_temperature": (lambda v: v > 0, "must be > 0"),
  "sampling_topk": (lambda v: v >= 0, "must be >= 0 (0: all tokens)"),
  "sampling_topp": (lambda v: 0 < v <= 1, "must be in (0, 1] (1: all tokens)"),
  "num_samples": (lambda v: v >= 1, "must be >= 1"),
  "no_repeat_ngram": (lambda v: v >= 0, "must be >= 0 (0: off)"),
  "min_length_ratio": (lambda v: v >= 0, "must be >= 0 (0: off)"),
  "diverse_groups": (lambda v: v >= 1, "must be >= 1 (1: off)"),
  "diversity_strength": (lambda v: v >= 0, "must be >= 0"),
}

# The paper's search (section 6.1), the default of every entry that takes a SearchConfig.
PAPER_SEARCH = SearchConfig()
