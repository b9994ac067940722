"""What the docs show can be typed as shown, and every name they use is one the code has.

The docs: README.md, docs/*.md, launch/README.md and the markdown cells of
experiments/notebooks/*.ipynb (tests/doc_names.py reads them); CHANGELOG.md is history and is
not checked. Quick (no model runs; the commands' flags are gathered once, the repository's
Python is indexed once with `ast`):

- Commands: every `t2t-*` command line (in code blocks and inline code), for all nine
  commands, names only flags its command defines (`--noFLAG` for a boolean) and `--config.*`
  fields its experiment has (the `--experiment=` of the line, or the default); every
  `import`/`from ... import` of t2t_jax and every `python -m MODULE` resolves.
- Flags, anywhere (prose, inline code, tables, code blocks): `--name` belongs to the program
  the same code span or code line names before it (a `t2t-*` command; a file of tools/,
  launch/, experiments/ or t2t_jax by path or module, whose flags are read from its source:
  argparse, absl, `--x` strings, a shell script's words; a launch/ script also forwards
  t2t-train's); where none is named, to some command, to a file the doc names anywhere, or to
  another program that `EXTERNAL_FLAGS` lists and the sentence names (pip, pytest, Slurm,
  fairseq, ...; XLA's `--xla_*` anywhere). `--config.FIELD` must be a field of some
  experiment. `DELIBERATE` lists the wrong names a doc shows on purpose.
- Dotted names in inline code: a span that is one dotted name (`a.b.c`, `a.b()`, also
  `Class.method(args)`) resolves when its first part is `t2t_jax`, `tests` or `tools` (the
  whole path), a class of the repository (`Translator.from_workdir`: an attribute of a class
  of that name, its bases' included), or a module's last component (`search.beam_search`,
  `cli.host`: an attribute or submodule of a module of that name; not when called with
  arguments, which is an expression on a variable such as `translator.translate(x)`). Not
  checked: a config field path (`model.d_model`, `config.data.max_len`: a field of some
  experiment), a file name (last part an extension: `config.json`, `search.py`), a first part
  that is a standard or installed third-party module (`jax.jit`, `ctranslate2.Translator`).
  Also every `t2t_jax.x.y` anywhere, and every `Class.attr` of a repository class inside any
  code span, resolve.
- Other names in inline code: a private name (`_foo`, `_foo()`) is an identifier of the
  repository's code (comments and docstrings do not count); a snake_case name (`beam_size`,
  `constraint_state`) is an identifier, a module name, a config field or a flag, or one of
  `EXTERNAL_NAMES`; in `name=value` the name is some function's parameter, a class field or a
  config field; `f(kw=...)` passes only keywords some `f` of the repository takes.
- Python blocks: each compiles, its t2t_jax names resolve and its keywords are parameters;
  each runs (in a subprocess, from an empty directory) unless the line above its fence says
  `<!-- not run: REASON -->` or `<!-- slow: REASON -->` (run by the slow test).
- Paths and test ids: every repository path (`t2t_jax/...`, `tests/...`, `docs/...`, ...,
  and `test_x.py` for tests/test_x.py) exists; `FILE::name` and a bare `::name` after it name
  a function or class the file defines.
- Checkpoint choices: a list of `--checkpoint` values (three or more of them in one
  sentence, table row or synopsis) lists every choice the code takes
  (t2t_jax/cli/common.py's CHECKPOINT_SPEC; t2t-average refuses `auto` and `selected`) and
  no other, unless it starts with "also" (an addition to an earlier list: only choices
  taken); so does a list of `config.init_from`'s SPEC (t2t_jax/training/warm_start.py's
  _SPEC); each command's --checkpoint help lists every choice it takes.

Slow: README's own-text-files command verbatim on a tiny corpus, with overrides that make it
a few steps of a small model, then t2t-translate and t2t-score of the workdir it wrote; and
the Python blocks marked slow.
"""

import ast
import functools
import importlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from tests import doc_names, support

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = doc_names.doc_paths()
COMMANDS = (
  "train",
  "prepare",
  "translate",
  "score",
  "export",
  "average",
  "bench",
  "serve",
  "compare",
)
_COMMAND = re.compile(r"(?:\bt2t-(\w+)|python -m t2t_jax\.cli\.(\w+))((?:[ \t]+[^\s|><;&`#]+)*)")
_IMPORT = re.compile(r"(?:from (t2t_jax[\w.]*) import ([\w, ]+)|\bimport (t2t_jax[\w.]*))")
_MODULE = re.compile(r"python -m ((?:t2t_jax|tools)[\w.]*)")


def _texts() -> dict[str, str]:
  """{doc name: its text with backslash-continued lines joined}."""
  return {doc: re.sub(r"\\\n\s*", " ", doc_names.doc_text(doc)) for doc in DOCS}


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
from absl import app, flags
import t2t_jax.cli.common as common, t2t_jax.cli.helpconfig as helpconfig
import jax, t2t_jax.training.trainer, t2t_jax.decoding.translator  # once, for every child
out = {"flags": {}, "fields": {}, "checkpoint_help": {}}
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
    app.define_help_flags()  # --help, --helpfull, --helpshort: app.run defines them
    names = {n: isinstance(flags.FLAGS[n].value, bool) or flags.FLAGS[n].boolean
             for n in flags.FLAGS}
    help = flags.FLAGS["checkpoint"].help if "checkpoint" in flags.FLAGS else None
    os.write(write, json.dumps([names, help]).encode())
    os._exit(0)
  os.close(write)
  data = b""
  while chunk := os.read(read, 1 << 16):
    data += chunk
  os.wait()
  out["flags"][command], out["checkpoint_help"][command] = json.loads(data)
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


# --- flags anywhere ----------------------------------------------------------------------

_FLAG = re.compile(r"(?<![\w\-/.])--([A-Za-z][\w-]*(?:\.[\w{}-]+)*)(=[^\s`|,;)\]]*)?")
_PROGRAM = re.compile(
  r"\bt2t-(?P<command>\w+)|python -m t2t_jax\.cli\.(?P<module_command>\w+)"
  r"|(?P<file>\b(?:tools|launch|experiments)/[\w/]+\.(?:py|sh|sbatch)"
  r"|(?<![\w/.-])\w+\.(?:sh|sbatch)\b|\b(?:tools|t2t_jax)(?:\.\w+)+)"
)
# Other programs' flags the docs quote: (a pattern naming the program, which must occur in
# the flag's sentence or code line; None: the flag's own prefix names it), the flags, why
# they are there.
EXTERNAL_FLAGS = (
  (
    r"\bpip\b",
    {
      "--index-url",
      "--extra-index-url",
      "--no-index",
      "--find-links",
      "--no-deps",
      "--dry-run",
      "--report",
    },
    "pip install/download/wheel options (launch/README.md's wheelhouse, docs/export.md)",
  ),
  (r"\buv\b", {"--resolution"}, "uv pip install's resolver strategy (the lowest versions)"),
  (r"\bruff\b", {"--check"}, "ruff format's check-only mode (CI)"),
  (r"\bpytest\b", {"--collect-only", "--durations"}, "pytest's own options"),
  (r"#SBATCH|\bsbatch\b", {"--nodes", "--signal", "--requeue"}, "Slurm's sbatch options"),
  (r"\bsrun\b", {"--kill-on-bad-exit"}, "Slurm's srun option"),
  (r"\btensorboard\b", {"--logdir"}, "TensorBoard's log directory"),
  (r"\bsacrebleu\b", {"--paired-bs"}, "sacrebleu's paired bootstrap, which t2t-compare matches"),
  (r"\bldd\b", {"--version"}, "ldd --version prints the glibc version"),
  (
    r"\bfairseq\b",
    {"--ema", "--diverse-beam-groups", "--no-repeat-ngram-size"},
    "fairseq's options, named beside ours",
  ),
  (r"\bMarian\b", {"--exponential-smoothing"}, "Marian's option, named beside ours"),
  (
    None,
    {
      "--xla_force_host_platform_device_count",
      "--xla_backend_optimization_level",
      "--xla_cpu_use_fusion_emitters",
      "--xla_cpu_parallel_codegen_split_count",
      "--xla_llvm_disable_expensive_passes",
      "--xla_cpu_experimental_ynn_fusion_type",
      "--xla_cpu_use_xnnpack",
      "--xla_cpu_use_onednn",
      "--xla_cpu_experimental_onednn_custom_call",
      "--xla_cpu_prefer_vector_width",
      "--xla_cpu_opt_preset",
      "--xla_cpu_multi_thread_eigen",
      "--xla_cpu_enable_xprof_traceme",
      "--xla_dump_to",
      "--xla_dump_hlo_as_text",
    },
    "XLA's flags, read from $XLA_FLAGS (tests/conftest.py's FAST_COMPILE, measured options)",
  ),
)
# Wrong names a doc shows on purpose: {(doc, flag or path problem): why}.
DELIBERATE = {
  ("docs/faults.md", "--config.num_train_step"): "the mistyped override whose refusal it quotes",
  (
    "docs/testing.md",
    "tests/test_faults.py defines no test_sigint_saves_exits_75_and_resumes",
  ): "a renamed test's old name, beside its new one",
}


def _programs(text: str) -> list[tuple[int, tuple[str, str]]]:
  """(offset, ("command", NAME) or ("file", PATH-OR-MODULE)) of each program `text` names."""
  found = []
  for m in _PROGRAM.finditer(text):
    command = m["command"] or m["module_command"]
    if command in COMMANDS:
      found.append((m.start(), ("command", command)))
    elif m["file"]:
      found.append((m.start(), ("file", m["file"])))
  return found


def _program_file(ref: str) -> str | None:
  """The file of a program reference: tools/x.py, local.sh (in launch/ or tools/),
  tools.paired_ab, t2t_jax.training.summary; None if there is no such file."""
  ix = doc_names.index()
  if "/" in ref:
    return ref if ref in ix.flags else None
  if ref.endswith((".sh", ".sbatch")):
    return next((f"{d}/{ref}" for d in ("launch", "tools") if f"{d}/{ref}" in ix.flags), None)
  module = ix.modules.get(ref)
  return module.path if module else None


def doc_flags() -> list[tuple[str, int, str, tuple[str, str] | None, str]]:
  """(doc, line, flag as written, the program the same code span or code line names before
  it, the sentence or code line around it) for every `--flag` in the docs."""
  found = []
  for doc in DOCS:
    for block in doc_names.blocks(doc):
      if block.code:
        program = None  # a code line without one continues the block's last program
        lines = re.sub(r"\\\n\s*", lambda m: " " * len(m[0]), block.text).split("\n")
        for i, line in enumerate(lines):
          names = _programs(line)
          for m in _FLAG.finditer(line):
            before = [p for offset, p in names if offset < m.start()]
            found.append((doc, block.line + i, m[0], before[-1] if before else program, line))
          program = names[-1][1] if names else program
        continue
      spans = doc_names.code_spans(block.text)
      for m in _FLAG.finditer(block.text):
        start, end = doc_names.sentence_bounds(block.text, m.start())
        program = None
        for s, e, content in spans:
          if s <= m.start() < e:
            before = [p for offset, p in _programs(content) if offset < m.start() - s]
            program = before[-1] if before else None
        found.append((doc, block.line_of(m.start()), m[0], program, block.text[start:end]))
  return found


def _named_files(doc: str) -> set[str]:
  """The program files a doc names anywhere."""
  text = doc_names.doc_text(doc)
  return {f for _, (kind, ref) in _programs(text) if kind == "file" and (f := _program_file(ref))}


def _field_exists(path: str, fields: dict[str, list[str]]) -> bool:
  path = path.removeprefix("config.")
  return any(
    path in leaves or any(f.startswith(path + ".") for f in leaves) for leaves in fields.values()
  )


def _flag_problem(doc, flag, program, context, known, named) -> str | None:
  """Why a flag of a doc is unknown (None: it is known)."""
  ix = doc_names.index()
  name = flag.split("=", 1)[0]
  bare = name[2:]
  if _placeholder(flag) or (doc, name) in DELIBERATE:
    return None
  if bare.startswith(("config.", "noconfig.")):
    path = bare.removeprefix("no").removeprefix("config.")
    return (
      None if _field_exists(path, known["fields"]) else f"{name}: no experiment has field {path!r}"
    )

  def command_has(command: str) -> bool:
    own = known["flags"][command]
    return bare in own or (bare.startswith("no") and own.get(bare[2:]) is True)

  external = [
    f for pattern, f, _ in EXTERNAL_FLAGS if pattern is None or re.search(pattern, context)
  ]
  if any(name in flags for flags in external):
    return None
  if program and program[0] == "command":
    return None if command_has(program[1]) else f"{name}: t2t-{program[1]} has no such flag"
  path = _program_file(program[1]) if program else None
  if path:
    forwarded = path.startswith("launch/") and command_has("train")  # the rest goes to t2t-train
    return None if name in ix.flags[path] or forwarded else f"{name}: {path} has no such flag"
  if any(command_has(c) for c in COMMANDS) or any(name in ix.flags[f] for f in named):
    return None
  return f"{name}: no command, no file the doc names and no EXTERNAL_FLAGS program has it"


def test_every_flag_a_doc_names_exists(known):
  problems = []
  named = {doc: _named_files(doc) for doc in DOCS}
  for doc, line, flag, program, context in doc_flags():
    problem = _flag_problem(doc, flag, program, context, known, named[doc])
    if problem:
      problems.append(f"{doc}:{line}: {problem}")
  assert not problems, "\n".join(problems)


def test_the_flag_check_sees_every_kind_of_flag(known):
  """A flag in prose, in a table, in a code block; with its program in the span and without."""
  found = {(doc, flag.split("=")[0], program) for doc, _, flag, program, _ in doc_flags()}
  assert ("docs/serving.md", "--metrics", None) in found  # a table row
  assert ("docs/translation.md", "--prefix", ("command", "translate")) in found  # a code block
  assert ("docs/data.md", "--pairs", ("file", "tools/prepare_benchmark.py")) in found
  named = _named_files("docs/translation.md")
  assert _flag_problem("docs/translation.md", "--prefixes", None, "", known, named)
  assert _flag_problem("x.md", "--dtype", ("command", "compare"), "", known, named)
  assert not _flag_problem("x.md", "--dtype", ("command", "serve"), "", known, named)
  assert _flag_problem("x.md", "--config.model.d_modle", None, "", known, named)
  assert _flag_problem("x.md", "--ema", None, "as in Marian", known, named)
  assert not _flag_problem("x.md", "--ema", None, "fairseq's `--ema`", known, named)


# --- dotted and other names ----------------------------------------------------------------

_DOTTED = re.compile(r"([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(\(.*\))?")
_REPO_PATH = re.compile(r"(?<![\w.])(t2t_jax(?:\.[A-Za-z_]\w*)+)")
_CLASS_ATTR = re.compile(r"(?<![\w.])([A-Z]\w*(?:\.[A-Za-z_]\w*)+)")
# A dotted name ending in one of these is a file (`config.json`, `search.py`, `train.de`).
FILE_SUFFIXES = {
  "py", "md", "json", "jsonl", "txt", "sh", "sbatch", "png", "gz", "tgz", "cfg", "toml",
  "ipynb", "h", "spm", "model", "bin", "safetensors", "mrg", "de", "en", "fr", "words",
  "trees", "gold", "lock", "symbols", "LANG", "tsv", "yaml", "html", "csv", "log", "pb",
}  # fmt: skip
# snake_case names of other software the docs name in inline code: {name: what it is}.
EXTERNAL_NAMES = {
  "prometheus_client": "the Prometheus client library",
  "local_lock": "an NFS mount option (docs/faults.md, read from /proc/mounts)",
  "limit_req": "nginx's rate-limiting module",
  "upsample_primary": "fairseq's option, named beside config.data.train_corpora's weight",
  "num_updates": "fairseq's and Marian's update counter, named beside the EMA's warm-up",
  "op_name": "a field of XLA's profile and HLO metadata",
  "hlo_module": "a field of XLA's profile",
  "ynn_fusion": "XLA:CPU's name for an instruction it hands to YNNPACK",
  "jax_log_compiles": "a JAX configuration option",
  "serialize_executable": "jax.experimental's module",
  "bitext_s0": "a workdir the back-translation recipe (tools/backtranslation.sh) writes",
  "batch_type": "a CTranslate2 Translator option",
  "max_batch_size": "a CTranslate2 Translator option",
  "inter_threads": "a CTranslate2 Translator option",
  "intra_threads": "a CTranslate2 Translator option",
  "decoder_start_token_id": "a field of the transformers config an export writes",
}


@pytest.fixture(scope="module")
def foreign() -> set[str]:
  """Top-level module names that are not the repository's: the standard library's and the
  installed distributions' (`json.dumps`, `jax.jit`, `ctranslate2.Translator`)."""
  names = set(sys.stdlib_module_names) | set(importlib.metadata.packages_distributions())
  return names - {"t2t_jax", "tests", "tools"}


def _dotted_problem(name: str, call: str, fields, foreign) -> str | None:
  """Why a dotted name written in a doc does not resolve (None: it does, or it is not one
  of the repository's names)."""
  ix = doc_names.index()
  parts = name.split(".")
  if parts[-1] in FILE_SUFFIXES or _field_exists(name, fields):
    return None
  if parts[0] in ("t2t_jax", "tests", "tools"):
    found = doc_names.lookup(name)
  elif parts[0] in foreign:
    return None
  elif (parts[0] in ix.classes and parts[0][0].isupper()) or (
    parts[0] in ix.short and call in ("", "()")
  ):
    found = doc_names.lookup_short(parts)
  else:
    return None
  return f"{name} does not resolve" if found is False else None


def doc_spans() -> list[tuple[str, int, str]]:
  """(doc, line, content) of every inline code span of the docs' prose."""
  return [
    (doc, block.line_of(start), content.strip())
    for doc in DOCS
    for block in doc_names.blocks(doc)
    if not block.code
    for start, _, content in doc_names.code_spans(block.text)
  ]


def test_every_dotted_name_a_doc_names_resolves(known, foreign):
  problems = []
  for doc, line, span in doc_spans():
    names = set()
    if m := _DOTTED.fullmatch(span):
      names.add((m[1], m[2] or ""))
    names |= {
      (n, "") for n in _CLASS_ATTR.findall(span) if n.split(".")[0] in doc_names.index().classes
    }
    for name, call in sorted(names):
      if problem := _dotted_problem(name, call, known["fields"], foreign):
        problems.append(f"{doc}:{line}: `{span}`: {problem}")
  for doc in DOCS:  # t2t_jax.x.y anywhere: prose, code blocks
    text = doc_names.doc_text(doc)
    for m in _REPO_PATH.finditer(text):
      if doc_names.lookup(m[1]) is False:
        problems.append(f"{doc}:{text.count(chr(10), 0, m.start()) + 1}: {m[1]} does not resolve")
  assert not problems, "\n".join(sorted(set(problems)))


def _parameters() -> set[str]:
  """Every parameter of a function or method of the repository, and every class-level field."""
  ix = doc_names.index()
  names = set()
  for module in ix.modules.values():
    for params, _ in module.functions.values():
      names |= params
    for cls in module.classes.values():
      names |= cls.attrs
      for params, _ in cls.params.values():
        names |= params
  return names


def _callables(name: str) -> list[tuple[frozenset[str], bool]]:
  """The signatures of every function, method or class of t2t_jax called `name` (of the
  tests and tools where t2t_jax has none)."""
  ix = doc_names.index()
  found = {}
  for module in ix.modules.values():
    own = found.setdefault(module.name.startswith("t2t_jax"), [])
    if name in module.functions:
      own.append(module.functions[name])
    for cls in module.classes.values():
      if cls.name == name:
        own.append(doc_names._class_params(ix, cls))
      if name in cls.params:
        own.append(cls.params[name])
  return found.get(True) or found.get(False, [])


def _keywords(arguments: str) -> list[str]:
  """The keywords of a call's argument text (`a, b=1, c=f(d=2)` -> [b, c])."""
  depth, words, current = 0, [], ""
  for ch in arguments + ",":
    depth += ch in "([{"
    depth -= ch in ")]}"
    if ch == "," and depth == 0:
      words.append(current.strip())
      current = ""
    else:
      current += ch
  return [m[1] for w in words if (m := re.match(r"(\w+)\s*=(?!=)", w))]


def _calls(span: str) -> list[tuple[str, str]]:
  """(callee, argument text) of each call written in a span, brackets balanced."""
  found = []
  for m in re.finditer(r"(?<![\w.])([A-Za-z_][\w.]*)\(", span):
    depth, i = 1, m.end()
    while i < len(span) and depth:
      depth += (span[i] in "([{") - (span[i] in ")]}")
      i += 1
    found.append((m[1], span[m.end() : i - 1]))
  return found


@pytest.fixture(scope="module")
def names(known, foreign):
  """What the other names of the docs are checked against."""
  ix = doc_names.index()
  fields = {leaf for leaves in known["fields"].values() for f in leaves for leaf in f.split(".")}
  flags = {n for own in known["flags"].values() for n in own}
  return dict(
    parameters=_parameters() | ix.keys | fields | set(EXTERNAL_NAMES),
    identifiers=ix.identifiers | set(ix.short) | fields | flags | set(EXTERNAL_NAMES),
    foreign=foreign,
  )


def _name_problems(span: str, names: dict) -> list[str]:
  """Why the private, snake_case and keyword names of a code span are not the code's."""
  ix = doc_names.index()
  problems = []
  if m := re.fullmatch(r"(_\w+)(\(.*\))?", span):
    if m[1] not in ix.identifiers:
      problems.append(f"no {m[1]} in the code")
  elif re.fullmatch(r"[a-z][a-z0-9]*(?:_[a-z0-9]+)+(\(\))?", span):
    if span.removesuffix("()") not in names["identifiers"]:
      problems.append("no such name in the code")
  elif (m := re.fullmatch(r"([a-z_]\w*)=.*", span)) and m[1] not in names["parameters"]:
    problems.append(f"no function takes {m[1]}, no field is called so")
  for callee, arguments in _calls(span):
    head = callee.split(".")[0]
    ours = head in ("t2t_jax", *ix.classes, *ix.short) and head not in names["foreign"]
    if "." in callee and not ours:
      continue  # np.load(mmap_mode=...), translator.translate(...): not a name of ours
    signatures = _callables(callee.rsplit(".", 1)[-1])
    if not signatures or any(open_ended for _, open_ended in signatures):
      continue
    for keyword in _keywords(arguments):
      if keyword not in set().union(*(params for params, _ in signatures)):
        problems.append(f"{callee}() takes no {keyword}")
  return problems


def test_every_other_name_a_doc_names_exists(names):
  """Private names, snake_case names, `name=value` and the keywords of calls, in inline code."""
  problems = [
    f"{doc}:{line}: `{span}`: {problem}"
    for doc, line, span in doc_spans()
    for problem in _name_problems(span, names)
  ]
  assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
  "span, problem",
  [
    ("search.force_prefix", True),
    ("search.beam_search", False),
    ("Source.store_identity", True),
    ("Source.identity", False),
    ("t2t_jax.decoding.search.sample_stage", True),
    ("search.sample_stage", True),
    ("stages.Schedule.moves", False),
    ("programs._stage_first", False),
    ("SearchConfig.check_field", False),
    ("Translator.from_workdir(DIR)", False),
    ("model.d_model", False),  # a config field
    ("search.py", False),  # a file
    ("jax.jit", False),  # not ours
  ],
)
def test_a_stale_dotted_name_is_caught(span, problem, known, foreign):
  m = _DOTTED.fullmatch(span)
  assert bool(_dotted_problem(m[1], m[2] or "", known["fields"], foreign)) == problem


@pytest.mark.parametrize(
  "span, problem",
  [
    ("_stage_outputs", True),
    ("_cache_size()", True),
    ("_search", False),
    ("constraint_state", True),
    ("beam_size", False),
    ("compilation_cache=None", True),
    ("batch_threads=2", False),
    ("beam_search(resize_cache=...)", True),
    ("beam_search(prefix=p, constraint=c)", False),
    ("Translator(batch_threads=...)", False),
    ("np.load(mmap_mode='r')", False),  # not ours
  ],
)
def test_a_stale_private_name_or_keyword_is_caught(span, problem, names):
  assert bool(_name_problems(span, names)) == problem


# --- paths and test ids --------------------------------------------------------------------

_PATH = re.compile(
  r"(?<![\w/.-])(?P<path>(?:t2t_jax|tests|tools|docs|launch|experiments)/[\w/.-]*[\w/]"
  r"|test_\w+\.py)(?:::(?P<name>\w+))?|(?<![\w.:])::(?P<bare>\w+)"
)


@functools.cache
def _defined_in(path: str) -> frozenset[str]:
  """The functions and classes a Python file defines (a test id's name)."""
  with open(os.path.join(REPO, path), encoding="utf-8") as f:
    tree = ast.parse(f.read(), path)
  kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
  return frozenset(n.name for n in ast.walk(tree) if isinstance(n, kinds))


def _path_problems(text: str) -> list[tuple[int, str]]:
  """(offset, problem) for each repository path or test id in one prose unit or code line:
  the path exists (`test_x.py` alone is tests/test_x.py); in `FILE::name` the file defines
  name; `::name` alone is a name of the last file named before it."""
  problems, last = [], None
  for m in _PATH.finditer(text):
    following = text[m.end() : m.end() + 1]
    if following in ("{", "*", "<") or (m["path"] and _placeholder(m["path"])):
      last = None  # a pattern: experiments/NAME.py, test_{a,b}_*
      continue
    if m["path"]:
      path = m["path"].rstrip(".")
      path = path if "/" in path else f"tests/{path}"
      if not os.path.exists(os.path.join(REPO, path)):
        problems.append((m.start(), f"no file {path}"))
        last = None
        continue
      last = path if path.endswith(".py") else None
    name = m["name"] or m["bare"]
    if name and last and name not in _defined_in(last):
      problems.append((m.start(), f"{last} defines no {name}"))
  return problems


def test_every_path_and_test_id_a_doc_names_exists():
  problems = []
  for doc in DOCS:
    for block in doc_names.blocks(doc):
      if block.code:
        for i, line in enumerate(block.text.split("\n")):
          problems += [f"{doc}:{block.line + i}: {p}" for _, p in _path_problems(line)]
      else:
        for offset, p in _path_problems(block.text):
          line = block.line_of(offset)
          if (doc, p) not in DELIBERATE:
            problems.append(f"{doc}:{line}: {p}")
  assert not problems, "\n".join(problems)


def test_a_stale_path_or_test_id_is_caught():
  assert not _path_problems("`tests/test_docs.py::test_a_stale_path_or_test_id_is_caught`")
  assert not _path_problems("`test_docs.py::test_every_path_and_test_id_a_doc_names_exists`")
  assert not _path_problems("`test_docs.py::_path_problems`, `::_defined_in`, t2t_jax/cli/")
  assert _path_problems("`tests/test_docs.py::test_gone`")
  assert _path_problems("`tests/test_docs.py::_path_problems`, `::test_gone`")
  assert _path_problems("t2t_jax/decoding/gone.py")
  assert not _path_problems("experiments/NAME.py, `test_quick_equivalences.py::test_{a,b}_*`")


# --- Python blocks -------------------------------------------------------------------------


def python_blocks() -> list[tuple[doc_names.Block, str]]:
  """(block, "run" | "slow" | "not run") for every ```python block of the docs."""
  return [
    (block, (block.note or "run").split(":")[0])
    for doc in DOCS
    for block in doc_names.blocks(doc)
    if block.code and block.lang == "python"
  ]


def _block_problems(block: doc_names.Block) -> list[str]:
  """It compiles; what it imports from t2t_jax, and the attributes and keywords it uses of
  those names, exist."""
  where = f"{block.doc}:{block.line}"
  try:
    tree = ast.parse(block.text, where)
    compile(tree, where, "exec")
  except SyntaxError as e:
    return [f"{where}: does not compile: {e}"]
  local = {}  # name in the block -> the repository's dotted name
  problems = []
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "t2t_jax":
      for alias in node.names:
        local[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    elif isinstance(node, ast.Import):
      for alias in node.names:
        if alias.name.split(".")[0] == "t2t_jax":
          local[alias.asname or alias.name.split(".")[0]] = alias.asname and alias.name or "t2t_jax"
  for node in ast.walk(tree):
    dotted = doc_names._dotted(node.func if isinstance(node, ast.Call) else node)
    if not isinstance(node, (ast.Attribute, ast.Call)) or dotted.split(".")[0] not in local:
      continue
    head, _, rest = dotted.partition(".")
    full = ".".join(filter(None, [local[head], rest]))
    found = doc_names.lookup(full)
    if found is False:
      problems.append(f"{where}+{node.lineno - 1}: {dotted} ({full}) does not resolve")
    elif isinstance(node, ast.Call) and found and found.params and not found.params[1]:
      for keyword in node.keywords:
        if keyword.arg and keyword.arg not in found.params[0]:
          problems.append(f"{where}+{node.lineno - 1}: {dotted}() takes no {keyword.arg}")
  return problems


def test_every_python_block_compiles_and_its_names_resolve():
  blocks = python_blocks()
  assert len(blocks) >= 5
  problems = [p for block, _ in blocks for p in _block_problems(block)]
  assert not problems, "\n".join(problems)


def test_a_python_block_with_a_stale_name_is_caught():
  def problems(text: str) -> list[str]:
    return _block_problems(doc_names.Block("x.md", 1, True, "python", text))

  assert problems("from t2t_jax.decoding import search\nsearch.force_prefix(p)")
  assert problems("from t2t_jax.model import TransformerConfig\nTransformerConfig(d_modle=8)")
  assert problems("import t2t_jax.decoding.search as s\ns.sample_stage")
  assert problems("x = (")
  ok = "from t2t_jax.model import TransformerConfig\nTransformerConfig(d_model=8).replace(d_ff=4)"
  assert not problems(ok)


def _run_block(block: doc_names.Block, tmp_path, timeout: int) -> None:
  script = tmp_path / "block.py"
  script.write_text(block.text)
  env = support.cpu_env(T2T_HUGE_PAGES="0", PYTHONPATH=REPO)
  proc = subprocess.run(
    [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
    timeout=timeout,
  )  # fmt: skip
  assert proc.returncode == 0, f"{block.doc}:{block.line}:\n{proc.stderr[-3000:]}"


def test_every_python_block_runs_or_says_why_not(tmp_path):
  """An unmarked block runs here (it must be cheap); a slow one runs in the slow test; one
  that cannot run here (a trained workdir, an exported model, a fragment) says why."""
  for block, how in python_blocks():
    if how == "run":
      _run_block(block, tmp_path, timeout=60)


@pytest.mark.slow
def test_the_slow_python_blocks_run(tmp_path):
  slow = [block for block, how in python_blocks() if how == "slow"]
  assert slow
  for block in slow:
    _run_block(block, tmp_path, timeout=300)


# --- checkpoint choices --------------------------------------------------------------------

# Each checkpoint choice, as a doc may write it: {choice: (a probe the code must accept, the
# words that name it in a doc)}; "dev" is `selected` or `auto`: the choice t2t-train made on
# dev (or, for auto, the latest when it made none).
CHECKPOINT_CHOICES = {
  "latest": ("latest", r"`latest`|\blatest\b"),
  "average:N": ("average:3", r"average:N"),
  "best": ("best", r"`best`|best\[:N\]|(?<![\w:])best(?=\||\]|$)"),
  "best:N": ("best:3", r"best:N|best\[:N\]"),
  "ema": ("ema", r"\bema\b"),
  "step": ("1200", r"\bSTEP\b|\ba step\b"),
  "dev": ("selected", r"\bselected\b|\bauto\b|\bon dev\b"),
}
_SPEC_WORDS = ("latest", "selected", "auto", "best", "ema")
# Where the code says what each list takes: {kind: (file, the compiled pattern's name)}.
CHOICE_PATTERNS = {
  "--checkpoint": ("t2t_jax/cli/common.py", "CHECKPOINT_SPEC"),
  "init_from": ("t2t_jax/training/warm_start.py", "_SPEC"),
}


@functools.cache
def _code_pattern(path: str, name: str) -> re.Pattern:
  """The `NAME = re.compile("...")` of a module, read from its source."""
  with open(os.path.join(REPO, path), encoding="utf-8") as f:
    tree = ast.parse(f.read())
  for node in tree.body:
    if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == name:
      return re.compile(node.value.args[0].value)
  raise AssertionError(f"{path} has no {name}")


def _takes(kind: str, command: str, spec: str) -> bool:
  """Whether a list of `kind` (of `command`'s --checkpoint) takes the spec."""
  if command == "t2t-average" and spec in ("auto", "selected"):
    return False  # t2t-average refuses them (t2t_jax/cli/average.py)
  return bool(_code_pattern(*CHOICE_PATTERNS[kind]).match(spec))


def test_the_checkpoint_choices_are_the_codes():
  """Every choice above is one --checkpoint takes, and it takes no other word."""
  spec = _code_pattern(*CHOICE_PATTERNS["--checkpoint"])
  assert all(spec.match(probe) for probe, _ in CHECKPOINT_CHOICES.values())
  words = set(re.findall(r"(?<!\\)\b[a-z]{2,}\b", spec.pattern))
  assert words <= {"auto", "selected", "latest", "average", "best", "ema"}, words
  assert not _takes("init_from", "", "best") and _takes("init_from", "", "ema")


def _listed(window: str) -> set[str]:
  return {c for c, (_, words) in CHECKPOINT_CHOICES.items() if re.search(words, window)}


def _window(text: str, start: int, end: int) -> str:
  """text[start:end] up to its first `;` outside brackets."""
  window, depth = "", 0
  for ch in text[start:end]:
    depth += ch in "(["
    depth -= ch in ")]"
    if ch == ";" and depth <= 0:
      break
    window += ch
  return window


def choice_lists() -> list[tuple[str, int, str, str, str]]:
  """(doc, line, kind, command, text) of each list of checkpoint choices that names three or
  more: a `--checkpoint=a|b|c` synopsis, or the rest of the sentence (up to a `;` outside
  brackets) after `--checkpoint`; or, in a paragraph on `init_from`, after "`SPEC` is one
  of"."""
  found = []
  for doc in DOCS:
    for block in doc_names.blocks(doc):
      lists = []
      for m in re.finditer(r"(t2t-\w+ )?--checkpoint\b(=\S+)?", block.text):
        command = (m[1] or "t2t-translate ").strip()
        if m[2] and "|" in m[2]:
          lists.append((m.start(), "--checkpoint", command, m[2].strip("=[]`")))
        elif not block.code:
          end = doc_names.sentence_bounds(block.text, m.start())[1]
          lists.append((m.start(), "--checkpoint", command, _window(block.text, m.end(), end)))
      if not block.code and "init_from" in block.text:
        for m in re.finditer(r"`SPEC` is one of", block.text):
          end = doc_names.sentence_bounds(block.text, m.start())[1]
          lists.append((m.start(), "init_from", "", _window(block.text, m.end(), end)))
      for start, kind, command, window in lists:
        if len(_listed(window)) >= 3:
          line = block.line_of(start)
          found.append((doc, line, kind, command, window))
  return found


def _choice_problems(kind: str, command: str, window: str) -> list[str]:
  """A list must name every choice its kind takes, and nothing it does not take; one that
  starts with "also" adds to an earlier list, so it need only name choices taken."""
  problems = []
  takes = {c for c, (probe, _) in CHECKPOINT_CHOICES.items() if _takes(kind, command, probe)}
  listed = _listed(window)
  if not re.match(r"[`\s]*also\b", window) and takes - listed:
    problems.append(f"lists {sorted(listed)}: missing {sorted(takes - listed)}")
  words = re.split(r"[|`,\s()]+", window)
  for word in words:
    if re.fullmatch(r"[a-z]+(:N|:\d+)", word) or word in _SPEC_WORDS or word == "best[:N]":
      probes = ["best", "best:3"] if word == "best[:N]" else [word.replace(":N", ":3")]
      if not all(_takes(kind, command, p) for p in probes):
        problems.append(f"lists {word!r}, which {command or kind} does not take")
  return problems


def test_every_list_of_checkpoint_choices_is_complete():
  problems = []
  lists = choice_lists()
  docs = {doc for doc, *_ in lists}
  assert docs >= {"docs/serving.md", "docs/translation.md", "docs/export.md", "docs/training.md"}
  for doc, line, kind, command, window in lists:
    problems += [f"{doc}:{line}: {kind}: {p}" for p in _choice_problems(kind, command, window)]
  assert not problems, "\n".join(problems)


def test_an_incomplete_or_wrong_list_of_checkpoint_choices_is_caught():
  full = "`latest`, `average:N`, `best[:N]`, `ema`, a step or `auto`"
  assert not _choice_problems("--checkpoint", "t2t-translate", full)
  assert _choice_problems("--checkpoint", "t2t-translate", full.replace("`ema`, ", ""))
  assert _choice_problems("--checkpoint", "t2t-translate", full + ", `last:N`")
  assert _choice_problems("--checkpoint", "t2t-average", full)  # t2t-average takes no auto
  assert _choice_problems("init_from", "", full)  # nor init_from best
  assert not _choice_problems("--checkpoint", "t2t-translate", "` also takes `best`, `auto`")


def test_every_commands_checkpoint_help_lists_every_choice(known):
  helps = {c: h for c, h in known["checkpoint_help"].items() if h}
  assert set(helps) == {"translate", "score", "export", "average", "bench", "serve"}, helps
  for command, text in helps.items():
    text = text.replace("'", "`")
    assert not _choice_problems("--checkpoint", f"t2t-{command}", text), (command, text)


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
