"""The bad-input battery (tests/acceptance/bad_inputs.py) stays runnable: its --quick subset, a few
cases of each class run through the real command line, every one with its expected outcome."""

import dataclasses
import json
import os
import subprocess
import sys

from tests import runs
from tests.acceptance import judge
from tests.acceptance import lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_quick_battery_passes(tmp_path):
  env = runs.env()   # the runs are a user's, not this process's fake devices
  done = subprocess.run([sys.executable, "-m", "tests.acceptance.bad_inputs", "--quick",
                         f"--results={tmp_path}", f"--scratch={tmp_path / 'scratch'}"],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
                        check=False)
  with open(tmp_path / "bad_inputs_quick.json") as f:
    results = json.load(f)
  failed = [f"{r['class']}/{r['name']}: {r['outcome']} (expected {r['expect']}); "
            + "; ".join(c["name"] for c in r["checks"] if not c["ok"])
            for r in results["cases"] if not r["ok"]]
  assert done.returncode == 0 and not failed, "\n".join(failed) + done.stdout[-3000:]
  classes = {r["class"] for r in results["cases"]}
  assert classes == {"config", "tables", "dicom", "state", "phi"}
  outcomes = {r["outcome"] for r in results["cases"]}
  assert {"clear error", "quarantined", "recovered", "debug traceback"} <= outcomes
  # The rules ran, not just the processes: each case checked for tracebacks and raw ids.
  for r in results["cases"]:
    names = {c["name"] for c in r["checks"]}
    assert "no raw id in outputs" in names and "no process outlives the run" in names
  assert (tmp_path / "bad_inputs_quick.md").read_text().count("| config |") == 1


# -- the judge itself: it finds what it claims to find (no jax, no subprocess) -----------------

def _plan(tmp_path) -> lib.Plan:
  return lib.Plan(argv=[], workdir=str(tmp_path / "work"), raw_ids=["PTX7001K", "DOE^JOHN"],
                  cohort=str(tmp_path / "cohort"))


def test_raw_id_scan_finds_ids_in_any_case_and_skips_cohort_and_secrets(tmp_path):
  plan = _plan(tmp_path)
  work = tmp_path / "work"
  for rel in ("cohort/labels.csv", "secrets/id_salt"):
    (work / rel).parent.mkdir(parents=True, exist_ok=True)
    (work / rel).write_bytes(b"PTX7001K,flu\n")
  assert judge.raw_id_leaks(lib.Run(plan, 0, 1.0, b"all fine\n", b"")) == []
  (work / "cache").mkdir()
  (work / "cache" / "chunk").write_bytes(b"\x00\x01doe^john\x00")
  run = lib.Run(plan, 0, 1.0, b"patient ptx7001k done\n", b"")
  assert judge.raw_id_leaks(run) == ["stdout: 'ptx7001k'", "cache/chunk: 'doe^john'"]


def test_raw_id_scan_does_not_take_a_hash_holding_a_short_id_for_it(tmp_path):
  """A 4-digit id ('7001', a spreadsheet's without its leading zeros) turned up by chance in a
  pseudonym's hex in the cache index, failing a case now and then; as a cell it is found."""
  plan = dataclasses.replace(_plan(tmp_path), raw_ids=["0007001", "7001"])
  (tmp_path / "work" / "cache").mkdir(parents=True)
  index = tmp_path / "work" / "cache" / "index.json"
  index.write_bytes(b'{"r-de33e7001c7c": [-1, "2495a7001e", 170019]}')
  assert judge.raw_id_leaks(lib.Run(plan, 0, 1.0, b"", b"")) == []
  index.write_bytes(b'{"r-de33e74c": "7001"}\n')
  assert judge.raw_id_leaks(lib.Run(plan, 0, 1.0, b"", b"")) == ["cache/index.json: '7001'"]


def test_judge_calls_a_dropped_row_a_silent_loss_and_a_traceback_a_failure(tmp_path):
  plan = _plan(tmp_path)
  cohort = tmp_path / "cohort"
  cohort.mkdir()
  (cohort / "labels.csv").write_bytes(
      b"patient_id,diagnosis\r\nA,flu\r\n , \r\nB,copd\r\nC,flu\r\n")
  assert judge.labels_data_lines(str(cohort / "labels.csv")) == 3
  ingest = tmp_path / "work" / "ingest"
  ingest.mkdir(parents=True)
  (ingest / "manifest.jsonl").write_text('{"class_names": ["copd", "flu"]}\n'
                                         '{"id": "r-1", "image_files": []}\n'
                                         '{"id": "r-2", "image_files": []}\n')
  (ingest / "quarantine.jsonl").write_text("")
  case = lib.Case("tables", "fake", lib.ACCEPTED, lambda ctx: plan)
  [record] = judge.judge(case, lib.Run(plan, 0, 1.0, b"", b"done\n"))
  assert record["outcome"] == lib.ACCEPTED and not record["ok"]
  assert record["flags"] == ["silent loss"]
  (ingest / "quarantine.jsonl").write_text(
      '{"path": "labels.csv", "line": 5, "stage": "tables", "reason": "duplicate"}\n')
  [record] = judge.judge(case, lib.Run(plan, 0, 1.0, b"", b"done\n"))
  assert record["ok"] and record["flags"] == []
  stderr = b"Traceback (most recent call last):\n  ...\nerror: labels.csv: bad\n"
  [record] = judge.judge(case, lib.Run(plan, 2, 1.0, b"", stderr))
  assert record["outcome"] == lib.TRACEBACK and record["flags"] == [lib.TRACEBACK]
  [record] = judge.judge(case, lib.Run(plan, -6, 1.0, b"", b""))
  assert record["outcome"] == lib.ABORT


def _ingested(tmp_path, rows: list[str], quarantine: list[str], ids=("PTX7001K", "PTX7002K")):
  """A fake finished ingest of a cohort naming `ids` (labels.csv, one image of the first): its
  salt, manifest rows and quarantine lines as given."""
  from medjax.data import ingest  # pylint: disable=import-outside-toplevel
  plan = lib.Plan(argv=[], workdir=str(tmp_path / "work"), raw_ids=list(ids),
                  cohort=str(tmp_path / "cohort"), patient_ids=list(ids))
  cohort = tmp_path / "cohort"
  (cohort / "dicom" / "p0").mkdir(parents=True)
  (cohort / "dicom" / "p0" / "img.dcm").write_bytes(b"\0" * 8)
  (cohort / "labels.csv").write_text("patient_id,diagnosis\n" + "".join(
      f"{p},flu\n" for p in ids))
  salt = bytes(32)
  (tmp_path / "work" / "secrets").mkdir(parents=True)
  (tmp_path / "work" / "secrets" / "id_salt").write_bytes(salt)
  ingest_dir = tmp_path / "work" / "ingest"
  ingest_dir.mkdir()
  r = {p: ingest.pseudonym(p, salt) for p in ids}
  (ingest_dir / "manifest.jsonl").write_text(
      '{"class_names": ["flu"]}\n' + "".join(row.format(**r) + "\n" for row in rows))
  (ingest_dir / "quarantine.jsonl").write_text("".join(q.format(**r) + "\n" for q in quarantine))
  return plan, r


def test_judge_finds_a_patient_or_a_file_that_ingest_lost(tmp_path):
  row = '{{"id": "{PTX7001K}", "image_files": ["dicom/p0/img.dcm"]}}'
  left_out = ('{{"path": "", "patient": "{PTX7002K}", "stage": "link", '
              '"reason": "label row rejected: labels.csv line 3 (empty)"}}')
  line = '{{"path": "labels.csv", "line": 3, "stage": "tables", "reason": "empty"}}'
  case = lambda plan, expect=lib.ACCEPTED: lib.Case("tables", "fake", expect, lambda ctx: plan)
  # Everything accounted for: the second patient by its pseudonym in a patient entry.
  plan, r = _ingested(tmp_path / "a", [row], [left_out, line])
  plan.quarantined = [lib.left_out("PTX7002K", "label row rejected")]
  [record] = judge.judge(case(plan, lib.QUARANTINED), lib.Run(plan, 0, 1.0, b"", b""))
  assert record["ok"] and record["outcome"] == lib.QUARANTINED, record["checks"]
  assert r["PTX7002K"] in json.dumps(record) and "PTX7002K" not in json.dumps(record)
  # The patient entry missing: a silent loss (the labels line alone does not account for it).
  plan, _ = _ingested(tmp_path / "b", [row], [line])
  [record] = judge.judge(case(plan), lib.Run(plan, 0, 1.0, b"", b""))
  assert not record["ok"] and record["flags"] == ["silent loss"]
  failed = [c["name"] for c in record["checks"] if not c["ok"]]
  assert failed == ["every patient in the manifest or quarantined"]
  # A file under the cohort root nobody mentions: a silent loss too.
  plan, _ = _ingested(tmp_path / "c", [row], [left_out, line])
  (tmp_path / "c" / "cohort" / "notes.txt").write_text("x\n")
  [record] = judge.judge(case(plan), lib.Run(plan, 0, 1.0, b"", b""))
  failed = [c for c in record["checks"] if not c["ok"]]
  assert record["flags"] == ["silent loss"] and "notes.txt" in failed[0]["detail"]


def test_raw_id_scan_finds_ids_stored_as_numpy_strings(tmp_path):
  import numpy as np  # pylint: disable=import-outside-toplevel
  plan = _plan(tmp_path)
  (tmp_path / "work").mkdir()
  np.savez(tmp_path / "work" / "tables.npz", analytes=np.array(["Na", "PTX7001K"]))
  assert judge.raw_id_leaks(lib.Run(plan, 0, 1.0, b"", b"")) == ["tables.npz: 'ptx7001k'"]
