"""Every console script's --help says what the command does, shows an example and lists the
command's own flags with their defaults (not the flags of JAX, absl or other libraries)."""

import configparser
import os
import shutil
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


def _help(command: str, target: str) -> str:
  """`command --help` as installed, or through its entry point when not on PATH."""
  if shutil.which(command):
    argv = [command, "--help"]
  else:
    module, function = target.split(":")
    code = f"import sys; sys.argv[0] = {command!r}; from {module} import {function}; {function}()"
    argv = [sys.executable, "-c", code, "--help"]
  proc = subprocess.run(argv, env=ENV, capture_output=True, text=True, timeout=300, cwd=REPO)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return proc.stdout


@pytest.mark.parametrize("command", sorted(EXPECTED))
def test_help_shows_the_doc_an_example_and_the_own_flags(command):
  text = _help(command, console_scripts()[command])
  example, own_flags = EXPECTED[command]
  assert text.startswith(f"{command}: "), text[:300]
  assert example in text
  for flag in own_flags:
    assert f"  {flag}:" in text or f"  --[no]{flag[2:]}:" in text, (flag, text)
  assert "(default: " in text
  assert "--xla_" not in text and "jax_" not in text
  assert "Try --helpfull" not in text.splitlines()[0]
