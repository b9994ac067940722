"""check(config): the whole experiment config made into its typed parts and checked at once,
before a command reads or writes anything.

Every field is checked for its type, then for its value alone (each part's own rules:
TrainConfig, SearchConfig, TransformerConfig, the data config and its sources), then against
the fields it must agree with, then by the experiment's own `check_config` where its file has
one. The first problem is a ConfigError (or the data config's DataError) of one line that
names the field or fields, `config.FIELD=VALUE`, and the rule. t2t-train, t2t-prepare and
t2t-bench call it right after parsing their flags; `train_and_evaluate` calls it too.

A rule tying warmup_steps to num_train_steps is deliberately absent: a warmup longer than
the run (the rate still rising when it ends) is what a short trial run or a fine-tuning run
cut by its time limit may want.
"""

import dataclasses
import types
from collections.abc import Callable
from typing import Any, NamedTuple

import jax.numpy as jnp
import ml_collections

from t2t_jax import data as data_lib
from t2t_jax.data import config as data_config
from t2t_jax.decoding import SearchConfig
from t2t_jax.model import TransformerConfig
from t2t_jax.run.checkpoint import EMA
from t2t_jax.training import best, evaluation, profile
from t2t_jax.training import config as config_lib


class ConfigError(ValueError):
  """A config value that makes no sense; names the field."""


# The model's vocabulary size is known only once the vocabulary is built or read (after the
# data is prepared), so the model's fields are checked with this one in its place: any
# positive size passes TransformerConfig's rules, and no other rule reads it.
PLACEHOLDER_VOCAB_SIZE = 1000

# Search fields SearchConfig leaves to its callers, checked here for a config's values.
_SEARCH_CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {
  "alpha": (lambda v: v >= 0, "must be >= 0 (0: no length penalty)"),
  "max_output_extra": (lambda v: v >= 0, "must be >= 0"),
  "sampling_seed": (lambda v: 0 <= v < 2**31, "must be in [0, 2^31): an int32 key"),
}


class Checked(NamedTuple):
  """A config that passed `check`, with its defaults filled, and its typed parts."""

  config: ml_collections.ConfigDict
  train: config_lib.TrainConfig
  search: SearchConfig
  model: TransformerConfig  # its vocab_size is PLACEHOLDER_VOCAB_SIZE
  source: data_lib.Source


def check(
  config: ml_collections.ConfigDict,
  experiment_check: Callable[[ml_collections.ConfigDict], None] | None = None,
) -> Checked:
  """`config` checked whole (ConfigError, or DataError for a data field, naming the field
  and the rule in one line); `experiment_check` is the experiment's own rule
  (t2t_jax.cli.common.experiment_check), raising ValueError. Reads and writes nothing."""
  config = config_lib.with_defaults(config)
  try:
    train = config_lib.TrainConfig.from_config(config)
    search = _search(config)
    best.check_config(config)
    profile.parse_steps(config.profile_steps)
  except ValueError as e:
    raise ConfigError(str(e)) from None
  source = data_lib.sources.validate(config.data)
  model = _model(config.model)
  _check_across(config, search)
  if experiment_check is not None:
    try:
      experiment_check(config)
    except ValueError as e:
      raise ConfigError(str(e)) from None
  return Checked(config, train, search, model, source)


def _check_types(prefix: str, values: ml_collections.ConfigDict, cls: type) -> None:
  """ValueError for a field of dataclass `cls` whose value is not of its annotated type."""
  for f in dataclasses.fields(cls):
    kinds = f.type.__args__ if isinstance(f.type, types.UnionType) else (f.type,)
    if f.name not in values or Any in kinds:
      continue
    value = values[f.name]
    if not any(
      value is None if kind is type(None) else data_config.has_type(value, kind) for kind in kinds
    ):
      words = " or ".join("None" if k is type(None) else data_config.TYPE_WORDS[k] for k in kinds)
      raise ValueError(f"{prefix}{f.name}={value!r} must be {words}")


def _search(config: ml_collections.ConfigDict) -> SearchConfig:
  """The config's search (SearchConfig's rules, its types and the fields it leaves), and
  the search of the dev scores and the checkpoint selection (a beam of bleu_beam_size)."""
  _check_types("config.", config, SearchConfig)
  for field, (ok, must) in _SEARCH_CHECKS.items():
    if not ok(config[field]):
      raise ValueError(f"config.{field}={config[field]!r} {must}")
  search = SearchConfig.from_config(config)
  try:  # sampling, too, decodes the dev sentences with this beam: it must be 1 (or 0)
    evaluation.dev_search(config.bleu_beam_size, search)
  except ValueError as e:
    raise ValueError(
      f"config.bleu_beam_size={config.bleu_beam_size}, the beam of the dev scores: {e}"
    ) from None
  return search


def _model(model: ml_collections.ConfigDict) -> TransformerConfig:
  """TransformerConfig of config.model (PLACEHOLDER_VOCAB_SIZE for its vocabulary), its
  messages naming the config.model fields."""
  try:
    _check_types("config.model.", model, TransformerConfig)
  except ValueError as e:
    raise ConfigError(str(e)) from None
  try:  # jnp.dtype(None) is float64: a missing dtype is no choice of one
    dtype = None if model.dtype is None else jnp.dtype(model.dtype)
  except TypeError:
    dtype = None
  if dtype is None or not jnp.issubdtype(dtype, jnp.floating):
    raise ConfigError(
      f"config.model.dtype={model.dtype!r} must be a floating dtype: 'float32', or "
      "'bfloat16' on accelerators"
    )
  try:
    return TransformerConfig.from_dict(model.to_dict(), vocab_size=PLACEHOLDER_VOCAB_SIZE)
  except ValueError as e:
    raise ConfigError(str(e).replace("TransformerConfig.", "config.model.")) from None


def _check_across(config: ml_collections.ConfigDict, search: SearchConfig) -> None:
  """The rules between fields of different parts (or of one part, where its class has no
  rule for them)."""
  d, m = config.data, config.model
  longest, field = (d.pack_len, "pack_len") if d.batching == "pack" else (d.max_len, "max_len")
  if longest > m.max_len:
    raise ConfigError(
      f"config.data.{field}={longest} exceeds config.model.max_len={m.max_len}: training "
      f"rows of {longest} tokens need that many positions; raise model.max_len or lower "
      f"data.{field}"
    )
  if d.tokens_per_batch < longest:
    raise ConfigError(
      f"config.data.tokens_per_batch={d.tokens_per_batch} is less than config.data.{field}="
      f"{longest}: a batch must hold one row of the longest kept pair"
    )
  if config.average_checkpoints > config.keep_checkpoints:
    raise ConfigError(
      f"config.average_checkpoints={config.average_checkpoints} exceeds "
      f"config.keep_checkpoints={config.keep_checkpoints}: the average needs them kept"
    )
  _check_candidates(config)


def _check_candidates(config: ml_collections.ConfigDict) -> None:
  """Each candidate of select_checkpoints is one this run can make: written as
  t2t-translate's --checkpoint ('latest', 'average:N', 'best', 'best:N', 'ema', a step),
  'ema' with a moving average kept, 'best:N' with N best checkpoints kept."""
  text = config.select_checkpoints
  candidates = [c.strip() for c in text.split(",")]
  if not text:
    return
  flag = f"config.select_checkpoints={text!r}"
  for spec in candidates:
    kind, _, n = spec.partition(":")
    if not (
      spec in ("latest", "best", EMA)
      or spec.isdigit()
      or (kind in ("average", "best") and n.isdigit() and int(n) >= 1)
    ):
      raise ConfigError(
        f"{flag}: candidate {spec!r} is not 'latest', 'average:N', 'best', 'best:N', 'ema' "
        "or a step (N >= 1), comma separated"
      )
    if spec == EMA and not config.ema_decay:
      raise ConfigError(
        f"{flag}: candidate 'ema' needs a moving average, and config.ema_decay=0 keeps none"
      )
    wanted = int(n) if kind == "best" and n else 1
    if kind == "best" and wanted > config.keep_best_checkpoints:
      raise ConfigError(
        f"{flag}: candidate {spec!r} needs {wanted} best checkpoint(s) kept, but "
        f"config.keep_best_checkpoints={config.keep_best_checkpoints}"
      )
