"""Reading a trained model never loads the trainer, and a workdir's files are named once.

Decoding, evaluation, export and the plots (and the run layer they read workdirs with) may
not import t2t_jax.training, neither in their own source (checked on the syntax tree, so an
import inside a function or under TYPE_CHECKING counts) nor through anything they import
(checked in a fresh interpreter).
"""

import ast
import json
import pathlib
import subprocess
import sys

import pytest

import t2t_jax
from t2t_jax.run.workdir import Workdir
from tests import support

PACKAGE = pathlib.Path(t2t_jax.__file__).resolve().parent
READERS = (
  "decoding",
  "evaluation",
  "export",
  "viz",
  "run",
  "translate.py",
  "schedule.py",
  "cli/translate.py",
  "cli/export.py",
  "cli/average.py",
  "serve",
  "cli/serve.py",
)
TRAINING = "t2t_jax.training"


def _sources(*names: str) -> list[pathlib.Path]:
  out = []
  for name in names:
    path = (PACKAGE / name).resolve()
    out += sorted(path.rglob("*.py")) if path.is_dir() else [path]
  return out


def _imported(tree: ast.AST) -> list[str]:
  """Every module an import statement names, `from a import b` as both a and a.b."""
  names = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names += [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      names.append(node.module)
      names += [f"{node.module}.{alias.name}" for alias in node.names]
  return names


def _is_training(module: str) -> bool:
  return module == TRAINING or module.startswith(TRAINING + ".")


@pytest.mark.parametrize("path", _sources(*READERS), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_readers_do_not_import_training_in_their_source(path):
  tree = support.parse_source(path)
  assert not [m for m in _imported(tree) if _is_training(m)]


LOADED = """
import importlib, json, pkgutil, sys
import t2t_jax
roots = ["t2t_jax.decoding", "t2t_jax.evaluation", "t2t_jax.export", "t2t_jax.viz",
         "t2t_jax.run", "t2t_jax.translate", "t2t_jax.schedule", "t2t_jax.cli.translate",
         "t2t_jax.serve", "t2t_jax.cli.serve"]
skipped = []
for root in roots:
  package = importlib.import_module(root)
  for info in pkgutil.walk_packages(getattr(package, "__path__", []), root + "."):
    try:
      importlib.import_module(info.name)
    except ImportError as e:  # an optional extra (ctranslate2, matplotlib) not installed
      if (e.name or "").startswith("t2t_jax"):
        raise
      skipped.append(info.name)
print(json.dumps(dict(
  training=sorted(m for m in sys.modules if m.startswith("t2t_jax.training")),
  loaded=sorted(m for m in sys.modules if m.startswith("t2t_jax")),
  skipped=skipped)))
"""


def test_importing_every_reader_loads_no_training_module():
  result = subprocess.run(
    [sys.executable, "-c", LOADED], capture_output=True, text=True, timeout=300, check=True
  )
  report = json.loads(result.stdout.strip().splitlines()[-1])
  assert report["training"] == [], report
  assert "t2t_jax.decoding.translator" in report["loaded"]
  assert "t2t_jax.run.checkpoint" in report["loaded"]


def _string_constants(tree: ast.AST) -> list[str]:
  """String literals that are not docstrings (messages and help text may name a file)."""
  docstrings = set()
  for node in ast.walk(tree):
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
      body = node.body
      if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        docstrings.add(id(body[0].value))
  return [
    node.value
    for node in ast.walk(tree)
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
  ]


WORKDIR_FILES = (Workdir.CONFIG, Workdir.STARTS, Workdir.METRICS, Workdir.SELECTED, Workdir.BEST)
# The exporters write a model directory of another format, with that format's config.json.
OTHER_FORMATS = {"export/to_huggingface.py", "export/to_ctranslate2.py"}


@pytest.mark.parametrize("path", _sources("."), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_workdir_file_names_are_spelled_only_in_workdir(path):
  name = str(path.relative_to(PACKAGE))
  if name in {"run/workdir.py"} | OTHER_FORMATS:
    return
  tree = support.parse_source(path)
  assert not [s for s in _string_constants(tree) if s in WORKDIR_FILES + (Workdir.CHECKPOINTS,)]


@pytest.mark.parametrize("path", _sources("run"), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_run_layer_imports_only_itself(path):
  """run/ sits under every other package (data imports run.files): importing any of them
  from it would make a circle."""
  tree = support.parse_source(path)
  others = [m for m in _imported(tree) if m.startswith("t2t_jax") and m != "t2t_jax"]
  assert all(m == "t2t_jax.run" or m.startswith("t2t_jax.run.") for m in others), others


def test_workdir_imports_neither_the_checkpoints_nor_the_lock():
  """run.checkpoint and run.lock build on Workdir: importing either back makes a circle."""
  imported = _imported(support.parse_source(PACKAGE / "run" / "workdir.py"))
  below = ("t2t_jax.run.checkpoint", "t2t_jax.run.lock")
  assert not [m for m in imported if m in below or m.startswith(tuple(b + "." for b in below))]


LIBRARY = [p for p in _sources(".") if p.relative_to(PACKAGE).parts[0] != "cli"]


def _is_cli_or_private_jax(module: str) -> bool:
  return any(module == m or module.startswith(m + ".") for m in ("t2t_jax.cli", "jax._src"))


@pytest.mark.parametrize("path", LIBRARY, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_library_imports_neither_the_command_line_tools_nor_private_jax(path):
  """cli/ sits on top of the library, which serves notebooks and benchmarks without it; jax's
  private modules change between releases without notice."""
  imported = _imported(support.parse_source(path))
  assert not [m for m in imported if _is_cli_or_private_jax(m)]
