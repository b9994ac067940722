"""Bad input to every command ends in one line naming the path or the field, exit status 1 (2 for a
field the config lacks: a wrong command line), no traceback, and nothing created: a file or a
missing directory as --workdir, a corrupt config.json, a selection file that holds no choice, an
--output that cannot be written, an override of a field the experiment lacks.

Each command runs as its console script does (`run()`: flag parsing, absl's app.run, the
interpreter's handling of SystemExit), in a forked child of one interpreter that loaded the
libraries once: one subprocess for every case instead of one (about 4 s) per case.
"""

import json
import os
import pathlib

import pytest

from t2t_jax.data import store
from t2t_jax.run.workdir import Workdir
from tests import support
from tests.test_train import small_config


def _absl_log_line(line: str) -> bool:
  """absl's 'I1201 16:43:52.654639 140529 train.py:53] ...' progress lines (not errors)."""
  return len(line) > 5 and line[0] in "IWE" and line[1:5].isdigit()


def _cases(root: str) -> dict[str, tuple[str, list[str], str]]:
  """name -> (command, arguments, what its one line of error must say)."""
  a_file, missing = f"{root}/a_file", f"{root}/typo"
  good, corrupt, listed = f"{root}/good", f"{root}/corrupt", f"{root}/listed"
  src = f"{root}/src.txt"
  not_a_dir = f"--workdir={a_file} is not a directory"
  no_config = "no config.json (not a t2t-train workdir?)"
  bad_config = f"{corrupt}/config.json: not a t2t-train config: Expecting value: line 1"
  selection = f"{listed}/selected.json is not a selection file"
  cases = {
    "train-workdir-is-a-file": ("train", [f"--workdir={a_file}"], not_a_dir),
    "train-misspelled-field": (
      "train",
      [f"--workdir={root}/new", "--config.num_train_step=5"],
      "--config.num_train_step=5: config has no field 'num_train_step' (nearest: num_train_steps)",
    ),
    "train-misspelled-model-field": (
      "train",
      [f"--workdir={root}/new", "--config.model.d_modle=8"],
      "--config.model.d_modle=8: config.model has no field 'd_modle' (nearest: d_model",
    ),
    "prepare-workdir-is-a-file": ("prepare", [f"--workdir={a_file}"], not_a_dir),
    "prepare-misspelled-field": (
      "prepare",
      [f"--workdir={root}/new", "--config.data.vocab_sise=64"],
      "--config.data.vocab_sise=64: config.data has no field 'vocab_sise' (nearest: vocab_size",
    ),
    "prepare-verify-a-flipped-byte": (
      "prepare",
      [f"--workdir={root}/damaged", "--verify"],
      f"{root}/damaged/prepared/train.inputs.npy: sha256 ",
    ),
    "prepare-verify-no-store": (
      "prepare",
      [f"--workdir={missing}", "--verify"],
      f"{missing}/prepared/manifest.json: no prepared data to verify",
    ),
    "translate-output-in-no-directory": (
      "translate",
      [f"--workdir={good}", f"--input={src}", "--output=/no/such/dir/x"],
      "--output=/no/such/dir/x: cannot write (No such file or directory)",
    ),
    "translate-selection-entry-is-no-choice": (
      "translate",
      [f"--workdir={root}/numbered", f"--input={src}", "--checkpoint=selected"],
      f"{root}/numbered/selected.json is not a selection file: its 'checkpoint' entry 6 is not",
    ),
    "average-output-is-a-file": (
      "average",
      [f"--workdir={good}", f"--output={a_file}"],
      f"--output={a_file} is not a directory",
    ),
    "average-workdir-is-a-file": (
      "average",
      [f"--workdir={a_file}", f"--output={root}/avg"],
      not_a_dir,
    ),
    "average-missing-workdir": (
      "average",
      [f"--workdir={missing}", f"--output={root}/avg"],
      f"--workdir={missing} does not exist",
    ),
    "average-corrupt-config": (
      "average",
      [f"--workdir={corrupt}", f"--output={root}/avg"],
      bad_config,
    ),
  }
  for command, extra in (
    ("translate", [f"--input={src}"]),
    ("export", [f"--output={root}/exported"]),
  ):
    cases[f"{command}-workdir-is-a-file"] = (command, [f"--workdir={a_file}", *extra], no_config)
    cases[f"{command}-missing-workdir"] = (command, [f"--workdir={missing}", *extra], no_config)
    cases[f"{command}-corrupt-config"] = (command, [f"--workdir={corrupt}", *extra], bad_config)
    cases[f"{command}-selection-is-a-list"] = (command, [f"--workdir={listed}", *extra], selection)
  return cases


CASE_NAMES = sorted(_cases("ROOT"))


@pytest.fixture(scope="module")
def results(tmp_path_factory):
  """(root, name -> {status, stderr, created}): every case, each in its own forked child."""
  root = str(tmp_path_factory.mktemp("bad_input"))
  out_dir = str(tmp_path_factory.mktemp("bad_input_stderr"))
  with open(f"{root}/a_file", "w") as f:
    f.write("not a workdir\n")
  with open(f"{root}/src.txt", "w") as f:
    f.write("1 2 3\n")
  for name in ("good", "corrupt", "listed", "numbered"):
    os.makedirs(f"{root}/{name}")
    Workdir(f"{root}/{name}").write_start(small_config())
  with open(f"{root}/corrupt/config.json", "w") as f:
    f.write('{"model": ')  # cut short
  with open(f"{root}/listed/selected.json", "w") as f:
    json.dump(["latest", "average:2"], f)
  with open(f"{root}/numbered/selected.json", "w") as f:
    json.dump({"checkpoint": 6}, f)  # a step, not the spec "6"
  for name in ("damaged", "intact"):  # a store's files and the manifest of their sha256s
    os.makedirs(f"{root}/{name}/prepared")
    with open(f"{root}/{name}/prepared/train.inputs.npy", "wb") as f:
      f.write(bytes(range(100)))
    store.write_manifest(pathlib.Path(f"{root}/{name}/prepared"), {"format_version": 1})
  with open(f"{root}/damaged/prepared/train.inputs.npy", "r+b") as f:
    f.seek(50), f.write(b"\xff")  # same size: only the sha256 tells
  cases = [[name, command, args] for name, (command, args, _) in _cases(root).items()]
  cases.append(["prepare-verify-intact", "prepare", [f"--workdir={root}/intact", "--verify"]])
  return root, support.forked_commands(cases, root, out_dir)


@pytest.mark.parametrize("name", CASE_NAMES)
def test_bad_input_is_one_line_naming_it_and_creates_nothing(results, name):
  root, got = results
  command, _, expected = _cases(root)[name]
  result = got[name]
  stderr = result["stderr"]
  assert result["status"] == (2 if "misspelled" in name else 1), stderr  # 2: the command line
  assert "Traceback" not in stderr, stderr
  errors = [line for line in stderr.splitlines() if line.strip() and not _absl_log_line(line)]
  assert len(errors) == 1 and errors[0].startswith(f"t2t-{command}: "), stderr
  assert expected in errors[0], stderr
  assert result["created"] == [], result["created"]  # refused before any work


def test_verify_of_an_intact_store_exits_0_and_creates_nothing(results):
  _, got = results
  result = got["prepare-verify-intact"]
  assert result["status"] == 0, result["stderr"]
  assert "Traceback" not in result["stderr"] and result["created"] == []
