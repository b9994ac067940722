"""t2t-average: write the mean of a workdir's last N checkpoints as a new workdir.

    t2t-average --workdir=DIR --num=5 --output=DIR_avg
    t2t-translate --workdir=DIR_avg --input=... --reference=...

The paper averages the last 5 (base) or 20 (big) checkpoints, written at 10-minute intervals.
`t2t-translate --checkpoint=average:N` does the same on the fly without writing anything.
"""

import os
from collections.abc import Sequence

from absl import app, flags

from t2t_jax.cli import common
from t2t_jax.run import checkpoint
from t2t_jax.run.workdir import Workdir, WorkdirError, WorkdirFileError

flags.DEFINE_string("workdir", None, "a t2t-train workdir")
flags.DEFINE_integer("num", 5, "how many of the latest checkpoints to average")
flags.DEFINE_string("output", None, "new workdir for the averaged checkpoint")
FLAGS = flags.FLAGS


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  if not FLAGS.workdir or not FLAGS.output:
    raise app.UsageError("--workdir and --output are required")
  if FLAGS.num < 1:
    raise SystemExit(f"t2t-average: --num={FLAGS.num} must be >= 1")
  common.quiet_library_logs()
  try:
    _check_paths(FLAGS.workdir, FLAGS.output)
    steps = checkpoint.choose_steps(checkpoint.Checkpoints(FLAGS.workdir), f"average:{FLAGS.num}")
    path = checkpoint.write_averaged_workdir(FLAGS.workdir, steps, FLAGS.output)
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


def run() -> None:
  common.run(main, __doc__)


if __name__ == "__main__":
  run()
