"""Constraints on what a search may emit next: small automata over fixed-shape JAX state.

A constraint is three pure functions (the `Constraint` protocol):

    state = c.init(sources, **inputs)     sources int32 [batch, src_len] (EOS-terminated, PAD 0)
    mask = c.allowed(state)               bool [rows, vocab]: the tokens allowed next
    state = c.advance(state, tokens)      tokens int32 [rows]: the tokens chosen

Every leaf of a state has the leading dimension rows (batch after `init`), so a search can
copy the state to every hypothesis, flatten it to rows, set the log-probabilities of the
tokens `allowed` refuses to -inf, `advance` with the chosen tokens and gather the rows by
parent after each beam step, all inside jit (the shapes never change). Per-sentence data
other than the sources (a forced prefix, an output limit) are keyword inputs of `init`.

`allowed` never refuses every token of a row: where its rules leave nothing (a limit below
`TreeConstraint.min_length`, say) it allows EOS, so the hypothesis ends instead of carrying
-inf scores. After EOS a row allows PAD and EOS and `advance` leaves its state unchanged.

`TreeConstraint` makes every finished output of a parsing model (paper section 6.3, targets
of `t2t_jax.data.trees`) a well-formed tree over exactly the source's words: the leaves
`TreeConstraint.for_symbols` finds, the brackets balanced and matched, no empty constituent,
one root, and always room to finish within each row's output limit. `PrefixConstraint`
forces first tokens (`prefix_token`, as the decoding rule `rules.ForcePrefix`),
`VocabularyConstraint` restricts the vocabulary, and `AllOf` combines constraints.
"""

import dataclasses
import inspect
from collections.abc import Sequence
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from t2t_jax.tokens import EOS_ID, PAD_ID

PyTree = Any
LEAF_FORMS = ("xx", "words", "positions")  # as t2t_jax.data.trees.TREE_LEAVES

_OTHER, _OPEN, _CLOSE = 0, 1, 2  # token kinds of TreeConstraint's table


class Constraint(Protocol):
  def init(self, sources: jax.Array, **inputs: jax.Array) -> PyTree: ...

  def allowed(self, state: PyTree) -> jax.Array: ...

  def advance(self, state: PyTree, tokens: jax.Array) -> PyTree: ...


def init_state(constraint: Any, sources: jax.Array, **inputs: jax.Array) -> PyTree:
  """`constraint.init(sources, ...)` with those of `inputs` that its init names (a search
  offers every per-sentence input it has, e.g. max_lengths and prefix)."""
  names = inspect.signature(constraint.init).parameters
  return constraint.init(sources, **{k: v for k, v in inputs.items() if k in names})


def source_lengths(sources: jax.Array) -> jax.Array:
  """int32 [batch]: the tokens of each source before its EOS (PAD and EOS excluded)."""
  before_eos = jnp.cumsum(sources == EOS_ID, axis=-1) == 0
  return jnp.sum(before_eos & (sources != PAD_ID), axis=-1).astype(jnp.int32)


def _finished_rows(mask: jax.Array, done: jax.Array, eos_id: int, pad_id: int) -> jax.Array:
  """`mask` with finished rows allowing only PAD and EOS, and EOS wherever nothing is left."""
  vocab = jnp.arange(mask.shape[-1])
  end = (vocab == eos_id) | (vocab == pad_id)
  mask = jnp.where(done[:, None], end[None, :], mask)
  stuck = ~jnp.any(mask, axis=-1)
  return mask | (stuck[:, None] & (vocab == eos_id)[None, :])


def prefix_token(prefix: jax.Array, step: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(forced bool [rows], token int32 [rows]) at `step`: whether each row is still inside its
  prefix (int32 [rows, P], PAD after its tokens; `step` a scalar or int32 [rows]) and the
  prefix token it must take there. The one definition of prefix forcing: the decoding rule
  (rules.ForcePrefix) and `PrefixConstraint` read it."""
  lengths = jnp.sum(prefix != PAD_ID, axis=-1)
  index = jnp.minimum(step, prefix.shape[-1] - 1)
  if jnp.ndim(index) == 0:
    token = jax.lax.dynamic_index_in_dim(prefix, index, axis=-1, keepdims=False)
  else:
    token = jnp.take_along_axis(prefix, index[:, None], axis=-1)[:, 0]
  return step < lengths, token.astype(jnp.int32)


def _one_hot(ids: jax.Array, vocab_size: int) -> jax.Array:
  return ids[:, None] == jnp.arange(vocab_size)[None, :]


@dataclasses.dataclass(frozen=True)
class TreeConstraint:
  """Linearized trees over the source's words: '(L' ... ')L' brackets and one leaf per word.

  open_ids[i] and close_ids[i] are the vocabulary ids of '(L' and ')L' of the i-th label.
  Leaves by `leaves` (LEAF_FORMS): 'xx', any of `leaf_ids`; 'positions', exactly
  leaf_ids[k] as the (k+1)-th leaf (the ids of XX1, XX2, ...; the last one repeats beyond the
  table); 'words', exactly the source's (k+1)-th token (the decoder copies the sentence).

  The rules, each checked against a Python automaton in tests/test_constraints.py:
  - the first token opens the root; after the root closes only EOS may follow (it closes
    after the last leaf, and a bracket opens only while a leaf is left to fill it);
  - a leaf only inside a bracket and while fewer leaves than source words are out;
  - a closing bracket only of the innermost open label, once that constituent holds a leaf,
    and the root's only once every leaf is out;
  - an opening bracket only while depth < max_depth and, with max_opens > 0, while fewer
    than max_opens opening brackets follow each other (since the last leaf or closing
    bracket): the treebank's own bounds, which keep a weak model from stacking unary
    brackets (`(NX (NX (NX ...`) until its output limit;
  - EOS only when every leaf is out and every bracket closed (or for an empty source);
  - nothing whose shortest completion (the leaves left, one closing bracket per open one,
    EOS) would pass the row's `max_lengths` (tokens including EOS; `init` input, default
    unlimited). A limit of at least `min_length(words)` therefore always finishes.
  """

  vocab_size: int
  open_ids: tuple[int, ...]
  close_ids: tuple[int, ...]
  leaf_ids: tuple[int, ...] = ()
  leaves: str = "xx"
  max_depth: int = 64
  max_opens: int = 0  # opening brackets in a row at most (0: any number)
  eos_id: int = EOS_ID
  pad_id: int = PAD_ID

  def __post_init__(self) -> None:
    if self.leaves not in LEAF_FORMS:
      raise ValueError(f"leaves={self.leaves!r} must be one of {LEAF_FORMS}")
    if len(self.open_ids) != len(self.close_ids) or not self.open_ids:
      raise ValueError("open_ids and close_ids: one id of each per label, at least one label")
    if self.max_depth < 1 or self.max_opens < 0:
      raise ValueError(f"max_depth={self.max_depth} must be >= 1, max_opens={self.max_opens} >= 0")
    if self.leaves != "words" and not self.leaf_ids:
      raise ValueError(f"leaves={self.leaves!r} needs leaf_ids")
    ids = list(self.open_ids) + list(self.close_ids) + list(self.leaf_ids)
    if len(set(ids)) != len(ids) or {self.eos_id, self.pad_id} & set(ids):
      raise ValueError("bracket and leaf ids must be distinct, and not EOS or PAD")
    if not all(0 <= i < self.vocab_size for i in ids):
      raise ValueError(f"every id must be below vocab_size={self.vocab_size}")
    kind = np.zeros(self.vocab_size, np.int32)
    label = np.zeros(self.vocab_size, np.int32)
    kind[list(self.open_ids)], kind[list(self.close_ids)] = _OPEN, _CLOSE
    label[list(self.open_ids)] = label[list(self.close_ids)] = np.arange(len(self.open_ids))
    leaf_mask = np.zeros(self.vocab_size, bool)
    leaf_mask[list(self.leaf_ids)] = True
    object.__setattr__(self, "_kind", kind)
    object.__setattr__(self, "_label", label)
    object.__setattr__(self, "_leaf_mask", leaf_mask)

  @classmethod
  def for_symbols(
    cls, pieces: Sequence[str], leaves: str = "xx", max_depth: int = 64, max_opens: int = 0
  ) -> "TreeConstraint":
    """The constraint of a parsing vocabulary, `pieces[i]` the symbol of id i (a tokenizer's
    `id_to_piece` over range(vocab_size)): labels with both '(L' and ')L', leaves 'XX'
    (xx) or XX1, XX2, ... (positions)."""
    index = {p: i for i, p in enumerate(pieces)}
    labels = sorted(p[1:] for p in pieces if len(p) > 1 and p[0] == "(" and ")" + p[1:] in index)
    if leaves == "xx":
      leaf_ids = (index["XX"],) if "XX" in index else ()
    elif leaves == "positions":
      leaf_ids = []
      while f"XX{len(leaf_ids) + 1}" in index:
        leaf_ids.append(index[f"XX{len(leaf_ids) + 1}"])
      leaf_ids = tuple(leaf_ids)
    else:
      leaf_ids = ()
    return cls(
      vocab_size=len(pieces),
      open_ids=tuple(index["(" + label] for label in labels),
      close_ids=tuple(index[")" + label] for label in labels),
      leaf_ids=leaf_ids,
      leaves=leaves,
      max_depth=max_depth,
      max_opens=max_opens,
    )

  @staticmethod
  def min_length(words: int) -> int:
    """The shortest output of `words` leaves, EOS included: '(L', the leaves, ')L', EOS."""
    return words + 3 if words else 1

  def init(self, sources: jax.Array, max_lengths: jax.Array | None = None) -> PyTree:
    """State of each sentence; `max_lengths` int32 [batch]: output tokens allowed, EOS
    included (the search's per-row limit); None: no limit."""
    batch = sources.shape[0]
    zeros = jnp.zeros((batch,), jnp.int32)
    if max_lengths is None:
      max_lengths = jnp.full((batch,), jnp.iinfo(jnp.int32).max // 2, jnp.int32)
    return dict(
      words=sources.astype(jnp.int32),  # [batch, src_len]: the leaves of 'words'
      num_words=source_lengths(sources),
      limit=jnp.asarray(max_lengths, jnp.int32),
      length=zeros,  # tokens emitted
      leaves=zeros,  # leaves emitted
      depth=zeros,  # brackets open
      opens=zeros,  # opening brackets since the last leaf or closing bracket
      stack=jnp.zeros((batch, self.max_depth), jnp.int32),  # label index per open bracket
      filled=jnp.zeros((batch, self.max_depth), bool),  # whether that bracket holds a leaf
      done=jnp.zeros((batch,), bool),
    )

  def _next_leaf(self, state: PyTree) -> jax.Array:
    """bool [rows, vocab]: the leaf tokens allowed as the next leaf."""
    rows = state["leaves"].shape[0]
    if self.leaves == "xx":
      return jnp.broadcast_to(jnp.asarray(self._leaf_mask), (rows, self.vocab_size))
    if self.leaves == "positions":
      index = jnp.minimum(state["leaves"], len(self.leaf_ids) - 1)
      return _one_hot(jnp.asarray(self.leaf_ids, jnp.int32)[index], self.vocab_size)
    index = jnp.minimum(state["leaves"], state["words"].shape[1] - 1)
    word = jnp.take_along_axis(state["words"], index[:, None], axis=1)[:, 0]
    return _one_hot(word, self.vocab_size)

  def allowed(self, state: PyTree) -> jax.Array:
    depth, length = state["depth"], state["length"]
    left = state["num_words"] - state["leaves"]  # leaves still to come
    room = state["limit"] - length - 1  # tokens after this one, EOS included
    top = jnp.maximum(depth - 1, 0)
    top_label = jnp.take_along_axis(state["stack"], top[:, None], axis=1)[:, 0]
    top_filled = jnp.take_along_axis(state["filled"], top[:, None], axis=1)[:, 0]
    inside = depth > 0
    # Each kind of token, if chosen now, and whether its shortest completion still fits.
    leaf = inside & (left > 0) & (left - 1 + depth + 1 <= room)
    # One root: the root closes only after the last leaf, and opening needs a leaf left.
    opening = (left > 0) & (depth < self.max_depth) & (left + depth + 2 <= room)
    if self.max_opens > 0:
      opening &= state["opens"] < self.max_opens
    closing = inside & top_filled & ((depth > 1) | (left == 0)) & (left + depth <= room)
    end = (left == 0) & (depth == 0)
    kind = jnp.asarray(self._kind)[None, :]
    label = jnp.asarray(self._label)[None, :]
    vocab = jnp.arange(self.vocab_size)[None, :]
    mask = (
      (self._next_leaf(state) & leaf[:, None])
      | ((kind == _OPEN) & opening[:, None])
      | ((kind == _CLOSE) & (label == top_label[:, None]) & closing[:, None])
      | ((vocab == self.eos_id) & end[:, None])
    )
    return _finished_rows(mask, state["done"], self.eos_id, self.pad_id)

  def advance(self, state: PyTree, tokens: jax.Array) -> PyTree:
    tokens = tokens.astype(jnp.int32)
    kind = jnp.asarray(self._kind)[tokens]
    label = jnp.asarray(self._label)[tokens]
    live = ~state["done"] & (tokens != self.pad_id)
    eos = live & (tokens == self.eos_id)
    opens = live & (kind == _OPEN)
    closes = live & (kind == _CLOSE) & (state["depth"] > 0)
    leaf = live & ~eos & (kind == _OTHER)
    depth = state["depth"]
    levels = jnp.arange(self.max_depth)[None, :]
    at_depth = levels == depth[:, None]  # the level an opening bracket takes
    innermost = levels == (depth - 1)[:, None]  # the level a leaf fills, a closing leaves
    parent = levels == (depth - 2)[:, None]
    stack = jnp.where(opens[:, None] & at_depth, label[:, None], state["stack"])
    filled = state["filled"]
    filled = jnp.where(opens[:, None] & at_depth, False, filled)
    filled = filled | (leaf[:, None] & innermost) | (closes[:, None] & parent)
    return dict(
      state,
      length=state["length"] + live,
      leaves=state["leaves"] + leaf,
      depth=depth + opens - closes,
      opens=jnp.where(opens, state["opens"] + 1, jnp.where(leaf | closes, 0, state["opens"])),
      stack=stack,
      filled=filled,
      done=state["done"] | eos,
    )


@dataclasses.dataclass(frozen=True)
class PrefixConstraint:
  """Forced first tokens: while a row is inside its prefix (int32 [batch, P], PAD after its
  tokens; an `init` input) only the prefix's next token is allowed, then every token, as
  `rules.ForcePrefix` does, from its own step count."""

  vocab_size: int
  eos_id: int = EOS_ID
  pad_id: int = PAD_ID

  def init(self, sources: jax.Array, prefix: jax.Array) -> PyTree:
    if prefix.ndim != 2 or prefix.shape[0] != sources.shape[0]:
      raise ValueError(f"prefix of shape {prefix.shape}: need [batch = {sources.shape[0]}, P]")
    return dict(
      prefix=prefix.astype(jnp.int32),
      step=jnp.zeros((sources.shape[0],), jnp.int32),
      done=jnp.zeros((sources.shape[0],), bool),
    )

  def allowed(self, state: PyTree) -> jax.Array:
    forced, token = prefix_token(state["prefix"], state["step"])
    mask = ~forced[:, None] | _one_hot(token, self.vocab_size)
    return _finished_rows(mask, state["done"], self.eos_id, self.pad_id)

  def advance(self, state: PyTree, tokens: jax.Array) -> PyTree:
    live = ~state["done"] & (tokens != self.pad_id)
    return dict(
      state, step=state["step"] + live, done=state["done"] | (live & (tokens == self.eos_id))
    )


@dataclasses.dataclass(frozen=True)
class VocabularyConstraint:
  """A fixed set of allowed token ids (EOS always among them, so every row can end)."""

  vocab_size: int
  ids: tuple[int, ...]
  eos_id: int = EOS_ID
  pad_id: int = PAD_ID

  def init(self, sources: jax.Array) -> PyTree:
    return dict(done=jnp.zeros((sources.shape[0],), bool))

  def allowed(self, state: PyTree) -> jax.Array:
    mask = np.zeros(self.vocab_size, bool)
    mask[list(self.ids) + [self.eos_id]] = True
    rows = state["done"].shape[0]
    mask = jnp.broadcast_to(jnp.asarray(mask), (rows, self.vocab_size))
    return _finished_rows(mask, state["done"], self.eos_id, self.pad_id)

  def advance(self, state: PyTree, tokens: jax.Array) -> PyTree:
    live = ~state["done"] & (tokens != self.pad_id)
    return dict(done=state["done"] | (live & (tokens == self.eos_id)))


@dataclasses.dataclass(frozen=True)
class AllOf:
  """Several constraints at once: a token is allowed when every one allows it. `init`'s
  keyword inputs go to the members that name them."""

  members: tuple[Any, ...]

  def init(self, sources: jax.Array, **inputs: jax.Array) -> PyTree:
    states = []
    for member in self.members:
      names = inspect.signature(member.init).parameters
      states.append(member.init(sources, **{k: v for k, v in inputs.items() if k in names}))
    return tuple(states)

  def allowed(self, state: PyTree) -> jax.Array:
    masks = [m.allowed(s) for m, s in zip(self.members, state)]
    mask = masks[0]
    for other in masks[1:]:
      mask = mask & other
    eos_id = getattr(self.members[0], "eos_id", EOS_ID)
    stuck = ~jnp.any(mask, axis=-1)
    return mask | (stuck[:, None] & (jnp.arange(mask.shape[-1]) == eos_id)[None, :])

  def advance(self, state: PyTree, tokens: jax.Array) -> PyTree:
    return tuple(m.advance(s, tokens) for m, s in zip(self.members, state))
