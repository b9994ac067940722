#!/usr/bin/env python3
"""What t2t_jax needs that a Python lacks, and the planning steps of launch/wheelhouse.sh.

Standard library only: it has to run in the very image that lacks the packages. Versions,
specifiers and markers follow PEP 440 and PEP 508 as far as requirement lists like setup.cfg's
use them (not a full implementation: an unparseable version counts as satisfying).

  python3 launch/wheelhouse.py check [--extra NAME] [--have FILE] [--requirements FILE]
      the requirements this Python (or the one FILE was frozen from) lacks or has too old;
      exit status 1 when there are some
  python3 launch/wheelhouse.py freeze > have.txt
      what this Python has, headed by its version and platform: `wheelhouse.sh build --have`
      builds for exactly that target and leaves out what it already has

The other commands (target, build-requirements, constraints, sdists, fit, plan, finish,
verify) are steps of wheelhouse.sh.
"""

from __future__ import annotations

import argparse
import configparser
import hashlib
import importlib.metadata
import json
import os
import platform
import re
import sys
import sysconfig
import zipfile
from typing import Any, NamedTuple

HERE = os.path.dirname(os.path.abspath(__file__))
SETUP_CFG = os.path.join(HERE, os.pardir, "setup.cfg")
PROJECT = "t2t_jax"
PYPROJECT = os.path.join(HERE, os.pardir, "pyproject.toml")
# Never pinned to the target's version: pip itself, and the build tools above.
UNPINNED = {"pip", "setuptools", "wheel"}
HEADER = "# wheelhouse-target"
PLAN = "plan.json"
MANIFEST = "manifest.json"
REQUIREMENTS = "requirements.txt"
THIS_PYTHON = f"{sys.version_info[0]}.{sys.version_info[1]}"


def normalize(name: str) -> str:
  """PEP 503 name: `ml_collections`, `ML-Collections` and `ml.collections` are one package."""
  return re.sub(r"[-_.]+", "-", name).lower()


# Versions (PEP 440) ------------------------------------------------------------------------

_VERSION = re.compile(
  r"^\s*v?(?:(?P<epoch>\d+)!)?(?P<release>\d+(?:\.\d+)*)"
  r"(?:[-_.]?(?P<pre_l>alpha|beta|preview|pre|rc|a|b|c)[-_.]?(?P<pre_n>\d*))?"
  r"(?:-(?P<post_n1>\d+)|[-_.]?(?P<post_l>post|rev|r)[-_.]?(?P<post_n2>\d*))?"
  r"(?:[-_.]?(?P<dev_l>dev)[-_.]?(?P<dev_n>\d*))?"
  r"(?:\+(?P<local>[a-z0-9]+(?:[-_.][a-z0-9]+)*))?\s*$",
  re.IGNORECASE,
)
_PRE_RANK = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "c": 2, "rc": 2, "pre": 2, "preview": 2}


class Version(NamedTuple):
  epoch: int
  release: tuple[int, ...]
  pre: tuple[int, int] | None
  post: int | None
  dev: int | None
  local: str | None

  def key(self) -> tuple[Any, ...]:
    """Sort key of packaging.version: dev < pre < release < post; trailing zeros ignored."""
    release = self.release
    while len(release) > 1 and release[-1] == 0:
      release = release[:-1]
    if self.pre is None and self.post is None and self.dev is not None:
      pre: tuple[int, ...] = (-1,)
    elif self.pre is None:
      pre = (1,)
    else:
      pre = (0, *self.pre)
    post = (-1,) if self.post is None else (0, self.post)
    dev = (1,) if self.dev is None else (0, self.dev)
    return (self.epoch, release, pre, post, dev)


def parse_version(text: str) -> Version | None:
  m = _VERSION.match(text)
  if not m:
    return None
  pre = None
  if m["pre_l"]:
    pre = (_PRE_RANK[m["pre_l"].lower()], int(m["pre_n"] or 0))
  post = None
  if m["post_n1"]:
    post = int(m["post_n1"])
  elif m["post_l"]:
    post = int(m["post_n2"] or 0)
  dev = int(m["dev_n"] or 0) if m["dev_l"] else None
  return Version(
    int(m["epoch"] or 0),
    tuple(int(x) for x in m["release"].split(".")),
    pre,
    post,
    dev,
    m["local"].lower() if m["local"] else None,
  )


def _matches_prefix(have: Version, prefix: tuple[int, ...]) -> bool:
  padded = have.release + (0,) * max(0, len(prefix) - len(have.release))
  return padded[: len(prefix)] == prefix


def spec_allows(op: str, wanted: str, have_text: str) -> bool:
  """One clause such as `>=0.2.5` against an installed version. An installed pre-release
  counts like any other version: it is what the machine runs."""
  if op == "===":
    return have_text.strip().lower() == wanted.strip().lower()
  have = parse_version(have_text)
  if have is None:
    return True
  if op in ("==", "!=") and wanted.endswith(".*"):
    base = parse_version(wanted[:-2])
    if base is None:
      return True
    equal = have.epoch == base.epoch and _matches_prefix(have, base.release)
    return equal if op == "==" else not equal
  spec = parse_version(wanted)
  if spec is None:
    return True
  if op in ("==", "!="):
    equal = have.key() == spec.key() and (spec.local is None or have.local == spec.local)
    return equal if op == "==" else not equal
  if op == "~=":
    return (
      have.key() >= spec.key()
      and have.epoch == spec.epoch
      and _matches_prefix(have, spec.release[:-1])
    )
  a, b = have.key(), spec.key()
  return {">=": a >= b, "<=": a <= b, ">": a > b, "<": a < b}[op]


# Requirements and markers (PEP 508) --------------------------------------------------------

_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_REQUIREMENT = re.compile(rf"^\s*(?P<name>{_NAME})\s*(?:\[(?P<extras>[^\]]*)\])?\s*(?P<rest>.*)$")
_CLAUSE = re.compile(r"^\s*(===|==|!=|~=|<=|>=|<|>)\s*([A-Za-z0-9*+!._-]+)\s*$")


class Requirement(NamedTuple):
  text: str
  name: str
  extras: tuple[str, ...]
  specs: tuple[tuple[str, str], ...]
  marker: str | None


def _clauses(text: str, line: str = "") -> tuple[tuple[str, str], ...]:
  """(operator, version) of each clause of a specifier such as `>=1.6,<2`."""
  out = []
  for clause in filter(None, (c.strip() for c in text.split(","))):
    m = _CLAUSE.match(clause)
    if not m:
      raise ValueError(f"cannot read the version clause {clause!r} of {line or text!r}")
    out.append((m[1], m[2]))
  return tuple(out)


def parse_requirement(line: str) -> Requirement:
  text = line.strip()
  m = _REQUIREMENT.match(text)
  if not m:
    raise ValueError(f"not a requirement: {line!r}")
  rest, marker = m["rest"].strip(), None
  if rest.startswith("@"):  # name @ url [; marker]: any version
    marker_part = rest.partition(" ;")[2]
    rest, marker = "", marker_part.strip() or None
  else:
    rest, _, marker_part = rest.partition(";")
    marker = marker_part.strip() or None
    rest = rest.strip()
    if rest.startswith("(") and rest.endswith(")"):  # Requires-Dist: `name (>=1.0)`
      rest = rest[1:-1]
  specs = _clauses(rest, line)
  extras = tuple(normalize(e.strip()) for e in (m["extras"] or "").split(",") if e.strip())
  return Requirement(text, m["name"], extras, specs, marker)


_MARKER_TOKEN = re.compile(
  r"\s*(?:(?P<str>'[^']*'|\"[^\"]*\")|(?P<op>===|==|!=|<=|>=|~=|<|>|not\s+in\b|in\b)"
  r"|(?P<paren>[()])|(?P<word>[A-Za-z_][A-Za-z0-9_.]*))"
)


def environment(**overrides: str) -> dict[str, str]:
  """PEP 508's marker variables for this interpreter."""
  impl = sys.implementation
  env = {
    "implementation_name": impl.name,
    "implementation_version": ".".join(map(str, impl.version[:3])),
    "os_name": os.name,
    "platform_machine": platform.machine(),
    "platform_python_implementation": platform.python_implementation(),
    "platform_release": platform.release(),
    "platform_system": platform.system(),
    "platform_version": platform.version(),
    "python_full_version": platform.python_version(),
    "python_version": THIS_PYTHON,
    "sys_platform": sys.platform,
    "extra": "",
  }
  env.update(overrides)
  return env


def marker_holds(marker: str, env: dict[str, str]) -> bool:
  """Evaluates `python_version < "3.11" and extra == "epath"` and the like."""
  tokens: list[tuple[str, str]] = []
  pos = 0
  text = marker.strip()
  while pos < len(text):
    m = _MARKER_TOKEN.match(text, pos)
    if not m or m.end() == pos:
      raise ValueError(f"cannot read the marker {marker!r}")
    pos = m.end()
    kind = m.lastgroup or ""
    value = m[kind]
    if kind == "word" and value in ("and", "or"):
      kind = value
    tokens.append((kind, " ".join(value.split()) if kind == "op" else value))
  at = 0

  def peek() -> str:
    return tokens[at][0] if at < len(tokens) else ""

  def take() -> tuple[str, str]:
    nonlocal at
    if at >= len(tokens):
      raise ValueError(f"the marker {marker!r} ends early")
    at += 1
    return tokens[at - 1]

  def value() -> tuple[str, str]:  # (text, variable name or "")
    kind, tok = take()
    if kind == "str":
      return tok[1:-1], ""
    if kind == "word":
      return env.get(tok, ""), tok
    raise ValueError(f"unexpected {tok!r} in the marker {marker!r}")

  def compare() -> bool:
    if peek() == "paren" and tokens[at][1] == "(":
      take()
      result = either()
      if take() != ("paren", ")"):
        raise ValueError(f"unbalanced parentheses in the marker {marker!r}")
      return result
    left, left_var = value()
    kind, op = take()
    if kind != "op":
      raise ValueError(f"expected a comparison in the marker {marker!r}")
    right, right_var = value()
    if "extra" in (left_var, right_var):
      left, right = normalize(left), normalize(right)
    if op == "in":
      return left in right
    if op == "not in":
      return left not in right
    if parse_version(left) and parse_version(right) and op not in ("===",):
      return spec_allows(op, right, left)
    if op == "==":
      return left == right
    if op == "!=":
      return left != right
    if op == "===":
      return left == right
    return False

  def both() -> bool:
    result = compare()
    while peek() == "and":
      take()
      result = compare() and result
    return result

  def either() -> bool:
    result = both()
    while peek() == "or":
      take()
      result = both() or result
    return result

  result = either()
  if at != len(tokens):
    raise ValueError(f"trailing text in the marker {marker!r}")
  return result


def read_requirements_file(path: str) -> list[Requirement]:
  """A pip requirements file: one requirement a line; comments and option lines skipped."""
  out = []
  with open(path) as f:
    for raw in f:
      line = re.sub(r"(^|\s)#.*$", "", raw).strip()
      if line and not line.startswith("-"):
        out.append(parse_requirement(line))
  return out


def project_requirements(setup_cfg: str, extras: list[str]) -> list[Requirement]:
  """install_requires plus the named extras, from setup.cfg, else from an installed t2t_jax."""
  if os.path.exists(setup_cfg):
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read(setup_cfg)
    lines = cfg.get("options", "install_requires", fallback="").splitlines()
    known = (
      dict(cfg.items("options.extras_require")) if cfg.has_section("options.extras_require") else {}
    )
    for extra in extras:
      if extra not in known:
        raise SystemExit(f"wheelhouse: no extra {extra!r} in {setup_cfg} (it has: {sorted(known)})")
      lines += known[extra].splitlines()
    return [parse_requirement(line) for line in lines if line.strip()]
  try:
    listed = importlib.metadata.requires(PROJECT) or []
  except importlib.metadata.PackageNotFoundError:
    raise SystemExit(f"wheelhouse: neither {setup_cfg} nor an installed {PROJECT}") from None
  out = []
  for line in listed:
    req = parse_requirement(line)
    if not req.marker or any(marker_holds(req.marker, environment(extra=e)) for e in ["", *extras]):
      out.append(req._replace(marker=None) if req.marker and "extra" in req.marker else req)
  return out


# What a Python has -------------------------------------------------------------------------


class Installed(NamedTuple):
  name: str
  version: str | None  # None: present, version unknown (a `name @ url` line of pip freeze)
  requires: tuple[str, ...] | None  # None: not known (read from a freeze file)


def installed_here() -> dict[str, Installed]:
  found: dict[str, Installed] = {}
  for dist in importlib.metadata.distributions():
    name = dist.metadata["Name"]
    if name:  # the first on sys.path wins, as for import
      found.setdefault(normalize(name), Installed(name, dist.version, tuple(dist.requires or ())))
  return found


def read_have(path: str) -> tuple[dict[str, Installed], dict[str, str]]:
  """A `pip freeze`, `pip list --format=freeze` or `wheelhouse.py freeze` file: the packages,
  and the target that `freeze` wrote in its header (python_version, platform, implementation)."""
  found: dict[str, Installed] = {}
  target: dict[str, str] = {}
  with open(path) as f:
    for raw in f:
      line = raw.strip()
      if line.startswith(HEADER):
        target.update(w.split("=", 1) for w in line[len(HEADER) :].split() if "=" in w)
        continue
      line = re.sub(r"(^|\s)#.*$", "", line).strip()
      if not line:
        continue
      if line.startswith("-e"):  # an editable checkout: `-e git+...#egg=name`
        egg = re.search(r"[#&]egg=([^&\s]+)", line)
        if egg:
          found[normalize(egg[1])] = Installed(egg[1], None, None)
        continue
      if line.startswith("-"):
        continue
      m = re.match(rf"^({_NAME})\s*(?:\[[^\]]*\])?\s*(?:===?\s*(\S+)|@\s*\S+)", line)
      if not m:
        raise SystemExit(f"wheelhouse: cannot read {line!r} in {path}")
      found[normalize(m[1])] = Installed(m[1], m[2], None)
  return found, target


def unmet(
  requirements: list[Requirement],
  have: dict[str, Installed],
  env: dict[str, str] | None = None,
) -> list[tuple[Requirement, str]]:
  """(requirement, why) for each requirement that `have` lacks or has at a wrong version.
  The extras of a requirement (`etils[epath]`) are followed through the installed package's
  own metadata where that is known (not for a freeze file)."""
  env = env or environment()
  out: list[tuple[Requirement, str]] = []
  seen: set[tuple[Any, ...]] = set()

  def visit(req: Requirement, via: str) -> None:
    key = (normalize(req.name), req.extras, req.specs, req.marker)
    if key in seen:
      return
    seen.add(key)
    if req.marker and not marker_holds(req.marker, env):
      return
    found = have.get(normalize(req.name))
    if found is None:
      out.append((req, "missing" + via))
      return
    if found.version is not None and not all(
      spec_allows(op, v, found.version) for op, v in req.specs
    ):
      out.append((req, f"have {found.version}{via}"))
      return
    for line in (found.requires or ()) if req.extras else ():
      sub = parse_requirement(line)
      if sub.marker and "extra" in sub.marker:
        wanted = any(marker_holds(sub.marker, dict(env, extra=e)) for e in req.extras)
        if wanted and not marker_holds(sub.marker, dict(env, extra="")):
          text = sub.text.partition(";")[0].strip()
          visit(sub._replace(text=text, marker=None), f", for {req.text}")

  for req in requirements:
    visit(req, "")
  return out


# Commands ----------------------------------------------------------------------------------


def _requirements(args: argparse.Namespace) -> list[Requirement]:
  if args.requirements:
    return read_requirements_file(args.requirements)
  return project_requirements(args.setup_cfg, args.extra)


def _target_environment(target: dict[str, str]) -> dict[str, str]:
  """Marker variables for the Python a freeze file came from, as far as its header tells."""
  version = target.get("python_version")
  return (
    environment(python_version=version, python_full_version=version) if version else environment()
  )


def cmd_check(args: argparse.Namespace) -> int:
  have, target = read_have(args.have) if args.have else (installed_here(), {})
  if args.wheelhouse:
    with open(os.path.join(args.wheelhouse, MANIFEST)) as f:
      args.extra = [*args.extra, *json.load(f)["extras"]]
  problems = unmet(_requirements(args), have, _target_environment(target))
  for req, why in problems:
    print(f"{req.text} ({why})")
  return 1 if problems else 0


def this_platform() -> str:
  """This interpreter's most specific wheel platform, e.g. manylinux_2_36_x86_64."""
  plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
  if plat.startswith("linux_"):
    libc, version = platform.libc_ver()
    parts = version.split(".")
    if libc == "glibc" and len(parts) >= 2:
      return f"manylinux_{parts[0]}_{parts[1]}_{plat[len('linux_') :]}"
  return plat


def _implementation() -> str:
  return {"cpython": "cp", "pypy": "pp"}.get(sys.implementation.name, sys.implementation.name)


def build_requirements(pyproject: str = PYPROJECT) -> list[str]:
  """pyproject.toml's build-system.requires: an editable install on the target (`pip install
  -e .`) builds in isolation from the wheelhouse alone, so these always travel, whatever the
  target has."""
  with open(pyproject) as f:
    text = f.read()
  m = re.search(r"^\[build-system\][^\[]*?^requires\s*=\s*\[([^\]]*)\]", text, re.M | re.S)
  if not m:
    raise SystemExit(f"wheelhouse: no build-system.requires in {pyproject}")
  return [a or b for a, b in re.findall(r'"([^"]+)"|\'([^\']+)\'', m[1])]


def cmd_build_requirements(args: argparse.Namespace) -> int:
  del args
  print("\n".join(build_requirements()))
  return 0


def cmd_freeze(args: argparse.Namespace) -> int:
  del args
  print(
    f"{HEADER} python_version={THIS_PYTHON}"
    f" platform={this_platform()} implementation={_implementation()}"
  )
  for key, found in sorted(installed_here().items()):
    del key
    print(f"{found.name}=={found.version}")
  return 0


def platforms(tag: str) -> list[str]:
  """The platform tags a machine of `tag` installs: pip's --platform takes a list and does not
  widen manylinux_2_X to the older glibc tags itself, so a target of glibc 2.31 gets 2_31 ...
  2_17 and the legacy manylinux2014/2010/1 names."""
  legacy = {"manylinux2014": 17, "manylinux2010": 12, "manylinux1": 5}
  m = re.match(r"^manylinux_(\d+)_(\d+)_(.+)$", tag)
  if m:
    major, minor, arch = int(m[1]), int(m[2]), m[3]
  else:
    m = re.match(r"^(manylinux2014|manylinux2010|manylinux1)_(.+)$", tag)
    if not m:
      return [tag]
    major, minor, arch = 2, legacy[m[1]], m[2]
  if major != 2:
    return [tag]
  lowest = 5 if arch in ("x86_64", "i686") else 17
  tags = [f"manylinux_2_{y}_{arch}" for y in range(minor, lowest - 1, -1)]
  for name, y in legacy.items():
    if minor >= y and (name == "manylinux2014" or arch in ("x86_64", "i686")):
      tags.append(f"{name}_{arch}")
  return tags


def cmd_target(args: argparse.Namespace) -> int:
  """Prints the target's Python version, implementation, then its platform tags, a line each:
  the options given, else what a --have file's header says, else this interpreter."""
  project_requirements(SETUP_CFG, args.extra)  # stops on an extra that setup.cfg lacks
  recorded = read_have(args.have)[1] if args.have else {}
  version = args.python_version or recorded.get("python_version")
  version = version or THIS_PYTHON
  if not re.match(r"^\d+\.\d+$", version):
    raise SystemExit(
      f"wheelhouse: --python-version wants MAJOR.MINOR such as 3.11, not {version!r}"
    )
  impl = args.implementation or recorded.get("implementation") or _implementation()
  tag = args.platform or recorded.get("platform") or this_platform()
  print(version)
  print(impl)
  print("\n".join(platforms(tag)))
  return 0


def stub_wheel(directory: str, name: str, version: str) -> str:
  """A wheel that holds only the metadata `name version`, no files and no dependencies."""
  dist = f"{re.sub(r'[-_.]+', '_', name)}-{version}"
  path = os.path.join(directory, f"{dist}-py3-none-any.whl")
  files = {
    f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
    f"{dist}.dist-info/WHEEL": (
      "Wheel-Version: 1.0\nGenerator: wheelhouse.py\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    ),
  }
  record = "".join(f"{f},,\n" for f in files) + f"{dist}.dist-info/RECORD,,\n"
  with zipfile.ZipFile(path, "w") as z:
    for filename, text in {**files, f"{dist}.dist-info/RECORD": record}.items():
      z.writestr(filename, text)
  return path


def cmd_constraints(args: argparse.Namespace) -> int:
  """Pins for the resolve: each package the target has, at the version it has, so that what
  the wheelhouse adds fits what is there. With --stubs, a metadata-only wheel of each pinned
  package goes there too: the target's own builds (a CUDA jaxlib of an NVIDIA image, a version
  the index no longer offers) then resolve as what they are, installed. Not pinned:
  requirements the target has too old (they are to be upgraded), pip and the build tools."""
  have, target = read_have(args.have)
  problems = unmet(_requirements(args), have, _target_environment(target))
  for req, why in problems:
    print(f"wheelhouse: the target lacks {req.text} ({why})", file=sys.stderr)
  upgrade = {normalize(req.name) for req, _ in problems}
  for key, found in sorted(have.items()):
    if key in upgrade or key in UNPINNED or key == normalize(PROJECT):
      continue
    if found.version is None or parse_version(found.version) is None:
      continue
    print(f"{found.name}=={found.version}")
    if args.stubs:
      stub_wheel(args.stubs, found.name, found.version)
  return 0


def cmd_sdists(args: argparse.Namespace) -> int:
  """NAME==VERSION of each package that a resolve's report takes as an sdist."""
  with open(args.report) as f:
    report = json.load(f)
  for item in report["install"]:
    if not item["download_info"]["url"].split("#")[0].endswith(".whl"):
      print(f"{item['metadata']['name']}=={item['metadata']['version']}")
  return 0


def unfit(report: dict[str, Any], python_version: str) -> list[tuple[str, Requirement, str | None]]:
  """(package, requirement, resolved version or None) for each requirement of a resolved
  package that holds on the target's Python and that the resolve does not meet. pip evaluates
  markers for the Python it runs on, whatever --python-version says: from Python 3.11,
  `protobuf<=6.32; python_version < "3.11"` is not asked for, yet a 3.10 target needs it."""
  env = environment(
    python_version=python_version,
    python_full_version=python_version,
    implementation_version=python_version,
  )
  items = {normalize(i["metadata"]["name"]): i for i in report["install"]}
  extras = {k: {normalize(e) for e in i.get("requested_extras") or ()} for k, i in items.items()}
  while True:  # extras asked for by dependencies (`etils[epath]`) switch on more requirements
    active, grew = [], False
    for key, item in items.items():
      for line in item["metadata"].get("requires_dist") or ():
        req = parse_requirement(line)
        contexts = ["", *sorted(extras[key])]
        if req.marker and not any(marker_holds(req.marker, dict(env, extra=e)) for e in contexts):
          continue
        active.append((item["metadata"]["name"], req))
        dep = normalize(req.name)
        if dep in items and not set(req.extras) <= extras[dep]:
          extras[dep] |= set(req.extras)
          grew = True
    if not grew:
      break
  out: list[tuple[str, Requirement, str | None]] = []
  for name, req in active:
    dep = items.get(normalize(req.name))
    if dep is None:
      out.append((name, req, None))
    elif not all(spec_allows(op, v, dep["metadata"]["version"]) for op, v in req.specs):
      out.append((name, req, dep["metadata"]["version"]))
  return out


def cmd_fit(args: argparse.Namespace) -> int:
  """Prints each unmet requirement of `unfit` as a line to add to the resolve."""
  with open(args.report) as f:
    report = json.load(f)
  lines = []
  for name, req, resolved in unfit(report, args.python_version):
    line = req.name + (f"[{','.join(req.extras)}]" if req.extras else "")
    line += ",".join(op + v for op, v in req.specs)
    got = f"resolved {resolved}" if resolved else "not resolved"
    print(
      f"wheelhouse: on Python {args.python_version}, {name} needs {line} ({got})", file=sys.stderr
    )
    if line not in lines:
      lines.append(line)
  for line in lines:
    print(line)
  return 0


def _requires_closure(report: dict[str, Any], roots: list[str], python_version: str) -> set[str]:
  """The names that `roots` need, through the Requires-Dist of the resolved packages."""
  env = environment(python_version=python_version)
  by_name = {normalize(i["metadata"]["name"]): i for i in report["install"]}
  todo, seen = [normalize(r) for r in roots], set()
  while todo:
    name = todo.pop()
    if name in seen or name not in by_name:
      continue
    seen.add(name)
    for line in by_name[name]["metadata"].get("requires_dist", []):
      req = parse_requirement(line)
      if not req.marker or marker_holds(req.marker, env):
        todo.append(normalize(req.name))
  return seen


def plan(
  report: dict[str, Any],
  local_dir: str,
  have: dict[str, Installed] | None,
  upgrade: set[str],
  python_version: str = THIS_PYTHON,
) -> dict[str, Any]:
  """Sorts the packages of a `pip install --dry-run --report` into those already built here
  (under local_dir: the project and pure-Python wheels built from sdists), those the target has
  (left out unless to be upgraded; the build tools always travel) and those to download."""
  local_dir = os.path.realpath(local_dir)
  build_tools = [parse_requirement(r).name for r in build_requirements()]
  keep = upgrade | _requires_closure(report, build_tools, python_version)
  out: dict[str, Any] = {"local": [], "download": [], "excluded": []}
  for item in report["install"]:
    name, version = item["metadata"]["name"], item["metadata"]["version"]
    needs = item["metadata"].get("requires_python")
    if needs and not all(spec_allows(op, v, python_version) for op, v in _clauses(needs)):
      raise SystemExit(
        f"wheelhouse: the resolve took {name} {version}, which requires Python {needs}, for a"
        f" target of Python {python_version}: pips before 24.2 do so for another Python version;"
        " upgrade pip here (PYTHON -m pip install -U pip) or build with a PYTHON of the target's"
        " version"
      )
    key = normalize(name)
    url = item["download_info"]["url"]
    path = os.path.realpath(url[len("file://") :]) if url.startswith("file://") else ""
    if path.startswith(local_dir + os.sep):
      out["local"].append({"name": name, "version": version, "file": os.path.basename(path)})
    elif have is not None and key in have and key not in keep and key != normalize(PROJECT):
      out["excluded"].append({"name": name, "resolved": version, "have": have[key].version})
    else:
      out["download"].append({"name": name, "version": version})
  return out


def cmd_plan(args: argparse.Namespace) -> int:
  with open(args.report) as f:
    report = json.load(f)
  have, upgrade = None, set()
  if args.have:
    have = read_have(args.have)[0]
    env = _target_environment({"python_version": args.python_version})
    upgrade = {normalize(r.name) for r, _ in unmet(_requirements(args), have, env)}
  target = dict(python_version=args.python_version, implementation=args.implementation)
  result = plan(report, args.local, have, upgrade, args.python_version)
  result.update(
    extras=args.extra,
    have=os.path.abspath(args.have) if args.have else None,
    target=dict(target, platforms=args.platform),
    requirement=args.requirement,
  )
  with open(args.out, "w") as f:
    json.dump(result, f, indent=1)
  for item in result["download"]:
    print(f"{item['name']}=={item['version']}")
  if result["excluded"]:
    names = ", ".join(f"{e['name']} {e['have']}" for e in result["excluded"])
    print(f"wheelhouse: left out, the target has them: {names}", file=sys.stderr)
  return 0


def _package_key(name: str, version: str) -> tuple[str, Any]:
  parsed = parse_version(version)
  return normalize(name), parsed.key() if parsed else version


def _sha256(path: str) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      h.update(block)
  return h.hexdigest()


def cmd_finish(args: argparse.Namespace) -> int:
  """Checks that DIR holds a wheel of each planned package, removes wheels of earlier builds
  into DIR that the plan no longer names (pip would pick a newer stale one), and writes
  DIR/manifest.json and DIR/requirements.txt."""
  with open(args.plan) as f:
    planned = json.load(f)
  wanted = {
    _package_key(i["name"], i["version"]): f"{i['name']} {i['version']}"
    for i in planned["local"] + planned["download"]
  }
  files, found = [], set()
  for filename in sorted(os.listdir(args.dir)):
    if not filename.endswith(".whl"):
      continue
    key = _package_key(*filename.split("-")[:2])
    path = os.path.join(args.dir, filename)
    if key not in wanted:
      print(f"wheelhouse: removing {filename}, not part of this build", file=sys.stderr)
      os.remove(path)
      continue
    found.add(key)
    files.append({"file": filename, "bytes": os.path.getsize(path), "sha256": _sha256(path)})
  absent = sorted(text for key, text in wanted.items() if key not in found)
  if absent:
    raise SystemExit(f"wheelhouse: no wheel in {args.dir} for: {', '.join(absent)}")
  built = [i for i in planned["local"] if normalize(i["name"]) != normalize(PROJECT)]
  manifest = {
    "requirement": planned["requirement"],
    "extras": planned["extras"],
    "target": planned["target"],
    "have": planned["have"],
    "left_out_target_has": planned["excluded"],
    "built_here_from_sdist": built,
    "files": files,
  }
  with open(os.path.join(args.dir, MANIFEST), "w") as f:
    json.dump(manifest, f, indent=1)
  with open(os.path.join(args.dir, REQUIREMENTS), "w") as f:
    f.write(planned["requirement"] + "\n")
  total = sum(f["bytes"] for f in files)
  print(
    f"wheelhouse: {len(files)} wheels, {total / 2**20:.1f} MiB in {args.dir}"
    + (f" ({len(planned['excluded'])} left out: the target has them)" if planned["have"] else "")
    + (f"; built here from sdists: {', '.join(i['name'] for i in built)}" if built else "")
  )
  return 0


def cmd_verify(args: argparse.Namespace) -> int:
  """Every wheel of DIR/manifest.json is there with its size and sha256 (a copy over a
  cluster's file transfer can be cut short)."""
  path = os.path.join(args.dir, MANIFEST)
  if not os.path.exists(path):
    raise SystemExit(f"wheelhouse: {path} not found: not a directory wheelhouse.sh build made")
  with open(path) as f:
    manifest = json.load(f)
  bad = []
  for entry in manifest["files"]:
    wheel = os.path.join(args.dir, entry["file"])
    if not os.path.exists(wheel):
      bad.append(f"{entry['file']} (missing)")
    elif os.path.getsize(wheel) != entry["bytes"] or _sha256(wheel) != entry["sha256"]:
      bad.append(f"{entry['file']} (differs from when it was built)")
  for line in bad:
    print(f"wheelhouse: {line}", file=sys.stderr)
  target = manifest["target"]
  if target.get("python_version") and target["python_version"] != THIS_PYTHON:
    print(
      f"wheelhouse: built for Python {target['python_version']}, this is {THIS_PYTHON}",
      file=sys.stderr,
    )
    bad.append("python")
  return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
    prog="wheelhouse.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  commands = parser.add_subparsers(dest="command", required=True)

  def with_requirements(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--extra", action="append", default=[], help="an extra of setup.cfg")
    p.add_argument("--requirements", help="a requirements file instead of setup.cfg's")
    p.add_argument("--setup-cfg", default=SETUP_CFG, help=argparse.SUPPRESS)
    return p

  check = with_requirements(commands.add_parser("check", help="what this Python lacks"))
  check.add_argument("--have", help="a freeze file of another Python instead of this one")
  check.add_argument("--wheelhouse", help="also the extras a wheelhouse was built with")
  check.set_defaults(run=cmd_check)
  commands.add_parser("freeze", help="what this Python has").set_defaults(run=cmd_freeze)
  commands.add_parser("build-requirements").set_defaults(run=cmd_build_requirements)
  target = commands.add_parser("target")
  target.add_argument("--have")
  target.add_argument("--python-version")
  target.add_argument("--platform")
  target.add_argument("--implementation")
  target.add_argument("--extra", action="append", default=[])
  target.set_defaults(run=cmd_target)
  constraints = with_requirements(commands.add_parser("constraints"))
  constraints.add_argument("--have", required=True)
  constraints.add_argument("--stubs", help="a directory for metadata-only wheels of the pins")
  constraints.set_defaults(run=cmd_constraints)
  fit = commands.add_parser("fit")
  fit.add_argument("report")
  fit.add_argument("--python-version", required=True)
  fit.set_defaults(run=cmd_fit)
  sdists = commands.add_parser("sdists")
  sdists.add_argument("report")
  sdists.set_defaults(run=cmd_sdists)
  plan_p = with_requirements(commands.add_parser("plan"))
  plan_p.add_argument("report")
  plan_p.add_argument("--local", required=True)
  plan_p.add_argument("--have")
  plan_p.add_argument("--requirement", required=True)
  plan_p.add_argument("--out", required=True)
  plan_p.add_argument("--python-version", required=True)
  plan_p.add_argument("--implementation", required=True)
  plan_p.add_argument("--platform", action="append", required=True)
  plan_p.set_defaults(run=cmd_plan)
  finish = commands.add_parser("finish")
  finish.add_argument("plan")
  finish.add_argument("--dir", required=True)
  finish.set_defaults(run=cmd_finish)
  verify = commands.add_parser("verify")
  verify.add_argument("--dir", required=True)
  verify.set_defaults(run=cmd_verify)
  args = parser.parse_args(argv)
  # Status 1 means "something is missing" (check, verify); a failure of its own is 2.
  try:
    return args.run(args)
  except SystemExit as stop:
    if not isinstance(stop.code, str):
      raise
    print(stop.code, file=sys.stderr)
  except (ValueError, OSError) as error:
    print(f"wheelhouse: {error}", file=sys.stderr)
  return 2


if __name__ == "__main__":
  sys.exit(main())
