"""The install lines: constraints.txt against setup.cfg, README's test command against CI.

A pin that setup.cfg's ranges exclude makes `pip install -c constraints.txt` fail on a fresh
machine, and a README test command that is not CI's tests something other than what a user
runs; both are checked here rather than found by a newcomer.
"""

import configparser
import pathlib
import re

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = pathlib.Path(__file__).resolve().parent.parent
# The extras README's test command and CI install (and so constraints.txt must pin).
TESTED_EXTRAS = ("dev", "export", "serve", "browser")


def _requirements(text: str) -> list[Requirement]:
  lines = (line.split("#", 1)[0].strip() for line in text.splitlines())
  return [Requirement(line) for line in lines if line]


def setup_requirements(setup_cfg: str) -> dict[str, list[Requirement]]:
  """{"": install_requires, extra: its requirements} of a setup.cfg's text."""
  cfg = configparser.ConfigParser()
  cfg.read_string(setup_cfg)
  found = {"": _requirements(cfg["options"]["install_requires"])}
  for extra, text in cfg["options.extras_require"].items():
    found[extra] = _requirements(text)
  return found


def pins(constraints: str) -> dict[str, Version]:
  """{canonical name: version} of a constraints file's `name==version` lines."""
  found = {}
  for number, line in enumerate(constraints.splitlines(), 1):
    line = line.split("#", 1)[0].strip()
    if not line:
      continue
    match = re.fullmatch(r"([A-Za-z0-9_.\-]+)==(\S+)", line)
    assert match, f"constraints.txt:{number}: {line!r} is not name==version"
    found[canonicalize_name(match[1])] = Version(match[2])
  return found


def constraint_problems(setup_cfg: str, constraints: str) -> list[str]:
  """Pins that a setup.cfg range excludes, and tested requirements left unpinned."""
  pinned = pins(constraints)
  problems = []
  for extra, requirements in setup_requirements(setup_cfg).items():
    where = f"[{extra}]" if extra else "install_requires"
    for requirement in requirements:
      name = canonicalize_name(requirement.name)
      if name in pinned:
        if not requirement.specifier.contains(pinned[name], prereleases=True):
          problems.append(f"{name}=={pinned[name]} is outside setup.cfg {where} {requirement}")
      elif extra in ("", *TESTED_EXTRAS):
        problems.append(f"{name} ({where}) has no pin in constraints.txt")
  return problems


def test_every_pin_is_inside_setup_cfg_and_every_tested_requirement_is_pinned():
  problems = constraint_problems(
    (ROOT / "setup.cfg").read_text(), (ROOT / "constraints.txt").read_text()
  )
  assert not problems, "\n".join(problems)


def test_the_constraint_check_fails_on_a_pin_outside_a_range_or_missing():
  setup_cfg = "[options]\ninstall_requires =\n    jax>=0.9.0\n    numpy>=2.0,<3  # why\n"
  setup_cfg += "[options.extras_require]\ndev =\n    pytest>=8.0\ncuda12 =\n    jax[cuda12]>=0.9\n"
  assert constraint_problems(setup_cfg, "jax==0.10.2\nNumPy==2.4.6\npytest==9.2.0\n") == []
  assert constraint_problems(setup_cfg, "jax==0.8.0\nnumpy==2.4.6\npytest==9.2.0\n") == [
    "jax==0.8.0 is outside setup.cfg install_requires jax>=0.9.0",
    "jax==0.8.0 is outside setup.cfg [cuda12] jax[cuda12]>=0.9",
  ]
  assert constraint_problems(setup_cfg, "jax==0.10.2\nnumpy==3.0\n") == [
    "numpy==3.0 is outside setup.cfg install_requires numpy<3,>=2.0",
    "pytest ([dev]) has no pin in constraints.txt",
  ]


def readme_commands() -> list[str]:
  """The one-line commands of README's "Set up" section, in order."""
  readme = (ROOT / "README.md").read_text()
  section = readme.split("## Set up", 1)[1].split("\n## ", 1)[0]
  return [block.strip() for block in re.findall(r"```bash\n(.*?)```", section, re.S)]


def test_readme_gives_two_set_up_commands_and_ci_runs_the_test_command_verbatim():
  commands = readme_commands()
  assert len(commands) == 2 and all("\n" not in c for c in commands), commands
  test_command = commands[1]
  for part in test_command.split(" && "):
    assert part in (ROOT / ".ci" / "run").read_text().splitlines(), (
      f".ci/run does not run README's {part!r}"
    )
  install = next(p for p in test_command.split(" && ") if "-e '.[" in p)
  assert "-c constraints.txt" in install
  assert re.search(r"-e '\.\[([a-z0-9,]+)\]'", install)[1].split(",") == list(TESTED_EXTRAS)
