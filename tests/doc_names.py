"""What tests/test_docs.py reads: the docs split into prose and code blocks, and an index of
the names the repository's Python defines, built from the source with `ast` (no import), so
that a doc's `Class.method`, `module.function`, `--flag` or `name=` can be looked up fast.

Docs: README.md, docs/*.md, launch/README.md, the markdown cells of
experiments/notebooks/*.ipynb; CHANGELOG.md is history and is not read.
"""

import ast
import dataclasses
import functools
import glob
import json
import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def doc_paths() -> list[str]:
  """Every doc, relative to the repository root."""
  paths = ["README.md", "launch/README.md", *sorted(glob.glob("docs/*.md", root_dir=REPO))]
  paths += sorted(glob.glob("experiments/notebooks/*.md", root_dir=REPO))
  paths += sorted(glob.glob("experiments/notebooks/*.ipynb", root_dir=REPO))
  return paths


def doc_text(path: str) -> str:
  """A doc's markdown; a notebook's markdown cells, each after a `<!-- cell N -->` line."""
  with open(os.path.join(REPO, path), encoding="utf-8") as f:
    text = f.read()
  if not path.endswith(".ipynb"):
    return text
  cells = json.loads(text)["cells"]
  parts = [
    f"<!-- cell {i} -->\n{''.join(cell['source'])}\n"
    for i, cell in enumerate(cells)
    if cell["cell_type"] == "markdown"
  ]
  return "\n".join(parts)


@dataclasses.dataclass(frozen=True)
class Block:
  """A fenced code block (`lang` its info string, `note` the `<!-- not run: REASON -->` or
  `<!-- slow: REASON -->` on the line right above its fence, as "not run: REASON") or a
  prose unit: a paragraph, one table row, one list item or a heading, its lines joined by
  single spaces."""

  doc: str
  line: int  # of its first line (1-based); for a code block, of its first line of code
  code: bool
  lang: str
  text: str
  note: str | None = None
  starts: tuple[int, ...] = dataclasses.field(default=(0,), compare=False, repr=False)

  def line_of(self, offset: int) -> int:
    """The doc line of a character of `text`."""
    if self.code:
      return self.line + self.text.count("\n", 0, offset)
    return self.line + sum(1 for s in self.starts[1:] if s <= offset)


_FENCE = re.compile(r"^\s*(```+|~~~+)\s*([\w+-]*)")
_NOTE = re.compile(r"^\s*<!--\s*((?:not run|slow):\s*.+?)\s*-->\s*$")
# A line that starts a new prose unit: a list item, a table row, a heading, an HTML comment.
_ITEM = re.compile(r"^\s*(?:[-*]|\d+\.)\s+|^\s*\||^\s*#|^\s*<!--")


@functools.cache
def blocks(path: str) -> tuple[Block, ...]:
  """The blocks of one doc, in order."""
  lines = doc_text(path).splitlines()
  out: list[Block] = []
  unit: list[tuple[int, str]] = []

  def flush() -> None:
    if unit:
      text, starts = "", []
      for _, line in unit:
        starts.append(len(text) + (1 if text else 0))
        text = f"{text} {line.strip()}" if text else line.strip()
      out.append(Block(path, unit[0][0], False, "", text, starts=tuple(starts)))
      unit.clear()

  i = 0
  while i < len(lines):
    line = lines[i]
    fence = _FENCE.match(line)
    if fence:
      flush()
      note = _NOTE.match(lines[i - 1]) if i else None
      end = i + 1
      while end < len(lines) and not lines[end].strip().startswith(fence[1]):
        end += 1
      out.append(
        Block(path, i + 2, True, fence[2], "\n".join(lines[i + 1 : end]), note and note[1])
      )
      i = end + 1
      continue
    if not line.strip() or _ITEM.match(line):
      flush()
    if line.strip():
      unit.append((i + 1, line))
      if line.lstrip().startswith(("|", "#", "<!--")):
        flush()
    i += 1
  flush()
  return tuple(out)


_CODE_SPAN = re.compile(r"(`+)(.+?)\1")


def code_spans(text: str) -> list[tuple[int, int, str]]:
  """(start, end, content) of each inline code span of a prose unit."""
  return [(m.start(2), m.end(2), m[2]) for m in _CODE_SPAN.finditer(text)]


def masked(text: str) -> str:
  """The prose with each code span's content blanked out (for finding sentence ends)."""
  for start, end, _ in code_spans(text):
    text = text[:start] + "x" * (end - start) + text[end:]
  return text


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z`(\[*])")
_NOT_AN_END = ("e.g.", "i.e.", "al.", "cf.", "vs.")


def sentence_bounds(text: str, offset: int) -> tuple[int, int]:
  """[start, end) of the sentence of a prose unit holding `offset`: it ends at `.`, `!` or
  `?` before a space and a capital letter, a code span, a bracket or emphasis (not inside a
  code span, not after "e.g." and the like)."""
  start, end = 0, len(text)
  prose = masked(text)
  ends = [m for m in _SENTENCE_END.finditer(prose) if not prose[: m.start()].endswith(_NOT_AN_END)]
  for m in ends:
    if m.end() <= offset:
      start = m.end()
    elif m.start() >= offset:
      end = m.start()
      break
  return start, end


# --- the index of the repository's Python --------------------------------------------------


@dataclasses.dataclass
class ClassInfo:
  name: str
  module: str
  attrs: set[str]
  bases: list[str]  # as written: "Base", "nn.Module", "NamedTuple"
  params: dict[str, tuple[frozenset[str], bool]]  # method -> (parameter names, takes **kw)


@dataclasses.dataclass
class ModuleInfo:
  name: str  # t2t_jax.decoding.search; experiments/x.py is t2t_jax.experiments.x
  path: str  # relative to the repository root
  names: set[str]  # bound at module level (defs, classes, assignments, imports, __all__)
  imports: dict[str, str]  # local name -> the dotted name it stands for
  classes: dict[str, ClassInfo]
  functions: dict[str, tuple[frozenset[str], bool]]
  lazy: bool  # a module-level __getattr__: names may come from elsewhere
  keys: set[str] = dataclasses.field(default_factory=set)  # "name" strings, not flag names


# Where the indexed modules live: (directory, dotted prefix).
PACKAGES = (
  ("t2t_jax", "t2t_jax"),
  ("experiments", "t2t_jax.experiments"),
  ("tests", "tests"),
  ("tools", "tools"),
  ("launch", "launch"),
)


def _module_name(path: str) -> str:
  for directory, prefix in PACKAGES:
    if path == directory or path.startswith(directory + "/"):
      rest = path[len(directory) :].removesuffix(".py").removesuffix("/__init__")
      return prefix + rest.replace("/", ".")
  raise ValueError(path)


def _signature(node: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[frozenset[str], bool]:
  a = node.args
  names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
  return frozenset(names), a.kwarg is not None


def _dotted(node: ast.expr) -> str:
  if isinstance(node, ast.Name):
    return node.id
  if isinstance(node, ast.Attribute):
    return f"{_dotted(node.value)}.{node.attr}"
  if isinstance(node, ast.Subscript):
    return _dotted(node.value)
  if isinstance(node, ast.Call):
    return _dotted(node.func)
  return ""


def _targets(node: ast.stmt) -> list[ast.expr]:
  if isinstance(node, ast.Assign):
    return node.targets
  if isinstance(node, (ast.AnnAssign, ast.AugAssign)):
    return [node.target]
  return []


def _names_of(target: ast.expr) -> list[str]:
  if isinstance(target, ast.Name):
    return [target.id]
  if isinstance(target, (ast.Tuple, ast.List)):
    return [n for t in target.elts for n in _names_of(t)]
  return []


def _class_info(node: ast.ClassDef, module: str) -> ClassInfo:
  info = ClassInfo(node.name, module, set(), [_dotted(b) for b in node.bases], {})
  for stmt in node.body:
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
      info.attrs.add(stmt.name)
      info.params[stmt.name] = _signature(stmt)
    elif isinstance(stmt, ast.ClassDef):
      info.attrs.add(stmt.name)
    for target in _targets(stmt):
      info.attrs.update(_names_of(target))
  for sub in ast.walk(node):  # self.x = ... in its methods
    for target in _targets(sub) if isinstance(sub, ast.stmt) else ():
      if (
        isinstance(target, ast.Attribute)
        and isinstance(target.value, ast.Name)
        and target.value.id == "self"
      ):
        info.attrs.add(target.attr)
  return info


def _module_info(path: str) -> tuple[ModuleInfo, set[str], set[str]]:
  """(the module, every identifier its code uses, the `--flags` it defines or reads)."""
  with open(os.path.join(REPO, path), encoding="utf-8") as f:
    tree = ast.parse(f.read(), path)
  name = _module_name(path)
  package = name if path.endswith("__init__.py") else name.rsplit(".", 1)[0]
  info = ModuleInfo(name, path, set(), {}, {}, {}, False)
  for stmt in tree.body:
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
      info.names.add(stmt.name)
      info.functions[stmt.name] = _signature(stmt)
      info.lazy |= stmt.name == "__getattr__"
    elif isinstance(stmt, ast.ClassDef):
      info.names.add(stmt.name)
      info.classes[stmt.name] = _class_info(stmt, name)
    elif isinstance(stmt, ast.Import):
      for alias in stmt.names:
        local = alias.asname or alias.name.split(".")[0]
        info.names.add(local)
        info.imports[local] = alias.name if alias.asname else local
    elif isinstance(stmt, ast.ImportFrom):
      base = stmt.module or ""
      if stmt.level:
        base = ".".join(package.split(".")[: len(package.split(".")) - stmt.level + 1] + [base])
        base = base.strip(".")
      for alias in stmt.names:
        info.names.add(alias.asname or alias.name)
        info.imports[alias.asname or alias.name] = f"{base}.{alias.name}"
    for target in _targets(stmt):
      for n in _names_of(target):
        info.names.add(n)
        if n == "__all__" and isinstance(stmt.value, (ast.List, ast.Tuple)):
          info.names.update(e.value for e in stmt.value.elts if isinstance(e, ast.Constant))
  identifiers, flags, defined = set(), set(), set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Name):
      identifiers.add(node.id)
    elif isinstance(node, ast.Attribute):
      identifiers.add(node.attr)
    elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      identifiers.add(node.name)
    elif isinstance(node, ast.arg) or (isinstance(node, ast.keyword) and node.arg):
      identifiers.add(node.arg)
    elif isinstance(node, ast.alias):
      identifiers.update((node.asname or node.name).split("."))
    elif isinstance(node, ast.Constant) and isinstance(node.value, str):
      if re.fullmatch(r"[A-Za-z_]\w*", node.value):
        identifiers.add(node.value)  # getattr(x, "name"), a field or metric by name
      flags.update(re.findall(r"(?<![\w-])(--[A-Za-z][\w-]*)", node.value))
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
      called, first = _dotted(node.func).rsplit(".", 1)[-1], node.args[0].value
      if called.startswith("DEFINE") and isinstance(first, str):  # absl flags, config_flags
        flags.add(f"--{first}")
        defined.add(first)
        if "bool" in called:
          flags.add(f"--no{first}")
  strings = {
    node.value
    for node in ast.walk(tree)
    if isinstance(node, ast.Constant) and isinstance(node.value, str)
    and re.fullmatch(r"[A-Za-z_]\w*", node.value)
  }  # fmt: skip
  info.keys = strings - defined
  return info, identifiers, flags


def _mutation_names(path: str) -> set[str]:
  """The names of the mutations a tools/mutations/ module declares (docs/testing.md's table)."""
  with open(os.path.join(REPO, path), encoding="utf-8") as f:
    tree = ast.parse(f.read(), path)
  return {
    node.args[0].value
    for node in ast.walk(tree)
    if isinstance(node, ast.Call) and _dotted(node.func) in ("M", "Mutation") and node.args
    and isinstance(node.args[0], ast.Constant)
  }  # fmt: skip


def _python_files() -> list[str]:
  out = []
  for directory, _ in PACKAGES:
    out += sorted(glob.glob(f"{directory}/**/*.py", root_dir=REPO, recursive=True))
  return out


@dataclasses.dataclass
class Index:
  modules: dict[str, ModuleInfo]
  identifiers: set[str]  # every name any of the Python uses (not comments or docstrings)
  keys: set[str]  # identifier-like strings other than flag names: fields read by name
  flags: dict[str, set[str]]  # file -> the --flags it defines or reads (also shell scripts)

  @functools.cached_property
  def short(self) -> dict[str, list[str]]:
    """Last component -> the modules of that name (`search` -> [t2t_jax.decoding.search])."""
    out: dict[str, list[str]] = {}
    for name in self.modules:
      out.setdefault(name.rsplit(".", 1)[-1], []).append(name)
    return out

  @functools.cached_property
  def classes(self) -> dict[str, list[ClassInfo]]:
    """Class name -> every class of that name."""
    out: dict[str, list[ClassInfo]] = {}
    for module in self.modules.values():
      for cls in module.classes.values():
        out.setdefault(cls.name, []).append(cls)
    return out

  def class_attrs(self, cls: ClassInfo, seen: frozenset = frozenset()) -> tuple[set[str], bool]:
    """(its attributes and those of its bases found in the index, whether a base is not
    in the index: a library class whose attributes are not listed)."""
    attrs, open_ended = set(cls.attrs), False
    for base in cls.bases:
      found = self.lookup_class(cls.module, base)
      if found is None or found.name in seen:
        open_ended |= base not in ("object", "Protocol", "Exception", "ValueError")
        continue
      more, more_open = self.class_attrs(found, seen | {cls.name})
      attrs |= more
      open_ended |= more_open
    return attrs, open_ended

  def lookup_class(self, module: str, written: str) -> ClassInfo | None:
    """The class a name written in `module` stands for, if it is in the index."""
    info = self.modules.get(module)
    head = written.split(".")[0]
    if info and written in info.classes:
      return info.classes[written]
    if info and head in info.imports:
      target = info.imports[head] + written[len(head) :]
      mod, _, name = target.rpartition(".")
      if mod in self.modules and name in self.modules[mod].classes:
        return self.modules[mod].classes[name]
    return None


# Files whose names are no evidence that the code has a name: the docs' tests (which spell
# stale names to refuse them) and the mutations (which write stale names on purpose).
NOT_EVIDENCE = ("tests/test_docs.py", "tests/doc_names.py", "tools/mutations/")


@functools.cache
def index() -> Index:
  modules, identifiers, keys, flags = {}, set(), set(), {}
  for path in _python_files():
    info, used, defined = _module_info(path)
    modules[info.name] = info
    if not path.startswith(NOT_EVIDENCE):
      identifiers |= used
      keys |= info.keys
      flags[path] = defined
    elif path.startswith("tools/mutations/"):
      identifiers |= _mutation_names(path)
  for path in sorted(
    glob.glob("launch/*.sh", root_dir=REPO) + glob.glob("tools/*.sh", root_dir=REPO)
  ):
    with open(os.path.join(REPO, path), encoding="utf-8") as f:
      flags[path] = set(re.findall(r"(?<![\w-])(--[A-Za-z][\w-]*)", f.read()))
  for path in glob.glob("launch/*.sbatch", root_dir=REPO):
    with open(os.path.join(REPO, path), encoding="utf-8") as f:
      flags[path] = set(re.findall(r"(?<![\w-])(--[A-Za-z][\w-]*)", f.read()))
  return Index(modules, identifiers, keys, flags)


# --- resolving a dotted name -----------------------------------------------------------------

# Bases that add no attribute a doc would name: a class with only these is fully listed.
_CLOSED_BASES = {"object", "abc.ABC", "ABC", "Protocol", "typing.Protocol", "Generic"}


@dataclasses.dataclass(frozen=True)
class Found:
  """What a dotted name stands for: a module, a class, a function or method (with its
  parameters), or another value."""

  kind: str  # "module" | "class" | "function" | "value"
  params: tuple[frozenset[str], bool] | None = None  # what a call may pass by keyword


def _walk_module(ix: "Index", module: str, parts: list[str], depth: int = 0) -> Found | bool | None:
  """Found, False (it is not there) or None (the index cannot tell: a library's name, a
  module-level __getattr__, an attribute of a value)."""
  info = ix.modules[module]
  if not parts:
    return Found("module")
  head, rest = parts[0], parts[1:]
  if f"{module}.{head}" in ix.modules:
    return _walk_module(ix, f"{module}.{head}", rest, depth)
  if head in info.classes:
    return _walk_class(ix, [info.classes[head]], rest)
  if head in info.functions:
    return None if rest else Found("function", info.functions[head])
  if head in info.imports and depth < 8:
    target = info.imports[head]
    if target in ix.modules:
      return _walk_module(ix, target, rest, depth + 1)
    parent, _, name = target.rpartition(".")
    if parent in ix.modules and parent != module:
      return _walk_module(ix, parent, [name, *rest], depth + 1)
    return None  # a library's name
  if head in info.names:
    return None if rest else Found("value")
  return None if info.lazy else False


def _class_params(ix: "Index", cls: ClassInfo) -> tuple[frozenset[str], bool]:
  """What `Class(...)` takes by keyword: __init__'s parameters, else its fields (a
  dataclass, a NamedTuple, a flax module: the annotated class attributes)."""
  attrs, open_ended = ix.class_attrs(cls)
  if "__init__" in cls.params:
    return cls.params["__init__"]
  return frozenset(attrs), open_ended


def _walk_class(ix: "Index", classes: list[ClassInfo], parts: list[str]) -> Found | bool | None:
  if not parts:
    names, open_ended = set(), False
    for cls in classes:
      p, o = _class_params(ix, cls)
      names |= p
      open_ended |= o
    return Found("class", (frozenset(names), open_ended))
  head, rest = parts[0], parts[1:]
  verdicts = []
  for cls in classes:
    attrs, open_ended = ix.class_attrs(cls)
    if head not in attrs:
      verdicts.append(None if open_ended else False)
    elif head in ix.classes and rest:
      verdicts.append(_walk_class(ix, ix.classes[head], rest))
    elif rest:
      verdicts.append(None)  # an attribute of an attribute: its type is not indexed
    else:
      method = next((c.params[head] for c in [cls] if head in c.params), None)
      verdicts.append(Found("function", method) if method else Found("value"))
  for v in verdicts:
    if isinstance(v, Found):
      return v
  return None if None in verdicts else False


def _imported(dotted: str) -> bool | None:
  """The last word: import the longest module prefix and look the rest up (for what the
  index cannot tell). None when the module cannot be imported here."""
  import importlib

  parts = dotted.split(".")
  for k in range(len(parts), 0, -1):
    try:
      obj = importlib.import_module(".".join(parts[:k]))
    except ImportError:
      continue
    except Exception:  # an import with side effects this process lacks
      return None
    for part in parts[k:]:
      if not hasattr(obj, part):
        return False
      obj = getattr(obj, part)
    return True
  return None


def lookup(dotted: str) -> Found | bool | None:
  """A full dotted name of the repository (t2t_jax.x.y, tests.support.z, tools.paired_ab):
  Found, False (missing) or None (cannot tell)."""
  ix = index()
  parts = dotted.split(".")
  for k in range(len(parts), 0, -1):
    module = ".".join(parts[:k])
    if module in ix.modules:
      found = _walk_module(ix, module, parts[k:])
      if found is None:
        imported = _imported(dotted)
        return None if imported is None else (Found("value") if imported else False)
      return found
  return False


def lookup_short(parts: list[str]) -> Found | bool | None:
  """`search.beam_search`, `Translator.from_workdir`, `stages.Schedule.moves`: the first part
  a module's last component or a class name of the index (any of that name may hold it)."""
  ix = index()
  verdicts = [lookup(f"{m}.{'.'.join(parts[1:])}".rstrip(".")) for m in ix.short.get(parts[0], ())]
  for cls in ix.classes.get(parts[0], ()):
    verdict = _walk_class(ix, [cls], parts[1:])
    if verdict is None:
      imported = _imported(f"{cls.module}.{'.'.join(parts)}")
      verdict = None if imported is None else (Found("value") if imported else False)
    verdicts.append(verdict)
  for v in verdicts:
    if isinstance(v, Found):
      return v
  return None if None in verdicts else False
