"""The search, assembled once: `start` (each output's limit, the rules' state, the mode's
state) and `stage` (steps of the mode under the rules, which rows are done, every row's
outputs), over any model (decoding/model_view.py) and any mode (decoding/modes.py).

programs.py compiles these for Transformers and runs them in stages (the Translator's, the
trainer's and the benchmarks' search); search.py runs them for a `tokens_to_logits`
function. Three things enter, each once:

- `Decoding`: the static settings that shape the program: the mode and the decoding rules.
- `Batch`: the per-batch inputs (sources, limits, prefixes, sentence ids), one pytree.
- `Knobs`: the traced settings (alpha and sampling's), named as in `SearchConfig`: other
  values reuse the compilation.
"""

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from t2t_jax.decoding import modes, rulebook
from t2t_jax.decoding.config import SearchConfig
from t2t_jax.decoding.model_view import LAYOUTS
from t2t_jax.decoding.rows import RowInputs, prefix_limits
from t2t_jax.decoding.rules import Rules
from t2t_jax.tokens import BOS_ID, EOS_ID


@dataclasses.dataclass(frozen=True)
class Decoding:
  """The static settings of one search (hashable: the programs' key): the mode
  (`modes.Beam`, `Greedy` or `Sample`) and the decoding rules (`rulebook.rules_of`): a
  `decoding.constraints` constraint, EOS only at each output's limit (benchmarks), and the
  rules the settings turn on (`rulebook.registered`: no repeated n-gram, a minimum length)."""

  mode: modes.Mode = modes.Greedy()
  constraint: Any = None
  eos_only_at_limit: bool = False
  registered: tuple[Any, ...] = ()

  @classmethod
  def of(
    cls,
    settings: SearchConfig,
    *,
    nbest: int | None = None,
    mode: modes.Mode | None = None,
    constraint: Any = None,
    eos_only_at_limit: bool = False,
  ) -> "Decoding":
    """The decoding `settings` ask for (`modes.of_settings`, or `mode` as given)."""
    return cls(
      mode=modes.of_settings(settings, nbest) if mode is None else mode,
      constraint=constraint,
      eos_only_at_limit=eos_only_at_limit,
      registered=rulebook.registered(settings),
    )

  def rules(self, prefix: bool) -> Rules:
    """The rules of a batch with (`prefix`) or without forced prefixes."""
    return rulebook.rules_of(
      prefix=prefix,
      constraint=self.constraint,
      eos_only_at_limit=self.eos_only_at_limit,
      registered=self.registered,
    )


class Knobs(NamedTuple):
  """The traced settings: other values reuse the compiled programs."""

  alpha: jax.Array  # float32: the length penalty's exponent
  sampling_temperature: jax.Array  # float32
  sampling_topk: jax.Array  # int32, 0: all tokens
  sampling_topp: jax.Array  # float32, 1: all tokens
  sampling_seed: jax.Array  # int32

  @classmethod
  def of(cls, settings: SearchConfig) -> "Knobs":
    # Numpy scalars copied to the device: jnp.float32(x) compiles a conversion program.
    f32, i32 = (lambda x: jax.device_put(np.float32(x))), (lambda x: jax.device_put(np.int32(x)))
    return cls(
      alpha=f32(settings.alpha),
      sampling_temperature=f32(settings.sampling_temperature),
      sampling_topk=i32(settings.sampling_topk),
      sampling_topp=f32(settings.sampling_topp),
      sampling_seed=i32(settings.sampling_seed),
    )


class Batch(NamedTuple):
  """One padded batch's inputs."""

  inputs: jax.Array | None  # int32 [batch, source length], PAD 0 (what the rules start from)
  limits: jax.Array  # int32 [batch]: each output's limit, EOS included
  prefix: jax.Array | None = None  # int32 [batch, P]: forced first tokens, PAD after them
  sentence_ids: jax.Array | None = None  # int32 [batch]: each row's index in the input
  keys: jax.Array | None = None  # sampling: uint32 [rows, 2], the rows' own keys (None: from
  # the seed and sentence_ids, `sampling.sample_keys`)


class Rows(NamedTuple):
  """The rows of a staged search: the mode's state and each row's inputs."""

  state: Any  # beam.BeamState or rows.RowState
  inputs: RowInputs


Stage = tuple[Rows, jax.Array, jax.Array, tuple[jax.Array, jax.Array]]


def start(
  model: Any, batch: Batch, knobs: Knobs, *, max_decode_len: int, first: int, decoding: Decoding
) -> Rows:
  """The rows before step 0: limits clipped to [1, max_decode_len] and raised to fit each
  prefix, the rules' state, the mode's state (sampling: one row per (sentence, sample),
  sentence-major), its cache `first` positions long."""
  limits = jnp.clip(batch.limits.astype(jnp.int32), 1, max_decode_len)
  limits = prefix_limits(limits, batch.prefix, max_decode_len)
  rules = decoding.rules(batch.prefix is not None)
  rule_state = rules.init(batch.inputs, limits, batch.prefix)
  mode = decoding.mode
  state, inputs = mode.init(model, batch._replace(limits=limits), rule_state, knobs, max_decode_len)
  if first < max_decode_len:
    layout = LAYOUTS[mode.layout]  # only the Transformer's caches start shorter
    state = state._replace(cache=layout.resize(state.cache, first))
  return Rows(state, inputs)


def stage(
  model: Any,
  rows: Rows,
  knobs: Knobs,
  until: Any,
  *,
  bound: int,
  decoding: Decoding,
  eos_id: int = EOS_ID,
  bos_id: int = BOS_ID,
) -> Stage:
  """Search steps until step == bound or at most `until` rows are not done: (rows, step,
  done [rows], every row's outputs (`modes`' `outputs`), which the host reads only for the
  rows that leave the batch or when the batch ends)."""
  rules = decoding.rules(rows.inputs.prefix is not None)
  state, done = decoding.mode.stage(
    rows.state,
    model,
    rows.inputs,
    rules,
    knobs,
    bound=bound,
    until=until,
    eos_id=eos_id,
    bos_id=bos_id,
  )
  rows = rows._replace(state=state)
  return rows, state.step, done, decoding.mode.outputs(state, knobs)
