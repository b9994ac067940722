"""Shared state touched from several threads: one-token changes the quick loop must catch."""

from tools.mutations import Mutation

M = Mutation

MUTATIONS = ()
