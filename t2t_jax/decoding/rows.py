"""Row searches, greedy and sampling: one row per output (a sentence, or one sample of it),
each row taking one token per step (`Pick`) until EOS or its limit; and the per-row inputs
every search carries (`RowInputs`, `prefix_limits`)."""

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp
from jax import lax

from t2t_jax.decoding import rules as rules_lib
from t2t_jax.decoding.beam_dims import last_tokens, materialized
from t2t_jax.decoding.kernels import NEG_INF, argmax, log_probs_of, row_max
from t2t_jax.decoding.rules import Rules
from t2t_jax.decoding.sampling import draw_tokens, sampling_log_probs
from t2t_jax.tokens import BOS_ID, EOS_ID, PAD_ID

Cache = Any
PyTree = Any
TokensToLogits = Callable[[jax.Array, Cache], tuple[jax.Array, Cache]]


class RowInputs(NamedTuple):
  """Each row's inputs to a search, leading dim rows (beam search: sentences)."""

  limits: jax.Array  # int32 [rows]: output tokens allowed, EOS included (`prefix_limits`)
  prefix: jax.Array | None = None  # int32 [rows, P]: forced first tokens, PAD after them
  keys: jax.Array | None = None  # sampling: uint32 [rows, 2], each row's key (sample_keys)


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


class RowState(NamedTuple):
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
) -> RowState:
  """A row search's state before the first step (`cache` and `rule_state` per row)."""
  return RowState(
    step=jnp.array(0, jnp.int32),
    seqs=jnp.full((rows, max_decode_len), PAD_ID, jnp.int32),
    log_probs=jnp.zeros((rows,), jnp.float32),
    finished=jnp.zeros((rows,), bool),
    cache=cache,
    rules=rule_state,
  )


def row_stage(
  state: RowState,
  *,
  tokens_to_logits: TokensToLogits,
  inputs: RowInputs,
  rules: Rules,
  pick: Pick,
  bound: int,
  until: int | jax.Array,
  eos_id: int = EOS_ID,
  bos_id: int = BOS_ID,
) -> RowState:
  """Greedy or sampling steps (`pick`) in one `lax.while_loop`, until step == `bound` (the
  cache's length in positions) or at most `until` rows have not ended: the unit that
  `greedy_search` and `sample_search` run once and `run_in_stages` calls from the host. The
  rules restrict each pick (a row at its limit takes EOS); a row that has ended takes PAD.
  The log-probability added is the model's, normalised over the whole vocabulary."""

  def cond(state: RowState) -> jax.Array:
    return (state.step < bound) & (jnp.sum(~state.finished) > until)

  def body(state: RowState) -> RowState:
    ids = last_tokens(state.seqs, state.step, bos_id)
    logits, cache = tokens_to_logits(ids.reshape(-1, 1), state.cache)
    logits = logits.astype(jnp.float32)
    vocab = logits.shape[-1]
    view = rules_lib.View(state.step, state.seqs, inputs.limits, inputs.prefix, vocab)
    choice = rules.choice(view, state.rules)
    token, log_probs = pick(logits, rules_lib.token_mask(choice, vocab, eos_id), state.step, inputs)
    token = rules_lib.end_where_stopped(choice, token, eos_id)
    if log_probs is None:
      top = row_max(logits)
      log_normalizer = jnp.log(jnp.sum(jnp.exp(logits - top[:, None]), axis=-1))
      chosen = jnp.take_along_axis(logits, token[:, None], axis=-1)
      token_log_prob = log_probs_of(chosen, top, log_normalizer)[:, 0]
    else:
      token_log_prob = jnp.take_along_axis(log_probs, token[:, None], axis=-1)[:, 0]
    token = jnp.where(state.finished, PAD_ID, token)
    seqs = lax.dynamic_update_slice_in_dim(state.seqs, token[:, None], state.step, axis=1)
    return RowState(
      step=state.step + 1,
      seqs=seqs,
      log_probs=state.log_probs + jnp.where(state.finished, 0.0, token_log_prob),
      finished=state.finished | (token == eos_id),
      cache=cache,
      rules=rules.advance(state.rules, token),
    )

  return lax.while_loop(cond, body, materialized(state))
