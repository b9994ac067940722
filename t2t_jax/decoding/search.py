"""Beam search, greedy search and sampling over a `tokens_to_logits(ids, cache)` function.

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
  positions. Unstaged, a search is one `jax.lax.while_loop`, so it works under `jax.jit`
  with `tokens_to_logits` closed over; `staged=True` runs it from the host by
  `stages.run_in_stages`, as the Translator's search does.
- The settings are a `SearchConfig`'s (beam_size, alpha, beam_stop, diverse_groups,
  no_repeat_ngram, sampling_temperature, ...); alpha and the sampling fields may be jax
  scalars (traced under jit).

These functions are the assembly of decoding/assembly.py (`start`, `stage`) over a
`model_view.FunctionModel`, the same code the Translator's programs run.
"""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from t2t_jax.decoding import assembly, modes
from t2t_jax.decoding.assembly import Batch, Decoding, Knobs
from t2t_jax.decoding.beam_dims import map_nonscalar
from t2t_jax.decoding.config import PAPER_SEARCH, SearchConfig
from t2t_jax.decoding.model_view import FunctionModel, Reorder, TokensToLogits
from t2t_jax.decoding.stages import Stages, run_in_stages
from t2t_jax.tokens import BOS_ID, EOS_ID

Cache = Any
SAMPLING = SearchConfig(beam_size=1, sampling=True)  # sample_search's default: temperature 1


def _checked_limits(cache: Cache, max_lengths: ArrayLike, max_decode_len: int) -> jax.Array:
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
  return jnp.asarray(max_lengths, jnp.int32)


def _knobs(search: SearchConfig) -> Knobs:
  """The traced settings, where alpha or the sampling fields may already be jax scalars."""
  if not any(isinstance(v, jax.Array) for v in vars(search).values()):
    return Knobs.of(search)
  as_ = lambda x, dtype: jnp.asarray(x, dtype)
  return Knobs(
    alpha=as_(search.alpha, jnp.float32),
    sampling_temperature=as_(search.sampling_temperature, jnp.float32),
    sampling_topk=as_(search.sampling_topk, jnp.int32),
    sampling_topp=as_(search.sampling_topp, jnp.float32),
    sampling_seed=as_(search.sampling_seed, jnp.int32),
  )


def _search(
  mode: modes.Mode,
  model: FunctionModel,
  batch: Batch,
  search: SearchConfig,
  *,
  max_decode_len: int,
  constraint: Any,
  eos_only_at_limit: bool,
  staged: bool,
  eos_id: int,
  bos_id: int,
) -> tuple[jax.Array, jax.Array]:
  """`mode` under `search`'s rules: `assembly.start` and `assembly.stage` run once to the
  end, or from the host by `run_in_stages` (halving the batch down to one row as rows
  finish; each stage jitted). Returns the mode's outputs (sequences [rows, hypotheses, L],
  values [rows, hypotheses])."""
  batch = batch._replace(limits=_checked_limits(model.cache, batch.limits, max_decode_len))
  if constraint is not None and batch.inputs is None:
    raise ValueError("a constraint needs the sources its state starts from")
  decoding = Decoding.of(
    search, mode=mode, constraint=constraint, eos_only_at_limit=eos_only_at_limit
  )
  knobs = _knobs(search)
  rows = assembly.start(
    model, batch, knobs, max_decode_len=max_decode_len, first=max_decode_len, decoding=decoding
  )
  ids = dict(decoding=decoding, eos_id=eos_id, bos_id=bos_id)
  if not staged:
    return assembly.stage(model, rows, knobs, 0, bound=max_decode_len, **ids)[3]

  def run(rows: assembly.Rows, knobs: Knobs, until: jax.Array, bound: int) -> assembly.Stage:
    return assembly.stage(model, rows, knobs, until, bound=bound, **ids)

  run = jax.jit(run, static_argnums=3)
  take = jax.jit(lambda rows, keep: map_nonscalar(lambda x: x[keep], rows))
  stages = Stages(
    run=lambda rows, bound, until: run(rows, knobs, until, bound),
    take=lambda rows, keep, length: take(rows, keep),
    resize=None,
  )
  size = rows.inputs.limits.shape[0]
  return run_in_stages(stages, rows, size, [max_decode_len], min_rows=1)


def beam_search(
  tokens_to_logits: TokensToLogits,
  cache: Cache,
  *,
  max_lengths: ArrayLike,
  max_decode_len: int,
  search: SearchConfig = PAPER_SEARCH,
  reorder_cache: Reorder | None = None,
  prefix: jax.Array | None = None,
  constraint: Any = None,
  sources: jax.Array | None = None,
  nbest: int | None = None,
  eos_only_at_limit: bool = False,
  early_stop: bool = True,
  staged: bool = False,
  eos_id: int = EOS_ID,
  bos_id: int = BOS_ID,
) -> tuple[jax.Array, jax.Array]:
  """Beam search with the GNMT length penalty, as in tensor2tensor (paper: beam 4, alpha 0.6):
  `beam.beam_stage` over the whole batch, as one program (jit it whole), or with `staged`
  from the host by `run_in_stages` (not under jit), which drops finished sentences from the
  batch as it goes, as the Translator's search does.

  Each step extends the live hypotheses by one token. Each live hypothesis's EOS extension
  is offered to a finished set, which keeps the beam_size best by
  score = log p(sequence) / length_penalty(length incl. EOS, alpha). The beam_size most
  probable non-EOS extensions become the next live set; each carries its parent's history
  (its cache is reordered by parent). The search stops when no live hypothesis can still
  enter the finished set (`beam.beam_done`; exact, not a heuristic) or at max_decode_len.

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
    search: beam_size, alpha, beam_stop, diverse_groups, diversity_strength and
      no_repeat_ngram (`SearchConfig`).
    reorder_cache: (cache, parents int32 [batch, beam]) -> cache, called after every step:
      new hypothesis b of sentence i continues old hypothesis parents[i, b]. Hypotheses
      start identical (all with BOS; only hypothesis 0 is expanded at the first step).
    prefix, constraint (with `sources`, int32 [batch, src_len], that its state starts
      from), eos_only_at_limit: the decoding rules (`rulebook.rules_of`). prefix: int32
      [batch, P], each sentence's forced first tokens, PAD after them (an all-PAD row:
      unconstrained); a limit below len(prefix) + 1 is raised to it.
    nbest: how many of the best hypotheses must be exact when a sentence stops (`Stop`;
      None: all beam_size of them).
    early_stop: False runs every sentence to its limit (for tests; same results).
    eos_id, bos_id: end and start token ids.

  Returns:
    sequences int32 [batch, beam_size, max_decode_len] (no BOS, EOS then PAD) and scores
    float32 [batch, beam_size], best first. Empty slots (fewer than beam_size sequences of
    nonzero probability) have score -inf and all-PAD sequences. A sentence with no
    finished hypothesis at all (only possible if the model gives EOS probability 0)
    returns its live hypotheses, scored log p / lp(length).
  """
  return _search(
    modes.Beam.of(search, nbest, early_stop),
    FunctionModel(tokens_to_logits, cache, reorder_cache),
    Batch(inputs=sources, limits=max_lengths, prefix=prefix),
    search,
    max_decode_len=max_decode_len,
    constraint=constraint,
    eos_only_at_limit=eos_only_at_limit,
    staged=staged,
    eos_id=eos_id,
    bos_id=bos_id,
  )


def greedy_search(
  tokens_to_logits: TokensToLogits,
  cache: Cache,
  *,
  max_lengths: ArrayLike,
  max_decode_len: int,
  search: SearchConfig = PAPER_SEARCH,
  prefix: jax.Array | None = None,
  constraint: Any = None,
  sources: jax.Array | None = None,
  eos_only_at_limit: bool = False,
  staged: bool = False,
  eos_id: int = EOS_ID,
  bos_id: int = BOS_ID,
) -> tuple[jax.Array, jax.Array]:
  """Takes the most probable token the rules allow at every step until EOS (or the forced
  EOS at the limit), as one program.

  Args: as `beam_search`'s (of `search`, only no_repeat_ngram applies); `cache` leaves have
  leading dim batch.

  Returns:
    sequences int32 [batch, max_decode_len] (no BOS, EOS then PAD) and their log-probs
    float32 [batch]. Stops as soon as every sentence has ended.
  """
  found = _search(
    modes.Greedy(),
    FunctionModel(tokens_to_logits, cache),
    Batch(inputs=sources, limits=max_lengths, prefix=prefix),
    search,
    max_decode_len=max_decode_len,
    constraint=constraint,
    eos_only_at_limit=eos_only_at_limit,
    staged=staged,
    eos_id=eos_id,
    bos_id=bos_id,
  )
  return tuple(x[:, 0] for x in found)  # one hypothesis per row


def sample_search(
  tokens_to_logits: TokensToLogits,
  cache: Cache,
  *,
  max_lengths: ArrayLike,
  max_decode_len: int,
  keys: jax.Array,
  search: SearchConfig = SAMPLING,
  prefix: jax.Array | None = None,
  constraint: Any = None,
  sources: jax.Array | None = None,
  eos_only_at_limit: bool = False,
  staged: bool = False,
  eos_id: int = EOS_ID,
  bos_id: int = BOS_ID,
) -> tuple[jax.Array, jax.Array]:
  """Draws every output token (`rows.SamplePick`) until EOS, or the forced EOS at the limit
  (ancestral sampling), as one program.

  Args: as `greedy_search`, one row per sample (`cache` and `max_lengths` with leading dim
    rows); keys: uint32 key data [rows, 2] (`sampling.sample_keys`); of `search`,
    sampling_temperature, sampling_topk, sampling_topp (`sampling.sampling_log_probs`) and
    no_repeat_ngram apply.

  Returns:
    sequences int32 [rows, max_decode_len] (no BOS, EOS then PAD) and their log-probs
    float32 [rows] under the model itself (before temperature and truncation), so that
    they rank and compare with beam search's.
  """
  rows = np.shape(max_lengths)[0]
  if keys.shape != (rows, 2):
    raise ValueError(f"keys of shape {keys.shape}: need one key per row, ({rows}, 2)")
  found = _search(
    modes.Sample(num_samples=1, bos_id=bos_id),
    FunctionModel(tokens_to_logits, cache),
    Batch(inputs=sources, limits=max_lengths, prefix=prefix, keys=keys),
    search,
    max_decode_len=max_decode_len,
    constraint=constraint,
    eos_only_at_limit=eos_only_at_limit,
    staged=staged,
    eos_id=eos_id,
    bos_id=bos_id,
  )
  return tuple(x[:, 0] for x in found)  # one hypothesis per row
