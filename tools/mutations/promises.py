"""User-visible promises that only a targeted test would notice breaking: one-token changes
the quick loop must catch."""

from tools.mutations import Mutation

M = Mutation

MUTATIONS = ()
