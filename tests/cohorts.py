"""Hand-made cohorts for tests, from real DICOM files shipped with pydicom."""

import os
import pathlib
import shutil

import pydicom

from tests import testdata


def _copy_with_patient(src_name, dst, patient_id, name="DOE^JOHN"):
  ds = pydicom.dcmread(testdata.dicom_test_file(src_name))
  if patient_id is None:
    del ds.PatientID
  else:
    ds.PatientID = patient_id
  ds.PatientName = name
  # Another patient's copy is another instance: its own SOPInstanceUID (an instance held under
  # two PatientIDs is quarantined as a mix-up).
  uid = pydicom.uid.generate_uid(entropy_srcs=[os.path.basename(dst), str(patient_id)])
  ds.SOPInstanceUID = uid
  if "MediaStorageSOPInstanceUID" in ds.file_meta:
    ds.file_meta.MediaStorageSOPInstanceUID = uid
  os.makedirs(os.path.dirname(dst), exist_ok=True)
  ds.save_as(dst)


def tiny_cohort(root: str) -> str:
  """Six patients: images, partial labs, vitals, each alone and together, plus junk files.

  Real DICOM test files from pydicom with their PatientID rewritten; tables with one of each
  malformation ingest must report (duplicate row, non-numeric value, out-of-order vitals, a label
  without data, images without a label).
  """
  root = pathlib.Path(root)
  d = root / "dicom"
  _copy_with_patient("CT_small.dcm", str(d / "s1" / "a.dcm"), "MRN001")
  _copy_with_patient("MR_small_RLE.dcm", str(d / "s1" / "b.dcm"), "MRN001")
  _copy_with_patient("emri_small.dcm", str(d / "s2" / "x"), "MRN003")  # multi-frame, no suffix
  _copy_with_patient("MR_small.dcm", str(d / "s3" / "c.dcm"), None)    # no PatientID
  _copy_with_patient("MR_small.dcm", str(d / "s4" / "d.dcm"), "MRN999")  # no label
  shutil.copy(testdata.dicom_test_file("rtplan.dcm"), d / "s5.dcm")
  data = open(testdata.dicom_test_file("CT_small.dcm"), "rb").read()
  (d / "s6.dcm").write_bytes(data[: len(data) // 2])
  (d / "README.txt").write_text("scanner export\n")
  (root / "labs.csv").write_text("patient_id,Na,K,Cl\nMRN001,140,4.0,100\nMRN002,,3.9,\n"
                                 "MRN004,135,4.4,101\nMRN004,1,1,1\nMRN005,13O,4,99\n")
  (root / "vitals.csv").write_text(
      "patient_id,hour,hr,sbp,dbp,rr,spo2,temp\nMRN001,0,80,120,80,16,98,37\n"
      "MRN003,0,70,110,70,14,99,36.9\nMRN003,5,72,112,71,15,98,37.1\n"
      "MRN006,1,90,130,85,18,95,38.2\nMRN006,0,91,131,86,18,95,38.1\n")
  (root / "labels.csv").write_text(
      "patient_id,diagnosis\nMRN001,pneumonia\nMRN002,copd\nMRN003,pneumonia\nMRN004,copd\n"
      "MRN005,asthma\nMRN006,asthma\nMRN007,copd\n")
  return str(root)
