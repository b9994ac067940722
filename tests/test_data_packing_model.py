"""A packed row through the core model equals each of its pairs run alone."""

import jax
import numpy as np

from t2t_jax import data
from t2t_jax.model import Transformer, TransformerConfig


def test_packed_forward_equals_each_pair_alone(tmp_path):
  c = data.default_config()  # synthetic 'reverse'
  c.update(
    batching="pack",
    synthetic_train_size=300,
    synthetic_max_len=12,
    max_len=24,
    pack_len=48,
    tokens_per_batch=4 * 48,
  )
  d = data.get_datasets(c, str(tmp_path))
  batch = {k: v[0] for k, v in next(d.train_iter()).items()}  # device 0: [rows, 48]
  row = int(np.argmax(batch["targets_segmentation"].max(axis=1)))  # the fullest row
  packed = {k: v[row : row + 1] for k, v in batch.items()}
  num_pairs = int(packed["targets_segmentation"].max())
  assert num_pairs >= 2

  model = Transformer(
    TransformerConfig(
      vocab_size=d.tokenizer.vocab_size,
      d_model=32,
      d_ff=64,
      num_heads=4,
      num_layers=2,
      dropout_rate=0.0,
      attention_dropout_rate=0.0,
      max_len=64,
    )
  )
  params = jax.jit(model.init)(jax.random.PRNGKey(0), packed["inputs"], packed["targets"])["params"]
  apply = jax.jit(model.apply)
  logits = apply(
    {"params": params},
    packed["inputs"],
    packed["targets"],
    inputs_segmentation=packed["inputs_segmentation"],
    targets_segmentation=packed["targets_segmentation"],
    inputs_position=packed["inputs_position"],
    targets_position=packed["targets_position"],
  )
  assert logits.shape == (1, 48, d.tokenizer.vocab_size)

  # Each pair alone, one per row, left-aligned and 0-padded (no segment ids or positions).
  alone = {side: np.zeros((num_pairs, 48), np.int32) for side in ("inputs", "targets")}
  where = {}
  for s in range(num_pairs):
    for side in ("inputs", "targets"):
      where[side, s] = packed[f"{side}_segmentation"][0] == s + 1
      alone[side][s, : where[side, s].sum()] = packed[side][0, where[side, s]]
  alone_logits = apply({"params": params}, alone["inputs"], alone["targets"])
  for s in range(num_pairs):
    n = where["targets", s].sum()
    np.testing.assert_allclose(
      logits[0, where["targets", s]], alone_logits[s, :n], atol=1e-5, rtol=1e-5
    )
