"""The data layer's shape: sources are plugins chosen through the registry, and the modules of
t2t_jax/data import one another without a circle (so none needs a lazy import to load)."""

import ast
import json
import pathlib
import subprocess
import sys

import pytest

from t2t_jax import data
from t2t_jax.data import sources
from t2t_jax.data.sources import base
from tests import support

ROOT = pathlib.Path(__file__).resolve().parents[1]
DATA = ROOT / "t2t_jax" / "data"
SCANNED = [ROOT / "t2t_jax", ROOT / "tools", ROOT / "experiments"]


def _python_files() -> list[pathlib.Path]:
  return sorted(p for d in SCANNED if d.is_dir() for p in d.rglob("*.py"))


def _names_the_source(node: ast.expr) -> bool:
  """`c.source`, `data["source"]`, `data.get("source", ...)`; not `self.source` (a class's own
  field, e.g. how a process joined a distributed run)."""
  if isinstance(node, ast.Attribute):
    owner = node.value
    return node.attr == "source" and not (isinstance(owner, ast.Name) and owner.id == "self")
  if isinstance(node, ast.Subscript):
    return isinstance(node.slice, ast.Constant) and node.slice.value == "source"
  if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
    first = node.args[0] if node.args else None
    return node.func.attr == "get" and isinstance(first, ast.Constant) and first.value == "source"
  return isinstance(node, ast.Name) and node.id == "source"


def _source_comparisons(path: pathlib.Path) -> list[str]:
  """`file:line` of every ==/!= that branches on the data source's name."""
  known = set(sources.names())
  found = []
  for node in ast.walk(support.parse_source(path)):
    if not isinstance(node, ast.Compare):
      continue
    operands = [node.left, *node.comparators]
    for op, left, right in zip(node.ops, operands, operands[1:]):
      if not isinstance(op, (ast.Eq, ast.NotEq)):
        continue
      for side, other in ((left, right), (right, left)):
        literal = isinstance(other, ast.Constant) and isinstance(other.value, str)
        if (literal and other.value in known) or (literal and _names_the_source(side)):
          found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
          break
  return found


def test_no_branch_on_the_source_name_outside_the_registry():
  found = [hit for path in _python_files() for hit in _source_comparisons(path)]
  assert not found, "ask sources.get_source(config.data) instead of comparing names:\n" + (
    "\n".join(found)
  )


def _module_name(path: pathlib.Path) -> str:
  parts = path.relative_to(ROOT).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _data_modules() -> dict[str, pathlib.Path]:
  return {_module_name(p): p for p in sorted(DATA.rglob("*.py"))}


def _imports(tree: ast.Module, modules: dict[str, pathlib.Path]) -> list[tuple[str, ast.stmt]]:
  """(imported data module, statement) of every import of a module of t2t_jax.data."""
  out = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      out += [(a.name, node) for a in node.names if a.name in modules]
    elif isinstance(node, ast.ImportFrom) and node.module and node.module in modules:
      for alias in node.names:
        submodule = f"{node.module}.{alias.name}"
        out.append((submodule if submodule in modules else node.module, node))
  return out


def _import_graph() -> dict[str, set[str]]:
  modules = _data_modules()
  return {
    name: {target for target, _ in _imports(support.parse_source(path), modules)} - {name}
    for name, path in modules.items()
  }


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
  """One import circle of `graph` (a list of modules, the first repeated last), or None."""
  state, stack = {}, []

  def visit(node: str) -> list[str] | None:
    state[node] = "open"
    stack.append(node)
    for target in sorted(graph.get(node, ())):
      if state.get(target) == "open":
        return stack[stack.index(target) :] + [target]
      if target not in state and (found := visit(target)):
        return found
    stack.pop()
    state[node] = "done"
    return None

  for node in sorted(graph):
    if node not in state and (found := visit(node)):
      return found
  return None


def test_the_data_modules_import_one_another_without_a_circle():
  graph = _import_graph()
  assert "t2t_jax.data.sources.base" in graph and graph["t2t_jax.data.sources.treebank"]
  cycle = _cycle(graph)
  assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_the_circle_check_finds_a_circle():
  assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
  assert _cycle({"a": {"b"}, "b": set()}) is None


def test_data_modules_are_imported_at_module_level_only():
  """An import of a data module inside a function or under TYPE_CHECKING hides a circle.

  One kind is allowed: the package's module-level `__getattr__` (PEP 562), which imports
  the pipeline on first use so that a translating process never loads grain. Its import
  stays in the graph the circle check above walks, so it hides nothing."""
  modules = _data_modules()
  late = []
  for name, path in modules.items():
    tree = support.parse_source(path)
    top = {id(node) for node in tree.body}
    for node in tree.body:
      if isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
        top |= {id(inner) for inner in ast.walk(node)}
    late += [f"{name}:{node.lineno}" for _, node in _imports(tree, modules) if id(node) not in top]
  assert not late, "imports of t2t_jax.data modules below module level: " + ", ".join(late)


FIRST_IMPORTS = """
import importlib, json, os, sys, traceback
for library in ("numpy", "jax", "ml_collections", "grain", "tensorflow_datasets", "sentencepiece"):
  importlib.import_module(library)  # loaded once; nothing of t2t_jax is loaded here
failed = []
for name in json.loads(sys.argv[1]):
  pid = os.fork()
  if pid == 0:  # a child with no t2t_jax module loaded imports `name` first
    try:
      importlib.import_module(name)
    except BaseException:
      traceback.print_exc()
      os._exit(1)
    os._exit(0)
  if os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0:
    failed.append(name)
print(json.dumps(failed))
"""


@pytest.mark.slow  # the syntax-tree check above is the quick one
def test_every_data_module_imports_first():
  """Each data module imported before any other t2t_jax module (a circle among them fails
  there): one forked child per module, from a parent that loaded only the libraries."""
  names = json.dumps(list(_data_modules()))
  out = subprocess.run(
    [sys.executable, "-c", FIRST_IMPORTS, names], capture_output=True, text=True, timeout=300
  )
  assert out.returncode == 0, out.stderr[-3000:]
  assert json.loads(out.stdout.splitlines()[-1]) == [], out.stderr[-3000:]


# ----------------------------------------------------------------------------- the registry


def test_every_source_is_registered_under_its_config_name():
  assert sources.names() == (
    "synthetic",
    "textfiles",
    "treebank",
    "wmt14_translate",
    "wmt17_translate",
  )
  for name in sources.names():
    c = data.default_config()
    c.source = name
    assert data.get_source(c).name == name


def test_an_unknown_source_names_the_flag_and_the_known_sources(tmp_path):
  c = data.default_config()
  c.source = "wmt99"
  with pytest.raises(data.DataError) as e:
    data.get_datasets(c, str(tmp_path))
  message = str(e.value)
  assert "config.data.source='wmt99'" in message and "--config.data.source" in message
  assert all(name in message for name in sources.names())


class _Counting(base.Source):
  """A source in a few lines: the numbers 1..n, each paired with its double."""

  name = "counting"
  vocab_file = "vocab.symbols"

  def open_splits(self, c, workdir, process_index):
    sizes = dict(train=40, dev=6, test=0)
    return {
      split: base.ListPairs([(str(i), str(2 * i)) for i in range(1, n + 1)]) if n else None
      for split, n in sizes.items()
    }

  def identity(self, c, splits):
    return dict(name=self.name)

  def check_identity(self, path, recorded, c):
    pass

  def symbols(self, c):
    return [str(i) for i in range(1, 81)]


@pytest.mark.parametrize("prepared_store", [True, False])
def test_a_new_source_is_one_class_and_one_registration(tmp_path, monkeypatch, prepared_store):
  monkeypatch.setattr(base, "_REGISTRY", dict(base._REGISTRY))
  sources.register(_Counting())
  with pytest.raises(ValueError, match="already registered"):
    sources.register(_Counting())
  c = data.default_config()
  c.update(source="counting", prepared_store=prepared_store, max_len=8, tokens_per_batch=64)
  d = data.get_datasets(c, str(tmp_path))
  assert d.tokenizer.vocab_size == 84 and d.stats.train.kept == 40
  assert d.dev_pairs[0] == ("1", "2") and d.test_pairs == []
  assert d.split_name("dev") == "counting dev split"
  assert next(d.train_iter())["inputs"].ndim == 3
