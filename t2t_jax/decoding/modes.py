"""The three ways of decoding, each one strategy object: `Beam`, `Greedy`, `Sample`.

A mode says, and is the only place that says, what its state is (`init`), how a stage
steps it and which rows are done (`stage`), what its outputs are (`outputs`), how the host
orders them (`finish`) and what their scores mean (`scores`). The assembly
(decoding/assembly.py) and the programs run any mode the same way; a mode is chosen once,
from the settings (`of_settings`), and is part of the programs' static key, so a setting
that does not apply to it (greedy search has no stopping rule) does not multiply programs.

Scores, every mode alike (docs/translation.md): `score` = log p / lp(length) with the GNMT
length penalty lp (`length_penalty`; length counts EOS), the value beam search ranks by and
samples are ordered by; `log_prob` = log p(output | source) under the model. On the device
beam search keeps the score and a row search the log-probability; `scores` turns either
into both on the host.
"""

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from t2t_jax import compilation
from t2t_jax.decoding.beam import (
  BeamState,
  Stop,
  beam_done,
  beam_outputs,
  beam_stage,
  init_beam_state,
  length_penalty,
)
from t2t_jax.decoding.beam_dims import gather_beams
from t2t_jax.decoding.config import SearchConfig
from t2t_jax.decoding.diverse import PLAIN, Diversity
from t2t_jax.decoding.model_view import FIRST_SEGMENT
from t2t_jax.decoding.rows import (
  Pick,
  RowInputs,
  RowState,
  SamplePick,
  greedy_pick,
  init_row_state,
  row_stage,
)
from t2t_jax.decoding.rules import Rules
from t2t_jax.decoding.sampling import sample_keys
from t2t_jax.tokens import BOS_ID, EOS_ID, PAD_ID

PyTree = Any
Outputs = tuple[jax.Array, jax.Array]  # sequences [rows, hypotheses, L], values [rows, hyp.]


@dataclasses.dataclass(frozen=True)
class Beam:
  """Beam search (decoding/beam.py): `beam_size` hypotheses per sentence, its stopping rule
  and, with several groups, diverse beam search (decoding/diverse.py)."""

  beam_size: int
  stop: Stop = Stop()
  diversity: Diversity = PLAIN

  rows_per_sentence: ClassVar[int] = 1  # beam search keeps one row per sentence
  first_segment: ClassVar[int] = FIRST_SEGMENT
  layout: ClassVar[str] = "beam"  # the cache (model_view.LAYOUTS)
  finish_programs: ClassVar[int] = 0  # compiled programs `finish` calls

  @classmethod
  def of(cls, settings: SearchConfig, nbest: int | None = None, early: bool = True) -> "Beam":
    """Beam search of `settings` (beam_size, beam_stop, diverse_groups and strength);
    `nbest`: how many of the best hypotheses the caller reads, exact when a sentence stops
    (`Stop`; `SearchConfig.check_nbest`)."""
    settings.check_nbest(nbest)
    diversity = Diversity(settings.diverse_groups, settings.diversity_strength)
    if diversity.diverse_groups == 1:
      diversity = PLAIN  # the strength of plain beam search does not multiply programs
    return cls(settings.beam_size, Stop(settings.beam_stop, nbest, early), diversity)

  def init(
    self, model: Any, batch: Any, rule_state: PyTree, knobs: Any, max_decode_len: int
  ) -> tuple[BeamState, RowInputs]:
    """The state before step 0 and the rows' inputs; `batch` (assembly.Batch) with its
    limits final."""
    cache = model.beam_cache(batch.inputs, max_decode_len, self.beam_size)
    size = batch.limits.shape[0]
    state = init_beam_state(
      cache, size, self.beam_size, max_decode_len, rule_state, self.diversity.diverse_groups
    )
    return state, RowInputs(batch.limits, batch.prefix)

  def stage(
    self,
    state: BeamState,
    model: Any,
    inputs: RowInputs,
    rules: Rules,
    knobs: Any,
    *,
    bound: int,
    until: Any,
    eos_id: int = EOS_ID,
    bos_id: int = BOS_ID,
  ) -> tuple[BeamState, jax.Array]:
    tokens_to_logits, reorder = model.beam_step()
    state = beam_stage(
      state,
      tokens_to_logits=tokens_to_logits,
      reorder_cache=reorder,
      inputs=inputs,
      rules=rules,
      alpha=knobs.alpha,
      stop=self.stop,
      bound=bound,
      until=until,
      eos_id=eos_id,
      bos_id=bos_id,
      diversity=self.diversity,
    )
    return state, beam_done(state, inputs.limits, knobs.alpha, self.stop)

  def outputs(self, state: BeamState, knobs: Any) -> Outputs:
    """The finished hypotheses, best first, and their scores (`beam_outputs`)."""
    return beam_outputs(state, knobs.alpha)

  def finish(self, seqs: np.ndarray, values: np.ndarray, knobs: Any) -> tuple:
    return seqs, values

  @staticmethod
  def scores(value: float, penalty: float) -> tuple[float, float]:
    """(score, log_prob) of an output from its value on the device (its score)."""
    return value, value * penalty


@dataclasses.dataclass(frozen=True)
class _RowMode:
  """What greedy search and sampling share: one row per output (`rows_per_sentence` of a
  sentence), stepped by `row_stage` with the mode's `pick`."""

  first_segment: ClassVar[int] = 2 * FIRST_SEGMENT  # one cache slot per position, not beam
  layout: ClassVar[str] = "rows"
  finish_programs: ClassVar[int] = 0

  @property
  def rows_per_sentence(self) -> int:
    return 1

  def pick(self, knobs: Any) -> Pick:
    raise NotImplementedError

  def keys(self, knobs: Any, batch: Any) -> jax.Array | None:
    return None

  def init(
    self, model: Any, batch: Any, rule_state: PyTree, knobs: Any, max_decode_len: int
  ) -> tuple[RowState, RowInputs]:
    per = self.rows_per_sentence
    repeat = lambda tree: jax.tree_util.tree_map(lambda x: jnp.repeat(x, per, axis=0), tree)
    if per == 1:
      repeat = lambda tree: tree
    cache = model.row_cache(batch.inputs, max_decode_len, per)
    rows = batch.limits.shape[0] * per
    state = init_row_state(cache, rows, max_decode_len, repeat(rule_state))
    return state, RowInputs(repeat(batch.limits), repeat(batch.prefix), self.keys(knobs, batch))

  def stage(
    self,
    state: RowState,
    model: Any,
    inputs: RowInputs,
    rules: Rules,
    knobs: Any,
    *,
    bound: int,
    until: Any,
    eos_id: int = EOS_ID,
    bos_id: int = BOS_ID,
  ) -> tuple[RowState, jax.Array]:
    state = row_stage(
      state,
      tokens_to_logits=model.row_step(),
      inputs=inputs,
      rules=rules,
      pick=self.pick(knobs),
      bound=bound,
      until=until,
      eos_id=eos_id,
      bos_id=bos_id,
    )
    return state, state.finished

  def outputs(self, state: RowState, knobs: Any) -> Outputs:
    """Each row's output and its log-probability, as one hypothesis."""
    return state.seqs[:, None], state.log_probs[:, None]

  def finish(self, seqs: np.ndarray, values: np.ndarray, knobs: Any) -> tuple:
    return seqs, values

  @staticmethod
  def scores(value: float, penalty: float) -> tuple[float, float]:
    """(score, log_prob) of an output from its value on the device (its log-probability)."""
    return value / penalty, value


@dataclasses.dataclass(frozen=True)
class Greedy(_RowMode):
  """The most probable token the rules allow, every step (`greedy_pick`)."""

  def pick(self, knobs: Any) -> Pick:
    return greedy_pick


@dataclasses.dataclass(frozen=True)
class Sample(_RowMode):
  """Ancestral sampling (`SamplePick`): `num_samples` rows per sentence, sample j of the
  sentence at input index i keyed by its sentence id (`sample_keys`), so that it does not
  depend on its batch; `finish` orders a sentence's samples by score, best first."""

  num_samples: int = 1
  bos_id: int = BOS_ID
  finish_programs: ClassVar[int] = 1  # _samples_ranked

  @property
  def rows_per_sentence(self) -> int:
    return self.num_samples

  def pick(self, knobs: Any) -> Pick:
    return SamplePick(
      knobs.sampling_temperature, knobs.sampling_topk, knobs.sampling_topp, self.bos_id
    )

  def keys(self, knobs: Any, batch: Any) -> jax.Array:
    """Each row's key: the batch's own (`Batch.keys`, one per row), else from the seed and
    the sentence ids."""
    if batch.keys is not None:
      return batch.keys
    return sample_keys(knobs.sampling_seed, batch.sentence_ids, self.num_samples)

  def finish(self, seqs: np.ndarray, values: np.ndarray, knobs: Any) -> tuple:
    """Each sentence's samples ([sentences * num_samples, 1, L] -> [sentences, num_samples,
    L]) ordered by score, best first (ties: sample order)."""
    per, length = self.num_samples, seqs.shape[-1]
    size = seqs.shape[0] // per
    ranked = _samples_ranked(
      seqs.reshape(size, per, length), values.reshape(size, per), knobs.alpha
    )
    return tuple(np.asarray(x) for x in ranked)


@compilation.stored
@jax.jit
def _samples_ranked(
  seqs: jax.Array, log_probs: jax.Array, alpha: jax.Array
) -> tuple[jax.Array, jax.Array]:
  """Each sentence's samples (seqs [batch, num_samples, length], log_probs [batch,
  num_samples]) ordered by length-normalised score, best first (ties: sample order)."""
  lengths = jnp.sum(seqs != PAD_ID, axis=-1)
  order = jnp.argsort(-(log_probs / length_penalty(lengths, alpha)), axis=1, stable=True)
  return gather_beams(seqs, order), jnp.take_along_axis(log_probs, order, axis=1)


Mode = Beam | Greedy | Sample


def of_settings(settings: SearchConfig, nbest: int | None = None) -> Mode:
  """The mode `settings` ask for: sampling, greedy (beam_size 1) or beam search. `nbest`:
  how many of beam search's best hypotheses the caller reads (`Beam.of`)."""
  if settings.sampling:
    return Sample(num_samples=settings.num_samples)
  if settings.beam_size == 1:
    return Greedy()
  return Beam.of(settings, nbest)
