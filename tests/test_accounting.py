"""Every patient and every file of a cohort accounted for (issue 32, item 1): in the manifest, or
in the quarantine report with why, as a chain when one rejection causes another; generated
cohorts with random rejections keep the count; ingest fails loudly if it loses track."""

import dataclasses
import gzip
import json
import os
import zipfile

import numpy as np
import pydicom
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from configs import default as default_config
from medjax import errors
from medjax.data import accounting
from medjax.data import ingest
from tests import testdata

CLASSES = ("flu", "copd", "gout")


def _config(**data):
  config = default_config.get_config()
  config.data.vitals_steps = 4
  config.data.split = (0.5, 0.0, 0.5)
  config.data.scan_workers = 1
  config.data.classes = CLASSES
  config.data.update(data)
  return config


def _dicom(path, patient_id, *, uid=None):
  ds = pydicom.dcmread(testdata.dicom_test_file("CT_small.dcm"))
  if patient_id is None:
    del ds.PatientID
  else:
    ds.PatientID = patient_id
  uid = uid or pydicom.uid.generate_uid()
  ds.SOPInstanceUID = uid
  ds.file_meta.MediaStorageSOPInstanceUID = uid
  os.makedirs(os.path.dirname(path), exist_ok=True)
  ds.save_as(path)


def _ingest(tmp_path, root, **data):
  return ingest.run(_config(**data), str(tmp_path / "work"), str(root))


def _patients(result) -> dict[str, str]:
  """pseudonym -> reason of the patients left out."""
  return {q["patient"]: q["reason"] for q in result.quarantine if q.get("patient")}


def _files(result) -> dict[str, str]:
  return {q["path"]: q["reason"] for q in result.quarantine if q["path"] and "line" not in q}


def test_a_rejected_label_row_takes_its_patient_out_with_the_reason_on_their_files(tmp_path):
  root = tmp_path / "cohort"
  root.mkdir()
  (root / "labels.csv").write_bytes(
      b"patient_id,diagnosis\nP1,flu\nP2,measles\nP3,co\x01pd\nP4,\"copd\nP5,gout\n")
  (root / "labs.csv").write_text("patient_id,Na\nP1,140\nP2,141\nP3,139\nP4,138\nP5,137\n")
  for pid in ("P1", "P2", "P3", "P4"):
    _dicom(str(root / "dicom" / f"{pid}.dcm"), pid)
  result = _ingest(tmp_path, root)
  salt = ingest.load_or_create_salt(str(tmp_path / "work" / "secrets" / "id_salt"))
  assert sorted(result.manifest.record_ids) == sorted(
      ingest.pseudonym(p, salt) for p in ("P1", "P5"))
  left = _patients(result)
  assert set(left) == {ingest.pseudonym(p, salt) for p in ("P2", "P3", "P4")}
  want = {"P2": "labels.csv line 3 (class 'measles' not in config.data.classes",
          "P3": "labels.csv line 4 (control character (byte 0x01) in the line)",
          "P4": "labels.csv line 5 (unbalanced quote"}
  files = _files(result)
  for pid, text in want.items():
    assert left[ingest.pseudonym(pid, salt)].startswith("label row rejected: " + text), pid
    assert files[f"dicom/{pid}.dcm"] == left[ingest.pseudonym(pid, salt)]
  assert result.summary["accounting"]["patients"] == {"named": 5, "in_manifest": 2,
                                                      "quarantined": 3}
  text = json.dumps(result.quarantine)
  assert not any(f'"{p}"' in text for p in ("P1", "P2", "P3", "P4", "P5"))   # pseudonyms only


def test_patients_named_only_by_tables_or_images_each_end_somewhere(tmp_path):
  root = tmp_path / "cohort"
  root.mkdir()
  (root / "labels.csv").write_text("patient_id,diagnosis\nP1,flu\nP2,copd\nP9,gout\n")
  # P2's only lab value is garbage, P3 has labs and no label, P4 only a vitals row, P5 only an
  # image, P9 a label and nothing else.
  (root / "labs.csv").write_text("patient_id,Na\nP1,140\nP2,abc\nP3,139\n")
  (root / "vitals.csv").write_text("patient_id,hour,hr,sbp,dbp,rr,spo2,temp\n"
                                   "P4,0,80,120,80,16,98,37\n")
  _dicom(str(root / "dicom" / "a" / "p5.dcm"), "P5")
  (root / "notes.txt").write_text("a note\n")
  (root / "Vitals.xlsx").write_text("")   # vitals.csv is there: the spreadsheet is a copy
  (root / "extra").mkdir()
  (root / "extra" / "old_labels.csv").write_text("x\n")
  result = _ingest(tmp_path, root)
  salt = ingest.load_or_create_salt(str(tmp_path / "work" / "secrets" / "id_salt"))
  left = {p: r for p, r in _patients(result).items()}
  reason = lambda pid: left[ingest.pseudonym(pid, salt)]
  assert len(result.manifest) == 1 and len(left) == 5
  assert reason("P2").startswith("a label but no data") or reason("P2").startswith(
      "no usable data")
  assert reason("P3").startswith("no row in labels.csv")
  assert reason("P4").startswith("no row in labels.csv")
  assert reason("P5").startswith("no row in labels.csv")
  assert reason("P9") == "a label but no data (no image, lab or vitals row): labels.csv line 4"
  files = _files(result)
  assert files["dicom/a/p5.dcm"] == accounting.NO_LABEL
  assert files["notes.txt"].startswith("not part of a cohort's layout")
  assert files[os.path.join("extra", "old_labels.csv")].startswith("not part of")
  assert files["Vitals.xlsx"].endswith("; not read")
  (root / "Labs.xlsx").write_text("")   # where labs.csv is missing, the entry says what to do
  os.remove(root / "labs.csv")
  assert [e["reason"].split("; not read")[1] for e in accounting.foreign_files(str(root))
          if e["path"].endswith(".xlsx")] == ["; a spreadsheet; save it as CSV to labs.csv to be "
                                              "read", ""]
  counts = result.summary["accounting"]
  assert counts["files"] == {"under_root": 7, "in_manifest": 0, "quarantined": 4,
                             "tables_read": 3, "unlisted_folders": 0}
  assert counts["patients"] == {"named": 6, "in_manifest": 1, "quarantined": 5}


def test_gzipped_tables_are_read_as_mimic_ships_them(tmp_path):
  """labels.csv.gz and labs.csv.gz (MIMIC-IV's hosp/labevents.csv.gz, unpacked by nobody) were
  'not part of a cohort's layout; unpack it': every patient without a label. A table's gzip is
  read where the table itself is not there; beside it, the copy is reported, not read; a gzip
  cut short is refused with one line naming it."""
  root = tmp_path / "cohort"
  root.mkdir()
  with gzip.open(root / "labels.csv.gz", "wt") as f:
    f.write("patient_id,diagnosis\nP1,flu\nP2,copd\n")
  with gzip.open(root / "labs.csv.gz", "wt") as f:
    f.write("patient_id,Na\nP1,140\nP2,abc\n")
  (root / "vitals.csv").write_text("patient_id,hour,hr,sbp,dbp,rr,spo2,temp\n"
                                   "P1,0,80,120,80,16,98,37\nP2,0,81,121,81,17,97,37\n")
  (root / "vitals.csv.gz").write_bytes(b"")
  result = _ingest(tmp_path, root)
  assert len(result.manifest) == 2 and not _patients(result)
  assert _files(result) == {"vitals.csv.gz": "not part of a cohort's layout (dicom/**, "
                            "labels.csv, labs.csv, vitals.csv; oracle.npz in a synthetic "
                            "cohort); not read; vitals.csv beside it is read"}
  # Its rows are labs.csv's, by line: P2's sodium is not a number.
  assert [(q["path"], q["line"]) for q in result.quarantine if "line" in q] == [("labs.csv", 3)]
  assert result.summary["accounting"]["files"]["tables_read"] == 3
  data = gzip.compress(b"patient_id,Na\n" + b"P1,140\n" * 160_000)   # 1.1 MiB unpacked
  (root / "labs.csv.gz").write_bytes(data[:len(data) // 2])
  with pytest.raises(errors.InputError, match=r"labs.csv.gz: is a gzip file cut short or "
                     "damaged; copy or export it again"):
    _ingest(tmp_path, root)
  # A gzip that unpacks past config.data.max_file_mb (a bomb, or not the table meant) is
  # refused unread; a higher budget reads it.
  (root / "labs.csv.gz").write_bytes(data)
  with pytest.raises(errors.InputError, match=r"labs.csv.gz: unpacks to more than "
                     r"config.data.max_file_mb=1 MiB; check that it is the table meant, and "
                     "raise it if so"):
    _ingest(tmp_path, root, max_file_mb=1)
  assert len(_ingest(tmp_path, root, max_file_mb=2).manifest) == 2


def test_zipped_tables_are_read_as_a_mail_or_a_share_packs_them(tmp_path):
  """labs.csv.zip (an export zipped for mail, with a Mac's __MACOSX/ entry) was 'not part of a
  cohort's layout; unpack it to labs.csv': every lab lost. A table's zip holding one file is read
  where neither the table nor its gzip is there; a zip holding several files, cut short, or
  encrypted is refused with one line naming it and what to do."""
  root = tmp_path / "cohort"
  root.mkdir()
  (root / "labels.csv").write_text("patient_id,diagnosis\nP1,flu\nP2,copd\n")
  with zipfile.ZipFile(root / "labs.csv.zip", "w", zipfile.ZIP_DEFLATED) as z:
    z.writestr("__MACOSX/._labs.csv", b"\0\5\26\7")
    z.writestr("export 2024/labs.csv", "patient_id,Na,K\nP1,140,4\nP2,abc,4.1\n")
  result = _ingest(tmp_path, root)
  assert len(result.manifest) == 2 and not _patients(result) and not _files(result)
  assert [(q["path"], q["line"]) for q in result.quarantine if "line" in q] == [("labs.csv", 3)]
  assert result.summary["accounting"]["files"]["tables_read"] == 2
  packed = (root / "labs.csv.zip").read_bytes()
  with zipfile.ZipFile(root / "labs.csv.zip", "w") as z:
    z.writestr("labs.csv", "patient_id,Na\nP1,140\n")
    z.writestr("vitals.csv", "patient_id,hour,hr\nP1,0,80\n")
  for data, refusal in ((None, "holds 2 files where a zipped table holds one; unpack the "
                         "table's file to its name"),
                        (packed[:len(packed) // 2], "is a zip file cut short or damaged"),
                        (_encrypted(packed), "is zipped encrypted or by a method Python cannot "
                         "unpack; unpack it to labs.csv")):
    if data is not None:
      (root / "labs.csv.zip").write_bytes(data)
    with pytest.raises(errors.InputError, match=r"labs.csv.zip: " + refusal):
      _ingest(tmp_path, root)


def _encrypted(packed: bytes) -> bytes:
  """A zip's bytes with its members flagged encrypted (bit 0 of the general purpose flag, in
  each local header and central directory entry), as a password-protected export is."""
  data = bytearray(packed)
  for signature, at in ((b"PK\3\4", 6), (b"PK\1\2", 8)):
    start = data.find(signature)
    while start >= 0:
      data[start + at] |= 1
      start = data.find(signature, start + 4)
  return bytes(data)


def test_a_patient_whose_every_image_is_rejected_is_accounted_for(tmp_path):
  """A file rejected after its header was read still names its patient: with a label and
  nothing else usable, that patient is left out with the file's reason, not lost."""
  root = tmp_path / "cohort"
  root.mkdir()
  (root / "labels.csv").write_text("patient_id,diagnosis\nP1,flu\nP2,copd\nP3,gout\n")
  (root / "labs.csv").write_text("patient_id,Na\nP1,140\nP2,141\n")
  _dicom(str(root / "dicom" / "p3.dcm"), "P3")
  with open(root / "dicom" / "p3.dcm", "r+b") as f:   # cut inside its pixel data
    f.truncate(os.path.getsize(root / "dicom" / "p3.dcm") - 1000)
  result = _ingest(tmp_path, root)
  salt = ingest.load_or_create_salt(str(tmp_path / "work" / "secrets" / "id_salt"))
  reason = _patients(result)[ingest.pseudonym("P3", salt)]
  assert reason.startswith("no usable data: every image file of theirs was quarantined; first: "
                           "dicom/p3.dcm (truncated pixel data")
  assert result.summary["accounting"]["patients"] == {"named": 3, "in_manifest": 2,
                                                      "quarantined": 1}


def test_a_labelled_patient_whose_every_value_was_set_aside_says_so(tmp_path):
  root = tmp_path / "cohort"
  root.mkdir()
  (root / "labels.csv").write_text("patient_id,diagnosis\nP1,flu\nP2,copd\n")
  (root / "labs.csv").write_text("patient_id,Na,K\nP1,140,4\nP2,inf,abc\n")
  result = _ingest(tmp_path, root)
  salt = ingest.load_or_create_salt(str(tmp_path / "work" / "secrets" / "id_salt"))
  assert _patients(result)[ingest.pseudonym("P2", salt)] == (
      "no usable data: every value of theirs was missing or set aside, first on labs.csv line 3 "
      "(see that file's values entries)")


def test_one_instance_under_two_patients_quarantines_both_files(tmp_path):
  root = tmp_path / "cohort"
  root.mkdir()
  (root / "labels.csv").write_text("patient_id,diagnosis\nP1,flu\nP2,copd\nP3,gout\n")
  uid = pydicom.uid.generate_uid()
  _dicom(str(root / "dicom" / "p1.dcm"), "P1", uid=uid)
  _dicom(str(root / "dicom" / "p2.dcm"), "P2", uid=uid)
  _dicom(str(root / "dicom" / "p3.dcm"), "P3")
  _dicom(str(root / "dicom" / "p3_copy.dcm"), "P3")   # its own instance
  (root / "labs.csv").write_text("patient_id,Na\nP1,140\n")
  result = _ingest(tmp_path, root)
  files = _files(result)
  assert files["dicom/p1.dcm"].startswith("its SOPInstanceUID is also in dicom/p2.dcm")
  assert files["dicom/p2.dcm"].startswith("its SOPInstanceUID is also in dicom/p1.dcm")
  # P1 keeps its labs; P2 had nothing else and is left out; P3 is untouched.
  assert len(result.manifest) == 2 and len(_patients(result)) == 1
  assert sum(len(f) for f in result.manifest.image_files) == 2


def test_losing_track_of_a_file_or_a_patient_fails_loudly(tmp_path, monkeypatch):
  root = tmp_path / "cohort"
  root.mkdir()
  (root / "labels.csv").write_text("patient_id,diagnosis\nP1,flu\nP2,copd\n")
  (root / "labs.csv").write_text("patient_id,Na\nP1,140\nP2,141\nP3,142\n")
  _dicom(str(root / "dicom" / "p1.dcm"), "P1")
  real = accounting.left_out
  monkeypatch.setattr(accounting, "left_out", lambda *a, **k: real(*a, **k)[1:])
  with pytest.raises(accounting.LostTrack, match=r"lost track of 0 files and 1 patients"):
    _ingest(tmp_path, root)
  monkeypatch.setattr(accounting, "left_out", real)
  monkeypatch.setattr(accounting, "foreign_files", lambda *a, **k: [])
  (root / "stray.bin").write_bytes(b"\0")
  with pytest.raises(accounting.LostTrack, match=r"lost track of 1 files and 0 patients"):
    _ingest(tmp_path, root)


# -- generated cohorts ---------------------------------------------------------------------------

@dataclasses.dataclass
class _Patient:
  pid: str
  label: str          # 'ok', 'none', or how the row is broken
  labs: str           # 'ok', 'none', 'bad_value', 'broken'
  vitals: str         # 'ok', 'none', 'bad_time', 'broken'
  images: int
  blank_dicom: bool


_LABEL = {"ok": "{pid},flu", "unknown": "{pid},measles", "control": "{pid},fl\x02u",
          "quote": "{pid},\"flu", "empty": "{pid},", "fields": "{pid},flu,extra"}
_LABS = {"ok": "{pid},140", "bad_value": "{pid},x1", "broken": "{pid},14\x00"}
_VITALS = {"ok": "{pid},0,80,120,80,16,98,37", "bad_time": "{pid},soon,80,120,80,16,98,37",
           "broken": "{pid},0,80,120"}


def _write_cohort(root, patients, foreign: int, junk: int):
  root.mkdir(parents=True)
  labels = ["patient_id,diagnosis"] + [_LABEL[p.label].format(pid=p.pid) for p in patients
                                       if p.label != "none"]
  labs = ["patient_id,Na"] + [_LABS[p.labs].format(pid=p.pid) for p in patients
                              if p.labs != "none"]
  vitals = ["patient_id,hour,hr,sbp,dbp,rr,spo2,temp"] + [
      _VITALS[p.vitals].format(pid=p.pid) for p in patients if p.vitals != "none"]
  for name, rows in (("labels.csv", labels), ("labs.csv", labs), ("vitals.csv", vitals)):
    (root / name).write_bytes(("\n".join(rows) + "\n").encode())
  for i, p in enumerate(patients):   # folders not named after patients: paths are written
    for k in range(p.images):
      _dicom(str(root / "dicom" / f"s{i}" / f"{k}.dcm"), p.pid)
    if p.blank_dicom:
      _dicom(str(root / "dicom" / f"s{i}" / "blank.dcm"), "")
  for k in range(junk):
    os.makedirs(root / "dicom", exist_ok=True)
    (root / "dicom" / f"junk{k}.txt").write_text("not dicom")
  for k in range(foreign):
    (root / f"foreign{k}.dat").write_text("x")


_patient = st.builds(
    _Patient, pid=st.just(""), label=st.sampled_from(["ok", "ok", "none", *list(_LABEL)[1:]]),
    labs=st.sampled_from(["ok", "none", "bad_value", "broken"]),
    vitals=st.sampled_from(["ok", "none", "bad_time", "broken"]),
    images=st.integers(0, 2), blank_dicom=st.booleans())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(patients=st.lists(_patient, min_size=1, max_size=8), foreign=st.integers(0, 2),
       junk=st.integers(0, 2), seed=st.integers(0, 10_000))
def test_generated_cohorts_with_random_rejections_account_for_everyone(
    tmp_path_factory, patients, foreign, junk, seed):
  for i, p in enumerate(patients):
    p.pid = f"MRN{seed:05d}{i:02d}"
  base = tmp_path_factory.mktemp("gen")
  root = base / "cohort"
  _write_cohort(root, patients, foreign, junk)
  try:
    result = ingest.run(_config(), str(base / "work"), str(root))
  except errors.InputError as e:
    # A cohort that keeps no patient is refused in one line, with the quarantine report written.
    assert "kept no patient" in str(e) and os.path.exists(base / "work" / "ingest" /
                                                         "quarantine.jsonl")
    return
  salt = ingest.load_or_create_salt(str(base / "work" / "secrets" / "id_salt"))
  named = {p.pid for p in patients if p.label != "none" or p.labs != "none"
           or p.vitals != "none" or p.images}
  kept = {ingest.pseudonym(p, salt) for p in named} & set(result.manifest.record_ids)
  left = _patients(result)
  # Each named patient exactly once: the manifest xor a patient entry; nobody else anywhere.
  assert kept | set(left) == {ingest.pseudonym(p, salt) for p in named}
  assert not kept & set(left)
  assert set(result.manifest.record_ids) == kept
  # Each file exactly once (the check inside ingest also ran), and the counts add up.
  files, _ = accounting.files_under(str(root))
  referenced = {f for row in result.manifest.image_files for f in row}
  quarantined = set(_files(result))
  tables_read = {f for f in files if f in accounting.TABLE_FILES}
  assert referenced | quarantined | tables_read == set(files)
  assert not referenced & quarantined
  counts = result.summary["accounting"]
  assert counts["patients"]["named"] == len(named)
  assert counts["files"]["under_root"] == len(files)
  # A patient out for a rejected label row carries that row's line on every file of theirs.
  for i, p in enumerate(patients):
    if p.label in ("unknown", "control", "quote", "empty", "fields") and p.images:
      reason = left[ingest.pseudonym(p.pid, salt)]
      assert reason.startswith("label row rejected: labels.csv line"), reason
      assert all(_files(result)[f"dicom/s{i}/{k}.dcm"] == reason for k in range(p.images))
  assert not any(p.pid in json.dumps(result.quarantine) for p in patients)


def test_the_quickstart_cohort_is_accounted_for(tmp_path):
  """The synthetic cohort's counts: every file and patient somewhere, its junk files included."""
  from configs import quickstart  # pylint: disable=import-outside-toplevel
  from medjax.data import synthetic  # pylint: disable=import-outside-toplevel
  config = quickstart.get_config("tiny")
  root = str(tmp_path / "cohort")
  synthetic.generate(config.data.synthetic, root)
  result = ingest.run(config, str(tmp_path / "work"), root)
  counts = result.summary["accounting"]
  files, _ = accounting.files_under(root)
  assert counts["files"]["under_root"] == len(files) == (
      counts["files"]["in_manifest"] + counts["files"]["quarantined"]
      + counts["files"]["tables_read"])
  assert counts["patients"]["named"] == (counts["patients"]["in_manifest"]
                                         + counts["patients"]["quarantined"])
  assert counts["patients"]["in_manifest"] == len(result.manifest)
  assert np.all(result.tables["labs_mask"].any(1) | ~result.manifest.modality_mask[:, 1])
