"""The Translator: a trained workdir's model, parameters and vocabulary, text in, text out.

Used by notebooks, t2t-translate, t2t-serve and the trainer's evaluation. Sentences are
sorted by length for batching and put back in input order; padded shapes are rounded so
that few compile. Every call decodes with one `SearchConfig` (the Translator's, or the
call's own `search=`), down to the compiled programs unchanged.
"""

import dataclasses
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
from flax.typing import VariableDict

from t2t_jax.data.tokenizer import Tokenizer
from t2t_jax.decoding import attention_maps, batching, modes
from t2t_jax.decoding import hypotheses as hypotheses_lib
from t2t_jax.decoding.batch_threads import DecodeStats, default_batch_threads, each_batch
from t2t_jax.decoding.batching import source_buckets
from t2t_jax.decoding.config import PAPER_SEARCH, SearchConfig
from t2t_jax.decoding.hypotheses import Hypothesis, one_line
from t2t_jax.decoding.loading import check_members, check_same_shape, load_workdir
from t2t_jax.decoding.programs import search_batch
from t2t_jax.decoding.stages import StageStats
from t2t_jax.decoding.workdirs import TranslateError, load_config, task_constraint
from t2t_jax.model import Transformer, decoding_params
from t2t_jax.tokens import EOS_ID, PAD_ID

# Names other modules and notebooks import from here.
__all__ = [
  "DecodeStats",
  "Hypothesis",
  "TranslateError",
  "Translator",
  "default_batch_threads",
  "load_config",
  "one_line",
  "search_batch",
  "source_buckets",
  "task_constraint",
]


def _name(translator: "Translator") -> str:
  return ",".join(translator.workdirs) or "a model"


class Translator:
  """A trained model with its vocabulary: `.translate(sentences)` and `.attention_weights`.

  `search` holds the decoding settings every call uses unless it passes its own (a
  `SearchConfig`: `translator.search.override(beam_size=1)`, say); from_workdir: the
  workdir's config. `stats` sums what the searches did (`DecodeStats`). constraint: the
  grammar every search obeys when search.constrained (`task_constraint`; from_workdir sets
  the workdir's). The other keyword arguments are what from_workdir and ensemble know: the
  checkpoint steps, the target language, the workdirs, an ensemble's members and their
  steps; batch_threads, how many batches translate() decodes at once
  (`default_batch_threads`).

  Building one changes nothing outside it: JAX's persistent compilation cache is the
  caller's (t2t-translate turns it on; API and notebook users call
  `t2t_jax.compilation.enable()` once, docs/translation.md).
  """

  def __init__(
    self,
    model: Transformer,
    params: VariableDict,
    tokenizer: Tokenizer,
    search: SearchConfig = PAPER_SEARCH,
    constraint: Any = None,
    *,
    batch_tokens: int = 4096,
    checkpoint_steps: Sequence[int] = (),
    target_lang: str = "de",
    workdirs: Sequence[str] = (),
    members: Sequence[tuple[Transformer, VariableDict]] = (),
    member_steps: Sequence[Sequence[int]] = (),
    max_rows: int | None = None,
    batch_threads: int | None = None,
    shapes: batching.Shapes = batching.DEFAULT_SHAPES,
  ) -> None:
    self.search = search
    # The grammar of the task's outputs (parsing workdirs: `constraints.TreeConstraint`,
    # `task_constraint`), obeyed by every search when search.constrained.
    self.constraint: Any = constraint
    self.model, self.params, self.tokenizer = model, params, tokenizer
    self.batch_tokens = batch_tokens
    # Sentences per translate() batch at most (None: batch_tokens alone bounds them): a
    # server bounds its batch shapes, and so its warm-up (`warm_up_batches`), with it.
    self.max_rows = max_rows
    # The row counts and source buckets translate() pads its batches to (`batching.Shapes`).
    self.shapes = shapes
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
    """One Translator decoding with every member's model at each step (the normalised mean
    of their log-probabilities, `model_view.ensemble_log_probs`); vocabulary, search and
    target language are the first member's, `kwargs` go to Translator(). The members must
    agree on the vocabulary size and max_len (`loading.check_same_shape`); that they share
    one vocabulary is the caller's to check (`from_workdirs` compares the files' sha256)."""
    check_same_shape([(_name(t), t.model) for t in translators])
    first = translators[0]
    for field in ("search", "batch_tokens", "max_rows", "batch_threads", "constraint", "shapes"):
      kwargs.setdefault(field, getattr(first, field))
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
    checkpoint_spec: str = "auto",
    dtype: str | None = "auto",
    **kwargs: Any,
  ) -> "Translator":
    """`from_workdir` of one workdir, or the `ensemble` of several (the same checkpoint
    choice in each; search and vocabulary from the first), checked before any checkpoint is
    read (`loading.check_members`)."""
    if len(workdirs) == 1:
      return cls.from_workdir(workdirs[0], checkpoint_spec, dtype, **kwargs)
    check_members(workdirs)
    members = [cls.from_workdir(w, checkpoint_spec, dtype, **kwargs) for w in workdirs]
    return cls.ensemble(members, **kwargs)

  @classmethod
  def from_workdir(
    cls,
    workdir: str,
    checkpoint_spec: str = "auto",
    dtype: str | None = "auto",
    **kwargs: Any,
  ) -> "Translator":
    """A workdir's model (`loading.load_workdir`). The defaults are t2t-translate's, so
    that the same workdir gives the same lines from Python as from the command: checkpoint
    'auto' (the one chosen on dev, else the latest; also 'latest', 'average:N', 'best[:N]',
    'ema', 'selected' or 'STEP') and dtype 'auto' (bfloat16 on a CPU with AMX or
    AVX512-BF16; also 'float32', 'bfloat16', or None: the config's). The search defaults to
    the config's, `kwargs` go to Translator()."""
    loaded = load_workdir(workdir, checkpoint_spec, dtype)
    return cls(loaded.model, loaded.params, loaded.tokenizer, **(loaded.settings | kwargs))

  def decoder(self) -> tuple[Any, Any]:
    """(params, model) as `search_batch` takes them: one model's, or tuples of the
    members'; the parameters as a search reads them (`decoding_params`), made once for
    the parameters in `params` (`members`) and again if they are replaced."""
    sources = ((self.model, self.params),) if len(self.members) == 1 else self.members
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

  def source_ids(self, sentences: Sequence[str], source_name: str = "input") -> list[list[int]]:
    """Token ids + EOS per sentence, cut to max_len (`hypotheses.source_ids`)."""
    return hypotheses_lib.source_ids(
      self.tokenizer, sentences, self.model.config.max_len, source_name
    )

  def _settings(self, search: SearchConfig | None, nbest: int | None) -> SearchConfig:
    """The search of one call (default: the Translator's), with `nbest` checked against
    it (`SearchConfig.check_nbest`)."""
    settings = self.search if search is None else search
    try:
      settings.check_nbest(nbest)
    except ValueError as e:
      raise TranslateError(str(e)) from None
    return settings

  def translate(
    self,
    sentences: Sequence[str],
    *,
    search: SearchConfig | None = None,
    nbest: int | None = None,
    source_name: str = "input",
    prefixes: Sequence[str] | None = None,
    prefix_name: str = "prefixes",
  ) -> list[str] | list[list[Hypothesis]]:
    """Translates each sentence (max output length = its source length +
    search.max_output_extra) with `search` (default: the Translator's).

    Returns one string per sentence, or with `nbest` (1 to search.hypotheses) a list per
    sentence of its nbest best `Hypothesis`es, best first (the first one's text is the
    string translate() returns without nbest). `source_name` (a file name) labels the
    warning about sentences cut to max_len.

    prefixes: one per sentence, the text its translation starts with (tokenized with the
    target vocabulary, no EOS; '' leaves the sentence unconstrained): the search takes the
    prefix's tokens first and continues after them, and scores count their log-probs
    (`rules.ForcePrefix`). The output limit is at least the prefix length + 1.
    A count other than len(sentences), or a prefix of max_len tokens or more, is refused
    naming `prefix_name` and `source_name`.
    """
    settings = self._settings(search, nbest)
    max_len = self.model.config.max_len
    prefix_ids = hypotheses_lib.prefix_ids(
      self.tokenizer, prefixes, len(sentences), max_len, prefix_name, source_name
    )
    sources = self.source_ids(sentences, source_name)
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    outputs: list = [None] * len(sources)
    # Compacted batches attend over the call's longest source bucket, so that batches of
    # every length share their programs after the first compaction (`decode_in_stages`).
    buckets = self.shapes.source_buckets(max_len)
    longest = len(sources[order[-1]]) if sources else None
    memory_len = self.shapes.memory or (
      batching.source_bucket(max_len, longest, buckets) if sources else None
    )
    batches = list(batching.batches(order, sources, self.batch_tokens, self.max_rows, self.shapes))

    def translate_batch(batch: list[int]) -> list:
      return self._translate_batch(
        [sources[i] for i in batch],
        settings,
        nbest,
        ids=batch,
        prefixes=None if prefix_ids is None else [prefix_ids[i] for i in batch],
        memory_len=memory_len,
      )

    results = each_batch(translate_batch, batches, self.batch_threads)
    for batch, found in zip(batches, results):
      for i, result in zip(batch, found):
        outputs[i] = result
    return outputs

  def sample(
    self,
    sentences: Sequence[str],
    *,
    search: SearchConfig | None = None,
    nbest: int | None = None,
    **kwargs: Any,
  ) -> list[str] | list[list[Hypothesis]]:
    """translate() by sampling (`modes.Sample`): `search` (default: the Translator's) with
    sampling on (beam_size 1); its num_samples outputs drawn per sentence at
    sampling_temperature, cut to the sampling_topk best and the sampling_topp nucleus.
    Returns the best-scoring sample per sentence, or with `nbest` (<= num_samples) the
    nbest best samples as `Hypothesis`es (score: log p / lp, as beam search ranks). The
    same sampling_seed gives the same samples for the sentence at the same input index,
    whatever else is translated with it. `kwargs`: translate()'s."""
    settings = (self.search if search is None else search).override(sampling=True, beam_size=1)
    return self.translate(sentences, search=settings, nbest=nbest, **kwargs)

  def buckets(self) -> list[int]:
    """Padded source lengths of streaming translation: 16, 32, 64, ... up to max_len."""
    return batching.stream_buckets(self.model.config.max_len)

  def _bucket_shape(self, source_len: int, max_output_extra: int) -> tuple[int, int]:
    """`batching.bucket_shape` over the stream's buckets."""
    max_len = self.model.config.max_len
    return batching.bucket_shape(max_len, source_len, max_output_extra, self.buckets())

  def warm_up(self, *, search: SearchConfig | None = None, nbest: int | None = None) -> None:
    """Compiles the search for every bucket, so that translate_stream never compiles."""
    settings = self._settings(search, nbest)
    for bucket in self.buckets():
      shape = self._bucket_shape(bucket, settings.max_output_extra)
      self._translate_batch([[EOS_ID]], settings, nbest, shape, ids=[0])

  def warm_up_batches(
    self, *, search: SearchConfig | None = None, nbests: Sequence[int | None] = (None,)
  ) -> tuple[int, int]:
    """Compiles every program translate() can run on sentences without prefixes, so that
    none compiles later: each batch shape of `batching.batch_shapes` (within batch_tokens
    and max_rows) for each n-best size of `nbests` (None: plain translations; an n-best
    size whose mode is another's, as greedy search's and sampling's are, shares its
    programs), through `search_batch`'s warm-up. Returns (batch shapes, program calls)."""
    settings = self._settings(search, None)
    for nbest in nbests:
      self._settings(settings, nbest)
    sizes = list({modes.of_settings(settings, n or 1): n or 1 for n in nbests}.values())
    max_len, extra = self.model.config.max_len, settings.max_output_extra
    shapes = batching.batch_shapes(max_len, self.batch_tokens, extra, self.max_rows, self.shapes)
    params, model = self.decoder()
    buckets = self.shapes.source_buckets(max_len)

    def warm_up_shape(index: list[int]) -> list[int]:
      rows, src_len, max_decode_len = shapes[index[0]]
      # a call's longest bucket, the memory of its compacted batches, is any from src_len up
      # (with shapes.memory: every batch's, from its first stage)
      memory_lens = [bucket for bucket in buckets if bucket >= src_len]
      if self.shapes.memory:
        memory_lens = [self.shapes.memory]
      inputs, limits, _, _ = batching.padded_batch(
        max_len, [[EOS_ID]] * rows, extra, (src_len, max_decode_len), shapes=self.shapes
      )
      return [
        search_batch(
          params,
          inputs,
          limits,
          model=model,
          max_decode_len=max_decode_len,
          search=settings,
          nbest=nbest,
          constraint=self._constraint(settings),
          warm_up=True,
          memory_lens=memory_lens,
          full_memory=self.shapes.memory is not None,
        )
        for nbest in sizes
      ]

    # Shapes compile independently: as many at once as translate() decodes batches (XLA
    # compiles a program on one core, and JAX lets go of the GIL while it does).
    found = each_batch(warm_up_shape, [[i] for i in range(len(shapes))], self.batch_threads)
    calls = sum(sum(counts) for counts in found)
    if any(nbest is not None for nbest in nbests):
      hypotheses_lib.warm_up_hypotheses(settings.alpha)
    return len(shapes) * len(sizes), calls

  def _constraint(self, settings: SearchConfig) -> Any:
    return self.constraint if settings.constrained else None

  def translate_stream(
    self,
    lines: Iterable[str],
    *,
    search: SearchConfig | None = None,
    nbest: int | None = None,
  ) -> Iterator[str | list[Hypothesis]]:
    """Translates lines one at a time as they arrive, yielding each result (as translate()
    gives it) as soon as it is done.

    Each source is padded to the smallest of a few length buckets (`buckets()`), so the
    search compiles once per bucket (all of them in `warm_up`) instead of once per length.
    The per-sentence output limit is the same as translate()'s, and so are the outputs.
    """
    settings = self._settings(search, nbest)
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
    """Translates sentences (id lists) in one padded batch (`batching.padded_batch`); `ids`
    are their indices in the input, which key their samples when sampling; `prefixes`
    their forced first target tokens; `memory_len` the source positions of compacted
    batches (`programs.decode_in_stages`)."""
    inputs, limits, max_decode_len, prefix = batching.padded_batch(
      self.model.config.max_len, sources, settings.max_output_extra, shape, prefixes, self.shapes
    )
    sentence_ids = np.zeros(inputs.shape[0], np.int32)
    sentence_ids[: len(sources)] = range(len(sources)) if ids is None else ids
    params, model = self.decoder()
    stages = StageStats()  # this batch's, added to self.stats with the rest (_count)
    found = search_batch(
      params,
      inputs,
      limits,
      model=model,
      max_decode_len=max_decode_len,
      search=settings,
      nbest=nbest,
      sentence_ids=sentence_ids,
      prefix=prefix,
      stats=stages,
      constraint=self._constraint(settings),
      memory_len=memory_len,
      full_memory=self.shapes.memory is not None,
    )
    n = len(sources)
    if nbest is None:
      seqs = np.asarray(found)
      self._count(n, seqs.shape[0], seqs[:n], stages)
      return [one_line(self.tokenizer.decode(row)) for row in seqs[:n]]
    seqs, values = (np.asarray(x) for x in found)
    self._count(n, seqs.shape[0], seqs[:n, 0], stages)
    mode, alpha = modes.of_settings(settings), settings.alpha
    return [
      hypotheses_lib.hypotheses(self.tokenizer, seqs[r], values[r], mode, alpha, nbest)
      for r in range(n)
    ]

  def _count(self, sentences: int, rows: int, best: np.ndarray, stages: StageStats) -> None:
    """Adds a batch to `stats` (best: int32 [sentences, max_decode_len], PAD after EOS;
    stages: its search's), under a lock: batches may finish together (`each_batch`)."""
    with self._stats_lock:
      stats = self._stats
      for field in dataclasses.fields(stages):
        setattr(stats, field.name, getattr(stats, field.name) + getattr(stages, field.name))
      stats.batches += 1
      stats.sentences += sentences
      stats.rows += rows
      stats.needed_row_steps += int(np.sum(best != PAD_ID))

  def attention_weights(self, source: str, target: str) -> dict[str, np.ndarray | list[str]]:
    """Every layer's and head's attention for one pair, teacher-forced on `target`
    (`attention_maps.attention_weights`: [layers, heads, ...] arrays and the tokens that
    label their axes)."""
    src = self.source_ids([source])[0]
    return attention_maps.attention_weights(self.model, self.params, self.tokenizer, src, target)
