"""t2t-train: train an experiment (absl entry point; all the work is in t2t_jax.training.trainer).

    t2t-train --experiment=NAME --workdir=DIR [--config.FIELD=VALUE ...]
    python -m t2t_jax.cli.train --experiment=NAME --workdir=DIR

NAME is a file in experiments/ (tiny, base, big, ...) or a path to any get_config() file,
optionally followed by :ARG for get_config(ARG) (e.g. table3:A2, multi30k:de-en); any config
field can be overridden with --config.FIELD=VALUE (e.g. --config.model.d_model=256).

    t2t-train --experiment=NAME --helpconfig

lists the experiment's config fields: value, default and what each does.

Exit status: 0 when training (and the test at its end) finished; 75 (EX_TEMPFAIL of
sysexits.h: "temporary failure, run again") when SIGTERM/SIGINT stopped it after saving a
checkpoint, so that a scheduler can requeue it: the same command resumes; 2 for a wrong
command line (a flag, an experiment, a config value), refused before anything is written;
1 for another error the one-line message explains (nothing to gain from running it again
unchanged). See docs/faults.md.

Several hosts: every process runs the same command; t2t_jax.training.distributed joins them (TPU pod
slices and Slurm srun steps are detected; elsewhere --coordinator_address=HOST:PORT
--num_processes=N --process_id=I). See launch/ for launchers.
"""

from collections.abc import Sequence

from absl import app, flags, logging

from t2t_jax.cli import common, host
from t2t_jax.training import distributed

EXIT_STOPPED = 75  # EX_TEMPFAIL (sysexits.h): stopped early by a signal, saved; rerun to resume

flags.DEFINE_string(
  "experiment",
  common.DEFAULT_EXPERIMENT,
  "experiment: a file in experiments/ or a path, optionally NAME:ARG",
)
flags.DEFINE_string("workdir", None, "directory for checkpoints, vocabulary and logs")
distributed.define_flags()
flags.DEFINE_string("compilation_cache", "default", common.COMPILATION_CACHE_HELP)


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(
      f"unexpected arguments {argv[1:]}: flags are written --name=value (t2t-train --help)"
    )
  if not flags.FLAGS.workdir:
    raise app.UsageError("--workdir is required: the run's directory, e.g. --workdir=workdirs/NAME")
  common.quiet_library_logs()
  from t2t_jax.training import trainer

  config = flags.FLAGS.config
  # A value that makes no sense, alone or with others: a usage error, before anything else.
  common.check_config("t2t-train", config, flags.FLAGS.experiment)
  try:  # every input file exists and is aligned: before a workdir, lock or store is made
    trainer.check_inputs(config, flags.FLAGS.workdir)
  except trainer.EXPLAINED_ERRORS as e:
    raise SystemExit(f"t2t-train: {e}") from None
  try:  # before anything touches the devices
    plan = distributed.setup(flags.FLAGS)
  except distributed.DistributedSetupError as e:
    raise app.UsageError(str(e)) from e
  except distributed.DistributedInitError as e:
    raise SystemExit(f"t2t-train: {e}") from e
  common.use_compilation_cache()
  logging.info("experiment %s, workdir %s", flags.FLAGS.experiment, flags.FLAGS.workdir)
  with distributed.fail_fast(plan):
    try:
      last = trainer.train_and_evaluate(config, flags.FLAGS.workdir)
    except trainer.EXPLAINED_ERRORS as e:
      raise SystemExit(f"t2t-train: {e}") from None
  if last["stopped_by"]:  # outside fail_fast: every process stops, saved, with this status
    logging.info(
      "stopped by %s at step %d after saving; exit status %d: run the same command to resume",
      last["stopped_by"],
      last["step"],
      EXIT_STOPPED,
    )
    raise SystemExit(EXIT_STOPPED)


def run() -> None:
  """Console-script entry point."""
  host.use_huge_pages()
  common.define_config_flag("t2t-train")
  common.run(main, __doc__)


if __name__ == "__main__":
  run()
