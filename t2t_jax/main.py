"""t2t-train: train an experiment (absl entry point; all the work is in t2t_jax.train).

    t2t-train --experiment=NAME --workdir=DIR [--config.FIELD=VALUE ...]
    python -m t2t_jax.main --experiment=NAME --workdir=DIR

NAME is a file in experiments/ (tiny, base, big, ...) or a path to any get_config() file,
optionally followed by :ARG for get_config(ARG) (e.g. table3:A2, multi30k:de-en); any config
field can be overridden with --config.FIELD=VALUE (e.g. --config.model.d_model=256).
"""

import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

import t2t_jax.experiments

EXPERIMENTS_DIR = os.path.dirname(t2t_jax.experiments.__file__)

flags.DEFINE_string("experiment", "tiny",
                    "experiment: a file in experiments/ or a path, optionally NAME:ARG")
flags.DEFINE_string("workdir", None, "directory for checkpoints, vocabulary and logs")


def available_experiments() -> list:
  return sorted(f[:-3] for f in os.listdir(EXPERIMENTS_DIR)
                if f.endswith(".py") and not f.startswith("_"))


def experiment_path(name: str) -> str:
  """Resolves --experiment=NAME[:ARG] to 'file.py[:ARG]' (ARG goes to get_config)."""
  name, sep, arg = name.partition(":")
  if name.endswith(".py") and os.path.isfile(name):
    return name + sep + arg
  path = os.path.join(EXPERIMENTS_DIR, f"{name}.py")
  if not os.path.isfile(path):
    raise app.UsageError(f"--experiment={name}: unknown experiment; available: "
                         f"{', '.join(available_experiments())}")
  return path + sep + arg


def _experiment_from_argv(argv) -> str:
  """--experiment must be known before flag parsing: it picks the file --config.* overrides."""
  for i, arg in enumerate(argv):
    if arg.startswith("--experiment="):
      return arg.split("=", 1)[1]
    if arg == "--experiment" and i + 1 < len(argv):
      return argv[i + 1]
  return flags.FLAGS["experiment"].default


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if not flags.FLAGS.workdir:
    raise app.UsageError("--workdir is required")
  from t2t_jax import train  # pylint: disable=g-import-not-at-top
  config = flags.FLAGS.config
  logging.info("experiment %s, workdir %s", flags.FLAGS.experiment, flags.FLAGS.workdir)
  train.train_and_evaluate(config, flags.FLAGS.workdir)


def run():
  """Console-script entry point."""
  try:
    path = experiment_path(_experiment_from_argv(sys.argv))
  except app.UsageError as e:
    sys.exit(f"t2t-train: {e}")
  config_flags.DEFINE_config_file("config", path, "experiment config (set by --experiment)",
                                  lock_config=True)
  app.run(main)


if __name__ == "__main__":
  run()
