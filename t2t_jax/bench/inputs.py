"""What the benchmarks measure on: synthetic batches and real sentences from ../shared/data."""

import os
import pathlib

import ml_collections
import numpy as np
from absl import app

CORPORA = {"multi30k": "multi30k/test2016.en", "newstest2014": "wmt14/newstest2014.en"}


def synthetic_batch(
  rows: int, src_len: int, tgt_len: int, vocab: int, devices: int
) -> dict[str, np.ndarray]:
  """Random ids (no padding: every token is real), int32 [devices, rows / devices, length]."""
  rng = np.random.default_rng(0)
  batch = dict(
    inputs=rng.integers(4, vocab, (devices, rows // devices, src_len)),
    targets=rng.integers(4, vocab, (devices, rows // devices, tgt_len)),
  )
  return {k: v.astype(np.int32) for k, v in batch.items()}


def shared_data_dir() -> pathlib.Path:
  """The offline corpora: $T2T_SHARED_DATA, else `shared/data` beside the repository."""
  if os.environ.get("T2T_SHARED_DATA"):
    return pathlib.Path(os.environ["T2T_SHARED_DATA"])
  return pathlib.Path(__file__).resolve().parents[3] / "shared" / "data"


def real_sentences(n: int, corpus: str = "") -> tuple[list[str] | None, str | None]:
  """The first n (0: all) English sources from ../shared/data: `corpus` (an error if
  absent), or the first of multi30k test2016 and newstest2014 present, or (None, None)."""
  root = str(shared_data_dir())
  for name in [corpus] if corpus else CORPORA:
    path = os.path.join(root, CORPORA[name])
    if os.path.isfile(path):
      with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f][: n or None], CORPORA[name]
  if corpus:
    raise app.UsageError(
      f"--decode_corpus={corpus}: {path} not found "
      f"(set T2T_SHARED_DATA to the folder holding {CORPORA[corpus]})"
    )
  return None, None


def multi30k_data_config(
  directory: pathlib.Path, like: ml_collections.ConfigDict
) -> ml_collections.ConfigDict:
  """Multi30k en-de as text files, batched like `like` (the stand-in for WMT's pipeline)."""
  from t2t_jax import data

  c = data.default_config()
  c.update(source="textfiles", source_lang="en", target_lang="de", vocab_size=8000)
  for split, stem in (("train", "train"), ("dev", "val"), ("test", "test2016")):
    c[f"{split}_source"] = str(directory / f"{stem}.en")
    c[f"{split}_target"] = str(directory / f"{stem}.de")
  c.update(max_len=like.max_len, tokens_per_batch=like.tokens_per_batch, batching=like.batching)
  return c
