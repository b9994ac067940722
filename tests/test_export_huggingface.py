"""t2t-export --format=huggingface: transformers' MarianMTModel computes what t2t_jax computes.

The residual-stream permutation maps our interleaved position table onto Marian's exactly;
exported random-parameter and trained models give t2t_jax's logits within 1e-4; a trained
tiny model gives t2t-translate's greedy outputs on its whole test split; for a SentencePiece
workdir, MarianTokenizer reproduces our ids and text, and pipeline("translation") gives
t2t-translate's greedy translations
(or, with transformers >= 5, which removed that pipeline, tokenizer + generate).
"""

import importlib
import importlib.util
import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from t2t_jax import data
from t2t_jax.decoding.translator import Translator, load_config
from t2t_jax.export import ExportError, to_huggingface
from t2t_jax.model import Transformer, TransformerConfig, positional
from t2t_jax.tokens import BOS_ID, EOS_ID, PAD_ID
from tests import export_support, support
from tests.export_support import random_params, symbol_trained


class _Lazy:
  """A package imported at its first use: collecting this module imports no torch."""

  def __init__(self, name: str):
    self._name = name

  def __getattr__(self, attr: str):
    if attr.startswith("_") and attr != "__version__":  # pytest's probes while collecting
      raise AttributeError(attr)
    return getattr(importlib.import_module(self._name), attr)


def _installed(name):
  """The package (imported when first used), or None where it is not installed (the
  optional 'export' extra)."""
  return _Lazy(name) if importlib.util.find_spec(name) is not None else None


torch, transformers = _installed("torch"), _installed("transformers")
safetensors = _installed("safetensors")
# Each test skips on what it uses: the exporter writes model.safetensors; MarianMTModel runs
# on torch and transformers, whose model code loads safetensors too.
needs_safetensors = pytest.mark.skipif(
  safetensors is None, reason="the export writes model.safetensors"
)
needs_marian = pytest.mark.skipif(
  None in (torch, transformers, safetensors),
  reason="MarianMTModel needs torch, transformers and safetensors",
)

TOLERANCE = 1e-4


@needs_marian
def test_permutation_turns_our_table_into_marians():
  from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

  length, d_model = 50, 16
  perm = to_huggingface.residual_permutation(d_model)
  assert sorted(perm) == list(range(d_model))
  marian = MarianSinusoidalPositionalEmbedding(length, d_model).create_weight().numpy()
  ours = np.asarray(positional.sinusoidal(length, d_model))
  np.testing.assert_allclose(ours[:, perm], marian, atol=1e-7, rtol=0)
  assert np.abs(ours - marian).max() > 0.5  # the two layouts do differ


def _random_batch(vocab_size, seed=1):
  """Sources and targets ending with EOS, ragged (padded with 0)."""
  rng = np.random.default_rng(seed)
  inputs = rng.integers(4, vocab_size, (4, 9))
  targets = rng.integers(4, vocab_size, (4, 7))
  for row, (n, m) in enumerate([(9, 7), (3, 5), (6, 1), (1, 7)]):
    inputs[row, n - 1], inputs[row, n:] = EOS_ID, PAD_ID
    targets[row, m - 1], targets[row, m:] = EOS_ID, PAD_ID
  return inputs, targets


def hf_logits(model, inputs, targets):
  """Teacher-forced logits of a MarianMTModel, decoder inputs BOS + targets[:-1]."""
  decoder_inputs = np.concatenate([np.full((len(targets), 1), BOS_ID), targets[:, :-1]], 1)
  with torch.no_grad():
    out = model(
      input_ids=torch.tensor(inputs),
      attention_mask=torch.tensor(inputs != PAD_ID),
      decoder_input_ids=torch.tensor(decoder_inputs),
      decoder_attention_mask=torch.tensor(decoder_inputs != PAD_ID),
    )
  return out.logits.numpy()


def assert_logits_match(cfg, params, out, seed=1, strict=True):
  model, info = transformers.MarianMTModel.from_pretrained(out, output_loading_info=True)
  if strict:
    assert not any(info.values()), info  # no missing, unexpected or mismatched weights
  model.eval()
  inputs, targets = _random_batch(cfg.vocab_size, seed)
  batch = jnp.asarray(inputs), jnp.asarray(targets)
  ours = np.asarray(support.jit_apply(Transformer(cfg), {"params": params}, *batch))
  theirs = hf_logits(model, inputs, targets)
  real = targets != PAD_ID  # logits at padded target positions are not defined the same way
  np.testing.assert_allclose(theirs[real], ours[real], atol=TOLERANCE, rtol=0)


@pytest.mark.slow
@needs_marian
@needs_safetensors
@pytest.mark.parametrize("share_embeddings", [True, False])
def test_random_models_give_the_same_logits(share_embeddings, tmp_path):
  cfg = TransformerConfig(
    vocab_size=24,
    d_model=16,
    d_ff=32,
    num_heads=2,
    num_layers=2,
    max_len=32,
    share_embeddings=share_embeddings,
  )
  params = random_params(cfg)
  out = to_huggingface.export(symbol_trained(cfg, params, tmp_path), str(tmp_path / "hf"))
  assert not os.path.exists(os.path.join(out, "vocab.json"))  # symbols: no MarianTokenizer
  assert_logits_match(cfg, params, out)


def _drop_position_tables(out):
  """Removes the stored position tables, so that transformers builds its own (as some
  versions do whatever the file holds)."""
  from safetensors.numpy import load_file, save_file

  path = os.path.join(out, "model.safetensors")
  tensors = {k: v for k, v in load_file(path).items() if "embed_positions" not in k}
  save_file(tensors, path, metadata={"format": "pt"})


@needs_marian
@needs_safetensors
def test_marians_own_table_needs_the_permutation(tmp_path, monkeypatch):
  cfg = TransformerConfig(vocab_size=24, d_model=16, d_ff=32, num_heads=2, num_layers=2, max_len=32)
  params = random_params(cfg)
  trained = symbol_trained(cfg, params, tmp_path)
  out = to_huggingface.export(trained, str(tmp_path / "permuted"))
  _drop_position_tables(out)
  assert_logits_match(cfg, params, out, strict=False)
  monkeypatch.setattr(to_huggingface, "residual_permutation", np.arange)
  out = to_huggingface.export(trained, str(tmp_path / "not_permuted"))
  _drop_position_tables(out)
  with pytest.raises(AssertionError, match="Not equal to tolerance"):
    assert_logits_match(cfg, params, out, strict=False)


@needs_safetensors
@pytest.mark.parametrize(
  "change, reason",
  [
    (dict(norm="pre"), "pre-norm"),
    (dict(positional="learned"), "learned positions"),
    (dict(d_k=4, d_v=4), "d_model / h = 8"),
  ],
)
def test_refuses_what_marian_cannot_express(change, reason, tmp_path):
  cfg = TransformerConfig(
    vocab_size=24, d_model=16, d_ff=32, num_heads=2, num_layers=1, max_len=32, **change
  )
  with pytest.raises(ExportError, match=reason):
    to_huggingface.export(symbol_trained(cfg, random_params(cfg), tmp_path), str(tmp_path))


def export_cli(*args):
  return subprocess.run(
    [sys.executable, "-m", "t2t_jax.cli.export", "--format=huggingface", *args],
    env=export_support.ENV,
    capture_output=True,
    text=True,
    timeout=600,
  )


def _greedy_groups(t2t, sources):
  """Sentence indices grouped by t2t_jax's output limit (source length + extra, EOS
  included), which becomes max_new_tokens: transformers then forces EOS where we do."""
  groups = {}
  for i, text in enumerate(sources):
    limit = min(
      len(t2t.tokenizer.encode(text)) + 1 + t2t.search.max_output_extra, t2t.model.config.max_len
    )
    groups.setdefault(limit, []).append(i)
  return groups


def _test_pairs(workdir):
  return data.get_datasets(load_config(workdir).data, workdir).test_pairs


@needs_marian
@needs_safetensors
@pytest.mark.slow
def test_tiny_model_greedy_outputs_and_logits_match(tmp_path):
  workdir, out = export_support.tiny_workdir(), str(tmp_path / "hf")
  proc = export_cli(f"--workdir={workdir}", f"--output={out}")
  assert proc.returncode == 0, proc.stderr[-2000:]
  t2t = Translator.from_workdir(workdir)
  assert_logits_match(t2t.model.config, t2t.params, out)
  model = transformers.MarianMTModel.from_pretrained(out).eval()
  sources = [s for s, _ in _test_pairs(workdir)]
  ours = t2t.translate(sources, search=t2t.search.override(beam_size=1))
  for limit, rows in _greedy_groups(t2t, sources).items():
    ids = [t2t.tokenizer.encode(sources[i]) + [EOS_ID] for i in rows]
    inputs = np.full((len(ids), max(map(len, ids))), PAD_ID)
    for r, row in enumerate(ids):
      inputs[r, : len(row)] = row
    with torch.no_grad():
      generated = model.generate(
        input_ids=torch.tensor(inputs),
        attention_mask=torch.tensor(inputs != PAD_ID),
        num_beams=1,
        do_sample=False,
        max_new_tokens=limit,
      ).numpy()
    for i, row in zip(rows, generated):
      assert row[0] == BOS_ID
      # The symbol vocabulary maps ids one to one (EOS ends, PAD/BOS dropped).
      assert t2t.tokenizer.decode(row[1:]) == ours[i], (sources[i], row)


@needs_marian
@needs_safetensors
@pytest.mark.slow
def test_sentencepiece_model_tokenizer_and_translation(tmp_path):
  workdir, out = export_support.text_workdir(), str(tmp_path / "hf")
  proc = export_cli(f"--workdir={workdir}", f"--output={out}", "--checkpoint=latest")
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert {"source.spm", "target.spm", "vocab.json", "model.safetensors"} <= set(os.listdir(out))
  t2t = Translator.from_workdir(workdir, "latest")
  pairs = _test_pairs(workdir)
  sources = [s for s, _ in pairs]
  tokenizer = transformers.MarianTokenizer.from_pretrained(out)
  for source, reference in pairs:  # MarianTokenizer gives our ids (plus EOS) and our text
    ids = t2t.tokenizer.encode(reference)
    assert tokenizer(source).input_ids == t2t.tokenizer.encode(source) + [EOS_ID]
    assert tokenizer.decode([BOS_ID] + ids + [EOS_ID], skip_special_tokens=True) == (
      t2t.tokenizer.decode(ids)
    )
  translate_hf = _translation_pipeline(out)
  ours = t2t.translate(sources, search=t2t.search.override(beam_size=1))
  for limit, rows in _greedy_groups(t2t, sources).items():
    theirs = translate_hf([sources[i] for i in rows], num_beams=1, max_new_tokens=limit)
    for i, text in zip(rows, theirs):
      # A translation ending in a lone '▁' piece decodes to a trailing space in
      # SentencePiece; MarianTokenizer's decode strips it.
      assert text == ours[i].rstrip(" "), sources[i]


def _translation_pipeline(out):
  """pipeline("translation") where transformers has it (before 5.0); transformers 5 removed
  that task, so there the same steps by hand: MarianTokenizer, generate, decode."""
  if int(transformers.__version__.split(".")[0]) < 5:
    pipe = transformers.pipeline("translation", model=out, device="cpu")
    return lambda texts, **kw: [r["translation_text"] for r in pipe(texts, **kw)]
  tokenizer = transformers.MarianTokenizer.from_pretrained(out)
  model = transformers.MarianMTModel.from_pretrained(out).eval()

  def translate_hf(texts, **kw):
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
      generated = model.generate(**batch, **kw)
    return tokenizer.batch_decode(generated, skip_special_tokens=True)

  return translate_hf
