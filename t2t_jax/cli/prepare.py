"""t2t-prepare: everything before the first training step, done once.

    t2t-prepare --experiment=NAME --workdir=DIR [--config.FIELD=VALUE ...]
    python -m t2t_jax.cli.prepare --experiment=NAME --workdir=DIR

Downloads and prepares the TFDS source (or reads the local text files), trains or loads the
vocabulary, tokenizes every split and applies the length filter, then writes the prepared
store (memory-mappable arrays and a manifest) to <config.data.data_dir or DIR>/prepared,
beside the vocabulary. `t2t-train` with the same experiment and overrides then starts
without tokenizing anything; with other store-relevant overrides (corpus, max_len,
train_max_pairs, vocabulary) it refuses the store, naming the field. Run it on one machine:
it needs no accelerator, and the hosts of a multi-host run read the store from shared
storage (config.data.data_dir).

    t2t-prepare --experiment=NAME --workdir=DIR --verify

prepares nothing: it recomputes the sha256 of every file of the store and compares them with
the manifest's, printing OK or exiting 1 naming each damaged file.
"""

import pathlib
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from absl import app, flags

from t2t_jax.cli import common

if TYPE_CHECKING:  # the data package loads TFDS: only once flags are parsed
  from t2t_jax.data.store import Store

flags.DEFINE_string(
  "experiment",
  common.DEFAULT_EXPERIMENT,
  "experiment: a file in experiments/ or a path, optionally NAME:ARG",
)
flags.DEFINE_string(
  "workdir",
  None,
  "the workdir t2t-train will use (the store goes to <config.data.data_dir or workdir>/prepared)",
)


flags.DEFINE_bool(
  "verify",
  False,
  "prepare nothing: check every file of the prepared store against the sha256 its manifest "
  "keeps; exit 1 naming each damaged file",
)


def verify(path: "pathlib.Path") -> str:
  """The OK line for an intact store at `path`; DataError naming each damaged file."""
  from t2t_jax import data
  from t2t_jax.data import store

  damaged = store.verify(path)
  if damaged:
    raise data.DataError(
      f"{'; '.join(damaged)}: the store is damaged; delete {path} to prepare the data again"
    )
  count = len(store.read_manifest(path)["sha256"])
  return f"{path}: OK, all {count} files match the sha256s of {store.MANIFEST_FILE}"


def describe(store: "Store") -> str:
  """A few lines on what the store holds and what was skipped or dropped."""
  m = store.manifest
  size = sum(m["files"].values())
  lines = [f"prepared data: {store.path} ({size / 2**20:.1f} MiB, {m['dtype']} tokens)"]
  for split in ("train", "dev", "test"):
    if not store.has(split):
      lines.append(f"  {split}: none")
      continue
    c, pairs = store.counts(split), store.pairs(split)
    dropped = (
      f", {c.dropped_too_long} dropped by length (max_len {m['max_len']}), "
      f"{c.dropped_by_ratio} by length ratio (max_length_ratio "
      f"{m.get('max_length_ratio', 0.0):g})"
      if split == "train"
      else ""
    )
    lines.append(
      f"  {split}: {c.read} pairs read, {c.empty_skipped} empty skipped{dropped}, "
      f"{c.kept} kept; {len(pairs.inputs_flat)} source + "
      f"{len(pairs.targets_flat)} target tokens (EOS included)"
    )
    corpora = store.corpus_counts() if split == "train" else []
    for i, k in enumerate(corpora if len(corpora) > 1 else []):
      lines.append(
        f"    corpus {i}: {k.read} read, {k.empty_skipped} empty skipped, "
        f"{k.dropped_too_long} dropped by length, {k.dropped_by_ratio} by length ratio, "
        f"{k.kept} kept"
      )
  vocab = m["vocabulary"]
  lines.append(
    f"  vocabulary: {vocab['path']} ({vocab['size']} ids, sha256 {vocab['sha256'][:12]}...)"
  )
  lines.append("  seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in m["seconds"].items()))
  return "\n".join(lines)


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(
      f"unexpected arguments {argv[1:]}: flags are written --name=value (t2t-prepare --help)"
    )
  if not flags.FLAGS.workdir:
    raise app.UsageError(
      "--workdir is required: the workdir t2t-train will use, e.g. --workdir=workdirs/NAME"
    )
  from t2t_jax import data
  from t2t_jax.data import config as data_config
  from t2t_jax.data import prepare
  from t2t_jax.data import store as store_lib
  from t2t_jax.run.lock import LockError
  from t2t_jax.run.workdir import Workdir, WorkdirError

  common.quiet_library_logs()
  # The whole config, not only its data: t2t-train would refuse the run this store is for.
  common.check_config("t2t-prepare", flags.FLAGS.config, flags.FLAGS.experiment)
  config = data_config.with_defaults(flags.FLAGS.config.data)
  try:
    if flags.FLAGS.verify:
      print(verify(store_lib.store_path(config, flags.FLAGS.workdir)))
      return
    Workdir(flags.FLAGS.workdir).check_place()
    prepare.check_inputs(config, flags.FLAGS.workdir)  # before a workdir, lock or store
    workdir = Workdir(flags.FLAGS.workdir).create().path
    store = prepare.ensure_store(config, workdir)
  except (data.DataError, WorkdirError, LockError) as e:
    sys.exit(f"t2t-prepare: {e}")
  print(describe(store), flush=True)


def run() -> None:
  """Console-script entry point."""
  common.define_config_flag("t2t-prepare")
  common.run(main, __doc__)


if __name__ == "__main__":
  run()
