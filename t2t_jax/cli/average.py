"""t2t-average: write the mean of checkpoints of a workdir as a new workdir.

    t2t-average --workdir=DIR --num=5 --output=DIR_avg
    t2t-average --workdir=DIR --checkpoint=best:3 --output=DIR_best3
    t2t-translate --workdir=DIR_avg --input=... --reference=...

The paper averages the last 5 (base) or 20 (big) checkpoints, written at 10-minute intervals.
--checkpoint takes t2t-translate's choices instead ('best': the best checkpoint by the dev
metric t2t-train ranked by, 'best:N' the N best, 'average:N', 'latest', a step, 'ema': the
moving average of the parameters kept with config.ema_decay).
`t2t-translate --checkpoint=average:N` does the same on the fly without writing anything.
"""

import os
from collections.abc import Sequence

from absl import app, flags

from t2t_jax.cli import common
from t2t_jax.run import checkpoint
from t2t_jax.run.workdir import Workdir, WorkdirError, WorkdirFileError

FLAGS = flags.FLAGS


def average(workdir: str, spec: str, output: str) -> tuple[list[int], str]:
  """(the steps of `spec`, the checkpoint written): their mean as the workdir `output`."""
  steps = checkpoint.choose_steps(checkpoint.Checkpoints(workdir), spec)
  item = checkpoint.spec_item(spec)  # 'ema': the moving average, not the parameters
  return steps, checkpoint.write_averaged_workdir(workdir, steps, output, item)


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(
      f"unexpected arguments {argv[1:]}: flags are written --name=value (t2t-average --help)"
    )
  if not FLAGS.workdir or not FLAGS.output:
    raise app.UsageError(
      "--workdir and --output are required: the trained workdir and a new one for the "
      "average, e.g. --workdir=workdirs/NAME --output=workdirs/NAME_avg"
    )
  if FLAGS.checkpoint is not None and FLAGS["num"].present:
    raise app.UsageError("give --num or --checkpoint, not both")
  if FLAGS.num < 1:
    raise app.UsageError(f"--num={FLAGS.num} must be >= 1 (the latest checkpoints to average)")
  if FLAGS.checkpoint is not None:
    if FLAGS.checkpoint in ("auto", "selected"):
      raise app.UsageError(
        f"--checkpoint={FLAGS.checkpoint}: t2t-average takes 'latest', 'average:N', 'best', "
        "'best:N', 'ema' or a step"
      )
    common.check_checkpoint_flag("t2t-average", FLAGS.checkpoint)
  common.quiet_library_logs()
  spec = FLAGS.checkpoint if FLAGS.checkpoint is not None else f"average:{FLAGS.num}"
  try:
    _check_paths(FLAGS.workdir, FLAGS.output)
    steps, path = average(FLAGS.workdir, spec, FLAGS.output)
  except (checkpoint.CheckpointSpecError, FileExistsError, WorkdirError, WorkdirFileError) as e:
    raise SystemExit(f"t2t-average: {e}") from None
  print(f"averaged steps {steps} -> {path}")


def _check_paths(workdir: str, output: str) -> None:
  """Refuses, before any checkpoint is read, an input that is not a t2t-train workdir (it is
  only read: nothing is created in it) and an output that is a file or holds checkpoints."""
  source = Workdir(workdir).require()
  if source.config_values() is None:  # the averaged workdir needs it to be translated
    raise WorkdirError(f"--workdir={workdir}: no {Workdir.CONFIG} (not a t2t-train workdir?)")
  target = Workdir(output)
  if os.path.exists(output) and not os.path.isdir(output):
    raise WorkdirError(f"--output={output} is not a directory (a file is in its place)")
  if os.path.isdir(target.checkpoint_dir) and os.listdir(target.checkpoint_dir):
    raise FileExistsError(
      f"{target.checkpoint_dir} already holds checkpoints; choose a new --output"
    )


def _define_flags() -> None:
  """Defined when the command runs, not on import: t2t-translate has flags of the same
  names, and tests import both modules into one process."""
  flags.DEFINE_string("workdir", None, "a t2t-train workdir")
  flags.DEFINE_integer("num", 5, "how many of the latest checkpoints to average")
  flags.DEFINE_string(
    "checkpoint",
    None,
    "instead of --num: 'best', 'best:N', 'average:N', 'latest', 'ema' (the moving average of "
    "the parameters) or a step (as t2t-translate)",
  )
  flags.DEFINE_string("output", None, "new workdir for the averaged checkpoint")


def run() -> None:
  _define_flags()
  common.run(main, __doc__)


if __name__ == "__main__":
  run()
