"""What a search may choose next: decoding rules, each written once and composed, applied at
the one point where every search (beam, greedy, sampling) chooses its tokens.

A rule sees a `View` of the rows being extended (the step, each row's tokens so far, its
output limit and forced prefix, and its own per-row state) and returns a `Choice`, three
optional restrictions that the searches apply without knowing which rule asked:

    tokens  bool [rows, vocab]  the tokens a row may take (EOS's column included)
    go_on   bool [rows]         whether a row may take anything but EOS (False: it must end)
    eos     bool [rows]         whether a row may end now

None is "no restriction", so a rule that never restricts the vocabulary costs no
[rows, vocab] pass (beam search then keeps its fast top-k over the raw logits). Rules only
remove choices: the log-probabilities of what is left are the model's, never renormalised,
so every mode returns the model's log p of its outputs.

A rule with state (a grammar's automaton) keeps it per row: `init` at the start, `advance`
with the chosen tokens; beam search gathers it by parent like every other per-hypothesis
leaf. A rule the settings ask for is registered once in decoding/rulebook.py, which
builds every search's rules; docs/design.md says where a new rule goes.
"""

import dataclasses
from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp

from t2t_jax.decoding import constraints
from t2t_jax.decoding.constraints import prefix_token
from t2t_jax.tokens import EOS_ID

PyTree = Any


class View(NamedTuple):
  """The rows a step extends, as the rules see them."""

  step: jax.Array  # int32 scalar: tokens each row has taken so far
  seqs: jax.Array  # int32 [rows, max_decode_len]: those tokens, PAD from `step` on
  limits: jax.Array  # int32 [rows]: output tokens allowed, EOS included
  prefix: jax.Array | None  # int32 [rows, P]: forced first tokens, PAD after them
  vocab: int  # the vocabulary size (static)


class Choice(NamedTuple):
  """Restrictions of one step (None: none). See the module docstring."""

  tokens: jax.Array | None = None
  go_on: jax.Array | None = None
  eos: jax.Array | None = None


def _both(a: jax.Array | None, b: jax.Array | None) -> jax.Array | None:
  return b if a is None else a if b is None else a & b


def merge(choices: Sequence[Choice]) -> Choice:
  """What every one of `choices` allows."""
  out = Choice()
  for c in choices:
    out = Choice(*(_both(a, b) for a, b in zip(out, c)))
  return out


class Rule(Protocol):
  """One decoding rule (frozen and hashable: it is part of the compiled programs' key)."""

  def init(self, sources: jax.Array, limits: jax.Array, prefix: jax.Array | None) -> PyTree:
    """Per-sentence state, leaves [batch, ...] (None: the rule keeps none)."""
    ...

  def choice(self, view: View, state: PyTree) -> Choice: ...

  def advance(self, state: PyTree, tokens: jax.Array) -> PyTree: ...


class Stateless:
  """A rule that decides from the `View` alone (no per-row state)."""

  def init(self, sources: jax.Array, limits: jax.Array, prefix: jax.Array | None) -> PyTree:
    return None

  def advance(self, state: PyTree, tokens: jax.Array) -> PyTree:
    return state


@dataclasses.dataclass(frozen=True)
class EndAtLimit(Stateless):
  """A row that reaches its limit ends: at its last step only EOS may be taken, and EOS keeps
  its model log-probability (the paper's output limit, source length + 50)."""

  def choice(self, view: View, state: PyTree) -> Choice:
    return Choice(go_on=view.step + 1 < view.limits)


@dataclasses.dataclass(frozen=True)
class EosOnlyAtLimit(Stateless):
  """EOS only at the limit, so every output has its limit's length whatever the model
  (benchmarks; CTranslate2's min_decoding_length). EOS stays in the softmax."""

  def choice(self, view: View, state: PyTree) -> Choice:
    return Choice(eos=view.step + 1 >= view.limits)


@dataclasses.dataclass(frozen=True)
class ForcePrefix(Stateless):
  """A row inside its prefix takes the prefix's next token and nothing else (not EOS);
  its score counts the token's log-probability."""

  def choice(self, view: View, state: PyTree) -> Choice:
    forced, token = prefix_token(view.prefix, view.step)
    return Choice(tokens=~forced[:, None] | (token[:, None] == jnp.arange(view.vocab)))


@dataclasses.dataclass(frozen=True)
class Constrained:
  """A `decoding.constraints` constraint (a grammar, a vocabulary): its `allowed` tokens, EOS
  where it allows EOS; its state per row."""

  constraint: Any

  def init(self, sources: jax.Array, limits: jax.Array, prefix: jax.Array | None) -> PyTree:
    inputs = dict(max_lengths=limits) if prefix is None else dict(max_lengths=limits, prefix=prefix)
    return constraints.init_state(self.constraint, sources, **inputs)

  def choice(self, view: View, state: PyTree) -> Choice:
    return Choice(tokens=self.constraint.allowed(state))

  def advance(self, state: PyTree, tokens: jax.Array) -> PyTree:
    return self.constraint.advance(state, tokens)


@dataclasses.dataclass(frozen=True)
class Rules:
  """Rules applied together: a token is allowed when every rule allows it. The state is
  the tuple of the members' states."""

  members: tuple[Any, ...] = ()

  def init(self, sources: jax.Array, limits: jax.Array, prefix: jax.Array | None) -> PyTree:
    return tuple(r.init(sources, limits, prefix) for r in self.members)

  def choice(self, view: View, state: PyTree) -> Choice:
    return merge([r.choice(view, s) for r, s in zip(self.members, state)])

  def advance(self, state: PyTree, tokens: jax.Array) -> PyTree:
    return tuple(r.advance(s, tokens) for r, s in zip(self.members, state))


def token_mask(choice: Choice, vocab: int, eos_id: int = EOS_ID) -> jax.Array | None:
  """bool [rows, vocab]: the tokens `choice.tokens` and `choice.eos` leave (None: all). A
  row's `go_on` is applied after the choice (`end_where_stopped`), so a forced end never
  depends on what the other rules allow."""
  if choice.eos is None:
    return choice.tokens
  eos_ok = choice.eos[:, None] | (jnp.arange(vocab) != eos_id)
  return eos_ok if choice.tokens is None else choice.tokens & eos_ok


def end_where_stopped(choice: Choice, tokens: jax.Array, eos_id: int = EOS_ID) -> jax.Array:
  """tokens int32 [rows] with EOS wherever `choice.go_on` is False."""
  return tokens if choice.go_on is None else jnp.where(choice.go_on, tokens, eos_id)
