"""The package's shape: imports run one way (down the layers), no module imports itself back
through others, no library module imports experiments or tests, and no function or module grows
past the size STYLE.md asks for without a reason written beside it.

Read from the source (ast), not by importing: imports inside functions count too.
"""

import ast
import collections
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "medjax"

# Lowest first. A module may import modules of its own layer and of the layers below it; the
# first prefix that matches a module's dotted name gives its layer.
LAYERS = (
    ("base", ("medjax.errors", "medjax.jsonl", "medjax.paths", "medjax.secretfile",
              "medjax.lifeline", "medjax.programs", "medjax.progress", "medjax.runlog",
              "medjax.plots", "medjax.schema")),
    ("lineage", ("medjax.lineage",)),
    ("data and model", ("medjax.data", "medjax.model")),
    ("checkpoint", ("medjax.checkpoint",)),
    ("runtime: the worker-side hooks", ("medjax.runtime",)),
    ("evals and monitor", ("medjax.evals", "medjax.monitor", "medjax.monitor_plots")),
    ("train", ("medjax.train",)),
    ("evaluate: the notebook's load", ("medjax.evaluate",)),
    ("fault: coordinator, agents, workers", ("medjax.fault",)),
    ("config_check", ("medjax.config_check",)),
    ("sweep", ("medjax.sweep",)),
    ("cli", ("medjax.cli", "medjax.__main__")),
    ("medjax", ("medjax",)),   # the package's own __init__ (a docstring)
)
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 500
# A longer function or module says why on the line of its `def` or in its first lines, with
# this marker: e.g. `# long: one table of every field's rules, read top to bottom`.
LONG_MARKER = "# long:"


def _modules() -> dict[str, pathlib.Path]:
  found = {}
  for path in PACKAGE.rglob("*.py"):
    parts = path.relative_to(ROOT).with_suffix("").parts
    if parts[-1] == "__init__":
      parts = parts[:-1]
    found[".".join(parts)] = path
  return found


MODULES = _modules()


def _imports(name: str, path: pathlib.Path) -> list[tuple[str, int]]:
  """(imported medjax module, line) for every import in the module, functions' included."""
  out = []
  package = name if path.name == "__init__.py" else name.rpartition(".")[0]
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      out += [(a.name, node.lineno) for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]
                        + ([base] if base else []))
      for a in node.names:
        full = f"{base}.{a.name}"
        out.append((full if full in MODULES else base, node.lineno))
  return out


def _layer(name: str) -> int:
  for i, (_, prefixes) in enumerate(LAYERS):
    if any(name == p or name.startswith(p + ".") for p in prefixes):
      return i
  raise AssertionError(f"{name} is in no layer of tests/test_layers.py: add it to LAYERS")


def _graph() -> dict[str, set[str]]:
  graph = collections.defaultdict(set)
  for name, path in MODULES.items():
    for target, _ in _imports(name, path):
      if target in MODULES and target != name:
        graph[name].add(target)
  return graph


def test_every_module_has_a_layer():
  for name in MODULES:
    _layer(name)


def test_imports_run_down_the_layers():
  upward = []
  for name, path in sorted(MODULES.items()):
    for target, line in _imports(name, path):
      if target.startswith("medjax") and target in MODULES and _layer(target) > _layer(name):
        upward.append(f"{path.relative_to(ROOT)}:{line}: {name} ({LAYERS[_layer(name)][0]}) "
                      f"imports {target} ({LAYERS[_layer(target)][0]})")
  assert not upward, "imports up the layers:\n" + "\n".join(upward)


def test_the_library_never_imports_experiments_or_tests():
  found = [f"{path.relative_to(ROOT)}:{line}: {target}"
           for name, path in MODULES.items() for target, line in _imports(name, path)
           if target.split(".")[0] in ("experiments", "tests")]
  assert not found, found


def test_tests_never_import_experiments():
  found = []
  for path in (ROOT / "tests").rglob("*.py"):
    for node in ast.walk(ast.parse(path.read_text())):
      names = ([a.name for a in node.names] if isinstance(node, ast.Import)
               else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
      found += [f"{path.relative_to(ROOT)}:{node.lineno}: {n}" for n in names
                if n.split(".")[0] == "experiments"]
  assert not found, found


def test_no_import_cycles():
  graph = _graph()
  index, low, stack, on_stack, cycles = {}, {}, [], set(), []

  def visit(v):  # Tarjan's strongly connected components
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in graph.get(v, ()):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        cycles.append(sorted(component))

  for v in sorted(MODULES):
    if v not in index:
      visit(v)
  assert not cycles, f"import cycles: {cycles}"


def _long_reason(lines: list[str], first: int, last: int) -> bool:
  return any(LONG_MARKER in line for line in lines[first - 1:min(last, first + 3)])


def test_functions_are_short_or_say_why():
  long = []
  for path in sorted(list(PACKAGE.rglob("*.py")) + [ROOT / "launch.py"]):
    text = path.read_text()
    lines = text.splitlines()
    for node in ast.walk(ast.parse(text)):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        n = node.end_lineno - node.lineno + 1
        if n > MAX_FUNCTION_LINES and not _long_reason(lines, node.lineno, node.end_lineno):
          long.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.name} has {n} lines")
  assert not long, (f"functions over {MAX_FUNCTION_LINES} lines without a '{LONG_MARKER} why' "
                    "comment:\n" + "\n".join(long))


def test_modules_are_short_or_say_why():
  long = []
  for path in sorted(PACKAGE.rglob("*.py")):
    lines = path.read_text().splitlines()
    if len(lines) > MAX_MODULE_LINES and not any(LONG_MARKER in line for line in lines[:40]):
      long.append(f"{path.relative_to(ROOT)}: {len(lines)} lines")
  assert not long, (f"modules over {MAX_MODULE_LINES} lines without a '{LONG_MARKER} why' "
                    "comment in their first lines:\n" + "\n".join(long))


@pytest.mark.parametrize("layer", [name for name, _ in LAYERS])
def test_every_layer_holds_a_module(layer):
  prefixes = dict(LAYERS)[layer]
  assert any(_layer(name) == [n for n, _ in LAYERS].index(layer) for name in MODULES), (
      f"layer {layer!r} ({prefixes}) matches no module: remove it or fix its prefixes")


def test_an_upward_import_would_be_reported(tmp_path):
  """The rule itself, on a module written for the test: data importing the trainer is upward,
  the trainer importing data is not; a relative import resolves like an absolute one."""
  fake = tmp_path / "fake.py"
  fake.write_text("from medjax.train import loop\nfrom ..checkpoint import saver\n"
                  "def f():\n  from medjax import lineage\n")
  found = _imports("medjax.data.fake", fake)
  assert ("medjax.train.loop", 1) in found and ("medjax.checkpoint.saver", 2) in found
  assert ("medjax.lineage", 4) in found   # inside a function
  assert _layer("medjax.train.loop") > _layer("medjax.data.fake")
  assert _layer("medjax.checkpoint.saver") > _layer("medjax.data.fake")
  assert _layer("medjax.lineage") < _layer("medjax.data.fake")
