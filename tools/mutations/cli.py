"""The commands' refusals: a wrong command line is one line, exit status 2, and nothing is
created before every check has passed."""

from tools.mutations import Mutation

M = Mutation
FIRST = ("tests/test_wrong_invocations.py",)
MUTATIONS = (
  M(
    "cli_usage_status",
    "a wrong command line exits 1 like a failed run, not 2",
    "t2t_jax/cli/common.py",
    "EXIT_USAGE = 2",
    "EXIT_USAGE = 1",
    FIRST,
  ),
  M(
    "cli_help_status",
    "--help exits with absl's status 1",
    "t2t_jax/cli/common.py",
    "raise SystemExit(0 if e.code == 1 else e.code) from None",
    "raise SystemExit(e.code) from None",
    FIRST,
  ),
  M(
    "cli_usage_with_help",
    "a usage error goes back to absl: the whole --help before the message",
    "t2t_jax/cli/common.py",
    "      refuse(tool, str(e))\n",
    "      raise\n",
    FIRST,
  ),
  M(
    "cli_data_config_checked_late",
    "config.data values are checked only once the workdir and its lock exist",
    "t2t_jax/training/checks.py",
    "  source = data_lib.sources.validate(config.data)\n",
    "  source = data_lib.sources.get_source(config.data)\n",
    FIRST,
  ),
  M(
    "cli_prepare_creates_before_checking",
    "t2t-prepare makes the workdir where it should check the input files",
    "t2t_jax/cli/prepare.py",
    "    prepare.check_inputs(config, flags.FLAGS.workdir)  # before a workdir, lock or store",
    "    Workdir(flags.FLAGS.workdir).create()  # before a workdir, lock or store",
    FIRST,
  ),
  M(
    "cli_train_checks_files_after_start",
    "t2t-train checks the input files only after its log lines and JAX's start-up",
    "t2t_jax/cli/train.py",
    "    trainer.check_inputs(config, flags.FLAGS.workdir)",
    "    trainer.checked_config(config)",
    FIRST,
  ),
  M(
    "cli_checkpoint_spec_zero",
    "--checkpoint=average:0 passes the up-front check",
    "t2t_jax/cli/common.py",
    "(average|best):[1-9]\\d*",
    "(average|best):\\d+",
    FIRST,
  ),
  M(
    "cli_reexecute_after_import",
    "a console script imports its tool (and jax) before re-executing: every start imports twice",
    "t2t_jax/cli/host.py",
    "    use_huge_pages()\n    _import_frozen(module).run()",
    "    tool = _import_frozen(module)\n    use_huge_pages()\n    tool.run()",
    ("tests/test_host.py",),
  ),
)
