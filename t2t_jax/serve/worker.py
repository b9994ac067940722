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
from t2t_jax.serve.api import Pair
from t2t_jax.translate import TranslateError, Translator, load_config

__all__ = ["WARM_UPS", "Hypothesis", "Model", "ModelError", "WarmUp"]

WARM_UPS = ("buckets", "all")

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
  max_rows: int | None = None  # sentences per decoding batch at most (None: batch_tokens)
  alternatives_limit: int = 3  # n-best alternatives a request may ask for (-1: beam - 1)
  warm_up: str = "buckets"  # WARM_UPS: what load() compiles before the server is ready
  dtype: str = "auto"  # the products' dtype (decoding.precision.decode_dtype)


@dataclasses.dataclass(frozen=True)
class WarmUp:
  """What `Model.load` compiled: batch shapes (times n-best sizes), the calls of their
  programs (`Translator.warm_up_batches`), seconds."""

  shapes: int
  programs: int
  seconds: float

  def __str__(self) -> str:
    if not self.programs:  # warm_up 'buckets'
      return f"one sentence in each of {self.shapes} source length buckets in {self.seconds:.1f} s"
    return f"{self.shapes} batch shapes, {self.programs} program calls in {self.seconds:.1f} s"


class Model:
  """A Translator behind the server: `load()` once, then translate/attention."""

  def __init__(self, settings: ModelSettings) -> None:
    self.settings = settings
    self._translator: Any = None
    self.warm_up: WarmUp | None = None
    self.param_bytes = 0  # the parameters and their decoding copies, once loaded
    config = load_config(settings.workdirs[0])
    self.pair = settings.pair or Pair(
      source=config.data.source_lang or "en", target=data_config.target_language(config.data)
    )

  def load(self) -> None:
    """Reads the checkpoint(s) and compiles before the server says it is ready: with
    warm_up 'buckets' the search of one sentence per source length bucket (a start in
    seconds; a batch of a new shape compiles when it first comes), with 'all' every batch
    shape the batching thread's translate() calls can take (rows up to max_rows, each source
    length bucket) for plain translations and each n-best size alternatives can ask for
    (`Translator.warm_up_batches`), so that after /ready no request compiles (minutes). The
    process-wide compilation cache is the command's choice: none is switched on here."""
    s = self.settings
    if s.warm_up not in WARM_UPS:
      raise ValueError(f"warm_up={s.warm_up!r} must be one of {WARM_UPS}")
    if s.warm_up == "all" and not s.max_rows:
      raise ValueError("warm_up='all' needs max_rows: it bounds the batch shapes to compile")
    translator = Translator.from_workdirs(
      list(s.workdirs),
      s.checkpoint,
      s.dtype,
      batch_tokens=s.batch_tokens,
      max_rows=s.max_rows,
    )
    # the server's beam_size and alpha into the one search every request decodes with
    translator.search = translator.search.override(beam_size=s.beam_size, alpha=s.alpha)
    start = time.perf_counter()
    if s.warm_up == "all":
      nbests = self.nbest_sizes(translator.search.beam_size)
      print(
        f"t2t-serve: compiling the search for every batch shape (up to {s.max_rows} "
        f"sentences, n-best sizes {', '.join(map(str, sorted({n or 1 for n in nbests})))})",
        file=sys.stderr,
        flush=True,
      )
      shapes, programs = translator.warm_up_batches(nbests=nbests)
    else:
      translator.warm_up()
      shapes, programs = len(translator.buckets()), 0
    self.warm_up = WarmUp(shapes, programs, time.perf_counter() - start)
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


def _bytes(tree: Any) -> int:
  """Bytes of a tree's arrays, each buffer once (a decoding copy may be the parameter)."""
  leaves = {id(x): x for x in jax.tree.leaves(tree)}
  return sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in leaves.values())


def workdir_list(flag: str | Sequence[str]) -> tuple[str, ...]:
  """--workdir's comma-separated workdirs (several: an ensemble)."""
  items = flag.split(",") if isinstance(flag, str) else list(flag)
  return tuple(w for w in items if w)
