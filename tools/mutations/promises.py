"""User-visible promises that only a targeted test would notice breaking: one-token changes
the quick loop must catch."""

from tools.mutations import Mutation

M = Mutation

MUTATIONS = (
  M(
    "store_key_without_source_digest",
    "a stored program's key leaves out the t2t_jax sources: an upgrade runs the old code's",
    "t2t_jax/compilation.py",
    "    _sources_digest(),\n",
    "",
    ("tests/test_compilation.py",),
  ),
)
