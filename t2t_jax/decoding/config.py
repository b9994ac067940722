"""How beam search decodes: the paper's settings (section 6.1) as one typed value.

Every caller of the search (the Translator, the trainer's evaluation, t2t-translate,
t2t-export, t2t-bench) and the experiment configs take their decoding defaults from
`SearchConfig`, so that the paper's numbers are written here only. This module imports
nothing heavy: experiment files read it before JAX is needed.
"""

import dataclasses
from collections.abc import Mapping
from typing import Any

# Beam search's stopping rules (search.beam_search's `stop`).
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
      faster, may differ; search._beam_search_done).
  """

  beam_size: int = 4
  alpha: float = 0.6
  max_output_extra: int = 50
  beam_stop: str = "exact"

  def __post_init__(self) -> None:
    if self.beam_stop not in STOP_RULES:
      raise ValueError(f"beam_stop={self.beam_stop!r} must be one of {', '.join(STOP_RULES)}")

  @classmethod
  def from_config(cls, config: Mapping[str, Any]) -> "SearchConfig":
    """The search an experiment config (or a workdir's config.json) asks for: its
    beam_size, alpha, max_output_extra and beam_stop, each defaulting to the paper's.

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


# The paper's search (section 6.1), the default of every entry that takes a SearchConfig.
PAPER_SEARCH = SearchConfig()
