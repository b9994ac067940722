"""Decoding constraints (t2t_jax.decoding.constraints) against a Python automaton written from
their rules, and random constrained walks: every walk that samples only allowed tokens ends
in a well-formed tree over exactly the source's words."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t_jax.data import trees
from t2t_jax.decoding import constraints
from t2t_jax.tokens import EOS_ID, NUM_RESERVED, PAD_ID

LABELS = ["NP", "S", "VP"]
WORDS = ["the", "dog", "ran", "<unk-cap>"]


def _pieces(leaves: str, positions: int = 12) -> list[str]:
  """A small parsing vocabulary: the reserved ids, brackets, leaf symbols, then words; a
  '(X' without ')X' is not a label."""
  pieces = ["<pad>", "</s>", "<s>", "<unk>"]
  pieces += ["(" + label for label in LABELS] + [")" + label for label in LABELS] + ["(X"]
  if leaves == "xx":
    pieces.append("XX")
  if leaves == "positions":
    pieces += [trees.position_symbol(k) for k in range(1, positions + 1)]
  return pieces + WORDS


class Reference:
  """The rules of TreeConstraint, one sentence at a time, with Python lists."""

  def __init__(self, pieces, leaves, words, limit, max_depth, max_opens=0):
    self.pieces, self.leaves, self.words = pieces, leaves, words
    self.limit, self.max_depth, self.max_opens = limit, max_depth, max_opens
    self.stack, self.out, self.done = [], [], False  # stack: [label, holds a leaf]
    self.count = 0
    self.run = 0  # opening brackets since the last leaf or closing bracket

  def allowed(self) -> set[int]:
    if self.done:
      return {PAD_ID, EOS_ID}
    left, depth, length = len(self.words) - self.count, len(self.stack), len(self.out)
    room = self.limit - length - 1
    ok = set()
    for i, p in enumerate(self.pieces):
      if p.startswith("(") and ")" + p[1:] in self.pieces:
        in_run = not self.max_opens or self.run < self.max_opens
        deeper = depth < self.max_depth and left + depth + 2 <= room
        if (depth or not length) and left and deeper and in_run:
          ok.add(i)
      elif p.startswith(")"):
        innermost = depth and self.stack[-1] == [p[1:], True]
        if innermost and (depth > 1 or not left) and left + depth <= room:
          ok.add(i)
      elif i >= NUM_RESERVED and depth and left and left + depth <= room and self._is_next_leaf(i):
        ok.add(i)
    if not left and not depth:
      ok.add(EOS_ID)
    return ok or {EOS_ID}

  def _is_next_leaf(self, i: int) -> bool:
    if self.leaves == "xx":
      return self.pieces[i] == "XX"
    if self.leaves == "positions":
      n = sum(p.startswith("XX") for p in self.pieces)
      return self.pieces[i] == trees.position_symbol(min(self.count + 1, n))
    return i == self.words[self.count]

  def advance(self, token: int) -> None:
    if self.done or token == PAD_ID:
      return
    self.out.append(token)
    piece = self.pieces[token]
    if token == EOS_ID:
      self.done = True
    elif piece.startswith("(") and ")" + piece[1:] in self.pieces:
      self.stack.append([piece[1:], False])
      self.run += 1
    elif piece.startswith(")"):
      self.run = 0
      self.stack.pop()
      if self.stack:
        self.stack[-1][1] = True
    else:
      self.run = 0
      self.count += 1
      self.stack[-1][1] = True


def _sources(rng: np.random.Generator, batch: int, src_len: int, pieces) -> np.ndarray:
  """Random EOS-terminated, PAD-padded sources of word ids (some empty)."""
  word_ids = [pieces.index(w) for w in WORDS]
  out = np.zeros((batch, src_len), np.int32)
  for row in range(batch):
    n = int(rng.integers(0, src_len))
    out[row, :n] = rng.choice(word_ids, n)
    out[row, n] = EOS_ID
  return out


def _walk(leaves, seed, batch=24, src_len=8, max_depth=5, tight=False, max_opens=0):
  """Random walks under the constraint, each step checked against the reference; returns
  the sources, the limits and the token sequences."""
  pieces = _pieces(leaves)
  c = constraints.TreeConstraint.for_symbols(pieces, leaves, max_depth, max_opens)
  rng = np.random.default_rng(seed)
  sources = _sources(rng, batch, src_len, pieces)
  n = (sources != PAD_ID).sum(1) - 1
  extra = rng.integers(0, 3, batch) if tight else rng.integers(0, 3 * src_len, batch)
  limits = np.maximum(n + 3, 1) + extra
  state = c.init(jnp.asarray(sources), jnp.asarray(limits, jnp.int32))
  refs = [
    Reference(pieces, leaves, list(sources[r, : n[r]]), int(limits[r]), max_depth, max_opens)
    for r in range(batch)
  ]
  allowed, advance = jax.jit(c.allowed), jax.jit(c.advance)
  steps = int(limits.max()) + 2
  for _ in range(steps):
    mask = np.asarray(allowed(state))
    tokens = []
    for r, ref in enumerate(refs):
      assert set(np.flatnonzero(mask[r])) == ref.allowed(), (r, ref.out)
      tokens.append(int(rng.choice(np.flatnonzero(mask[r]))))
      ref.advance(tokens[-1])
    state = advance(state, jnp.asarray(tokens, jnp.int32))
    for leaf in jax.tree_util.tree_leaves(state):
      assert leaf.shape[0] == batch
  return pieces, sources, n, limits, [ref.out for ref in refs]


@pytest.mark.parametrize("leaves", constraints.LEAF_FORMS)
def test_allowed_and_advance_follow_the_reference_and_walks_end_in_trees(leaves):
  for seed, tight, max_opens in ((0, False, 0), (1, True, 0), (2, False, 2)):
    pieces, sources, n, limits, outs = _walk(leaves, seed, tight=tight, max_opens=max_opens)
    for r, out in enumerate(outs):
      assert out and out[-1] == EOS_ID and len(out) <= limits[r], out
      symbols = [pieces[t] for t in out[:-1]]
      words = [f"w{k}" for k in range(n[r])]
      tree, repairs = trees.rebuild(symbols, words, "xx" if leaves == "words" else leaves)
      assert len([s for s in symbols if not trees.is_bracket(s)]) == n[r]
      assert (repairs.unclosed, repairs.unopened, repairs.mislabelled, repairs.empty) == (
        0,
        0,
        0,
        0,
      ), symbols
      assert tree.leaves() == words and (n[r] == 0 or tree.label != "TOP"), symbols
      if leaves == "words":  # the copied leaves are the source's tokens in order
        leaf_ids = [t for t, s in zip(out, symbols) if not trees.is_bracket(s)]
        assert leaf_ids == list(sources[r, : n[r]])
      if max_opens:  # no longer run of opening brackets than allowed
        runs = "".join("(" if s.startswith("(") else " " for s in symbols).split()
        assert max(map(len, runs), default=0) <= max_opens, symbols
      if leaves == "positions":
        assert [s for s in symbols if not trees.is_bracket(s)] == [
          trees.position_symbol(k + 1) for k in range(n[r])
        ]


def test_the_tightest_limit_gives_one_flat_constituent():
  pieces = _pieces("xx")
  c = constraints.TreeConstraint.for_symbols(pieces, "xx")
  sources = jnp.asarray([[4, 4, 4, EOS_ID, 0]], jnp.int32)  # three words
  assert c.min_length(3) == 6
  state = c.init(sources, jnp.asarray([6], jnp.int32))
  out = []
  for _ in range(6):
    mask = np.asarray(c.allowed(state))[0]
    token = int(np.flatnonzero(mask)[0])
    if len(out) == 1:  # a second opening bracket could not be closed in time
      assert not any(mask[pieces.index("(" + label)] for label in LABELS)
    out.append(token)
    state = c.advance(state, jnp.asarray([token]))
  assert [pieces[t] for t in out] == ["(NP", "XX", "XX", "XX", ")NP", "</s>"]


def test_a_limit_too_short_still_ends_with_eos():
  pieces = _pieces("xx")
  c = constraints.TreeConstraint.for_symbols(pieces, "xx")
  state = c.init(jnp.asarray([[4, 4, 4, EOS_ID]], jnp.int32), jnp.asarray([4], jnp.int32))
  mask = np.asarray(c.allowed(state))[0]
  assert list(np.flatnonzero(mask)) == [EOS_ID]


def test_for_symbols_reads_labels_and_leaves_from_the_vocabulary():
  pieces = _pieces("positions", positions=5)
  c = constraints.TreeConstraint.for_symbols(pieces, "positions")
  assert [pieces[i] for i in c.open_ids] == ["(NP", "(S", "(VP"]  # no ')X': '(X' is not one
  assert [pieces[i] for i in c.close_ids] == [")NP", ")S", ")VP"]
  assert [pieces[i] for i in c.leaf_ids] == [trees.position_symbol(k) for k in range(1, 6)]
  with pytest.raises(ValueError, match="needs leaf_ids"):
    constraints.TreeConstraint.for_symbols(_pieces("words"), "xx")


def _force_prefix_reference(step: int, prefix: np.ndarray, vocab: int) -> np.ndarray:
  """rules.ForcePrefix's rule: inside the prefix only its token, else everything."""
  length = int((prefix != PAD_ID).sum())
  if step < length:
    return np.arange(vocab) == prefix[step]
  return np.ones(vocab, bool)


def test_prefix_constraint_forces_the_prefix_then_frees():
  rng = np.random.default_rng(0)
  vocab, batch = 11, 6
  prefix = np.zeros((batch, 4), np.int32)
  for r in range(batch):
    k = int(rng.integers(0, 5))
    prefix[r, :k] = rng.integers(NUM_RESERVED, vocab, k)
  c = constraints.PrefixConstraint(vocab)
  state = c.init(jnp.zeros((batch, 3), jnp.int32), prefix=jnp.asarray(prefix))
  for step in range(6):
    mask = np.asarray(c.allowed(state))
    expected = np.stack([_force_prefix_reference(step, prefix[r], vocab) for r in range(batch)])
    np.testing.assert_array_equal(mask, expected)
    tokens = [int(rng.choice(np.flatnonzero(m & (np.arange(vocab) != EOS_ID)))) for m in mask]
    state = c.advance(state, jnp.asarray(tokens, jnp.int32))


def test_vocabulary_constraint_and_all_of():
  vocab = 12
  c = constraints.VocabularyConstraint(vocab, (5, 7))
  state = c.init(jnp.zeros((2, 3), jnp.int32))
  mask = np.asarray(c.allowed(state))
  assert [list(np.flatnonzero(m)) for m in mask] == [[EOS_ID, 5, 7]] * 2
  state = c.advance(state, jnp.asarray([EOS_ID, 5]))
  mask = np.asarray(c.allowed(state))
  assert [list(np.flatnonzero(m)) for m in mask] == [[PAD_ID, EOS_ID], [EOS_ID, 5, 7]]
  # A prefix of 6 while the vocabulary allows only 5 and 7: nothing is left but EOS.
  both = constraints.AllOf((c, constraints.PrefixConstraint(vocab)))
  state = both.init(jnp.zeros((2, 3), jnp.int32), prefix=jnp.asarray([[7, 0], [6, 0]]))
  mask = np.asarray(jax.jit(both.allowed)(state))
  assert [list(np.flatnonzero(m)) for m in mask] == [[7], [EOS_ID]]
  state = both.advance(state, jnp.asarray([7, EOS_ID]))
  mask = np.asarray(both.allowed(state))
  assert [list(np.flatnonzero(m)) for m in mask] == [[EOS_ID, 5, 7], [PAD_ID, EOS_ID]]


# --- sentences whose last leaf is the last entry of its table ---------------------------------


def _well_formed(leaf_tokens, opens, closes, max_depth, limit) -> set[tuple[int, ...]]:
  """Every well-formed output over `leaf_tokens` (each word's leaf token, in order) of at
  most `limit` tokens with EOS, written from the grammar alone: one labelled root over every
  leaf, no empty constituent, at most `max_depth` brackets open at once."""
  if not leaf_tokens:
    return {(EOS_ID,)}
  budget = limit - 1  # tokens before EOS

  @functools.cache
  def constituents(i, j, level):  # one bracket pair at `level` (1: the root) over leaves i..j-1
    if level > max_depth:
      return ()
    inner = forests(i, j, level + 1)
    return tuple(
      (o,) + body + (c,) for body in inner for o, c in zip(opens, closes) if len(body) + 2 <= budget
    )

  @functools.cache
  def forests(i, j, level):  # non-empty sequences of leaves and constituents at `level`
    out = []
    for k in range(i + 1, j + 1):
      firsts = constituents(i, k, level) + (((leaf_tokens[i],),) if k == i + 1 else ())
      rests = forests(k, j, level) if k < j else ((),)
      out += [f + r for f in firsts for r in rests if len(f) + len(r) <= budget]
    return tuple(out)

  return {tree + (EOS_ID,) for tree in constituents(0, len(leaf_tokens), 1)}


def _every_output(c, pieces, leaves, sources, limits, max_depth, capacity=512):
  """Every output the constraint lets a search emit from each source, taking every allowed
  token at every step (breadth first, the state gathered by parent as a search does, in
  `capacity` rows so that each function compiles once), each step's allowed set checked
  against `Reference`; {row: set of outputs}."""
  n = np.asarray(constraints.source_lengths(jnp.asarray(sources)))
  at = np.arange(capacity) % len(sources)  # the rows beyond the frontier are ignored
  state = c.init(jnp.asarray(sources[at]), jnp.asarray(limits[at], jnp.int32))
  allowed_fn = jax.jit(c.allowed)

  @jax.jit
  def grow(state, parents, tokens):
    return c.advance(jax.tree_util.tree_map(lambda x: x[parents], state), tokens)

  frontier = [(row, ()) for row in range(len(sources))]
  outputs = {row: set() for row in range(len(sources))}
  while frontier:
    mask = np.asarray(allowed_fn(state))
    parents, tokens, grown = [], [], []
    for k, (row, prefix) in enumerate(frontier):
      ref = Reference(pieces, leaves, list(sources[row, : n[row]]), int(limits[row]), max_depth)
      for token in prefix:
        ref.advance(token)
      allowed = set(np.flatnonzero(mask[k]).tolist())
      assert allowed == ref.allowed(), (row, [pieces[t] for t in prefix])
      for token in sorted(allowed):
        if token == EOS_ID:
          outputs[row].add(prefix + (EOS_ID,))
        else:
          parents.append(k)
          tokens.append(token)
          grown.append((row, prefix + (token,)))
    assert len(grown) <= capacity
    pad = capacity - len(grown)
    parents, tokens = np.asarray(parents + [0] * pad), np.asarray(tokens + [PAD_ID] * pad)
    state = grow(state, jnp.asarray(parents, jnp.int32), jnp.asarray(tokens, jnp.int32))
    frontier = grown
  return outputs


def test_the_last_leaf_at_the_edge_of_its_table_is_the_right_one():
  """'words': a source that fills its row (no EOS left in it, so every column is a word)
  copies its last word from the last column; 'positions': a sentence of as many words as
  there are XXk symbols ends on the last one, and a longer one repeats it. Every output the
  constraint allows, over every path, is checked step by step against `Reference` and, as a
  set, against every well-formed tree over exactly the source's words (`_well_formed`), so a
  bound that clamps the leaf index one entry short of its table fails here. (An
  EOS-terminated source never reaches the last column: only a full row tests 'words'.)"""
  max_depth = 3
  the, dog, ran, unk = WORDS
  end, pad = "</s>", "<pad>"
  for leaves, positions, rows in (
    (
      "words",
      12,
      [[the, dog, ran, unk], [ran, the, dog, the], [dog, unk, ran, end], [ran, the, end, pad]],
    ),
    (
      "positions",
      4,
      [
        [the, dog, ran, unk, end, pad],
        [dog, the, unk, ran, the, end],
        [ran, unk, the, end, pad, pad],
      ],
    ),
  ):
    pieces = _pieces(leaves, positions)
    sources = np.asarray([[pieces.index(w) for w in row] for row in rows], np.int32)
    c = constraints.TreeConstraint.for_symbols(pieces, leaves, max_depth)
    opens = [pieces.index("(" + label) for label in LABELS]
    closes = [pieces.index(")" + label) for label in LABELS]
    n = np.asarray(constraints.source_lengths(jnp.asarray(sources)))
    # The edge is reached: a source as long as its row ('words'), or as the XXk table.
    edge = sources.shape[1] if leaves == "words" else len(c.leaf_ids)
    assert edge in n and max(n) >= edge
    limits = np.asarray([c.min_length(k) + 2 for k in n])  # room for one more constituent
    found = _every_output(c, pieces, leaves, sources, limits, max_depth)
    for row, k in enumerate(n):
      if leaves == "words":
        leaf_tokens = tuple(int(t) for t in sources[row, :k])
      else:
        symbols = [trees.position_symbol(min(i + 1, positions)) for i in range(k)]
        leaf_tokens = tuple(pieces.index(s) for s in symbols)
      expected = _well_formed(leaf_tokens, opens, closes, max_depth, int(limits[row]))
      assert len(expected) > len(LABELS)  # flat trees and trees with one inner constituent
      assert found[row] == expected, (leaves, row, sorted(found[row] ^ expected)[:3])
