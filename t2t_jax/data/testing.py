"""Helpers shared by the data tests and the benchmark: locating the offline corpora, configs."""

import os
import pathlib

from t2t_jax.data.config import default_config


def shared_data_dir() -> pathlib.Path:
  """`<repo>/../shared/data` (the offline corpora), or $T2T_SHARED_DATA if set."""
  if os.environ.get('T2T_SHARED_DATA'):
    return pathlib.Path(os.environ['T2T_SHARED_DATA'])
  return pathlib.Path(__file__).resolve().parents[2].parent / 'shared' / 'data'


def textfiles_config(directory, train: str = 'train', dev: str = 'val', test: str = 'test2016',
                     source_lang: str = 'en', target_lang: str = 'de', **overrides):
  """A data config reading `<directory>/{train,dev,test}.{source_lang,target_lang}`."""
  c = default_config()
  c.source = 'textfiles'
  c.source_lang, c.target_lang = source_lang, target_lang
  for split, stem in (('train', train), ('dev', dev), ('test', test)):
    if stem:
      c[f'{split}_source'] = str(pathlib.Path(directory) / f'{stem}.{source_lang}')
      c[f'{split}_target'] = str(pathlib.Path(directory) / f'{stem}.{target_lang}')
  c.update(overrides)
  return c
