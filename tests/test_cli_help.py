"""Every console script's --help says what the command does, shows an example and lists the
command's own flags with their defaults (not the flags of JAX, absl or other libraries)."""

import configparser
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, JAX_PLATFORMS="cpu", T2T_HUGE_PAGES="0")

# Per command: its example line and a few of its own flags.
EXPECTED = {
  "t2t-train": ("t2t-train --experiment=NAME --workdir=DIR", ["--workdir", "--experiment"]),
  "t2t-prepare": ("t2t-prepare --experiment=NAME --workdir=DIR", ["--workdir", "--config"]),
  "t2t-translate": (
    "t2t-translate --workdir=DIR[,DIR...]",
    ["--beam_size", "--nbest", "--checkpoint", "--prefix"],
  ),
  "t2t-average": ("t2t-average --workdir=DIR --num=5", ["--num", "--output"]),
  "t2t-export": ("t2t-export --workdir=DIR --format=ctranslate2", ["--format", "--quantization"]),
  "t2t-bench": ("t2t-bench --experiment=tiny", ["--parts", "--beam_size", "--vs", "--sampling"]),
  "t2t-score": (
    "t2t-score --workdir=DIR[,DIR...] --source=FILE --target=FILE",
    ["--source", "--target", "--per_token", "--checkpoint"],
  ),
  "t2t-compare": (
    "t2t-compare --reference=REF BASELINE SYSTEM [SYSTEM ...]",
    ["--reference", "--paired", "--samples", "--lang"],
  ),
  "t2t-serve": (
    "t2t-serve --workdir=DIR[,DIR...] [--host=127.0.0.1] [--port=5000]",
    ["--workdir", "--host", "--port", "--char_limit", "--api_keys", "--batch_window_ms"],
  ),
}


def console_scripts() -> dict[str, str]:
  """setup.cfg's console_scripts: command -> 'module:function'."""
  parser = configparser.ConfigParser()
  parser.read(os.path.join(REPO, "setup.cfg"))
  lines = parser["options.entry_points"]["console_scripts"].strip().splitlines()
  return dict(tuple(part.strip() for part in line.split("=")) for line in lines)


def test_every_console_script_is_checked():
  assert set(console_scripts()) == set(EXPECTED)


# Each command's entry point with --help in a forked child of one interpreter that loaded the
# libraries once (one start instead of one per command); stdout goes to a file per command.
_HELP_RUNNER = r"""
import importlib, json, os, sys
import jax, ml_collections.config_flags, t2t_jax.training.trainer, t2t_jax.decoding.translator
targets, out_dir = json.loads(sys.argv[1]), sys.argv[2]
status = {}
for command, target in targets.items():
  module, function = target.split(":")
  out = os.path.join(out_dir, command + ".out")
  pid = os.fork()
  if pid == 0:
    os.dup2(os.open(out, os.O_WRONLY | os.O_CREAT), 1)
    sys.argv = [command, "--help"]
    code = 0
    try:
      getattr(importlib.import_module(module), function)()
    except SystemExit as e:
      code = e.code if isinstance(e.code, int) else 1
    sys.stdout.flush()
    os._exit(code)
  status[command] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
print(json.dumps(status))
"""


@pytest.fixture(scope="module")
def helps(tmp_path_factory) -> dict[str, str]:
  """command -> what `command --help` prints, through its setup.cfg entry point."""
  out_dir = tmp_path_factory.mktemp("help")
  proc = subprocess.run(
    [sys.executable, "-c", _HELP_RUNNER, json.dumps(console_scripts()), str(out_dir)],
    env=ENV,
    capture_output=True,
    text=True,
    timeout=300,
    cwd=REPO,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  status = json.loads(proc.stdout.strip().splitlines()[-1])
  assert all(code == 0 for code in status.values()), (status, proc.stderr[-3000:])
  return {command: (out_dir / f"{command}.out").read_text() for command in status}


@pytest.mark.parametrize("command", sorted(EXPECTED))
def test_help_shows_the_doc_an_example_and_the_own_flags(command, helps):
  text = helps[command]
  example, own_flags = EXPECTED[command]
  assert text.startswith(f"{command}: "), text[:300]
  assert example in text
  for flag in own_flags:
    assert f"  {flag}:" in text or f"  --[no]{flag[2:]}:" in text, (flag, text)
  assert "(default: " in text
  assert "--xla_" not in text and "jax_" not in text
  assert "Try --helpfull" not in text.splitlines()[0]
