"""The input pipeline: corpus sources, a shared vocabulary, a prepared store, token-budget
batches.

Public surface (see pipeline.py for the flow):
  default_config()                         every data field, with defaults and comments
  get_source(config.data), Source          the source named by config.data.source (sources/)
  get_datasets(config.data, workdir, ...)  -> Datasets (.tokenizer, .train_iter(),
                                              .eval_batches(), .dev_pairs, .test_pairs, .stats)
  load_or_train_tokenizer(config.data, workdir), load_tokenizer(path)
  DataError                                bad input or config (names file/line/flag)
"""

from t2t_jax.data.config import bucket_boundaries, default_config, target_language
from t2t_jax.data.errors import DataError
from t2t_jax.data.sources import Source, get_source
from t2t_jax.data.tokenizer import (
  SentencePieceTokenizer,
  SymbolTokenizer,
  load_or_train_tokenizer,
  load_tokenizer,
  vocab_path,
)


def __getattr__(name: str):
  """The pipeline's names, imported on first use: it pulls in grain, which a process that
  only translates (t2t-translate, the Translator) does not need at start-up."""
  if name in ("Datasets", "DataStats", "get_datasets"):
    from t2t_jax.data import pipeline

    return getattr(pipeline, name)
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
  "bucket_boundaries",
  "default_config",
  "DataError",
  "Datasets",
  "DataStats",
  "get_datasets",
  "get_source",
  "load_or_train_tokenizer",
  "load_tokenizer",
  "SentencePieceTokenizer",
  "Source",
  "SymbolTokenizer",
  "target_language",
  "vocab_path",
]
