"""README's Python snippet decodes as README's t2t-translate command does.

`Translator.from_workdir`'s defaults are t2t-translate's (the checkpoint chosen on dev,
bfloat16 where the CPU has it), so a user moving from the command to a notebook keeps the
same lines. The quick test compares the defaults; the slow one runs both README blocks.
"""

import ast
import inspect
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from tests import support

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _section_blocks(language: str) -> list[str]:
  readme = (ROOT / "README.md").read_text()
  section = readme.split("## Translating and scoring", 1)[1].split("\n## ", 1)[0]
  return re.findall(rf"```{language}\n(.*?)```", section, re.S)


def _readme_pair() -> tuple[str, str]:
  """(the shell line piping sentences into t2t-translate, the Python block)."""
  (command,) = [b for b in _section_blocks("bash") if "| t2t-translate" in b]
  (python,) = _section_blocks("python")
  return command.strip(), python


def _flag_defaults(path: pathlib.Path) -> dict[str, object]:
  """{flag: default} of a command's `flags.DEFINE_*("name", default, ...)` calls."""
  found = {}
  for node in ast.walk(support.parse_source(path)):
    call = node if isinstance(node, ast.Call) else None
    if call and getattr(call.func, "attr", "").startswith("DEFINE_") and len(call.args) > 1:
      name, default = call.args[:2]
      if isinstance(name, ast.Constant) and isinstance(default, ast.Constant):
        found[name.value] = default.value
  return found


def test_from_workdir_defaults_are_t2t_translate_flag_defaults():
  from t2t_jax.decoding.translator import Translator

  defaults = _flag_defaults(ROOT / "t2t_jax" / "cli" / "translate.py")
  assert {"checkpoint", "dtype"} <= defaults.keys()
  for method in (Translator.from_workdir, Translator.from_workdirs):
    params = inspect.signature(method).parameters
    assert params["checkpoint_spec"].default == defaults["checkpoint"]
    assert params["dtype"].default == defaults["dtype"]
  command, python = _readme_pair()
  assert "--checkpoint" not in command and "--dtype" not in command  # the defaults, both
  assert re.search(r'from_workdir\("workdirs/tiny"\)', python)


@pytest.mark.slow
def test_readme_python_snippet_gives_the_lines_of_readme_command(tmp_path):
  """Both README blocks as written, in a directory whose workdirs/tiny is a small model with
  checkpoints 2, 4, 6 and a dev choice of step 2 (so the latest is not the default's pick),
  without the suite's float32 override of 'auto'."""
  from t2t_jax.training import trainer
  from tests.test_train import small_config

  workdir = tmp_path / "workdirs" / "tiny"
  trainer.train_and_evaluate(small_config(checkpoint_every_steps=2), str(workdir))
  (workdir / "selected.json").write_text('{"checkpoint": "2", "steps": [2]}')
  env = support.cpu_env()
  env.pop("T2T_DECODE_DTYPE", None)
  env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
  assert shutil.which("t2t-translate", path=env["PATH"]), "t2t-translate not installed"
  command, python = _readme_pair()
  shell = subprocess.run(
    ["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True
  )
  assert shell.returncode == 0, shell.stderr[-3000:]
  snippet = subprocess.run(
    [sys.executable, "-c", python], cwd=tmp_path, env=env, capture_output=True, text=True
  )
  assert snippet.returncode == 0, snippet.stderr[-3000:]
  assert snippet.stdout.splitlines() == shell.stdout.splitlines()
  assert len(shell.stdout.splitlines()) == command.count("\\n")


def _record_entries(revision: str) -> str:
  """The text of bench/record/performance.md's entries headed with `revision`."""
  record = (ROOT / "bench" / "record" / "performance.md").read_text()
  entries = re.split(r"\n(?=### )", record)
  return "\n".join(e for e in entries if e.startswith(f"### `{revision}`"))


def readme_figures_by_record() -> dict[str, list[str]]:
  """{revision: the decimal figures of the tables that follow README's "record `REV`"}."""
  readme = (ROOT / "README.md").read_text()
  found = {}
  for match in re.finditer(r"record `([0-9a-f]{7})`", readme):
    rest = readme[match.end() :].split("\n## ", 1)[0]
    rest = rest.split("record `", 1)[0]  # up to the next figure's source
    tables = "\n".join(line for line in rest.splitlines() if line.startswith("|"))
    found[match[1]] = re.findall(r"\d[\d,]*\.\d+", tables)
  return found


def test_readme_figures_are_the_record_entries_they_cite():
  """Every decimal figure in a README table is in the results-record entry it names."""
  figures = readme_figures_by_record()
  assert len(figures) >= 2 and all(figures.values()), figures
  for revision, numbers in figures.items():
    entry = _record_entries(revision)
    assert entry, f"README cites record `{revision}`, which has no entry"
    missing = [n for n in numbers if n not in entry]
    assert not missing, f"README's figures {missing} are not in record `{revision}`"
