"""Every input-side failure is one line and exit code 2 (issue 32, item 4): a table with a header
and no rows, files and folders the process may not read, and anything a reader raises on a
user's file, classified where the file is read, never "internal error"."""

import os
import shutil
import subprocess
import sys

import pytest

from configs import default as default_config
from medjax import errors
from medjax.data import ingest
from medjax.data import tables

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Root reads any file; without these capabilities it obeys the permission bits like anyone.
NO_OVERRIDE = ["setpriv", "--inh-caps=-dac_override,-dac_read_search",
               "--bounding-set=-dac_override,-dac_read_search"]
can_drop = os.geteuid() == 0 and shutil.which("setpriv") is not None
needs_setpriv = pytest.mark.skipif(
    not can_drop and os.geteuid() == 0, reason="root without setpriv reads every file")


def _cohort(root, labels="patient_id,diagnosis\nP1,flu\nP2,copd\nP3,flu\nP4,copd\n"):
  os.makedirs(root, exist_ok=True)
  with open(os.path.join(root, "labels.csv"), "w") as f:
    f.write(labels)
  with open(os.path.join(root, "labs.csv"), "w") as f:
    f.write("patient_id,Na\nP1,140\nP2,141\nP3,139\nP4,142\n")
  with open(os.path.join(root, "vitals.csv"), "w") as f:
    f.write("patient_id,hour,hr,sbp,dbp,rr,spo2,temp\nP1,0,80,120,80,16,98,37\n")
  return root


def _ingest_cli(root, workdir):
  """An ingest as a user starts it, without root's override of permission bits."""
  argv = [sys.executable, "-m", "medjax", "--config=configs/quickstart.py:tiny",
          f"--config.data.root={root}", f"--workdir={workdir}", "--config.mode=ingest",
          "--config.data.num_partitions=2", "--config.data.batch_size=4"]
  if can_drop:
    argv = NO_OVERRIDE + argv
  return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)


def _one_line(out) -> str:
  errors_seen = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
  assert out.returncode == errors.EXIT_INPUT, out.stderr[-2000:]
  assert len(errors_seen) == 1 and "internal error" not in out.stderr
  assert "Traceback" not in out.stderr
  return errors_seen[0]


@pytest.mark.slow
@pytest.mark.parametrize("labels", ["patient_id,diagnosis\n", "patient_id,diagnosis\n\n\n",
                                   "patient_id,diagnosis\nP1,\n,flu\n"])
def test_a_labels_file_without_a_usable_row_is_one_line(tmp_path, labels):
  root = _cohort(str(tmp_path / "cohort"), labels)
  line = _one_line(_ingest_cli(root, str(tmp_path / "work")))
  assert line.startswith(f"error: {root}: ingest kept no patient (labels.csv has no usable row")
  assert os.path.exists(tmp_path / "work" / "ingest" / "quarantine.jsonl")


@pytest.mark.slow
@needs_setpriv
@pytest.mark.parametrize("name", ["labels.csv", "labs.csv", "vitals.csv"])
def test_a_table_the_process_may_not_read_is_one_line(tmp_path, name):
  root = _cohort(str(tmp_path / "cohort"))
  os.chmod(os.path.join(root, name), 0)
  line = _one_line(_ingest_cli(root, str(tmp_path / "work")))
  assert line == (f"error: {os.path.join(root, name)}: cannot be read (Permission denied); give "
                  "the process read permission on it (or remove it: every table is optional)")


@pytest.mark.slow
@needs_setpriv
def test_a_cohort_folder_the_process_may_not_read_is_one_line(tmp_path):
  root = _cohort(str(tmp_path / "cohort"))
  os.chmod(root, 0)
  try:
    line = _one_line(_ingest_cli(root, str(tmp_path / "work")))
  finally:
    os.chmod(root, 0o755)
  assert "cannot be read (permission denied)" in line and root in line


@pytest.mark.slow
@needs_setpriv
def test_a_dicom_folder_the_process_may_not_read_is_quarantined_and_the_rest_ingested(tmp_path):
  root = _cohort(str(tmp_path / "cohort"))
  locked = os.path.join(root, "dicom", "locked")
  os.makedirs(locked)
  with open(os.path.join(locked, "a.dcm"), "wb") as f:
    f.write(b"\0" * 256)
  os.chmod(locked, 0)
  try:
    out = _ingest_cli(root, str(tmp_path / "work"))
  finally:
    os.chmod(locked, 0o755)
  assert out.returncode == 0, out.stderr[-2000:]
  with open(tmp_path / "work" / "ingest" / "quarantine.jsonl") as f:
    assert '"path": "dicom/locked", "stage": "scan", "reason": "directory not readable' in f.read()


@pytest.mark.parametrize("name,reader", [("labels.csv", "read_labels"), ("labs.csv", "read_labs"),
                                         ("vitals.csv", "read_vitals")])
@pytest.mark.parametrize("exception", [KeyError("MRN0042"), ValueError("cell 'MRN0042'"),
                                       UnicodeDecodeError("utf-8", b"\xff", 0, 1, "MRN0042"),
                                       IndexError("MRN0042")])
def test_anything_a_reader_raises_on_a_users_file_is_about_that_file(
    tmp_path, monkeypatch, name, reader, exception):
  root = _cohort(str(tmp_path / "cohort"))

  def fail(*args, **kwargs):
    raise exception

  monkeypatch.setattr(tables, reader, fail)
  monkeypatch.delenv("MEDJAX_DEBUG", raising=False)
  config = default_config.get_config()
  config.data.vitals_steps = 4
  with pytest.raises(errors.InputError) as e:
    ingest.run(config, str(tmp_path / "work"), root)
  message = str(e.value)
  assert message.startswith(f"{os.path.join(root, name)}: could not be read as {name} "
                            f"({type(exception).__name__}); export it again")
  assert "MRN0042" not in message and "\n" not in message
