"""The throughput benchmark runs end to end on a slice of multi30k (no timing assertions)."""

import pytest

from tests import support as testing
from tools import data_benchmark as benchmark

SHARED = testing.shared_data_dir()


@pytest.mark.skipif(
  not (SHARED / "multi30k").is_dir(), reason=f"offline corpora not found at {SHARED}"
)
def test_benchmark_on_a_slice(capsys):
  results = benchmark.main(
    [
      "--max_pairs=1500",
      "--vocab_size=500",
      "--max_len=64",
      "--tokens_per_batch=2048",
      "--devices=2",
    ]
  )
  out = capsys.readouterr().out
  for mode in ("bucket", "pack"):
    assert results[mode]["read"] == 1500
    assert results[mode]["pairs"] >= results[mode]["kept"] > 0 and results[mode]["tokens"] > 0
    assert f"[{mode}] whole pipeline" in out
  assert "pairs/s" in out and "tokens/s" in out


@pytest.mark.skipif(
  not (SHARED / "multi30k").is_dir(), reason=f"offline corpora not found at {SHARED}"
)
@pytest.mark.slow
def test_benchmark_trainer_comparison_runs(capsys):
  results = benchmark.main(
    [
      "--max_pairs=300",
      "--vocab_size=400",
      "--max_len=32",
      "--tokens_per_batch=512",
      "--batching=pack",
      "--trainer_steps=2",
    ]
  )
  assert results["pack"]["trainer_pairs_s"] > 0
  assert "[pack] trainer (tiny model" in capsys.readouterr().out
