"""decoding.SearchConfig: the paper's defaults, read from experiment configs, overridden."""

import dataclasses

import pytest

from t2t_jax.decoding import PAPER_SEARCH, SearchConfig
from t2t_jax.experiments import base, parsing


def test_paper_defaults_are_the_base_experiment_fields():
  assert SearchConfig(4, 0.6, 50, "exact") == PAPER_SEARCH  # paper 6.1
  config = base.get_config()
  assert SearchConfig.from_config(config) == PAPER_SEARCH
  assert {f.name: config[f.name] for f in dataclasses.fields(SearchConfig)} == (
    PAPER_SEARCH.config_fields()
  )


def test_from_config_reads_the_parsing_search_and_defaults_missing_fields():
  assert SearchConfig.from_config(parsing.get_config()) == SearchConfig(21, 0.3, 300, "exact")
  assert SearchConfig.from_config({"alpha": 1.0}) == SearchConfig(alpha=1.0)


def test_override_leaves_fields_given_as_none():
  search = SearchConfig(beam_size=2).override(beam_size=None, alpha=0.0, beam_stop=None)
  assert search == SearchConfig(beam_size=2, alpha=0.0)


def test_a_bad_stop_rule_names_the_field():
  with pytest.raises(ValueError, match="^beam_stop='never' must be one of exact, heuristic$"):
    SearchConfig(beam_stop="never")
  with pytest.raises(ValueError, match=r"^config\.beam_stop='never' must be one of"):
    SearchConfig.from_config({"beam_stop": "never"})
  with pytest.raises(dataclasses.FrozenInstanceError):
    PAPER_SEARCH.beam_size = 8
