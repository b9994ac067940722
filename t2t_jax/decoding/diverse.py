"""Diverse beam search (Vijayakumar et al. 2016, Hamming diversity; fairseq's
DiverseBeamSearch): the beam is split into `groups` of beam_size / groups hypotheses, and at
each step the groups choose their extensions in turn, each group's candidates lowered by
`strength` for every time a group before it chose the same token at this step. The
lowering only ranks the candidates: the log-probabilities kept and the scores returned
stay the model's. A way of choosing the live set (`beam.beam_step`), not a decoding
rule: the rules (decoding/rules.py) have already removed what may not be chosen."""

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

NEG_INF = float("-inf")


class Diversity(NamedTuple):
  """`SearchConfig`'s fields of the same names (checked there): diverse_groups, 1 is plain
  beam search; diversity_strength, the penalty per earlier choice of a token."""

  diverse_groups: int = 1
  diversity_strength: float = 0.5


PLAIN = Diversity()  # plain beam search


def first_of_each_group(beam_size: int, groups: int) -> jax.Array:
  """float32 [beam]: 0 for the first hypothesis of each group, -inf for the others (all
  start identical; only one per group expands at the first step)."""
  per_group = beam_size // groups
  return jnp.where(jnp.arange(beam_size) % per_group == 0, 0.0, NEG_INF)


def diverse_top(
  candidates: jax.Array, tokens: jax.Array, diversity: Diversity
) -> tuple[jax.Array, jax.Array]:
  """The live set of one step: candidates float32 [batch, beam, k] (each hypothesis's k best
  extensions' log-probabilities, -inf where it may not go on) and their tokens int32
  [batch, beam, k] -> (log-probs [batch, beam], indices into the flattened beam * k
  candidates). Group g's beam / groups hypotheses keep their best extensions by
  log-prob - strength * (times a group before g chose that token at this step). k >= beam
  keeps this exact: at most beam - beam / groups tokens are lowered."""
  batch, beam, k = candidates.shape
  size = beam // diversity.diverse_groups
  chosen: list[jax.Array] = []
  log_probs, indices = [], []
  for g in range(diversity.diverse_groups):
    cand = candidates[:, g * size : (g + 1) * size].reshape(batch, -1)
    toks = tokens[:, g * size : (g + 1) * size].reshape(batch, -1)
    ranked = cand
    if chosen:
      before = jnp.concatenate(chosen, axis=1)  # [batch, g * size]
      count = jnp.sum(toks[:, :, None] == before[:, None, :], axis=-1)
      ranked = cand - diversity.diversity_strength * count
    _, top = lax.top_k(ranked, size)
    picked = jnp.take_along_axis(cand, top, axis=1)
    chosen.append(jnp.where(picked > NEG_INF, jnp.take_along_axis(toks, top, axis=1), -1))
    log_probs.append(picked)
    indices.append(top + g * size * k)
  return jnp.concatenate(log_probs, axis=1), jnp.concatenate(indices, axis=1)
