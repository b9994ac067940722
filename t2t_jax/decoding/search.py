"""Greedy and beam search over a `tokens_to_logits(ids, cache)` function.

Decoding never sees the model. The caller closes the model, its parameters and the encoder
output over a function

    tokens_to_logits(ids, cache) -> (logits, new_cache)

where `ids` is int32 [N, 1] (the last token of each hypothesis; `BOS_ID` at the first step),
`logits` is [N, vocab] and unnormalised (the search applies log-softmax), and `cache` is any
pytree whose scalar leaves are shared by all rows (e.g. a step index) and whose other leaves
have leading dim N. Beam search then keeps a copy of the cache per hypothesis and gathers
those copies after every step.

A model that knows about beams can do better (`beam_search(..., reorder_cache=...)`): it
takes ids [batch, beam] and returns logits [batch, beam, vocab], keeps whatever cache layout
it likes (the Transformer shares the encoder keys/values between a sentence's hypotheses
and writes each hypothesis's self-attention entry in place, see `BeamSlots`), and is told
after every step which parent each new hypothesis continues.

Conventions of both searches:

- `cache` comes in for `batch` sentences (leading dim batch).
- Outputs exclude BOS, end with EOS and hold PAD after it: int32 [..., max_decode_len].
- `max_lengths` int [batch] is each sentence's output limit, EOS included (the paper uses
  source length + 50); values above `max_decode_len` are clipped to it. A hypothesis that
  reaches its limit is forced to end: at that step every token but EOS gets log-probability
  -inf, and EOS keeps its model log-probability (no renormalisation), so scores stay model
  probabilities of the sequences returned.
- `max_decode_len` is the static array length; the self-attention cache must hold that many
  positions. Everything runs in `jax.lax.while_loop`s (greedy: one; beam search: one per
  batch size, see its `compact`), so both searches work under `jax.jit` with
  `tokens_to_logits` closed over.
"""

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.typing import ArrayLike

from t2t_jax.decoding import rules as rules_lib
from t2t_jax.decoding.config import STOP_RULES, SearchConfig
from t2t_jax.decoding.diverse import PLAIN, Diversity, diverse_top, first_of_each_group
from t2t_jax.decoding.rules import Rules
from t2t_jax.tokens import BOS_ID, EOS_ID, PAD_ID

Cache = Any
PyTree = Any  # arrays in nested tuples/lists/dicts/NamedTuples, as jax.tree_util sees them
TokensToLogits = Callable[[jax.Array, Cache], tuple[jax.Array, Cache]]

NEG_INF = float("-inf")


def argmax(x: jax.Array, axis: int = -1) -> jax.Array:
  """`jnp.argmax` (the first index of the maximum) without the variadic (value, index)
  reduce XLA:CPU lowers jnp.argmax to, which does not vectorize; greedy decoding takes one
  per step. Along a vocabulary-sized axis in chunks (`_first_max_index`); else max, then
  the smallest matching index. A NaN counts as a maximum, but XLA:CPU's max reductions may
  skip NaNs, so a row holding one gets the index of a NaN or of its largest number."""
  axis = axis % x.ndim
  if _chunked(x.shape[axis]):
    return _first_max_index(jnp.moveaxis(x, axis, -1))
  top = jnp.max(x, axis=axis, keepdims=True)
  index = lax.broadcasted_iota(jnp.int32, x.shape, axis)
  hit = (x == top) | jnp.isnan(x)
  return jnp.min(jnp.where(hit, index, x.shape[axis]), axis=axis)


def _chunked(size: int) -> bool:
  """Whether an axis of `size` is taken in chunks: at least 4 of them, dividing it."""
  chunk = _chunk_size(size)
  return size % chunk == 0 and size >= 4 * chunk


def _chunk_maxima(x: jax.Array, chunk: int | None = None) -> jax.Array:
  """[..., vocab] -> [..., ceil(vocab / chunk)]: the maximum of each chunk (default
  `_chunk_size`), read from x in place where the chunk divides vocab (a short last chunk is
  reduced on its own)."""
  vocab = x.shape[-1]
  chunk = chunk or _chunk_size(vocab)
  full = vocab // chunk
  maxima = jnp.max(x[..., : full * chunk].reshape(x.shape[:-1] + (full, chunk)), axis=-1)
  if full * chunk < vocab:
    maxima = jnp.concatenate([maxima, jnp.max(x[..., full * chunk :], axis=-1, keepdims=True)], -1)
  return maxima


def _max_of_chunks(maxima: jax.Array) -> jax.Array:
  """[..., chunks] chunk maxima -> [...] the row maximum. The barrier keeps XLA from folding
  this into a second full pass over the row."""
  return jnp.max(lax.optimization_barrier(maxima), axis=-1)


def _row_max(x: jax.Array) -> jax.Array:
  """[..., vocab] -> [...]: the maximum, over the chunk maxima where the axis is taken in
  chunks (`_first_max_index` takes the same, so XLA computes them once for both)."""
  if not _chunked(x.shape[-1]):
    return jnp.max(x, axis=-1)
  return _max_of_chunks(_chunk_maxima(x))


def _first_max_index(x: jax.Array) -> jax.Array:
  """argmax over the last axis in one pass over x: the chunk maxima give the row maximum
  and the first chunk holding it (or a NaN); the index is then found in that chunk alone,
  gathered [..., chunk]. First chunk, then first index in it: the first index overall.
  Max-then-min-index reads x twice and writes an int32 copy of it in between."""
  maxima = _chunk_maxima(x)
  top = _max_of_chunks(maxima)[..., None]
  chunks = maxima.shape[-1]
  first = lax.broadcasted_iota(jnp.int32, maxima.shape, maxima.ndim - 1)
  first = jnp.min(jnp.where((maxima == top) | jnp.isnan(maxima), first, chunks), axis=-1)
  blocks = x.reshape(x.shape[:-1] + (chunks, -1))
  block = jnp.take_along_axis(blocks, first[..., None, None], axis=-2)[..., 0, :]
  inside = lax.broadcasted_iota(jnp.int32, block.shape, block.ndim - 1)
  hit = (block == top) | jnp.isnan(block)
  return first * block.shape[-1] + jnp.min(jnp.where(hit, inside, block.shape[-1]), axis=-1)


def length_penalty(length: ArrayLike, alpha: float | jax.Array) -> jax.Array:
  """GNMT length penalty lp = ((5 + length) / 6) ** alpha (Wu et al. 2016, eq. 14).

  `length` counts generated tokens including EOS; float32, broadcasting.
  """
  return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


# --- beam-dimension helpers (scalar leaves are shared and pass through untouched) -------------


def _map_nonscalar(fn: Callable[[jax.Array], jax.Array], tree: PyTree) -> PyTree:
  return jax.tree_util.tree_map(lambda x: x if jnp.ndim(x) == 0 else fn(x), tree)


def add_beam_dim(tree: PyTree, beam_size: int) -> PyTree:
  """[batch, ...] -> [batch, beam, ...], each sentence repeated beam_size times."""

  def add(x: ArrayLike) -> jax.Array:
    x = jnp.asarray(x)
    return jnp.broadcast_to(x[:, None], (x.shape[0], beam_size) + x.shape[1:])

  return _map_nonscalar(add, tree)


def flatten_beam_dim(tree: PyTree) -> PyTree:
  """[batch, beam, ...] -> [batch * beam, ...]: the layout `tokens_to_logits` sees."""
  return _map_nonscalar(lambda x: x.reshape((-1,) + x.shape[2:]), tree)


def unflatten_beam_dim(tree: PyTree, batch_size: int) -> PyTree:
  """[batch * beam, ...] -> [batch, beam, ...]."""
  return _map_nonscalar(lambda x: x.reshape((batch_size, -1) + x.shape[1:]), tree)


def gather_beams(tree: PyTree, beam_indices: jax.Array) -> PyTree:
  """Picks beams per sentence: leaves [batch, old_beam, ...] -> [batch, new_beam, ...].

  `beam_indices` is int [batch, new_beam] into the old beam dimension.
  """
  batch_indices = jnp.arange(beam_indices.shape[0])[:, None]
  return _map_nonscalar(lambda x: x[batch_indices, beam_indices], tree)


def _write_tokens(seqs: jax.Array, step: jax.Array, tokens: jax.Array) -> jax.Array:
  """seqs int32 [batch, beam, max_decode_len] with `tokens` [batch, beam] written at `step`."""
  return lax.dynamic_update_slice_in_dim(seqs, tokens[..., None].astype(seqs.dtype), step, axis=2)


def _last_tokens(seqs: jax.Array, step: jax.Array, bos_id: int) -> jax.Array:
  """Input of this step: BOS at step 0, else the token written at step - 1. [...] int32."""
  prev = lax.dynamic_index_in_dim(seqs, jnp.maximum(step - 1, 0), axis=-1, keepdims=False)
  return jnp.where(step == 0, jnp.asarray(bos_id, seqs.dtype), prev)


def prefix_limits(limits: jax.Array, prefix: jax.Array | None, max_decode_len: int) -> jax.Array:
  """Each row's limit (int32 [rows], clipped) raised to its prefix length + 1 (room for the
  prefix and EOS), so that the forced end never falls inside a prefix; prefixes must be
  shorter than max_decode_len."""
  if prefix is None:
    return limits
  if prefix.ndim != 2 or prefix.shape[0] != limits.shape[0]:
    raise ValueError(
      f"prefix of shape {prefix.shape}: need [batch = {limits.shape[0]}, prefix length]"
    )
  lengths = jnp.sum(prefix != PAD_ID, axis=-1).astype(jnp.int32)
  return jnp.clip(jnp.maximum(limits, lengths + 1), 1, max_decode_len)


def _materialized(tree: PyTree) -> PyTree:
  """A while loop's initial state, computed once before the loop.

  Without the barrier XLA may sink cheap ops on loop-invariant leaves into the loop body
  (e.g. the transpose that puts the encoder keys/values into the cache layout), where they
  run at every step.
  """
  return lax.optimization_barrier(tree)


def _check_args(cache: Cache, max_lengths: ArrayLike, max_decode_len: int) -> jax.Array:
  leaves = [x for x in jax.tree_util.tree_leaves(cache) if jnp.ndim(x) > 0]
  batch_size = np.shape(max_lengths)[0]
  for x in leaves:
    if x.shape[0] != batch_size:
      raise ValueError(
        f"cache leaf of shape {x.shape} does not have leading dim "
        f"batch = len(max_lengths) = {batch_size}"
      )
  if max_decode_len < 1:
    raise ValueError(f"max_decode_len must be >= 1, got {max_decode_len}")
  return jnp.clip(jnp.asarray(max_lengths, jnp.int32), 1, max_decode_len)


def resize_positions(x: jax.Array, length: int, axis: int = -1) -> jax.Array:
  """x with its `axis` cut or zero-padded to `length`."""
  axis = axis % x.ndim
  if x.shape[axis] >= length:
    return lax.slice_in_dim(x, 0, length, axis=axis)
  pad = [(0, 0)] * x.ndim
  pad[axis] = (0, length - x.shape[axis])
  return jnp.pad(x, pad)


FIRST_SEGMENT = 16  # positions in beam search's first cache segment (see segment_bounds)


def segment_bounds(max_decode_len: int, first: int | None = None) -> list[int]:
  """Where a staged search grows the cache: `first` (default FIRST_SEGMENT), twice that, ...
  below max_decode_len, then max_decode_len. Doubling keeps the cache at most twice the
  positions written while compiling the step only log2(max_decode_len / first) + 1 times."""
  bounds, bound = [], first or FIRST_SEGMENT
  while bound < max_decode_len:
    bounds.append(bound)
    bound *= 2
  return [*bounds, max_decode_len]


# --- caches with one slot per hypothesis and position ------------------------------------------


class BeamSlots(NamedTuple):
  """Where each hypothesis's history lives in a cache that is never reordered.

  For a beam-aware model whose self-attention cache holds max_decode_len * beam slots per
  sentence, position-major: at step t hypothesis b writes slot t * beam + b, in place. After
  reordering, a hypothesis's entries at earlier positions sit in its ancestors' slots;
  `slots` records which. Instead of gathering the cache (every step, all of it), the model
  attends through `attention_mask()`, and `reorder` gathers only this int32 table.

  Put it in the cache given to `beam_search` and call `reorder` from its `reorder_cache`.
  """

  slots: jax.Array  # int32 [batch, beam, max_decode_len]: [i, b, s] = beam index whose slot
  # holds position s of hypothesis b of sentence i (valid for s < step)
  step: jax.Array  # int32 scalar: the position written next

  @classmethod
  def create(cls, batch_size: int, beam_size: int, max_decode_len: int) -> "BeamSlots":
    return cls(
      slots=jnp.zeros((batch_size, beam_size, max_decode_len), jnp.int32),
      step=jnp.array(0, jnp.int32),
    )

  def _with_current(self) -> jax.Array:
    """`slots` with position `step` set to each hypothesis's own slot (what it writes now)."""
    beam_size, length = self.slots.shape[1:]
    now = jnp.arange(length) == self.step
    return jnp.where(now, jnp.arange(beam_size)[:, None], self.slots)

  def attention_mask(self) -> jax.Array:
    """bool [batch, 1, beam, max_decode_len * beam]: the slots each hypothesis reads at this
    step (its history at positions < step and its own entry at `step`)."""
    batch_size, beam_size, length = self.slots.shape
    visible = (jnp.arange(length) <= self.step)[:, None]
    mask = (self._with_current()[..., None] == jnp.arange(beam_size)) & visible
    return mask.reshape(batch_size, 1, beam_size, length * beam_size)

  def resize(self, length: int) -> "BeamSlots":
    """The table for a cache of `length` positions (`beam_search`'s resize_cache): cut, or
    padded with zeros for positions not written yet."""
    return BeamSlots(slots=resize_positions(self.slots, length), step=self.step)

  def reorder(self, parents: jax.Array) -> "BeamSlots":
    """After the step: new hypothesis b continues old hypothesis parents[:, b] ([batch, beam])."""
    return BeamSlots(slots=gather_beams(self._with_current(), parents), step=self.step + 1)


def _per_row_model(
  tokens_to_logits: TokensToLogits, cache: Cache, beam_size: int
) -> tuple[TokensToLogits, Cache, Callable[[Cache, jax.Array], Cache]]:
  """A per-row `tokens_to_logits` as a beam-aware one: (tokens_to_logits, cache, reorder).

  The cache is copied to every hypothesis ([batch, beam, ...]) and gathered by parent.
  """

  def beam_tokens_to_logits(ids: jax.Array, cache: Cache) -> tuple[jax.Array, Cache]:
    logits, new_cache = tokens_to_logits(ids.reshape(-1, 1), flatten_beam_dim(cache))
    logits = logits.reshape(ids.shape + logits.shape[-1:])
    return logits, unflatten_beam_dim(new_cache, ids.shape[0])

  return beam_tokens_to_logits, add_beam_dim(cache, beam_size), gather_beams


# --- beam search ------------------------------------------------------------------------------


class _BeamState(NamedTuple):
  step: jax.Array  # int32 scalar: tokens generated so far by every live hypothesis
  live_seqs: jax.Array  # int32 [batch, beam, max_decode_len], PAD beyond `step`
  live_log_probs: jax.Array  # float32 [batch, beam], sorted best first; -inf = empty slot
  finished_seqs: jax.Array  # int32 [batch, beam, max_decode_len], EOS-terminated
  finished_scores: jax.Array  # float32 [batch, beam], sorted best first; -inf = empty slot
  cache: Cache  # the model's, for beams (see beam_search)
  rules: PyTree = None  # the rules' state per hypothesis, leaves [batch, beam, ...]


def _merge_finished(
  seqs: jax.Array, scores: jax.Array, new_seqs: jax.Array, new_scores: jax.Array
) -> tuple[jax.Array, jax.Array]:
  """Keeps the best beam_size of old and new finished hypotheses, best first.

  Old entries come first, so on equal scores `lax.top_k` (lower index first on ties)
  keeps what was already there.
  """
  all_seqs = jnp.concatenate([seqs, new_seqs], axis=1)
  all_scores = jnp.concatenate([scores, new_scores], axis=1)
  top_scores, top = lax.top_k(all_scores, scores.shape[1])
  return gather_beams(all_seqs, top), top_scores


def _chunk_size(vocab: int, near: int = 128) -> int:
  """A divisor of `vocab` in [near / 2, 2 * near] closest to `near` (then the chunk maxima
  read the logits in place; a short last chunk makes XLA copy the rest), else `near`."""
  divisors = [c for c in range(near // 2, 2 * near + 1) if vocab % c == 0]
  return min(divisors, key=lambda c: abs(c - near)) if divisors else near


def _top_tokens(
  rows: jax.Array, k: int, eos_id: int, chunk: int | None = None
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Each row's k largest logits other than EOS, and the row's maximum (EOS included).

  rows float32 [R, vocab] -> (values [R, k], tokens int32 [R, k], row_max [R]); values and
  tokens are what lax.top_k gives on the rows with EOS set to -inf (best first, lower index
  first on ties), with far less work than XLA's TopK over the whole vocabulary: the top k
  elements lie in the k chunks with the largest maxima (an element of the top k whose chunk
  is not among them would have k better chunk maxima above it; equal maxima order chunks by
  index, as equal elements are ordered). So one max-reduction per chunk, a top_k over the
  chunk maxima, and a top_k over the k chosen chunks, gathered in index order so that ties
  still go to the lower index. The chunk maxima are taken over the logits as they are
  (XLA:CPU's fast reductions read their input from memory, so a masked copy would be
  written first), which also gives the row maximum; only the maximum of EOS's own chunk is
  then taken again without EOS.
  """
  vocab = rows.shape[-1]
  chunk = chunk or _chunk_size(vocab)
  if 4 * k * chunk > vocab:
    masked = jnp.where(jnp.arange(vocab) != eos_id, rows, NEG_INF)
    values, tokens = lax.top_k(masked, k)
    return values, tokens.astype(jnp.int32), jnp.max(rows, axis=-1)
  maxima = _chunk_maxima(rows, chunk)
  row_max = _max_of_chunks(maxima)
  start = eos_id // chunk * chunk
  eos_chunk = rows[:, start : start + chunk]
  eos_chunk = jnp.where(
    jnp.arange(start, start + eos_chunk.shape[-1]) != eos_id, eos_chunk, NEG_INF
  )
  maxima = jnp.where(
    jnp.arange(maxima.shape[-1]) == eos_id // chunk, jnp.max(eos_chunk, -1)[:, None], maxima
  )
  _, chunks = lax.top_k(maxima, k)
  chunks = jnp.sort(chunks, axis=-1)
  index = (chunks[..., None] * chunk + jnp.arange(chunk)).reshape(-1, k * chunk)
  values = jnp.take_along_axis(rows, jnp.minimum(index, vocab - 1), axis=-1)
  values = jnp.where((index < vocab) & (index != eos_id), values, NEG_INF)
  top_values, top = lax.top_k(values, k)
  return top_values, jnp.take_along_axis(index, top, axis=-1).astype(jnp.int32), row_max


def _log_probs_of(logits: jax.Array, row_max: jax.Array, log_normalizer: jax.Array) -> jax.Array:
  """log-softmax values of some of a row's logits, computed as jax.nn.log_softmax computes
  them: (l - max) - log(sum(exp(l - max))). logits [R, j]; row_max, log_normalizer [R]."""
  return (logits - row_max[:, None]) - log_normalizer[:, None]


def _beam_step(
  state: _BeamState,
  tokens_to_logits: TokensToLogits,
  reorder_cache: Callable[[Cache, jax.Array], Cache],
  inputs: "RowInputs",
  alpha: float | jax.Array,
  rules: Rules,
  done: jax.Array | None = None,
  eos_id: int = EOS_ID,
  bos_id: int = BOS_ID,
  diversity: Diversity = PLAIN,
) -> _BeamState:
  """One search step: extends every live hypothesis by one token (with diversity groups,
  `diverse.diverse_top` chooses the live set).

  `done` (bool [batch], `beam_done` before the step) freezes the sentences that are
  done: they offer no EOS extension and keep no live hypothesis, so their finished sets stay
  as they were when they were declared done, whichever sentences share their batch and
  however long it runs (under the heuristic rule, or the exact rule on fewer than beam_size
  final hypotheses, stepping on could still change them).

  The `rules` (decoding/rules.py) restrict the choice: their `tokens` are the only non-EOS
  extensions a hypothesis may take and their EOS column, with `eos`, where it may end; `go_on`
  False (at the limit) leaves it only its EOS extension. The log-normaliser is always the
  whole row's, so scores are the model's log-probabilities. The rules' state follows each
  hypothesis's parent and token.

  Only what the search keeps is turned into log-probabilities: the EOS logit of every
  hypothesis and the beam_size best other logits of each (chosen on the logits, which
  log-softmax and adding the hypothesis's log-prob order the same way). The [batch, beam,
  vocab] log-probabilities are never written: the logits are read twice, once for the
  maxima and the top candidates, once for the log-sum-exp.
  """
  batch_size, beam_size, _ = state.live_seqs.shape
  ids = _last_tokens(state.live_seqs, state.step, bos_id)
  logits, cache = tokens_to_logits(ids, state.cache)
  vocab = logits.shape[-1]
  # [rows, vocab] whatever the leading dims: XLA's CPU reductions round differently by
  # rank, and this way the log-probs equal those of a per-row model bit for bit.
  rows = logits.astype(jnp.float32).reshape(-1, vocab)
  per_beam = min(beam_size, vocab)
  view = rules_lib.View(
    step=state.step,
    seqs=state.live_seqs.reshape(-1, state.live_seqs.shape[-1]),
    limits=jnp.repeat(inputs.limits, beam_size),
    prefix=None if inputs.prefix is None else jnp.repeat(inputs.prefix, beam_size, axis=0),
    vocab=vocab,
  )
  choice = rules.choice(view, flatten_beam_dim(state.rules))
  if choice.tokens is None:
    top_logits, top_tokens, row_max = _top_tokens(rows, per_beam, eos_id)
  else:
    choosable = jnp.where(choice.tokens, rows, NEG_INF)
    top_logits, top_tokens, _ = _top_tokens(choosable, per_beam, eos_id)
    row_max = jnp.max(rows, axis=-1)
  log_normalizer = jnp.log(jnp.sum(jnp.exp(rows - row_max[:, None]), axis=-1))
  live = state.live_log_probs.reshape(-1, 1)

  # Every live hypothesis's EOS extension is offered to the finished set where it may end.
  eos_log_probs = live + _log_probs_of(rows[:, eos_id : eos_id + 1], row_max, log_normalizer)
  eos_ok = rules_lib.merge(
    [choice, rules_lib.Choice(eos=None if choice.tokens is None else choice.tokens[:, eos_id])]
  ).eos
  if eos_ok is not None:
    eos_log_probs = jnp.where(eos_ok[:, None], eos_log_probs, NEG_INF)
  eos_log_probs = eos_log_probs.reshape(batch_size, beam_size)
  if done is not None:
    eos_log_probs = jnp.where(done[:, None], NEG_INF, eos_log_probs)
  eos_scores = eos_log_probs / length_penalty(state.step + 1, alpha)
  eos_tokens = jnp.full((batch_size, beam_size), eos_id, jnp.int32)
  eos_seqs = _write_tokens(state.live_seqs, state.step, eos_tokens)
  finished_seqs, finished_scores = _merge_finished(
    state.finished_seqs, state.finished_scores, eos_seqs, eos_scores
  )

  # The live set is the beam_size best non-EOS extensions of the hypotheses that go on.
  candidates = live + _log_probs_of(top_logits, row_max, log_normalizer)
  if choice.go_on is not None:
    candidates = jnp.where(choice.go_on[:, None], candidates, NEG_INF)
  candidates = candidates.reshape(batch_size, -1)
  if done is not None:
    candidates = jnp.where(done[:, None], NEG_INF, candidates)
  if diversity.groups == 1:
    live_log_probs, top = lax.top_k(candidates, beam_size)  # [batch, beam]
  else:
    shaped = candidates.reshape(batch_size, beam_size, per_beam)
    tokens = top_tokens.reshape(batch_size, beam_size, per_beam)
    live_log_probs, top = diverse_top(shaped, tokens, diversity)
  parent = top // per_beam
  token = jnp.take_along_axis(top_tokens.reshape(batch_size, -1), top, axis=1)
  live_seqs = _write_tokens(gather_beams(state.live_seqs, parent), state.step, token)
  chosen = flatten_beam_dim(gather_beams(state.rules, parent))
  rule_state = unflatten_beam_dim(rules.advance(chosen, token.reshape(-1)), batch_size)
  return _BeamState(
    step=state.step + 1,
    live_seqs=live_seqs,
    live_log_probs=live_log_probs,
    finished_seqs=finished_seqs,
    finished_scores=finished_scores,
    cache=reorder_cache(cache, parent),
    rules=rule_state,
  )


class Stop(NamedTuple):
  """Beam search's stopping rule, the one place it is read (`beam_done`): `rule` one of
  STOP_RULES and `final`, how many of the best finished hypotheses must be final when a
  sentence stops (None: all beam_size, tensor2tensor's rule; 1: the best output only)."""

  rule: str = SearchConfig.beam_stop
  final: int | None = None
  early: bool = True  # False: every sentence runs to its limit (tests: the same results)

  def check(self, beam_size: int) -> "Stop":
    if self.rule not in STOP_RULES:
      raise ValueError(f"stop={self.rule!r}: must be one of {', '.join(STOP_RULES)}")
    if self.final is not None and not 1 <= self.final <= beam_size:
      raise ValueError(f"final={self.final}: must be between 1 and beam_size={beam_size}")
    return self


def beam_done(
  state: _BeamState, limits: jax.Array, alpha: float | jax.Array, stop: Stop
) -> jax.Array:
  """[batch] bool: True where no live hypothesis can still change the `stop.final` best
  finished hypotheses (None: all beam_size of them).

  Bound: a live hypothesis with log-prob L <= 0 and length `step` ends with log-prob
  L' <= L (log-probs only fall) at some length n in [step + 1, max_length], so its score is
  L' / lp(n) <= L / lp(n) <= L / max(lp(step + 1), lp(max_length)): lp is monotone in n
  (increasing for alpha >= 0, where this is t2t's L / lp(max_length); decreasing for
  alpha < 0), so its largest value on the range is at an end. The bound is exact (never
  stops while a live hypothesis could still enter the finished set) for every alpha.
  A sentence is done when that bound for its best live hypothesis is strictly below the
  score of its `final`-th best finished hypothesis (so it has at least `final`) or it has
  no live hypothesis left. With final=1 the 1-best is exact and the search stops as soon as
  no live hypothesis can beat the best finished one; with final=beam_size (tensor2tensor's
  rule) the whole finished set is.

  stop.rule="heuristic" divides by lp(step + 1) alone: the best live hypothesis is scored as
  if it ended at the next step (Hugging Face's early_stopping=False rule). For alpha > 0 it
  stops sooner, since a longer ending's larger divisor is ignored, and may then miss a
  longer hypothesis that would have scored better; for alpha <= 0 it is the exact rule.
  Without stop.early a sentence is done at its limit only (tests: the same results).
  """
  if not stop.early:
    return state.step >= limits
  best_live = jnp.max(state.live_log_probs, axis=1)  # the first, unless diverse groups
  largest_lp = length_penalty(state.step + 1, alpha)
  if stop.rule == "exact":
    largest_lp = jnp.maximum(largest_lp, length_penalty(limits, alpha))
  best_possible = best_live / largest_lp
  rank = state.finished_scores.shape[1] if stop.final is None else stop.final
  last_needed = state.finished_scores[:, rank - 1]
  return (best_live == NEG_INF) | (best_possible < last_needed)


def beam_search(
  tokens_to_logits: TokensToLogits,
  cache: Cache,
  *,
  max_lengths: ArrayLike,
  max_decode_len: int,
  beam_size: int = SearchConfig.beam_size,
  alpha: float | jax.Array = SearchConfig.alpha,
  eos_id: int = EOS_ID,
  bos_id: int = BOS_ID,
  early_stop: bool = True,
  reorder_cache: Callable[[Cache, jax.Array], Cache] | None = None,
  eos_only_at_limit: bool = False,
  stop: str = SearchConfig.beam_stop,
  prefix: jax.Array | None = None,
  final: int | None = None,
  constraint: Any = None,
  sources: jax.Array | None = None,
  no_repeat_ngram: int = 0,
  staged: bool = False,
  diversity: Diversity = PLAIN,
) -> tuple[jax.Array, jax.Array]:
  """Beam search with the GNMT length penalty, as in tensor2tensor (paper: beam 4, alpha 0.6):
  `beam_stage` run once over the whole batch, as one program (jit it whole), or with
  `staged` run from the host by `run_in_stages` (not under jit), which drops finished
  sentences from the batch as it goes, as the Translator's search does.

  Each step extends the live hypotheses by one token. Each live hypothesis's EOS extension
  is offered to a finished set, which keeps the beam_size best by
  score = log p(sequence) / length_penalty(length incl. EOS, alpha). The beam_size most
  probable non-EOS extensions become the next live set; each carries its parent's history
  (its cache is reordered by parent). The search stops when no live hypothesis can still
  enter the finished set (see `beam_done`; exact, not a heuristic) or at
  `max_decode_len`.

  One deliberate difference from t2t's beam_search.py (and Flax's examples/wmt): those take
  the top 2 * beam_size extensions by log-prob and finish only the EOS extensions among
  them. Here every live hypothesis's EOS extension is considered. The live sets are the
  same (t2t's top 2k always contain the top k non-EOS extensions), so the finished set is
  the best of a superset of t2t's candidates and its best score is never lower than t2t's.
  With a beam at least as large as the number of possible prefixes the search is exact.

  Note that beam_size=1 is not greedy search: a hypothesis ending early stays in the
  finished set while the live one continues, and the better of the two by score wins.

  Args:
    tokens_to_logits: without `reorder_cache`, a per-row model (see the module docstring):
      the search copies `cache` to every hypothesis and gathers the copies by parent after
      each step. With `reorder_cache`, a beam-aware model: ids int32 [batch, beam] ->
      logits [batch, beam, vocab] and the new cache.
    cache: without `reorder_cache`, a pytree for `batch` sentences (leading dim batch;
      scalar leaves shared); with it, the model's cache for batch * beam hypotheses in any
      layout whose non-scalar leaves have leading dim batch.
    max_lengths: int [batch] output limit per sentence, EOS included.
    max_decode_len: static length of the returned arrays (>= max(max_lengths)).
    beam_size: hypotheses kept per sentence.
    alpha: length-penalty exponent (a Python float or a traced scalar).
    eos_id, bos_id: end and start token ids.
    early_stop: False runs every sentence to its limit (for tests; same results).
    reorder_cache: (cache, parents int32 [batch, beam]) -> cache, called after every step:
      new hypothesis b of sentence i continues old hypothesis parents[i, b]. Hypotheses
      start identical (all with BOS; only hypothesis 0 is expanded at the first step).
    eos_only_at_limit, prefix, constraint (with `sources`, int32 [batch, src_len], that
      its state starts from), no_repeat_ngram: the decoding rules (`rules.of_settings`).
      prefix: int32 [batch, P], each sentence's forced first tokens, PAD after them (an
      all-PAD row: unconstrained); a limit below len(prefix) + 1 is raised to it.
    stop, final: the stopping rule (`Stop`, `beam_done`).
    diversity: diverse beam search's groups and strength (decoding/diverse.py).

  Returns:
    sequences int32 [batch, beam_size, max_decode_len] (no BOS, EOS then PAD) and scores
    float32 [batch, beam_size], best first. Empty slots (fewer than beam_size sequences of
    nonzero probability) have score -inf and all-PAD sequences. A sentence with no
    finished hypothesis at all (only possible if the model gives EOS probability 0)
    returns its live hypotheses, scored log p / lp(length).
  """
  limits = prefix_limits(_check_args(cache, max_lengths, max_decode_len), prefix, max_decode_len)
  stop_rule = Stop(stop, final, early_stop).check(beam_size)
  rules = rules_lib.of_settings(
    prefix=prefix is not None,
    constraint=constraint,
    eos_only_at_limit=eos_only_at_limit,
    no_repeat_ngram=no_repeat_ngram,
  )
  if constraint is not None and sources is None:
    raise ValueError("a constraint needs the sources its state starts from")
  if reorder_cache is None:
    tokens_to_logits, cache, reorder_cache = _per_row_model(tokens_to_logits, cache, beam_size)
  batch_size = limits.shape[0]
  rule_state = rules.init(sources, limits, prefix)
  diversity = diversity.check(beam_size)
  state = init_beam_state(
    cache, batch_size, beam_size, max_decode_len, rule_state, diversity.groups
  )

  def run(rows: tuple, until: jax.Array) -> tuple[tuple, jax.Array, jax.Array]:
    state, inputs, alpha = rows
    state = beam_stage(
      state,
      tokens_to_logits=tokens_to_logits,
      reorder_cache=reorder_cache,
      inputs=inputs,
      rules=rules,
      alpha=alpha,
      stop=stop_rule,
      bound=max_decode_len,
      until=until,
      eos_id=eos_id,
      bos_id=bos_id,
      diversity=diversity,
    )
    done = beam_done(state, inputs.limits, alpha, stop_rule)
    return (state, inputs, alpha), state.step, done

  outputs = lambda rows: beam_outputs(rows[0], rows[2])
  # alpha travels with the rows (a scalar: never taken), traced in every stage alike.
  rows = (state, RowInputs(limits, prefix), jnp.asarray(alpha, jnp.float32))
  return _once_or_staged(run, outputs, rows, max_decode_len, staged)


def _once_or_staged(
  run: Callable[[Any, Any], tuple[Any, jax.Array, jax.Array]],
  outputs: Callable[[Any], tuple[jax.Array, jax.Array]],
  rows: Any,
  max_decode_len: int,
  staged: bool,
) -> tuple[jax.Array, jax.Array]:
  """A search's stage `run(rows, until)` run once to the end, or from the host by
  `run_in_stages` (halving the batch down to one row as rows finish; each stage jitted)."""
  if not staged:
    return outputs(run(rows, 0)[0])

  def stage(rows: Any, bound: int, until: jax.Array) -> tuple:
    rows, step, done = run(rows, until)
    return rows, step, done, outputs(rows)

  stages = Stages(
    run=jax.jit(stage, static_argnums=1),
    take=jax.jit(
      lambda rows, keep, length: _map_nonscalar(lambda x: x[keep], rows), static_argnums=2
    ),
    resize=None,
  )
  size = jnp.shape(rows[1].limits)[0]
  return run_in_stages(stages, rows, size, [max_decode_len], min_rows=1)


def init_beam_state(
  cache: Cache,
  batch_size: int,
  beam_size: int,
  max_decode_len: int,
  rule_state: PyTree = None,
  groups: int = 1,
) -> _BeamState:
  """The search state before the first step: BOS only, nothing finished; `cache` beam-aware;
  `rule_state` per sentence (leaves [batch, ...]), copied to every hypothesis."""
  empty_seqs = jnp.full((batch_size, beam_size, max_decode_len), PAD_ID, jnp.int32)
  first_beam_only = first_of_each_group(beam_size, groups)
  return _BeamState(
    step=jnp.array(0, jnp.int32),
    live_seqs=empty_seqs,
    # All beams start identical; only the first (of each diversity group) may expand, or
    # it would be found k times.
    live_log_probs=jnp.broadcast_to(first_beam_only, (batch_size, beam_size)),
    finished_seqs=empty_seqs,
    finished_scores=jnp.full((batch_size, beam_size), NEG_INF, jnp.float32),
    cache=cache,
    rules=add_beam_dim(rule_state, beam_size),
  )


def beam_stage(
  state: _BeamState,
  *,
  tokens_to_logits: TokensToLogits,
  reorder_cache: Callable[[Cache, jax.Array], Cache],
  inputs: "RowInputs",
  rules: Rules,
  alpha: float | jax.Array,
  stop: Stop,
  bound: int,
  until: int | jax.Array,
  eos_id: int = EOS_ID,
  bos_id: int = BOS_ID,
  diversity: Diversity = PLAIN,
) -> _BeamState:
  """Beam search steps in one `lax.while_loop`: until step == `bound` (the cache's length
  in positions) or at most `until` sentences are not done (`beam_done`). The unit that
  `beam_search` runs once and `run_in_stages` calls from the host."""

  def cond(state: _BeamState) -> jax.Array:
    not_done = ~beam_done(state, inputs.limits, alpha, stop)
    return (state.step < bound) & (jnp.sum(not_done) > until)

  def body(state: _BeamState) -> _BeamState:
    done = beam_done(state, inputs.limits, alpha, stop)
    return _beam_step(
      state, tokens_to_logits, reorder_cache, inputs, alpha, rules, done, eos_id, bos_id, diversity
    )

  return lax.while_loop(cond, body, _materialized(state))


def beam_outputs(state: _BeamState, alpha: float | jax.Array) -> tuple[jax.Array, jax.Array]:
  """(sequences, scores) as beam_search returns them, from a search state."""
  has_finished = state.finished_scores[:, 0] > NEG_INF
  live_scores = state.live_log_probs / length_penalty(state.step, alpha)
  sequences = jnp.where(has_finished[:, None, None], state.finished_seqs, state.live_seqs)
  scores = jnp.where(has_finished[:, None], state.finished_scores, live_scores)
  return jnp.where((scores > NEG_INF)[..., None], sequences, PAD_ID), scores


# --- greedy search and sampling: one row per output -------------------------------------------


class RowInputs(NamedTuple):
  """Each row's inputs to a search, leading dim rows (beam search: sentences)."""

  limits: jax.Array  # int32 [rows]: output tokens allowed, EOS included (`prefix_limits`)
  prefix: jax.Array | None = None  # int32 [rows, P]: forced first tokens, PAD after them
  keys: jax.Array | None = None  # sampling: uint32 [rows, 2], each row's key (sample_keys)


class _RowState(NamedTuple):
  step: jax.Array  # int32 scalar: tokens generated so far
  seqs: jax.Array  # int32 [rows, max_decode_len]
  log_probs: jax.Array  # float32 [rows]: the model's log p of the tokens taken (EOS included)
  finished: jax.Array  # bool [rows]
  cache: Cache  # leaves [rows, ...]
  rules: PyTree = None  # the rules' state per row, leaves [rows, ...]


class Pick(Protocol):
  """How a row search takes one token per row: (logits float32 [rows, vocab], mask bool
  [rows, vocab] or None (`rules.token_mask`), step, inputs) -> (tokens int32 [rows], the
  model's log-probabilities float32 [rows, vocab] or None when the pick does not compute
  them)."""

  def __call__(
    self, logits: jax.Array, mask: jax.Array | None, step: jax.Array, inputs: RowInputs
  ) -> tuple[jax.Array, jax.Array | None]: ...


def greedy_pick(
  logits: jax.Array, mask: jax.Array | None, step: jax.Array, inputs: RowInputs
) -> tuple[jax.Array, None]:
  """The most probable token the rules allow (chosen on the logits: log-softmax keeps their
  order, so the [rows, vocab] log-probabilities are never written)."""
  choosable = logits if mask is None else jnp.where(mask, logits, NEG_INF)
  return argmax(choosable).astype(jnp.int32), None


@dataclasses.dataclass(frozen=True)
class SamplePick:
  """A token drawn from `sampling_log_probs` of the model's distribution over what the rules
  allow, without PAD and BOS (fairseq's sampler masks PAD the same way); row r's token of
  step t with fold_in(inputs.keys[r], t), so a row's draws do not depend on the rows beside
  it or on the stage it is drawn in. The shaping is traced (jax arrays or floats)."""

  temperature: Any = 1.0
  topk: Any = 0
  topp: Any = 1.0
  bos_id: int = BOS_ID

  def __call__(
    self, logits: jax.Array, mask: jax.Array | None, step: jax.Array, inputs: RowInputs
  ) -> tuple[jax.Array, jax.Array]:
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    vocab = jnp.arange(log_probs.shape[-1])
    allowed = (vocab != PAD_ID) & (vocab != self.bos_id)
    if mask is not None:
      allowed = allowed & mask
    drawn_from = sampling_log_probs(
      jnp.where(allowed, log_probs, NEG_INF), self.temperature, self.topk, self.topp
    )
    step_keys = jax.vmap(lambda k: jax.random.fold_in(k, step))(inputs.keys)
    return draw_tokens(step_keys, drawn_from), log_probs


def init_row_state(
  cache: Cache, rows: int, max_decode_len: int, rule_state: PyTree = None
) -> _RowState:
  """A row search's state before the first step (`cache` and `rule_state` per row)."""
  return _RowState(
    step=jnp.array(0, jnp.int32),
    seqs=jnp.full((rows, max_decode_len), PAD_ID, jnp.int32),
    log_probs=jnp.zeros((rows,), jnp.float32),
    finished=jnp.zeros((rows,), bool),
    cache=cache,
    rules=rule_state,
  )


def row_stage(
  state: _RowState,
  *,
  tokens_to_logits: TokensToLogits,
  inputs: RowInputs,
  rules: Rules,
  pick: Pick,
  bound: int,
  until: int | jax.Array,
  eos_id: int = EOS_ID,
  bos_id: int = BOS_ID,
) -> _RowState:
  """Greedy or sampling steps (`pick`) in one `lax.while_loop`, until step == `bound` (the
  cache's length in positions) or at most `until` rows have not ended: the unit that
  `greedy_search` and `sample_search` run once and `run_in_stages` calls from the host. The
  rules restrict each pick (a row at its limit takes EOS); a row that has ended takes PAD.
  The log-probability added is the model's, normalised over the whole vocabulary."""

  def cond(state: _RowState) -> jax.Array:
    return (state.step < bound) & (jnp.sum(~state.finished) > until)

  def body(state: _RowState) -> _RowState:
    ids = _last_tokens(state.seqs, state.step, bos_id)
    logits, cache = tokens_to_logits(ids.reshape(-1, 1), state.cache)
    logits = logits.astype(jnp.float32)
    vocab = logits.shape[-1]
    view = rules_lib.View(state.step, state.seqs, inputs.limits, inputs.prefix, vocab)
    choice = rules.choice(view, state.rules)
    token, log_probs = pick(logits, rules_lib.token_mask(choice, vocab, eos_id), state.step, inputs)
    token = rules_lib.end_where_stopped(choice, token, eos_id)
    if log_probs is None:
      top = _row_max(logits)
      log_normalizer = jnp.log(jnp.sum(jnp.exp(logits - top[:, None]), axis=-1))
      chosen = jnp.take_along_axis(logits, token[:, None], axis=-1)
      token_log_prob = _log_probs_of(chosen, top, log_normalizer)[:, 0]
    else:
      token_log_prob = jnp.take_along_axis(log_probs, token[:, None], axis=-1)[:, 0]
    token = jnp.where(state.finished, PAD_ID, token)
    seqs = lax.dynamic_update_slice_in_dim(state.seqs, token[:, None], state.step, axis=1)
    return _RowState(
      step=state.step + 1,
      seqs=seqs,
      log_probs=state.log_probs + jnp.where(state.finished, 0.0, token_log_prob),
      finished=state.finished | (token == eos_id),
      cache=cache,
      rules=rules.advance(state.rules, token),
    )

  return lax.while_loop(cond, body, _materialized(state))


def _row_search(
  tokens_to_logits: TokensToLogits,
  cache: Cache,
  pick: Pick,
  *,
  max_lengths: ArrayLike,
  max_decode_len: int,
  keys: jax.Array | None,
  eos_id: int,
  bos_id: int,
  prefix: jax.Array | None,
  constraint: Any,
  sources: jax.Array | None,
  eos_only_at_limit: bool,
  no_repeat_ngram: int,
  staged: bool,
) -> tuple[jax.Array, jax.Array]:
  """`row_stage` run once over every row, or staged (`_once_or_staged`): (sequences [rows,
  max_decode_len], log-probs [rows])."""
  limits = prefix_limits(_check_args(cache, max_lengths, max_decode_len), prefix, max_decode_len)
  if constraint is not None and sources is None:
    raise ValueError("a constraint needs the sources its state starts from")
  rules = rules_lib.of_settings(
    prefix=prefix is not None,
    constraint=constraint,
    eos_only_at_limit=eos_only_at_limit,
    no_repeat_ngram=no_repeat_ngram,
  )
  state = init_row_state(
    cache, limits.shape[0], max_decode_len, rules.init(sources, limits, prefix)
  )

  def run(rows: tuple, until: jax.Array) -> tuple[tuple, jax.Array, jax.Array]:
    state, inputs = rows
    state = row_stage(
      state,
      tokens_to_logits=tokens_to_logits,
      inputs=inputs,
      rules=rules,
      pick=pick,
      bound=max_decode_len,
      until=until,
      eos_id=eos_id,
      bos_id=bos_id,
    )
    return (state, inputs), state.step, state.finished

  outputs = lambda rows: (rows[0].seqs, rows[0].log_probs)
  rows = (state, RowInputs(limits, prefix, keys))
  return _once_or_staged(run, outputs, rows, max_decode_len, staged)


def greedy_search(
  tokens_to_logits: TokensToLogits,
  cache: Cache,
  *,
  max_lengths: ArrayLike,
  max_decode_len: int,
  eos_id: int = EOS_ID,
  bos_id: int = BOS_ID,
  prefix: jax.Array | None = None,
  constraint: Any = None,
  sources: jax.Array | None = None,
  eos_only_at_limit: bool = False,
  no_repeat_ngram: int = 0,
  staged: bool = False,
) -> tuple[jax.Array, jax.Array]:
  """Takes the most probable token the rules allow at every step until EOS (or the forced
  EOS at the limit), as one program.

  Args: as `beam_search`'s; `cache` leaves have leading dim batch.

  Returns:
    sequences int32 [batch, max_decode_len] (no BOS, EOS then PAD) and their log-probs
    float32 [batch]. Stops as soon as every sentence has ended.
  """
  return _row_search(
    tokens_to_logits,
    cache,
    greedy_pick,
    max_lengths=max_lengths,
    max_decode_len=max_decode_len,
    keys=None,
    eos_id=eos_id,
    bos_id=bos_id,
    prefix=prefix,
    constraint=constraint,
    sources=sources,
    eos_only_at_limit=eos_only_at_limit,
    no_repeat_ngram=no_repeat_ngram,
    staged=staged,
  )


def sample_search(
  tokens_to_logits: TokensToLogits,
  cache: Cache,
  *,
  max_lengths: ArrayLike,
  max_decode_len: int,
  keys: jax.Array,
  temperature: float | jax.Array = 1.0,
  topk: int | jax.Array = 0,
  topp: float | jax.Array = 1.0,
  eos_id: int = EOS_ID,
  bos_id: int = BOS_ID,
  prefix: jax.Array | None = None,
  constraint: Any = None,
  sources: jax.Array | None = None,
  eos_only_at_limit: bool = False,
  no_repeat_ngram: int = 0,
  staged: bool = False,
) -> tuple[jax.Array, jax.Array]:
  """Draws every output token (`SamplePick`) until EOS, or the forced EOS at the limit
  (ancestral sampling), as one program.

  Args: as `greedy_search`, one row per sample (`cache` and `max_lengths` with leading dim
    rows); keys: uint32 key data [rows, 2] (`sample_keys`); temperature, topk, topp: see
    `sampling_log_probs` (may be traced).

  Returns:
    sequences int32 [rows, max_decode_len] (no BOS, EOS then PAD) and their log-probs
    float32 [rows] under the model itself (before temperature and truncation), so that
    they rank and compare with beam search's.
  """
  rows = jnp.shape(max_lengths)[0]
  if keys.shape != (rows, 2):
    raise ValueError(f"keys of shape {keys.shape}: need one key per row, ({rows}, 2)")
  return _row_search(
    tokens_to_logits,
    cache,
    SamplePick(temperature, topk, topp, bos_id),
    max_lengths=max_lengths,
    max_decode_len=max_decode_len,
    keys=keys,
    eos_id=eos_id,
    bos_id=bos_id,
    prefix=prefix,
    constraint=constraint,
    sources=sources,
    eos_only_at_limit=eos_only_at_limit,
    no_repeat_ngram=no_repeat_ngram,
    staged=staged,
  )


# --- running a search in stages from the host -------------------------------------------------


class Stages(NamedTuple):
  """What `run_in_stages` needs of a search, each a (jitted) function of its rows' state.

  The rows' state is any pytree whose non-scalar leaves have leading dim rows (the search
  state with its cache, plus per-row inputs such as limits and prefixes) and that holds
  the scalar step.
  """

  run: Callable[[Any, int, int], tuple[Any, jax.Array, jax.Array, tuple[jax.Array, ...]]]
  # (rows, bound, until) -> (rows, step, done, outputs): steps until step == bound (the
  # cache's positions) or at most `until` rows are not done; then the scalar step, bool
  # [rows] whose results are final, and every row's results so far (leading dim rows)
  take: Callable[[Any, jax.Array, int | None], Any]  # (rows, keep int32 [n], length) ->
  # those rows in order, the cache grown to `length` positions (None: as it is)
  resize: Callable[[Any, int], Any] | None  # (rows, n) -> the cache grown to n positions
  first: Callable[[Any, int, int], tuple] | None = None  # the first stage, as `run`, from
  # what `run_in_stages` is given (None: `run`): a program that starts the search (encoder,
  # caches) and runs its first stage in one call


@dataclasses.dataclass
class StageStats:
  """What a staged search did, summed over calls (docs/performance.md): rows stepped times
  steps (padding and done rows included; times beam_size: hypothesis-steps), stages run,
  and how often the batch was compacted and the cache grown."""

  row_steps: int = 0
  stages: int = 0
  compactions: int = 0
  resizes: int = 0


def _power_of_two_at_least(n: int) -> int:
  return 1 << max(n - 1, 0).bit_length()


def compacted_size(running: int, min_rows: int) -> int:
  """The rows `run_in_stages` gathers `running` unfinished rows into: the next power of two,
  at least min_rows (padded with done rows)."""
  return max(_power_of_two_at_least(running), min_rows)


def stage_sizes(batch_size: int, min_rows: int = 1) -> dict[int, tuple[int, ...]]:
  """Every batch size `run_in_stages` can step a batch of `batch_size` rows at, each with
  the sizes it can be compacted to (ascending; none at min_rows or below). A size above
  min_rows is compacted once at most size // 2 rows run, to `compacted_size` of their
  number, so sizes only fall and the table is small: log2(batch_size) + 1 entries at most.
  The stage programs of a batch shape are these sizes times the cache's bounds."""
  table: dict[int, tuple[int, ...]] = {}
  todo = [batch_size]
  while todo:
    size = todo.pop()
    if size in table:
      continue
    running = range(1, size // 2 + 1) if size > min_rows else range(0)
    table[size] = tuple(sorted({compacted_size(n, min_rows) for n in running}))
    todo.extend(table[size])
  return dict(sorted(table.items(), reverse=True))


def compacted_segment(bounds: Sequence[int], segment: int, compacted_bound: int) -> int:
  """The segment of `bounds` a batch compacted in `segment` continues in: the first whose
  bound is at least compacted_bound, and never an earlier one."""
  while segment + 1 < len(bounds) and bounds[segment] < compacted_bound:
    segment += 1
  return segment


def run_in_stages(
  stages: Stages,
  rows: Any,
  batch_size: int,
  bounds: Sequence[int],
  min_rows: int = 1,
  stats: StageStats | None = None,
  compacted_bound: int = 0,
) -> tuple[np.ndarray, ...]:
  """Runs a search to its end in jitted stages chosen on the host, as CTranslate2 does
  step by step: whenever at most half of the rows are still running, those are gathered
  into a batch of the next power of two at least their number (padded with done rows,
  whose results are final), and whenever the step reaches the cache's length it grows to
  the next of `bounds` (`segment_bounds`; the first is its length already). A stage runs
  only as long as neither is due, so the cache is never longer than twice what has been
  written and at least half of the rows stepped are running, at every batch size. Each
  (rows, bound) pair compiles once; powers of two keep the pairs few. A compacted batch's
  cache is at least `compacted_bound` positions long (`compacted_segment`: its take grows
  it), so that no batch below the full size runs on the shortest caches, whose stages would
  compile for a few steps each. `rows` is what the first stage starts from
  (`Stages.first`'s input when it is given, else the rows).

  Returns the outputs (`Stages.run`) of the batch_size original rows, as numpy arrays, each
  row taken when it was done (frozen from then on, so the same whatever runs beside it).
  `stats`, when given, is added to.
  """
  origin = np.arange(batch_size)  # each current row's original row; -1: padding
  results: list[np.ndarray] | None = None
  size, segment, step = batch_size, 0, 0
  stats = StageStats() if stats is None else stats

  def collect(outputs: tuple[jax.Array, ...], which: np.ndarray) -> None:
    nonlocal results
    outputs = jax.device_get(outputs)
    if results is None:
      results = [np.zeros((batch_size,) + x.shape[1:], x.dtype) for x in outputs]
    for result, x in zip(results, outputs):
      result[origin[which]] = x[which]

  stage = stages.first or stages.run
  while True:
    until = size // 2 if size > min_rows else 0
    rows, step_now, done, outputs = stage(rows, bounds[segment], until)
    stage = stages.run
    before, (step, done) = step, jax.device_get((step_now, done))
    step = int(step)  # a Python int: the sums in `stats` must not wrap at 2^31
    stats.stages += 1
    stats.row_steps += size * (step - before)
    real = origin >= 0
    running = np.flatnonzero(real & ~done)
    if running.size == 0 or step >= bounds[-1]:
      collect(outputs, np.flatnonzero(real))
      return tuple(results)
    if running.size <= until:
      size = compacted_size(running.size, min_rows)
      filler = np.flatnonzero(done)[: size - running.size]
      keep = np.concatenate([running, filler])
      grown = compacted_segment(bounds, segment, compacted_bound)
      length = bounds[grown] if grown > segment else None
      segment = grown
      rows = stages.take(rows, jax.device_put(keep.astype(np.int32)), length)  # no program
      collect(outputs, np.flatnonzero(real & done))
      origin = np.concatenate([origin[running], np.full(filler.size, -1)])
      stats.compactions += 1
    elif step >= bounds[segment]:
      segment += 1
      stats.resizes += 1
      rows = stages.resize(rows, bounds[segment])


# --- sampling ---------------------------------------------------------------------------------


def top_k_log_probs(log_probs: jax.Array, k: int | jax.Array) -> jax.Array:
  """log_probs [..., vocab] with every token below the k-th largest set to -inf (k <= 0 or
  k >= vocab: unchanged). Tokens equal to the k-th largest are kept, so a tie at the
  boundary keeps more than k; nothing is renormalised. `k` may be traced."""
  vocab = log_probs.shape[-1]
  ordered = -jnp.sort(-log_probs, axis=-1)  # descending
  index = jnp.clip(jnp.asarray(k, jnp.int32) - 1, 0, vocab - 1)
  kth = jnp.take_along_axis(ordered, jnp.broadcast_to(index, ordered.shape[:-1])[..., None], -1)
  keep = (log_probs >= kth) | (jnp.asarray(k) <= 0)
  return jnp.where(keep, log_probs, NEG_INF)


def top_p_log_probs(log_probs: jax.Array, p: float | jax.Array) -> jax.Array:
  """log_probs [..., vocab] (normalised) restricted to the nucleus: the most probable tokens
  whose probabilities first add up to at least p (Holtzman et al. 2020); the others get
  -inf, nothing is renormalised. A token is in the nucleus when the tokens more probable
  than it hold less than p; the most probable token always is, ties with the last token in
  are kept, and p >= 1 keeps everything (rounding in the sum cannot drop the tail). `p`
  may be traced."""
  ordered = -jnp.sort(-log_probs, axis=-1)
  probs = jnp.exp(ordered)
  before = jnp.cumsum(probs, axis=-1) - probs  # mass of the tokens ranked above each one
  inside = (before < p) | (jnp.arange(ordered.shape[-1]) == 0)
  last = jnp.min(jnp.where(inside, ordered, jnp.inf), axis=-1, keepdims=True)
  keep = (log_probs >= last) | (jnp.asarray(p) >= 1.0)
  return jnp.where(keep, log_probs, NEG_INF)


def sampling_log_probs(
  log_probs: jax.Array,
  temperature: float | jax.Array = 1.0,
  topk: int | jax.Array = 0,
  topp: float | jax.Array = 1.0,
) -> jax.Array:
  """The distribution a token is drawn from, as normalised log-probabilities [..., vocab]:
  the model's log_probs divided by `temperature` and renormalised, cut to the `topk` best
  and renormalised, then cut to the `topp` nucleus and renormalised (the order of
  fairseq's and Hugging Face's samplers: top-p is taken within the top-k).

  Each cut runs only when it removes something (`lax.cond` on the traced settings): both
  sort the vocabulary, which inside the sampling loop cost about 20 times the rest of a
  step on a CPU (docs/performance.md)."""
  tempered = jax.nn.log_softmax(log_probs / temperature, axis=-1)
  topk, topp = jnp.asarray(topk, jnp.int32), jnp.asarray(topp, jnp.float32)
  cut_k = (topk > 0) & (topk < log_probs.shape[-1])
  kept = lax.cond(
    cut_k, lambda x: jax.nn.log_softmax(top_k_log_probs(x, topk), axis=-1), lambda x: x, tempered
  )
  return lax.cond(
    topp < 1.0, lambda x: jax.nn.log_softmax(top_p_log_probs(x, topp), axis=-1), lambda x: x, kept
  )


def draw_tokens(keys: jax.Array, log_probs: jax.Array) -> jax.Array:
  """One token per row drawn from normalised log_probs [rows, vocab] by inverting the
  cumulative distribution with one uniform number per row (uint32 key data keys [rows, 2]):
  token = the first index whose cumulative probability exceeds u * total. Exact, like
  jax.random.categorical's Gumbel-max, which needs vocab random numbers per row: with a
  vocabulary of thousands, generating them was most of a sampling step on a CPU
  (docs/performance.md). A token of probability 0 is never drawn (its cumulative value
  equals its predecessor's), nor is one past the last token of nonzero probability."""
  probs = jnp.exp(log_probs.astype(jnp.float32))
  cumulative = jnp.cumsum(probs, axis=-1)
  u = jax.vmap(jax.random.uniform)(keys) * cumulative[:, -1]
  token = jnp.sum(cumulative <= u[:, None], axis=-1)
  vocab = log_probs.shape[-1]
  last = vocab - 1 - argmax(jnp.flip(probs > 0, axis=-1).astype(jnp.int32))
  return jnp.minimum(token, last).astype(jnp.int32)


def sample_keys(seed: int | jax.Array, sentence_ids: ArrayLike, num_samples: int) -> jax.Array:
  """One key per (sentence, sample): fold_in(fold_in(PRNGKey(seed), sentence id), sample),
  uint32 key data [len(sentence_ids) * num_samples, 2], sentence-major. A sentence's
  samples depend on its id (its index in the input) only, not on its batch or row."""
  root = jax.random.PRNGKey(seed)
  samples = jnp.arange(num_samples)

  def of_sentence(i: jax.Array) -> jax.Array:
    key = jax.random.fold_in(root, i)
    return jax.vmap(lambda j: jax.random.fold_in(key, j))(samples)

  keys = jax.vmap(of_sentence)(jnp.asarray(sentence_ids))
  return keys.reshape(-1, keys.shape[-1])


# --- ensembles --------------------------------------------------------------------------------


def ensemble_log_probs(logits: Sequence[jax.Array]) -> jax.Array:
  """The next-token log-probabilities of an ensemble from its members' logits (each
  [..., vocab], over the same vocabulary): the mean of the members' log-softmax, renormalised,
  float32:

      log p(y) = mean_m log p_m(y) - log sum_y' exp(mean_m log p_m(y'))

  the normalised geometric mean of the members' distributions (a product of experts): a
  token must be likely under every member, and one that any member rules out stays ruled
  out. It stays in log space, where the search works (no exp and log per step), and the
  ensemble of a model with itself is that model. fairseq's ensembles average the
  probabilities instead (logsumexp_m log p_m(y) - log M, a mixture): a token that one member
  likes keeps at least 1/M of its probability whatever the others say. With one member this
  is that member's log-softmax.
  """
  members = [jax.nn.log_softmax(x.astype(jnp.float32), axis=-1) for x in logits]
  mean = sum(members[1:], members[0]) / len(members)
  return jax.nn.log_softmax(mean, axis=-1)
