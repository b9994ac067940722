"""The search's compiled programs over a Transformer (or an ensemble of them) and the one
driver that runs them: `decode_in_stages`, and `search_batch` for one padded batch.

The programs compile the assembly of decoding/assembly.py (`start`, `stage`) for a
`model_view.TransformerMembers` model, with the `Decoding` settings, the model and the
output length as their static arguments; `decode_in_stages` runs them from the host by
`stages.run_in_stages`, and `warm_up_stages` calls every program that can reach
(`stages.Schedule.moves`, the table `run_in_stages` follows).
"""

import functools
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from flax.typing import VariableDict
from jax.typing import ArrayLike

from t2t_jax import compilation
from t2t_jax.decoding import assembly
from t2t_jax.decoding.assembly import Batch, Decoding, Knobs, Rows, Stage
from t2t_jax.decoding.beam_dims import map_nonscalar
from t2t_jax.decoding.config import PAPER_SEARCH, SearchConfig
from t2t_jax.decoding.model_view import FIRST_SEGMENT, LAYOUTS, TransformerMembers, segment_bounds
from t2t_jax.decoding.stages import Move, Schedule, Stages, StageStats, run_in_stages
from t2t_jax.model import Transformer

Members = tuple[Transformer, ...]
__all__ = ["Batch", "Decoding", "Knobs", "Rows", "decode_in_stages", "search_batch"]


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
  """Encodes and builds the rows before step 0 (`assembly.start`), the cache `first`
  positions long."""
  members = TransformerMembers.of(params, model)
  return assembly.start(
    members, batch, knobs, max_decode_len=max_decode_len, first=first, decoding=decoding
  )


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
  """A stage (`stages.Stages.run`, `assembly.stage`) in one program."""
  members = TransformerMembers.of(params, model)
  return assembly.stage(members, rows, knobs, until, bound=bound, decoding=decoding)


@compilation.stored
@functools.partial(
  jax.jit, static_argnames=("model", "max_decode_len", "bound", "decoding", "memory_len")
)
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
  memory_len: int | None = None,
) -> Stage:
  """The start (`_start`, its cache `bound` positions long) and the first stage in one
  program (`stages.Stages.first`): the full batch's first run is always right after its
  start, so a separate program for each would compile and call two where one does. With
  memory_len the encoder keys/values are padded to that many positions before the first
  step, so that every later program of the search is shared by batches of every source
  length."""
  rows = _start(
    params, batch, knobs, model=model, max_decode_len=max_decode_len, first=bound, decoding=decoding
  )
  if memory_len is not None:  # decode_in_stages' full_memory
    padded = LAYOUTS[decoding.mode.layout].pad_memory(rows.state.cache, memory_len)
    rows = rows._replace(state=rows.state._replace(cache=padded))
  return _stage_run(params, rows, knobs, until, model=model, bound=bound, decoding=decoding)


@compilation.stored
@functools.partial(jax.jit, static_argnames=("layout", "memory_len", "length"))
def _stage_take(
  rows: Rows,
  keep: jax.Array,
  *,
  layout: str,
  memory_len: int | None = None,
  length: int | None = None,
) -> Rows:
  """The rows `keep`, their encoder keys/values padded to `memory_len` positions and their
  self-attention caches grown to `length` (None: as they are); `layout`, the mode's cache
  (`model_view.LAYOUTS`)."""
  kept = map_nonscalar(lambda x: x[keep], rows)
  cache = kept.state.cache
  if memory_len is not None:
    cache = LAYOUTS[layout].pad_memory(cache, memory_len)
  if length is not None:
    cache = LAYOUTS[layout].resize(cache, length)
  return kept._replace(state=kept.state._replace(cache=cache))


@compilation.stored
@functools.partial(jax.jit, static_argnames=("layout", "length"))
def _stage_resize(rows: Rows, *, layout: str, length: int) -> Rows:
  cache = LAYOUTS[layout].resize(rows.state.cache, length)
  return rows._replace(state=rows.state._replace(cache=cache))


def stage_bounds(max_decode_len: int, decoding: Decoding) -> list[int]:
  """The cache's bounds (`model_view.segment_bounds`) of a staged search, from the mode's
  first segment: a row search (greedy, sampling) attends over one cache slot per position,
  beam search over beam_size, so a row search's first segment is twice beam search's, which
  saves a resize and the stage programs of the shortest cache for little more attention per
  step."""
  return segment_bounds(max_decode_len, decoding.mode.first_segment)


# The shortest cache of a compacted batch (`stages.run_in_stages`' compacted_bound): beam
# search's full batch starts on FIRST_SEGMENT positions, where it does most of its steps,
# but a batch compacted before step 32 would run a few steps each at several sizes, each
# size a stage program of its own; a compaction there grows the cache to 32 instead.
COMPACTED_BOUND = 2 * FIRST_SEGMENT


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
  stats: StageStats | None = None,
  min_rows: int = MIN_ROWS,
  memory_len: int | None = None,
  full_memory: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
  """Decodes one batch with `stages.run_in_stages`, the one search loop: sentences (samples)
  leave the batch (halving it) as they finish and the self-attention cache grows with the
  output at every batch size.

  An ensemble: `model` a tuple of Transformers and `params` the tuple of their parameters
  (same vocabulary).

  Returns (numpy) the mode's outputs (`modes`' `finish`): sequences [batch, hypotheses,
  max_decode_len] and their values [batch, hypotheses], best first (beam search: beam_size
  hypotheses and their scores; greedy: one and its log-probability; sampling: num_samples
  and their log-probabilities, ordered by score). `stats` is added to
  (`stages.StageStats`). memory_len: the source positions the encoder keys/values of
  compacted batches are padded to (None: their own), so that batches of several source
  lengths share the stage programs after their first compaction; the full batch attends
  over its own length, where padding would cost the most, unless full_memory pads it too
  (a server: every program after the first stage shared by every source length, for a
  longer cross-attention)."""
  bounds = stage_bounds(max_decode_len, decoding)
  common = dict(model=model, decoding=decoding)
  layout = decoding.mode.layout
  on_device = lambda until: jax.device_put(np.int32(until))  # as warm_up_stages passes it
  stages = Stages(
    run=lambda rows, bound, until: _stage_run(
      params, rows, knobs, on_device(until), bound=bound, **common
    ),
    take=lambda rows, keep, length: _stage_take(
      rows, keep, layout=layout, memory_len=memory_len, length=length
    ),
    resize=lambda rows, length: _stage_resize(rows, layout=layout, length=length),
    first=lambda batch, bound, until: _stage_first(
      params,
      batch,
      knobs,
      on_device(until),
      max_decode_len=max_decode_len,
      bound=bound,
      memory_len=memory_len if full_memory else None,
      **common,
    ),
  )
  rows = batch.inputs.shape[0] * decoding.mode.rows_per_sentence
  seqs, values = run_in_stages(
    stages, batch, rows, bounds, min_rows=min_rows, stats=stats, compacted_bound=COMPACTED_BOUND
  )
  return decoding.mode.finish(seqs, values, knobs)


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
  full_memory: bool = False,
) -> int:
  """Calls every program `decode_in_stages` can call for a batch of `batch`'s shape (its
  contents do not matter) with each of `memory_lens` as its memory_len, so that none of
  them compiles later; returns how many.

  Which programs a search runs depends on when its sentences finish; `stages.Schedule.moves`
  lists every stage `run_in_stages` can reach (it asks the same Schedule) and what can
  follow each: the first stage (start and run in one program), then each stage's run, the
  take to each size it can be compacted to and the resize at its bound; below the full size
  once per memory length (the full batch's memory is its own). A stage is called with
  `until` = its rows, so it compiles without taking a step. Every call gets rows made as
  the search makes them (the first stage's, or a run's taken or resized), so that shapes
  and weak types, and so the programs, are those a search will call."""
  bounds = stage_bounds(max_decode_len, decoding)
  full = batch.inputs.shape[0] * decoding.mode.rows_per_sentence
  schedule = Schedule(tuple(bounds), min_rows, COMPACTED_BOUND)
  common = dict(model=model, decoding=decoding)
  layout = decoding.mode.layout
  on_device = lambda until: jax.device_put(np.int32(until))
  if full_memory and len(memory_lens) != 1:
    raise ValueError(f"full_memory pads every batch to one memory_len, not {memory_lens}")
  first = _stage_first(
    params,
    batch,
    knobs,
    on_device(full),
    max_decode_len=max_decode_len,
    bound=bounds[0],
    memory_len=memory_lens[0] if full_memory else None,
    **common,
  )
  # stage -> memory_len -> the rows it starts from (None: the first stage's, which has run;
  # with full_memory padded already: a take pads nothing more)
  entering: dict[Move, dict[int | None, Rows | None]] = {
    Move(full, 0): {memory_lens[0] if full_memory else None: None}
  }
  calls = 1
  for move, after in schedule.moves(full).items():
    growth = schedule.growth(move)
    for memory, start in entering.get(move, {}).items():
      if start is None:
        rows = first[0]
      else:
        until, bound = on_device(move.size), bounds[move.segment]
        rows = _stage_run(params, start, knobs, until, bound=bound, **common)[0]
        calls += 1
      for following in after:
        if following == growth:
          grown = _stage_resize(rows, layout=layout, length=bounds[following.segment])
          entering.setdefault(following, {}).setdefault(memory, grown)
          calls += 1
          continue
        keep = jax.device_put(np.arange(following.size, dtype=np.int32))
        for memory_len in memory_lens if memory is None else (memory,):
          taken = _stage_take(
            rows, keep, layout=layout, memory_len=memory_len, length=following.length
          )
          entering.setdefault(following._replace(length=None), {}).setdefault(memory_len, taken)
          calls += 1
  decoding.mode.finish(*jax.device_get(first[3]), knobs)
  return calls + decoding.mode.finish_programs


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
  nbest: int | None = None,
  eos_only_at_limit: bool = False,
  sentence_ids: ArrayLike | None = None,
  prefix: ArrayLike | None = None,
  stats: StageStats | None = None,
  constraint: Any = None,
  warm_up: bool = False,
  memory_len: int | None = None,
  memory_lens: Sequence[int | None] | None = None,
  full_memory: bool = False,
) -> jax.Array | tuple[jax.Array, jax.Array] | int:
  """Decodes one padded batch, the entry for code that holds a model and parameters but no
  Translator (benchmarks, A/B timing), through `decode_in_stages`.

  inputs: int32 [batch, source length] (PAD 0); max_lengths: int32 [batch], each output's
  limit, EOS included (search.max_output_extra is the caller's business: it is already in
  them). nbest: None returns the best output per sentence, int32 [batch, max_decode_len];
  n returns `decode_in_stages`' (sequences, values) of every hypothesis, the n best of
  beam search's exact when a sentence stops (`beam.Stop`). eos_only_at_limit
  (benchmarks): EOS only at each output's limit. constraint: a `decoding.constraints`
  constraint that every mode obeys. prefix: int32 [batch, P], the tokens each output
  starts with, PAD after them (None or all-PAD rows: unconstrained). With search.sampling,
  row r's samples are keyed by sentence_ids[r] (default: r), its index in the caller's
  input, so that a sentence's samples do not depend on its batch.

  warm_up: decodes nothing, but calls every program a batch of this shape can need
  (`warm_up_stages`) and returns their number. memory_len: `decode_in_stages`'; with
  warm_up, memory_lens (default [memory_len]) are every memory_len a later search of this
  shape may be given. full_memory: the full batch's memory is padded to memory_len too
  (`decode_in_stages`).
  """
  batch, knobs, decoding = _prepared(
    search,
    inputs,
    max_lengths,
    sentence_ids,
    prefix,
    nbest=1 if nbest is None else nbest,
    constraint=constraint,
    eos_only_at_limit=eos_only_at_limit,
  )
  common = dict(model=model, max_decode_len=max_decode_len, decoding=decoding)
  if warm_up:
    memory_lens = (memory_len,) if memory_lens is None else tuple(memory_lens)
    return warm_up_stages(
      params, batch, knobs, memory_lens=memory_lens, full_memory=full_memory, **common
    )
  seqs, values = decode_in_stages(
    params, batch, knobs, stats=stats, memory_len=memory_len, full_memory=full_memory, **common
  )
  return seqs[:, 0] if nbest is None else (seqs, values)
