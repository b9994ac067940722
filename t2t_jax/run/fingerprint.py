"""What a checkpoint was trained with, so that a resume never silently mixes two experiments.

Every checkpoint stores a fingerprint: the sha256 of the vocabulary file, the resolved
config, the identity of the training data (its content: sizes and sha256 of the text files,
the TFDS name, version and size; never paths) and the number of devices and processes.
Resuming compares it with the new start's. The policy, field by field, is the table of
docs/faults.md ("What a resume may change"): fields in `MAY_CHANGE_ON_RESUME` may differ
and are recorded in starts.jsonl (how often to log, evaluate and save, how long to train,
how to decode for evaluation, where files are, implementation choices); those of them in
`NOT_BIT_EXACT` change the numbers of the steps after the resume (rounding), so the start
record lists them apart. Any other difference (a model field, the training data, the
batching, the optimizer) is refused, because the checkpoint's parameters, optimizer
moments and data position belong to the old values.
"""

import json
import re
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
    "constrained",
    "data.tree_max_depth",
    "data.tree_max_opens",
    "init_from",
    "init_keep_optimizer",
    "keep_best_checkpoints",
    "keep_checkpoints",
    "log_every_steps",
    "diverse_groups",
    "diversity_strength",
    "no_repeat_ngram",
    "max_output_extra",
    "min_delta",
    "min_length_ratio",
    "num_samples",
    "num_train_steps",
    "patience",
    "prefetch_batches",
    "profile_steps",
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
    # Where the files are: the training data's content is compared instead (`train_data`),
    # and dev/test are measured, not trained on.
    "data.train_source",
    "data.train_target",
    "data.train_corpora[].source",
    "data.train_corpora[].target",
    "data.dev_source",
    "data.dev_target",
    "data.test_source",
    "data.test_target",
    "data.treebank_dir",
    "data.treebank_dev",
    "data.treebank_test",
    # Where the vocabulary and the store live, and how they are read: the vocabulary's
    # sha256 and the training data's identity are compared; the store's batches equal
    # in-memory tokenization's bit for bit (tests/test_data_store.py).
    "data.data_dir",
    "data.prepared_store",
    "data.vocab_path",
    "data.tfds_data_dir",
    "data.tfds_download",
    "data.tfds_manual_dir",
    "data.download_probe_s",
    "data.prefetch_batches",
    "data.tokenize_threads",
    "data.wait_for_process0_s",
    # The machine: a requeued job may get another allocation; the global batch stays
    # config.data.tokens_per_batch.
    "devices",
    "processes",
  }
)

# Allowed changes after which the steps differ from an uninterrupted run's by rounding: an
# other attention kernel or loss chunking sums in another order, and other devices split
# each global batch into other rows and reduce the gradients in another order.
NOT_BIT_EXACT = frozenset(
  {"model.attention_impl", "model.loss_chunk_tokens", "devices", "processes"}
)

# The fingerprint's 'run' record: facts of the start, not config fields.
RUN_FIELDS = ("devices", "processes")


class FingerprintError(ValueError):
  """A resume or a translation whose config or vocabulary differs from the checkpoint's."""


def make(
  config: ml_collections.ConfigDict,
  vocab_sha256: str,
  parent: dict[str, Any] | None = None,
  train_data: dict[str, Any] | None = None,
  run: dict[str, int] | None = None,
) -> dict[str, Any]:
  """{'vocab_sha256': hex, 'config': the resolved config as JSON values}, with 'train_data'
  (the training data's identity, `Source.train_identity`) and 'run' ({'devices',
  'processes'}) when given, and 'parent' (the workdir, spec, steps and vocabulary sha256 a
  warm start took its parameters from) when the run began from another workdir; `compare`
  checks all but 'parent'."""
  out = dict(vocab_sha256=vocab_sha256, config=json.loads(config.to_json_best_effort()))
  if train_data is not None:
    out["train_data"] = train_data
  if run is not None:
    out["run"] = dict(run)
  if parent is not None:
    out["parent"] = parent
  return out


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
  """{'model.d_model': 512, 'data.train_corpora[0].source': 'a.en', ...} for nested dicts
  and lists of dicts (other lists are values)."""
  out = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      out.update(flatten(value, f"{prefix}{key}."))
    elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
      for i, item in enumerate(value):
        out.update(flatten(item, f"{prefix}{key}[{i}]."))
    else:
      out[f"{prefix}{key}"] = value
  return out


_ABSENT = "<absent>"


def policy_name(field: str) -> str:
  """The name a field has in `MAY_CHANGE_ON_RESUME`: list positions dropped
  ('data.train_corpora[2].source' -> 'data.train_corpora[].source')."""
  return re.sub(r"\[\d+\]", "[]", field)


def may_change(field: str) -> bool:
  return policy_name(field) in MAY_CHANGE_ON_RESUME


def compare(saved: dict[str, Any], current: dict[str, Any], where: str) -> dict[str, list[Any]]:
  """The allowed changes {field: [old, new]} (config fields, and 'devices'/'processes');
  raises FingerprintError on any other one, naming the field or the training file.

  A config field absent from the checkpoint (added to the config since) is reported, not
  refused, except inside a list: a training corpus more is another corpus. A checkpoint
  saved without a training-data identity or run record is not checked for them.
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
    in_list = "[" in field  # an entry more or less (a training corpus) is other data
    if in_list and _ABSENT in (before, after):
      allowed = False
    else:
      allowed = may_change(field) or before is _ABSENT
    if not allowed:
      raise FingerprintError(
        f"{where} was trained with config.{field}={before!r}, but this start has "
        f"config.{field}={after!r}: refusing to resume a different experiment (set it back, "
        "or use a new --workdir)"
      )
    changes[field] = [before, after]
  if saved.get("train_data") is not None and current.get("train_data") is not None:
    _compare_train_data(saved["train_data"], current["train_data"], new, where)
  saved_run, current_run = saved.get("run") or {}, current.get("run") or {}
  for field in RUN_FIELDS:
    if field in saved_run and saved_run[field] != current_run.get(field, saved_run[field]):
      changes[field] = [saved_run[field], current_run[field]]
  return changes


def _compare_train_data(
  saved: dict[str, Any], current: dict[str, Any], config: dict[str, Any], where: str
) -> None:
  """Raises FingerprintError naming the first entry of the training data's identity that
  differs: a training file by its flag and configured path, or a field of the source."""
  for key in sorted(set(saved) | set(current)):
    before, after = saved.get(key, _ABSENT), current.get(key, _ABSENT)
    if before == after:
      continue
    path = config.get(f"data.{key}")
    what = f"config.data.{key}={path}" if isinstance(path, str) else f"the training data's {key}"
    raise FingerprintError(
      f"{where} was trained on other training data: {what} is now {_describe(after)}, "
      f"the checkpoint's was {_describe(before)}: refusing to resume on other data (restore "
      "the file, or use a new --workdir)"
    )


def _describe(value: Any) -> str:
  if isinstance(value, dict) and {"size", "sha256"} <= set(value):
    return f"{value['size']} bytes, sha256 {value['sha256']}"
  if value is _ABSENT:
    return "absent"
  return repr(value)
