"""The served model: the one module of the server that calls t2t_jax's decoding.

`Model` loads a workdir (or an ensemble) through the public Translator, compiles the search
before the server says it is ready, and answers in plain Python values (strings, floats,
nested lists) so that the HTTP side never touches arrays. Every call runs in the batching
thread (serve.batching), one at a time.
"""

import dataclasses
import sys
import time
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from t2t_jax.data import config as data_config
from t2t_jax.decoding import batching
from t2t_jax.decoding.batch_threads import default_batch_threads
from t2t_jax.serve.api import Pair
from t2t_jax.translate import TranslateError, Translator, load_config

__all__ = ["WARM_UPS", "Hypothesis", "Model", "ModelError", "WarmUp"]

WARM_UPS = ("plain", "all")
BATCH_ROWS = (1, 8)  # the default row counts of a decoding batch (`batching.Shapes.rows`)

# The model's errors (an unreadable workdir, a checkpoint that does not fit) as the server
# reports them at start.
ModelError = TranslateError


@dataclasses.dataclass(frozen=True)
class Hypothesis:
  """One entry of an n-best list: score is log p / lp, beam search's ranking number."""

  text: str
  score: float
  log_prob: float


@dataclasses.dataclass(frozen=True)
class ModelSettings:
  """What t2t-serve's flags choose about the model (None: the workdir's config)."""

  workdirs: tuple[str, ...]
  pair: Pair | None = None  # None: the first workdir's config.data languages
  checkpoint: str = "auto"
  beam_size: int | None = None
  alpha: float | None = None
  batch_tokens: int = 4096
  # The row counts every decoding batch is padded to; the largest bounds a batch.
  batch_rows: tuple[int, ...] = BATCH_ROWS
  # Batches decoded at once, each from a batching thread (0: default_batch_threads(), 2 on
  # a CPU, where one batch's small compacted stages leave the second core idle).
  batch_threads: int = 0
  alternatives_limit: int = 3  # n-best alternatives a request may ask for (-1: beam - 1)
  warm_up: str = "plain"  # WARM_UPS: what load() compiles before the server is ready
  dtype: str = "auto"  # the products' dtype (decoding.precision.decode_dtype)


@dataclasses.dataclass(frozen=True)
class WarmUp:
  """What `Model.load` compiled: batch shapes (times n-best sizes), the calls of their
  programs (`Translator.warm_up_batches`), seconds."""

  shapes: int
  programs: int
  seconds: float

  def __str__(self) -> str:
    return f"{self.shapes} batch shapes, {self.programs} program calls in {self.seconds:.1f} s"


class Model:
  """A Translator behind the server: `load()` once, then translate/attention."""

  def __init__(self, settings: ModelSettings) -> None:
    self.settings = settings
    self._translator: Any = None
    self.warm_up: WarmUp | None = None
    self.param_bytes = 0  # the parameters and their decoding copies, once loaded
    self.batch_threads = settings.batch_threads or default_batch_threads()
    config = load_config(settings.workdirs[0])
    self.pair = settings.pair or Pair(
      source=config.data.source_lang or "en", target=data_config.target_language(config.data)
    )

  def load(self) -> None:
    """Reads the checkpoint(s) and compiles, before the server says it is ready, every
    program a batch can run: batches are padded to `shapes` (rows to one of batch_rows,
    sources to a power of two up to max_len), and each of those shapes is compiled for
    plain translations (warm_up 'plain') or also for each n-best size alternatives can ask
    for ('all'; `Translator.warm_up_batches`), so that after /ready a request compiles
    nothing (only an n-best size after 'plain'). The process-wide compilation cache is
    the command's choice: none is switched on here."""
    s = self.settings
    if s.warm_up not in WARM_UPS:
      raise ValueError(f"warm_up={s.warm_up!r} must be one of {WARM_UPS}")
    translator = Translator.from_workdirs(
      list(s.workdirs), s.checkpoint, s.dtype, batch_tokens=s.batch_tokens
    )
    translator.shapes = shapes(s.batch_rows, translator.model.config.max_len)
    # the server's beam_size and alpha into the one search every request decodes with
    translator.search = translator.search.override(beam_size=s.beam_size, alpha=s.alpha)
    start = time.perf_counter()
    nbests = self.nbest_sizes(translator.search.beam_size) if s.warm_up == "all" else [None]
    print(
      f"t2t-serve: compiling the search for every batch shape ({', '.join(map(str, s.batch_rows))}"
      f" rows; n-best sizes {', '.join(str(n or 1) for n in nbests)})",
      file=sys.stderr,
      flush=True,
    )
    found, programs = translator.warm_up_batches(nbests=nbests)
    self.warm_up = WarmUp(found, programs, time.perf_counter() - start)
    self.param_bytes = _bytes((translator.params, translator.decoder()[0]))
    self._translator = translator

  def nbest_sizes(self, beam_size: int) -> list[int | None]:
    """The n-best sizes `translate` can be asked for (None: plain): alternatives + 1, the
    page's and the API's, up to the alternatives limit (never more than beam_size - 1)."""
    limit = self.settings.alternatives_limit
    cap = beam_size - 1 if limit == -1 else min(limit, beam_size - 1)
    return [None, *range(1, cap + 2)]

  @property
  def max_tokens(self) -> int:
    """Source tokens a sentence may have (the model's max_len, less the EOS): the server
    cuts a longer sentence into pieces of at most this (serve.segment)."""
    return self._translator.model.config.max_len - 1

  def count_tokens(self, text: str) -> int:
    return len(self._translator.tokenizer.encode(text))

  @property
  def beam_size(self) -> int:
    """The beam of every request: the flag's, else the workdir's config."""
    return self._translator.search.beam_size

  def translate(self, lines: list[str], nbest: int = 0) -> list[Any]:
    """One string per line, or with nbest a list of `Hypothesis` per line, best first."""
    if not nbest:
      return list(self._translator.translate(lines))
    found = self._translator.translate(lines, nbest=nbest)
    return [[Hypothesis(h.text, float(h.score), float(h.log_prob)) for h in hyps] for hyps in found]

  def attention(self, source: str, target: str) -> dict[str, Any]:
    """The encoder-decoder attention of `target` (teacher-forced) on `source`: 'cross'
    [layers][heads][target pieces][source pieces] rounded to 4 decimals, with the pieces
    (EOS included) that label its axes."""
    found = self._translator.attention_weights(source, target)
    cross = np.round(np.asarray(found["cross"], np.float64), 4)
    return dict(
      source_tokens=list(found["source_tokens"]),
      target_tokens=list(found["target_tokens"]),
      cross=cross.tolist(),
    )


def shapes(batch_rows: Sequence[int], max_len: int) -> batching.Shapes:
  """The served batches' shapes: `batch_rows` rows, sources padded to 16, 32, 64, ... up to
  max_len (powers of two, not translate()'s default 1.5x steps: half the buckets, for
  sources padded by at most 2x), and every batch's encoder keys/values padded to max_len
  positions, so that only a search's first stage is compiled per source bucket and every
  later program once per row count: a few times fewer programs to compile before /ready,
  for a cross-attention over max_len positions at every step."""
  return batching.Shapes(
    rows=tuple(sorted(set(batch_rows))),
    buckets=tuple(batching.stream_buckets(max_len)),
    memory=max_len,
  )


def _bytes(tree: Any) -> int:
  """Bytes of a tree's arrays, each buffer once (a decoding copy may be the parameter)."""
  leaves = {id(x): x for x in jax.tree.leaves(tree)}
  return sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in leaves.values())


def workdir_list(flag: str | Sequence[str]) -> tuple[str, ...]:
  """--workdir's comma-separated workdirs (several: an ensemble)."""
  items = flag.split(",") if isinstance(flag, str) else list(flag)
  return tuple(w for w in items if w)
