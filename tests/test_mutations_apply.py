"""Every mutation of tools/mutation_check.py still applies: its text occurs exactly once in
its file, so a change of the code it mutates cannot silently retire it, and its `first`
test files exist."""

import pathlib

import pytest

from tools.mutations import all_mutations

REPO = pathlib.Path(__file__).resolve().parents[1]
MUTATIONS = all_mutations()


@pytest.mark.parametrize("mutation", MUTATIONS, ids=lambda m: m.name)
def test_the_mutation_applies_once_and_names_existing_tests(mutation):
  text = (REPO / mutation.path).read_text(encoding="utf-8")
  assert text.count(mutation.old) == 1, (mutation.name, mutation.path)
  assert mutation.old != mutation.new
  for first in mutation.first:
    assert (REPO / first.split("::")[0]).is_file(), (mutation.name, first)
