"""Property tests of what users write: corpus lines, treebank brackets, --config overrides.

Each property compares the code with a reference written apart from it (Python's own string
splitting, a counter of brackets, a walk of the config's dict) on inputs hypothesis draws:
blank lines, tabs, carriage returns, any Unicode, a byte-order mark, a missing last newline,
lines across the reader's block boundaries, brackets nested or not, fields present or not.
"""

import contextlib
import os
import tempfile

import ml_collections
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from t2t_jax.cli import common
from t2t_jax.data import tokenized, trees
from t2t_jax.data.errors import DataError
from t2t_jax.data.sources import textfiles

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# --- corpus lines ---------------------------------------------------------------------------

# Any character but the line end and lone surrogates (not encodable as UTF-8): tabs, '\r',
# spaces, combining marks, emoji, other scripts.
LINE = st.text(st.characters(blacklist_characters="\n", blacklist_categories=("Cs",)), max_size=12)


@contextlib.contextmanager
def _file(data: bytes):
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "corpus.txt")
    with open(path, "wb") as f:
      f.write(data)
    yield path


@contextlib.contextmanager
def _block(size: int):
  """The reader scans `size` bytes at a time (the default is 64 MiB: no test file crosses a
  block boundary otherwise)."""
  saved, textfiles._BLOCK = textfiles._BLOCK, size
  try:
    yield
  finally:
    textfiles._BLOCK = saved


def _reference_lines(data: bytes) -> list[str]:
  """Python's reading of a UTF-8 text file: a leading BOM dropped, lines split at '\\n', a
  final '\\n' ending the last line rather than starting an empty one, one '\\r' before the
  '\\n' dropped (Windows line ends)."""
  text = data.decode("utf-8")
  text = text[1:] if text.startswith("\ufeff") else text
  if not text:
    return []
  parts = text.split("\n")
  if text.endswith("\n"):
    parts.pop()
  return [p[:-1] if p.endswith("\r") else p for p in parts]


@SETTINGS
@given(
  lines=st.lists(LINE, max_size=8),
  final_newline=st.booleans(),
  bom=st.booleans(),
  crlf=st.booleans(),
  block=st.sampled_from([1, 3, 7, 1 << 26]),
)
def test_corpus_lines_are_read_as_python_splits_them(lines, final_newline, bom, crlf, block):
  end = "\r\n" if crlf else "\n"
  text = end.join(lines) + (end if final_newline and lines else "")
  data = (b"\xef\xbb\xbf" if bom else b"") + text.encode("utf-8")
  with _file(data) as path, _block(block):
    want = _reference_lines(data)
    assert textfiles.read_lines(path) == want
    reader = textfiles.LineFile(path)
    assert len(reader) == len(want)
    # Any lines, in any order, one at a time or as a range.
    every_other = list(range(0, len(want), 2))[::-1]
    assert reader.lines(every_other) == [want[i] for i in every_other]


@SETTINGS
@given(
  lines=st.lists(LINE, min_size=1, max_size=6),
  bad=st.data(),
  block=st.sampled_from([2, 5, 1 << 26]),
)
def test_bytes_that_are_not_utf8_name_the_file_and_line(lines, bad, block):
  line = bad.draw(st.integers(0, len(lines) - 1))
  raw = [x.encode("utf-8") for x in lines]
  raw[line] += bad.draw(st.sampled_from([b"\xff", b"\xc3", b"\xe2\x82", b"\x80"]))
  with _file(b"\n".join(raw) + b"\n") as path, _block(block), pytest.raises(DataError) as e:
    textfiles.read_lines(path, "train_source")
  message = str(e.value)
  assert message.startswith(f"{path}:{line + 1}: bytes that are not UTF-8"), message
  assert message.endswith("(config.data.train_source)") and "\n" not in message


@SETTINGS
@given(sources=st.lists(LINE, max_size=6), targets=st.lists(LINE, max_size=6), split=st.booleans())
def test_misaligned_files_are_refused_naming_both_files_and_their_counts(sources, targets, split):
  with tempfile.TemporaryDirectory() as tmp:
    paths = []
    for name, lines in (("a.en", sources), ("a.de", targets)):
      paths.append(os.path.join(tmp, name))
      with open(paths[-1], "w", encoding="utf-8", newline="") as f:
        f.write("".join(line + "\n" for line in lines))
    want_s, want_t = (len(_reference_lines(open(p, "rb").read())) for p in paths)
    name = "train" if split else ""
    if want_s == want_t:
      pairs = textfiles.read_parallel(*paths, name)
      assert [s for s, _ in pairs] == _reference_lines(open(paths[0], "rb").read())
      assert [t for _, t in pairs] == _reference_lines(open(paths[1], "rb").read())
      # Blank pairs are skipped and counted; the others keep their alignment.
      counts = tokenized.SplitCounts()
      kept = tokenized.non_empty(pairs, counts)
      assert kept == [(s, t) for s, t in pairs if s.strip() and t.strip()]
      assert counts.read == len(pairs) and counts.empty_skipped == len(pairs) - len(kept)
    else:
      with pytest.raises(DataError) as e:
        textfiles.read_parallel(*paths, name)
      assert str(e.value) == (
        f"{name or 'parallel'} files are not aligned: {paths[0]} has {want_s} lines but "
        f"{paths[1]} has {want_t} lines"
      )


# --- treebank brackets ----------------------------------------------------------------------

LABEL = st.sampled_from(["S", "NP", "VP", "PP", "NP-SBJ", "-NONE-", "TOP", "."])
WORD = st.text(
  st.characters(blacklist_categories=("Cs", "Zs", "Zl", "Zp", "Cc"), blacklist_characters="()"),
  min_size=1,
  max_size=4,
).filter(lambda w: not w.isspace())


def _trees(depth: int) -> st.SearchStrategy:
  preterminal = st.builds(lambda label, word: trees.Tree(label, (word,)), LABEL, WORD)
  if depth == 0:
    return preterminal
  inner = st.builds(
    lambda label, children: trees.Tree(label, tuple(children)),
    LABEL,
    st.lists(_trees(depth - 1), min_size=1, max_size=3),
  )
  return st.one_of(preterminal, inner)


TREES = _trees(3)


@SETTINGS
@given(forest=st.lists(TREES, min_size=1, max_size=4), gaps=st.lists(st.integers(0, 3), min_size=5))
def test_printed_trees_parse_back_with_the_line_each_starts_on(forest, gaps):
  text, starts = "", []
  for i, tree in enumerate(forest):
    text += "\n" * gaps[i] + " "
    starts.append(text.count("\n") + 1)
    text += str(tree).replace(" (", "\n  (", gaps[i + 1] % 2)  # a line break inside, sometimes
  got = list(trees.parse_brackets(text))
  assert [t for t, _ in got] == forest
  assert [line for _, line in got] == starts


def _bracket_reference(tokens: list[str]) -> str | None:
  """Whether a token sequence ('(' , ')', words) is well formed, by counting: None if it
  is, else the kind of error ('close', 'outside', 'open', 'empty', 'mixed')."""
  depth, frames = 0, []  # per open bracket: [children count, words count, label seen]
  for i, tok in enumerate(tokens):
    if tok == "(":
      if frames:
        frames[-1][0] += 1
      frames.append([0, 0, False])
      depth += 1
    elif tok == ")":
      if depth == 0:
        return "close"
      children, words, _ = frames.pop()
      depth -= 1
      if children == 0:
        return "empty"
      if words and children > 1:
        return "mixed"
    elif depth == 0:
      return "outside"
    elif tokens[i - 1] == "(":
      frames[-1][2] = True  # its label
    else:
      frames[-1][0] += 1
      frames[-1][1] += 1
  return "open" if depth else None


MESSAGES = {
  "close": "closes no open bracket",
  "outside": "outside any bracket",
  "open": "is never closed",
  "empty": "empty bracket",
  "mixed": "beside others",
}


@SETTINGS
@given(st.lists(st.sampled_from(["(", "(", ")", ")", "NP", "w"]), max_size=14))
def test_any_bracket_sequence_parses_exactly_when_it_is_well_formed(tokens):
  text = " ".join(tokens)
  want = _bracket_reference(tokens)
  if want is None:
    forest = list(trees.parse_brackets(text))
    assert " ".join(" ".join(str(t).replace("(", "( ").replace(")", " )").split())
                    for t, _ in forest) == " ".join(tokens)  # fmt: skip
  else:
    with pytest.raises(trees.BracketError, match=MESSAGES[want]):
      list(trees.parse_brackets(text))


# --- --config.FIELD=VALUE overrides ----------------------------------------------------------

NAMES = st.sampled_from(["model", "data", "d_ff", "seed", "vocab_size", "alpha", "tag"])


def _nested(depth: int) -> st.SearchStrategy:
  leaf = st.one_of(st.integers(), st.booleans(), st.text(max_size=3))
  if depth == 0:
    return leaf
  return st.one_of(leaf, st.dictionaries(NAMES, _nested(depth - 1), max_size=4))


def _reference_unknown(config: dict, path: list[str]) -> str | None:
  """Where a dotted override path leaves the config's fields: None if every part names a
  field; else ('leaf', where) when it walks into a value, ('missing', where, part)."""
  node, where = config, "config"
  for part in path:
    if not isinstance(node, dict):
      return f"{where} is "
    if part not in node:
      return f"{where} has no field {part!r}"
    node, where = node[part], f"{where}.{part}"
  return None


@settings(SETTINGS, max_examples=60)
@given(
  config=st.dictionaries(NAMES, _nested(2), min_size=1, max_size=5),
  path=st.lists(NAMES, min_size=1, max_size=3),
  negated=st.booleans(),
  others=st.lists(st.sampled_from(["--experiment=tiny", "--workdir=/w", "-v", "--config"])),
)
def test_an_override_of_a_field_the_config_lacks_is_named_with_where(config, path, negated, others):
  arg = f"--{'no' if negated else ''}config.{'.'.join(path)}" + ("" if negated else "=1")
  got = common.unknown_override(ml_collections.ConfigDict(config), [*others, arg])
  want = _reference_unknown(config, path)
  if want is None:
    assert got is None
  else:
    assert got is not None and got.startswith(f"{arg}: {want}"), (got, want)
    assert "\n" not in got


# --- the workdir's files: temporaries of killed writers, records cut by a kill -----------------

FILE_NAMES = st.sampled_from(["config.json", "best.json", "selected.json", "vocab.model", "x"])


@SETTINGS
@given(
  names=st.lists(FILE_NAMES, min_size=1, max_size=3, unique=True),
  temporaries=st.lists(st.tuples(FILE_NAMES, st.booleans()), max_size=6),
  others=st.lists(
    st.sampled_from(["config.json", "config.json.tmp", "xconfig.json.tmp-a", "checkpoints"]),
    max_size=3,
    unique=True,
  ),
)
def test_stale_temporaries_of_the_named_files_and_only_those_are_removed(
  names, temporaries, others
):
  from t2t_jax.run import files

  with tempfile.TemporaryDirectory() as tmp:
    made = {}
    for name, dotted in temporaries:
      entry = ("." if dotted else "") + files.temporary_name(name)
      made[entry] = name
    for entry in [*made, *others]:
      open(os.path.join(tmp, entry), "w").close()
    removed = files.remove_stale_temporaries(tmp, tuple(names))
    want = sorted(entry for entry, name in made.items() if name in names)
    assert removed == want
    assert sorted(os.listdir(tmp)) == sorted(set(made) - set(want) | set(others))


RECORD = st.dictionaries(
  st.sampled_from(["step", "loss", "dev_bleu", "note"]),
  st.one_of(st.integers(-5, 10**6), st.floats(allow_nan=False), st.text(max_size=4)),
  min_size=1,
)


@SETTINGS
@given(
  records=st.lists(RECORD, max_size=5),
  cut=st.integers(0, 40),
  ended=st.booleans(),
)
def test_metrics_records_are_read_back_and_a_last_line_cut_by_a_kill_is_dropped(
  records, cut, ended
):
  """A kill mid-append leaves the last record cut short (with or without its newline); the
  reader returns every whole record and says the last line was incomplete."""
  import json

  from t2t_jax.run import files

  lines = [json.dumps(r) for r in records]
  text = "".join(line + "\n" for line in lines)
  last = json.dumps({"step": 7, "loss": 1.5})
  partial = last[: cut % len(last)]  # a proper prefix: never a whole record
  if partial.strip():
    text += partial + ("\n" if ended else "")
  with _file(text.encode("utf-8")) as path:
    got, complete = files.read_json_lines(path)
  assert got == records
  assert complete == (not partial.strip())
