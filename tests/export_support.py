"""What the export tests share, none of it needing an exporter's optional package.

`random_params(cfg)` and `symbol_trained(cfg, params, tmp_path)`: a random-parameter model
as a `Trained` with a symbol vocabulary.
`tiny_workdir()`: the `tiny` experiment (symbol vocabulary, reverse task) trained briefly.
`text_workdir()`: a small model with a SentencePiece vocabulary trained on real text (the
first Multi30k pairs when /work/shared/data is present, else a generated corpus).
Both workdirs are made once per test run (support.made_once), in a subprocess on one CPU
device with XLA's default flags, as a user runs t2t-train.
"""

import functools
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np

from t2t_jax.data.tokenizer import SymbolTokenizer
from t2t_jax.export import Trained, vocabulary_tokens
from t2t_jax.model import Transformer, TransformerConfig
from tests import support

ENV = support.cpu_env()
# The trained workdirs run hundreds of steps, where running time dominates: with XLA's
# default optimisation, as a user has, they cost less CPU time in all than with the suite's
# fast-compiling flags (conftest.FAST_COMPILE; docs/testing.md).
TRAIN_ENV = dict(ENV, XLA_FLAGS="")


def random_params(cfg: TransformerConfig, seed: int = 0):
  """Initial parameters plus noise, so that biases and layer norms are not 0 and 1."""
  x = jnp.ones((1, 4), jnp.int32)
  params = support.jit_init(Transformer(cfg), jax.random.PRNGKey(seed), x, x)
  rng = np.random.default_rng(seed)
  return jax.tree.map(
    lambda p: np.asarray(p) + rng.normal(0, 0.2, p.shape).astype(np.float32), params
  )


def symbol_trained(cfg, params, tmp_path) -> Trained:
  tokenizer = SymbolTokenizer([str(i) for i in range(cfg.vocab_size - 4)])
  vocab_file = tmp_path / "vocab.symbols"
  vocab_file.write_text("".join(s + "\n" for s in tokenizer.symbols))
  return Trained(cfg, params, tokenizer, vocabulary_tokens(tokenizer), str(vocab_file), [0])


def _train(workdir: str, experiment: str, *overrides: str) -> str:
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "t2t_jax.cli.train",
      f"--experiment={experiment}",
      f"--workdir={workdir}",
      *overrides,
    ],
    env=TRAIN_ENV,
    capture_output=True,
    text=True,
    timeout=1200,
  )
  if proc.returncode != 0:
    raise RuntimeError(f"training {workdir} failed:\n{proc.stderr[-3000:]}")
  return workdir


@functools.cache
def tiny_workdir() -> str:
  """`tiny`, 400 steps: most reversals right, so greedy argmaxes are rarely near ties."""
  flags = (
    "--config.num_train_steps=400",
    "--config.checkpoint_every_steps=400",
    "--config.eval_every_steps=400",
    "--config.select_checkpoints=",
    "--config.test_at_end=False",
  )
  return support.made_once("export_tiny", lambda path: _train(path, "tiny", *flags))


def _text_corpus() -> str:
  return support.made_once("export_corpus", _write_corpus)


def _write_corpus(out: str) -> None:
  """Train/val/test2016 .en/.de files of real or generated sentences in `out`."""
  shared = support.shared_data_dir() / "multi30k"
  os.makedirs(out)
  sizes = {"train": 3000, "val": 100, "test2016": 100}
  for split, n in sizes.items():
    for lang in ("en", "de"):
      if (shared / f"{split}.{lang}").exists():
        with open(shared / f"{split}.{lang}", encoding="utf-8") as f:
          lines = [next(f) for _ in range(n)]
      else:
        lines = _generated(n, lang, seed=list(sizes).index(split))
      with open(os.path.join(out, f"{split}.{lang}"), "w", encoding="utf-8") as f:
        f.writelines(line.rstrip("\n") + "\n" for line in lines)


def _generated(n: int, lang: str, seed: int) -> list:
  """Sentence pairs from a small word-for-word lexicon (same seed: same sentences)."""
  lexicon = {
    "en": "a man woman dog child walks runs sits in on the park street red blue big small",
    "de": "ein Mann Frau Hund Kind geht rennt sitzt in auf dem Park Straße rot blau groß klein",
  }
  words = lexicon[lang].split(" ")
  rng = np.random.default_rng(seed)
  return [
    " ".join(words[i] for i in rng.integers(0, len(words), rng.integers(3, 12))) for _ in range(n)
  ]


@functools.cache
def text_workdir() -> str:
  """An en->de model with a SentencePiece vocabulary, 300 steps: 500 pieces on Multi30k;
  300 on the generated corpus, whose 34-word lexicon gives BPE fewer than 500 pieces."""
  corpus = _text_corpus()
  real = (support.shared_data_dir() / "multi30k" / "train.en").exists()
  data = [
    f"--config.data.{k}={v}"
    for k, v in dict(
      source="textfiles",
      vocab_size=500 if real else 300,
      max_len=48,
      tokens_per_batch=2048,
      bucket_boundaries="(16,32,48)",
      pack_len=48,
      source_lang="en",
      target_lang="de",
    ).items()
  ]
  for split, stem in (("train", "train"), ("dev", "val"), ("test", "test2016")):
    data += [
      f"--config.data.{split}_source={corpus}/{stem}.en",
      f"--config.data.{split}_target={corpus}/{stem}.de",
    ]
  flags = (
    *data,
    "--config.model.max_len=256",
    "--config.num_train_steps=300",
    "--config.checkpoint_every_steps=300",
    "--config.eval_every_steps=300",
    "--config.select_checkpoints=",
    "--config.test_at_end=False",
  )
  return support.made_once("export_text", lambda path: _train(path, "tiny", *flags))
