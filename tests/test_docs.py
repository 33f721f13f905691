"""Every command in README.md, docs/*.md and deploy/README.md is valid, checked without running it.

The fenced shell blocks (```bash, ```sh, ```console, and unlabelled blocks that look like shell) are
read as a shell would split them: lines continued with `\\` joined, quotes removed, `;`, `&&`, `||`
and `|` separating commands, `bash -c '...'` read inside. Then:

- `python launch.py`, `python -m medjax` and `medjax` use only flags that `medjax.cli` defines;
  every `--config FILE[:variant]` file exists and its `get_config(variant)` returns; every
  `--config.a.b=value` names a field (`config_check.field_names()`, or the sweep config's own
  fields for a sweep config);
- `python -m experiments.X` / `python experiments/X.py` (any `python PATH.py`) name files that
  exist, and their `--options` are ones the script's argparse parser adds; `bash PATH`,
  `sbatch PATH`, `kubectl ... -f PATH` and `jupyter execute PATH` name files that exist;
- `python -m pytest PATH[::test]` names files (and tests) that exist;
- README.md is at most MAX_README_LINES lines and starts with the two commands a new user runs;
- relative links in these pages point at files (and headings) that exist.

Shell variables (`$WORK`, `$(hostname)`) are fine as values. Each failure names the file, the line
and what is wrong.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
import pathlib
import re
import textwrap

import ml_collections
import pytest
from absl import flags

from medjax import cli
from medjax import config_check
from medjax.config_check import schema as config_schema

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_README_LINES = 260
INSTALL = "python3 -m venv .venv && . .venv/bin/activate && pip install -r requirements.txt -e ."
FIRST_COMMANDS = (f"{INSTALL} && python launch.py --config configs/quickstart.py",
                  f"{INSTALL} && python -m pytest -q")

SHELL_LANGS = {"bash", "sh", "shell", "console", "zsh"}
# First words that make an unlabelled block a shell block.
SHELL_WORDS = {"python", "python3", "medjax", "pip", "pytest", "bash", "sh", "export", "srun",
               "sbatch", "salloc", "kubectl", "helm", "tensorboard", "optuna-dashboard", "jupyter",
               "cd", "rm", "ls", "cat", "git", "nice", "env", "docker", "ssh", "mkdir", "cp",
               "sudo", "source", "."}
ABSL_HELP = {"help", "helpfull", "helpshort", "helpxml"}
# pytest options that take a value (the value is not a path to check).
PYTEST_VALUE_OPTIONS = {"-m", "-k", "-p", "-c", "-o", "-W", "-n", "--durations", "--rootdir",
                        "--deselect", "--junitxml", "--maxfail", "--timeout", "--basetemp",
                        "--ignore", "--tb", "-r", "--override-ini", "--confcutdir"}


def doc_files() -> list[pathlib.Path]:
  """The pages whose commands are checked; deploy/README.md only where it exists."""
  files = [README] + sorted((ROOT / "docs").glob("*.md"))
  deploy = ROOT / "deploy" / "README.md"
  if deploy.exists():
    files.append(deploy)
  return files


# -- reading the blocks -------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Block:
  path: pathlib.Path
  line: int                  # the line of the block's first content line (1-based)
  lang: str
  lines: tuple[str, ...]

  @property
  def text(self) -> str:
    return "\n".join(self.lines)


_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([^`\s]*)[^`]*$")


def blocks(path: pathlib.Path, text: str | None = None) -> list[Block]:
  """Every fenced block of a markdown file, with its info string's first word."""
  lines = (path.read_text() if text is None else text).splitlines()
  out, i = [], 0
  while i < len(lines):
    m = _FENCE.match(lines[i])
    if not m:
      i += 1
      continue
    indent, fence, lang = len(m.group(1)), m.group(2), m.group(3).lower()
    body, j = [], i + 1
    while j < len(lines):
      stripped = lines[j].strip()
      if stripped.startswith(fence[0] * len(fence)) and set(stripped) == {fence[0]}:
        break
      line = lines[j]
      body.append(line[indent:] if line[:indent].isspace() else line.lstrip())
      j += 1
    out.append(Block(path, i + 2, lang, tuple(body)))
    i = j + 1
  return out


def is_shell(block: Block) -> bool:
  if block.lang in SHELL_LANGS:
    return True
  if block.lang:
    return False
  for line in block.lines:
    line = line.strip()
    if not line or line.startswith("#"):
      continue
    if line.startswith("$ "):
      return True
    first = line.split()[0]
    return first in SHELL_WORDS or bool(re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", first))
  return False


def logical_lines(block: Block) -> list[tuple[int, str]]:
  """(line number, command line) with `\\` continuations joined; a console block's commands are
  its `$ ` lines (the rest is output)."""
  out, pending, start = [], None, 0
  for k, raw in enumerate(block.lines):
    number = block.line + k
    if pending is None:
      if block.lang == "console":
        if not raw.lstrip().startswith("$ "):
          continue
        raw = raw.lstrip()[2:]
      if not raw.strip() or raw.lstrip().startswith("#"):
        continue
      pending, start = "", number
    if raw.rstrip().endswith("\\"):
      pending += raw.rstrip()[:-1] + " "
      continue
    out.append((start, pending + raw))
    pending = None
  if pending is not None:
    out.append((start, pending))
  return out


def _closing(text: str, i: int) -> int:
  """The index of the `)` closing the `$(` whose `(` is at i (quotes respected)."""
  depth, quote = 0, None
  for j in range(i, len(text)):
    c = text[j]
    if quote:
      if c == quote:
        quote = None
    elif c in "'\"":
      quote = c
    elif c == "(":
      depth += 1
    elif c == ")":
      depth -= 1
      if depth == 0:
        return j
  raise ValueError(f"unclosed $( in {text!r}")


def commands(text: str) -> list[list[str]]:
  """The simple commands of a shell line, as words: quotes removed, `$VAR` and `$(...)` kept as
  written, redirections and comments dropped, split at `;`, `&`, `&&`, `||`, `|`, `(` and `)`."""
  out, words, word, started, drop_next = [], [], [], False, False
  i = 0

  def flush():
    nonlocal word, started, drop_next
    if started:
      if drop_next:
        drop_next = False
      else:
        words.append("".join(word))
    word, started = [], False

  def end_command():
    nonlocal words
    flush()
    if words:
      out.append(words)
    words = []

  while i < len(text):
    c = text[i]
    if c in " \t\n":
      flush()
    elif c == "'":
      j = text.index("'", i + 1)
      word.append(text[i + 1:j])
      started, i = True, j
    elif c == '"':
      j = i + 1
      while text[j] != '"':
        if text[j] == "\\" and text[j + 1] in '"\\$`':
          word.append(text[j + 1])
          j += 2
        elif text.startswith("$(", j):
          k = _closing(text, j + 1)
          word.append(text[j:k + 1])
          j = k + 1
        else:
          word.append(text[j])
          j += 1
      started, i = True, j
    elif c == "\\" and i + 1 < len(text):
      word.append(text[i + 1])
      started, i = True, i + 1
    elif text.startswith("$(", i):
      k = _closing(text, i + 1)
      word.append(text[i:k + 1])
      started, i = True, k
    elif c == "#" and not started:
      break
    elif c in "<>":
      if started and "".join(word).isdigit():
        word, started = [], False     # 2>file: the 2 is the redirection's, not a word
      flush()
      while i + 1 < len(text) and text[i + 1] in "<>&":
        i += 1
      if text[i] == "&" and i + 1 < len(text) and text[i + 1].isdigit():
        i += 1                         # 2>&1: no file word follows
      else:
        drop_next = True
    elif c in ";&|()":
      end_command()
    else:
      word.append(c)
      started = True
    i += 1
  end_command()
  return out


# -- what each command may say ------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Invocation:
  kind: str            # medjax, module, script, file
  target: str          # the module, script or file
  args: tuple[str, ...]


_PYTHON = re.compile(r"(.*/)?python(3(\.\d+)?)?")


def invocations(words: list[str]) -> list[Invocation]:
  """The commands of one simple command that this test checks (wrappers such as `srun ...`,
  `nice -n 10`, `VAR=value` before them are skipped)."""
  n = len(words)
  for i, w in enumerate(words):
    if _PYTHON.fullmatch(w):
      j = i + 1
      while j < n and words[j].startswith("-") and words[j] not in ("-m", "-c"):
        j += 2 if words[j] in ("-W", "-X") else 1
      if j >= n or words[j] == "-c":
        return []
      if words[j] == "-m":
        if j + 1 >= n:
          return []
        module, args = words[j + 1], tuple(words[j + 2:])
        if module == "medjax":
          return [Invocation("medjax", "python -m medjax", args)]
        return [Invocation("module", module, args)]
      if os.path.basename(words[j]) == "launch.py":
        return [Invocation("medjax", words[j], tuple(words[j + 1:])),
                Invocation("file", words[j], ())]
      return [Invocation("script", words[j], tuple(words[j + 1:]))]
    if w == "medjax" and (i + 1 == n or words[i + 1].startswith("-")):
      return [Invocation("medjax", "medjax", tuple(words[i + 1:]))]
    if os.path.basename(w) == "pytest" and i == 0:
      return [Invocation("module", "pytest", tuple(words[i + 1:]))]
    if w in ("bash", "sh") and i + 1 < n:
      if words[i + 1] == "-c" and i + 2 < n:
        return [inv for sub in commands(words[i + 2]) for inv in invocations(sub)]
      if not words[i + 1].startswith("-"):
        return [Invocation("file", words[i + 1], ())]
    if w == "sbatch":  # the script: the first word that is a path (options may take values)
      rest = [x for x in words[i + 1:] if not x.startswith("-") and ("/" in x or "." in x)]
      return [Invocation("file", rest[0], ())] if rest else []
    if w == "kubectl":
      return [Invocation("file", words[k + 1], ()) for k in range(i + 1, n - 1)
              if words[k] in ("-f", "--filename")]
    if w == "jupyter" and i + 2 < n and words[i + 1] in ("execute", "nbconvert", "notebook", "lab"):
      rest = [x for x in words[i + 2:] if not x.startswith("-")]
      return [Invocation("file", rest[0], ())] if rest else []
  return []


@functools.cache
def cli_flags() -> dict[str, flags.Flag]:
  return {f.name: f for f in flags.FLAGS.get_key_flags_for_module(cli)}


@functools.cache
def schema_fields() -> frozenset[str]:
  return frozenset(config_check.field_names())


def _flat(config, prefix="") -> list[str]:
  out = []
  for key, value in config.items():
    name = prefix + key
    out.append(name)
    if isinstance(value, (ml_collections.ConfigDict, dict)):
      out += _flat(value, name + ".")
  return out


@functools.cache
def load_config(spec: str):
  """(the config, its field names) of `--config FILE[:variant]`, as config_flags loads it;
  raises on a missing file or a get_config that fails."""
  path, _, variant = spec.partition(":")
  file = ROOT / path
  if not file.is_file():
    raise FileNotFoundError(f"no such file {path}")
  module_spec = importlib.util.spec_from_file_location(f"_doc_config_{len(spec)}_{abs(hash(spec))}",
                                                       file)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  config = module.get_config(variant) if variant else module.get_config()
  return config, frozenset(_flat(config))


def _is_field(name: str, config) -> tuple[bool, list[str]]:
  """Whether --config.<name> is a field, and the names it was checked against."""
  if config is not None and config[0].get("mode") == "sweep":
    names = sorted(config[1])
  else:
    names = sorted(schema_fields())
    if any(name.startswith(f + ".") for f in config_schema.FREE_FORM):
      return True, names
  return name in names, names


def check_medjax(args: tuple[str, ...]) -> list[str]:
  """Problems with the flags of one medjax invocation."""
  known, problems = cli_flags(), []
  config, overrides, i = None, [], 0
  while i < len(args):
    arg = args[i]
    i += 1
    if not arg.startswith("-") or arg == "-":
      problems.append(f"positional argument {arg!r}: medjax takes flags only")
      continue
    name, eq, value = arg.lstrip("-").partition("=")
    takes_value = not eq and i < len(args) and not args[i].startswith("-")
    if name == "config":
      if not eq:
        if i >= len(args):
          problems.append("--config without a file")
          continue
        value, i = args[i], i + 1
      if "$" in value:
        continue
      try:
        config = load_config(value)
      except Exception as e:  # noqa: BLE001  # pylint: disable=broad-except  (the file's own error)
        problems.append(f"--config {value}: {type(e).__name__}: {e}")
    elif name.startswith("config."):
      overrides.append(name[len("config."):])
      i += takes_value
    elif name in known:
      i += takes_value and not known[name].boolean
    elif name.startswith("no") and name[2:] in known and known[name[2:]].boolean:
      pass
    elif name not in ABSL_HELP:
      i += takes_value  # its value is not a second problem
      hint = config_check.suggest(name, known)
      problems.append(f"flag --{name} is not one of medjax.cli's flags ({', '.join(known)})"
                      + (f"; {hint}" if hint else ""))
  for field in overrides:
    ok, names = _is_field(field, config)
    if not ok:
      hint = config_check.suggest(field, names)
      problems.append(f"--config.{field}: no such config field" + (f"; {hint}" if hint else ""))
  return problems


def _exists(target: str, page: pathlib.Path) -> bool:
  """A path as a command names it: from the repository root, or from the page's folder."""
  return (ROOT / target).exists() or (page.parent / target).exists()


def _skip_path(target: str) -> bool:
  return any(c in target for c in "$<>*{") or target.startswith("/")


def check_module(module: str, args: tuple[str, ...]) -> list[str]:
  if module == "pytest":
    return check_pytest(args)
  if module.split(".")[0] != "experiments":
    return []
  base = ROOT / module.replace(".", "/")
  if base.with_suffix(".py").is_file():
    return check_script_flags(f"python -m {module}", [base.with_suffix(".py")], args)
  if (base / "__main__.py").is_file():
    return check_script_flags(f"python -m {module}", sorted(base.glob("*.py")), args)
  path = module.replace(".", "/")
  return [f"python -m {module}: neither {path}.py nor {path}/__main__.py exists"]


_ARGUMENT = re.compile(r"""add_argument\(\s*["'](--[\w-]+)["']""")


def check_script_flags(name: str, files: list[pathlib.Path], args: tuple[str, ...]) -> list[str]:
  """An experiments script's --flags against the options its argparse parser adds (scripts
  without an argparse parser are not checked)."""
  known = {flag for f in files for flag in _ARGUMENT.findall(f.read_text())}
  if not known:
    return []
  used = [a.split("=")[0] for a in args if a.startswith("--")]
  return [f"{name}: {flag} is not one of its options ({', '.join(sorted(known))})"
          for flag in used if flag not in known and flag != "--help"]


def check_pytest(args: tuple[str, ...]) -> list[str]:
  problems, i = [], 0
  while i < len(args):
    arg = args[i]
    i += 1
    if arg.startswith("-"):
      i += arg in PYTEST_VALUE_OPTIONS
      continue
    path, _, node = arg.partition("::")
    if _skip_path(path):
      continue
    if not (ROOT / path).exists():
      problems.append(f"pytest path {path} does not exist")
    elif node:
      test = node.split("::")[-1].split("[")[0]
      if not re.search(rf"def {re.escape(test)}\b", (ROOT / path).read_text()):
        problems.append(f"pytest: {path} has no test {test}")
  return problems


def check_line(text: str, page: pathlib.Path) -> tuple[list[str], list[Invocation]]:
  """(problems, invocations) of one logical command line."""
  problems, found = [], []
  for words in commands(text):
    for inv in invocations(words):
      found.append(inv)
      if inv.kind == "medjax":
        problems += [f"{inv.target}: {p}" for p in check_medjax(inv.args)]
      elif inv.kind == "module":
        problems += check_module(inv.target, inv.args)
      elif inv.kind in ("script", "file"):
        if _skip_path(inv.target):
          continue
        if not _exists(inv.target, page):
          problems.append(f"{inv.target} does not exist")
        elif inv.kind == "script" and inv.target.startswith("experiments/"):
          problems += check_script_flags(inv.target, [ROOT / inv.target], inv.args)
  return problems, found


def check_page(path: pathlib.Path, text: str | None = None):
  """Every problem of a page's shell blocks as 'file:line: problem', and what it invoked."""
  rel = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
  problems, found = [], []
  for block in blocks(path, text):
    if not is_shell(block):
      continue
    for number, line in logical_lines(block):
      try:
        bad, invs = check_line(line, path)
      except ValueError as e:
        bad, invs = [f"cannot read as shell: {e}"], []
      problems += [f"{rel}:{number}: {p}" for p in bad]
      found += invs
  return problems, found


# -- the tests ----------------------------------------------------------------------------------

@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_is_valid(path):
  problems, _ = check_page(path)
  assert not problems, "invalid commands:\n" + "\n".join(problems)


def test_the_pages_have_commands_to_check():
  """The parser finds the commands it is meant to check (a broken parser would pass silently)."""
  found = [inv for path in doc_files() for inv in check_page(path)[1]]
  kinds = {inv.kind for inv in found}
  assert {"medjax", "module", "file"} <= kinds, kinds   # experiments run as modules, not by path
  assert sum(inv.kind == "medjax" for inv in found) >= 10
  readme = [inv for inv in check_page(README)[1] if inv.kind == "medjax"]
  assert any(("--config", "configs/quickstart.py") == inv.args[:2] for inv in readme)


def test_readme_is_short_and_starts_with_the_two_commands():
  lines = README.read_text().splitlines()
  assert len(lines) <= MAX_README_LINES, (
      f"README.md: {len(lines)} lines, over {MAX_README_LINES}; move detail to docs/")
  first = blocks(README)[:2]
  assert [b.lang for b in first] == ["bash", "bash"], (
      f"README.md: the first two fenced blocks must be ```bash (lines {[b.line for b in first]})")
  for block, want in zip(first, FIRST_COMMANDS):
    assert block.lines == (want,), (
        f"README.md:{block.line}: the block should hold exactly\n  {want}\nnot\n  {block.text}")
  # Before each: only prose (the title first); no heading, no other block.
  prose_before = [lines[1:first[0].line - 2], lines[first[0].line + 1:first[1].line - 2]]
  for k, chunk in enumerate(prose_before):
    text = [x for x in chunk if x.strip()]
    assert text, f"README.md: no sentence before command {k + 1}"
    assert not any(x.startswith("#") for x in text), (
        f"README.md: a heading before command {k + 1}: the two commands come first")
  assert lines[0].startswith("# "), "README.md: line 1 should be the title"


_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path):
  problems = []
  in_block = False
  for number, line in enumerate(path.read_text().splitlines(), 1):
    if _FENCE.match(line):
      in_block = not in_block
    if in_block:
      continue
    for target in _LINK.findall(line):
      if re.match(r"[a-z]+:", target):
        continue
      if target.startswith("#"):
        target = path.name + target
      file, _, anchor = target.partition("#")
      resolved = (path.parent / file).resolve()
      if resolved.is_relative_to(ROOT / "deploy") and not (ROOT / "deploy").exists():
        continue   # deploy/ is being written; its links are checked once it exists
      if not resolved.exists():
        problems.append(f"{path.relative_to(ROOT)}:{number}: link to {target}: no such file")
      elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
        problems.append(f"{path.relative_to(ROOT)}:{number}: link to {target}: "
                        f"{file} has no heading #{anchor}")
  assert not problems, "\n".join(problems)


def _anchors(page: pathlib.Path) -> set[str]:
  """GitHub's anchors for a page's headings: lower case, punctuation dropped, spaces -> '-'."""
  return {re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
          for m in re.finditer(r"^#+\s+(.*)$", page.read_text(), re.MULTILINE)}


# -- the checker itself -------------------------------------------------------------------------

def test_checker_names_the_file_line_and_what_is_wrong(tmp_path):
  page = tmp_path / "page.md"
  text = textwrap.dedent("""\
      # t

      ```bash
      python launch.py --config configs/quickstart.py --config.fault.hang_factr=2 \\
          --workdir $WORK --wrkdir x
      ```

      ```
      medjax --config configs/nope.py
      python -m experiments.bench_nothing && python experiments/nothing.py
      nice -n 10 python experiments/cache_sim.py --hosts 8 --host 9 | tee log
      srun -w "$HEAD" bash -c 'python -m medjax --role=agent --colour=red'
      python -m pytest -q -m 'not slow' tests/test_no_such.py tests/test_docs.py::test_missing
      ```

      ```text
      python launch.py --bogus (not a shell block)
      ```
      """)
  problems, found = check_page(page, text)
  assert any(p.startswith(f"{page}:4: launch.py: --config.fault.hang_factr") for p in problems)
  joined = "\n".join(problems)
  assert "--config.fault.hang_factr: no such config field; did you mean fault.hang_factor?" in (
      joined)
  assert ":4: launch.py: flag --wrkdir is not one of medjax.cli's flags" in joined
  assert ":9: medjax: --config configs/nope.py: FileNotFoundError" in joined
  assert ":10: python -m experiments.bench_nothing: neither" in joined
  assert ":10: experiments/nothing.py does not exist" in joined
  assert ":11: experiments/cache_sim.py: --host is not one of its options" in joined
  assert ":12: python -m medjax: flag --colour" in joined
  assert ":13: pytest path tests/test_no_such.py does not exist" in joined
  assert ":13: pytest: tests/test_docs.py has no test test_missing" in joined
  assert "--bogus" not in joined
  assert "--workdir" not in joined
  assert len(problems) == 9, joined
  assert sum(inv.kind == "medjax" for inv in found) == 3


def test_checker_accepts_valid_commands(tmp_path):
  text = textwrap.dedent("""\
      ```console
      $ medjax --config=configs/quickstart.py:tiny --config.optim.epochs=3 --nodebug --debug \\
          --config.data.rename.K=potassium \\
          --workdir "$(mktemp -d)"  # a comment --bogus
      workdir: /tmp/x --not-a-command
      $ python -m medjax --config configs/sweep.py --config.study.storage=sqlite:///x.db \\
          --config.space.model.fusion="()" > log 2>&1
      $ python -m experiments.report --scale tiny; python experiments/bench_data.py --patients 30
      ```
      """)
  problems, found = check_page(tmp_path / "page.md", text)
  assert problems == []
  assert [inv.kind for inv in found] == ["medjax", "medjax", "module", "script"]
