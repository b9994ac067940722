"""Beam search: its state, one step, the exact stopping rule, and a stage of steps.

Beam search with the GNMT length penalty as in tensor2tensor (paper 6.1: beam 4, alpha 0.6).
Each step extends the live hypotheses by one token. Each live hypothesis's EOS extension is
offered to a finished set, which keeps the beam_size best by
score = log p(sequence) / length_penalty(length incl. EOS, alpha). The beam_size most
probable non-EOS extensions become the next live set; each carries its parent's history
(its cache is reordered by parent). A sentence stops when no live hypothesis can still enter
the finished set (`beam_done`; exact, not a heuristic) or at its limit.

One deliberate difference from t2t's beam_search.py (and Flax's examples/wmt): those take the
top 2 * beam_size extensions by log-prob and finish only the EOS extensions among them. Here
every live hypothesis's EOS extension is considered. The live sets are the same (t2t's top 2k
always contain the top k non-EOS extensions), so the finished set is the best of a superset
of t2t's candidates and its best score is never lower than t2t's. With a beam at least as
large as the number of possible prefixes the search is exact. beam_size=1 is not greedy
search: a hypothesis ending early stays in the finished set while the live one continues,
and the better of the two by score wins.
"""

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.typing import ArrayLike

from t2t_jax.decoding import rules as rules_lib
from t2t_jax.decoding.beam_dims import (
  add_beam_dim,
  flatten_beam_dim,
  gather_beams,
  last_tokens,
  materialized,
  unflatten_beam_dim,
  write_tokens,
)
from t2t_jax.decoding.config import SearchConfig
from t2t_jax.decoding.diverse import PLAIN, Diversity, diverse_top, first_of_each_group
from t2t_jax.decoding.kernels import NEG_INF, log_probs_of, top_tokens
from t2t_jax.decoding.rows import RowInputs
from t2t_jax.decoding.rules import Rules
from t2t_jax.tokens import BOS_ID, EOS_ID, PAD_ID

Cache = Any
PyTree = Any
TokensToLogits = Callable[[jax.Array, Cache], tuple[jax.Array, Cache]]


def length_penalty(length: ArrayLike, alpha: float | jax.Array) -> jax.Array:
  """GNMT length penalty lp = ((5 + length) / 6) ** alpha (Wu et al. 2016, eq. 14).

  `length` counts generated tokens including EOS; float32, broadcasting.
  """
  return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


class BeamState(NamedTuple):
  step: jax.Array  # int32 scalar: tokens generated so far by every live hypothesis
  live_seqs: jax.Array  # int32 [batch, beam, max_decode_len], PAD beyond `step`
  live_log_probs: jax.Array  # float32 [batch, beam], sorted best first; -inf = empty slot
  finished_seqs: jax.Array  # int32 [batch, beam, max_decode_len], EOS-terminated
  finished_scores: jax.Array  # float32 [batch, beam], sorted best first; -inf = empty slot
  cache: Cache  # the model's, for beams (see beam_search)
  rules: PyTree = None  # the rules' state per hypothesis, leaves [batch, beam, ...]


def merge_finished(
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


def beam_step(
  state: BeamState,
  tokens_to_logits: TokensToLogits,
  reorder_cache: Callable[[Cache, jax.Array], Cache],
  inputs: RowInputs,
  alpha: float | jax.Array,
  rules: Rules,
  done: jax.Array | None = None,
  eos_id: int = EOS_ID,
  bos_id: int = BOS_ID,
  diversity: Diversity = PLAIN,
) -> BeamState:
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
  ids = last_tokens(state.live_seqs, state.step, bos_id)
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
    top_logits, candidate_tokens, row_max = top_tokens(rows, per_beam, eos_id)
  else:
    choosable = jnp.where(choice.tokens, rows, NEG_INF)
    top_logits, candidate_tokens, _ = top_tokens(choosable, per_beam, eos_id)
    row_max = jnp.max(rows, axis=-1)
  log_normalizer = jnp.log(jnp.sum(jnp.exp(rows - row_max[:, None]), axis=-1))
  live = state.live_log_probs.reshape(-1, 1)

  # Every live hypothesis's EOS extension is offered to the finished set where it may end.
  eos_log_probs = live + log_probs_of(rows[:, eos_id : eos_id + 1], row_max, log_normalizer)
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
  eos_seqs = write_tokens(state.live_seqs, state.step, eos_tokens)
  finished_seqs, finished_scores = merge_finished(
    state.finished_seqs, state.finished_scores, eos_seqs, eos_scores
  )

  # The live set is the beam_size best non-EOS extensions of the hypotheses that go on.
  candidates = live + log_probs_of(top_logits, row_max, log_normalizer)
  if choice.go_on is not None:
    candidates = jnp.where(choice.go_on[:, None], candidates, NEG_INF)
  candidates = candidates.reshape(batch_size, -1)
  if done is not None:
    candidates = jnp.where(done[:, None], NEG_INF, candidates)
  if diversity.diverse_groups == 1:
    live_log_probs, top = lax.top_k(candidates, beam_size)  # [batch, beam]
  else:
    shaped = candidates.reshape(batch_size, beam_size, per_beam)
    tokens = candidate_tokens.reshape(batch_size, beam_size, per_beam)
    live_log_probs, top = diverse_top(shaped, tokens, diversity)
  parent = top // per_beam
  token = jnp.take_along_axis(candidate_tokens.reshape(batch_size, -1), top, axis=1)
  live_seqs = write_tokens(gather_beams(state.live_seqs, parent), state.step, token)
  chosen = flatten_beam_dim(gather_beams(state.rules, parent))
  rule_state = unflatten_beam_dim(rules.advance(chosen, token.reshape(-1)), batch_size)
  return BeamState(
    step=state.step + 1,
    live_seqs=live_seqs,
    live_log_probs=live_log_probs,
    finished_seqs=finished_seqs,
    finished_scores=finished_scores,
    cache=reorder_cache(cache, parent),
    rules=rule_state,
  )


class Stop(NamedTuple):
  """Beam search's stopping rule, the one place it is read (`beam_done`): `beam_stop` one
  of STOP_RULES (`SearchConfig.beam_stop`) and `nbest`, how many of the best finished
  hypotheses the caller reads, which must be final when a sentence stops (None: all
  beam_size, tensor2tensor's rule; 1: the best output only)."""

  beam_stop: str = SearchConfig.beam_stop
  nbest: int | None = None
  early: bool = True  # False: every sentence runs to its limit (tests: the same results)


def beam_done(
  state: BeamState, limits: jax.Array, alpha: float | jax.Array, stop: Stop
) -> jax.Array:
  """[batch] bool: True where no live hypothesis can still change the `stop.nbest` best
  finished hypotheses (None: all beam_size of them).

  Bound: a live hypothesis with log-prob L <= 0 and length `step` ends with log-prob
  L' <= L (log-probs only fall) at some length n in [step + 1, max_length], so its score is
  L' / lp(n) <= L / lp(n) <= L / max(lp(step + 1), lp(max_length)): lp is monotone in n
  (increasing for alpha >= 0, where this is t2t's L / lp(max_length); decreasing for
  alpha < 0), so its largest value on the range is at an end. The bound is exact (never
  stops while a live hypothesis could still enter the finished set) for every alpha.
  A sentence is done when that bound for its best live hypothesis is strictly below the
  score of its `nbest`-th best finished hypothesis (so it has at least `nbest`) or it has
  no live hypothesis left. With nbest=1 the 1-best is exact and the search stops as soon as
  no live hypothesis can beat the best finished one; with nbest=beam_size (tensor2tensor's
  rule) the whole finished set is.

  stop.beam_stop="heuristic" divides by lp(step + 1) alone: the best live hypothesis is scored as
  if it ended at the next step (Hugging Face's early_stopping=False rule). For alpha > 0 it
  stops sooner, since a longer ending's larger divisor is ignored, and may then miss a
  longer hypothesis that would have scored better; for alpha <= 0 it is the exact rule.
  Without stop.early a sentence is done at its limit only (tests: the same results).
  """
  if not stop.early:
    return state.step >= limits
  best_live = jnp.max(state.live_log_probs, axis=1)  # the first, unless diverse groups
  largest_lp = length_penalty(state.step + 1, alpha)
  if stop.beam_stop == "exact":
    largest_lp = jnp.maximum(largest_lp, length_penalty(limits, alpha))
  best_possible = best_live / largest_lp
  rank = state.finished_scores.shape[1] if stop.nbest is None else stop.nbest
  last_needed = state.finished_scores[:, rank - 1]
  return (best_live == NEG_INF) | (best_possible < last_needed)


def init_beam_state(
  cache: Cache,
  batch_size: int,
  beam_size: int,
  max_decode_len: int,
  rule_state: PyTree = None,
  groups: int = 1,
) -> BeamState:
  """The search state before the first step: BOS only, nothing finished; `cache` beam-aware;
  `rule_state` per sentence (leaves [batch, ...]), copied to every hypothesis."""
  empty_seqs = jnp.full((batch_size, beam_size, max_decode_len), PAD_ID, jnp.int32)
  first_beam_only = first_of_each_group(beam_size, groups)
  return BeamState(
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
  state: BeamState,
  *,
  tokens_to_logits: TokensToLogits,
  reorder_cache: Callable[[Cache, jax.Array], Cache],
  inputs: RowInputs,
  rules: Rules,
  alpha: float | jax.Array,
  stop: Stop,
  bound: int,
  until: int | jax.Array,
  eos_id: int = EOS_ID,
  bos_id: int = BOS_ID,
  diversity: Diversity = PLAIN,
) -> BeamState:
  """Beam search steps in one `lax.while_loop`: until step == `bound` (the cache's length
  in positions) or at most `until` sentences are not done (`beam_done`). The unit that
  `beam_search` runs once and `run_in_stages` calls from the host."""

  def cond(state: BeamState) -> jax.Array:
    not_done = ~beam_done(state, inputs.limits, alpha, stop)
    return (state.step < bound) & (jnp.sum(not_done) > until)

  def body(state: BeamState) -> BeamState:
    done = beam_done(state, inputs.limits, alpha, stop)
    return beam_step(
      state, tokens_to_logits, reorder_cache, inputs, alpha, rules, done, eos_id, bos_id, diversity
    )

  return lax.while_loop(cond, body, materialized(state))


def beam_outputs(state: BeamState, alpha: float | jax.Array) -> tuple[jax.Array, jax.Array]:
  """(sequences, scores) as beam_search returns them, from a search state."""
  has_finished = state.finished_scores[:, 0] > NEG_INF
  live_scores = state.live_log_probs / length_penalty(state.step, alpha)
  sequences = jnp.where(has_finished[:, None, None], state.finished_seqs, state.live_seqs)
  scores = jnp.where(has_finished[:, None], state.finished_scores, live_scores)
  return jnp.where((scores > NEG_INF)[..., None], sequences, PAD_ID), scores
