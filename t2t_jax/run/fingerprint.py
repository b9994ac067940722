"""What a checkpoint was trained with, so that a resume never silently mixes two experiments.

Every checkpoint stores a fingerprint: the sha256 of the vocabulary file and the resolved
config. Resuming compares it with the new start's: fields in `MAY_CHANGE_ON_RESUME` (how
often to log, evaluate and save, how long to train, how to decode for evaluation, and
implementation choices with equal results) may differ and are reported; any other
difference (a model field, the corpus, the batching, the optimizer) is refused, because the
checkpoint's parameters, optimizer moments and data position belong to the old values.
"""

import json
from typing import Any

import ml_collections

MAY_CHANGE_ON_RESUME = frozenset(
  {
    "alpha",
    "average_checkpoints",
    "beam_size",
    "beam_stop",
    "best_metric",
    "bleu_beam_size",
    "bleu_every_steps",
    "bleu_num_sentences",
    "checkpoint_every_steps",
    "eval_every_steps",
    # Read only when the workdir has no checkpoint: a resume never looks at them.
    "init_from",
    "init_keep_optimizer",
    "keep_best_checkpoints",
    "keep_checkpoints",
    "log_every_steps",
    "max_output_extra",
    "min_delta",
    "num_samples",
    "num_train_steps",
    "patience",
    "prefetch_batches",
    "sampling",
    "sampling_seed",
    "sampling_temperature",
    "sampling_topk",
    "sampling_topp",
    "select_checkpoints",
    "select_num_sentences",
    "test_at_end",
    "train_time_limit_minutes",
    "model.attention_impl",
    "model.loss_chunk_tokens",
    "data.prefetch_batches",
    "data.tfds_data_dir",
    "data.tfds_download",
    "data.tokenize_threads",
    "data.vocab_path",
    "data.wait_for_process0_s",
  }
)


class FingerprintError(ValueError):
  """A resume or a translation whose config or vocabulary differs from the checkpoint's."""


def make(
  config: ml_collections.ConfigDict, vocab_sha256: str, parent: dict[str, Any] | None = None
) -> dict[str, Any]:
  """{'vocab_sha256': hex, 'config': the resolved config as JSON values}, and 'parent' (the
  workdir, spec, steps and vocabulary sha256 a warm start took its parameters from) when the
  run began from another workdir; `compare` checks only the first two."""
  out = dict(vocab_sha256=vocab_sha256, config=json.loads(config.to_json_best_effort()))
  if parent is not None:
    out["parent"] = parent
  return out


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
  """{'model.d_model': 512, ...} for nested dicts."""
  out = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      out.update(flatten(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = value
  return out


_ABSENT = "<absent>"


def compare(saved: dict[str, Any], current: dict[str, Any], where: str) -> dict[str, list[Any]]:
  """The allowed changes {field: [old, new]}; raises FingerprintError on any other one.

  A field absent from the checkpoint (added to the config since) is reported, not refused.
  """
  if saved["vocab_sha256"] != current["vocab_sha256"]:
    raise FingerprintError(
      f"{where} was trained with a vocabulary of sha256 {saved['vocab_sha256']}, but the "
      f"vocabulary now configured has sha256 {current['vocab_sha256']}: refusing to resume "
      "(use the original vocabulary file, or a new --workdir)"
    )
  old, new = flatten(saved["config"]), flatten(current["config"])
  changes = {}
  for field in sorted(set(old) | set(new)):
    before, after = old.get(field, _ABSENT), new.get(field, _ABSENT)
    if before == after:
      continue
    if field not in MAY_CHANGE_ON_RESUME and before is not _ABSENT:
      raise FingerprintError(
        f"{where} was trained with config.{field}={before!r}, but this start has "
        f"config.{field}={after!r}: refusing to resume a different experiment (set it back, "
        "or use a new --workdir)"
      )
    changes[field] = [before, after]
  return changes
