"""The mutations tools/mutation_check.py applies, one module per feature area.

Each module holds a tuple `MUTATIONS` of one-token changes that a careful reviewer would fear
(a wrong translation, the wrong checkpoint, wrong proportions, a stale compiled program);
`ALL` gathers them in a fixed order. A new area is a new module listed in `AREAS`.
"""

import dataclasses
import importlib


@dataclasses.dataclass(frozen=True)
class Mutation:
  name: str
  what: str  # the concept it breaks
  path: str  # relative to the repository root
  old: str  # must occur exactly once in the file
  new: str
  first: tuple[str, ...] = ()  # test files to try before the whole quick loop


# Areas in the order the table lists them; each is tools/mutations/<area>.py.
AREAS = (
  "paper",
  "features",
  "research",
  "decoding",
  "serve",
  "serve_limits",
  "serve_detect",
  "serve_segment",
  "serve_formats",
  "serve_load",
  "serve_page",
  "serve_shapes",
  "cli",
  "configs",
  "threads",
  "promises",
  "docs",
)


def all_mutations() -> tuple[Mutation, ...]:
  found = []
  for area in AREAS:
    found += importlib.import_module(f"tools.mutations.{area}").MUTATIONS
  names = [m.name for m in found]
  dupes = sorted({n for n in names if names.count(n) > 1})
  if dupes:
    raise SystemExit(f"mutation names used twice: {dupes}")
  return tuple(found)
