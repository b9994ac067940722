"""t2t-bench --vs=peers: every system trains the same tiny model on the same batch."""

import importlib.util
import math
import sys

import pytest

from t2t_jax.cli import bench_peers as peers
from t2t_jax.model import TransformerConfig
from t2t_jax.training import optim

# Rows: a multiple of the 8 simulated devices of tests/conftest.py (t2t_jax's pmap splits
# the batch over them). A short warmup so that a few steps already move the loss.
CFG = TransformerConfig(
  vocab_size=64, d_model=32, d_ff=64, num_heads=4, num_layers=1, max_len=16, dropout_rate=0.1
)
WORKLOAD = peers.Workload(CFG, rows=8, seq_len=8, label_smoothing=0.1, warmup_steps=8)


@pytest.mark.slow  # builds and trains four systems
def test_every_system_trains_the_same_model_size_and_the_table_prints():
  pytest.importorskip("torch")
  pytest.importorskip("transformers")
  result = peers.compare(WORKLOAD, steps=2, repeats=2, threads=1)
  systems = result["systems"]
  assert list(systems) == list(peers.SYSTEMS)
  ours = systems["t2t_jax"]["params"]
  for name, row in systems.items():
    assert row["status"] == "ok", (name, row)
    # A fixed batch, repeated: the loss of the warm-up step and of 2 x 2 timed ones.
    losses = row["losses"]
    assert len(losses) == 5 and all(map(math.isfinite, losses)), (name, losses)
    assert losses[-1] < losses[0] - 0.2, (name, losses)
    assert len(row["repetition_medians_s"]) == 2 and row["step_time_s"] > 0
    assert row["target_tokens_per_s"] == pytest.approx(64 / row["step_time_s"])
    # Tolerance: exactly the key biases every peer has and t2t_jax leaves out,
    # d_model x (1 + 2 x 1) = 96 of ~23,000 (0.4%); nothing else may differ.
    if name != "t2t_jax":
      assert row["params_vs_t2t_jax"] == peers.key_bias_params(CFG) == 96, name
      assert row["params_vs_t2t_jax"] / ours < 0.005
      assert row["params_note"].startswith("attention key biases")
  assert systems["t2t_jax"]["t2t_jax_speedup"] == 1.0
  assert result["best_peer"] in ("torch", "flax", "marian")
  text = peers.table(result)
  for system in peers.SYSTEMS:
    assert f"| {system} (" in text
  assert "best peer: " in text and "| 23,328 |" in text and "23,424 (+96)" in text


def test_a_missing_library_gets_a_row_not_a_crash(monkeypatch):
  monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` fails
  missing = "transformers" if importlib.util.find_spec("torch") else "torch"
  result = peers.compare(WORKLOAD, steps=1, repeats=1, systems=("marian",))
  assert result["systems"] == {"marian": {"status": f"not installed ({missing})"}}
  assert result["best_peer"] is None
  assert f"| marian | not installed ({missing}) |" in peers.table(result)


def test_torch_schedule_is_the_paper_schedule():
  schedule = optim.optimizer_schedule(32, 8)
  rate = peers.paper_rate(32, 8)
  for count in (0, 3, 7, 8, 50):
    assert rate(count) == pytest.approx(float(schedule(count)), rel=1e-6)


def test_other_model_variants_are_refused():
  with pytest.raises(ValueError, match="norm"):
    peers.check_comparable(CFG.replace(norm="pre"))
  with pytest.raises(ValueError, match="d_k"):
    peers.check_comparable(CFG.replace(d_k=16))
