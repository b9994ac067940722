"""t2t-train: train an experiment (absl entry point; all the work is in t2t_jax.training.trainer).

    t2t-train --experiment=NAME --workdir=DIR [--config.FIELD=VALUE ...]
    python -m t2t_jax.cli.train --experiment=NAME --workdir=DIR

NAME is a file in experiments/ (tiny, base, big, ...) or a path to any get_config() file,
optionally followed by :ARG for get_config(ARG) (e.g. table3:A2, multi30k:de-en); any config
field can be overridden with --config.FIELD=VALUE (e.g. --config.model.d_model=256).

Several hosts: every process runs the same command; t2t_jax.training.distributed joins them (TPU pod
slices and Slurm srun steps are detected; elsewhere --coordinator_address=HOST:PORT
--num_processes=N --process_id=I). See launch/ for launchers.
"""

from absl import app, flags, logging

from t2t_jax.cli import common, host
from t2t_jax.training import distributed

flags.DEFINE_string(
  "experiment",
  common.DEFAULT_EXPERIMENT,
  "experiment: a file in experiments/ or a path, optionally NAME:ARG",
)
flags.DEFINE_string("workdir", None, "directory for checkpoints, vocabulary and logs")
distributed.define_flags()


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if not flags.FLAGS.workdir:
    raise app.UsageError("--workdir is required")
  try:  # before anything touches the devices
    plan = distributed.setup(flags.FLAGS)
  except distributed.DistributedSetupError as e:
    raise app.UsageError(str(e)) from e
  except distributed.DistributedInitError as e:
    raise SystemExit(f"t2t-train: {e}") from e
  from t2t_jax.training import trainer

  common.quiet_library_logs()
  config = flags.FLAGS.config
  logging.info("experiment %s, workdir %s", flags.FLAGS.experiment, flags.FLAGS.workdir)
  from t2t_jax.data import DataError

  try:
    with distributed.fail_fast(plan):
      trainer.train_and_evaluate(config, flags.FLAGS.workdir)
  except DataError as e:  # bad data input or config: one line naming the file or field
    raise SystemExit(f"t2t-train: {e}") from None


def run():
  """Console-script entry point."""
  host.use_huge_pages()
  common.define_config_flag("t2t-train")
  app.run(main)


if __name__ == "__main__":
  run()
