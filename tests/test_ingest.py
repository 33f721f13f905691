"""Ingest of a hand-made cohort built from real DICOM test files shipped with pydicom."""

import json
import os
import re

import numpy as np
import pytest

from configs import default as default_config
from medjax.data import ingest
from medjax.data import ingest_summary
from tests import cohorts


@pytest.fixture
def cohort(tmp_path):
  return cohorts.tiny_cohort(str(tmp_path / "cohort"))


def _config(**data):
  config = default_config.get_config()
  config.data.vitals_steps = 6
  config.data.image_size = 16
  config.data.split = (0.5, 0.0, 0.5)
  config.data.update(data)
  return config


def test_ingest_links_by_patient_id_and_accounts_for_every_file(cohort, tmp_path):
  workdir = str(tmp_path / "work")
  result = ingest.run(_config(), workdir, cohort)
  m = result.manifest
  assert len(m) == 6  # MRN001..MRN006; MRN007 has only a label, MRN999 only images, no label
  by_group = {ingest.manifest_lib.group_name(mask): i for i, mask in enumerate(m.modality_mask)}
  assert set(by_group) == {"ILV", "L", "IV", "V"}
  row = by_group["ILV"]
  assert sorted(m.image_files[row]) == ["dicom/s1/a.dcm", "dicom/s1/b.dcm"]
  assert m.num_images[by_group["IV"]] == 10  # emri_small has 10 frames
  # Every input file is either in the manifest or in the quarantine report.
  all_files = {os.path.relpath(os.path.join(dp, f), cohort)
               for dp, _, fs in os.walk(os.path.join(cohort, "dicom")) for f in fs}
  referenced = {f for files in m.image_files for f in files}
  quarantined = {q["path"] for q in result.quarantine if q.get("path", "").startswith("dicom")}
  assert referenced | quarantined == all_files and not referenced & quarantined
  reasons = {q["path"]: q["reason"] for q in result.quarantine if "path" in q}
  assert "PatientID" in reasons["dicom/s3/c.dcm"]
  assert "labels.csv" in reasons["dicom/s4/d.dcm"]
  assert "pixel" in reasons["dicom/s5.dcm"].lower()
  # Table problems: duplicate row, non-numeric value, out-of-order vitals, label without data.
  table_lines = {(q["path"], q["line"]) for q in result.quarantine if q["stage"] == "tables"}
  # Every patient named anywhere: 6 in the manifest; left out, each once, by pseudonym only:
  # MRN007 (a label, no data), MRN999 (images, no label), and the patients of the RT plan and
  # of the truncated file (their headers name them; no label either).
  left_out = {q["patient"]: q["reason"] for q in result.quarantine if "patient" in q}
  assert sorted(left_out.values()) == [
      "a label but no data (no image, lab or vitals row): labels.csv line 8"] + [
          "no row in labels.csv; their images and table rows are left out"] * 3
  assert all(p.startswith("r-") for p in left_out) and not set(left_out) & set(m.record_ids)
  counts = result.summary["accounting"]
  assert counts["patients"] == {"named": 10, "in_manifest": 6, "quarantined": 4}
  assert counts["files"]["tables_read"] == 3 and counts["files"]["in_manifest"] == len(
      referenced)
  assert {("labs.csv", 5), ("labs.csv", 6), ("vitals.csv", 6), ("labels.csv", 8)} <= table_lines
  tables = result.summary["tables"]
  assert [tables[f]["rows_quarantined"] for f in ("labels.csv", "labs.csv", "vitals.csv")] == [
      1, 1, 1]
  assert tables["values_not_a_number"] == {"Na": 1} and tables["ids"]["labels_without_data"] == 1
  text = ingest_summary.format_summary(result.summary)
  assert "values set to missing: not a number Na 1" in text
  assert "labs.csv: 1 of 5 rows set aside" in text


def test_no_raw_identifiers_leave_ingest(cohort, tmp_path):
  workdir = str(tmp_path / "work")
  ingest.run(_config(), workdir, cohort)
  for dirpath, _, files in os.walk(os.path.join(workdir, "ingest")):
    for name in files:
      blob = open(os.path.join(dirpath, name), "rb").read()
      for secret in (b"MRN00", b"DOE^JOHN", b"MRN999"):
        assert secret not in blob, f"{name} contains {secret!r}"
  salt = os.path.join(workdir, "secrets", "id_salt")
  assert os.stat(salt).st_mode & 0o077 == 0


def test_pseudonyms_stable_with_salt_and_split_is_stratified(cohort, tmp_path):
  workdir = str(tmp_path / "work")
  a = ingest.run(_config(), workdir, cohort).manifest
  b = ingest.run(_config(), workdir, cohort).manifest
  np.testing.assert_array_equal(a.record_ids, b.record_ids)
  np.testing.assert_array_equal(a.split, b.split)
  other = ingest.run(_config(), str(tmp_path / "other"), cohort).manifest
  assert not set(other.record_ids) & set(a.record_ids)  # another salt, other ids
  for label in np.unique(a.labels):
    splits = a.split[a.labels == label]
    assert abs(np.sum(splits == "train") - np.sum(splits == "test")) <= 1


def test_raise_policy_names_file_and_line(cohort, tmp_path):
  with pytest.raises(ingest.tables.TableError, match=r"labs.csv:5: duplicate patient row"):
    ingest.run(_config(on_error="raise"), str(tmp_path / "w"), cohort)


def test_tables_are_optional(cohort, tmp_path):
  for name in ("labs.csv", "vitals.csv"):
    os.remove(os.path.join(cohort, name))
  result = ingest.run(_config(), str(tmp_path / "w"), cohort)
  assert result.manifest.modality_mask[:, 0].all() and not result.manifest.modality_mask[:, 1:].any()


def test_manifest_round_trip(cohort, tmp_path):
  workdir = str(tmp_path / "work")
  result = ingest.run(_config(), workdir, cohort)
  loaded = ingest.load(workdir)
  for field in ("record_ids", "labels", "modality_mask", "num_images", "split"):
    np.testing.assert_array_equal(getattr(loaded.manifest, field), getattr(result.manifest, field))
  assert loaded.manifest.image_files == result.manifest.image_files
  first = json.loads(open(os.path.join(workdir, "ingest", "manifest.jsonl")).readlines()[1])
  assert set(first) >= {"id", "label", "modalities", "image_files", "cost_ms", "split"}


def _summary(classes):
  return {"patients": sum(classes.values()), "splits": {"train": 1, "val": 0, "test": 1},
          "dicom_files": 0, "images": 0, "quarantined": 0, "groups": {}, "missing": {},
          "classes": classes, "quarantine_reasons": {}}


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 37, 100])
def test_class_line_reads_correctly_for_any_class_count(k):
  classes = {f"c{i:03d}": 3 * (k - i) for i in range(k)}
  line = next(x for x in ingest_summary.format_summary(_summary(classes)).splitlines()
              if x.startswith("classes"))
  named = re.findall(r"c\d{3}", line)
  assert len(named) == len(set(named)), line   # no class listed twice
  assert line.startswith(f"classes {k}: ")
  if k <= 8:
    assert named == list(classes) and "largest" not in line
    total = sum(classes.values())
    assert f"c000 {3 * k} ({100 * 3 * k / total:.1f}%)" in line
  else:
    assert named == ["c000", "c001", "c002", f"c{k - 1:03d}", f"c{k - 2:03d}", f"c{k - 3:03d}"]
    assert "; smallest " in line and line.index("largest") < line.index("smallest")


@pytest.mark.parametrize("make", ["fifo", "dev_zero", "directory"])
def test_a_table_that_is_not_a_regular_file_is_refused_without_reading_it(cohort, tmp_path, make):
  from medjax import errors  # pylint: disable=import-outside-toplevel
  path = os.path.join(cohort, "labels.csv")
  os.remove(path)
  if make == "fifo":
    os.mkfifo(path)
  elif make == "dev_zero":
    os.symlink("/dev/zero", path)
  else:
    os.mkdir(path)
  with pytest.raises(errors.InputError, match=r"labels\.csv: .*; give a regular CSV file$"):
    ingest.run(_config(), str(tmp_path / "work"), cohort)


def test_dicom_that_is_a_file_and_a_garbled_oracle_are_refused(cohort, tmp_path):
  from medjax import errors  # pylint: disable=import-outside-toplevel
  with open(os.path.join(cohort, "oracle.npz"), "wb") as f:
    f.write(b"PK\x03\x04 not a zip")
  with pytest.raises(errors.InputError, match=r"oracle\.npz: not the synthetic generator's "):
    ingest.run(_config(), str(tmp_path / "work"), cohort)
  os.remove(os.path.join(cohort, "oracle.npz"))
  import shutil  # pylint: disable=import-outside-toplevel
  shutil.rmtree(os.path.join(cohort, "dicom"))
  open(os.path.join(cohort, "dicom"), "w").close()
  with pytest.raises(errors.InputError, match=r"dicom is not a directory"):
    ingest.run(_config(), str(tmp_path / "work2"), cohort)


def test_a_damaged_ingest_is_named_with_how_to_redo_it(cohort, tmp_path):
  from medjax import errors  # pylint: disable=import-outside-toplevel
  workdir = str(tmp_path / "work")
  ingest.run(_config(), workdir, cohort)
  manifest = os.path.join(workdir, "ingest", "manifest.jsonl")
  with open(manifest, "r+b") as f:
    f.truncate(os.path.getsize(manifest) // 2)
  with pytest.raises(errors.InputError, match=r"ingest is damaged or incomplete \(.*\); run the "
                     r"ingest again: --config.data.reingest=True"):
    ingest.load(workdir)
