"""The search's compiled programs over a Transformer (or an ensemble of them) and the one
driver that runs them: `decode_in_stages`, and `search_batch` for one padded batch.

Three things enter a program, each once:

- `Decoding`: the frozen settings that shape the program (mode, beam size, samples per
  sentence, the stopping rule, the decoding rules); the one static argument besides the
  model and the output length. A setting that does not apply to a mode is normalised away
  (greedy search has no stopping rule), so it does not multiply the programs.
- `Batch`: the per-batch inputs (sources, limits, prefixes, sentence ids), one pytree.
- `Knobs`: the traced settings (alpha, the sampling temperature, top-k, top-p and seed):
  other values reuse the compilation.

The model's view (`model_steps`): each member encodes once and keeps its own cache; beam
search runs the decoder on [batch, beam] ids (`Transformer.decode_beam_step`: the
hypotheses of a sentence share its encoder keys/values, their self-attention entries are
written in place and read through `search.BeamSlots`), greedy search and sampling on rows.
An ensemble's step combines its members' distributions (`search.ensemble_log_probs`).
"""

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax.typing import VariableDict
from jax.typing import ArrayLike

from t2t_jax import compilation
from t2t_jax.decoding import rules as rules_lib
from t2t_jax.decoding import search
from t2t_jax.decoding.config import PAPER_SEARCH, SearchConfig
from t2t_jax.decoding.diverse import Diversity
from t2t_jax.decoding.search import StageStats
from t2t_jax.model import Transformer, beam_search_cache, map_self_attention_cache, pad_memory
from t2t_jax.tokens import PAD_ID

Members = tuple[Transformer, ...]
MODES = ("beam", "greedy", "sample")


@dataclasses.dataclass(frozen=True)
class Decoding:
  """The static settings of one search (hashable: the programs' key).

  mode: 'beam', 'greedy' or 'sample'. beam_size: hypotheses per sentence (beam; 1
  otherwise). num_samples: outputs per sentence (sample; 1 otherwise). stop: beam search's
  stopping rule (`search.Stop`; None otherwise). constraint: a `decoding.constraints`
  constraint every mode obeys. eos_only_at_limit: EOS only at each output's limit
  (benchmarks). no_repeat_ngram: no n-gram twice in an output (0: off). diversity: diverse
  beam search's groups and strength (beam; decoding/diverse.py).
  """

  mode: str = "beam"
  beam_size: int = 1
  num_samples: int = 1
  stop: search.Stop | None = None
  constraint: Any = None
  eos_only_at_limit: bool = False
  no_repeat_ngram: int = 0
  diversity: Diversity = Diversity()

  def __post_init__(self) -> None:
    if self.mode not in MODES:
      raise ValueError(f"mode={self.mode!r} must be one of {', '.join(MODES)}")
    if self.mode == "beam":
      (self.stop or search.Stop()).check(self.beam_size)
      self.diversity.check(self.beam_size)

  @classmethod
  def of(
    cls,
    settings: SearchConfig,
    *,
    final: int | None = None,
    constraint: Any = None,
    eos_only_at_limit: bool = False,
  ) -> "Decoding":
    """The static part of `settings`: sampling, greedy (beam_size 1) or beam search."""
    common = dict(
      constraint=constraint,
      eos_only_at_limit=eos_only_at_limit,
      no_repeat_ngram=settings.no_repeat_ngram,
    )
    if settings.sampling:
      return cls(mode="sample", num_samples=settings.num_samples, **common)
    if settings.beam_size == 1:
      return cls(mode="greedy", **common)
    stop = search.Stop(settings.beam_stop, final)
    diversity = Diversity(settings.diverse_groups, settings.diversity_strength)
    if diversity.groups == 1:
      diversity = Diversity()  # the strength of plain beam search does not multiply programs
    return cls(mode="beam", beam_size=settings.beam_size, stop=stop, diversity=diversity, **common)

  def rules(self, prefix: bool) -> rules_lib.Rules:
    return rules_lib.of_settings(
      prefix=prefix,
      constraint=self.constraint,
      eos_only_at_limit=self.eos_only_at_limit,
      no_repeat_ngram=self.no_repeat_ngram,
    )

  @property
  def rows_per_sentence(self) -> int:
    """Rows of a row search per sentence (samples); beam search keeps one per sentence."""
    return self.num_samples if self.mode == "sample" else 1


class Knobs(NamedTuple):
  """The traced settings: other values reuse the compiled programs."""

  alpha: jax.Array  # float32: the length penalty's exponent
  temperature: jax.Array  # float32
  topk: jax.Array  # int32, 0: all tokens
  topp: jax.Array  # float32, 1: all tokens
  seed: jax.Array  # int32

  @classmethod
  def of(cls, settings: SearchConfig) -> "Knobs":
    # Numpy scalars copied to the device: jnp.float32(x) compiles a conversion program.
    f32, i32 = (lambda x: jax.device_put(np.float32(x))), (lambda x: jax.device_put(np.int32(x)))
    return cls(
      alpha=f32(settings.alpha),
      temperature=f32(settings.sampling_temperature),
      topk=i32(settings.sampling_topk),
      topp=f32(settings.sampling_topp),
      seed=i32(settings.sampling_seed),
    )


class Batch(NamedTuple):
  """One padded batch's inputs."""

  inputs: jax.Array  # int32 [batch, source length], PAD 0
  limits: jax.Array  # int32 [batch]: each output's limit, EOS included
  prefix: jax.Array | None  # int32 [batch, P]: forced first tokens, PAD after them
  sentence_ids: jax.Array  # int32 [batch]: each row's index in the input (sampling keys)


class Rows(NamedTuple):
  """The rows of a staged search: the search state and each row's inputs."""

  state: Any  # search._BeamState or search._RowState
  inputs: search.RowInputs


# --- the model's view ---------------------------------------------------------------------------


def as_members(
  params: VariableDict | tuple[VariableDict, ...], model: Transformer | Members
) -> tuple[tuple[VariableDict, ...], Members]:
  """(params, models) as tuples: one member, or an ensemble's members."""
  if isinstance(model, tuple):
    return tuple(params), model
  return (params,), (model,)


def _member_caches(
  member_params: tuple[VariableDict, ...],
  models: Members,
  inputs: jax.Array,
  max_decode_len: int,
  repeats: int = 1,
) -> tuple[VariableDict, ...]:
  """Each member encodes the input once and builds its decoding cache (`init_cache`), with
  every sentence's encoder output repeated `repeats` times (one row per sample)."""
  caches = []
  for member, params in zip(models, member_params):
    encoded = member.apply({"params": params}, inputs, method=Transformer.encode)
    member_inputs = inputs
    if repeats > 1:
      encoded, member_inputs = (jnp.repeat(x, repeats, axis=0) for x in (encoded, inputs))
    _, state = member.apply(
      {"params": params},
      encoded,
      member_inputs,
      max_decode_len,
      method=Transformer.init_cache,
      mutable=["cache"],
    )
    caches.append(state["cache"])
  return tuple(caches)


def _combine(logits: list[jax.Array]) -> jax.Array:
  """One member's logits, or an ensemble's next-token log-probabilities."""
  return logits[0] if len(logits) == 1 else search.ensemble_log_probs(logits)


def _row_model(member_params: tuple[VariableDict, ...], models: Members) -> search.TokensToLogits:
  """The per-row `tokens_to_logits` of greedy search and sampling over member caches."""

  def tokens_to_logits(ids: jax.Array, caches: tuple) -> tuple[jax.Array, tuple]:
    logits, new_caches = [], []
    for member, params, cache in zip(models, member_params, caches):
      member_logits, new = member.apply(
        {"params": params, "cache": cache}, ids, method=Transformer.decode_step, mutable=["cache"]
      )
      logits.append(member_logits)
      new_caches.append(new["cache"])
    return _combine(logits), tuple(new_caches)

  return tokens_to_logits


BeamCache = tuple[tuple[VariableDict, ...], search.BeamSlots]


def _beam_model(
  member_params: tuple[VariableDict, ...], models: Members
) -> tuple[search.TokensToLogits, Any]:
  """(tokens_to_logits, reorder_cache) of the beam-aware search: ids [batch, beam] through
  `Transformer.decode_beam_step`, members' caches never moved, one `BeamSlots` table
  reordered for all of them."""

  def tokens_to_logits(ids: jax.Array, cache: BeamCache) -> tuple[jax.Array, BeamCache]:
    model_caches, slots = cache
    mask = slots.attention_mask()
    logits, new_caches = [], []
    for member, params, model_cache in zip(models, member_params, model_caches):
      member_logits, new = member.apply(
        {"params": params, "cache": model_cache},
        ids,
        mask,
        method=Transformer.decode_beam_step,
        mutable=["cache"],
      )
      logits.append(member_logits)
      new_caches.append(new["cache"])
    return _combine(logits), (tuple(new_caches), slots)

  def reorder(cache: BeamCache, parents: jax.Array) -> BeamCache:
    model_caches, slots = cache
    return model_caches, slots.reorder(parents)

  return tokens_to_logits, reorder


def _map_member_caches(state: Any, fn: Callable[[VariableDict], VariableDict]) -> Any:
  """The state with `fn` applied to each member's model cache, whether beam search's
  (member caches and the BeamSlots table) or a row search's (member caches)."""
  if isinstance(state, search._RowState):
    return state._replace(cache=tuple(map(fn, state.cache)))
  model_caches, slots = state.cache
  return state._replace(cache=(tuple(map(fn, model_caches)), slots))


def _resize_cache(state: Any, length: int) -> Any:
  """The state with its cache cut or zero-padded to `length` positions: beam search's
  (beam_size slots per position, and the BeamSlots table) or a row search's (one slot)."""
  rows = isinstance(state, search._RowState)
  slots_per_position = 1 if rows else state.live_seqs.shape[1]
  fn = lambda x, axis: search.resize_positions(x, length * slots_per_position, axis)
  state = _map_member_caches(state, lambda c: map_self_attention_cache(c, fn))
  if rows:
    return state
  model_caches, slots = state.cache
  return state._replace(cache=(model_caches, slots.resize(length)))


def _pad_memory(state: Any, length: int) -> Any:
  """The state with its members' encoder keys/values padded to `length` source positions
  (`pad_memory`), whether beam search's or a row search's."""
  return _map_member_caches(state, lambda c: pad_memory(c, length))


# --- the programs ---------------------------------------------------------------------------------


def _start(
  params: Any,
  batch: Batch,
  knobs: Knobs,
  *,
  model: Transformer | Members,
  max_decode_len: int,
  first: int,
  decoding: Decoding,
) -> Rows:
  """Encodes, builds the caches (`first` positions long), the rules' state and the search
  state before step 0. Sampling: one row per (sentence, sample), sentence-major, each with
  its key."""
  member_params, models = as_members(params, model)
  repeats = decoding.rows_per_sentence
  caches = _member_caches(member_params, models, batch.inputs, max_decode_len, repeats)
  limits = jnp.clip(batch.limits.astype(jnp.int32), 1, max_decode_len)
  limits = search.prefix_limits(limits, batch.prefix, max_decode_len)
  rules = decoding.rules(batch.prefix is not None)
  rule_state = rules.init(batch.inputs, limits, batch.prefix)
  size = batch.inputs.shape[0]
  if decoding.mode == "beam":
    beam_cache = (
      tuple(beam_search_cache(c, decoding.beam_size) for c in caches),
      search.BeamSlots.create(size, decoding.beam_size, max_decode_len),
    )
    state = search.init_beam_state(
      beam_cache,
      size,
      decoding.beam_size,
      max_decode_len,
      rule_state,
      decoding.diversity.groups,
    )
    inputs = search.RowInputs(limits, batch.prefix)
  else:
    repeat = lambda tree: jax.tree_util.tree_map(lambda x: jnp.repeat(x, repeats, axis=0), tree)
    keys = None
    if decoding.mode == "sample":
      keys = search.sample_keys(knobs.seed, batch.sentence_ids, repeats)
    state = search.init_row_state(caches, size * repeats, max_decode_len, repeat(rule_state))
    inputs = search.RowInputs(repeat(limits), repeat(batch.prefix), keys)
  if first < max_decode_len:
    state = _resize_cache(state, first)
  return Rows(state, inputs)


Stage = tuple[Rows, jax.Array, jax.Array, tuple[jax.Array, jax.Array]]


@functools.partial(compilation.stored, donate=("rows",))
@functools.partial(
  jax.jit, static_argnames=("model", "bound", "decoding"), donate_argnames=("rows",)
)
def _stage_run(
  params: Any,
  rows: Rows,
  knobs: Knobs,
  until: jax.Array,
  *,
  model: Transformer | Members,
  bound: int,
  decoding: Decoding,
) -> Stage:
  """A stage (`search.Stages.run`) in one program: search steps until step == bound or at
  most `until` rows are not done; (rows, step, done [rows], every row's `_outputs`, which
  the host reads only for the rows that leave the batch or when the batch ends)."""
  member_params, models = as_members(params, model)
  rules = decoding.rules(rows.inputs.prefix is not None)
  if decoding.mode == "beam":
    tokens_to_logits, reorder = _beam_model(member_params, models)
    state = search.beam_stage(
      rows.state,
      tokens_to_logits=tokens_to_logits,
      reorder_cache=reorder,
      inputs=rows.inputs,
      rules=rules,
      alpha=knobs.alpha,
      stop=decoding.stop,
      bound=bound,
      until=until,
      diversity=decoding.diversity,
    )
    done = search.beam_done(state, rows.inputs.limits, knobs.alpha, decoding.stop)
    rows = rows._replace(state=state)
    return rows, state.step, done, _outputs(rows, knobs.alpha)
  pick = search.greedy_pick
  if decoding.mode == "sample":
    pick = search.SamplePick(knobs.temperature, knobs.topk, knobs.topp)
  state = search.row_stage(
    rows.state,
    tokens_to_logits=_row_model(member_params, models),
    inputs=rows.inputs,
    rules=rules,
    pick=pick,
    bound=bound,
    until=until,
  )
  rows = rows._replace(state=state)
  return rows, state.step, state.finished, _outputs(rows, knobs.alpha)


def _outputs(rows: Rows, alpha: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Every row's (sequences [rows, hypotheses, max_decode_len], scores [rows, hypotheses]):
  beam search's, or a row search's output and log-probability."""
  state = rows.state
  if isinstance(state, search._RowState):
    return state.seqs[:, None], state.log_probs[:, None]
  return search.beam_outputs(state, alpha)


@compilation.stored
@functools.partial(jax.jit, static_argnames=("model", "max_decode_len", "bound", "decoding"))
def _stage_first(
  params: Any,
  batch: Batch,
  knobs: Knobs,
  until: jax.Array,
  *,
  model: Transformer | Members,
  max_decode_len: int,
  bound: int,
  decoding: Decoding,
) -> Stage:
  """The start (`_start`, its cache `bound` positions long) and the first stage in one
  program (`search.Stages.first`): the full batch's first run is always right after its
  start, so a separate program for each would compile and call two where one does."""
  rows = _start(
    params, batch, knobs, model=model, max_decode_len=max_decode_len, first=bound, decoding=decoding
  )
  return _stage_run(params, rows, knobs, until, model=model, bound=bound, decoding=decoding)


@compilation.stored
@functools.partial(jax.jit, static_argnames=("memory_len", "length"))
def _stage_take(
  rows: Rows, keep: jax.Array, *, memory_len: int | None = None, length: int | None = None
) -> Rows:
  """The rows `keep`, their encoder keys/values padded to `memory_len` positions and their
  self-attention caches grown to `length` (None: as they are)."""
  kept = search._map_nonscalar(lambda x: x[keep], rows)
  if memory_len is not None:
    kept = kept._replace(state=_pad_memory(kept.state, memory_len))
  if length is not None:
    kept = kept._replace(state=_resize_cache(kept.state, length))
  return kept


@compilation.stored
@functools.partial(jax.jit, static_argnames=("length",))
def _stage_resize(rows: Rows, *, length: int) -> Rows:
  return rows._replace(state=_resize_cache(rows.state, length))


@compilation.stored
@jax.jit
def _samples_ranked(
  seqs: jax.Array, log_probs: jax.Array, alpha: jax.Array
) -> tuple[jax.Array, jax.Array]:
  """Each sentence's samples (seqs [batch, num_samples, length], log_probs [batch,
  num_samples]) ordered by length-normalised score, best first (ties: sample order)."""
  lengths = jnp.sum(seqs != PAD_ID, axis=-1)
  order = jnp.argsort(-(log_probs / search.length_penalty(lengths, alpha)), axis=1, stable=True)
  return search.gather_beams(seqs, order), jnp.take_along_axis(log_probs, order, axis=1)


def stage_bounds(max_decode_len: int, decoding: Decoding) -> list[int]:
  """The cache's bounds (`search.segment_bounds`) of a staged search. A row search (greedy,
  sampling) attends over one cache slot per position, beam search over beam_size: its
  first segment is twice beam search's, which saves a resize and the stage programs of
  the shortest cache for little more attention per step."""
  first = search.FIRST_SEGMENT * (1 if decoding.mode == "beam" else 2)
  return search.segment_bounds(max_decode_len, first)


# The shortest cache of a compacted batch (`search.run_in_stages`' compacted_bound): beam
# search's full batch starts on FIRST_SEGMENT positions, where it does most of its steps,
# but a batch compacted before step 32 would run a few steps each at several sizes, each
# size a stage program of its own; a compaction there grows the cache to 32 instead.
COMPACTED_BOUND = 2 * search.FIRST_SEGMENT


# The smallest batch a staged search compacts to: below it a step costs about the same, and
# every smaller size would compile stages of its own.
MIN_ROWS = 8


def decode_in_stages(
  params: VariableDict | tuple[VariableDict, ...],
  batch: Batch,
  knobs: Knobs,
  *,
  model: Transformer | Members,
  max_decode_len: int,
  decoding: Decoding,
  stats: search.StageStats | None = None,
  min_rows: int = MIN_ROWS,
  memory_len: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
  """Decodes one batch with `search.run_in_stages`, the one search loop: sentences (samples)
  leave the batch (halving it) as they finish and the self-attention cache grows with the
  output at every batch size.

  An ensemble: `model` a tuple of Transformers and `params` the tuple of their parameters
  (same vocabulary).

  Returns (numpy): beam search's (sequences [batch, beam, max_decode_len], length-normalised
  scores [batch, beam]), best first; greedy: (sequences [batch, 1, max_decode_len], log-probs
  [batch, 1]); sampling: (sequences [batch, num_samples, max_decode_len], log-probs [batch,
  num_samples]) ordered by length-normalised score, best first (ties: sample order).
  `stats` is added to (`search.StageStats`). memory_len: the source positions the encoder
  keys/values of compacted batches are padded to (None: their own), so that batches of
  several source lengths share the stage programs after their first compaction; the full
  batch attends over its own length, where padding would cost the most."""
  bounds = stage_bounds(max_decode_len, decoding)
  common = dict(model=model, decoding=decoding)
  on_device = lambda until: jax.device_put(np.int32(until))  # as warm_up_stages passes it
  stages = search.Stages(
    run=lambda rows, bound, until: _stage_run(
      params, rows, knobs, on_device(until), bound=bound, **common
    ),
    take=lambda rows, keep, length: _stage_take(rows, keep, memory_len=memory_len, length=length),
    resize=lambda rows, length: _stage_resize(rows, length=length),
    first=lambda batch, bound, until: _stage_first(
      params, batch, knobs, on_device(until), max_decode_len=max_decode_len, bound=bound, **common
    ),
  )
  size = batch.inputs.shape[0]
  per = decoding.rows_per_sentence
  seqs, scores = search.run_in_stages(
    stages,
    batch,
    size * per,
    bounds,
    min_rows=min_rows,
    stats=stats,
    compacted_bound=COMPACTED_BOUND,
  )
  if decoding.mode != "sample":
    return seqs, scores
  ranked = _samples_ranked(
    seqs.reshape(size, per, max_decode_len), scores.reshape(size, per), knobs.alpha
  )
  return tuple(np.asarray(x) for x in ranked)


def warm_up_stages(
  params: VariableDict | tuple[VariableDict, ...],
  batch: Batch,
  knobs: Knobs,
  *,
  model: Transformer | Members,
  max_decode_len: int,
  decoding: Decoding,
  min_rows: int = MIN_ROWS,
  memory_lens: Sequence[int | None] = (None,),
) -> int:
  """Calls every program `decode_in_stages` can call for a batch of `batch`'s shape (its
  contents do not matter) with each of `memory_lens` as its memory_len, so that none of
  them compiles later; returns how many.

  Which programs a search runs depends on when its sentences finish; these are all that
  `search.run_in_stages` can reach: the first stage (start and run in one program), then
  at each of the cache's bounds a run and (below the last bound) the resize at every size
  of `search.stage_sizes` that meets it, and the take of each size to each size it can be
  compacted to (growing the cache to COMPACTED_BOUND below it: the smaller sizes then
  start at that bound); below the full size, once per memory length. A stage is called
  with `until` = its rows, so it compiles without taking a step. Every call gets rows made
  as the search makes them (the first stage's, or a run's taken or resized), so that shapes
  and weak types, and so the programs, are those a search will call."""
  bounds = stage_bounds(max_decode_len, decoding)
  full = batch.inputs.shape[0] * decoding.rows_per_sentence
  sizes = search.stage_sizes(full, min_rows)
  common = dict(model=model, decoding=decoding)
  first = _stage_first(
    params,
    batch,
    knobs,
    jax.device_put(np.int32(full)),
    max_decode_len=max_decode_len,
    bound=bounds[0],
    **common,
  )
  # segment -> (size, memory_len) -> the rows a run at its bound meets (None: the full
  # batch's first stage, which has run); the full batch's memory is its own (None)
  entering, calls = {0: {(full, None): None}}, 1
  for segment, bound in enumerate(bounds):
    here, ran = entering.setdefault(segment, {}), set()
    after = search.compacted_segment(bounds, segment, COMPACTED_BOUND)
    length = bounds[after] if after > segment else None
    while todo := [key for key in here if key not in ran]:
      size, memory = key = max(todo, key=lambda k: k[0])  # largest first: takes fill smaller
      ran.add(key)
      if here[key] is None:
        rows = first[0]
      else:
        until = jax.device_put(np.int32(size))
        rows = _stage_run(params, here[key], knobs, until, bound=bound, **common)[0]
        calls += 1
      for target in sizes[size]:
        keep = jax.device_put(np.arange(target, dtype=np.int32))
        for memory_len in memory_lens if memory is None else (memory,):
          taken = _stage_take(rows, keep, memory_len=memory_len, length=length)
          entering.setdefault(after, {}).setdefault((target, memory_len), taken)
          calls += 1
      if segment + 1 < len(bounds):
        grown = _stage_resize(rows, length=bounds[segment + 1])
        entering.setdefault(segment + 1, {}).setdefault(key, grown)
        calls += 1
  if decoding.mode == "sample":
    seqs, scores = jax.device_get(first[3])
    size, per = batch.inputs.shape[0], decoding.rows_per_sentence
    _samples_ranked(seqs.reshape(size, per, max_decode_len), scores.reshape(size, per), knobs.alpha)
    calls += 1
  return calls


def _prepared(
  search: SearchConfig,
  inputs: ArrayLike,
  max_lengths: ArrayLike,
  sentence_ids: ArrayLike | None,
  prefix: ArrayLike | None,
  **decoding: Any,
) -> tuple[Batch, Knobs, Decoding]:
  """`search_batch`'s (Batch, Knobs, Decoding): `decoding` are `Decoding.of`'s keywords."""
  ids = np.arange(np.shape(inputs)[0]) if sentence_ids is None else sentence_ids
  # Cast on the host and copy: jnp.asarray compiles a conversion program for every new
  # shape of int64 numpy input (sentence ids, keep lists).
  as_int32 = lambda x: jax.device_put(np.asarray(x, np.int32))
  batch = Batch(
    inputs=as_int32(inputs),
    limits=as_int32(max_lengths),
    prefix=None if prefix is None else as_int32(prefix),
    sentence_ids=as_int32(ids),
  )
  return batch, Knobs.of(search), Decoding.of(search, **decoding)


def search_batch(
  params: VariableDict | tuple[VariableDict, ...],
  inputs: ArrayLike,
  max_lengths: ArrayLike,
  *,
  model: Transformer | Members,
  max_decode_len: int,
  search: SearchConfig = PAPER_SEARCH,
  suppress_eos: bool = False,
  nbest: bool = False,
  sentence_ids: ArrayLike | None = None,
  prefix: ArrayLike | None = None,
  final: int | None = None,
  stats: StageStats | None = None,
  constraint: Any = None,
  warm_up: bool = False,
  memory_len: int | None = None,
  memory_lens: Sequence[int | None] | None = None,
) -> jax.Array | tuple[jax.Array, jax.Array] | int:
  """Decodes one padded batch, the entry for code that holds a model and parameters but no
  Translator (benchmarks, A/B timing), through `decode_in_stages`.

  inputs: int32 [batch, source length] (PAD 0); max_lengths: int32 [batch], each output's
  limit, EOS included (search.max_output_extra is the caller's business: it is already in
  them). final: how many of the best beam hypotheses must be exact when a sentence stops
  (`search.Stop`); default 1 for the best output, all of them with nbest. suppress_eos
  (benchmarks): EOS only at each output's limit. constraint: a `decoding.constraints`
  constraint that every mode obeys. prefix: int32 [batch, P], the tokens each output
  starts with, PAD after them (None or all-PAD rows: unconstrained). With search.sampling,
  row r's samples are keyed by sentence_ids[r] (default: r), its index in the caller's
  input, so that a sentence's samples do not depend on its batch.

  Returns the best output per sentence, int32 [batch, max_decode_len]; with `nbest`,
  `decode_in_stages`' (sequences, scores). warm_up: decodes nothing, but calls every
  program a batch of this shape can need (`warm_up_stages`) and returns their number.
  memory_len: `decode_in_stages`'; with warm_up, memory_lens (default [memory_len]) are
  every memory_len a later search of this shape may be given.
  """
  batch, knobs, decoding = _prepared(
    search,
    inputs,
    max_lengths,
    sentence_ids,
    prefix,
    final=final if final is not None or nbest else 1,
    constraint=constraint,
    eos_only_at_limit=suppress_eos,
  )
  common = dict(model=model, max_decode_len=max_decode_len, decoding=decoding)
  if warm_up:
    memory_lens = (memory_len,) if memory_lens is None else tuple(memory_lens)
    return warm_up_stages(params, batch, knobs, memory_lens=memory_lens, **common)
  seqs, scores = decode_in_stages(
    params, batch, knobs, stats=stats, memory_len=memory_len, **common
  )
  return (seqs, scores) if nbest else seqs[:, 0]
