"""What README.md and docs/*.md show can be typed as shown.

Quick: every `t2t-*` command line in them (in code blocks and inline code) names only flags
its command defines (`--noFLAG` for a boolean) and `--config.*` fields its experiment has
(the `--experiment=` of the line, or the default); every `import`/`from ... import` of
t2t_jax and every `python -m MODULE` resolves. Commands that train for long or need big
data are checked this way only (their flags and fields exist); the slow test runs README's
own-text-files command verbatim on a tiny corpus, with overrides that make it a few steps
of a small model, then t2t-translate and t2t-score of the workdir it wrote.
"""

import glob
import importlib
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from tests import support

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = [os.path.join(REPO, "README.md"), *sorted(glob.glob(os.path.join(REPO, "docs", "*.md")))]
COMMANDS = ("train", "prepare", "translate", "score", "export", "average", "bench")
_COMMAND = re.compile(r"(?:\bt2t-(\w+)|python -m t2t_jax\.cli\.(\w+))((?:[ \t]+[^\s|><;&`#]+)*)")
_IMPORT = re.compile(r"(?:from (t2t_jax[\w.]*) import ([\w, ]+)|\bimport (t2t_jax[\w.]*))")
_MODULE = re.compile(r"python -m ((?:t2t_jax|tools)[\w.]*)")


def _texts() -> dict[str, str]:
  """{doc name: its text with backslash-continued lines joined}."""
  out = {}
  for path in DOCS:
    with open(path, encoding="utf-8") as f:
      out[os.path.relpath(path, REPO)] = re.sub(r"\\\n\s*", " ", f.read())
  return out


def _placeholder(token: str) -> bool:
  """NAME, FIELD=VALUE, DIR, [--flag ...] and similar: a shape, not a value to check."""
  name = token.split("=", 1)[0]
  return bool(re.search(r"[A-Z]{2,}|\.\.\.|\||\{", name)) or name in ("--", "--no")


def doc_commands() -> list[tuple[str, str, list[str]]]:
  """(doc, command, its flags as typed) for every t2t-* command line the docs show."""
  found = []
  for doc, text in _texts().items():
    text = text.replace("\n", " \n")  # a command ends at its line's end
    for m in _COMMAND.finditer(text):
      command = m[1] or m[2]
      if command not in COMMANDS:
        continue
      try:
        words = shlex.split(m[3].split("\n")[0])
      except ValueError:  # an unbalanced quote in prose: take the words as written
        words = m[3].split("\n")[0].split()
      flags = [w.strip("[](),.'\"") for w in words if w.lstrip("[(").startswith("--")]
      flags = [f for f in flags if not _placeholder(f)]
      if flags:
        found.append((doc, command, flags))
  return found


def doc_imports() -> list[tuple[str, str, list[str]]]:
  """(doc, module, names) of every t2t_jax import the docs show, and (doc, module, []) for
  every `python -m` module."""
  found = []
  for doc, text in _texts().items():
    for m in _IMPORT.finditer(text):
      if m[1]:
        names = [n.strip() for n in m[2].split(",") if n.strip()]
        found.append((doc, m[1].rstrip("."), names))
      else:
        found.append((doc, m[3].rstrip("."), []))
    found += [(doc, m[1].rstrip("."), []) for m in _MODULE.finditer(text)]
  return found


# The flags of each command, and the --config fields of each experiment, gathered in one
# interpreter: each command's flags are defined in a forked child (they would clash in one).
_GATHER = r"""
import importlib, json, os, sys
from absl import flags
import t2t_jax.cli.common as common, t2t_jax.cli.helpconfig as helpconfig
import jax, t2t_jax.training.trainer, t2t_jax.decoding.translator  # once, for every child
out = {"flags": {}, "fields": {}}
for command in sys.argv[1].split(","):
  read, write = os.pipe()
  if os.fork() == 0:
    os.close(read)
    sys.argv = [f"t2t-{command}"]
    module = importlib.import_module(f"t2t_jax.cli.{command}")
    if hasattr(module, "_define_flags"):
      module._define_flags()
    if "config" not in flags.FLAGS and command in ("train", "prepare", "bench"):
      common.define_config_flag(f"t2t-{command}")
    names = {n: isinstance(flags.FLAGS[n].value, bool) or flags.FLAGS[n].boolean
             for n in flags.FLAGS}
    os.write(write, json.dumps(names).encode())
    os._exit(0)
  os.close(write)
  data = b""
  while chunk := os.read(read, 1 << 16):
    data += chunk
  os.wait()
  out["flags"][command] = json.loads(data)
for name in common.available_experiments():
  config = common.load_experiment(common.experiment_path(name))
  out["fields"][name] = sorted(path for path, _ in helpconfig._leaves(config))
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def known():
  proc = subprocess.run(
    [sys.executable, "-c", _GATHER, ",".join(COMMANDS)],
    capture_output=True,
    text=True,
    env=support.cpu_env(T2T_HUGE_PAGES="0"),
    timeout=300,
    cwd=REPO,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_docs_show_commands_and_imports():
  commands = {command for _, command, _ in doc_commands()}
  assert commands == set(COMMANDS), commands
  assert len(doc_imports()) >= 3


def _config_field_problem(flag: str, experiment: str, fields: dict[str, list[str]]) -> str | None:
  name = flag.split("=", 1)[0]
  path = name.removeprefix("--config.").removeprefix("--noconfig.")
  experiment = experiment.split(":", 1)[0]
  if experiment not in fields:
    return None  # a path to a get_config() file, or a placeholder
  leaves = fields[experiment]
  if path in leaves or any(leaf.startswith(path + ".") for leaf in leaves):
    return None
  return f"{flag}: --experiment={experiment} has no field {path!r}"


def test_every_flag_a_doc_shows_exists_for_its_command(known):
  problems = []
  for doc, command, flags in doc_commands():
    experiment = "tiny"
    for flag in flags:
      if flag.startswith("--experiment="):
        experiment = flag.split("=", 1)[1]
    for flag in flags:
      name = flag[2:].split("=", 1)[0]
      own = known["flags"][command]
      if name.startswith(("config.", "noconfig.")):
        problem = _config_field_problem(flag, experiment, known["fields"])
      elif name in own or (name.startswith("no") and own.get(name[2:]) is True):
        problem = None
      else:
        problem = f"{flag}: t2t-{command} has no such flag"
      if problem:
        problems.append(f"{doc}: t2t-{command} {problem}")
  assert not problems, "\n".join(problems)


def test_every_import_and_module_a_doc_shows_resolves():
  problems = []
  for doc, module, names in doc_imports():
    try:
      if not names:
        if importlib.util.find_spec(module) is None:
          problems.append(f"{doc}: no module {module}")
        continue
      imported = importlib.import_module(module)
    except ImportError as e:
      problems.append(f"{doc}: {module}: {e}")
      continue
    for name in names:  # an attribute, or a submodule (`from t2t_jax import viz`)
      if not hasattr(imported, name) and importlib.util.find_spec(f"{module}.{name}") is None:
        problems.append(f"{doc}: {module} has no {name}")
  assert not problems, "\n".join(problems)


def test_helpconfig_lists_every_field_with_its_default():
  """Each field of an experiment is one line; a field the experiment changes shows the
  typed default; the descriptions come from the comments beside the defaults."""
  from t2t_jax.cli import common, helpconfig

  config = common.load_experiment(common.experiment_path("multi30k"))
  text = helpconfig.describe(config, "multi30k")
  lines = text.splitlines()[1:]
  assert len(lines) == len(list(helpconfig._leaves(config)))
  by_field = {line.split(" = ", 1)[0].strip(): line for line in lines}
  assert "data.max_len = 64 (default 256)  # drop TRAIN pairs" in by_field["data.max_len"]
  assert by_field["label_smoothing"].startswith("  label_smoothing = 0.1  # eps_ls (5.4)")
  assert "(default 512)" in by_field["model.d_model"]
  assert "# hypotheses kept per sentence" in by_field["beam_size"]
  assert "this experiment's own field" in by_field["corpus_dir"]


def _readme_own_data_command() -> list[str]:
  with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
    text = f.read()
  section = text.split("## Train on your own text files", 1)[1]
  block = section.split("```bash", 1)[1].split("```", 1)[0]
  return shlex.split(re.sub(r"\\\n", " ", block))


@pytest.mark.slow
def test_readme_own_data_command_runs_on_a_tiny_corpus(tmp_path):
  """README's command as written, from a directory holding data/{train,dev,test}.{de,en}
  (made up: numbers and their reversal), plus overrides that make it a few steps of a small
  model; then t2t-translate and t2t-score of the workdir it wrote."""
  data = tmp_path / "data"
  data.mkdir()
  for split, n in (("train", 300), ("dev", 20), ("test", 20)):
    rows = [" ".join(str((i * 7 + j) % 50) for j in range(3 + i % 5)) for i in range(n)]
    (data / f"{split}.de").write_text("".join(r + "\n" for r in rows))
    (data / f"{split}.en").write_text("".join(" ".join(reversed(r.split())) + "\n" for r in rows))
  command = _readme_own_data_command()
  assert command[0] == "t2t-train"
  tiny = [
    "--config.num_train_steps=4",
    "--config.data.vocab_size=320",
    "--config.model.d_model=32",
    "--config.model.d_ff=64",
    "--config.model.num_layers=1",
    "--config.checkpoint_every_steps=2",
    "--config.eval_every_steps=2",
    "--config.bleu_every_steps=2",
    "--config.log_every_steps=2",
  ]
  env = support.cpu_env(T2T_HUGE_PAGES="0")
  module = [sys.executable, "-m", "t2t_jax.cli.train"]
  run = subprocess.run(
    [*module, *command[1:], *tiny], cwd=tmp_path, env=env, capture_output=True, text=True
  )
  assert run.returncode == 0, run.stderr[-3000:]
  workdir = tmp_path / "workdirs" / "mine"
  assert (workdir / "test.en").read_text().count("\n") == 20  # where README says
  out = subprocess.run(
    [sys.executable, "-m", "t2t_jax.cli.translate", f"--workdir={workdir}", "--input=data/test.de"],
    cwd=tmp_path,
    env=env,
    capture_output=True,
    text=True,
  )
  assert out.returncode == 0 and out.stdout.count("\n") == 20, out.stderr[-3000:]
  score = subprocess.run(
    [
      sys.executable,
      "-m",
      "t2t_jax.cli.score",
      f"--workdir={workdir}",
      "--source=data/test.de",
      "--target=data/test.en",
    ],
    cwd=tmp_path,
    env=env,
    capture_output=True,
    text=True,
  )
  assert score.returncode == 0 and score.stdout.count("\n") == 20, score.stderr[-3000:]
