"""t2t_jax's beam and greedy search: sentences/s and generated tokens/s.

Sources are real sentences (multi30k or newstest2014 from ../shared/data when present, else
synthetic), decoded by a trained workdir's model or by random parameters. A trained model
stops where it wants (limit: source + the search's max_output_extra); random parameters
would stop at once, so there EOS is suppressed until the source length.
"""

import dataclasses
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import app
from flax.typing import VariableDict

from t2t_jax.bench import ctranslate2, inputs
from t2t_jax.bench.train import model_config
from t2t_jax.decoding import SearchConfig, search_batch
from t2t_jax.decoding.translator import Translator
from t2t_jax.model import Transformer


def _random_model(
  config: ml_collections.ConfigDict, vocab_size: int
) -> tuple[VariableDict, Transformer]:
  """The experiment's model at `vocab_size` with initial (random) parameters."""
  model = Transformer(model_config(config, vocab_size))
  dummy = jnp.ones((1, 8), jnp.int32)
  return jax.jit(model.init)(jax.random.PRNGKey(0), dummy, dummy)["params"], model


def _workdir_sources(workdir: str, n: int, corpus: str) -> tuple[list[list[int]], str, Translator]:
  """(source id lists, their origin, the Translator) of real sentences through a workdir."""
  sentences, origin = inputs.real_sentences(n, corpus)
  if sentences is None:
    raise app.UsageError("--workdir given but no real sentences under ../shared/data")
  translator = Translator.from_workdir(workdir, "latest", None)
  return translator.source_ids(sentences), origin, translator


def decode_inputs(
  config: ml_collections.ConfigDict,
  vocab_size: int,
  n: int,
  workdir: str | None = None,
  corpus: str = "",
) -> tuple[list[list[int]], str, VariableDict, Transformer]:
  """(source id lists, description, params, model) for the decode figure."""
  if workdir:
    ids, origin, tr = _workdir_sources(workdir, n, corpus)
    return ids, f"{origin} through {workdir}'s model", tr.params, tr.model
  sentences, origin = inputs.real_sentences(n, corpus)
  rng = np.random.default_rng(0)
  if sentences is not None:
    # Random parameters and ids, with the lengths of real sentences (~1.3 subwords a word).
    lengths = [max(2, int(round(1.3 * len(s.split())))) + 1 for s in sentences]
    what = f"random ids with the lengths of {origin} (1.3 subwords per word)"
  else:
    lengths = [30] * n
    what = "synthetic: random ids, 30 tokens each"
  ids = [list(rng.integers(4, vocab_size, size=n - 1)) + [1] for n in lengths]
  params, model = _random_model(config, vocab_size)
  return ids, what + ", random parameters, outputs as long as sources", params, model


def _batch(ids: list[list[int]], max_len: int, extra: int) -> tuple[np.ndarray, np.ndarray, int]:
  """(inputs [n, longest source], limits [n], max_decode_len) of one padded batch; each
  output's limit is its source length + `extra`, capped at max_len."""
  src_len = min(max(len(s) for s in ids), max_len)
  padded = np.zeros((len(ids), src_len), np.int32)
  for r, s in enumerate(ids):
    padded[r, : min(len(s), src_len)] = s[:src_len]
  limits = np.minimum(np.array([len(s) + extra for s in ids], np.int32), max_len)
  return padded, limits, int(min(-(-limits.max() // 8) * 8, max_len))


def _timed_search(run: Any, sentences: int, beam_size: int) -> dict[str, Any]:
  """One compiling call of run(), then one timed call: the figures of one search."""
  t0 = time.perf_counter()
  run()
  first = time.perf_counter() - t0
  t0 = time.perf_counter()
  seqs = run()
  elapsed = time.perf_counter() - t0
  generated = int(np.sum(seqs != 0))  # tokens up to and including EOS
  return dict(
    beam_size=beam_size,
    sentences=sentences,
    seconds=elapsed,
    compile_s=first - elapsed,
    sentences_per_s=sentences / elapsed,
    target_tokens=generated,
    target_tokens_per_s=generated / elapsed,
    mean_output_tokens=generated / sentences,
  )


def measure_decode(
  config: ml_collections.ConfigDict,
  vocab_size: int,
  n: int,
  search: SearchConfig,
  workdir: str | None = None,
  corpus: str = "",
  sampling: bool = False,
) -> dict[str, Any]:
  """The decode figure of t2t-bench: `search` and greedy decoding of n sentences in one batch;
  with `sampling`, also sampling with `search`'s sampling fields (beam 1, num_samples per
  sentence)."""
  ids, what, params, model = decode_inputs(config, vocab_size, n, workdir, corpus)
  trained = workdir is not None
  extra = search.max_output_extra if trained else 0
  batch, limits, max_decode_len = _batch(ids, model.config.max_len, extra)
  out = {}
  search = dataclasses.replace(search, sampling=False)
  runs = [("beam", search), ("greedy", dataclasses.replace(search, beam_size=1))]
  if sampling:
    runs.append(("sampling", dataclasses.replace(search, beam_size=1, sampling=True)))
  for name, settings in runs:
    run = lambda settings=settings: np.asarray(
      search_batch(
        params,
        batch,
        limits,
        model=model,
        max_decode_len=max_decode_len,
        search=settings,
        eos_only_at_limit=not trained,
      )
    )
    out[name] = _timed_search(run, len(ids), settings.beam_size)
  out["inputs"] = what
  out["mean_source_tokens"] = float(np.mean([len(s) for s in ids]))
  return out


def measure_decode_vs(
  config: ml_collections.ConfigDict,
  vocab_size: int,
  search: SearchConfig,
  *,
  sentences: int,
  seq_len: int,
  repeats: int,
) -> dict[str, Any]:
  """Beam search against CTranslate2 on the same random parameters (ctranslate2.compare):
  `seq_len`-token sources, outputs forced to that length. A trained workdir on a text file
  is bench.real_text's."""
  trained = ctranslate2.random_trained(model_config(config, vocab_size))
  ids = ctranslate2.synthetic_sources(sentences, seq_len, vocab_size)
  result = ctranslate2.compare(
    trained,
    ids,
    [seq_len] * len(ids),
    beam_size=search.beam_size,
    alpha=search.alpha,
    forced=True,
    repeats=repeats,
    stop=search.beam_stop,
  )
  result["inputs"] = f"random parameters and ids, {seq_len} tokens"
  result["model"] = dict(
    d_model=trained.config.d_model,
    layers=[trained.config.encoder_layers, trained.config.decoder_layers],
    vocab_size=trained.config.vocab_size,
  )
  return result
