"""The docs: a name they use that the code no longer has (a renamed flag, a moved function, a
checkpoint choice left out) must fail tests/test_docs.py's quick tests."""

from tools.mutations import Mutation

M = Mutation
FIRST = ("tests/test_docs.py",)
MUTATIONS = (
  M(
    "docs_stale_flag",
    "docs/translation.md names t2t-translate's --prefix by an old name, --prefixes",
    "docs/translation.md",
    "`--prefix` file, the task's grammar",
    "`--prefixes` file, the task's grammar",
    FIRST,
  ),
  M(
    "docs_stale_function",
    "docs/parsing.md names the forced prefix's rule by a function that moved away",
    "docs/parsing.md",
    "the semantics of\n`rules.ForcePrefix`)",
    "the semantics of\n`search.force_prefix`)",
    FIRST,
  ),
  M(
    "docs_checkpoint_list_without_ema",
    "docs/translation.md's list of --checkpoint choices leaves out ema",
    "docs/translation.md",
    "a step, `ema` (the moving average of the parameters\nkept with `config.ema_decay`), ",
    "a step, ",
    FIRST,
  ),
)
