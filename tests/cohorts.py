"""Hand-made cohorts for tests, from real DICOM files shipped with pydicom."""

import hashlib
import os
import pathlib
import shutil

import numpy as np
import pydicom

from medjax.data import manifest as manifest_lib
from tests import testdata


def _copy_with_patient(src_name, dst, patient_id, name="DOE^JOHN"):
  ds = pydicom.dcmread(testdata.dicom_test_file(src_name))
  if patient_id is None:
    del ds.PatientID
  else:
    ds.PatientID = patient_id
  ds.PatientName = name
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


def random_manifest(n: int, seed: int = 0) -> manifest_lib.Manifest:
  """Random rows in the paper cohort's proportions: 37 long-tailed classes, ~38% without images,
  ~10% without labs, ~15% without vitals, 1-4 images, 80/10/10 split."""
  rng = np.random.default_rng(seed)
  p_C = 1.0 / np.arange(1, 38) ** 1.2
  labels_N = rng.choice(37, size=n, p=p_C / p_C.sum()).astype(np.int32)
  mask_Nx3 = np.stack([rng.random(n) >= 0.38, rng.random(n) >= 0.10, rng.random(n) >= 0.15], 1)
  mask_Nx3[~mask_Nx3.any(1), manifest_lib.LABS] = True
  images_N = np.where(mask_Nx3[:, manifest_lib.IMAGES], rng.integers(1, 5, n), 0).astype(np.int32)
  split_N = np.array(manifest_lib.SPLITS)[rng.choice(3, size=n, p=[0.8, 0.1, 0.1])]
  ids_N = np.array([f"r-{hashlib.sha256(f'{seed}/{i}'.encode()).hexdigest()[:16]}"
                    for i in range(n)])
  return manifest_lib.Manifest(
      record_ids=ids_N, labels=labels_N, modality_mask=mask_Nx3, num_images=images_N,
      cost=manifest_lib.expected_cost(mask_Nx3, images_N), split=split_N,
      image_files=[[f"dicom/{ids_N[i]}/{k}.dcm" for k in range(images_N[i])] for i in range(n)],
      class_names=[f"class-{k}" for k in range(37)])
