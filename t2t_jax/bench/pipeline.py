"""The input pipeline's pairs/s and tokens/s, on the experiment's data (WMT: multi30k)."""

import tempfile
import time
from typing import Any

import jax
import ml_collections
import numpy as np

from t2t_jax.bench import inputs


def _pairs(batch: dict[str, np.ndarray]) -> int:
  """Sentence pairs in a batch: rows, or with packing the segments of every row."""
  seg = batch.get("targets_segmentation")
  if seg is None:
    return int(np.sum(batch["targets"][..., 0] != 0))
  return int(sum(len(np.unique(r[r > 0])) for r in seg.reshape(-1, seg.shape[-1])))


def measure_pipeline(config: ml_collections.ConfigDict, num_batches: int) -> dict[str, Any]:
  """Draws num_batches training batches; a source that needs a download (WMT) is measured on
  multi30k from ../shared/data instead, or skipped when that is absent too."""
  from t2t_jax import data
  from t2t_jax.data import sources as data_sources

  data_config = config.data
  note = config.data.source
  if data_sources.get_source(data_config).needs_download:
    root = inputs.shared_data_dir()
    if not (root / "multi30k" / "train.en").exists():
      return dict(skipped=f"{data_config.source} needs a download and multi30k is absent")
    data_config = inputs.multi30k_data_config(root / "multi30k", data_config)
    note = "multi30k (stand-in for WMT)"
  with tempfile.TemporaryDirectory() as workdir:
    t0 = time.perf_counter()
    ds = data.get_datasets(data_config, workdir, num_local_devices=jax.local_device_count())
    setup = time.perf_counter() - t0
    it = ds.train_iter()
    pairs = tokens = 0
    t0 = time.perf_counter()
    for _ in range(num_batches):
      batch = next(it)
      tokens += int(np.sum(batch["targets"] != 0) + np.sum(batch["inputs"] != 0))
      pairs += _pairs(batch)
    elapsed = time.perf_counter() - t0
    it.close()
  return dict(
    source=note,
    batching=data_config.batching,
    setup_s=setup,
    batches=num_batches,
    pairs_per_s=pairs / elapsed,
    tokens_per_s=tokens / elapsed,
  )
