"""The `treebank` source: Penn Treebank `.mrg` files as (words, linearized tree) pairs.

The paper's section 6.3 trains on the WSJ part of the Penn Treebank; here it reads any
directory of `wsj_NNNN.mrg` files (the NLTK sample holds wsj_0001-wsj_0199, sections 00 and
01). Splits are made of whole files, named by their numbers (`config.data.treebank_train =
'1-179'`), so that no document straddles two splits. Each tree is cleaned and linearized by
`t2t_jax.data.trees`: the source is the words, the target the bracket sequence.

The vocabulary is word level (`vocabulary_symbols`): every bracket symbol of the training
targets, and the training words seen at least `vocab_min_count` times; other words are read
as a class of their shape (`t2t_jax.data.symbols.word_class`). Dev and test are scored by
bracket F1 against `gold_trees`, not by BLEU.
"""

import collections
import functools
import hashlib
import os
import pathlib
import re
from typing import Any

import ml_collections

from t2t_jax.data import trees
from t2t_jax.data.errors import DataError
from t2t_jax.data.sources import base
from t2t_jax.data.symbols import WORD_CLASSES, WORDS_FILE

SPLITS = base.SPLITS
_FILE_RE = re.compile(r"wsj_(\d{4})\.mrg$")


def file_numbers(spec: str, flag: str) -> list[int]:
  """'1-179' or '180-184,186' -> the file numbers, in order; DataError names the flag."""
  numbers = []
  for part in (p.strip() for p in spec.split(",")):
    match = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
    if not match:
      raise DataError(
        f"config.data.{flag}={spec!r}: {part!r} is not a file number or a range like 1-179"
      )
    first, last = int(match.group(1)), int(match.group(2) or match.group(1))
    if last < first:
      raise DataError(f"config.data.{flag}={spec!r}: range {part!r} runs backwards")
    numbers.extend(range(first, last + 1))
  return numbers


def split_files(c: ml_collections.ConfigDict) -> dict[str, list[str]]:
  """{'train', 'dev', 'test'} -> the .mrg paths of each split (a split may be empty)."""
  directory = c.treebank_dir
  if not directory or not os.path.isdir(directory):
    raise DataError(f"config.data.treebank_dir={directory!r} is not a directory")
  present = {
    int(m.group(1)): os.path.join(directory, name)
    for name in os.listdir(directory)
    if (m := _FILE_RE.fullmatch(name))
  }
  files, owner = {}, {}
  for split in SPLITS:
    flag = f"treebank_{split}"
    numbers = file_numbers(c[flag], flag) if c[flag] else []
    for n in numbers:
      if n in owner:
        raise DataError(
          f"config.data.{flag}: wsj_{n:04d}.mrg is also in treebank_{owner[n]}; "
          "a file belongs to one split"
        )
      if n not in present:
        raise DataError(f"config.data.{flag}: {directory}/wsj_{n:04d}.mrg does not exist")
      owner[n] = split
    files[split] = [present[n] for n in numbers]
  if not files["train"]:
    raise DataError("config.data.treebank_train names no files")
  return files


def read_trees(path: str) -> list[trees.Tree]:
  """Every tree of one .mrg file; DataError names the file, the sentence and the line."""
  try:
    with open(path, encoding="utf-8") as f:
      text = f.read()
  except (OSError, UnicodeDecodeError) as e:
    raise DataError(f"{path}: cannot read: {e}") from None
  out = []
  try:
    for tree, line in trees.parse_brackets(text):
      if not tree.leaves():
        raise trees.BracketError(f"line {line}: a tree without words")
      out.append(tree)
  except trees.BracketError as e:
    raise DataError(f"{path}: sentence {len(out) + 1}: {e}") from None
  return out


def _read_split(
  paths: list[str], leaves: str = "xx"
) -> tuple[tuple[trees.Tree, ...], tuple[tuple[str, str], ...]]:
  """(cleaned trees, pairs with leaf form `leaves`) of the files, cached while no file changes
  (size, mtime)."""
  stamps = []
  for path in paths:
    stat = os.stat(path)
    stamps.append((path, stat.st_size, stat.st_mtime_ns))
  return _read_files(tuple(stamps), leaves)


@functools.lru_cache(maxsize=16)
def _read_files(
  stamps: tuple[tuple[str, int, int], ...], leaves: str
) -> tuple[tuple[trees.Tree, ...], tuple[tuple[str, str], ...]]:
  gold, pairs = [], []
  for path, _, _ in stamps:
    for number, tree in enumerate(read_trees(path), start=1):
      cleaned = trees.clean(tree)
      if cleaned is None:
        raise DataError(f"{path}: sentence {number}: no words left after removing -NONE-")
      try:
        words, symbols = trees.linearize(cleaned, leaves)
      except ValueError as e:
        flag = f"config.data.tree_leaves={leaves!r}"
        raise DataError(f"{path}: sentence {number}: {flag}: {e}") from None
      gold.append(cleaned)
      pairs.append((" ".join(words), " ".join(symbols)))
  return tuple(gold), tuple(pairs)


def split_pairs(c: ml_collections.ConfigDict, split: str) -> list[tuple[str, str]]:
  """(words, linearized tree) pairs of one split, in file and sentence order; the target's
  leaves in the form `config.data.tree_leaves`."""
  return list(_read_split(split_files(c)[split], c.tree_leaves)[1])


def gold_trees(c: ml_collections.ConfigDict, split: str) -> list[trees.Tree]:
  """The cleaned trees of one split, part-of-speech tags kept (scoring needs them to find
  punctuation); aligned with `split_pairs`."""
  return list(_read_split(split_files(c)[split])[0])


def open_splits(c: ml_collections.ConfigDict) -> base.Splits:
  """Every split named by a non-empty treebank_{split} flag, parsed into memory."""
  files = split_files(c)
  return {
    split: base.ListPairs(split_pairs(c, split)) if files[split] else None for split in SPLITS
  }


IDENTITY_FIELDS = (
  "treebank_train",
  "treebank_dev",
  "treebank_test",
  "vocab_min_count",
  "tree_leaves",
)
# A manifest or fingerprint written before tree_leaves existed was made with XX leaves.
_RECORDED_DEFAULTS = {"tree_leaves": "xx"}


def identity(c: ml_collections.ConfigDict) -> dict[str, Any]:
  """Names the corpus in a prepared store's manifest: the split flags, the word vocabulary's
  threshold and a digest of the content of every file read (a moved copy still matches)."""
  digest, train = hashlib.sha256(), hashlib.sha256()
  for split, paths in split_files(c).items():
    for path in paths:
      with open(path, "rb") as f:
        content = hashlib.sha256(f.read()).digest()
      for d in (digest, train) if split == "train" else (digest,):
        d.update(f"{split}:{os.path.basename(path)}:".encode())
        d.update(content)
  return dict(
    name="treebank",
    treebank_dir=c.treebank_dir,
    files_sha256=digest.hexdigest(),
    train_files_sha256=train.hexdigest(),
    **{field: c[field] for field in IDENTITY_FIELDS},
  )


def target_symbols(c: ml_collections.ConfigDict) -> list[str]:
  """The target-only symbols, sorted: every bracket of the training targets, and the leaf
  symbols of the leaf form (xx: XX; positions: XX1 .. XX<max_len>, since a kept target is
  shorter than max_len and a dev or test sentence may be longer than every training one;
  words: none, the leaves are the source's own tokens)."""
  pairs = split_pairs(c, "train")
  if c.tree_leaves == "xx":
    return sorted({s for _, target in pairs for s in target.split()})
  brackets = sorted({s for _, target in pairs for s in target.split() if trees.is_bracket(s)})
  if c.tree_leaves == "positions":
    return brackets + [trees.position_symbol(k) for k in range(1, c.max_len + 1)]
  return brackets


def vocabulary_symbols(c: ml_collections.ConfigDict) -> list[str]:
  """The word vocabulary: the target symbols (`target_symbols`), the word classes, then
  training words seen >= vocab_min_count times (most frequent first). Source and target
  share it, so in the `words` leaf form a target leaf is the very id of its source word."""
  pairs = split_pairs(c, "train")
  symbols = target_symbols(c)
  counts = collections.Counter(w for source, _ in pairs for w in source.split())
  taken = set(symbols) | set(WORD_CLASSES)
  words = sorted(
    (w for w, n in counts.items() if n >= c.vocab_min_count and w not in taken),
    key=lambda w: (-counts[w], w),
  )
  return symbols + list(WORD_CLASSES) + words


class Treebank(base.Source):
  """Parsing as translation; the word vocabulary is read from the training trees."""

  name = "treebank"
  vocab_file = WORDS_FILE
  scores_trees = True

  def check_values(self, c: ml_collections.ConfigDict) -> None:
    if c.vocab_min_count < 1:
      raise DataError(f"config.data.vocab_min_count={c.vocab_min_count} must be >= 1")
    if c.tree_leaves not in trees.TREE_LEAVES:
      raise DataError(
        f"config.data.tree_leaves={c.tree_leaves!r} must be one of {trees.TREE_LEAVES}"
      )
    for field in ("tree_max_depth", "tree_max_opens"):
      if c[field] < 0:
        raise DataError(f"config.data.{field}={c[field]} must be >= 0 (0: no bound)")
    for split in SPLITS:
      flag = f"treebank_{split}"
      if c[flag]:
        file_numbers(c[flag], flag)

  def validate(self, c: ml_collections.ConfigDict) -> None:
    if not c.treebank_train:
      raise DataError("config.data.treebank_train='' names no files: give the training files")

  def open_splits(
    self, c: ml_collections.ConfigDict, workdir: str, process_index: int
  ) -> base.Splits:
    return open_splits(c)

  def identity(self, c: ml_collections.ConfigDict, splits: base.Splits) -> dict[str, Any]:
    return identity(c)

  def train_identity(
    self, c: ml_collections.ConfigDict, recorded: dict[str, Any]
  ) -> dict[str, Any]:
    """The training files' digest (from the files when a store made before it was recorded
    lacks it), the training file numbers and the word vocabulary's threshold."""
    train = recorded.get("train_files_sha256") or identity(c)["train_files_sha256"]
    out = dict(
      name=self.name,
      train_files_sha256=train,
      treebank_train=recorded["treebank_train"],
      vocab_min_count=recorded["vocab_min_count"],
    )
    leaves = recorded.get("tree_leaves", _RECORDED_DEFAULTS["tree_leaves"])
    if leaves != "xx":  # absent for XX leaves: the fingerprints of older runs still match
      out["tree_leaves"] = leaves
    return out

  def check_identity(
    self, path: pathlib.Path, recorded: dict[str, Any], c: ml_collections.ConfigDict
  ) -> None:
    """The same split flags and vocabulary threshold, and files of the same content."""
    current = identity(c)
    recorded = {**_RECORDED_DEFAULTS, **recorded}
    base.check_fields(path, recorded, {field: current[field] for field in IDENTITY_FIELDS})
    if recorded.get("files_sha256") != current["files_sha256"]:
      raise DataError(
        f"{path}: prepared from other treebank files than config.data.treebank_dir="
        f"{c.treebank_dir!r} holds now (was {recorded.get('treebank_dir')!r}); point "
        f"config.data.data_dir elsewhere, or delete {path} to prepare the data again"
      )

  def symbols(self, c: ml_collections.ConfigDict) -> list[str]:
    return vocabulary_symbols(c)

  def symbols_description(self, c: ml_collections.ConfigDict) -> str:
    return "this treebank split"


base.register(Treebank())
