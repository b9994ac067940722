"""Every console script's --help says what the command does, shows an example and lists the
command's own flags with their defaults (not the flags of JAX, absl or other libraries)."""

import configparser
import os

import pytest

from tests import support

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

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
    "t2t-serve --workdir=[SRC:TGT=]DIR[,DIR...] [--workdir=...] [--host=127.0.0.1] [--port=5000]",
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


@pytest.fixture(scope="module")
def helps(tmp_path_factory) -> dict[str, str]:
  """command -> what `command --help` prints, through its setup.cfg entry point, each in a
  forked child of one interpreter that loaded the libraries once."""
  cases = []
  for command, target in console_scripts().items():
    name = command.removeprefix("t2t-")
    # what forked_commands calls: the module's run(), directly or after host's re-execution
    assert target in (f"t2t_jax.cli.{name}:run", f"t2t_jax.cli.host:{name}"), target
    cases.append([command, name, ["--help"]])
  out_dir = tmp_path_factory.mktemp("help")
  results = support.forked_commands(cases, str(out_dir), str(out_dir))
  assert all(r["status"] == 0 for r in results.values()), results
  return {command: r["stdout"] for command, r in results.items()}


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
