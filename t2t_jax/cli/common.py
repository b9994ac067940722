"""Command-line plumbing shared by the commands: `run` (absl's app.run with a useful --help
and one-line refusals) and, for t2t-train, t2t-prepare and t2t-bench, --experiment -> the
--config flag.

Exit status of every command: 0 done (and `--help`); 2 the command line is wrong (a flag
missing, misspelled or out of range, an unknown experiment, a config value that makes no
sense alone or with another: `check_config`), found before anything is read or written; 1
the command line is well formed but what it names is not (a missing or misaligned file, a
workdir without checkpoints). Either way stderr holds one line, '<command>: <the problem>;
<the way out>', and no traceback.
"""

import difflib
import functools
import importlib.util
import logging as std_logging
import os
import re
import sys
import types
from collections.abc import Callable, Sequence
from typing import NoReturn

import ml_collections
from absl import app, flags, logging
from ml_collections import config_flags

import t2t_jax.experiments

EXPERIMENTS_DIR = os.path.dirname(t2t_jax.experiments.__file__)
DEFAULT_EXPERIMENT = "tiny"
EXIT_USAGE = 2  # the command line itself is wrong (as getopt/argparse tools exit)


class UsageExit(SystemExit):
  """A wrong command line: exit status EXIT_USAGE, and str() is the one line
  '<tool>: <problem>' that `run` prints to stderr (for an integer status the interpreter
  prints nothing itself)."""

  def __init__(self, line: str) -> None:
    super().__init__(EXIT_USAGE)
    self.line = line
    self.printed = False

  def __str__(self) -> str:
    return self.line


def refuse(tool: str, problem: str) -> NoReturn:
  """Prints '<tool>: <problem>' as the one line on stderr and exits with EXIT_USAGE."""
  error = UsageExit(f"{tool}: {problem}")
  _print_once(error)
  raise error


def _print_once(error: UsageExit) -> None:
  if not error.printed:
    print(error.line, file=sys.stderr, flush=True)
    error.printed = True


def available_experiments() -> list[str]:
  """Training experiments: files in experiments/ that define get_config() (not programs such
  as why_self_attention)."""
  names = []
  for f in sorted(os.listdir(EXPERIMENTS_DIR)):
    if f.endswith(".py") and not f.startswith("_"):
      with open(os.path.join(EXPERIMENTS_DIR, f), encoding="utf-8") as source:
        if "\ndef get_config(" in source.read():
          names.append(f[:-3])
  return names


def experiment_path(name: str) -> str:
  """Resolves --experiment=NAME[:ARG] to 'file.py[:ARG]' (ARG goes to get_config)."""
  name, sep, arg = name.partition(":")
  if name.endswith(".py") and os.path.isfile(name):
    return name + sep + arg
  path = os.path.join(EXPERIMENTS_DIR, f"{name}.py")
  if name not in available_experiments():
    raise app.UsageError(
      f"--experiment={name}: unknown experiment; available: {', '.join(available_experiments())}"
    )
  return path + sep + arg


def experiment_from_argv(argv: Sequence[str]) -> str:
  """--experiment must be known before flag parsing: it picks the file --config.* overrides."""
  for i, arg in enumerate(argv):
    if arg.startswith("--experiment="):
      return arg.split("=", 1)[1]
    if arg == "--experiment" and i + 1 < len(argv):
      return argv[i + 1]
  return DEFAULT_EXPERIMENT


def define_config_flag(tool: str) -> None:
  """Defines --config from --experiment in sys.argv; exits with the known names if unknown,
  and with one line naming the flag and the nearest fields for an override of a field the
  experiment's config lacks (ml_collections applies the overrides here, and would end in
  chained tracebacks)."""
  flags.DEFINE_bool(
    "helpconfig", False, "list the experiment's config fields (value, default, what each does)"
  )
  name = experiment_from_argv(sys.argv)
  try:
    path = experiment_path(name)
  except app.UsageError as e:
    refuse(tool, str(e))
  try:
    config = load_experiment(path)
  except Exception as e:  # get_config's own refusal (a Table 3 row, a direction): its words
    refuse(tool, f"--experiment={name}: {_first_line(e)}")
  try:
    config_flags.DEFINE_config_file(
      "config", path, "experiment config (set by --experiment)", lock_config=True
    )
  except (KeyError, AttributeError, ValueError, TypeError) as e:
    unknown = unknown_override(config, sys.argv)
    refuse(tool, unknown or f"{_first_line(e)} ({tool} --experiment={name} --helpconfig)")


def _first_line(error: BaseException) -> str:
  lines = str(error).strip().splitlines()
  return lines[0] if lines else type(error).__name__


def _experiment_module(path: str) -> types.ModuleType:
  spec = importlib.util.spec_from_file_location("_t2t_experiment", path.partition(":")[0])
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def load_experiment(path: str) -> ml_collections.ConfigDict:
  """get_config() (or get_config(ARG)) of 'file.py[:ARG]', as --config loads it."""
  _, sep, arg = path.partition(":")
  module = _experiment_module(path)
  return module.get_config(arg) if sep else module.get_config()


def experiment_check(path: str) -> Callable[[ml_collections.ConfigDict], None] | None:
  """The experiment's own rule for its config, `check_config(config)` of 'file.py[:ARG]'
  (raising ValueError naming the field), or None where the file defines none."""
  return getattr(_experiment_module(path), "check_config", None)


def check_config(tool: str, config: ml_collections.ConfigDict, experiment: str) -> None:
  """Refuses (one line, exit 2) a config that is wrong as a whole, before any file or folder
  is made: every field's type and value, the rules between fields and the experiment's own
  (t2t_jax.training.checks)."""
  from t2t_jax import data
  from t2t_jax.training import checks

  try:
    checks.check(config, experiment_check(experiment_path(experiment)))
  except (checks.ConfigError, data.DataError) as e:
    refuse(tool, str(e))


def unknown_override(config: ml_collections.ConfigDict, argv: Sequence[str]) -> str | None:
  """'--config.A.B=V: config.A has no field B (nearest: ...)' for the first override in
  `argv` naming a field `config` lacks; None when every override names a field."""
  for arg in argv:
    name = arg.split("=", 1)[0]
    for prefix in ("--config.", "--noconfig."):
      if name.startswith(prefix):
        break
    else:
      continue
    node, where = config, "config"
    for part in name[len(prefix) :].split("."):
      fields = list(node.keys()) if isinstance(node, (ml_collections.ConfigDict, dict)) else None
      if fields is None:
        return f"{arg}: {where} is {node!r}, which has no fields"
      if part not in fields:
        near = difflib.get_close_matches(part, fields, n=3)
        hint = f"nearest: {', '.join(near)}" if near else f"its fields: {', '.join(sorted(fields))}"
        return f"{arg}: {where} has no field {part!r} ({hint})"
      node, where = node[part], f"{where}.{part}"
  return None


# Every command's --checkpoint: which parameters of a workdir (run.checkpoint.resolve_spec).
CHECKPOINT_HELP = (
  "'latest', 'average:N' (last N), 'best' or 'best:N' (the best by the dev metric t2t-train "
  "ranked by; best:N averages the N best), 'ema' (the moving average of the parameters "
  "kept with config.ema_decay), a step, 'selected' (the choice t2t-train made on dev), or "
  "'auto': 'selected' when the workdir has one, else 'latest'"
)

COMPILATION_CACHE_HELP = (
  "directory of JAX's persistent compilation cache, so that a later run reads the programs "
  "this one compiled ('default': $T2T_COMPILATION_CACHE, else ~/.cache/t2t_jax/xla; "
  "'off': compile everything)"
)


def use_compilation_cache(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """Turns on the cache --compilation_cache names, before anything compiles."""
  from t2t_jax import compilation

  compilation.enable(flag_values.compilation_cache)


def quiet_library_logs() -> None:
  """Keeps the console to our progress lines: orbax's and TFDS's INFO chatter is dropped."""
  noisy = ("/orbax/", "/tensorflow_datasets/", "/etils/", "/grain/", "/jax/", "/jaxlib/")

  def keep(record: std_logging.LogRecord) -> bool:
    return record.levelno >= std_logging.WARNING or not any(n in record.pathname for n in noisy)

  logging.get_absl_handler().addFilter(keep)
  # Outside absl.app (a notebook) the absl handler is not installed: filter at the logger.
  std_logging.getLogger("absl").addFilter(keep)


def adopt_own_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """Makes every flag defined by a t2t_jax module a key flag of the program.

  absl's --help lists only the key flags of `__main__` (named by sys.argv[0]); a console
  script's `__main__` is a stub, so the command's flags, defined in t2t_jax.cli.* (and
  t2t_jax.training.distributed, the --config flag in this module), would be left out.
  """
  program = sys.argv[0]
  for module, defined in flag_values.flags_by_module_dict().items():
    if module.startswith("t2t_jax.") and module != program:
      for flag in defined:
        flag_values.register_key_flag_for_module(program, flag)


CHECKPOINT_SPEC = re.compile(r"^(auto|selected|latest|best|ema|\d+|(average|best):[1-9]\d*)$")
CHECKPOINT_CHOICES = "'auto', 'selected', 'latest', 'average:N', 'best', 'best:N', 'ema' or a step"


def check_checkpoint_flag(tool: str, spec: str, flag: str = "--checkpoint") -> None:
  """UsageExit for a --checkpoint value that no workdir could meet (a typo, 'average:0'),
  before any workdir is read; whether the workdir holds that checkpoint is checked later."""
  if not CHECKPOINT_SPEC.match(spec):
    raise UsageExit(f"{tool}: {flag}={spec}: not {CHECKPOINT_CHOICES} (N >= 1)")


def tool_name(main: Callable[..., object]) -> str:
  """'t2t-train' for t2t_jax.cli.train.main, also when run as `python -m t2t_jax.cli.train`."""
  module = main.__module__
  if module == "__main__":
    module = os.path.splitext(os.path.basename(sys.argv[0]))[0]
  name = module.rsplit(".", 1)[-1]
  return name if name.startswith("t2t-") else f"t2t-{name}"


def parse_flags(tool: str, argv: list[str]) -> list[str]:
  """absl's flag parsing, with a flag error as one line (exit 2) instead of absl's FATAL
  and its pointer to --helpfull, and --help exiting 0 rather than absl's 1."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    hint = "--experiment=NAME --helpconfig lists the fields" if "config." in str(e) else "--help"
    refuse(tool, f"{_first_line(e)} ({tool} {hint})")
  except SystemExit as e:
    # Parsing exits by itself only for absl's --help/--helpshort/--helpfull/--helpxml,
    # with status 1 after printing the help: that is a success.
    raise SystemExit(0 if e.code == 1 else e.code) from None


def refusing(tool: str, main: Callable[[list[str]], None]) -> Callable[[list[str]], None]:
  """`main` with app.UsageError as one line and exit 2 (absl would print the whole help
  before the message, and exit 1); with --helpconfig (commands that take --experiment), the
  experiment's config fields instead."""

  @functools.wraps(main)
  def wrapped(argv: list[str]) -> None:
    if "helpconfig" in flags.FLAGS and flags.FLAGS.helpconfig:
      from t2t_jax.cli import helpconfig

      print(helpconfig.describe(flags.FLAGS.config, flags.FLAGS.experiment))
      return
    try:
      main(argv)
    except app.UsageError as e:
      refuse(tool, str(e))

  return wrapped


def run(main: Callable[[list[str]], None], doc: str) -> None:
  """app.run(main) where --help prints `doc` (the command's module docstring: what it does
  and an example) and the command's own flags with their defaults, not absl's bare usage
  line, and where a wrong command line is one line on stderr and exit status 2. Call it
  after every flag is defined."""
  adopt_own_flags()
  sys.modules["__main__"].__doc__ = doc
  tool = tool_name(main)
  try:
    app.run(refusing(tool, main), flags_parser=functools.partial(parse_flags, tool))
  except UsageExit as e:
    _print_once(e)
    raise
