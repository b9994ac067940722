"""The model as the search sees it: the cache layout of beam search (`BeamSlots`), the
segments the cache grows by, and the two adapters a search runs over.

- `TransformerMembers`: one Transformer or an ensemble of them (same vocabulary). Each member
  encodes once and keeps its own cache; beam search runs the decoder on [batch, beam] ids
  (`Transformer.decode_beam_step`: the hypotheses of a sentence share its encoder
  keys/values, their self-attention entries are written in place and read through
  `BeamSlots`), greedy search and sampling on rows; an ensemble's step combines its
  members' distributions (`ensemble_log_probs`).
- `FunctionModel`: any `tokens_to_logits(ids, cache) -> (logits, cache)` with the cache it
  starts from (the library searches of decoding/search.py): ids int32 [N, 1] -> logits
  [N, vocab]; a beam-aware one (`reorder_cache` given) takes [batch, beam] ids.

Both give a search what the modes (decoding/modes.py) ask of them: the cache of a row or a
beam search, the step over it, and (Transformers) the cache cut, grown or padded between
stages.
"""

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax.typing import VariableDict

from t2t_jax.decoding.beam_dims import (
  add_beam_dim,
  flatten_beam_dim,
  gather_beams,
  map_nonscalar,
  resize_positions,
  unflatten_beam_dim,
)
from t2t_jax.model import Transformer, beam_search_cache, map_self_attention_cache, pad_memory

Cache = Any
TokensToLogits = Callable[[jax.Array, Cache], tuple[jax.Array, Cache]]
Reorder = Callable[[Cache, jax.Array], Cache]  # (cache, parents int32 [batch, beam]) -> cache


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
    """The table for a cache of `length` positions (a stage growing or compacting the beam
    cache, `stages.Schedule`): cut, or padded with zeros for positions not written yet."""
    return BeamSlots(slots=resize_positions(self.slots, length), step=self.step)

  def reorder(self, parents: jax.Array) -> "BeamSlots":
    """After the step: new hypothesis b continues old hypothesis parents[:, b] ([batch, beam])."""
    return BeamSlots(slots=gather_beams(self._with_current(), parents), step=self.step + 1)


def per_row_step(tokens_to_logits: TokensToLogits) -> TokensToLogits:
  """A per-row `tokens_to_logits` as a beam-aware one over a cache copied to every
  hypothesis ([batch, beam, ...], `add_beam_dim`; gathered by parent, `gather_beams`)."""

  def beam_tokens_to_logits(ids: jax.Array, cache: Cache) -> tuple[jax.Array, Cache]:
    logits, new_cache = tokens_to_logits(ids.reshape(-1, 1), flatten_beam_dim(cache))
    logits = logits.reshape(ids.shape + logits.shape[-1:])
    return logits, unflatten_beam_dim(new_cache, ids.shape[0])

  return beam_tokens_to_logits


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


BeamCache = tuple[tuple[VariableDict, ...], BeamSlots]


@dataclasses.dataclass(frozen=True)
class TransformerMembers:
  """One Transformer (an ensemble: several) with its parameters, as a search's model."""

  models: tuple[Transformer, ...]
  params: tuple[VariableDict, ...] = ()

  @classmethod
  def of(cls, params: Any, model: Transformer | tuple[Transformer, ...]) -> "TransformerMembers":
    """(params, model) as the programs take them: one member's, or an ensemble's tuples."""
    if isinstance(model, tuple):
      return cls(model, tuple(params))
    return cls((model,), (params,))

  def caches(self, inputs: jax.Array, max_decode_len: int, repeats: int = 1) -> tuple:
    """Each member encodes `inputs` once and builds its decoding cache (`init_cache`), every
    sentence's encoder output repeated `repeats` times (one row per sample)."""
    caches = []
    for member, params in zip(self.models, self.params):
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

  def row_cache(self, inputs: jax.Array, max_decode_len: int, repeats: int) -> tuple:
    return self.caches(inputs, max_decode_len, repeats)

  def beam_cache(self, inputs: jax.Array, max_decode_len: int, beam_size: int) -> BeamCache:
    caches = self.caches(inputs, max_decode_len)
    return (
      tuple(beam_search_cache(c, beam_size) for c in caches),
      BeamSlots.create(inputs.shape[0], beam_size, max_decode_len),
    )

  def _combine(self, logits: list[jax.Array]) -> jax.Array:
    """One member's logits, or an ensemble's next-token log-probabilities."""
    return logits[0] if len(logits) == 1 else ensemble_log_probs(logits)

  def row_step(self) -> TokensToLogits:
    """The per-row step of greedy search and sampling over the members' caches."""

    def tokens_to_logits(ids: jax.Array, caches: tuple) -> tuple[jax.Array, tuple]:
      logits, new_caches = [], []
      for member, params, cache in zip(self.models, self.params, caches):
        member_logits, new = member.apply(
          {"params": params, "cache": cache}, ids, method=Transformer.decode_step, mutable=["cache"]
        )
        logits.append(member_logits)
        new_caches.append(new["cache"])
      return self._combine(logits), tuple(new_caches)

    return tokens_to_logits

  def beam_step(self) -> tuple[TokensToLogits, Reorder]:
    """(tokens_to_logits, reorder_cache) of beam search: ids [batch, beam] through
    `Transformer.decode_beam_step`, members' caches never moved, one `BeamSlots` table
    reordered for all of them."""

    def tokens_to_logits(ids: jax.Array, cache: BeamCache) -> tuple[jax.Array, BeamCache]:
      model_caches, slots = cache
      mask = slots.attention_mask()
      logits, new_caches = [], []
      for member, params, model_cache in zip(self.models, self.params, model_caches):
        member_logits, new = member.apply(
          {"params": params, "cache": model_cache},
          ids,
          mask,
          method=Transformer.decode_beam_step,
          mutable=["cache"],
        )
        logits.append(member_logits)
        new_caches.append(new["cache"])
      return self._combine(logits), (tuple(new_caches), slots)

    def reorder(cache: BeamCache, parents: jax.Array) -> BeamCache:
      model_caches, slots = cache
      return model_caches, slots.reorder(parents)

    return tokens_to_logits, reorder


def resize_row_cache(caches: tuple, length: int) -> tuple:
  """Members' row caches cut or zero-padded to `length` positions (one slot each)."""
  fn = lambda x, axis: resize_positions(x, length, axis)
  return tuple(map_self_attention_cache(c, fn) for c in caches)


def resize_beam_cache(cache: BeamCache, length: int) -> BeamCache:
  """A beam cache cut or zero-padded to `length` positions: beam_size slots per position in
  each member's self-attention cache, and the BeamSlots table."""
  model_caches, slots = cache
  beam_size = slots.slots.shape[1]
  return resize_row_cache(model_caches, length * beam_size), slots.resize(length)


def pad_row_memory(caches: tuple, length: int) -> tuple:
  """Members' encoder keys/values padded to `length` source positions (`pad_memory`)."""
  return tuple(pad_memory(c, length) for c in caches)


def pad_beam_memory(cache: BeamCache, length: int) -> BeamCache:
  model_caches, slots = cache
  return pad_row_memory(model_caches, length), slots


@dataclasses.dataclass(frozen=True)
class FunctionModel:
  """A `tokens_to_logits` function and the cache it starts from (leading dim batch; scalar
  leaves shared), as a search's model. Per row (`reorder_cache` None) beam search copies the
  cache to every hypothesis and gathers the copies by parent after each step; a beam-aware
  function keeps its own layout and is told the parents (`reorder_cache`)."""

  tokens_to_logits: TokensToLogits
  cache: Cache
  reorder_cache: Reorder | None = None

  def row_cache(self, inputs: Any, max_decode_len: int, repeats: int) -> Cache:
    if repeats == 1:
      return self.cache
    return map_nonscalar(lambda x: jnp.repeat(x, repeats, axis=0), self.cache)

  def beam_cache(self, inputs: Any, max_decode_len: int, beam_size: int) -> Cache:
    return self.cache if self.reorder_cache else add_beam_dim(self.cache, beam_size)

  def row_step(self) -> TokensToLogits:
    return self.tokens_to_logits

  def beam_step(self) -> tuple[TokensToLogits, Reorder]:
    if self.reorder_cache is not None:
      return self.tokens_to_logits, self.reorder_cache
    return per_row_step(self.tokens_to_logits), gather_beams


class CacheLayout(NamedTuple):
  """How the stages between programs change a mode's cache (decoding/modes.py `layout`)."""

  resize: Callable[[Any, int], Any]  # (cache, positions) -> cut or zero-padded
  pad_memory: Callable[[Any, int], Any]  # (cache, source positions) -> encoder side padded


# The Transformer's cache layouts by name (a name is a program's static argument).
LAYOUTS = {
  "beam": CacheLayout(resize_beam_cache, pad_beam_memory),
  "rows": CacheLayout(resize_row_cache, pad_row_memory),
}
