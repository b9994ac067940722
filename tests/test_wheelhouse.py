"""launch/wheelhouse.sh and launch/wheelhouse.py without a download: the requirement checker,
what a wheelhouse leaves out for a target, its manifest, the script's argument errors, and
gpu_bench.sh stopping before any work when a requirement is missing.

The download half (pip resolving and fetching for the target) needs an index; it is described
in launch/README.md with the figures of a run.
"""

import importlib.util
import json
import os
import shutil
import stat
import subprocess
import sys
import zipfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCH = os.path.join(REPO, "launch")

_spec = importlib.util.spec_from_file_location("wheelhouse", os.path.join(LAUNCH, "wheelhouse.py"))
wh = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(wh)


def _env(tmp_path, **extra):
  env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "DRY_RUN", "T2T_"))}
  env.update(HOME=str(tmp_path), TMPDIR=str(tmp_path), PIP_CONFIG_FILE=os.devnull)
  env.update(extra)
  return env


def _script(name, *args, env, timeout=60):
  return subprocess.run(
    ["bash", os.path.join(LAUNCH, name), *args],
    env=env,
    capture_output=True,
    text=True,
    timeout=timeout,
  )


def _write(path, text, executable=False):
  path.write_text(text)
  if executable:
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
  return path


@pytest.mark.parametrize(
  "have, spec, ok",
  [
    ("0.2.4", ">=0.2.5", False),
    ("0.2.5", ">=0.2.5", True),
    ("0.10.0", ">=0.4.30", True),  # numerically, not as text
    ("1.0", "==1.0.0", True),
    ("2.0rc1", ">=2.0", False),
    ("2.0.dev3", "<2.0rc1", True),
    ("2.0.post1", ">=2.0", True),
    ("0.4.36.dev20241010+nv24.10", ">=0.4.30", True),  # an image's own jaxlib build
    ("1.2.3", "~=1.2", True),
    ("2.0", "~=1.2", False),
    ("1.2.9", "==1.2.*", True),
    ("1.3", "!=1.3.*", False),
    ("1!0.1", ">=2.0", True),  # epoch first
  ],
)
def test_specifier(have, spec, ok):
  op = next(o for o in ("===", "==", "!=", "~=", "<=", ">=", "<", ">") if spec.startswith(o))
  assert wh.spec_allows(op, spec[len(op) :], have) is ok


def test_requirements_and_markers():
  r = wh.parse_requirement("etils[epath, epy]>=1.6,<2")
  assert (r.name, r.extras, r.specs, r.marker) == (
    "etils",
    ("epath", "epy"),
    ((">=", "1.6"), ("<", "2")),
    None,
  )
  r = wh.parse_requirement('fsspec (>=2023.1) ; extra == "epath"')  # Requires-Dist style
  assert r.specs == ((">=", "2023.1"),) and r.marker == 'extra == "epath"'
  r = wh.parse_requirement('pkg @ https://host/pkg-1.0-py3-none-any.whl ; python_version >= "3"')
  assert r.specs == () and r.marker == 'python_version >= "3"'
  env = wh.environment(python_version="3.10", sys_platform="linux", extra="epath")
  assert wh.marker_holds('python_version < "3.11"', env)
  assert not wh.marker_holds('python_version >= "3.11"', env)
  assert wh.marker_holds('python_version > "3.9"', env)  # as versions, not as text
  assert wh.marker_holds("extra == 'EPath'", env)  # extra names are normalized
  assert wh.marker_holds(
    '(sys_platform == "win32" or sys_platform == "linux") and extra != "enp"', env
  )
  assert not wh.marker_holds('sys_platform == "darwin" and extra == "epath"', env)
  assert wh.marker_holds('"linux" in sys_platform', env)
  with pytest.raises(ValueError):
    wh.marker_holds('python_version < "3.11" and', env)


def test_unmet_names_missing_too_old_and_the_missing_deps_of_an_extra():
  have = {
    "jax": wh.Installed("jax", "0.4.36.dev20241010+nv", ()),
    "optax": wh.Installed("optax", "0.2.4", ()),
    "etils": wh.Installed(
      "etils",
      "1.7.0",
      ('fsspec ; extra == "epath"', 'zipp ; extra == "epath"', 'numpy ; extra == "enp"'),
    ),
    "fsspec": wh.Installed("fsspec", "2024.1", ()),
    "ml-collections": wh.Installed("ml_collections", None, None),  # `ml_collections @ url`
  }
  reqs = [
    wh.parse_requirement(line)
    for line in (
      "jax>=0.4.30",
      "optax>=0.2.5",
      "ML-Collections>=0.1.1",
      "grain>=0.2.2",
      "etils[epath]>=1.6",
      'tomli>=1 ; python_version < "3.0"',
    )
  ]
  problems = [(r.text, why) for r, why in wh.unmet(reqs, have)]
  assert problems == [
    ("optax>=0.2.5", "have 0.2.4"),
    ("grain>=0.2.2", "missing"),
    ("zipp", "missing, for etils[epath]>=1.6"),
  ]


def test_setup_cfg_requirements_and_extras():
  core = wh.project_requirements(wh.SETUP_CFG, [])
  names = {wh.normalize(r.name) for r in core}
  assert {"jax", "flax", "optax", "ml-collections", "grain", "tensorflow-datasets"} <= names
  assert "torch" not in names  # only in the export extra
  with_cuda = wh.project_requirements(wh.SETUP_CFG, ["cuda12"])
  assert any(r.name == "jax" and r.extras == ("cuda12",) for r in with_cuda)
  with pytest.raises(SystemExit, match="no extra 'nope'"):
    wh.project_requirements(wh.SETUP_CFG, ["nope"])
  assert wh.build_requirements() == ["setuptools>=69", "wheel"]


def test_freeze_file_pins_and_stubs(tmp_path, capsys):
  have = _write(
    tmp_path / "have.txt",
    "# wheelhouse-target python_version=3.10 platform=manylinux_2_31_x86_64 implementation=cp\n"
    "jax==0.9.1\n"
    "jaxlib==0.9.1.dev20241010+cuda12  # the image's own build\n"
    "flax==0.10.2\n"
    "optax==0.2.4\n"
    "numpy @ file:///croot/numpy-1.26.4.whl\n"
    "-e git+https://host/repo.git@abc#egg=mytool\n"
    "pip==24.0\n"
    "setuptools==65.5.0\n"
    "t2t_jax==0.0.1\n",
  )
  found, target = wh.read_have(str(have))
  assert target == dict(
    python_version="3.10", platform="manylinux_2_31_x86_64", implementation="cp"
  )
  assert found["numpy"].version is None and "mytool" in found
  assert found["jaxlib"].version == "0.9.1.dev20241010+cuda12"
  stubs = tmp_path / "stubs"
  stubs.mkdir()
  assert wh.main(["constraints", "--have", str(have), "--stubs", str(stubs)]) == 0
  out = capsys.readouterr()
  # Pinned: what the target has and keeps (its own jaxlib build too); not optax, which is too
  # old and so to be upgraded, nor pip, the build tools, versionless lines or the project.
  assert out.out.splitlines() == [
    "flax==0.10.2",
    "jax==0.9.1",
    "jaxlib==0.9.1.dev20241010+cuda12",
  ]
  assert "the target lacks optax>=0.2.5 (have 0.2.4)" in out.err
  assert "the target lacks grain>=0.2.16 (missing)" in out.err
  assert sorted(os.listdir(stubs)) == [
    "flax-0.10.2-py3-none-any.whl",
    "jax-0.9.1-py3-none-any.whl",
    "jaxlib-0.9.1.dev20241010+cuda12-py3-none-any.whl",
  ]
  with zipfile.ZipFile(stubs / "jaxlib-0.9.1.dev20241010+cuda12-py3-none-any.whl") as z:
    metadata = z.read("jaxlib-0.9.1.dev20241010+cuda12.dist-info/METADATA").decode()
  assert "Name: jaxlib\nVersion: 0.9.1.dev20241010+cuda12\n" in metadata


def test_pip_takes_a_stub_as_the_installed_package(tmp_path):
  """The target's own build, which no index holds, resolves from its metadata-only wheel."""
  wh.stub_wheel(str(tmp_path), "jaxlib", "0.9.1.dev20241010+cuda12")
  report = tmp_path / "report.json"
  result = subprocess.run(
    [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-index"]
    + ["--quiet", "--find-links", str(tmp_path), "--report", str(report), "jaxlib>=0.4.30"],
    env=_env(tmp_path),
    capture_output=True,
    text=True,
    timeout=60,
  )
  assert result.returncode == 0, result.stderr
  (item,) = json.loads(report.read_text())["install"]
  assert item["metadata"]["version"] == "0.9.1.dev20241010+cuda12"


def _item(name, version, url, requires=()):
  return {
    "metadata": {"name": name, "version": version, "requires_dist": list(requires)},
    "download_info": {"url": url},
  }


def test_plan_leaves_out_what_the_target_has_and_finish_writes_the_manifest(tmp_path, capsys):
  local = tmp_path / "local"
  local.mkdir()
  index = "https://files.example/packages"
  report = {
    "version": "1",
    "install": [
      _item("t2t_jax", "0.1.0", f"file://{local}/t2t_jax-0.1.0-py3-none-any.whl"),
      _item("promise", "2.3", f"file://{local}/promise-2.3-py3-none-any.whl"),
      _item("jax", "0.9.1", f"file://{tmp_path}/stubs/jax-0.9.1-py3-none-any.whl"),
      _item("numpy", "1.26.4", f"{index}/numpy-1.26.4-cp310-cp310-manylinux_2_17_x86_64.whl"),
      _item("optax", "0.2.8", f"{index}/optax-0.2.8-py3-none-any.whl"),
      _item("grain", "0.2.18", f"{index}/grain-0.2.18-cp310-cp310-manylinux_2_28_x86_64.whl"),
      _item("setuptools", "80.0", f"{index}/setuptools-80.0-py3-none-any.whl"),
      _item("wheel", "0.46.1", f"{index}/wheel-0.46.1-py3-none-any.whl", ["packaging>=24.0"]),
      _item("packaging", "24.2", f"{index}/packaging-24.2-py3-none-any.whl"),
    ],
  }
  report_path = _write(tmp_path / "report.json", json.dumps(report))
  have = _write(
    tmp_path / "have.txt",
    "jax==0.9.1\nnumpy==2.0.2\noptax==0.2.4\npackaging==23.1\nsetuptools==65.5.0\n",
  )
  plan_path = tmp_path / "plan.json"
  argv = ["plan", str(report_path), "--local", str(local), "--have", str(have)]
  argv += ["--requirement", "t2t_jax==0.1.0", "--out", str(plan_path)]
  argv += ["--python-version", "3.10", "--implementation", "cp"]
  argv += ["--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_27_x86_64"]
  assert wh.main(argv) == 0
  out = capsys.readouterr()
  # optax: the target's is too old; setuptools, wheel and packaging (wheel needs it): the build
  # tools, which an editable install there builds with from the wheelhouse alone.
  assert out.out.splitlines() == [
    "optax==0.2.8",
    "grain==0.2.18",
    "setuptools==80.0",
    "wheel==0.46.1",
    "packaging==24.2",
  ]
  assert "left out, the target has them: jax 0.9.1, numpy 2.0.2" in out.err

  wheels = tmp_path / "wheels"
  wheels.mkdir()
  names = [
    "t2t_jax-0.1.0-py3-none-any.whl",
    "promise-2.3-py3-none-any.whl",
    "optax-0.2.8-py3-none-any.whl",
    "grain-0.2.18-cp310-cp310-manylinux_2_28_x86_64.whl",
    "setuptools-80.0-py3-none-any.whl",
    "wheel-0.46.1-py3-none-any.whl",
    "packaging-24.2-py3-none-any.whl",
    "optax-0.2.3-py3-none-any.whl",  # of an earlier build into the same directory
  ]
  for name in names:
    (wheels / name).write_bytes(name.encode())
  assert wh.main(["finish", str(plan_path), "--dir", str(wheels)]) == 0
  out = capsys.readouterr()
  assert "removing optax-0.2.3-py3-none-any.whl" in out.err
  assert "7 wheels" in out.out and "2 left out" in out.out and "promise" in out.out
  assert not (wheels / "optax-0.2.3-py3-none-any.whl").exists()
  assert (wheels / "requirements.txt").read_text() == "t2t_jax==0.1.0\n"
  manifest = json.loads((wheels / "manifest.json").read_text())
  assert manifest["target"]["python_version"] == "3.10"
  assert manifest["target"]["platforms"][0] == "manylinux_2_28_x86_64"
  assert [e["name"] for e in manifest["left_out_target_has"]] == ["jax", "numpy"]
  assert [b["name"] for b in manifest["built_here_from_sdist"]] == ["promise"]
  assert len(manifest["files"]) == 7

  manifest["target"]["python_version"] = wh.THIS_PYTHON
  (wheels / "manifest.json").write_text(json.dumps(manifest))
  assert wh.main(["verify", "--dir", str(wheels)]) == 0
  (wheels / "grain-0.2.18-cp310-cp310-manylinux_2_28_x86_64.whl").write_bytes(b"cut short")
  assert wh.main(["verify", "--dir", str(wheels)]) == 1
  assert "grain-0.2.18" in capsys.readouterr().err

  (wheels / "grain-0.2.18-cp310-cp310-manylinux_2_28_x86_64.whl").unlink()
  assert wh.main(["finish", str(plan_path), "--dir", str(wheels)]) == 2
  assert f"no wheel in {wheels} for: grain 0.2.18" in capsys.readouterr().err
  _write(tmp_path / "bad.txt", "jax>>0.4\n")
  assert wh.main(["check", "--requirements", str(tmp_path / "bad.txt")]) == 2
  assert "cannot read the version clause" in capsys.readouterr().err


def test_fit_finds_what_markers_ask_for_on_the_target_python(tmp_path, capsys):
  """pip evaluates markers for its own Python; `fit` redoes it for the target's."""
  index = "https://files.example"
  report = {
    "install": [
      _item("t2t_jax", "0.1.0", f"{index}/t", ["etils[epath]>=1.6", "tensorflow-metadata"]),
      _item(
        "etils", "1.13.0", f"{index}/e", ['fsspec ; extra == "epath"', 'numpy ; extra == "enp"']
      ),
      _item(
        "tensorflow-metadata",
        "1.21.0",
        f"{index}/m",
        [
          'protobuf<=6.32,>=4.21.6 ; python_version < "3.11"',
          'protobuf>=4 ; python_version >= "3.11"',
        ],
      ),
      _item("protobuf", "7.36.2", f"{index}/p"),
      _item("grain", "0.2.13", f"{index}/g", ['exceptiongroup ; python_version < "3.11"']),
    ]
  }
  report["install"][0]["requested_extras"] = []
  found = [(name, r.name, got) for name, r, got in wh.unfit(report, "3.10")]
  assert found == [
    ("etils", "fsspec", None),  # switched on by t2t_jax asking for etils[epath]
    ("tensorflow-metadata", "protobuf", "7.36.2"),
    ("grain", "exceptiongroup", None),
  ]
  assert [(name, r.name) for name, r, _ in wh.unfit(report, "3.11")] == [("etils", "fsspec")]
  path = _write(tmp_path / "report.json", json.dumps(report))
  assert wh.main(["fit", str(path), "--python-version", "3.10"]) == 0
  out = capsys.readouterr()
  assert out.out.splitlines() == ["fsspec", "protobuf<=6.32,>=4.21.6", "exceptiongroup"]
  assert "on Python 3.10, tensorflow-metadata needs protobuf<=6.32,>=4.21.6 (resolved 7.36.2)" in (
    out.err
  )


def test_plan_refuses_a_package_for_another_python(tmp_path):
  report = {"install": [_item("etils", "1.14.0", "https://files.example/etils-1.14.0.whl")]}
  report["install"][0]["metadata"]["requires_python"] = ">=3.11"
  with pytest.raises(SystemExit, match="etils 1.14.0, which requires Python >=3.11"):
    wh.plan(report, str(tmp_path), None, set(), "3.10")
  assert wh.plan(report, str(tmp_path), None, set(), "3.11")["download"][0]["name"] == "etils"


def test_platform_tags_widen_to_older_glibc():
  tags = wh.platforms("manylinux_2_28_x86_64")
  assert tags[:2] == ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64"]
  assert {"manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64"} <= set(tags)
  assert "manylinux_2_29_x86_64" not in tags
  assert wh.platforms("manylinux2014_aarch64") == [
    "manylinux_2_17_aarch64",
    "manylinux2014_aarch64",
  ]
  assert wh.platforms("macosx_11_0_arm64") == ["macosx_11_0_arm64"]  # pip widens those itself


def _shellcheck():
  return shutil.which("shellcheck") or shutil.which(
    "shellcheck", path=os.path.dirname(sys.executable)
  )


def test_wheelhouse_script_is_clean_and_refuses_bad_arguments(tmp_path):
  path = os.path.join(LAUNCH, "wheelhouse.sh")
  assert os.access(path, os.X_OK)
  checker = _shellcheck()
  if checker:
    result = subprocess.run([checker, "--shell=bash", path], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout
  env = _env(tmp_path, PYTHON=sys.executable)
  helped = _script("wheelhouse.sh", "--help", env=env)
  assert helped.returncode == 0 and "Usage:" in helped.stdout and "dry-run" in helped.stdout
  foreign = tmp_path / "foreign"
  foreign.mkdir()
  (foreign / "notes.txt").write_text("mine\n")
  for args, message in [
    ((), "Usage:"),
    (("fetch",), "unknown command fetch"),
    (("build",), "build needs --dir DIR"),
    (("build", "--dir"), "--dir needs a value"),
    (("build", "--dir", "d", "--colour"), "unknown argument --colour"),
    (("build", "--dir", "d", "--have", "nowhere.txt"), "--have nowhere.txt: no such file"),
    (("build", "--dir", "d", "--editable"), "--editable is an option of install"),
    (("build", "--dir", str(foreign)), "holds files that no earlier build put there"),
    (("build", "--dir", "d", "--python-version", "3"), "wants MAJOR.MINOR"),
    (("build", "--dir", "d", "--extra", "cuda13"), "no extra 'cuda13'"),
    (("install", "--dir", "d", "--extra", "cuda12"), "install takes only --dir"),
    (("install", "--dir", str(tmp_path)), "not a wheelhouse that build made"),
  ]:
    result = _script("wheelhouse.sh", *args, env=env)
    assert result.returncode == 2, (args, result.stdout, result.stderr)
    assert message in result.stderr, (args, result.stderr)


def test_wheelhouse_dry_runs_print_the_pip_commands(tmp_path):
  env = _env(tmp_path, PYTHON=sys.executable)
  have = _write(
    tmp_path / "have.txt",
    "# wheelhouse-target python_version=3.10 platform=manylinux_2_31_x86_64 implementation=cp\n"
    "jax==0.4.35\nflax==0.10.2\noptax==0.2.5\n",
  )
  out = tmp_path / "wheels"
  built = _script(
    "wheelhouse.sh", "build", f"--dir={out}", "--have", str(have), "--dry-run", env=env
  )
  assert built.returncode == 0, built.stderr
  lines = built.stdout.splitlines()
  assert (
    lines[0] == f"wheelhouse: for Python 3.10 (cp) on manylinux_2_31_x86_64, less what {have} lists"
  )
  resolve = next(line for line in lines if " install --dry-run " in line)
  for part in (
    "--only-binary=:all: --python-version 3.10 --implementation cp",
    "-c ",
    "t2t_jax==0",
  ):
    assert part in resolve
  assert "--platform manylinux_2_31_x86_64 --platform manylinux_2_30_x86_64" in resolve
  assert any(" download --no-deps " in line and f"-d {out}" in line for line in lines)
  assert not out.exists()

  (out / "x").mkdir(parents=True)
  (out / "requirements.txt").write_text("t2t_jax[cuda12]==0.1.0\n")
  (out / "manifest.json").write_text("{}")
  installed = _script("wheelhouse.sh", "install", "--dir", str(out), env=dict(env, DRY_RUN="1"))
  assert installed.returncode == 0, installed.stderr
  assert installed.stdout.splitlines() == [
    f"+ {sys.executable} -m pip install --no-index --find-links {out} -r {out}/requirements.txt"
  ]
  editable = _script(
    "wheelhouse.sh", "install", "--dir", str(out), "--editable", "--dry-run", env=env
  )
  assert editable.stdout.strip().endswith(f"--find-links {out} -e {REPO}\\[cuda12\\]")


def _bench_stub(directory, calls, launcher="plain"):
  """A t2t-bench that only records its arguments, run by this test's Python."""
  body = f"import sys\nopen({str(calls)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
  if launcher == "plain":
    head = f"#!{sys.executable}\n"
  else:  # pip's form for an interpreter path too long for a #! line
    head = f"#!/bin/sh\n'''exec' \"{sys.executable}\" \"$0\" \"$@\"\n' '''\n"
  return _write(directory / "t2t-bench", head + body, executable=True)


@pytest.mark.parametrize("launcher", ["plain", "sh"])
def test_gpu_bench_stops_before_any_work_naming_what_to_bring(tmp_path, launcher):
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  calls = tmp_path / "calls.txt"
  _bench_stub(bin_dir, calls, launcher)
  requirements = _write(
    tmp_path / "requirements.txt", "pytest>=1.0\nno-such-package-t2t>=1.0\npytest>=999\n"
  )
  env = _env(tmp_path, PATH=f"{bin_dir}:{os.environ['PATH']}", T2T_REQUIREMENTS=str(requirements))
  out = tmp_path / "out"
  stopped = _script("gpu_bench.sh", str(out), env=env)
  assert stopped.returncode == 3, (stopped.stdout, stopped.stderr)
  assert f"{sys.executable} lacks what t2t_jax needs" in stopped.stderr
  assert "  no-such-package-t2t>=1.0 (missing)\n" in stopped.stderr
  assert "  pytest>=999 (have " in stopped.stderr and "pytest>=1.0 (" not in stopped.stderr
  assert "wheelhouse.py freeze > have.txt" in stopped.stderr
  assert "launch/wheelhouse.sh build --dir wheels --have have.txt" in stopped.stderr
  assert "wheelhouse.sh install --dir wheels" in stopped.stderr
  assert not calls.exists() and not out.exists()
  if launcher != "plain":
    return

  dry = _script("gpu_bench.sh", "--dry-run", str(out), env=env)
  assert dry.returncode == 0 and "a run would stop here" in dry.stderr
  assert dry.stdout.count("+ t2t-bench") == 2 and not calls.exists()

  unchecked = _script("gpu_bench.sh", "--no-check", str(out), env=env)
  assert unchecked.returncode == 0, unchecked.stderr
  assert len(calls.read_text().splitlines()) == 2

  _write(requirements, "pytest>=1.0\n")
  satisfied = _script("gpu_bench.sh", str(out), env=env)
  assert satisfied.returncode == 0 and "lacks" not in satisfied.stderr, satisfied.stderr


def test_gpu_bench_without_t2t_bench_names_t2t_jax_too(tmp_path):
  requirements = _write(tmp_path / "requirements.txt", "pytest>=1.0\n")
  env = _env(tmp_path, PATH="/usr/bin:/bin", PYTHON=sys.executable)
  env["T2T_REQUIREMENTS"] = str(requirements)
  stopped = _script("gpu_bench.sh", str(tmp_path / "out"), env=env)
  assert stopped.returncode == 3, stopped.stderr
  assert "  t2t_jax (no t2t-bench on PATH)" in stopped.stderr
