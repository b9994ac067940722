"""t2t-bench --vs=ctranslate2: the same parameters and sources through both engines."""

import pytest

from t2t_jax.bench import ctranslate2 as vs
from t2t_jax.model import TransformerConfig
from t2t_jax.tokens import EOS_ID


def test_forced_lengths_compare_the_same_decoder_steps():
  pytest.importorskip("ctranslate2")
  cfg = TransformerConfig(
    vocab_size=300, d_model=32, d_ff=64, num_heads=4, num_layers=1, max_len=64, dropout_rate=0.0
  )
  trained = vs.random_trained(cfg)
  ids = vs.synthetic_sources(6, 10, cfg.vocab_size)
  assert all(len(s) == 10 and s[-1] == EOS_ID for s in ids)
  result = vs.compare(
    trained, ids, [10] * 6, beam_size=4, alpha=0.6, forced=True, repeats=2, threads=1
  )
  systems = result["systems"]
  assert list(systems) == ["t2t_jax", "ctranslate2 float32", "ctranslate2 int8"]
  for row in systems.values():
    # Every system ran 10 decoder steps per sentence (t2t_jax: 9 tokens and the forced EOS).
    assert row["output_tokens"] == 60
    assert len(row["seconds"]) == 2
  assert systems["t2t_jax"]["same_as_t2t_jax"] == 6
  assert systems["t2t_jax"]["t2t_jax_speedup"] == 1.0
  # Same float32 parameters, same beam: CTranslate2 finds the same best outputs (the
  # softmax of t2t_jax keeps EOS in while suppressing it; ties and that may flip a few).
  assert systems["ctranslate2 float32"]["same_as_t2t_jax"] >= 4
  assert "| ctranslate2 int8 |" in vs.table(result)


def test_outputs_are_compared_without_eos_and_forced_tail():
  assert vs._comparable([5, 6, 7, EOS_ID], 4, forced=True) == [5, 6, 7]
  assert vs._comparable([5, 6, 7, 8], 4, forced=True) == [5, 6, 7]
  assert vs._comparable([5, 6, EOS_ID], 9, forced=False) == [5, 6]
  assert vs._comparable([5, 6, 7, 8], 9, forced=False) == [5, 6, 7, 8]


def test_synthetic_vocabulary_keeps_the_reserved_tokens():
  vocab = vs.synthetic_vocabulary(10)
  assert vocab[:4] == ["<pad>", "</s>", "<s>", "<unk>"]
  assert vocab[4:] == [f"w{i}" for i in range(4, 10)]
