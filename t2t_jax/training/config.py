"""The training fields of an experiment config: one typed home for each default.

`TrainConfig`'s defaults are the base model's training (paper section 5); experiments/base.py
takes its top-level training fields from it, and `with_defaults` fills the fields an older
workdir's config.json lacks from it and from TransformerConfig, so no reader restates a
default.
"""

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import ml_collections

from t2t_jax.data import config as data_config
from t2t_jax.decoding.config import SearchConfig
from t2t_jax.model.config import TransformerConfig


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """The trainer's top-level config fields (`--config.FIELD=VALUE`), defaults as in the paper."""

  seed: int = 0  # parameter initialisation and dropout
  num_train_steps: int = 100_000  # the base model's 100k steps (5.2)
  warmup_steps: int = 4000  # linear warmup of the learning rate, eq. 3 (5.3)
  learning_rate_factor: float = 1.0  # multiplies eq. 3's rate (5.3)
  label_smoothing: float = 0.1  # eps_ls (5.4)
  grad_accum_steps: int = 1  # raise to reach 25k+25k tokens per step on fewer devices (5.1)
  log_every_steps: int = 100
  eval_every_steps: int = 1000  # dev loss
  checkpoint_every_steps: int = 1000
  # Checkpoints kept: at least those averaged at the end (5 base, 20 big).
  keep_checkpoints: int = 20
  # The last N checkpoints averaged for the test (6.1: 5 for base, 20 for big; 1: none).
  average_checkpoints: int = 5
  prefetch_batches: int = 2  # training batches copied to the devices ahead of the step
  bleu_every_steps: int = 0  # sacreBLEU on dev sentences every M steps (0: off)
  bleu_num_sentences: int = 500  # dev sentences of those scores
  bleu_beam_size: int = 0  # beam of those dev scores and of the checkpoint selection below
  #                         (0: beam_size; 1: greedy, cheaper)
  test_at_end: bool = False  # translate and score the test split after training (6.1)
  # Checkpoint selection on dev only (6.2 chose on the development set): candidates
  # ('latest', 'average:N', 'best', 'best:N', 'ema', 'STEP', comma separated) are scored by dev
  # sacreBLEU and the best one translates the test split; '': the average of the last
  # `average_checkpoints` (6.1).
  select_checkpoints: str = ""
  select_num_sentences: int = 0  # dev sentences scored per candidate (0: all)
  train_time_limit_minutes: float = 0.0  # stop, save and evaluate after this long (0: none)
  # Warm start (fine-tuning): 'WORKDIR[:SPEC]' starts a run that has no checkpoint of its own
  # from another workdir's parameters and vocabulary (SPEC as t2t-translate's --checkpoint;
  # default: its selected checkpoint, else its latest); step and schedule start at 0, so
  # warmup_steps is the new run's warmup. '': initialise from `seed`.
  init_from: str = ""
  # With init_from: keep the parent's Adam moments (and Adam's bias-correction count) instead
  # of zeros; the learning-rate schedule still starts at step 0.
  init_keep_optimizer: bool = False
  # The dev metric that ranks checkpoints: 'eval_loss' (lower is better), 'dev_bleu' or
  # 'dev_f1' (parsing; higher is better); 'auto': the task's dev score when bleu_every_steps
  # computes one, else eval_loss.
  best_metric: str = "auto"
  # The best N checkpoints by best_metric, kept apart from the newest keep_checkpoints and
  # never pruned by recency (an evaluation that enters them is saved); 0: none.
  keep_best_checkpoints: int = 1
  # Early stopping: end the run after this many evaluations without an improvement of at
  # least min_delta in best_metric (0: off).
  patience: int = 0
  min_delta: float = 0.0
  # An exponential moving average of the parameters (Marian's --exponential-smoothing,
  # fairseq's --ema), updated after every step with decay min(ema_decay, (1+t)/(10+t)),
  # saved in the checkpoints, read with --checkpoint=ema and a candidate of
  # select_checkpoints ('ema'); 0: off.
  ema_decay: float = 0.0
  # 'START,END': a jax.profiler trace of steps START to END (1-based, inclusive) under
  # <workdir>/tensorboard/plugins/profile (training/profile.py); '': none.
  profile_steps: str = ""

  def __post_init__(self) -> None:
    for f in dataclasses.fields(self):
      value = getattr(self, f.name)
      if not data_config.has_type(value, f.type):
        raise ValueError(f"config.{f.name}={value!r} must be {data_config.TYPE_WORDS[f.type]}")
      if f.name in _CHECKS and not _CHECKS[f.name][0](value):
        raise ValueError(f"config.{f.name}={value!r} {_CHECKS[f.name][1]}")
    if self.init_keep_optimizer and not self.init_from:
      raise ValueError(
        "config.init_keep_optimizer=True needs config.init_from (the workdir whose optimizer "
        "state to keep)"
      )

  @classmethod
  def defaults(cls) -> dict[str, Any]:
    """{field: default}: the top-level training fields of an experiment config."""
    return {f.name: f.default for f in dataclasses.fields(cls)}

  @classmethod
  def from_config(cls, config: Mapping[str, Any]) -> "TrainConfig":
    """The training fields of an experiment config; ValueError names a bad one."""
    return cls(**{f.name: config[f.name] for f in dataclasses.fields(cls) if f.name in config})


_POSITIVE = (lambda v: v >= 1, "must be a positive integer")
_COUNT = (lambda v: v >= 0, "must be >= 0")
# Each field's rule for its value alone, its type (the annotation above) checked first:
# (ok, what it must be). best_metric, keep_best_checkpoints, patience and min_delta are
# training.best's, profile_steps training.profile's.
_CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {
  # NumPy's generators take seeds >= 0; JAX's keys and the int32 fold-ins, below 2^31.
  "seed": (lambda v: 0 <= v < 2**31, "must be in [0, 2^31)"),
  "num_train_steps": _POSITIVE,
  "warmup_steps": (lambda v: v >= 1, "must be >= 1: eq. 3 divides by warmup_steps^1.5"),
  "learning_rate_factor": (lambda v: v > 0, "must be > 0"),
  "label_smoothing": (lambda v: 0 <= v < 1, "must be in [0, 1) (0: none)"),
  "grad_accum_steps": _POSITIVE,
  "log_every_steps": _POSITIVE,
  "eval_every_steps": _POSITIVE,
  "checkpoint_every_steps": _POSITIVE,
  "keep_checkpoints": _POSITIVE,
  "average_checkpoints": (lambda v: v >= 1, "must be >= 1 (1: no averaging)"),
  "prefetch_batches": _COUNT,
  "bleu_every_steps": _COUNT,
  "bleu_num_sentences": (lambda v: v >= 1, "must be >= 1"),
  "bleu_beam_size": _COUNT,
  "select_num_sentences": (lambda v: v >= 0, "must be >= 0 (0: all)"),
  "train_time_limit_minutes": (lambda v: v >= 0, "must be >= 0 (0: none)"),
  "ema_decay": (
    lambda v: 0 <= v < 1,
    "must be in [0, 1) (0: no moving average; 0.999 or 0.9999 are usual)",
  ),
}


def with_defaults(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """`config`, with every training, search, model and data field it lacks set to its default.

  A workdir's config.json holds the fields of the version that wrote it; newer fields get
  their defaults here, in one place, instead of a `.get(field, default)` at every read.
  Returns `config` itself when nothing is missing, otherwise a filled copy.
  """
  missing = _missing(config, {**TrainConfig.defaults(), **SearchConfig().config_fields()})
  missing_model = _missing(config.model, TransformerConfig.defaults()) if "model" in config else {}
  missing_data = _missing(config.data, data_config.default_config()) if "data" in config else {}
  if not missing and not missing_model and not missing_data:
    return config
  filled = ml_collections.ConfigDict(config.to_dict())
  filled.update(missing)
  if missing_model:
    filled.model.update(missing_model)
  if missing_data:
    filled.data.update(missing_data)
  return filled


def _missing(fields: Any, defaults: Mapping[str, Any]) -> dict[str, Any]:
  return {name: value for name, value in defaults.items() if name not in fields}
