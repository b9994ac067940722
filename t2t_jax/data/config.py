"""Every data field of an experiment, with its default and why, plus the checks of the fields
every source shares (each source checks its own: `t2t_jax.data.sources`).

Experiments do `config.data = t2t_jax.data.default_config()` and override fields; every field
is a plain type so absl/ml_collections can override it (`--config.data.max_len=128`).
"""

import functools
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

import ml_collections

from t2t_jax.data.errors import DataError
from t2t_jax.tokens import NUM_RESERVED


def default_config() -> ml_collections.ConfigDict:
  """Returns the data config: a small synthetic task, with the paper's WMT values elsewhere."""
  c = ml_collections.ConfigDict()
  # Where pairs come from: 'synthetic' (generated in-package, no files), 'textfiles' (local
  # aligned plain-text files, read in place into the prepared store), 'treebank' (Penn Treebank
  # .mrg files as words -> linearized trees: parsing, paper 6.3), 'wmt14_translate' or
  # 'wmt17_translate' (TFDS; downloads only when selected).
  c.source = "synthetic"

  # --- synthetic transduction tasks (tensor2tensor's algorithmic problems in spirit) ---
  c.task = "reverse"  # 'copy' | 'reverse' | 'sort' | 'shift' (+1 mod n) | 'addition' (decimal)
  c.synthetic_num_symbols = 16  # alphabet size for copy/reverse/sort/shift (addition uses 0-9)
  c.synthetic_min_len = 4  # shortest source, in symbols (addition: digits per operand)
  c.synthetic_max_len = 32  # longest source, in symbols (addition: digits per operand)
  c.synthetic_train_size = 20000  # training pairs generated (deterministic from the seed)
  c.synthetic_eval_size = 512  # pairs in each of dev and test
  c.synthetic_seed = 0  # generation seed; dev/test use distinct streams of it

  # --- translation direction (WMT and textfiles) ---
  c.pair = "de-en"  # TFDS config of wmt14/wmt17: 'de-en' | 'fr-en' | ...
  c.source_lang = ""  # '' -> 'en': the paper translates en->de and en->fr
  c.target_lang = ""  # '' -> the pair's other language

  # --- textfiles: aligned plain-text files, one sentence per line ('' = split absent) ---
  c.train_source = ""  # e.g. '../shared/data/multi30k/train.en'
  c.train_target = ""  # e.g. '../shared/data/multi30k/train.de'
  c.dev_source = ""
  c.dev_target = ""
  c.test_source = ""
  c.test_target = ""
  # Several weighted training corpora instead of train_source/train_target: a tuple of
  # {'source': path, 'target': path, 'weight': 1.0, 'tag': ''} (weight and tag optional).
  # weight is an upsampling factor: each epoch of the training stream holds every pair of
  # the corpus `weight` times (a fraction: a fixed seeded sample of that share once more);
  # tag, one vocabulary piece such as '<bt>', is put before each source of the corpus.
  # See docs/data.md, "Several training corpora".
  c.train_corpora = ()

  # --- treebank: wsj_NNNN.mrg files, split by file number ('' = split absent) ---
  c.treebank_dir = ""  # e.g. '../shared/data/ptb_sample' (the NLTK sample, wsj_0001-0199)
  c.treebank_train = "1-179"  # file numbers: ranges and numbers, comma separated
  c.treebank_dev = "180-189"
  c.treebank_test = "190-199"
  # The target's leaf tokens (t2t_jax.data.trees.TREE_LEAVES): 'xx' (every word XX, as in
  # Vinyals et al. 2015), 'words' (the word itself: the decoder copies the source in order),
  # 'positions' (XX1, XX2, ...: each leaf says which word it is). docs/parsing.md.
  c.tree_leaves = "xx"
  # Constrained decoding (decoding.constraints.TreeConstraint): the deepest nesting and the
  # longest run of opening brackets an output may have; 0: 64 and any run.
  c.tree_max_depth = 0
  c.tree_max_opens = 0

  # --- TFDS ---
  c.tfds_data_dir = ""  # '' -> TFDS default (WMT) or <data_dir or workdir>/tfds (textfiles)
  c.tfds_download = True  # False: fail instead of downloading/preparing WMT
  c.tfds_manual_dir = ""  # WMT archives downloaded by hand (TFDS manual_dir); '' -> TFDS's
  #                         <tfds_data_dir>/downloads/manual

  # --- the prepared store (t2t-prepare): every split tokenized once, memory-mapped ---
  c.data_dir = ""  # where the store, vocabulary and textfiles' TFDS copy live; '' -> the
  #                  workdir. Several workdirs (and all hosts) may share one data_dir.
  c.prepared_store = True  # False: tokenize the corpus into memory at every start instead

  # --- vocabulary (SentencePiece, shared by source and target, trained on train only) ---
  c.vocab_path = ""  # '' -> <data_dir or workdir>/vocab.model (synthetic: vocab.symbols, treebank:
  #                    vocab.words)
  c.vocab_size = 37000  # paper: 37000 for en-de, 32000 for en-fr; ignored by synthetic/treebank
  c.vocab_type = "bpe"  # 'bpe' (paper: byte-pair encoding) | 'unigram'
  c.vocab_max_sentences = 1_000_000  # bound on sentences sampled to train the vocab
  c.vocab_character_coverage = 1.0  # 1.0 keeps every character of Latin-script corpora
  c.vocab_byte_fallback = True  # unseen characters become byte pieces: decode is lossless
  c.vocab_seed = 0  # seed of the sentence sample used for vocabulary training
  c.vocab_min_count = 2  # treebank word vocabulary: rarer training words are read as a class

  # --- filtering and batching ---
  c.train_max_pairs = 0  # 0 = all; else only the first N training pairs (quick runs, tests)
  c.max_len = 256  # drop TRAIN pairs with either side longer (tokens incl. EOS); dev/test kept
  c.max_length_ratio = 0.0  # drop TRAIN pairs whose longer side has more than this many times
  #                           the tokens of the shorter (Moses clean-corpus-n: 9); 0 = off
  c.batching = "bucket"  # 'bucket' (padded length buckets, paper) | 'pack' (segments per row)
  c.tokens_per_batch = 25000  # GLOBAL budget per side per step (paper: ~25000 src + 25000 tgt)
  c.bucket_boundaries = ()  # explicit bucket lengths; () -> geometric rule below, up to max_len
  # Each bucket's source length, one per bucket of the above (its last = max_len), for tasks
  # whose sides differ in length (parsing: targets ~3x their sources); () -> the same lengths.
  c.source_bucket_boundaries = ()
  c.bucket_min = 8  # rule: first bucket length
  c.bucket_scale = 1.1  # rule: each bucket ~10% longer than the previous (tensor2tensor)
  c.bucket_multiple = 8  # rule: lengths rounded up to a multiple of this (TPU tiling)
  c.pack_len = 256  # packed row length, both sides; must be >= max_len
  c.pack_bins = 0  # rows packed at once; 0 -> the rows of one host step (more: tighter, slower)
  c.shuffle_seed = 0  # training order; each epoch is reshuffled from (seed, epoch)

  # --- performance and multi-host ---
  c.tokenize_threads = 0  # SentencePiece threads for the up-front tokenization; 0 -> all CPUs
  c.prefetch_batches = 2  # batches prepared ahead in a background thread
  c.wait_for_process0_s = 3600.0  # hosts > 0 wait this long for process 0's vocab/prepared data
  c.download_probe_s = 5.0  # seconds to reach each WMT download host before giving up; 0: no probe
  return c


# What a value of each type must be: a field holds the type of its default above (a float
# field also an integer), and every number is finite.
TYPE_WORDS = {
  bool: "True or False",
  int: "an integer",
  float: "a finite number",
  str: "a string",
  tuple: "a tuple",
}
LANGUAGE = r"[A-Za-z][A-Za-z0-9_]*"  # a code such as 'en' or 'pt_BR'; '-' joins a pair


def has_type(value: Any, kind: type) -> bool:
  """Whether `value` can be a field whose default is of type `kind` (ml_collections' rule,
  with bools kept apart from integers and NaN or infinity refused)."""
  if kind is bool:
    return isinstance(value, bool)
  if kind is int:
    return isinstance(value, int) and not isinstance(value, bool)
  if kind is float:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    return number and math.isfinite(value)
  if kind is tuple:
    return isinstance(value, tuple | list)
  return isinstance(value, kind)


def _lengths(v: Sequence[Any]) -> bool:
  ints = all(has_type(b, int) for b in v)
  return ints and all(b >= 2 for b in v) and list(v) == sorted(set(v))


# Each shared field's rule for its value alone (its type checked first), beyond those of
# `validate` below: (ok, what it must be). The source's own fields are its own
# (`Source.check_values`).
_CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {
  "pair": (
    lambda v: re.fullmatch(f"{LANGUAGE}-{LANGUAGE}", v) is not None,
    "must be two language codes joined by '-', such as 'de-en'",
  ),
  "source_lang": (
    lambda v: v == "" or re.fullmatch(LANGUAGE, v) is not None,
    "must be '' or a language code such as 'en'",
  ),
  "target_lang": (
    lambda v: v == "" or re.fullmatch(LANGUAGE, v) is not None,
    "must be '' or a language code such as 'de'",
  ),
  "vocab_size": (
    lambda v: v > NUM_RESERVED,
    f"must be > {NUM_RESERVED}: ids 0-{NUM_RESERVED - 1} are pad, EOS, BOS and unknown",
  ),
  "vocab_max_sentences": (lambda v: v >= 1, "must be >= 1"),
  "vocab_character_coverage": (lambda v: 0 < v <= 1, "must be in (0, 1]"),
  "vocab_seed": (lambda v: v >= 0, "must be >= 0"),
  "tokens_per_batch": (lambda v: v >= 1, "must be a positive integer"),
  "bucket_boundaries": (
    _lengths,
    "must be increasing integers >= 2 (a token plus EOS), or () for the rule below",
  ),
  "source_bucket_boundaries": (
    lambda v: all(has_type(b, int) for b in v),
    "must be integers, one per bucket, or () for the bucket lengths",
  ),
  "bucket_min": (lambda v: v >= 1, "must be >= 1"),
  "bucket_scale": (lambda v: v >= 1, "must be >= 1: each bucket at least as long as the last"),
  "bucket_multiple": (lambda v: v >= 1, "must be >= 1 (the lengths are rounded up to it)"),
  "pack_len": (lambda v: v >= 2, "must be >= 2 (a token plus EOS)"),
  "pack_bins": (lambda v: v >= 0, "must be >= 0 (0: the rows of one host step)"),
  "shuffle_seed": (lambda v: v >= 0, "must be >= 0"),
  "tokenize_threads": (lambda v: v >= 0, "must be >= 0 (0: all CPUs)"),
  "prefetch_batches": (lambda v: v >= 0, "must be >= 0 (0: none ahead)"),
  "wait_for_process0_s": (lambda v: v >= 0, "must be >= 0 (seconds)"),
  "download_probe_s": (lambda v: v >= 0, "must be >= 0 (seconds; 0: no probe)"),
}


def check_types(c: ml_collections.ConfigDict) -> None:
  """DataError naming the `config.data.*` flag whose value is not of its default's type (a
  string for a length, NaN for a rate, 1 for True), so that no later comparison meets one."""
  for field, kind in _default_types().items():
    if field in c and not has_type(c[field], kind):
      raise DataError(f"config.data.{field}={c[field]!r} must be {TYPE_WORDS[kind]}")


@functools.cache
def _default_types() -> dict[str, type]:
  return {field: type(default) for field, default in default_config().items()}


def validate(c: ml_collections.ConfigDict) -> None:
  """Raises DataError naming the offending `config.data.*` flag of a field every source
  shares (`t2t_jax.data.sources.validate` checks the source's fields as well): its type,
  then its value alone, then the rules between fields."""
  check_types(c)
  for field, (ok, must) in _CHECKS.items():
    if field in c and not ok(c[field]):
      raise DataError(f"config.data.{field}={c[field]!r} {must}")
  _check_choice(c, "batching", ("bucket", "pack"))
  _check_choice(c, "vocab_type", ("bpe", "unigram"))
  if c.train_max_pairs < 0:
    raise DataError(f"config.data.train_max_pairs={c.train_max_pairs} must be >= 0")
  if c.max_len < 2:
    raise DataError(f"config.data.max_len={c.max_len} must be >= 2 (a token plus EOS)")
  if c.max_length_ratio != 0 and not c.max_length_ratio >= 1:
    raise DataError(
      f"config.data.max_length_ratio={c.max_length_ratio} must be 0 (off) or >= 1: it bounds "
      "the longer side's tokens over the shorter side's"
    )
  if c.batching == "bucket":
    source_bucket_boundaries(c)  # raises naming the flag
  if c.batching == "pack" and c.pack_len < c.max_len:
    raise DataError(
      f"config.data.pack_len={c.pack_len} must be >= max_len={c.max_len}, "
      "or kept pairs could not fit a row"
    )


def _check_choice(c: ml_collections.ConfigDict, field: str, choices: Sequence[str]) -> None:
  if c[field] not in choices:
    raise DataError(f"config.data.{field}={c[field]!r} must be one of {choices}")


def with_defaults(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """`c`, with every field of default_config() it lacks set to its default: a workdir's
  config.json holds the fields of the version that wrote it, and readers fill them here
  instead of a `.get(field, default)` at every read. `c` itself when nothing is missing."""
  missing = {k: v for k, v in default_config().items() if k not in c}
  if not missing:
    return c
  filled = ml_collections.ConfigDict(c.to_dict())
  filled.update(missing)
  return filled


def data_root(c: ml_collections.ConfigDict, workdir: str) -> str:
  """Where the vocabulary, the prepared store and textfiles' TFDS copy live: data_dir or the
  workdir."""
  return c.data_dir or workdir


def bucket_boundaries(c: ml_collections.ConfigDict) -> tuple[int, ...]:
  """Sorted padded lengths of the training buckets; the last one is max_len."""
  if c.bucket_boundaries:
    lengths = sorted(int(b) for b in c.bucket_boundaries if int(b) < c.max_len)
    return tuple(lengths) + (c.max_len,)
  lengths, length = [], c.bucket_min
  while length < c.max_len:
    lengths.append(length)
    grown = -(-int(length * c.bucket_scale) // c.bucket_multiple) * c.bucket_multiple
    length = max(length + c.bucket_multiple, grown)
  return tuple(lengths) + (c.max_len,)


def source_bucket_boundaries(c: ml_collections.ConfigDict) -> tuple[int, ...]:
  """The padded source length of each training bucket (`bucket_boundaries` gives the target
  length): config.data.source_bucket_boundaries, or the target lengths. DataError names the
  flag when the list does not give one non-decreasing length per bucket ending at max_len."""
  targets = bucket_boundaries(c)
  given = tuple(int(b) for b in c.get("source_bucket_boundaries", ()))
  if not given:
    return targets
  flag = f"config.data.source_bucket_boundaries={given}"
  if len(given) != len(targets):
    raise DataError(
      f"{flag}: needs one source length per bucket, {len(targets)} for the bucket lengths "
      f"{targets} (config.data.bucket_boundaries={tuple(c.bucket_boundaries)}, "
      f"config.data.max_len={c.max_len})"
    )
  if given[0] < 2 or list(given) != sorted(given) or given[-1] != c.max_len:
    raise DataError(
      f"{flag}: the lengths must be >= 2, non-decreasing and end at max_len={c.max_len} "
      "(every kept pair needs a bucket)"
    )
  return given


def per_device_budget(c: ml_collections.ConfigDict, num_devices_total: int) -> int:
  """Tokens per side for one device: the global budget split evenly over all devices."""
  budget = c.tokens_per_batch // num_devices_total
  longest = c.pack_len if c.batching == "pack" else c.max_len
  if budget < longest:
    raise DataError(
      f"config.data.tokens_per_batch={c.tokens_per_batch} over {num_devices_total} devices "
      f"gives {budget} tokens per device, fewer than one row of {longest} tokens "
      f"({'pack_len' if c.batching == 'pack' else 'max_len'}); raise tokens_per_batch"
    )
  return budget


def target_language(c: ml_collections.ConfigDict) -> str:
  """The target language code of a data config (for the Moses tokenization of scoring)."""
  if c.target_lang:
    return c.target_lang
  other = [lang for lang in c.pair.split("-") if lang != "en"]
  return other[0] if other else "en"
