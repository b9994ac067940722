"""t2t-export --format=ctranslate2: CTranslate2 computes what t2t_jax computes.

Random-parameter models of every supported shape score forced targets as t2t_jax does; a
trained tiny model (symbol vocabulary) and a trained SentencePiece model, exported through the
command line, give t2t-translate's greedy outputs on their whole test split and its per-token
log-probabilities within 1e-4.
"""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t_jax import data
from t2t_jax.decoding.translator import Translator, load_config
from t2t_jax.export import ExportError, to_ctranslate2
from t2t_jax.model import Transformer, TransformerConfig
from t2t_jax.tokens import EOS_ID, PAD_ID
from tests import export_support, support
from tests.export_support import random_params, symbol_trained

ctranslate2 = pytest.importorskip("ctranslate2")

TOLERANCE = 1e-4


def t2t_log_probs(model, params, sources, targets):
  """Per-token log p(target token | source, previous targets), EOS included, one padded
  batch: sources/targets are lists of id lists ending with EOS."""

  def pad(rows):
    out = np.full((len(rows), max(map(len, rows))), PAD_ID, np.int32)
    for r, ids in enumerate(rows):
      out[r, : len(ids)] = ids
    return out

  inputs, outputs = pad(sources), pad(targets)
  logits = support.jit_apply(model, {"params": params}, jnp.asarray(inputs), jnp.asarray(outputs))
  log_probs = np.asarray(jax.nn.log_softmax(logits, axis=-1))
  picked = np.take_along_axis(log_probs, outputs[..., None], axis=-1)[..., 0]
  return [picked[r, : len(ids)] for r, ids in enumerate(targets)]


def assert_scores_match(translator, model, params, source_tokens, target_tokens, to_id):
  """CTranslate2's score_batch against t2t_jax's forced-target log-probs."""
  results = translator.score_batch(source_tokens, target_tokens)
  ours = t2t_log_probs(
    model,
    params,
    [[to_id(t) for t in s] + [EOS_ID] for s in source_tokens],
    [[to_id(t) for t in s] + [EOS_ID] for s in target_tokens],
  )
  for theirs, mine in zip(results, ours):
    assert len(theirs.log_probs) == len(mine)
    np.testing.assert_allclose(theirs.log_probs, mine, atol=TOLERANCE, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize(
  "shape",
  [
    dict(),  # the paper's: post-norm, shared embeddings, sinusoidal positions
    dict(norm="pre"),
    dict(share_embeddings=False, positional="learned"),
    dict(num_encoder_layers=1, num_decoder_layers=3, d_k=6, d_v=6),
  ],
)
def test_random_models_score_like_t2t_jax(shape, tmp_path):
  cfg = TransformerConfig(
    vocab_size=24, d_model=16, d_ff=32, num_heads=2, num_layers=2, max_len=32, **shape
  )
  params = random_params(cfg)
  trained = symbol_trained(cfg, params, tmp_path)
  out = to_ctranslate2.export(trained, str(tmp_path / "ct2"))
  translator = ctranslate2.Translator(out)
  rng = np.random.default_rng(1)
  sample = lambda: [str(i) for i in rng.integers(0, 20, rng.integers(1, 12))]
  sources, targets = [sample() for _ in range(8)], [sample() for _ in range(8)]
  assert_scores_match(
    translator, Transformer(cfg), params, sources, targets, trained.tokenizer._ids.__getitem__
  )


def test_refusals_name_the_reason(tmp_path):
  cfg = TransformerConfig(
    vocab_size=24, d_model=16, d_ff=32, num_heads=2, num_layers=1, max_len=32, d_k=4, d_v=8
  )
  trained = symbol_trained(cfg, random_params(cfg), tmp_path)
  with pytest.raises(ExportError, match="d_k=4 differs from d_v=8"):
    to_ctranslate2.export(trained, str(tmp_path / "a"))
  cfg = cfg.replace(d_k=0, d_v=0)
  trained = symbol_trained(cfg, random_params(cfg), tmp_path)
  with pytest.raises(ExportError, match="--quantization=int3: allowed values are float32"):
    to_ctranslate2.export(trained, str(tmp_path / "b"), "int3")
  (tmp_path / "full").mkdir()
  (tmp_path / "full" / "model.bin").write_text("")
  with pytest.raises(ExportError, match="already exists and is not empty"):
    to_ctranslate2.export(trained, str(tmp_path / "full"))


def export_cli(*args):
  return subprocess.run(
    [sys.executable, "-m", "t2t_jax.cli.export", *args],
    env=export_support.ENV,
    capture_output=True,
    text=True,
    timeout=600,
  )


def test_cli_bad_workdir_is_one_line(tmp_path):
  proc = export_cli(f"--workdir={tmp_path}/none", f"--output={tmp_path}/out")
  assert proc.returncode != 0
  assert proc.stderr.strip().splitlines()[-1] == (
    f"t2t-export: {tmp_path}/none: no config.json (not a t2t-train workdir?)"
  )


def _greedy_ct2(translator, token_lists, limits):
  """CTranslate2 greedy search with t2t_jax's per-sentence output limit.

  t2t_jax forces EOS at the limit (EOS included); CTranslate2 stops without one, so it gets
  limit - 1 tokens and both give the same text. Sentences are grouped by limit.
  """
  out = [None] * len(token_lists)
  for limit in sorted(set(limits)):
    rows = [i for i, n in enumerate(limits) if n == limit]
    results = translator.translate_batch(
      [token_lists[i] for i in rows], beam_size=1, max_decoding_length=limit - 1
    )
    for i, result in zip(rows, results):
      out[i] = result.hypotheses[0]
  return out


def _limits(t2t, source_ids):
  max_len = t2t.model.config.max_len
  return [min(len(s) + 1 + t2t.search.max_output_extra, max_len) for s in source_ids]


def _test_pairs(workdir):
  return data.get_datasets(load_config(workdir).data, workdir).test_pairs


@pytest.mark.slow
def test_tiny_model_greedy_and_scores_match(tmp_path):
  workdir = export_support.tiny_workdir()
  out = str(tmp_path / "ct2")
  proc = export_cli(f"--workdir={workdir}", f"--output={out}")
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "vocab.symbols" in os.listdir(out)
  pairs = _test_pairs(workdir)
  t2t = Translator.from_workdir(workdir)
  ours = t2t.translate([s for s, _ in pairs], search=t2t.search.override(beam_size=1))
  translator = ctranslate2.Translator(out, intra_threads=2)
  tokens = [s.split() for s, _ in pairs]
  theirs = _greedy_ct2(translator, tokens, _limits(t2t, tokens))
  assert [" ".join(h) for h in theirs] == ours
  assert sum(o == r for o, (_, r) in zip(ours, pairs)) > len(pairs) // 4  # a trained model
  to_id = t2t.tokenizer._ids.__getitem__
  assert_scores_match(
    translator, t2t.model, t2t.params, tokens, [r.split() for _, r in pairs], to_id
  )


@pytest.mark.slow
def test_sentencepiece_model_translates_with_ctranslate2_alone(tmp_path):
  import sentencepiece as spm

  workdir = export_support.text_workdir()
  out = str(tmp_path / "ct2")
  proc = export_cli(f"--workdir={workdir}", f"--output={out}", "--checkpoint=latest")
  assert proc.returncode == 0, proc.stderr[-2000:]
  # Only the exported directory: its vocabulary file and the CTranslate2 model.
  sp = spm.SentencePieceProcessor(model_file=os.path.join(out, "vocab.model"))
  translator = ctranslate2.Translator(out, intra_threads=2)
  pairs = _test_pairs(workdir)
  pieces = [sp.encode(s, out_type=str) for s, _ in pairs]
  t2t = Translator.from_workdir(workdir, "latest")
  theirs = [sp.decode_pieces(h) for h in _greedy_ct2(translator, pieces, _limits(t2t, pieces))]
  assert theirs == t2t.translate([s for s, _ in pairs], search=t2t.search.override(beam_size=1))
  assert_scores_match(
    translator,
    t2t.model,
    t2t.params,
    pieces,
    [sp.encode(r, out_type=str) for _, r in pairs],
    sp.piece_to_id,
  )


@pytest.mark.slow
def test_int8_export_loads_and_translates(tmp_path):
  workdir = export_support.tiny_workdir()
  proc = export_cli(f"--workdir={workdir}", f"--output={tmp_path}/int8", "--quantization=int8")
  assert proc.returncode == 0, proc.stderr[-2000:]
  translator = ctranslate2.Translator(f"{tmp_path}/int8", compute_type="int8")
  pairs = _test_pairs(workdir)[:32]
  results = translator.translate_batch([s.split() for s, _ in pairs], beam_size=4)
  exact = sum(" ".join(r.hypotheses[0]) == ref for r, (_, ref) in zip(results, pairs))
  assert exact > len(pairs) // 4
