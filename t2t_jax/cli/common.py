"""Command-line plumbing shared by the commands: `run` (absl's app.run with a useful --help)
and, for t2t-train, t2t-prepare and t2t-bench, --experiment -> the --config flag."""

import difflib
import importlib.util
import logging as std_logging
import os
import sys
from collections.abc import Callable, Sequence

import ml_collections
from absl import app, flags, logging
from ml_collections import config_flags

import t2t_jax.experiments

EXPERIMENTS_DIR = os.path.dirname(t2t_jax.experiments.__file__)
DEFAULT_EXPERIMENT = "tiny"


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
  try:
    path = experiment_path(experiment_from_argv(sys.argv))
  except app.UsageError as e:
    sys.exit(f"{tool}: {e}")
  try:
    config_flags.DEFINE_config_file(
      "config", path, "experiment config (set by --experiment)", lock_config=True
    )
  except (KeyError, AttributeError):
    unknown = unknown_override(load_experiment(path), sys.argv)
    if unknown is None:
      raise
    sys.exit(f"{tool}: {unknown}")


def load_experiment(path: str) -> ml_collections.ConfigDict:
  """get_config() (or get_config(ARG)) of 'file.py[:ARG]', as --config loads it."""
  file, sep, arg = path.partition(":")
  spec = importlib.util.spec_from_file_location("_t2t_experiment", file)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg) if sep else module.get_config()


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
  noisy = ("/orbax/", "/tensorflow_datasets/", "/etils/", "/grain/")

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


def run(main: Callable[[list[str]], None], doc: str) -> None:
  """app.run(main) where --help prints `doc` (the command's module docstring: what it does
  and an example) and the command's own flags with their defaults, not absl's bare usage
  line. Call it after every flag is defined."""
  adopt_own_flags()
  sys.modules["__main__"].__doc__ = doc
  app.run(main)
