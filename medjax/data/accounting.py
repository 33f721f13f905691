"""Every patient and every file of a cohort accounted for, and a check that none is lost.

A patient is named by any row of any table (accepted or set aside, where the row still shows
its id) or by a DICOM file's PatientID. Each ends in exactly one of: the manifest, or the
quarantine report as a patient entry (`{"path": "", "patient": <pseudonym>, "stage": "link",
"reason"}`: no file, a patient)
whose reason says why, as a chain when one rejection causes another ("label row rejected:
labels.csv line 7 (class 'X' not in config.data.classes ...)"). A left-out patient's image files
are quarantined with the same chain.

A file under the cohort root ends in exactly one of: the manifest (an image file), the
quarantine report (a file or a folder whose files could not be listed), or the tables ingest
read (labels.csv, labs.csv, vitals.csv, and oracle.npz of a synthetic cohort). A file that is
no part of a cohort's layout is quarantined, not ignored.

`check` counts them at the end of ingest and raises `LostTrack` (an internal error: a bug, not
bad input) if any patient or file is unaccounted for or accounted twice.
"""

from __future__ import annotations

import logging
import os

TABLE_FILES = ("labels.csv", "labs.csv", "vitals.csv", "oracle.npz")
NO_LABEL = "its PatientID has no row in labels.csv"


def table_file(root: str, table: str) -> str:
  """The file a table is read from, relative to `root`: `table` (labs.csv), else its gzip
  (labs.csv.gz, as MIMIC ships its tables), else its zip (labs.csv.zip, as a mail or a file
  share packs an export); '' where none is."""
  for name in (table, table + ".gz", table + ".zip"):
    if os.path.lexists(os.path.join(root, name)):
      return name
  return ""


# What a table meant for the cohort may be saved as instead of its name: a spreadsheet, or text
# under another extension (the reader finds the delimiter: ',', ';', tab or '|').
_SPREADSHEETS = (".xlsx", ".xlsm", ".xls", ".ods", ".numbers")
_TEXT = (".csv", ".tsv", ".tab", ".txt", ".dat")


def meant_as(rel: str) -> str:
  """The table a file at the cohort's top level is meant as: its name in another case or with
  another extension ('Labels.csv', 'labs.xlsx', 'vitals.tsv'); '' for any other file."""
  stem, ext = os.path.splitext(rel)
  if os.sep in rel or rel in TABLE_FILES or ext.casefold() not in _SPREADSHEETS + _TEXT:
    return ""
  return next((t for t in TABLE_FILES[:3] if stem.casefold() == os.path.splitext(t)[0]), "")


def table_hint(rel: str) -> str:
  """What to do with a file `meant_as` a table for it to be read; '' for any other file."""
  table, ext = meant_as(rel), os.path.splitext(rel)[1].casefold()
  if not table:
    return ""
  if ext in _SPREADSHEETS:
    return f"a spreadsheet; save it as CSV to {table} to be read"
  return f"rename it {table} to be read" + (" (names are case-sensitive)" if ext == ".csv"
                                             else "")


def misnamed_tables(root: str) -> dict[str, str]:
  """{table: 'found NAME: what to do'} for each of labels.csv, labs.csv and vitals.csv that
  `root` lacks while a file at its top level is `meant_as` it."""
  try:
    names = sorted(os.listdir(root))
  except OSError:
    return {}
  found = {}
  for name in names:
    table = meant_as(name)
    if table and table not in found and not os.path.exists(os.path.join(root, table)):
      found[table] = f"found {name}: {table_hint(name)}"
  return found


class LostTrack(RuntimeError):
  """Ingest did not account for every patient and file (a bug in medjax)."""


def files_under(root: str, skip: tuple[str, ...] = ()) -> tuple[list[str], list[str]]:
  """(files, unlisted folders) under `root`, as paths relative to it: what a walk that follows
  no folder symlink sees (a symlink to a folder counts as a file: it is quarantined as one).
  Folders in `skip` (absolute: the run's own workdir, when it lies inside the cohort) are not
  the cohort's and are not walked."""
  files, unlisted = [], []
  skip = {os.path.realpath(s) for s in skip}

  def failed(e: OSError) -> None:
    unlisted.append(os.path.relpath(e.filename, root))

  for dirpath, dirnames, filenames in os.walk(root, onerror=failed, followlinks=False):
    dirnames[:] = [d for d in dirnames if os.path.realpath(os.path.join(dirpath, d)) not in skip]
    for name in dirnames:
      if os.path.islink(os.path.join(dirpath, name)):
        files.append(os.path.relpath(os.path.join(dirpath, name), root))
    files += [os.path.relpath(os.path.join(dirpath, name), root) for name in filenames]
  return sorted(files), sorted(unlisted)


def foreign_files(root: str, skip: tuple[str, ...] = ()) -> list[dict]:
  """Quarantine entries for what lies under `root` outside a cohort's layout (dicom/ and the
  tables): read by nothing, so reported rather than silently skipped."""
  files, unlisted = files_under(root, skip)
  out = []
  for rel in files + unlisted:
    top = rel.split(os.sep)[0]
    if top == "dicom" or rel in TABLE_FILES:
      continue
    hint, meant, stem = "", meant_as(rel), os.path.splitext(rel)[0]
    if stem in TABLE_FILES[:3] and table_file(root, stem) == rel:   # labs.csv.gz, read
      continue
    if stem in TABLE_FILES:   # labs.csv.zip beside labs.csv, or another packing (.bz2)
      read = table_file(root, stem) if stem in TABLE_FILES[:3] else ""
      hint = f"{read} beside it is read" if read else f"unpack it to {stem}"
    elif meant and not os.path.exists(os.path.join(root, meant)):   # Labs.xlsx, no labs.csv
      hint = table_hint(rel)
    out.append({"path": rel, "stage": "scan",
                "reason": "not part of a cohort's layout (dicom/**, labels.csv, labs.csv, "
                          "vitals.csv; oracle.npz in a synthetic cohort); not read"
                          + (f"; {hint}" if hint else "")})
  return out


def left_out(named: set[str], in_manifest: set[str], problems, files_by_patient: dict,
             has_labels: bool, label_of: dict, pseudonym,
             file_rejections: dict[str, list] | None = None) -> list[dict]:
  """Quarantine entries for the named patients the manifest does not hold, each with its reason,
  and for their image files with the same reason.

  Args:
    named: every patient id named by a table row or a DICOM file (normalised).
    in_manifest: the ids the manifest holds.
    problems: the ingest's `tables.Problems` (row problems carry their patient, if known).
    files_by_patient: id -> [(path, frames)] of the accepted image files.
    has_labels: whether the cohort has a labels.csv.
    label_of: id -> class of labels.csv's accepted rows.
    pseudonym: id -> its record id (the salted hash: no raw id is written).
    file_rejections: id -> [(path, reason)] of their quarantined DICOM files, if any.
  """
  rows_of: dict[str, list] = {}
  for p in problems.items:
    if p.patient and p.what == "row":
      rows_of.setdefault(p.patient, []).append(p)
  out = []
  for pid in sorted(named - in_manifest):
    reason = _why(pid, rows_of.get(pid, []), has_labels, label_of,
                  (file_rejections or {}).get(pid, []), getattr(problems, "first_line", {}))
    out.append({"path": "", "patient": pseudonym(pid), "stage": "link", "reason": reason})
    file_reason = NO_LABEL if reason.startswith("no row in labels.csv") else reason
    out += [{"path": path, "stage": "link", "reason": file_reason}
            for path, _ in sorted(files_by_patient.get(pid, []))]
  return out


def _why(pid: str, rows: list, has_labels: bool, label_of: dict, files: list,
         first_line: dict[str, dict[str, int]]) -> str:
  """Why a named patient is not in the manifest: the first cause, as a chain."""
  rejected_label = [p for p in rows if p.source == "labels.csv"]
  if has_labels and pid not in label_of:
    if rejected_label:
      p = min(rejected_label, key=lambda p: p.line)
      return f"label row rejected: labels.csv line {p.line} ({_short(p.reason)})"
    return "no row in labels.csv; their images and table rows are left out"
  others = [p for p in rows if p.source != "labels.csv"]
  if files and not others:
    path, reason = min(files)
    return ("no usable data: every image file of theirs was quarantined; first: "
            f"{path} ({reason})")
  naming = sorted((source, lines[pid]) for source, lines in first_line.items()
                  if source != "labels.csv" and pid in lines)
  if naming and not others:
    where = " and ".join(f"{source} line {line}" for source, line in naming)
    return (f"no usable data: every value of theirs was missing or set aside, first on {where} "
            "(see that file's values entries)")
  if has_labels and not others:
    p = min((p for p in rows if p.source == "labels.csv"), key=lambda p: p.line, default=None)
    where = f": labels.csv line {p.line}" if p is not None else ""
    return f"a label but no data (no image, lab or vitals row){where}"
  return ("no usable data: no image, lab or vitals value of theirs was accepted"
          + _first_row(others))


def _first_row(rows: list) -> str:
  """'; first: labs.csv line 4 (reason)' for a patient's first set-aside row, else ''."""
  if not rows:
    return ""
  p = min(rows, key=lambda p: (p.source, p.line))
  return f"; first set aside: {p.source} line {p.line} ({_short(p.reason)})"


def _short(reason: str) -> str:
  """A row's reason without its ending, '; the row is set aside' (the chain says it)."""
  for ending in ("; the row is set aside", "; the patient is left out"):
    if reason.endswith(ending):
      return reason[:-len(ending)]
  return reason


def check(root: str, manifest, quarantine: list[dict], named: set[str],
          in_manifest: set[str], pseudonym, skip: tuple[str, ...] = ()) -> dict:
  """The conservation counts; raises LostTrack if any file or patient is unaccounted for or
  accounted twice (the message counts them; the log names the files)."""
  files, unlisted = files_under(root, skip)
  in_manifest_files = {f for row_files in manifest.image_files for f in row_files}
  quarantined = {q["path"] for q in quarantine if q.get("path") and "line" not in q}
  tables_read = {table_file(root, f) for f in TABLE_FILES} & set(files)
  folders = tuple(q.rstrip(os.sep) + os.sep for q in quarantined)
  lost = [f for f in files + unlisted
          if f not in in_manifest_files and f not in quarantined and f not in tables_read
          and not f.startswith(folders)]
  twice = sorted(in_manifest_files & quarantined)
  quarantined_patients = {q["patient"] for q in quarantine if "patient" in q}
  manifest_ids = {pseudonym(p) for p in in_manifest}
  lost_patients = {pseudonym(p) for p in named} - manifest_ids - quarantined_patients
  both = manifest_ids & quarantined_patients
  counts = {
      "files": {"under_root": len(files), "in_manifest": len(in_manifest_files),
                "quarantined": len(quarantined & set(files)), "tables_read": len(tables_read),
                "unlisted_folders": len(unlisted)},
      "patients": {"named": len(named), "in_manifest": len(manifest_ids),
                   "quarantined": len(quarantined_patients)}}
  if lost or twice or lost_patients or both:
    logging.error("ingest lost track of files %s, counted twice %s", lost[:20], twice[:20])
    raise LostTrack(
        f"ingest lost track of {len(lost)} files and {len(lost_patients)} patients, and counted "
        f"{len(twice)} files and {len(both)} patients both in the manifest and the quarantine "
        "report (a bug in medjax: the log lists them)")
  return counts
