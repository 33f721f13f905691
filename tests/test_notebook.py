"""experiments/notebooks/evaluate.ipynb, executed for real against a freshly trained tiny run."""

import base64
import json
import os
import re
import subprocess
import sys

import nbformat
import pytest
from jupyter_client import kernelspec
from nbclient import NotebookClient

from tests import runs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, "experiments", "notebooks", "evaluate.ipynb")


def _train_tiny(workdir: str) -> dict:
  """A single-process quickstart:tiny run (about a minute on CPU); returns its summary.json."""
  env = runs.env()  # one device, like a laptop run; this process has 8 fake ones
  proc = subprocess.run(
      [sys.executable, "launch.py", "--config=configs/quickstart.py:tiny", f"--workdir={workdir}",
       "--config.fault.supervised=False"],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
  assert proc.returncode == 0, f"launch.py exited {proc.returncode}:\n{proc.stderr[-3000:]}"
  with open(os.path.join(workdir, "summary.json")) as f:
    return json.load(f)


def _python3_kernel(monkeypatch, directory) -> None:
  """Makes "python3" this interpreter's kernel, whatever other kernelspecs are installed."""
  spec_dir = directory / "kernels" / "python3"
  spec_dir.mkdir(parents=True)
  (spec_dir / "kernel.json").write_text(json.dumps({
      "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
      "display_name": "Python 3 (medjax tests)", "language": "python"}))
  # JUPYTER_PATH comes before the user, venv and system kernel folders.
  monkeypatch.setenv("JUPYTER_PATH", str(directory))
  assert kernelspec.KernelSpecManager().get_kernel_spec("python3").argv[0] == sys.executable


def _texts(cell) -> list[str]:
  texts = []
  for out in cell.get("outputs", []):
    if out["output_type"] == "stream":
      texts.append(out["text"])
    elif "data" in out:
      texts.extend(v for k, v in out["data"].items() if k.startswith("text/"))
  return texts


def _tagged(nb, tag: str):
  (cell,) = [c for c in nb.cells if tag in c.metadata.get("tags", [])]
  return cell


def _row(cell, name: str) -> list[str]:
  """The cells of the row starting with `name` in a cell's plain-text table output."""
  for text in _texts(cell):
    match = re.search(rf"^{re.escape(name)}  +(.*)$", text, re.MULTILINE)
    if match:
      return match.group(1).split()
  raise AssertionError(f"no row {name!r} in the outputs of the {cell.metadata['tags']} cell: "
                       f"{_texts(cell)}")


def test_notebook_is_stored_without_outputs():
  nb = nbformat.read(NOTEBOOK, as_version=4)
  nbformat.validate(nb)
  assert nb.metadata.kernelspec.name == "python3"
  code = [c for c in nb.cells if c.cell_type == "code"]
  assert "parameters" in code[0].metadata.get("tags", [])
  assert all(c.outputs == [] and c.execution_count is None for c in code), (
      "clear the notebook's outputs before committing it")


@pytest.mark.slow
def test_notebook_evaluates_a_trained_run(tmp_path, monkeypatch):
  workdir = str(tmp_path / "run")
  summary = _train_tiny(workdir)
  _python3_kernel(monkeypatch, tmp_path / "jupyter")

  nb = nbformat.read(NOTEBOOK, as_version=4)
  # The kernel keeps this process's 8 fake CPU devices: the 1-device checkpoint is restored
  # onto 8, as on any machine other than the one that trained.
  env = dict(os.environ, MEDJAX_WORKDIR=workdir)
  client = NotebookClient(nb, kernel_name="python3", timeout=600,
                          resources={"metadata": {"path": os.path.dirname(NOTEBOOK)}})
  client.execute(env=env)  # raises CellExecutionError, with the traceback, if a cell fails

  assert not [o for c in nb.cells for o in c.get("outputs", []) if o["output_type"] == "error"]
  test, ceiling = summary["test"], summary["ceiling"]
  assert (f"{test['count']} test records on 8 cpu device(s); ceiling: yes"
          in "".join(_texts(_tagged(nb, "load"))))
  # The newest committed checkpoint is the state training evaluated, so the numbers agree.
  metrics = _tagged(nb, "metrics")
  assert _row(metrics, "accuracy")[:2] == [f"{test['accuracy']:.4f}", f"{ceiling['accuracy']:.4f}"]
  assert _row(metrics, "macro_f1")[:2] == [f"{test['macro_f1']:.4f}",
                                           f"{ceiling['macro_f1']:.4f}"]
  assert any(f"<td>{test['accuracy']:.4f}</td>" in t for t in _texts(metrics))
  table_iv = _tagged(nb, "table_iv")
  for key, name in (("all3", "All 3"), ("any2", "Any 2"), ("single", "Single")):
    row = test["table_iv"][key]
    assert _row(table_iv, name)[:2] == [str(row["count"]), f"{row['accuracy']:.4f}"]
  # Every figure was displayed as a real PNG.
  pngs = [base64.b64decode(o["data"]["image/png"]) for c in nb.cells for o in c.get("outputs", [])
          if "image/png" in o.get("data", {})]
  assert len(pngs) == 4  # loss curve, per-class F1, confusion matrix, accuracy by subset
  assert all(p.startswith(b"\x89PNG\r\n\x1a\n") for p in pngs)
