"""Which decoding rules a search runs (decoding/rules.py says what a rule is): the rules
every search has (the end at each output's limit; a forced prefix where the batch has
one; the task's constraint; EOS only at the limit for benchmarks) and the `REGISTRY` of
the rules a `SearchConfig` field turns on.

A new rule is its own module (a frozen dataclass with `init`, `choice` and `advance`) and
one entry here, (the SearchConfig field that sets it, the rule for a value that turns it
on): the settings carry it to `assembly.Decoding` and every mode applies it at the one
point where tokens are chosen, with no signature changed. Its field needs its check in
config.py's `_CHECKS` and its flag in cli/translate.py's SEARCH_FLAGS.
"""

from collections.abc import Callable
from typing import Any

from t2t_jax.decoding.config import SearchConfig
from t2t_jax.decoding.min_length import MinLengthRatio
from t2t_jax.decoding.no_repeat import NoRepeatNgram
from t2t_jax.decoding.rules import (
  Constrained,
  EndAtLimit,
  EosOnlyAtLimit,
  ForcePrefix,
  Rule,
  Rules,
)

# (SearchConfig field, the rule its value asks for; None: off), applied in this order.
REGISTRY: tuple[tuple[str, Callable[[Any], Rule | None]], ...] = (
  ("no_repeat_ngram", lambda n: NoRepeatNgram(n) if n > 0 else None),
  ("min_length_ratio", lambda ratio: MinLengthRatio(ratio) if ratio > 0 else None),
)


def registered(settings: SearchConfig) -> tuple[Rule, ...]:
  """The registered rules `settings` turn on (frozen: part of the programs' key)."""
  found = (make(getattr(settings, field)) for field, make in REGISTRY)
  return tuple(rule for rule in found if rule is not None)


def rules_of(
  *,
  prefix: bool,
  constraint: Any = None,
  eos_only_at_limit: bool = False,
  registered: tuple[Rule, ...] = (),
) -> Rules:
  """A search's rules: the end at the limit always, then those its batch and settings ask
  for."""
  members: list[Any] = [EndAtLimit()]
  if eos_only_at_limit:
    members.append(EosOnlyAtLimit())
  if prefix:
    members.append(ForcePrefix())
  if constraint is not None:
    members.append(Constrained(constraint))
  return Rules((*members, *registered))
