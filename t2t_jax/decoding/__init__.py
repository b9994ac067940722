"""Decoding: greedy and beam search over a `tokens_to_logits(ids, cache)` function (search),
their settings (config.SearchConfig), and the Translator that turns a workdir's checkpoint and
vocabulary into text (translator). `search_batch` decodes one padded batch of a model
without a Translator; it loads on first use, since the translator module brings in the data
package."""

from typing import Any

from t2t_jax.decoding.config import PAPER_SEARCH, SearchConfig

__all__ = ["PAPER_SEARCH", "SearchConfig", "search_batch"]


def __getattr__(name: str) -> Any:
  if name == "search_batch":
    from t2t_jax.decoding.programs import search_batch

    return search_batch
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
