"""The input pipeline: TFDS/synthetic sources, a shared vocabulary, token-budget batches.

Public surface (see pipeline.py for the flow):
  default_config()                         every data field, with defaults and comments
  get_datasets(config.data, workdir, ...)  -> Datasets (.tokenizer, .train_iter(),
                                              .eval_batches(), .dev_pairs, .test_pairs, .stats)
  load_or_train_tokenizer(config.data, workdir), load_tokenizer(path)
  DataError                                bad input or config (names file/line/flag)
"""

from t2t_jax.data.config import bucket_boundaries
from t2t_jax.data.config import default_config
from t2t_jax.data.errors import DataError
from t2t_jax.data.pipeline import Datasets
from t2t_jax.data.pipeline import DataStats
from t2t_jax.data.pipeline import get_datasets
from t2t_jax.data.tokenizer import load_or_train_tokenizer
from t2t_jax.data.tokenizer import load_tokenizer
from t2t_jax.data.tokenizer import SentencePieceTokenizer
from t2t_jax.data.tokenizer import SymbolTokenizer
from t2t_jax.data.tokenizer import vocab_path

__all__ = [
    'bucket_boundaries', 'default_config', 'DataError', 'Datasets', 'DataStats', 'get_datasets',
    'load_or_train_tokenizer', 'load_tokenizer', 'SentencePieceTokenizer', 'SymbolTokenizer',
    'vocab_path',
]
