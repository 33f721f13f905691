"""The cohort's dicom/ folder scanned: every file's header (no pixels) or its quarantine entry.

Headers are read in worker processes for large folders; a patient's second copy of one instance
(the same SOPInstanceUID) is quarantined here, the same UID under two PatientIDs by ingest's link
step (it needs every patient's files).
"""

from __future__ import annotations

import os

from medjax import errors
from medjax.data import pools
from medjax.data.dicom import files
from medjax.data.dicom import limits

MIN_POOL_FILES = 500   # up to this many files are scanned in the calling process
TIMEOUT_S = 120.0      # config.data.decode_timeout_s's default


def scan_root(dicom_root: str, workers: int, budgets: limits.Budgets,
              patients: dict[str, str], timeout_s: float = TIMEOUT_S) -> tuple[list, list]:
  """The headers of dicom/'s files and the quarantine entries of those rejected (none without
  a dicom/ folder; one that is not a folder is refused); the rest as `scan_dicom`'s."""
  if os.path.lexists(dicom_root) and not os.path.isdir(dicom_root):
    raise errors.InputError(f"{dicom_root} is not a directory; the cohort's DICOM files go in a "
                            "dicom/ folder (any subfolders)")
  if not os.path.isdir(dicom_root):
    return [], []
  return scan_dicom(dicom_root, workers, budgets, patients, timeout_s=timeout_s)


def scan_dicom(dicom_root: str, workers: int = 0, budgets: limits.Budgets | None = None,
               patients: dict[str, str] | None = None, *, timeout_s: float = TIMEOUT_S
               ) -> tuple[list[tuple[str, files.Header]], list[dict]]:
  """Reads every file's header (no pixels). Returns (accepted, quarantine entries).

  Only regular files are read; a symlinked file only when its target is inside the cohort root
  (the parent of `dicom_root`) or `dicom_root`. Directory symlinks are not followed (so a loop
  cannot hang the walk) and are quarantined, as are directories that cannot be listed. Of a
  patient's files holding the same SOPInstanceUID (one instance stored twice, e.g. re-exported
  or transcoded), the first by path is kept and the others are quarantined; the same UID under
  two PatientIDs is left to each patient (files are linked by PatientID alone).

  Args:
    dicom_root: the cohort's dicom/ folder.
    workers: header-scan processes (0: one per CPU core).
    budgets: size limits (`config.data.max_pixels` etc.; default: `limits.Budgets()`).
    patients: filled, where given, with the PatientID of each rejected file whose header could
      be read (quarantine path -> raw id; in memory only), so that its patient is accounted for.
    timeout_s: how long one file's header may take in a scanning process
      (config.data.decode_timeout_s): past it the process is killed and the file quarantined
      (`pools.Stall`; a stalled mount), and past 8 such files the scan fails with one line.
  """
  budgets = budgets or limits.Budgets()
  roots = (os.path.dirname(os.path.abspath(dicom_root)), dicom_root)

  def entry(path: str, reason: str) -> dict:
    rel = os.path.relpath(path, dicom_root)
    return {"path": "dicom" if rel == "." else os.path.join("dicom", rel), "stage": "scan",
            "reason": reason}

  rels, rejected = [], []
  def unlisted(e: OSError) -> None:
    rejected.append(entry(e.filename, f"directory not readable ({e.strerror}); its files were "
                          "not scanned"))
  for dirpath, dirnames, filenames in os.walk(dicom_root, onerror=unlisted, followlinks=False):
    for name in dirnames:
      if os.path.islink(os.path.join(dirpath, name)):
        rejected.append(entry(os.path.join(dirpath, name), "symlink to a directory; not "
                              "followed (put the files, or links to them, under dicom/)"))
    for name in filenames:
      rels.append(os.path.relpath(os.path.join(dirpath, name), dicom_root))
  rels.sort()
  workers = workers or pools.cores()
  jobs = [(dicom_root, r, roots, budgets) for r in rels]
  stall = pools.Stall(
      seconds=lambda job: timeout_s,
      result=lambda job: (job[1], None, (f"reading its header took longer than {timeout_s:g} "
                                         "s (config.data.decode_timeout_s): the storage did "
                                         "not answer"), ""),
      name=lambda job: os.path.join("dicom", job[1]), what="dicom scan")
  with pools.Pool(workers if len(rels) > MIN_POOL_FILES else 1, "dicom scan: a scanning "
                  "process died; scanning the rest in this process", stall=stall) as pool:
    results = list(pool.map(_scan_one, jobs, chunksize=64))
  accepted, kept = [], {}
  for rel, header, reason, patient_id in results:
    key = (header.patient_id, header.instance) if header is not None else None
    if header is None:
      rejected.append({"path": os.path.join("dicom", rel), "stage": "scan", "reason": reason})
      if patient_id.strip() and patients is not None:
        patients[os.path.join("dicom", rel)] = patient_id
    elif header.instance and key in kept:
      rejected.append({"path": os.path.join("dicom", rel), "stage": "scan",
                       "reason": "duplicate SOPInstanceUID (same instance as "
                                 f"{os.path.join('dicom', kept[key])})"})
      if patients is not None:
        patients[os.path.join("dicom", rel)] = header.patient_id
    else:
      if header.instance:
        kept[key] = rel
      accepted.append((rel, header))
  rejected.sort(key=lambda q: q["path"])
  return accepted, rejected


def _scan_one(args: tuple[str, str, tuple[str, ...], limits.Budgets]
              ) -> tuple[str, files.Header | None, str | None, str]:
  root, rel, roots, budgets = args
  try:
    # read_header refuses FIFOs, sockets, devices and directories from os.lstat/os.stat without
    # opening them, follows a symlink only to a regular file inside `roots`, and checks the
    # budgets before anything but the header is read.
    return rel, files.read_header(os.path.join(root, rel), budgets, roots=roots), None, ""
  except limits.RejectedFile as e:
    return rel, None, e.reason, e.patient_id
