"""t2t-bench --vs=peers: every system trains the same tiny model on the same batch, and a
peer written with another library (transformers' MarianMTModel) started from t2t_jax's
parameters reproduces t2t_jax's losses step by step."""

import importlib.util
import math
import sys

import jax
import numpy as np
import pytest

from t2t_jax.bench import peers
from t2t_jax.bench import train as bench
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
  ours_per_s = systems["t2t_jax"]["target_tokens_per_s"]
  for name in ("torch", "flax", "marian"):
    speedup = systems[name]["t2t_jax_speedup"]
    assert speedup == pytest.approx(ours_per_s / systems[name]["target_tokens_per_s"]), name
  assert result["best_peer"] in ("torch", "flax", "marian")
  text = peers.table(result)
  for system in peers.SYSTEMS:
    assert f"| {system} (" in text
  assert "best peer: " in text and "| 23,328 |" in text and "23,424 (+96)" in text


@pytest.mark.slow
def test_marian_from_our_parameters_gives_our_losses_step_by_step(monkeypatch):
  """The Marian system (MarianMTModel, its loss, torch Adam + LambdaLR) started from t2t_jax's
  initial parameters, exported weight by weight, on the benchmark's batch: the same loss
  before the first update and after each of the next ones, so both systems train the same
  model with the same loss normalisation, Adam and learning rate. Without dropout (the two
  libraries draw different masks) and label smoothing (torch spreads eps over all classes,
  t2t_jax over the others and reports the loss minus its minimum)."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  from t2t_jax.export import to_huggingface

  cfg = CFG.replace(dropout_rate=0.0)
  workload = peers.Workload(cfg, rows=8, seq_len=8, label_smoothing=0.0, warmup_steps=8)
  setup = bench.setup_train(cfg, workload.warmup_steps, 0.0, workload.rows, workload.seq_len)
  weights = to_huggingface.state_dict(cfg, jax.device_get(setup.params))
  tied = {
    "lm_head.weight",
    "model.encoder.embed_tokens.weight",
    "model.decoder.embed_tokens.weight",
  }
  torch_trainer = peers._torch_trainer

  def from_our_parameters(model, *args):
    """The harness's own torch trainer, on the Marian model it built, with our parameters."""
    assert isinstance(model, transformers.MarianMTModel)
    loaded = model.load_state_dict({k: torch.tensor(v) for k, v in weights.items()}, strict=False)
    assert set(loaded.missing_keys) <= tied and not loaded.unexpected_keys, loaded
    assert model.lm_head.weight.data_ptr() == model.model.shared.weight.data_ptr()
    return torch_trainer(model, *args)

  monkeypatch.setattr(peers, "_torch_trainer", from_our_parameters)
  inputs = setup.host_batch["inputs"].reshape(workload.rows, workload.seq_len)
  targets = setup.host_batch["targets"].reshape(workload.rows, workload.seq_len)
  theirs = peers.marian_system(workload, inputs, targets)
  ours = peers.t2t_jax_system(setup)
  assert theirs.params - ours.params == peers.key_bias_params(cfg)
  losses = np.array([(ours.run(), theirs.run()) for _ in range(4)])
  assert losses[-1, 0] < losses[0, 0] - 0.05  # the updates did change the model
  # Layer norm epsilon 1e-6 here, 1e-5 in transformers (the export's one difference).
  np.testing.assert_allclose(losses[:, 1], losses[:, 0], rtol=1e-4)


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
