"""No repeated n-grams (Paulus et al. 2018; fairseq's --no-repeat-ngram-size): an output never
holds the same n tokens twice. A decoding rule (decoding/rules.py) with no state of its own:
it reads the tokens each row has taken so far."""

import dataclasses

import jax.numpy as jnp

from t2t_jax.decoding.rules import Choice, PyTree, Stateless, View
from t2t_jax.tokens import EOS_ID


@dataclasses.dataclass(frozen=True)
class NoRepeatNgram(Stateless):
  """Bans, at each step, every token that would complete an n-gram the row already holds:
  token t is banned after ... a_1 .. a_{n-1} when a_1 .. a_{n-1} t occurs earlier in the row.
  With n = 1 no token repeats. EOS is never banned, so a row can always end."""

  n: int

  def __post_init__(self) -> None:
    if self.n < 1:
      raise ValueError(f"no_repeat_ngram={self.n} must be >= 1 (0: no rule)")

  def choice(self, view: View, state: PyTree) -> Choice:
    seqs, step, n = view.seqs, view.step, self.n
    length = seqs.shape[-1]
    starts = jnp.arange(length)
    # The n-gram starting at position s (its last token at s + n - 1) is complete if
    # s + n - 1 < step; it bans its last token when its first n - 1 tokens equal the row's
    # last n - 1 tokens (positions step - n + 1 .. step - 1).
    complete = starts + n - 1 < step
    same = complete[None, :]
    for k in range(n - 1):
      mine = jnp.take(seqs, jnp.clip(starts + k, 0, length - 1), axis=-1)
      last = jnp.take(seqs, jnp.clip(step - n + 1 + k, 0, length - 1), axis=-1)
      same = same & (mine == last[:, None])
    banned_token = jnp.take(seqs, jnp.clip(starts + n - 1, 0, length - 1), axis=-1)
    banned = jnp.zeros((seqs.shape[0], view.vocab), bool)
    rows = jnp.broadcast_to(jnp.arange(seqs.shape[0])[:, None], banned_token.shape)
    banned = banned.at[rows, banned_token].max(same & (step >= n - 1))
    banned = banned.at[:, EOS_ID].set(False)
    return Choice(tokens=~banned)
