"""The Translator: a trained workdir's model, parameters and vocabulary, text in, text out.

Used by notebooks, t2t-translate and the trainer's evaluation. Sentences are sorted by length
for batching and put back in input order; padded shapes are rounded so that few compile.
"""

import concurrent.futures
import dataclasses
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from flax.typing import VariableDict

from t2t_jax import data as data_lib
from t2t_jax.data.tokenizer import Tokenizer
from t2t_jax.decoding import batching, modes, precision
from t2t_jax.decoding import workdirs as workdirs_lib
from t2t_jax.decoding.batching import source_buckets
from t2t_jax.decoding.beam import length_penalty
from t2t_jax.decoding.config import PAPER_SEARCH, SearchConfig
from t2t_jax.decoding.programs import search_batch
from t2t_jax.decoding.stages import StageStats
from t2t_jax.decoding.workdirs import TranslateError, load_config, task_constraint
from t2t_jax.model import Transformer, TransformerConfig, decoding_params
from t2t_jax.run import checkpoint
from t2t_jax.tokens import EOS_ID, PAD_ID

# Names other modules and notebooks import from here.
__all__ = [
  "DecodeStats",
  "Hypothesis",
  "TranslateError",
  "Translator",
  "load_config",
  "one_line",
  "search_batch",
  "source_buckets",
  "task_constraint",
]


@dataclasses.dataclass
class DecodeStats(StageStats):
  """A Translator's staged searches, summed (`Translator.stats`; t2t-bench prints them):
  batches, the sentences in them and their rows (padding rows included), and the steps
  the outputs needed (each sentence's best output length, EOS included: a search that
  stepped every sentence only until its output ended would run that many row-steps)."""

  batches: int = 0
  sentences: int = 0
  rows: int = 0
  needed_row_steps: int = 0


def default_batch_threads() -> int:
  """Batches translate() decodes at once by default: 2 where JAX runs on the CPU (one
  batch's small compacted stages leave a core idle, docs/performance.md), 1 on an
  accelerator, where each batch holds its own device memory."""
  return 2 if jax.default_backend() == "cpu" else 1


_LINE_BREAKS = str.maketrans({"\n": " ", "\r": " ", "\t": " "})


def one_line(text: str) -> str:
  """A translation as one line of text: a model whose vocabulary falls back to bytes can
  output the newline, carriage-return or tab byte (sampling draws them now and then), which
  would split one output into two lines of t2t-translate's output or shift the columns of
  its TSV; each becomes a space."""
  return text.translate(_LINE_BREAKS)


class Hypothesis(NamedTuple):
  """One translation of an n-best list.

  score: the search's ranking score, log p / lp with the GNMT length penalty
  lp = ((5 + length) / 6)^alpha (beam.length_penalty; length counts EOS).
  log_prob: log p(translation | source), the sum of its token log-probabilities.
  """

  text: str
  score: float
  log_prob: float


def _hypotheses(
  tokenizer: Tokenizer,
  seqs: np.ndarray,
  scores: np.ndarray,
  mode: modes.Mode,
  alpha: float,
  nbest: int,
) -> list[Hypothesis]:
  """The `nbest` best of one sentence's search output (seqs [hypotheses, L], their values
  [hypotheses], as `mode` gives them: `modes`' `scores`), best first; empty slots (-inf:
  fewer hypotheses of nonzero probability) are left out."""
  out = []
  for seq, score in zip(seqs[:nbest], scores[:nbest]):
    if not np.isfinite(score):
      continue
    ends = np.flatnonzero(seq == EOS_ID)
    length = int(ends[0]) + 1 if ends.size else int(np.count_nonzero(seq != PAD_ID))
    score, log_prob = mode.scores(float(score), float(length_penalty(length, alpha)))
    out.append(Hypothesis(one_line(tokenizer.decode(seq)), score, log_prob))
  return out


def _warm_up_hypotheses(alpha: float) -> None:
  """Compiles the jnp operations `_hypotheses` runs on the host (the length penalty of a
  Python int and float), which would otherwise compile at the first n-best request."""
  length_penalty(1, alpha)


def _name(translator: "Translator") -> str:
  return ",".join(translator.workdirs) or "a model"


class Translator:
  """A trained model with its vocabulary: `.translate(sentences)` and `.attention_weights`.

  `search` holds the decoding settings translate() uses unless told otherwise (from_workdir:
  the workdir's config); max_output_extra= and beam_stop= override its fields. `stats` sums
  what the searches did (`DecodeStats`). constraint: the grammar every search obeys when
  search.constrained (`task_constraint`; from_workdir sets the workdir's). The other
  keyword arguments are what from_workdir and ensemble know: the checkpoint steps, the
  target language, the workdirs, an ensemble's members and their steps; batch_threads,
  how many batches translate() decodes at once (`default_batch_threads`).

  Building one changes nothing outside it: JAX's persistent compilation cache is the
  caller's (t2t-translate turns it on; API and notebook users call
  `t2t_jax.compilation.enable()` once, docs/translation.md).
  """

  def __init__(
    self,
    model: Transformer,
    params: VariableDict,
    tokenizer: Tokenizer,
    max_output_extra: int | None = None,
    batch_tokens: int = 4096,
    beam_stop: str | None = None,
    search: SearchConfig = PAPER_SEARCH,
    constraint: Any = None,
    *,
    checkpoint_steps: Sequence[int] = (),
    target_lang: str = "de",
    workdirs: Sequence[str] = (),
    members: Sequence[tuple[Transformer, VariableDict]] = (),
    member_steps: Sequence[Sequence[int]] = (),
    max_rows: int | None = None,
    batch_threads: int | None = None,
  ) -> None:
    self.search = search.override(max_output_extra=max_output_extra, beam_stop=beam_stop)
    # The grammar of the task's outputs (parsing workdirs: `constraints.TreeConstraint`,
    # `task_constraint`), obeyed by every search when search.constrained.
    self.constraint: Any = constraint
    self.model, self.params, self.tokenizer = model, params, tokenizer
    self.batch_tokens = batch_tokens
    # Sentences per translate() batch at most (None: batch_tokens alone bounds them): a
    # server bounds its batch shapes, and so its warm-up (`warm_up_batches`), with it.
    self.max_rows = max_rows
    self.checkpoint_steps: list[int] = list(checkpoint_steps)
    self.target_lang = target_lang
    # An ensemble's (model, params) per member (`ensemble`); `model` and `params` are the
    # first member's, which sets max_len and the vocabulary.
    self.members: tuple[tuple[Transformer, VariableDict], ...] = tuple(members) or (
      (model, params),
    )
    self.workdirs: list[str] = list(workdirs)
    # an ensemble's checkpoint steps per member
    self.member_steps: list[list[int]] = [list(m) for m in member_steps]
    self._stats_lock = threading.Lock()
    self._stats = DecodeStats()  # summed over every batch translated (`stats`)
    # (the parameters they were made from, `decoding_params` of each): `decoder`'s
    self._decoding_params: tuple[tuple, tuple] | None = None
    self._decoding_lock = threading.Lock()
    # Batches translate() decodes at once, each from a thread of its own (None:
    # `default_batch_threads()`).
    self.batch_threads = default_batch_threads() if batch_threads is None else batch_threads
    if self.batch_threads < 1:
      raise TranslateError(f"batch_threads={self.batch_threads}: must be at least 1")

  @classmethod
  def ensemble(cls, translators: Sequence["Translator"], **kwargs: Any) -> "Translator":
    """One Translator decoding with every member's model at each step (`decode`'s ensemble:
    the normalised mean of their log-probabilities); vocabulary, search and target language
    are the first member's, `kwargs` go to Translator(). The members must agree on the
    vocabulary size and max_len (refused naming both otherwise); that they share one
    vocabulary is the caller's to check (`from_workdirs` compares the files' sha256)."""
    first = translators[0]
    for other in translators[1:]:
      for what, get in (
        ("vocabulary size", lambda t: t.model.config.vocab_size),
        ("max_len", lambda t: t.model.config.max_len),
      ):
        if get(other) != get(first):
          raise TranslateError(
            f"ensemble: {_name(other)} has {what} {get(other)} but {_name(first)} has {get(first)}"
          )
    kwargs.setdefault("search", first.search)
    kwargs.setdefault("batch_tokens", first.batch_tokens)
    kwargs.setdefault("max_rows", first.max_rows)
    kwargs.setdefault("batch_threads", first.batch_threads)
    kwargs.setdefault("constraint", first.constraint)
    return cls(
      first.model,
      first.params,
      first.tokenizer,
      checkpoint_steps=first.checkpoint_steps,
      target_lang=first.target_lang,
      workdirs=[w for t in translators for w in t.workdirs],
      members=[m for t in translators for m in t.members],
      member_steps=[t.checkpoint_steps for t in translators],
      **kwargs,
    )

  @classmethod
  def from_workdirs(
    cls,
    workdirs: Sequence[str],
    checkpoint_spec: str = "latest",
    dtype: str | None = None,
    **kwargs: Any,
  ) -> "Translator":
    """`from_workdir` of one workdir, or the `ensemble` of several (the same checkpoint
    choice in each; search and vocabulary from the first). Before any checkpoint is read,
    the members' vocabulary files must have the same sha256, and their models the same
    vocabulary size and max_len: otherwise refused in one line naming both workdirs."""
    if len(workdirs) == 1:
      return cls.from_workdir(workdirs[0], checkpoint_spec, dtype, **kwargs)
    first = workdirs_lib.member_shape(workdirs[0])
    for workdir in workdirs[1:]:
      other = workdirs_lib.member_shape(workdir)
      if other.vocab_sha256 != first.vocab_sha256:
        raise TranslateError(
          f"ensemble: vocabulary {other.vocab} (sha256 {other.vocab_sha256}) differs from "
          f"{first.vocab} (sha256 {first.vocab_sha256}); the members must share one"
        )
      for what in ("vocab_size", "max_len"):
        if getattr(other, what) != getattr(first, what):
          raise TranslateError(
            f"ensemble: {workdir} has model {what}={getattr(other, what)} but "
            f"{workdirs[0]} has {getattr(first, what)}"
          )
    members = [cls.from_workdir(w, checkpoint_spec, dtype, **kwargs) for w in workdirs]
    return cls.ensemble(members, **kwargs)

  def decoder(self) -> tuple[Any, Any]:
    """(params, model) as `search_batch` takes them: one model's, or tuples of the
    members'; the parameters as a search reads them (`decoding_params`), made once for
    the parameters in `params` (`members`) and again if they are replaced."""
    if len(self.members) == 1:
      sources = ((self.model, self.params),)
    else:
      sources = self.members
    with self._decoding_lock:
      made = self._decoding_params
      if made is None or any(a is not b for (_, a), b in zip(sources, made[0])):
        derived = tuple(decoding_params(p, m.config) for m, p in sources)
        made = self._decoding_params = (tuple(p for _, p in sources), derived)
    models = tuple(m for m, _ in sources)
    if len(models) == 1:
      return made[1][0], models[0]
    return made[1], models

  @property
  def stats(self) -> DecodeStats:
    """What the searches did, summed over every batch translated (`DecodeStats`). Assigning
    a new one (or `reset_stats`) starts the sums again; a batch that finishes meanwhile is
    counted in the old or the new one, whole."""
    return self._stats

  @stats.setter
  def stats(self, value: DecodeStats) -> None:
    with self._stats_lock:
      self._stats = value

  def reset_stats(self) -> DecodeStats:
    """Starts the sums again; returns what they were, every batch counted whole."""
    with self._stats_lock:
      old, self._stats = self._stats, DecodeStats()
    return old

  @property
  def max_output_extra(self) -> int:
    return self.search.max_output_extra

  @property
  def beam_stop(self) -> str:
    """Beam search's stopping rule (`beam.Stop`)."""
    return self.search.beam_stop

  @classmethod
  def from_workdir(
    cls,
    workdir: str,
    checkpoint_spec: str = "latest",
    dtype: str | None = None,
    **kwargs: Any,
  ) -> "Translator":
    """Loads config.json, the vocabulary and checkpoint(s) ('latest', 'average:N', 'best[:N]',
    'STEP');
    the search defaults to the config's (SearchConfig.from_config), `kwargs` go to
    Translator(). dtype: the products' dtype ('float32', 'bfloat16', or 'auto':
    precision.decode_dtype); None: the config's."""
    config = load_config(workdir)
    checkpoint_spec = checkpoint.resolve_spec(workdir, checkpoint_spec)
    tokenizer = workdirs_lib.load_tokenizer(config, workdir)
    model_dict = config.model.to_dict()
    if dtype is not None:
      platform = jax.default_backend()
      configured = model_dict.get("dtype", "float32")
      try:
        model_dict["dtype"] = precision.decode_dtype(dtype, configured, platform)
      except ValueError as e:  # a bad $T2T_DECODE_DTYPE: one line from the commands
        raise TranslateError(str(e)) from None
    model_cfg = TransformerConfig.from_dict(model_dict, vocab_size=tokenizer.vocab_size)
    model = Transformer(model_cfg)
    shapes = workdirs_lib.param_shapes(model)
    params, steps = checkpoint.load_params(workdir, checkpoint_spec, shapes)
    workdirs_lib.check_vocabulary(workdir, steps, data_lib.vocab_path(config.data, workdir))
    kwargs.setdefault("search", SearchConfig.from_config(config))
    return cls(
      model,
      params,
      tokenizer,
      constraint=task_constraint(config.data, tokenizer),
      checkpoint_steps=steps,
      target_lang=data_lib.target_language(config.data),
      workdirs=[workdir],
      **kwargs,
    )

  def _settings(
    self, beam_size: int | None, alpha: float | None, search: SearchConfig | None
  ) -> SearchConfig:
    """The search of one call: `search` (default: the Translator's) with the beam_size and
    alpha given replacing its own."""
    return (search or self.search).override(beam_size=beam_size, alpha=alpha)

  def source_ids(self, sentences: Sequence[str], source_name: str = "input") -> list[list[int]]:
    """Token ids + EOS per sentence; longer than the model's max_len: cut to it, with one
    warning for all of `source_name`."""
    max_len = self.model.config.max_len
    ids, cut = [], []
    for i, text in enumerate(sentences):
      tokens = list(self.tokenizer.encode(text)) + [EOS_ID]
      if len(tokens) > max_len:
        cut.append(i + 1)
        tokens = tokens[: max_len - 1] + [EOS_ID]
      ids.append(tokens)
    if cut:
      logging.warning(
        "%s: %d of %d sentences have more source tokens than the model's max_len=%d and "
        "were truncated to it (lines %s)",
        source_name,
        len(cut),
        len(sentences),
        max_len,
        ", ".join(map(str, cut[:10])) + (", ..." if len(cut) > 10 else ""),
      )
    return ids

  def translate(
    self,
    sentences: Sequence[str],
    beam_size: int | None = None,
    alpha: float | None = None,
    nbest: int | None = None,
    source_name: str = "input",
    search: SearchConfig | None = None,
    prefixes: Sequence[str] | None = None,
    prefix_name: str = "prefixes",
  ) -> list[str] | list[list[Hypothesis]]:
    """Translates each sentence (max output length = its source length + max_output_extra).

    The search is `search` (default: the Translator's), with `beam_size` and `alpha`, when
    given, replacing its own. Returns one string per sentence, or with `nbest` (1 <= nbest
    <= max(beam_size, 1), or num_samples when sampling) a list per sentence of its nbest best
    `Hypothesis`es, best first
    (the first one's text is the string translate() returns without nbest). `source_name`
    (a file name) labels the warning about sentences cut to max_len.

    prefixes: one per sentence, the text its translation starts with (tokenized with the
    target vocabulary, no EOS; '' leaves the sentence unconstrained): the search takes the
    prefix's tokens first and continues after them, and scores count their log-probs
    (`rules.ForcePrefix`). The output limit is at least the prefix length + 1.
    A count other than len(sentences), or a prefix of max_len tokens or more, is refused
    naming `prefix_name` and `source_name`.
    """
    settings = self._settings(beam_size, alpha, search)
    self._check_nbest(nbest, settings)
    prefix_ids = self._prefix_ids(prefixes, len(sentences), prefix_name, source_name)
    sources = self.source_ids(sentences, source_name)
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    outputs: list = [None] * len(sources)
    # Compacted batches attend over the call's longest source bucket, so that batches of
    # every length share their programs after the first compaction (`decode_in_stages`).
    memory_len = (
      batching.source_bucket(self.model.config.max_len, len(sources[order[-1]]))
      if sources
      else None
    )
    batches = list(batching.batches(order, sources, self.batch_tokens, self.max_rows))

    def translate_batch(batch: list[int]) -> list:
      return self._translate_batch(
        [sources[i] for i in batch],
        settings,
        nbest,
        ids=batch,
        prefixes=None if prefix_ids is None else [prefix_ids[i] for i in batch],
        memory_len=memory_len,
      )

    for batch, results in zip(batches, self._each_batch(translate_batch, batches)):
      for i, result in zip(batch, results):
        outputs[i] = result
    return outputs

  def _each_batch(self, fn: Callable[[list[int]], list], batches: list[list[int]]) -> Iterable:
    """fn of each batch, in order: up to `batch_threads` batches at once. Batches are
    independent, so the results are those of one at a time; on a CPU a batch's small
    compacted stages and its host work leave a core idle that another batch's steps use
    (docs/performance.md)."""
    threads = min(self.batch_threads, len(batches))
    if threads <= 1:
      return map(fn, batches)
    with concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="t2t-batch") as pool:
      return list(pool.map(fn, batches))

  def _prefix_ids(
    self, prefixes: Sequence[str] | None, count: int, prefix_name: str, source_name: str
  ) -> list[list[int]] | None:
    """Each prefix's target token ids (no EOS), checked before any decoding."""
    if prefixes is None:
      return None
    if len(prefixes) != count:
      raise TranslateError(f"{prefix_name} has {len(prefixes)} lines but {source_name} has {count}")
    max_len = self.model.config.max_len
    ids = [list(self.tokenizer.encode(text)) for text in prefixes]
    long = [i + 1 for i, p in enumerate(ids) if len(p) + 1 > max_len]
    if long:
      lines = ", ".join(map(str, long[:10])) + (", ..." if len(long) > 10 else "")
      raise TranslateError(
        f"{prefix_name}: {len(long)} prefix(es) leave no room for EOS within the model's "
        f"max_len={max_len} (lines {lines})"
      )
    return ids

  @staticmethod
  def _check_nbest(nbest: int | None, settings: SearchConfig) -> None:
    if nbest is None or 1 <= nbest <= settings.hypotheses:
      return
    if settings.sampling:
      raise TranslateError(
        f"nbest={nbest}: must be between 1 and num_samples={settings.num_samples}"
      )
    raise TranslateError(f"nbest={nbest}: must be between 1 and the beam size {settings.beam_size}")

  def sample(
    self,
    sentences: Sequence[str],
    num_samples: int = 1,
    temperature: float | None = None,
    topk: int | None = None,
    topp: float | None = None,
    seed: int | None = None,
    nbest: int | None = None,
    source_name: str = "input",
    prefixes: Sequence[str] | None = None,
    prefix_name: str = "prefixes",
  ) -> list[str] | list[list[Hypothesis]]:
    """translate() by sampling (`modes.Sample`): `num_samples` outputs drawn per
    sentence from the model's distribution at `temperature`, cut to the `topk` best and the
    `topp` nucleus (None: the Translator's search fields, by default no cut, temperature 1,
    seed 0). Returns the best-scoring sample per sentence, or with `nbest` (<= num_samples)
    the nbest best samples as `Hypothesis`es (score: log p / lp, as beam search ranks). The
    same seed gives the same samples for the sentence at the same input index, whatever
    else is translated with it. `prefixes`: as translate()'s."""
    settings = self.search.override(
      sampling=True,
      beam_size=1,
      num_samples=num_samples,
      sampling_temperature=temperature,
      sampling_topk=topk,
      sampling_topp=topp,
      sampling_seed=seed,
    )
    return self.translate(
      sentences,
      nbest=nbest,
      source_name=source_name,
      search=settings,
      prefixes=prefixes,
      prefix_name=prefix_name,
    )

  def buckets(self) -> list[int]:
    """Padded source lengths of streaming translation: 16, 32, 64, ... up to max_len."""
    return batching.stream_buckets(self.model.config.max_len)

  def _bucket_shape(self, source_len: int, max_output_extra: int) -> tuple[int, int]:
    """`batching.bucket_shape` over the stream's buckets."""
    max_len = self.model.config.max_len
    return batching.bucket_shape(max_len, source_len, max_output_extra, self.buckets())

  def warm_up(
    self,
    beam_size: int | None = None,
    alpha: float | None = None,
    nbest: int | None = None,
    search: SearchConfig | None = None,
  ) -> None:
    """Compiles the search for every bucket, so that translate_stream never compiles."""
    settings = self._settings(beam_size, alpha, search)
    for bucket in self.buckets():
      shape = self._bucket_shape(bucket, settings.max_output_extra)
      self._translate_batch([[EOS_ID]], settings, nbest, shape, ids=[0])

  def warm_up_batches(
    self,
    beam_size: int | None = None,
    alpha: float | None = None,
    nbests: Sequence[int | None] = (None,),
    search: SearchConfig | None = None,
  ) -> tuple[int, int]:
    """Compiles every program translate() can run on sentences without prefixes, so that
    none compiles later: each batch shape of `batching.batch_shapes` (within batch_tokens
    and max_rows) for each n-best size of `nbests` (None: plain translations; an n-best
    size that shapes the same search as another shares its programs), through
    `search_batch`'s warm-up. Returns (batch shapes, program calls)."""
    settings = self._settings(beam_size, alpha, search)
    finals = list(dict.fromkeys(self._final(nbest, settings) for nbest in nbests))
    max_len, extra = self.model.config.max_len, settings.max_output_extra
    shapes = batching.batch_shapes(max_len, self.batch_tokens, extra, self.max_rows)
    params, model = self.decoder()
    calls = 0
    buckets = sorted(set(batching.source_buckets(max_len)))
    for rows, src_len, max_decode_len in shapes:
      # a call's longest bucket, the memory of its compacted batches, is any from src_len up
      memory_lens = [bucket for bucket in buckets if bucket >= src_len]
      sources = [[EOS_ID]] * rows
      inputs, limits, _, _ = batching.padded_batch(
        max_len, sources, extra, (src_len, max_decode_len)
      )
      for final in finals:
        calls += search_batch(
          params,
          inputs,
          limits,
          model=model,
          max_decode_len=max_decode_len,
          search=settings,
          final=final,
          constraint=self._constraint(settings),
          warm_up=True,
          memory_lens=memory_lens,
        )
    if any(nbest is not None for nbest in nbests):
      _warm_up_hypotheses(settings.alpha)
    return len(shapes) * len(finals), calls

  @staticmethod
  def _final(nbest: int | None, settings: SearchConfig) -> int | None:
    """`search_batch`'s final for an n-best size: beam search's nbest best hypotheses exact
    for an n-best list, else the best output alone (greedy search and sampling have no
    stopping rule: theirs is 1 as well, so that an n-best list shares their programs)."""
    if nbest is not None and settings.beam_size > 1 and not settings.sampling:
      return nbest
    return 1

  def _constraint(self, settings: SearchConfig) -> Any:
    return self.constraint if settings.constrained else None

  def translate_stream(
    self,
    lines: Iterable[str],
    beam_size: int | None = None,
    alpha: float | None = None,
    nbest: int | None = None,
    search: SearchConfig | None = None,
  ) -> Iterator[str | list[Hypothesis]]:
    """Translates lines one at a time as they arrive, yielding each result (as translate()
    gives it) as soon as it is done.

    Each source is padded to the smallest of a few length buckets (`buckets()`), so the
    search compiles once per bucket (all of them in `warm_up`) instead of once per length.
    The per-sentence output limit is the same as translate()'s, and so are the outputs.
    """
    settings = self._settings(beam_size, alpha, search)
    self._check_nbest(nbest, settings)
    for index, line in enumerate(lines):
      source = self.source_ids([line])[0]
      shape = self._bucket_shape(len(source), settings.max_output_extra)
      yield self._translate_batch([source], settings, nbest, shape, ids=[index])[0]

  def _translate_batch(
    self,
    sources: Sequence[Sequence[int]],
    settings: SearchConfig,
    nbest: int | None = None,
    shape: tuple[int, int] | None = None,
    ids: Sequence[int] | None = None,
    prefixes: Sequence[Sequence[int]] | None = None,
    memory_len: int | None = None,
  ) -> list[str] | list[list[Hypothesis]]:
    """Translates sentences (id lists) in one padded batch (`_padded_batch`); `ids` are
    their indices in the input, which key their samples when sampling; `prefixes` their
    forced first target tokens; `memory_len` the source positions of compacted batches
    (`programs.decode_in_stages`)."""
    inputs, limits, max_decode_len, prefix = batching.padded_batch(
      self.model.config.max_len, sources, settings.max_output_extra, shape, prefixes
    )
    sentence_ids = np.zeros(inputs.shape[0], np.int32)
    sentence_ids[: len(sources)] = range(len(sources)) if ids is None else ids
    params, model = self.decoder()
    stages = StageStats()  # this batch's, added to self.stats with the rest (_count)
    kw = dict(
      model=model,
      max_decode_len=max_decode_len,
      search=settings,
      sentence_ids=sentence_ids,
      prefix=prefix,
      stats=stages,
      constraint=self._constraint(settings),
      final=self._final(nbest, settings),
      memory_len=memory_len,
    )
    if nbest is None:
      seqs = np.asarray(search_batch(params, inputs, limits, **kw))
      self._count(len(sources), seqs.shape[0], seqs[: len(sources)], stages)
      return [one_line(self.tokenizer.decode(row)) for row in seqs[: len(sources)]]
    found = search_batch(params, inputs, limits, nbest=True, **kw)
    seqs, scores = (np.asarray(x) for x in found)
    self._count(len(sources), seqs.shape[0], seqs[: len(sources), 0], stages)
    mode = modes.of_settings(settings)
    return [
      _hypotheses(self.tokenizer, seqs[r], scores[r], mode, settings.alpha, nbest)
      for r in range(len(sources))
    ]

  def _count(self, sentences: int, rows: int, best: np.ndarray, stages: StageStats) -> None:
    """Adds a batch to `stats` (best: int32 [sentences, max_decode_len], PAD after EOS;
    stages: its search's), under a lock: batches may finish together (`_each_batch`)."""
    with self._stats_lock:
      stats = self._stats
      for field in dataclasses.fields(stages):
        setattr(stats, field.name, getattr(stats, field.name) + getattr(stages, field.name))
      stats.batches += 1
      stats.sentences += sentences
      stats.rows += rows
      stats.needed_row_steps += int(np.sum(best != PAD_ID))

  def attention_weights(self, source: str, target: str) -> dict[str, np.ndarray | list[str]]:
    """Every layer's and head's attention for one pair, teacher-forced on `target`.

    Returns {'encoder_self': [layers, heads, src, src], 'decoder_self': [layers, heads, tgt,
    tgt], 'cross': [layers, heads, tgt, src]} as numpy, plus the 'source_tokens' and
    'target_tokens' (subword strings, EOS included) that label the axes.
    """
    src = self.source_ids([source])[0]
    tgt = list(self.tokenizer.encode(target)) + [EOS_ID]
    inputs, targets = jnp.array([src]), jnp.array([tgt])
    _, state = self.model.apply({"params": self.params}, inputs, targets, mutable=["intermediates"])
    inter = state["intermediates"]
    stack = lambda part, layers, kind: np.stack(
      [
        np.asarray(inter[part][f"layer_{i}"][kind]["attention_weights"][0][0])
        for i in range(layers)
      ]
    )
    cfg = self.model.config
    return dict(
      encoder_self=stack("encoder", cfg.encoder_layers, "self_attention"),
      decoder_self=stack("decoder", cfg.decoder_layers, "self_attention"),
      cross=stack("decoder", cfg.decoder_layers, "cross_attention"),
      source_tokens=self._pieces(src),
      target_tokens=self._pieces(tgt),
    )

  def _pieces(self, ids: Sequence[int]) -> list[str]:
    piece = getattr(self.tokenizer, "id_to_piece", None)
    if piece is not None:
      return [piece(i) for i in ids]
    return [self.tokenizer.decode([i]) if i != EOS_ID else "</s>" for i in ids]
