"""Ingest: a cohort directory -> manifest, tables, quarantine report and summary.

Input layout under `config.data.root` (each table optional):
  dicom/**      DICOM files (any names, any folders), linked to patients only by PatientID
  labs.csv      wide (one column per analyte) or long (patient_id, analyte, value)
  vitals.csv    long: patient_id, hour (or an ISO timestamp), one column per channel
  labels.csv    patient_id, diagnosis
  oracle.npz    optional, synthetic cohorts only: the exact Bayes posterior per patient

Output under `<workdir>/ingest/`: manifest.jsonl, tables.npz, quarantine.jsonl, summary.json,
and ceiling.npz for synthetic cohorts. Every input DICOM file is either referenced by the manifest
or listed in the quarantine report with its reason, and so is every data line of labels.csv (the
table rules are in medjax/data/tables.py). Raw PatientIDs never leave this module: rows
are keyed by a salted hash, and the salt stays in a private file.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import time
import zipfile

import numpy as np

from medjax import errors
from medjax import paths
from medjax import secretfile
from medjax.data import accounting
from medjax.data import dicom
from medjax.data.dicom import scan as dicom_scan
from medjax.data import ingest_summary
from medjax.data import manifest as manifest_lib
from medjax.data import tables
# What a run reads back lives apart, without pandas and the readers (ingest.load as before).
from medjax.data.ingested import Ingested, load, load_ceiling  # pylint: disable=unused-import

ID_PREFIX = "r-"
SALT_BYTES = 32


def load_or_create_salt(path: str) -> bytes:
  """The pseudonymisation salt: created once (owner-only permissions), then reused.

  Reusing it keeps record ids, and so caches and checkpoints' lineage, stable across runs.
  """
  try:
    salt = secretfile.read_or_create(path, lambda: secrets.token_bytes(SALT_BYTES))
  except OSError as e:
    raise errors.InputError(f"{path}: cannot read or create the salt file ({e.strerror}); fix "
                            "its permissions or set config.data.salt_file") from e
  # Exactly what `secrets.token_bytes` wrote: any other length (cut short, a newline added by an
  # editor, another tool's salt) would re-key every record id, the split and the plans.
  if len(salt) != SALT_BYTES:
    raise errors.InputError(
        f"{path}: the salt file is damaged ({len(salt)} bytes, expected {SALT_BYTES}); restore "
        "it from a backup, or delete it and ingest again (record ids change: start a new "
        "--workdir, as this run's checkpoints and caches belong to the old ids)")
  return salt


def pseudonym(patient_id: str, salt: bytes) -> str:
  """Salted hash of a PatientID: stable for one salt, not reversible without it."""
  return ID_PREFIX + hmac.new(salt, patient_id.encode(), hashlib.sha256).hexdigest()[:20]


def stratified_split(labels_N: np.ndarray, record_ids: np.ndarray, fractions: tuple[float, ...],
                     seed: int) -> np.ndarray:
  """Patient-level train/val/test split, stratified by label, deterministic in (ids, seed)."""
  if len(fractions) != 3 or abs(sum(fractions) - 1) > 1e-6 or min(fractions) < 0:
    raise ValueError(f"config.data.split={fractions}: give three fractions (train, val, test) "
                     "that sum to 1")
  split = np.empty(len(labels_N), dtype="<U5")
  keys = np.array([hashlib.blake2b(f"{seed}/{r}".encode(), digest_size=8).hexdigest()
                   for r in record_ids])
  for label in np.unique(labels_N):
    rows = np.flatnonzero(labels_N == label)
    rows = rows[np.argsort(keys[rows], kind="stable")]
    n_test = int(round(len(rows) * fractions[2]))
    n_val = int(round(len(rows) * fractions[1]))
    split[rows[:n_test]] = "test"
    split[rows[n_test:n_test + n_val]] = "val"
    split[rows[n_test + n_val:]] = "train"
  return split


def _normalizer(values: np.ndarray, train_rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Per-feature mean and std over the training rows' observed values (last axis = feature)."""
  features = values.shape[-1]
  flat = values[train_rows].reshape(int(np.prod(values[train_rows].shape[:-1])), features)
  flat = flat.astype(np.float64)
  observed = ~np.isnan(flat)
  count = observed.sum(0)
  filled = np.where(observed, flat, 0.0)
  mean = filled.sum(0) / np.maximum(count, 1)
  var = np.where(observed, (flat - mean) ** 2, 0.0).sum(0) / np.maximum(count - 1, 1)
  std = np.sqrt(var)
  return mean.astype(np.float32), np.where(std > 1e-6, std, 1.0).astype(np.float32)


def run(config, workdir: str, root: str) -> Ingested:
  """Ingests the cohort at `root` into `<workdir>/ingest/` (see the module docstring)."""
  data = config.data
  run_paths = paths.RunPaths(workdir, config)
  os.makedirs(run_paths.ingest, exist_ok=True)
  salt = load_or_create_salt(run_paths.salt)
  problems = tables.Problems(data.on_error)
  t0 = time.perf_counter()
  budgets = dicom.Budgets.from_config(data)
  rejected_patients: dict[str, str] = {}   # a rejected file's path -> its PatientID
  headers, quarantine = dicom_scan.scan_root(
      os.path.join(root, "dicom"), data.scan_workers, budgets, rejected_patients,
      timeout_s=data.get("decode_timeout_s", dicom_scan.TIMEOUT_S))
  scan_s = time.perf_counter() - t0
  logging.info("ingest: scanned %d DICOM files in %.1f s (%d rejected)",
               len(headers) + len(quarantine), scan_s, len(quarantine))
  quarantine += accounting.foreign_files(root, skip=(workdir,))
  fold = bool(data.ids_case_insensitive)
  # DICOM PatientIDs are joined like the tables' ids: stripped, NFC, casefolded if configured.
  dicom_ids = tables.normalize_ids([h.patient_id for _, h in headers], fold)
  problems.known_ids.update(p.casefold() for p in dicom_ids)
  named = {p for p in dicom_ids if p}
  rejected_ids = dict(zip(rejected_patients, tables.normalize_ids(
      list(rejected_patients.values()), fold)))
  problems.known_ids.update(p.casefold() for p in rejected_ids.values())
  named |= {p for p in rejected_ids.values() if p}
  headers, dicom_ids = _shared_instances(headers, dicom_ids, quarantine, rejected_ids)
  read = _read_tables(root, data, budgets, problems, fold)
  named |= problems.named
  problems.redact()
  files_by_patient: dict[str, list[tuple[str, int]]] = collections.defaultdict(list)
  for (rel, header), pid in zip(headers, dicom_ids):
    if pid:
      files_by_patient[pid].append((os.path.join("dicom", rel), header.frames))
    else:
      quarantine.append({"path": os.path.join("dicom", rel), "stage": "link",
                         "reason": "its PatientID is blank or a missing-value marker "
                         "('NULL', 'N/A', 'None'); give the file its patient's id"})
  linked = _link(read, files_by_patient, data.classes, problems, run_paths)
  if not linked.patients:
    quarantine.extend(p.as_dict() for p in problems.items)
    _write_jsonl(run_paths.quarantine, quarantine)
    raise errors.InputError(f"{root}: ingest kept no patient ({_why_none(read, files_by_patient)}"
                            f"); every rejected file and row is in {run_paths.quarantine}")
  spellings = _count_id_spellings(read, files_by_patient)
  manifest, table_arrays = _assemble(linked, read, files_by_patient, data, salt, config.seed)
  label_of = dict(zip(read.labels.ids.tolist(), read.labels.classes.tolist())) if (
      read.labels is not None) else {}
  by_pseudonym = lambda pid: pseudonym(pid, salt)
  quarantine += accounting.left_out(named, set(linked.patients), problems, files_by_patient,
                                    read.labels is not None, label_of, by_pseudonym,
                                    _file_rejections(quarantine, rejected_ids))
  quarantine.extend(p.as_dict() for p in problems.items)
  counts = accounting.check(root, manifest, quarantine, named, set(linked.patients),
                            by_pseudonym, skip=(workdir,))

  manifest.save(run_paths.manifest)
  _check_finite(table_arrays)
  np.savez(run_paths.tables, **table_arrays)
  _write_jsonl(run_paths.quarantine, quarantine)
  oracle = os.path.join(root, "oracle.npz")
  if os.path.exists(oracle):
    try:
      _write_ceiling(oracle, run_paths.ceiling, manifest, linked.patients, salt, fold)
    except (OSError, ValueError, KeyError, IndexError, zipfile.BadZipFile) as e:
      raise errors.InputError(f"{oracle}: not the synthetic generator's posterior file "
                              f"({type(e).__name__}); delete it (only synthetic cohorts have "
                              "one)") from None
  summary = ingest_summary.summarize(manifest, quarantine, len(headers) + sum(
      1 for q in quarantine if q["stage"] == "scan"), scan_s, read.vitals.late)
  summary["tables"] = ingest_summary.tables_summary(problems, quarantine, linked.id_counts,
                                                    spellings, fold)
  summary["accounting"] = counts
  summary["seconds"] = round(time.perf_counter() - t0, 3)
  with open(run_paths.ingest_summary, "w") as f:
    json.dump(summary, f, indent=2)
  return Ingested(manifest, table_arrays, quarantine, summary)


def _why_none(read: "_Tables", files_by_patient: dict) -> str:
  """Why no patient could be kept, in a few words."""
  with_data = bool(files_by_patient) or len(read.labs.ids) or len(read.vitals.ids)
  if read.labels is not None and not len(read.labels.ids):
    return "labels.csv has no usable row: a header only, or every row set aside"
  if read.labels is not None and with_data:
    return "no patient of labels.csv has an image, lab or vitals row, nor the other way round"
  return "no image, lab or vitals row was usable"


def _file_rejections(quarantine: list[dict], rejected_ids: dict[str, str]) -> dict[str, list]:
  """Patient id -> [(path, reason)] of their quarantined DICOM files, for the reason chain of a
  patient left out because none of their files could be used."""
  out: dict[str, list] = collections.defaultdict(list)
  for q in quarantine:
    pid = rejected_ids.get(q.get("path", ""))
    if pid:
      out[pid].append((q["path"], q["reason"]))
  return out


def _shared_instances(headers: list, dicom_ids: np.ndarray, quarantine: list,
                      rejected_ids: dict[str, str]) -> tuple:
  """The headers (and their ids) without the files whose SOPInstanceUID another patient's file
  holds too: one instance belongs to one patient, so one of the PatientIDs is wrong, and which
  cannot be told; all such files are quarantined, each naming another file of the UID. (The
  same patient's copies of one instance were reduced to one by `dicom.scan.scan_dicom`.)"""
  by_uid: dict[str, list[int]] = collections.defaultdict(list)
  for i, (_, header) in enumerate(headers):
    if header.instance and dicom_ids[i]:
      by_uid[header.instance].append(i)
  shared = set()
  for rows in by_uid.values():
    if len({dicom_ids[i] for i in rows}) > 1:
      shared.update(rows)
      for i in rows:
        other = next(j for j in rows if dicom_ids[j] != dicom_ids[i])
        rejected_ids[os.path.join("dicom", headers[i][0])] = dicom_ids[i]
        quarantine.append({"path": os.path.join("dicom", headers[i][0]), "stage": "link",
                           "reason": "its SOPInstanceUID is also in "
                                     f"{os.path.join('dicom', headers[other][0])}, under another "
                                     "PatientID: one instance belongs to one patient, so one of "
                                     "the two PatientIDs is wrong"})
  keep = [i for i in range(len(headers)) if i not in shared]
  return [headers[i] for i in keep], dicom_ids[keep]


@dataclasses.dataclass
class _Tables:
  """The three tables as read (labels None when there is no labels.csv)."""
  labels: tables.Labels | None
  labs: tables.Labs
  vitals: tables.Vitals


def _read_tables(root: str, data, budgets: dicom.Budgets, problems: tables.Problems,
                 fold: bool) -> _Tables:
  """labels.csv, labs.csv and vitals.csv, each empty when absent."""

  def table(name):
    """The table's path, None when absent; anything but a regular file (a FIFO that would block
    the read, a device, a directory, a link out of the cohort) or an oversized one is refused."""
    rel = accounting.table_file(root, name)
    if not rel:
      return None
    path = os.path.join(root, rel)
    try:
      dicom.check_path(path, budgets, roots=(root,))
    except dicom.RejectedFile as e:
      raise errors.InputError(f"{path}: {e.reason}; give a regular CSV file") from None
    return path

  def read(name, reader, *args):
    """`reader(path, *args)`, or None without the file. Whatever goes wrong reading a user's
    file is about that file: one line naming it (the reader's own errors already are), never
    an internal error; the exception's text stays out of it (it may quote a cell)."""
    path = table(name)
    if path is None:
      return None
    try:
      return reader(path, *args, max_bytes=int(budgets.max_file_mb * (1 << 20)))
    except errors.InputError:
      raise
    except Exception as e:  # pylint: disable=broad-except
      logging.error("ingest: reading %s failed with %s (--debug shows where)", path,
                    type(e).__name__)
      if errors.debug():
        raise
      raise errors.InputError(f"{path}: could not be read as {name} ({type(e).__name__}); "
                              "export it again as a CSV table (UTF-8, one header line), or "
                              "remove it (every table is optional)") from None

  ranges = tables.value_ranges(data.value_ranges)
  labels = read("labels.csv", tables.read_labels, problems, tuple(data.classes), fold,
                dict(data.rename))
  analytes = list(data.analytes)
  labs = read("labs.csv", tables.read_labs, analytes, dict(data.rename), problems, ranges,
              fold, data.date_order) or tables.Labs(analytes, np.array([], object),
                                   np.zeros((0, len(analytes)), np.float32))
  channels = list(data.vitals_channels)
  vitals = read("vitals.csv", tables.read_vitals, channels, data.vitals_steps,
                data.vitals_hours_per_step, problems, ranges, fold,
                dict(data.rename), data.date_order) or tables.Vitals(
                    np.array([], object),
                    np.zeros((0, data.vitals_steps, len(channels)), np.float32), 0)
  return _Tables(labels, labs, vitals)


@dataclasses.dataclass
class _Linked:
  """The patients the manifest holds (raw ids, sorted), their classes, and the id counts."""
  patients: list[str]
  class_names: list[str]
  labels: np.ndarray     # class index per patient; -1 without labels.csv
  id_counts: dict
  splits: np.ndarray | None = None   # per patient, from labels.csv's split column


def _link(read: _Tables, files_by_patient: dict, classes, problems: tables.Problems,
          run_paths: paths.RunPaths) -> _Linked:
  """Patients with data and a label (every patient with data when there is no labels.csv); a
  label row without data is reported (the patients left out: `accounting.left_out`)."""
  labs_ids = read.labs.ids[~np.all(np.isnan(read.labs.values), axis=1)]
  vitals_ids = read.vitals.ids[~np.all(np.isnan(read.vitals.values), axis=(1, 2))]
  with_data = set(files_by_patient) | set(labs_ids) | set(vitals_ids)
  id_counts = {"labels": 0, "labs": len(labs_ids), "vitals": len(vitals_ids),
               "dicom": len(files_by_patient)}
  if read.labels is None:
    patients = sorted(with_data)
    return _Linked(patients, [], np.full(len(patients), -1, np.int32), id_counts)
  label_of = dict(zip(read.labels.ids.tolist(), read.labels.classes.tolist()))
  no_data = np.array([p not in with_data for p in read.labels.ids], bool)
  problems.extend([tables.Problem("labels.csv", int(line), "label for a patient with no data "
                                  "(no image, lab or vitals row); the patient is left out",
                                  patient=pid)
                   for line, pid in zip(read.labels.lines[no_data], read.labels.ids[no_data])])
  unlabeled = with_data - set(label_of)
  patients = sorted(with_data & set(label_of))
  # Unknown classes were set aside by read_labels when config.data.classes names them.
  class_names = list(classes) or sorted(set(label_of[p] for p in patients))
  class_index = {c: i for i, c in enumerate(class_names)}
  labels = np.array([class_index[label_of[p]] for p in patients], np.int32)
  id_counts.update(labels=len(label_of), labels_without_data=int(no_data.sum()),
                   data_without_label=len(unlabeled),
                   labs_without_label=len(set(labs_ids) - set(label_of)),
                   vitals_without_label=len(set(vitals_ids) - set(label_of)),
                   dicom_without_label=len(set(files_by_patient) - set(label_of)))
  if not patients and with_data:
    logging.warning("ingest: labels.csv links no patient with data; see %s",
                    run_paths.quarantine)
  splits = None
  if read.labels.splits is not None:
    split_of = dict(zip(read.labels.ids.tolist(), read.labels.splits.tolist()))
    splits = np.array([split_of[p] for p in patients], dtype="<U5")
  return _Linked(patients, class_names, labels, id_counts, splits)


# An id as a spreadsheet writes a long number it read from a cell: digits lost (1.23457E+11).
_SCIENTIFIC = re.compile(r"\d(\.\d+)?[eE]\+\d+")


def _count_id_spellings(read: _Tables, files_by_patient: dict) -> dict[str, int]:
  """Ids that may be one patient spelt two ways, kept apart but counted, each with a warning
  saying what to do: differing only by letter case; only by leading zeros (a spreadsheet drops
  them from an all-digit id: DICOM's 000123 is labs.csv's 123); written in scientific notation
  (a spreadsheet's 1.23457E+11, its digits lost)."""
  spellings = (set(read.labels.ids if read.labels is not None else ()) | set(read.labs.ids)
               | set(read.vitals.ids) | set(files_by_patient))
  twice = lambda keys: sum(1 for k in collections.Counter(keys).values() if k > 1)
  counts = {"ids_case_only_mismatch": twice(p.casefold() for p in spellings),
            "ids_leading_zeros_only_mismatch": twice(
                p.lstrip("0") or "0" for p in spellings if p.isascii() and p.isdigit()),
            "ids_in_scientific_notation": sum(1 for p in spellings if _SCIENTIFIC.fullmatch(p))}
  hints = {"ids_case_only_mismatch": "differ from another only by letter case; they are kept "
           "apart (set config.data.ids_case_insensitive=True if they are the same patients)",
           "ids_leading_zeros_only_mismatch": "differ from another only by leading zeros (a "
           "spreadsheet drops them: 000123 and 123); they are kept apart (export the ids as "
           "text, or restore the zeros, if they are the same patients)",
           "ids_in_scientific_notation": "are written in scientific notation (1.23E+11: a "
           "spreadsheet wrote a long number, its digits are lost); export the ids as text"}
  for key, n in counts.items():
    if n:
      logging.warning("ingest: %d patient ids %s", n, hints[key])
  return counts


def _split(linked: _Linked, record_ids: np.ndarray, data, seed: int) -> np.ndarray:
  """Each patient's split: labels.csv's split column's where it has one (a cohort's own split),
  else `stratified_split` by config.data.split."""
  if linked.splits is None:
    return stratified_split(linked.labels, record_ids, tuple(data.split), seed)
  counts = {s: int(np.sum(linked.splits == s)) for s in manifest_lib.SPLITS}
  logging.info("ingest: the split is labels.csv's split column's (config.data.split is not "
               "used): %s", ", ".join(f"{s} {k}" for s, k in counts.items()))
  if not counts["train"]:
    raise errors.InputError("labels.csv: its split column puts none of the patients ingest "
                            "kept in 'train'; give some 'train', or drop the column to let "
                            "config.data.split decide")
  return linked.splits


def _assemble(linked: _Linked, read: _Tables, files_by_patient: dict, data, salt: bytes,
              seed: int) -> tuple[manifest_lib.Manifest, dict[str, np.ndarray]]:
  """The manifest (pseudonymous ids, labels, modalities, image files, cost, split) and the
  tables' arrays in its row order, with their training-split normalisers."""
  patients = linked.patients
  record_ids = np.array([pseudonym(p, salt) for p in patients], dtype=object).astype(str)
  if len(set(record_ids)) != len(record_ids):
    raise RuntimeError("ingest: two PatientIDs hash to the same record id; use a longer id")
  n, analytes, channels = len(patients), read.labs.analytes, list(data.vitals_channels)
  row_of = {p: i for i, p in enumerate(patients)}
  labs = np.full((n, len(analytes)), np.nan, np.float32)
  rows = np.array([row_of.get(p, -1) for p in read.labs.ids], np.int64)
  labs[rows[rows >= 0]] = read.labs.values[rows >= 0]
  vitals = np.full((n, data.vitals_steps, len(channels)), np.nan, np.float32)
  rows = np.array([row_of.get(p, -1) for p in read.vitals.ids], np.int64)
  vitals[rows[rows >= 0]] = read.vitals.values[rows >= 0]
  image_files, num_images = [], np.zeros(n, np.int32)
  for i, pid in enumerate(patients):
    files = sorted(files_by_patient.get(pid, []))
    image_files.append([f for f, _ in files])
    num_images[i] = sum(frames for _, frames in files)
  mask = np.stack([num_images > 0, ~np.all(np.isnan(labs), axis=1),
                   ~np.all(np.isnan(vitals), axis=(1, 2))], axis=1)
  split = _split(linked, record_ids, data, seed)
  manifest = manifest_lib.Manifest(
      record_ids=record_ids, labels=linked.labels, modality_mask=mask, num_images=num_images,
      cost=manifest_lib.expected_cost(mask, num_images), split=split, image_files=image_files,
      class_names=linked.class_names)
  train = manifest.indices("train")
  labs_mean, labs_std = _normalizer(labs, train)
  vitals_mean, vitals_std = _normalizer(vitals, train)
  # On disk and in memory, a missing value is a mask's False over a 0, never a NaN.
  return manifest, dict(record_ids=record_ids, labs=np.nan_to_num(labs, nan=0.0),
                        labs_mask=~np.isnan(labs), analytes=np.array(analytes),
                        labs_mean=labs_mean, labs_std=labs_std,
                        vitals=np.nan_to_num(vitals, nan=0.0), vitals_mask=~np.isnan(vitals),
                        channels=np.array(channels), vitals_mean=vitals_mean,
                        vitals_std=vitals_std)


def _check_finite(table_arrays: dict[str, np.ndarray]) -> None:
  """Every number tables.npz holds is finite: the readers set whatever is not (or is beyond
  float32, or implausible) to missing, with a quarantine row. Anything else is a bug."""
  for key, value in table_arrays.items():
    if value.dtype.kind == "f" and not np.isfinite(value).all():
      raise RuntimeError(f"ingest: tables.npz's {key!r} holds {int((~np.isfinite(value)).sum())} "
                         "non-finite values (a bug in medjax: the readers set them to missing)")


def _write_ceiling(oracle_path, path, manifest, patients, salt, fold_case=False):
  """ceiling.npz: the oracle's posterior of the test records, in the manifest's classes; none
  (with a warning) when the oracle does not cover them, e.g. a class or patient added to the
  synthetic cohort's tables by hand: a partial ceiling would compare unlike things."""
  with np.load(oracle_path, allow_pickle=False) as f:
    oracle_ids = tables.normalize_ids([str(p) for p in f["patient_id"]], fold_case).tolist()
    posterior = f["posterior"]
    oracle_classes = [str(c) for c in f["class_names"]]
  row = {pid: i for i, pid in enumerate(oracle_ids)}
  test = manifest.indices("test")
  unknown = [c for c in manifest.class_names if c not in oracle_classes]
  missing = sum(1 for i in test if patients[i] not in row)
  if unknown or missing:
    logging.warning("ingest: oracle.npz covers %d of the %d classes and %d of the %d test "
                    "records; no Bayes ceiling for this cohort", len(manifest.class_names) -
                    len(unknown), len(manifest.class_names), len(test) - missing, len(test))
    if os.path.exists(path):
      os.remove(path)
    return
  columns = [oracle_classes.index(c) for c in manifest.class_names]
  np.savez(path, record_ids=manifest.record_ids[test],
           posterior=posterior[[row[patients[i]] for i in test]][:, columns])


def _write_jsonl(path, rows):
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    for r in rows:
      f.write(json.dumps(r) + "\n")
  os.replace(tmp, path)


