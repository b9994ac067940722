"""Constituency trees as sequences: Penn Treebank brackets in, linearized trees out and back.

The paper's section 6.3 parses English by translation: the source is the sentence's words and
the target is its tree written as a sequence in the style of Vinyals et al. 2015 ("Grammar as
a Foreign Language"), with labelled opening and closing brackets and every part-of-speech tag
normalized to one symbol, XX; the words appear on the source side only:

    (S (NP (NNP John)) (VP (VBZ has) (NP (DT a) (NN dog))) (. .))
    source: John has a dog .
    target: (S (NP XX )NP (VP XX (NP XX XX )NP )VP XX )S

With XX at every leaf nothing in the target says which word the decoder has reached, so
`linearize` also writes two other leaf forms (`TREE_LEAVES`, chosen by
`config.data.tree_leaves`):

    xx:        (S (NP XX )NP (VP XX (NP XX XX )NP )VP XX )S
    words:     (S (NP John )NP (VP has (NP a dog )NP )VP . )S     the decoder copies the source
    positions: (S (NP XX1 )NP (VP XX2 (NP XX3 XX4 )NP )VP XX5 )S   each leaf carries its index

Everything here is pure: `parse_brackets` reads bracketed text, `clean` removes empty elements
and function tags, `linearize` writes the target, and `rebuild` turns any model output back
into a tree over the input words, repairing what does not fit and counting the repairs.
Whatever the leaf form, every token that is not a bracket is one leaf, in order.
"""

import dataclasses
import re
from collections.abc import Iterator, Sequence
from typing import Union

from t2t_jax.data.symbols import word_class

XX = "XX"  # the one part-of-speech symbol of the target side
TREE_LEAVES = ("xx", "words", "positions")  # the target's leaf forms (config.data.tree_leaves)
NONE_TAG = "-NONE-"  # empty elements (traces, null complementizers)
ROOT_LABELS = ("", "TOP")  # the treebank's unlabelled outermost bracket, or TOP


@dataclasses.dataclass(frozen=True)
class Tree:
  """A constituent: `label` and its children (Trees, or one word string for a preterminal)."""

  label: str
  children: tuple[Union["Tree", str], ...]

  @property
  def is_preterminal(self) -> bool:
    return len(self.children) == 1 and isinstance(self.children[0], str)

  def leaves(self) -> list[str]:
    if self.is_preterminal:
      return [self.children[0]]
    return [word for child in self.children for word in child.leaves()]

  def tags(self) -> list[str]:
    """The preterminal labels, one per leaf."""
    if self.is_preterminal:
      return [self.label]
    return [tag for child in self.children for tag in child.tags()]

  def __str__(self) -> str:
    """One-line bracketed form: (S (NP (NNP John)) ...)."""
    inner = " ".join(str(child) for child in self.children)
    return f"({self.label} {inner})" if self.label else f"({inner})"


class BracketError(ValueError):
  """Text that is not a well-formed bracketed tree; says what and at which token."""


_TOKEN_RE = re.compile(r"\(|\)|[^\s()]+")


def parse_brackets(text: str) -> Iterator[tuple[Tree, int]]:
  """Yields (tree, line number where it starts) for every bracketed tree in `text`.

  The treebank's `.mrg` format: `(LABEL child ...)`, a preterminal `(TAG word)`, and an
  outermost bracket without a label. Raises BracketError on unbalanced brackets, text outside
  any tree, an empty bracket, or a bracket holding a word beside other children.
  """
  stack: list[tuple[str, list, int]] = []
  line, counted_to, previous = 1, 0, ""
  for match in _TOKEN_RE.finditer(text):
    token = match.group()
    line += text.count("\n", counted_to, match.start())
    counted_to = match.start()
    after_open, previous = previous == "(", token
    if token == "(":
      stack.append(("", [], line))
    elif token == ")":
      if not stack:
        raise BracketError(f"line {line}: ')' closes no open bracket")
      label, children, start = stack.pop()
      tree = _node(label, children, start)
      if stack:
        stack[-1][1].append(tree)
      else:
        yield tree, start
    elif not stack:
      raise BracketError(f"line {line}: {token!r} outside any bracket")
    elif after_open:
      stack[-1] = (token, stack[-1][1], stack[-1][2])  # the token right after '(' is its label
    else:
      stack[-1][1].append(token)
  if stack:
    raise BracketError(f"line {stack[-1][2]}: bracket opened here is never closed")


def _node(label: str, children: list, line: int) -> Tree:
  if not children:
    raise BracketError(f"line {line}: empty bracket ({label})")
  words = [c for c in children if isinstance(c, str)]
  if words and len(children) > 1:
    raise BracketError(f"line {line}: ({label} ...) holds the word {words[0]!r} beside others")
  return Tree(label, tuple(children))


def base_label(label: str) -> str:
  """NP-SBJ-1 -> NP, NP=2 -> NP, PP-LOC -> PP; tags starting with '-' (-NONE-, -LRB-) kept.

  EVALB's `modify_label`: everything from the first '-' or '=' is a function tag or index.
  """
  if label.startswith("-"):
    return label
  return re.split(r"[-=]", label, maxsplit=1)[0]


def clean(tree: Tree) -> Tree | None:
  """The tree the parser learns: no empty elements, no function tags, no root bracket.

  Removes -NONE- preterminals and the constituents left without words, strips function tags
  and indices from phrase labels (`base_label`), and drops the unlabelled (or TOP) outermost
  bracket when it holds one constituent. Returns None for a tree with no words left.
  """
  kept = _drop_empty(tree)
  if kept is None:
    return None
  if kept.label in ROOT_LABELS and len(kept.children) == 1 and not kept.is_preterminal:
    return kept.children[0]
  return Tree("TOP", kept.children) if kept.label == "" else kept


def _drop_empty(tree: Tree) -> Tree | None:
  if tree.is_preterminal:
    return None if tree.label == NONE_TAG else tree
  children = tuple(c for c in (_drop_empty(child) for child in tree.children) if c is not None)
  return Tree(base_label(tree.label), children) if children else None


def is_bracket(symbol: str) -> bool:
  """'(L' or ')L': an opening or closing labelled bracket; every other target token is a leaf."""
  return len(symbol) > 1 and symbol[0] in "()"


def position_symbol(index: int) -> str:
  """The `positions` leaf of the index-th word (1-based): XX1, XX2, ..."""
  return f"{XX}{index}"


def leaf_symbol(leaves: str, index: int, word: str) -> str:
  """The target token of the index-th (1-based) word in leaf form `leaves` (TREE_LEAVES)."""
  if leaves == "xx":
    return XX
  if leaves == "words":
    return word
  if leaves == "positions":
    return position_symbol(index)
  raise ValueError(f"tree leaves {leaves!r} must be one of {TREE_LEAVES}")


def linearize(tree: Tree, leaves: str = "xx") -> tuple[list[str], list[str]]:
  """(words, target symbols) of a cleaned tree: '(L', the children, ')L'; one leaf token per
  word, of the form `leaves` (XX, the word itself, or XX<k> for the k-th word)."""
  if leaves not in TREE_LEAVES:
    raise ValueError(f"tree leaves {leaves!r} must be one of {TREE_LEAVES}")
  words, symbols = [], []

  def walk(node: Tree) -> None:
    if node.is_preterminal:
      words.append(node.children[0])
      if leaves == "words" and is_bracket(node.children[0]):
        raise ValueError(f"the word {node.children[0]!r} reads as a bracket in a target")
      symbols.append(leaf_symbol(leaves, len(words), node.children[0]))
      return
    symbols.append("(" + node.label)
    for child in node.children:
      walk(child)
    symbols.append(")" + node.label)

  walk(tree)
  return words, symbols


def strip_tags(tree: Tree) -> Tree:
  """The tree with every part-of-speech tag replaced by XX (what `rebuild` can recover)."""
  if tree.is_preterminal:
    return Tree(XX, tree.children)
  return Tree(tree.label, tuple(strip_tags(child) for child in tree.children))


@dataclasses.dataclass
class Repairs:
  """What `rebuild` had to change to make a tree of one output (counts within the output)."""

  unclosed: int = 0  # opening brackets never closed (closed at the end)
  unopened: int = 0  # closing brackets with nothing open (ignored)
  mislabelled: int = 0  # closing bracket whose label differs from the one it closes
  empty: int = 0  # constituents with no words (removed)
  extra_leaves: int = 0  # leaf tokens beyond the number of input words (removed)
  missing_leaves: int = 0  # input words without a leaf token (attached to the top constituent)
  # Leaves in the right place whose token is not that place's (words: neither the word nor
  # its shape class, which is what the word vocabulary decodes a rare word to; positions: not
  # XX<k> for the k-th leaf). They still stand for the k-th word.
  wrong_leaf_tokens: int = 0

  @property
  def rebalanced(self) -> bool:
    return bool(self.unclosed or self.unopened)

  @property
  def wrong_leaf_count(self) -> bool:
    return bool(self.extra_leaves or self.missing_leaves)


def _leaf_matches(leaves: str, symbol: str, index: int, word: str) -> bool:
  if leaves == "words":
    return symbol in (word, word_class(word))
  if leaves == "positions":
    return symbol == position_symbol(index)
  return symbol == XX


def rebuild(
  symbols: Sequence[str] | str, words: Sequence[str], leaves: str = "xx"
) -> tuple[Tree, Repairs]:
  """The tree a target sequence describes, over `words`, and the repairs it took.

  Every token that is not a bracket ('(L', ')L') stands for one word, in order, whatever the
  leaf form `leaves` (TREE_LEAVES): the k-th leaf token, XX, a copied word or XX<k>, gets the
  k-th word, and one that is not the form's token for it is counted (`wrong_leaf_tokens`).
  The tree's leaves are preterminals (XX word), the gold tree's with its tags stripped.
  Brackets that do not close are closed at the end and closing brackets with nothing open are
  ignored (a closing bracket always closes the innermost open one, whatever its label). Leaves
  beyond
  the number of words are dropped; words without a leaf are attached, in order, to the end of
  the top constituent. Constituents left without words are removed. Several top-level pieces
  are joined under TOP, which scoring does not count.
  """
  if isinstance(symbols, str):
    symbols = symbols.split()
  repairs = Repairs()
  if leaves not in TREE_LEAVES:
    raise ValueError(f"tree leaves {leaves!r} must be one of {TREE_LEAVES}")
  stack: list[tuple[str, list]] = [("TOP", [])]
  done = 0  # leaves placed so far
  for symbol in symbols:
    if is_bracket(symbol) and symbol[0] == "(":
      stack.append((symbol[1:], []))
    elif is_bracket(symbol):
      if len(stack) == 1:
        repairs.unopened += 1
        continue
      label, children = stack.pop()
      repairs.mislabelled += symbol[1:] != label
      stack[-1][1].append((label, children))
    elif done < len(words):
      repairs.wrong_leaf_tokens += not _leaf_matches(leaves, symbol, done + 1, words[done])
      stack[-1][1].append(words[done])
      done += 1
    else:
      repairs.extra_leaves += 1
  repairs.unclosed = len(stack) - 1
  while len(stack) > 1:
    label, children = stack.pop()
    stack[-1][1].append((label, children))
  top = stack[0][1]
  missing = list(words[done:])
  repairs.missing_leaves = len(missing)
  if missing:
    target = top[0][1] if len(top) == 1 and not isinstance(top[0], str) else top
    target.extend(missing)
  kept = tuple(c for c in (_to_tree(child, repairs) for child in top) if c is not None)
  if len(kept) == 1 and not kept[0].is_preterminal:
    return kept[0], repairs
  return Tree("TOP", kept), repairs


def _to_tree(node: tuple[str, list] | str, repairs: Repairs) -> Tree | None:
  if isinstance(node, str):
    return Tree(XX, (node,))
  label, children = node
  kept = tuple(c for c in (_to_tree(child, repairs) for child in children) if c is not None)
  if not kept:
    repairs.empty += 1
    return None
  return Tree(label, kept)
