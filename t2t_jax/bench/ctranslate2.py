"""Beam search side by side with CTranslate2 on the very same parameters (`t2t-bench --vs`).

    t2t-bench --experiment=tiny --config.model.d_model=128 --config.model.d_ff=512 \
        --vocab_size=8000 --parts=decode --vs=ctranslate2 --decode_sentences=128 --seq_len=30

(A trained --workdir on a text file, in t2t-translate's batches: bench.real_text.)

The parameters t2t_jax times are exported with `t2t_jax.export.to_ctranslate2` into a
temporary directory and loaded by CTranslate2 with compute type float32 and int8, with as
many threads as XLA uses (the cores this process may run on). Every system decodes the same
source ids in one batch with the same beam and alpha:

- random parameters: sources of --seq_len tokens (EOS included) and outputs forced to
  --seq_len tokens (t2t_jax suppresses EOS until its limit, CTranslate2 gets
  min_decoding_length = max_decoding_length), so every system runs the same number of
  decoder steps over the same shapes;
- trained parameters (compare(forced=False)): each output ends where the model puts EOS
  (limits as given for t2t_jax; CTranslate2 takes one limit for the batch, the longest).

Repetitions are interleaved (t2t_jax, CTranslate2 float32, CTranslate2 int8, t2t_jax, ...)
so that machine noise hits all of them; the table gives medians and the ratio of each
system's tokens/s to t2t_jax's. CTranslate2 normalises scores by length^alpha, t2t_jax by
GNMT ((5 + length) / 6)^alpha (docs/export.md): outputs of trained models can differ where
two hypotheses are close.
"""

import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from t2t_jax.bench.timing import cpu_threads
from t2t_jax.decoding import SearchConfig, search_batch
from t2t_jax.export import RESERVED_TOKENS, Trained
from t2t_jax.model import Transformer, TransformerConfig
from t2t_jax.tokens import EOS_ID, NUM_RESERVED

COMPUTE_TYPES = ("float32", "int8")


def synthetic_vocabulary(vocab_size: int) -> list[str]:
  """Token strings for random-parameter models: the reserved tokens, then w4, w5, ..."""
  reserved = [RESERVED_TOKENS[i] for i in range(NUM_RESERVED)]
  return reserved + [f"w{i}" for i in range(NUM_RESERVED, vocab_size)]


def random_trained(model_config: TransformerConfig) -> Trained:
  """A `Trained` with random (initialised) parameters and a synthetic vocabulary."""
  model = Transformer(model_config)
  dummy = jnp.ones((1, 8), jnp.int32)
  params = jax.jit(model.init)(jax.random.PRNGKey(0), dummy, dummy)["params"]
  params = jax.tree.map(lambda x: np.asarray(x, np.float32), params)
  return Trained(
    config=model_config,
    params=params,
    tokenizer=None,
    vocabulary=synthetic_vocabulary(model_config.vocab_size),
    vocab_file="",
    checkpoint_steps=[],
  )


def synthetic_sources(n: int, length: int, vocab_size: int, seed: int = 0) -> list[list[int]]:
  """n random id sequences of `length` tokens, the last one EOS."""
  rng = np.random.default_rng(seed)
  return [
    [int(t) for t in rng.integers(NUM_RESERVED, vocab_size, length - 1)] + [EOS_ID]
    for _ in range(n)
  ]


def _padded(ids: Sequence[Sequence[int]]) -> np.ndarray:
  out = np.zeros((len(ids), max(map(len, ids))), np.int32)
  for row, seq in enumerate(ids):
    out[row, : len(seq)] = seq
  return out


def t2t_system(
  trained: Trained,
  ids: Sequence[Sequence[int]],
  limits: Sequence[int],
  search: SearchConfig,
  forced: bool,
) -> tuple[Callable[[], list[list[int]]], float]:
  """(run, compile seconds): run() decodes every sentence once with `search` (its beam size,
  alpha and stopping rule) and returns int id lists."""
  model = Transformer(trained.config)
  params = jax.device_put(trained.params)
  inputs, limits = jnp.asarray(_padded(ids)), np.asarray(limits, np.int32)
  max_decode_len = int(min(-(-limits.max() // 8) * 8, trained.config.max_len))

  def run() -> list[list[int]]:
    seqs = search_batch(
      params,
      inputs,
      limits,
      model=model,
      max_decode_len=max_decode_len,
      search=search,
      eos_only_at_limit=forced,
    )
    return [[int(t) for t in row if t != 0] for row in np.asarray(seqs)]

  start = time.perf_counter()
  run()
  return run, time.perf_counter() - start


def ctranslate2_system(
  path: str,
  trained: Trained,
  ids: Sequence[Sequence[int]],
  limits: Sequence[int],
  beam_size: int,
  alpha: float,
  forced: bool,
  compute_type: str,
  threads: int,
) -> tuple[Callable[[], list[list[int]]], float]:
  """(run, load seconds) for a CTranslate2 model directory: run() returns id lists, EOS
  included where the search ended with it."""
  import ctranslate2

  start = time.perf_counter()
  translator = ctranslate2.Translator(
    path, device="cpu", compute_type=compute_type, inter_threads=1, intra_threads=threads
  )
  index = {token: i for i, token in enumerate(trained.vocabulary)}
  # CTranslate2 appends EOS itself (the export sets add_source_eos).
  tokens = [[trained.vocabulary[t] for t in seq if t != EOS_ID] for seq in ids]
  longest = int(max(limits))
  options = dict(
    beam_size=beam_size,
    length_penalty=alpha,
    max_batch_size=len(tokens),
    max_decoding_length=longest,
    return_end_token=True,
  )
  if forced:
    options["min_decoding_length"] = longest

  def run() -> list[list[int]]:
    results = translator.translate_batch(tokens, **options)
    return [[index[t] for t in r.hypotheses[0]] for r in results]

  run()  # allocations, int8 packing
  return run, time.perf_counter() - start


def export_for_ctranslate2(trained: Trained, directory: str) -> str:
  """The float32 CTranslate2 model of `trained` under `directory` (int8 converts at load)."""
  from t2t_jax.export import to_ctranslate2

  spec = to_ctranslate2.build_spec(trained)
  spec.validate()
  spec.optimize(quantization="float32")
  path = os.path.join(directory, "ctranslate2")
  os.makedirs(path)
  spec.save(path)
  return path


def _comparable(seq: Sequence[int], limit: int, forced: bool) -> list[int]:
  """An output without EOS; with forced lengths, its first limit - 1 tokens (t2t_jax ends
  with the forced EOS where CTranslate2, stopped by its maximum, ends with one more token)."""
  seq = [t for t in seq if t != EOS_ID]
  return seq[: limit - 1] if forced else seq


def interleaved(systems: dict[str, Callable], repeats: int) -> tuple[dict, dict]:
  """Runs every system once per repetition, in turn; (seconds lists, last outputs)."""
  times = {name: [] for name in systems}
  outputs = {}
  for _ in range(repeats):
    for name, run in systems.items():
      start = time.perf_counter()
      outputs[name] = run()
      times[name].append(time.perf_counter() - start)
  return times, outputs


def compare(
  trained: Trained,
  ids: Sequence[Sequence[int]],
  limits: Sequence[int],
  *,
  beam_size: int,
  alpha: float,
  forced: bool,
  repeats: int,
  threads: int | None = None,
  compute_types: Sequence[str] = COMPUTE_TYPES,
  stop: str = SearchConfig.beam_stop,
) -> dict:
  """Times t2t_jax's beam search and CTranslate2's on the same parameters and sources.

  ids: source id lists (EOS last); limits: each output's length limit, EOS included;
  stop: t2t_jax's stopping rule (`beam.Stop`).
  Returns a dict per system (tokens/s, sentences/s, per-repetition seconds, ratio to
  t2t_jax, outputs equal to t2t_jax's) plus the set-up.
  """
  threads = threads or cpu_threads()
  search = SearchConfig(beam_size=beam_size, alpha=alpha, beam_stop=stop)
  t2t_run, compile_s = t2t_system(trained, ids, limits, search, forced)
  systems = {"t2t_jax": t2t_run}
  setup = {"t2t_jax": compile_s}
  with tempfile.TemporaryDirectory() as tmp:
    path = export_for_ctranslate2(trained, tmp)
    for compute_type in compute_types:
      name = f"ctranslate2 {compute_type}"
      systems[name], setup[name] = ctranslate2_system(
        path, trained, ids, limits, beam_size, alpha, forced, compute_type, threads
      )
    times, outputs = interleaved(systems, repeats)
  same = lambda out: [_comparable(seq, limit, forced) for seq, limit in zip(out, limits)]
  reference = same(outputs["t2t_jax"])
  rows = {}
  for name, seconds in times.items():
    median = statistics.median(seconds)
    tokens = sum(map(len, outputs[name]))
    rows[name] = dict(
      seconds=seconds,
      median_s=median,
      setup_s=setup[name],
      output_tokens=tokens,
      target_tokens_per_s=tokens / median,
      sentences_per_s=len(ids) / median,
      same_as_t2t_jax=sum(a == b for a, b in zip(same(outputs[name]), reference)),
    )
  base = rows["t2t_jax"]["target_tokens_per_s"]
  for row in rows.values():
    row["t2t_jax_speedup"] = base / row["target_tokens_per_s"]
  return dict(
    systems=rows,
    sentences=len(ids),
    beam_size=beam_size,
    alpha=alpha,
    forced_lengths=forced,
    beam_stop=stop,
    threads=threads,
    repeats=repeats,
    mean_source_tokens=float(np.mean([len(s) for s in ids])),
  )


def table(result: dict) -> str:
  """The comparison as lines of text (medians; ratio = t2t_jax tokens/s over the system's)."""
  lines = [
    f"decode vs CTranslate2: {result['sentences']} sentences, beam {result['beam_size']}, "
    f"alpha {result['alpha']}, t2t_jax stop rule {result['beam_stop']}, "
    f"{result['threads']} thread(s), "
    f"{'outputs forced to the source length' if result['forced_lengths'] else 'outputs end at EOS'}"
    f", medians of {result['repeats']} interleaved repetitions",
    "| system | target tokens/s | sentences/s | t2t_jax speed-up | same output as t2t_jax |",
    "|---|---:|---:|---:|---:|",
  ]
  for name, row in result["systems"].items():
    lines.append(
      f"| {name} | {row['target_tokens_per_s']:,.0f} | {row['sentences_per_s']:.1f} | "
      f"{row['t2t_jax_speedup']:.2f}x | {row['same_as_t2t_jax']}/{result['sentences']} |"
    )
  return "\n".join(lines)
