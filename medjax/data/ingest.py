"""Ingest: a cohort directory -> manifest, tables, quarantine report and summary.

Input layout under `config.data.root` (each table optional):
  dicom/**      DICOM files (any names, any folders), linked to patients only by PatientID
  labs.csv      wide (one column per analyte) or long (patient_id, analyte, value)
  vitals.csv    long: patient_id, hour (or an ISO timestamp), one column per channel
  labels.csv    patient_id, diagnosis
  oracle.npz    optional, synthetic cohorts only: the exact Bayes posterior per patient

Output under `<workdir>/ingest/`: manifest.jsonl, tables.npz, quarantine.jsonl, summary.json,
and ceiling.npz for synthetic cohorts. Every input DICOM file is either referenced by the manifest
or listed in the quarantine report with its reason. Raw PatientIDs never leave this module: rows
are keyed by a salted hash, and the salt stays in a private file.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import hashlib
import hmac
import json
import logging
import os
import secrets
import time

import numpy as np

from medjax import jsonl
from medjax import paths
from medjax import secretfile
from medjax.data import dicom
from medjax.data import manifest as manifest_lib
from medjax.data import tables

ID_PREFIX = "r-"


@dataclasses.dataclass
class Ingested:
  """What ingest produced (also on disk under `<workdir>/ingest/`)."""
  manifest: manifest_lib.Manifest
  tables: dict[str, np.ndarray]
  quarantine: list[dict]
  summary: dict


def load_or_create_salt(path: str) -> bytes:
  """The pseudonymisation salt: created once (owner-only permissions), then reused.

  Reusing it keeps record ids, and so caches and checkpoints' lineage, stable across runs.
  """
  salt = secretfile.read_or_create(path, lambda: secrets.token_bytes(32))
  if len(salt) < 16:
    raise ValueError(f"{path}: salt file holds {len(salt)} bytes, expected at least 16; "
                     "delete it to make a new one (record ids will change)")
  return salt


def pseudonym(patient_id: str, salt: bytes) -> str:
  """Salted hash of a PatientID: stable for one salt, not reversible without it."""
  return ID_PREFIX + hmac.new(salt, patient_id.encode(), hashlib.sha256).hexdigest()[:20]


def _scan_one(args: tuple[str, str]) -> tuple[str, dicom.Header | None, str | None]:
  root, rel = args
  try:
    return rel, dicom.read_header(os.path.join(root, rel)), None
  except dicom.RejectedFile as e:
    return rel, None, e.reason


def scan_dicom(dicom_root: str, workers: int = 0) -> tuple[list[tuple[str, dicom.Header]],
                                                            list[dict]]:
  """Reads every file's header (no pixels). Returns (accepted, quarantine entries)."""
  rels = []
  for dirpath, _, filenames in os.walk(dicom_root):
    for name in filenames:
      rels.append(os.path.relpath(os.path.join(dirpath, name), dicom_root))
  rels.sort()
  workers = workers or os.cpu_count() or 1
  jobs = [(dicom_root, r) for r in rels]
  if workers > 1 and len(rels) > 500:
    with concurrent.futures.ProcessPoolExecutor(workers) as pool:
      results = list(pool.map(_scan_one, jobs, chunksize=64))
  else:
    results = [_scan_one(j) for j in jobs]
  accepted, rejected = [], []
  for rel, header, reason in results:
    if header is None:
      rejected.append({"path": os.path.join("dicom", rel), "stage": "scan", "reason": reason})
    else:
      accepted.append((rel, header))
  return accepted, rejected


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

  dicom_root = os.path.join(root, "dicom")
  headers, quarantine = (scan_dicom(dicom_root, data.scan_workers) if os.path.isdir(dicom_root)
                         else ([], []))
  scan_s = time.perf_counter() - t0
  logging.info("ingest: scanned %d DICOM files in %.1f s (%d rejected)",
               len(headers) + len(quarantine), scan_s, len(quarantine))

  def table(name):
    path = os.path.join(root, name)
    return path if os.path.exists(path) else None

  labels_raw, label_lines = ({}, {})
  if table("labels.csv"):
    labels_raw, label_lines = tables.read_labels(table("labels.csv"), problems)
  analytes = list(data.analytes)
  labs_raw: dict[str, np.ndarray] = {}
  if table("labs.csv"):
    analytes, labs_raw = tables.read_labs(table("labs.csv"), analytes, dict(data.rename),
                                          problems)
  channels = list(data.vitals_channels)
  vitals_raw: dict[str, np.ndarray] = {}
  vitals_late = 0
  if table("vitals.csv"):
    vitals_raw, vitals_late = tables.read_vitals(table("vitals.csv"), channels, data.vitals_steps,
                                                 data.vitals_hours_per_step, problems)

  files_by_patient: dict[str, list[tuple[str, int]]] = collections.defaultdict(list)
  for rel, header in headers:
    files_by_patient[header.patient_id].append((os.path.join("dicom", rel), header.frames))
  labs_raw = {p: v for p, v in labs_raw.items() if not np.all(np.isnan(v))}
  vitals_raw = {p: v for p, v in vitals_raw.items() if not np.all(np.isnan(v))}
  with_data = set(files_by_patient) | set(labs_raw) | set(vitals_raw)

  if labels_raw:
    for line in sorted(label_lines[p] for p in set(labels_raw) - with_data):
      problems.report("labels.csv", line, "label for a patient with no data (no image, lab or "
                      "vitals row); the patient is left out")
    unlabeled = sorted(with_data - set(labels_raw))
    for pid in unlabeled:
      for path, _ in files_by_patient.get(pid, []):
        quarantine.append({"path": path, "stage": "link",
                           "reason": "its PatientID has no row in labels.csv"})
    if unlabeled:
      # Not an error in a table: the patients' rows are simply not used. Counted, never named.
      quarantine.append({"path": "labels.csv", "line": 0, "stage": "link",
                         "reason": f"{len(unlabeled)} patients with data have no label; their "
                                   "images and table rows are left out"})
    patients = sorted(with_data & set(labels_raw))
    class_names = list(data.classes) or sorted(set(labels_raw[p] for p in patients))
    unknown = sorted(set(labels_raw[p] for p in patients) - set(class_names))
    if unknown:
      raise tables.TableError(f"labels.csv: classes {unknown[:5]} not in config.data.classes "
                              f"({len(class_names)} names); add them or leave it empty")
    class_index = {c: i for i, c in enumerate(class_names)}
    labels = np.array([class_index[labels_raw[p]] for p in patients], np.int32)
  else:
    patients = sorted(with_data)
    class_names = []
    labels = np.full(len(patients), -1, np.int32)

  record_ids = np.array([pseudonym(p, salt) for p in patients], dtype=object).astype(str)
  if len(set(record_ids)) != len(record_ids):
    raise RuntimeError("ingest: two PatientIDs hash to the same record id; use a longer id")
  n, steps = len(patients), data.vitals_steps
  labs = np.full((n, len(analytes)), np.nan, np.float32)
  vitals = np.full((n, steps, len(channels)), np.nan, np.float32)
  image_files, num_images = [], np.zeros(n, np.int32)
  for i, pid in enumerate(patients):
    if pid in labs_raw:
      labs[i] = labs_raw[pid]
    if pid in vitals_raw:
      vitals[i] = vitals_raw[pid]
    files = sorted(files_by_patient.get(pid, []))
    image_files.append([f for f, _ in files])
    num_images[i] = sum(frames for _, frames in files)
  mask = np.stack([num_images > 0, ~np.all(np.isnan(labs), axis=1),
                   ~np.all(np.isnan(vitals), axis=(1, 2))], axis=1)
  split = stratified_split(labels, record_ids, tuple(data.split), config.seed)
  manifest = manifest_lib.Manifest(
      record_ids=record_ids, labels=labels, modality_mask=mask, num_images=num_images,
      cost=manifest_lib.expected_cost(mask, num_images), split=split, image_files=image_files,
      class_names=class_names)

  train = manifest.indices("train")
  labs_mean, labs_std = _normalizer(labs, train)
  vitals_mean, vitals_std = _normalizer(vitals, train)
  table_arrays = dict(record_ids=record_ids, labs=labs, analytes=np.array(analytes),
                      labs_mean=labs_mean, labs_std=labs_std, vitals=vitals,
                      channels=np.array(channels), vitals_mean=vitals_mean, vitals_std=vitals_std)
  quarantine.extend(p.as_dict() for p in problems.items)

  manifest.save(run_paths.manifest)
  np.savez(run_paths.tables, **table_arrays)
  _write_jsonl(run_paths.quarantine, quarantine)
  oracle = os.path.join(root, "oracle.npz")
  if os.path.exists(oracle):
    _write_ceiling(oracle, run_paths.ceiling, manifest, patients, salt)
  summary = summarize(manifest, quarantine, len(headers) + sum(
      1 for q in quarantine if q["stage"] == "scan"), scan_s, vitals_late)
  summary["seconds"] = round(time.perf_counter() - t0, 3)
  with open(run_paths.ingest_summary, "w") as f:
    json.dump(summary, f, indent=2)
  return Ingested(manifest, table_arrays, quarantine, summary)


def load(workdir: str) -> Ingested:
  """Reads back what `run` wrote."""
  run_paths = paths.RunPaths(workdir)
  manifest = manifest_lib.Manifest.load(run_paths.manifest)
  with np.load(run_paths.tables) as f:
    table_arrays = dict(f)
  if not np.array_equal(table_arrays["record_ids"], manifest.record_ids):
    raise RuntimeError(f"{run_paths.ingest}: tables.npz and manifest.jsonl disagree on record "
                       "ids; run the ingest again (--config.mode=ingest)")
  quarantine = jsonl.read(run_paths.quarantine)
  with open(run_paths.ingest_summary) as f:
    summary = json.load(f)
  return Ingested(manifest, table_arrays, quarantine, summary)


def load_ceiling(workdir: str) -> dict[str, np.ndarray] | None:
  """The Bayes posterior of the test records (synthetic cohorts), or None."""
  path = paths.RunPaths(workdir).ceiling
  if not os.path.exists(path):
    return None
  with np.load(path) as f:
    return dict(f)


def _write_ceiling(oracle_path, path, manifest, patients, salt):
  with np.load(oracle_path, allow_pickle=False) as f:
    oracle_ids, posterior = [str(p) for p in f["patient_id"]], f["posterior"]
    oracle_classes = [str(c) for c in f["class_names"]]
  row = {pid: i for i, pid in enumerate(oracle_ids)}
  columns = [oracle_classes.index(c) for c in manifest.class_names]
  test = manifest.indices("test")
  keep = [i for i in test if patients[i] in row]
  np.savez(path, record_ids=manifest.record_ids[keep],
           posterior=posterior[[row[patients[i]] for i in keep]][:, columns])


def _write_jsonl(path, rows):
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    for r in rows:
      f.write(json.dumps(r) + "\n")
  os.replace(tmp, path)


def summarize(manifest, quarantine, files_seen: int, scan_s: float, vitals_late: int) -> dict:
  """Counts for the ingest report: patients, modality groups, missingness, classes, quarantine."""
  mask = manifest.modality_mask
  groups = collections.Counter(manifest_lib.group_name(m) for m in mask)
  n = max(len(manifest), 1)
  reasons = collections.Counter(q["reason"].split(":")[0][:60] for q in quarantine)
  return {
      "patients": len(manifest),
      "splits": {s: int(np.sum(manifest.split == s)) for s in manifest_lib.SPLITS},
      "groups": {g: groups.get(g, 0) for g in manifest_lib.group_names()},
      "missing": {"images": round(float(np.mean(~mask[:, 0])) if len(manifest) else 0, 4),
                  "labs": round(float(np.mean(~mask[:, 1])) if len(manifest) else 0, 4),
                  "vitals": round(float(np.mean(~mask[:, 2])) if len(manifest) else 0, 4)},
      "images": int(manifest.num_images.sum()),
      "images_per_patient_with_images": round(
          float(manifest.num_images[mask[:, 0]].mean()) if mask[:, 0].any() else 0.0, 3),
      "classes": {c: int(np.sum(manifest.labels == i))
                  for i, c in enumerate(manifest.class_names)},
      "dicom_files": files_seen,
      "scan_files_per_s": round(files_seen / scan_s, 1) if scan_s > 0 else None,
      "quarantined": len(quarantine),
      "quarantine_reasons": dict(reasons.most_common()),
      "vitals_rows_past_last_step": vitals_late,
      "records_per_group_fraction": {g: round(c / n, 4) for g, c in groups.items()},
  }


def format_summary(summary: dict) -> str:
  """The ingest summary as a plain-text table for the terminal and logs."""
  lines = [f"patients {summary['patients']}  (train {summary['splits']['train']}, "
           f"val {summary['splits']['val']}, test {summary['splits']['test']})",
           f"DICOM files {summary['dicom_files']}, images {summary['images']}, "
           f"quarantined {summary['quarantined']}",
           "modality group   patients",
           *[f"  {g:<14} {c:>8}" for g, c in summary["groups"].items()],
           "missing          fraction",
           *[f"  {m:<14} {v:>8.3f}" for m, v in summary["missing"].items()]]
  classes = sorted(summary["classes"].items(), key=lambda kv: -kv[1])
  if classes:
    lines.append(f"classes {len(classes)}: largest "
                 + ", ".join(f"{c} {k}" for c, k in classes[:3]) + "; smallest "
                 + ", ".join(f"{c} {k}" for c, k in classes[-3:]))
  if summary["quarantine_reasons"]:
    lines.append("quarantine reasons")
    lines += [f"  {k:>5}  {r}" for r, k in summary["quarantine_reasons"].items()]
  return "\n".join(lines)
