"""Beam, greedy search and sampling run in host-driven stages (`programs.decode_in_stages`,
`run_in_stages`), the 1-best stopping rule (`nbest=1`), frozen done sentences, and
constrained decoding (decoding/constraints.py) inside the searches.

Every comparison is against an independent reference: the reference beam search of
tests/test_decode.py, or a host loop over the model's full forward pass in float64 (argmax,
or numpy's inverse-CDF draw with the same uniform numbers).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t_jax.decoding import SearchConfig, constraints, model_view, modes, programs, search
from t2t_jax.decoding.beam import Stop, beam_done, init_beam_state, length_penalty
from t2t_jax.decoding.sampling import sample_keys
from t2t_jax.decoding.stages import Stages, StageStats, run_in_stages
from t2t_jax.model import Transformer, TransformerConfig
from t2t_jax.tokens import EOS_ID, PAD_ID
from tests import support

VOCAB = 24
OPEN, CLOSE, LEAF = (4, 5, 6), (7, 8, 9), (10,)
WORDS = range(11, VOCAB)


@functools.cache
def _model_and_params(seed: int = 3, eos_bias: float = 2.0):
  """A small random Transformer with peaked output distributions and a likelier EOS, so
  that outputs end at many lengths (flat random distributions end at once)."""
  cfg = TransformerConfig(
    vocab_size=VOCAB,
    d_model=32,
    d_ff=64,
    num_heads=4,
    num_layers=2,
    dropout_rate=0.0,
    max_len=64,
    share_embeddings=False,
  )
  model = Transformer(cfg)
  dummy = jnp.ones((1, 4), jnp.int32)
  params = support.jit_init(model, jax.random.PRNGKey(seed), dummy, dummy)
  out = params["decoder"]["logits"]
  out["kernel"] = out["kernel"] * 8.0
  out["bias"] = out["bias"].at[EOS_ID].set(eos_bias)
  # No PAD or BOS outputs: a PAD taken as a token would be a padded position to the
  # teacher-forced reference (`_reference_rows`) but an input token to the search.
  out["bias"] = out["bias"].at[PAD_ID].set(-30.0).at[2].set(-30.0)
  return model, params


def _batch(batch: int, src_len: int = 7, extra: int = 20, seed: int = 0):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(2, src_len + 1, size=batch)
  inputs = rng.integers(WORDS.start, VOCAB, size=(batch, src_len))
  inputs[np.arange(src_len) >= lengths[:, None]] = PAD_ID
  inputs[np.arange(batch), lengths - 1] = EOS_ID
  return jnp.asarray(inputs, jnp.int32), jnp.asarray(lengths + extra, jnp.int32)


def _staged(beam_size, stats=None, *, nbest=None, stop="exact", constraint=None, **kw):
  """The Translator's search of one batch (`programs.decode_in_stages`), alpha 0.6."""
  model, params = _model_and_params(**kw)
  settings = SearchConfig(beam_size=beam_size, alpha=0.6, beam_stop=stop)

  def run(inputs, limits, max_decode_len, settings=settings, prefix=None, ids=None):
    ids = jnp.arange(inputs.shape[0]) if ids is None else ids
    return programs.decode_in_stages(
      params,
      programs.Batch(inputs, limits, prefix, ids),
      programs.Knobs.of(settings),
      model=model,
      max_decode_len=max_decode_len,
      decoding=programs.Decoding.of(settings, nbest=nbest, constraint=constraint),
      stats=stats,
    )

  return run


def test_a_search_compiles_only_its_stage_programs():
  """The programs a search compiles are its stages and nothing beside them: the batch's
  arrays (int64 numpy here, as the Translator's batcher makes them), the knobs and the keep
  lists of each compaction go to the device as int32 without a conversion program per new
  shape (jnp.asarray(int64, jnp.int32) compiled one each). A conversion program compiles
  once per process, so this is the file's first test: run alone or first (as
  tools/mutation_check.py runs the file), it sees every program of its search compile."""
  import logging
  import re

  model, params = _model_and_params()
  rng = np.random.default_rng(11)
  rows, src_len = 13, 11  # shapes no other test here uses: their programs are compiled anew
  inputs = rng.integers(WORDS.start, VOCAB, size=(rows, src_len))
  inputs[:, -1] = EOS_ID
  limits = rng.integers(3, 30, size=rows)
  compiled: list[str] = []

  class Names(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
      found = re.search(r"Finished XLA compilation of (\S+)", record.getMessage())
      if found:
        compiled.append(found.group(1))

  handler, logger = Names(), logging.getLogger("jax")
  logger.addHandler(handler)
  try:
    with jax.log_compiles(True):
      programs.search_batch(
        params,
        inputs,
        limits,
        model=model,
        max_decode_len=32,
        search=SearchConfig(beam_size=2, alpha=0.6, sampling_topk=7),
        sentence_ids=np.arange(rows),
      )
  finally:
    logger.removeHandler(handler)
  # The stages by name, or (programs kept by compilation.stored) their exported form's call.
  stages = {"_stage_first", "_stage_run", "_stage_take", "_stage_resize"}
  stages.add("call_exported")
  names = {n.removeprefix("jit(").removesuffix(")") for n in compiled}
  # An exported program jax's cache answered is compiled once more under an unseen name.
  names = {re.sub(r"^call_exported_[0-9a-f]{16}$", "call_exported", n) for n in names}
  # Nothing heard is allowed: a process may load every stage as a stored executable.
  assert names <= stages, compiled


@functools.cache
def _forward(seed: int = 3, eos_bias: float = 2.0):
  """float64 next-token log-probabilities of every row, teacher-forced on the tokens so far:
  the model's full forward pass (no cache, no search code)."""
  model, params = _model_and_params(seed, eos_bias)
  apply = jax.jit(lambda inputs, targets: model.apply({"params": params}, inputs, targets))

  def log_probs(inputs, targets, step):
    logits = np.asarray(apply(inputs, jnp.asarray(targets)), np.float64)[:, step]
    shifted = logits - logits.max(-1, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), -1, keepdims=True))

  return log_probs


def _reference_rows(inputs, limits, length, choose, eos_bias=2.0, mask=None):
  """A host loop over the full forward pass: each row takes choose(log_probs [rows, vocab],
  step) (EOS at its limit) until EOS; returns (tokens [rows, length], log-probs [rows]).
  `mask`: (state, step) -> (allowed bool [rows, vocab], advance(tokens))."""
  inputs = np.asarray(inputs)
  rows = inputs.shape[0]
  # Positions not chosen yet hold a word, not PAD: the decoder's padding mask reads the
  # targets, and the causal mask keeps them from the logits of earlier positions.
  targets = np.full((rows, length), WORDS.start, np.int32)
  total, done = np.zeros(rows), np.zeros(rows, bool)
  forward = _forward(eos_bias=eos_bias)
  for step in range(length):
    if done.all():
      break
    log_probs = forward(inputs, targets, step)
    allowed = None if mask is None else mask(step)
    token = choose(
      np.where(allowed, log_probs, -np.inf) if allowed is not None else log_probs, step
    )
    token = np.where(step + 1 >= np.asarray(limits), EOS_ID, token)
    token = np.where(done, PAD_ID, token)
    total += np.where(done, 0.0, log_probs[np.arange(rows), token])
    targets[:, step] = token
    done |= token == EOS_ID
  targets[np.arange(length) > np.argmax(targets == EOS_ID, -1)[:, None]] = PAD_ID
  return targets, total


def _first_segment(monkeypatch, positions: int) -> None:
  """Every mode's first cache segment `positions` long (rows: twice that, as they are)."""
  monkeypatch.setattr(model_view, "FIRST_SEGMENT", positions)
  monkeypatch.setattr(modes.Beam, "first_segment", positions)
  for mode in (modes.Greedy, modes.Sample):
    monkeypatch.setattr(mode, "first_segment", 2 * positions)


@pytest.mark.parametrize("stop", ["exact", "heuristic"])
def test_staged_beam_search_equals_the_reference_search(stop, monkeypatch):
  """Compaction (batch 32 halving as sentences finish) and the cache grown 4, 8, 16, 32
  positions: the best outputs equal the reference beam search's (tests/test_decode.py: the
  cache copied per hypothesis and gathered whole, over the per-row decode_step); with the
  exact rule every hypothesis does."""
  from tests.test_decode import reference_search

  _first_segment(monkeypatch, 4)
  model, params = _model_and_params()
  inputs, limits = _batch(32)
  stats = StageStats()
  got = _staged(4, stats, stop=stop)(inputs, limits, 32)
  want_seqs, want_scores = reference_search(model, params, inputs, limits, 32, 4)
  hypotheses = 4 if stop == "exact" else 1
  np.testing.assert_array_equal(got[0][:, :hypotheses], want_seqs[:, :hypotheses])
  np.testing.assert_allclose(got[1][:, :hypotheses], want_scores[:, :hypotheses], rtol=1e-5)
  lengths = (np.asarray(want_seqs)[:, 0] != PAD_ID).sum(-1)
  assert len(set(lengths.tolist())) > 3, "outputs should end at many lengths"
  assert stats.compactions >= 2 and stats.resizes >= 2, stats
  # Every row is stepped until its output ended at least; compaction keeps the rest small.
  assert lengths.sum() <= stats.row_steps < 32 * lengths.max()


def test_staged_greedy_search_equals_the_forward_pass_greedy(monkeypatch):
  """Greedy in stages (batch 32 halving, cache grown 4 .. 32) against argmax over the full
  forward pass in float64: the same tokens, the log-probabilities to rounding."""
  _first_segment(monkeypatch, 4)
  inputs, limits = _batch(32)
  stats = StageStats()
  got = _staged(1, stats)(inputs, limits, 32)
  margin = np.full(32, np.inf)  # each row's smallest gap between its best two tokens

  def argmax(log_probs, step):
    top2 = np.sort(log_probs, -1)[:, -2:]
    margin[:] = np.minimum(margin, np.where(step + 1 < limits, top2[:, 1] - top2[:, 0], np.inf))
    return log_probs.argmax(-1)

  want, log_probs = _reference_rows(inputs, limits, 32, argmax)
  clear = margin > 1e-3  # float32 and float64 logits rank these rows alike
  assert clear.sum() >= 28, margin
  np.testing.assert_array_equal(got[0][clear, 0], want[clear])
  np.testing.assert_allclose(got[1][clear, 0], log_probs[clear], rtol=1e-4)
  assert stats.compactions >= 2 and stats.resizes >= 2, stats


@pytest.mark.parametrize("with_prefix", [False, True])
def test_staged_sampling_draws_as_the_forward_pass_reference(with_prefix, monkeypatch):
  """Sampling in stages (rows leave as their samples end, the cache grows 4 .. 32) against
  a host loop over the full forward pass that draws each token by inverting numpy's
  float64 cumulative distribution (`np_sampling_probs`: temperature 1.3, top-p 0.95, no PAD
  or BOS) with the uniform number of the row's key (fold_in(fold_in(PRNGKey(seed), id),
  sample), then the step): the same samples, log-probs, and the samples' order by score;
  with a prefix, rows start with it."""
  from tests.test_sampling import np_sampling_probs

  _first_segment(monkeypatch, 4)
  inputs, limits = _batch(16, seed=2)
  ids = jnp.arange(16, dtype=jnp.int32) * 3 + 5
  prefix = None
  if with_prefix:
    prefix = np.zeros((16, 2), np.int32)
    prefix[::3] = [WORDS.start, WORDS.start + 1]
    prefix = jnp.asarray(prefix)
  settings = SearchConfig(
    beam_size=1,
    sampling=True,
    num_samples=3,
    sampling_temperature=1.3,
    sampling_topp=0.95,
    sampling_seed=7,
    alpha=0.6,
  )
  stats = StageStats()
  got = _staged(1, stats, eos_bias=1.0)(inputs, limits, 32, settings, prefix, ids)
  keys = sample_keys(7, ids, 3)
  rows_prefix = None if prefix is None else np.repeat(np.asarray(prefix), 3, axis=0)

  def draw(log_probs, step):
    never = np.zeros(log_probs.shape[-1], bool)
    never[[PAD_ID, 2]] = True
    probs = np_sampling_probs(np.where(never, -np.inf, log_probs), 1.3, 0, 0.95)
    u = np.asarray(jax.vmap(lambda k: jax.random.uniform(jax.random.fold_in(k, step)))(keys))
    cumulative = np.cumsum(probs, -1)
    token = np.sum(cumulative <= (u * cumulative[:, -1])[:, None], -1)
    if rows_prefix is not None:
      inside = step < (rows_prefix != PAD_ID).sum(-1)
      token = np.where(inside, rows_prefix[:, min(step, 1)], token)
    return token

  want, log_probs = _reference_rows(
    np.repeat(np.asarray(inputs), 3, 0), np.repeat(np.asarray(limits), 3), 32, draw, 1.0
  )
  lengths = (want != PAD_ID).sum(-1)
  order = np.argsort(-(log_probs / ((5 + lengths) / 6) ** 0.6).reshape(16, 3), 1, kind="stable")
  want = np.take_along_axis(want.reshape(16, 3, 32), order[..., None], 1)
  log_probs = np.take_along_axis(log_probs.reshape(16, 3), order, 1)
  np.testing.assert_array_equal(got[0], want)
  np.testing.assert_allclose(got[1], log_probs, rtol=1e-4)
  assert len(set(lengths.tolist())) > 3, "samples should end at many lengths"
  assert stats.compactions >= 1 and stats.resizes >= 2, stats


def test_nbest_one_keeps_the_best_output():
  inputs, limits = _batch(32, seed=1)
  want = _staged(4)(inputs, limits, 32)
  got = _staged(4, nbest=1)(inputs, limits, 32)
  np.testing.assert_array_equal(got[0][:, 0], want[0][:, 0])
  np.testing.assert_array_equal(got[1][:, 0], want[1][:, 0])


@pytest.mark.parametrize("stop", ["exact", "heuristic"])
def test_nbest_counts_the_finished_hypotheses_that_must_be_beaten(stop):
  """A sentence whose best live hypothesis can no longer beat its best finished one is
  done for nbest=1 but not while it could still beat the second (nbest=2) or the empty
  slots (nbest=None); the bound divides by the larger of lp(step + 1) and, for the exact
  rule, lp(limit)."""
  limit, alpha, step = 20, 0.6, 5
  lp = length_penalty(limit if stop == "exact" else step + 1, alpha)
  live = -2.0
  bound = live / float(lp)
  state = init_beam_state({}, 1, 4, 32)._replace(
    step=jnp.int32(step),
    live_log_probs=jnp.array([[live, -3.0, -4.0, -5.0]]),
    finished_scores=jnp.array([[bound + 0.1, bound - 0.1, -jnp.inf, -jnp.inf]]),
  )
  done = lambda nbest: bool(beam_done(state, jnp.array([limit]), alpha, Stop(stop, nbest))[0])
  assert done(1) and not done(2) and not done(None)
  with pytest.raises(ValueError, match="nbest=5: must be between 1 and beam_size=4"):
    modes.Beam.of(SearchConfig(beam_size=4, beam_stop=stop), nbest=5)


def _two_kinds_model(ids, cache):
  """A per-row stand-in model over 8 tokens. Kind 0 rows: EOS likely at the first step, then
  token 5 nearly certain with EOS second, so a done sentence that kept stepping would keep
  finding new finished hypotheses. Kind 1 rows: EOS ruled out, they run to their limit."""
  step, kind = cache["step"], cache["kind"]
  first = jnp.array([0.0, 5.0, 0.0, 0.0, 0.0, 2.6, 2.5, 2.4])
  later = jnp.array([0.0, 5.0, 0.0, 0.0, 0.0, 10.0, 0.0, 0.0])
  short = jnp.where(step == 0, first, later)
  long = jnp.array([0.0, -30.0, 0.0, 0.0, 0.0, 1.0, 0.5, 0.0])
  logits = jnp.where((kind == 0)[:, None], short[None], long[None])
  return logits, dict(cache, step=step + 1)


@pytest.mark.parametrize("stop", ["exact", "heuristic"])
def test_an_output_does_not_depend_on_the_sentences_beside_it(stop):
  """A sentence done early (nbest=1: its best output is final) gives the same hypotheses
  alone as beside a sentence that runs to its limit: done sentences are frozen, so the
  steps run for the neighbour cannot add finished hypotheses to it (under the heuristic,
  or below the best one with nbest=1, they could)."""
  run = lambda kinds, limits: search.beam_search(
    _two_kinds_model,
    dict(step=jnp.int32(0), kind=jnp.array(kinds, jnp.int32)),
    max_lengths=jnp.array(limits, jnp.int32),
    max_decode_len=12,
    search=SearchConfig(beam_size=4, beam_stop=stop),
    nbest=1,
  )
  alone_seqs, alone_scores = run([0], [10])
  seqs, scores = run([0, 1], [10, 12])
  assert int((np.asarray(seqs[1, 0]) != PAD_ID).sum()) == 12  # the neighbour ran to its limit
  np.testing.assert_array_equal(seqs[0], alone_seqs[0])
  np.testing.assert_array_equal(scores[0], alone_scores[0])


def _well_formed(seq: np.ndarray, words: int) -> bool:
  """A python check: balanced and matching brackets, one root, every leaf inside a
  bracket, exactly `words` leaves, EOS right after the root closes."""
  stack, leaves, closed_root = [], 0, False
  for token in seq.tolist():
    if token == EOS_ID:
      return closed_root and leaves == words
    if closed_root:
      return False
    if token in OPEN:
      stack.append(OPEN.index(token))
    elif token in CLOSE:
      if not stack or stack.pop() != CLOSE.index(token):
        return False
      closed_root = not stack
    elif token in LEAF:
      if not stack:
        return False
      leaves += 1
    else:
      return False
  return False


@pytest.mark.parametrize("mode", ["greedy", "beam", "sample"])
def test_constrained_outputs_are_trees_over_the_source_words(mode):
  """Under TreeConstraint no output is malformed (greedy, beam and sampling, every
  hypothesis); staged greedy equals argmax over the full forward pass masked by the
  constraint step by step; without the constraint this model's outputs are mostly not
  trees (so the check can fail)."""
  tree = constraints.TreeConstraint(vocab_size=VOCAB, open_ids=OPEN, close_ids=CLOSE, leaf_ids=LEAF)
  inputs, limits = _batch(16, extra=12, seed=4)
  words = np.asarray((inputs != PAD_ID).sum(-1)) - 1  # EOS is not a word
  beam_size = 4 if mode == "beam" else 1
  settings = SearchConfig(beam_size=beam_size, alpha=0.6, sampling=mode == "sample")
  settings = settings.override(num_samples=3 if mode == "sample" else None)
  got = _staged(beam_size, constraint=tree)(inputs, limits, 32, settings)
  for row in range(16):
    for seq, score in zip(got[0][row], got[1][row]):
      if np.isfinite(score):
        assert _well_formed(seq, int(words[row])), (row, seq)
  if mode == "greedy":
    state = [tree.init(inputs, max_lengths=limits)]

    def allowed(step):
      return np.asarray(tree.allowed(state[0]))

    def choose(log_probs, step):
      token = log_probs.argmax(-1)
      state[0] = tree.advance(state[0], jnp.asarray(np.where(step + 1 >= limits, EOS_ID, token)))
      return token

    want, log_probs = _reference_rows(inputs, limits, 32, choose, mask=allowed)
    np.testing.assert_array_equal(got[0][:, 0], want)
    np.testing.assert_allclose(got[1][:, 0], log_probs, rtol=1e-4)
  free = _staged(beam_size)(inputs, limits, 32, settings)[0][:, 0]
  assert sum(_well_formed(s, int(w)) for s, w in zip(free, words)) < 8


def test_search_refuses_a_constraint_without_its_sources():
  tree = constraints.TreeConstraint(vocab_size=VOCAB, open_ids=OPEN, close_ids=CLOSE, leaf_ids=LEAF)
  with pytest.raises(ValueError, match="needs the sources"):
    search.greedy_search(
      lambda ids, cache: (jnp.zeros((1, VOCAB)), cache),
      {},
      max_lengths=[4],
      max_decode_len=4,
      constraint=tree,
    )


@pytest.mark.parametrize("compacted_bound,resizes", [(0, 2), (16, 1)])
def test_run_in_stages_halves_and_grows_on_a_counting_search(compacted_bound, resizes):
  """The driver alone, on a stand-in search whose row r is done after r + 1 steps: each
  row's result is taken when it was done, batches shrink to powers of two, the cache
  grows through every bound, and row-steps are counted. With compacted_bound=16 the
  compaction at step 8 (cache 8) grows the cache to 16 in its take, not by a resize."""
  batch, bounds = 16, [4, 8, 16]

  outputs = lambda rows: (rows["left"] * 10,)

  def run(rows, bound, until):
    step, cache, left = rows["step"], rows["cache"], rows["left"]
    while step < bound and np.sum(left > step) > until:
      step += 1
    assert cache.shape[0] == bound, "the cache has the current bound's length"
    rows = dict(rows, step=step)
    return rows, step, left <= step, outputs(rows)

  rows = dict(step=0, cache=np.zeros(bounds[0]), left=np.arange(1, batch + 1))
  stages = Stages(
    run=run,
    take=lambda rows, keep, length: dict(
      rows,
      left=rows["left"][np.asarray(keep)],
      cache=rows["cache"] if length is None else np.zeros(length),
    ),
    resize=lambda rows, n: dict(rows, cache=np.zeros(n)),
  )
  stats = StageStats()
  (out,) = run_in_stages(stages, rows, batch, bounds, stats=stats, compacted_bound=compacted_bound)
  np.testing.assert_array_equal(out, np.arange(1, batch + 1) * 10)
  assert stats.resizes == resizes and stats.compactions >= 3
  # 16 rows to step 8 (half done), 8 to step 12, 4 to 14, 2 to 15, 1 to 16.
  assert stats.row_steps == 16 * 8 + 8 * 4 + 4 * 2 + 2 * 1 + 1 * 1
