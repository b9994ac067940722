"""Compacted batches attend over one source length (`memory_len`), so that the batches of
a translate() call share their stage programs after the first compaction: the padded
encoder keys/values change no output (against the unpadded cache and search), and a
second batch of another source length compiles only its full-size programs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t_jax.decoding import SearchConfig, batching, programs
from t2t_jax.decoding.translator import Translator
from t2t_jax.model import Transformer, TransformerConfig, pad_memory
from t2t_jax.tokens import EOS_ID, PAD_ID
from tests import support
from tests.test_staged_search import VOCAB, WORDS, _model_and_params


def _padded_inputs(rows: int, src_len: int, width: int, seed: int = 5) -> np.ndarray:
  """int32 [rows, width]: sources of at most src_len tokens (EOS last), PAD after them."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(2, src_len + 1, size=rows)
  inputs = rng.integers(WORDS.start, VOCAB, size=(rows, width))
  inputs[np.arange(width) >= lengths[:, None]] = PAD_ID
  inputs[np.arange(rows), lengths - 1] = EOS_ID
  return inputs.astype(np.int32)


def test_pad_memory_leaves_the_decoder_outputs_unchanged():
  """Three decoder steps on a cache padded from 6 to 13 source positions give the logits
  of the unpadded cache; the padded entries are zeros and masked."""
  cfg = TransformerConfig(
    vocab_size=20, d_model=16, d_ff=32, num_heads=2, num_layers=2, dropout_rate=0.0, max_len=16
  )
  model = Transformer(cfg)
  inputs = jnp.asarray(_padded_inputs(3, 6, 6)) % 20
  params = support.jit_init(model, jax.random.PRNGKey(1), inputs, inputs)
  encoded = model.apply({"params": params}, inputs, method=Transformer.encode)
  _, state = model.apply(
    {"params": params}, encoded, inputs, 8, method=Transformer.init_cache, mutable=["cache"]
  )
  caches = [state["cache"], pad_memory(state["cache"], 13)]
  assert caches[1]["decoder"]["cross_mask"].shape == (3, 1, 1, 13)
  assert not caches[1]["decoder"]["cross_mask"][..., 6:].any()
  key = caches[1]["decoder"]["layer_1"]["cross_attention"]["cross_key"]
  assert key.shape[-1] == 13 and not key[..., 6:].any()
  ids = jnp.asarray([[3], [7], [11]], jnp.int32)
  for _ in range(3):
    logits = []
    for i, cache in enumerate(caches):
      out, new = model.apply(
        {"params": params, "cache": cache}, ids, method=Transformer.decode_step, mutable=["cache"]
      )
      caches[i] = new["cache"]
      logits.append(out)
    np.testing.assert_allclose(logits[1], logits[0], rtol=1e-5, atol=1e-5)
    ids = jnp.argmax(logits[0], axis=-1)[:, None].astype(jnp.int32)
  with pytest.raises(ValueError, match="cannot pad a memory of 6 positions to 4"):
    pad_memory(state["cache"], 4)


@pytest.mark.parametrize("beam_size", [1, 3])
def test_a_padded_memory_changes_no_output(beam_size):
  """Beam search and greedy search of a batch that compacts (20 rows, down to 8): the
  outputs with compacted batches attending over 16 source positions are those of the
  batch's own 9 (sequences equal, scores to float32 rounding)."""
  model, params = _model_and_params()
  inputs = _padded_inputs(20, 9, 9, seed=beam_size)
  limits = np.random.default_rng(2).integers(4, 30, size=20)
  settings = SearchConfig(beam_size=beam_size, alpha=0.6)
  kw = dict(model=model, max_decode_len=32, search=settings, nbest=True)
  stats = [programs.StageStats(), programs.StageStats()]
  plain = programs.search_batch(params, inputs, limits, stats=stats[0], **kw)
  padded = programs.search_batch(params, inputs, limits, stats=stats[1], memory_len=16, **kw)
  assert stats[1].compactions == stats[0].compactions > 0
  np.testing.assert_array_equal(padded[0], plain[0])
  np.testing.assert_allclose(padded[1], plain[1], rtol=1e-5)


class _Runs:
  """Records each stage run's (rows, source positions of its memory, cache bound): with
  the model, decoding and weak types alike, the key of its program."""

  def __init__(self, monkeypatch):
    self.keys: list[tuple[int, int, int]] = []
    real = programs._stage_run

    def recording(params, rows, knobs, until, **kw):
      leaves = jax.tree_util.tree_leaves_with_path(rows)
      memory = next(x for p, x in leaves if "cross_key" in jax.tree_util.keystr(p))
      self.keys.append((memory.shape[0], memory.shape[-1], kw["bound"]))
      return real(params, rows, knobs, until, **kw)

    monkeypatch.setattr(programs, "_stage_run", recording)


def test_batches_of_two_source_lengths_share_their_compacted_programs(monkeypatch):
  """The same 24 sentences padded to 10 and to 14 source positions (so that they finish
  alike), both with memory_len 14: the second batch's compacted stages run at the first's
  shapes (its programs), its full-size stages at its own source length."""
  model, params = _model_and_params()
  inputs = _padded_inputs(24, 10, 10, seed=9)
  limits = np.random.default_rng(4).integers(4, 40, size=24)
  settings = SearchConfig(beam_size=2, alpha=0.6)
  runs = _Runs(monkeypatch)
  outputs, keys = [], []
  for width in (10, 14):
    before = len(runs.keys)
    wide = np.pad(inputs, ((0, 0), (0, width - 10)))
    outputs.append(
      programs.search_batch(
        params, wide, limits, model=model, max_decode_len=40, search=settings, memory_len=14
      )
    )
    keys.append(set(runs.keys[before:]))
  np.testing.assert_array_equal(outputs[1], outputs[0])
  compacted = [{k for k in batch_keys if k[0] < 24} for batch_keys in keys]
  assert compacted[0] and {k[1] for k in compacted[0]} == {14}  # the common memory
  assert compacted[1] == compacted[0]  # the same programs
  assert {k[1] for k in keys[1] - compacted[1]} == {14} and {
    k[1] for k in keys[0] - compacted[0]
  } == {10}


def test_translate_gives_compacted_batches_the_calls_longest_bucket(monkeypatch):
  """translate() of sentences in several buckets passes the longest one's bucket to every
  batch's search; translate_stream's one-sentence batches never compact and pass none."""
  model, params = support.small_model(seed=3, max_len=40)

  class Ids:
    def encode(self, text):
      return [int(t) for t in text.split()]

    def decode(self, ids):
      return " ".join(str(int(i)) for i in ids if i > 2)

  translator = Translator(model, params, Ids(), SearchConfig(max_output_extra=4), batch_tokens=64)
  seen = []
  real = programs.search_batch

  def recording(params, inputs, limits, **kw):
    seen.append((np.shape(inputs)[1], kw.get("memory_len")))
    return real(params, inputs, limits, **kw)

  monkeypatch.setattr("t2t_jax.decoding.translator.search_batch", recording)
  lines = [" ".join(["5"] * n) for n in (3, 3, 3, 20, 3, 12)]
  translator.translate(lines, search=translator.search.override(beam_size=2))
  longest = batching.source_bucket(40, 21)  # 20 tokens and EOS
  assert len({width for width, _ in seen}) > 1
  assert {memory for _, memory in seen} == {longest}
  seen.clear()
  list(translator.translate_stream(lines[:2], search=translator.search.override(beam_size=2)))
  assert {memory for _, memory in seen} == {None}


def test_row_searches_start_with_a_longer_cache_than_beam_search():
  """Greedy search attends over one cache slot per position: its first cache segment is
  twice beam search's (32 positions, not 16), so outputs of 17-30 tokens never grow it;
  beam search, beam_size slots per position, grows its cache at 16."""
  model, params = _model_and_params(eos_bias=-30.0)  # no EOS: outputs run to their limits
  inputs = _padded_inputs(4, 6, 6, seed=1)
  limits = np.full(4, 30)
  resizes = {}
  for beam_size in (1, 2):
    stats = programs.StageStats()
    programs.search_batch(
      params,
      inputs,
      limits,
      model=model,
      max_decode_len=64,
      search=SearchConfig(beam_size=beam_size, alpha=0.6),
      stats=stats,
    )
    resizes[beam_size] = stats.resizes
  assert resizes == {1: 0, 2: 1}
