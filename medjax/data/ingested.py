"""What ingest wrote under `<workdir>/ingest/`, read back and checked.

Apart from `medjax.data.ingest` so that a run reusing its ingest (the launcher's check, every
worker and standby, every restart) imports neither pandas nor the table and DICOM readers that
only an ingest needs: ~0.3 s of every process start on 2 cores.

Every file is checked for the shape ingest writes, not only for being readable: a manifest row
whose label is "3" or whose image_files is a string, a table of another dtype or length than the
manifest's, a summary that is not ingest's. Anything else is one line naming the file and what is
wrong, saying to ingest again (exit code 2), instead of an internal error later.
"""

from __future__ import annotations

import dataclasses
import json
import os
import zipfile

import numpy as np

from medjax import errors
from medjax import jsonl
from medjax import paths
from medjax import schema
from medjax.data import manifest as manifest_lib

REDO = ("run the ingest again: --config.data.reingest=True (record ids stay the same with the "
        "same salt)")


@dataclasses.dataclass
class Ingested:
  """What ingest produced (also on disk under `<workdir>/ingest/`)."""
  manifest: manifest_lib.Manifest
  tables: dict[str, np.ndarray]
  quarantine: list[dict]
  summary: dict


def load(workdir: str) -> Ingested:
  """Reads back what `medjax.data.ingest.run` wrote, checked (see the module docstring).

  Raises:
    errors.InputError: a file is missing, unreadable or not of the shape ingest writes.
  """
  run_paths = paths.RunPaths(workdir)

  def damaged(path: str, what: str) -> errors.InputError:
    return errors.InputError(f"{path} is damaged ({what}); {REDO}")

  reading = run_paths.ingest
  try:
    reading = run_paths.manifest
    manifest = _manifest(run_paths.manifest)
    reading = run_paths.tables
    with np.load(run_paths.tables, allow_pickle=False) as f:
      table_arrays = dict(f)
    reading = run_paths.quarantine
    quarantine = schema.check(jsonl.read(run_paths.quarantine), _QUARANTINE)
    reading = run_paths.ingest_summary
    with open(run_paths.ingest_summary) as f:
      summary = schema.check(json.load(f), _SUMMARY)
  except schema.SchemaError as e:
    raise damaged(reading, str(e)) from None
  except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile) as e:
    raise errors.InputError(f"{run_paths.ingest} is damaged or incomplete ({type(e).__name__}: "
                            f"{' '.join(str(e).split())[:120]}); {REDO}") from e
  problem = _tables_problem(table_arrays, manifest)
  if problem:
    raise errors.InputError(f"{run_paths.tables} is damaged or not manifest.jsonl's ({problem}); "
                            f"{REDO}")
  if summary["patients"] != len(manifest):
    raise errors.InputError(f"{run_paths.ingest_summary} is damaged or not manifest.jsonl's "
                            f"({summary['patients']} patients, the manifest {len(manifest)}); "
                            f"{REDO}")
  return Ingested(manifest, table_arrays, quarantine, summary)


def load_ceiling(workdir: str) -> dict[str, np.ndarray] | None:
  """The Bayes posterior of the test records (synthetic cohorts), or None."""
  path = paths.RunPaths(workdir).ceiling
  if not os.path.exists(path):
    return None
  try:
    with np.load(path, allow_pickle=False) as f:
      ceiling = dict(f)
    ids, posterior = ceiling["record_ids"], ceiling["posterior"]
  except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
    raise errors.InputError(f"{path} is damaged ({type(e).__name__}); {REDO}") from e
  if (ids.dtype.kind != "U" or ids.ndim != 1 or posterior.dtype.kind != "f"
      or posterior.ndim != 2 or len(posterior) != len(ids)):
    raise errors.InputError(f"{path} is damaged (record_ids {ids.dtype}{list(ids.shape)}, "
                            f"posterior {posterior.dtype}{list(posterior.shape)}); {REDO}")
  return ceiling


# -- manifest.jsonl ------------------------------------------------------------------------------

# Its first line (`Manifest.save`), then one row per patient.
_HEADER = schema.Object({"class_names": schema.List(schema.Str(nonempty=True))})
_MODALITIES = schema.Satisfies(
    schema.STR, lambda m: m == manifest_lib.group_name([c in m for c in manifest_lib.MODALITIES]),
    "a modality group ('ILV', 'IL', ..., 'V')")
_ROW = schema.Object({
    "id": schema.Str(nonempty=True), "label": schema.Int(min=-1),
    "label_name": schema.Nullable(schema.STR), "modalities": _MODALITIES,
    "num_images": schema.COUNT, "image_files": schema.List(schema.Str(nonempty=True)),
    "cost_ms": schema.Num(min=0), "split": schema.OneOf(*manifest_lib.SPLITS)})


def _manifest(path: str) -> manifest_lib.Manifest:
  """`Manifest.load`, with the header and every row checked (`_HEADER`, `_ROW`) before a value
  is converted (numpy would read a label "3" as 3, and list() a file name as its letters).

  Raises:
    schema.SchemaError: naming the line and the field.
  """
  with open(path) as f:
    numbered = [(i, line) for i, line in enumerate(f, start=1) if line.strip()]
  if not numbered:
    raise schema.SchemaError("", "is empty")
  values = [json.loads(line) for _, line in numbered]   # (not JSON: a ValueError, as before)
  header = schema.check(values[0], _HEADER, "line 1")
  rows = values[1:]
  try:
    columns = {key: [r[key] for r in rows] for key in _ROW.required}
  except (KeyError, TypeError, IndexError):
    columns = None
  if columns is None or not _columns_look_right(columns):
    # Checked whole columns at a time above (the paper's 53,420 rows); row by row only to say
    # which line is wrong.
    for (i, _), row in zip(numbered[1:], rows):
      schema.check(row, _ROW, f"line {i}")
  labels = np.array(columns["label"], dtype=np.int64)
  if len(labels) and labels.max() >= len(header["class_names"]):
    i = numbered[1 + int(labels.argmax())][0]
    raise schema.SchemaError(f"line {i}.label", f"is {labels.max()}, past the "
                             f"{len(header['class_names'])} class names of line 1")
  if len(set(columns["id"])) != len(rows):
    first: dict[str, int] = {}
    for (i, _), rid in zip(numbered[1:], columns["id"]):
      if rid in first:
        raise schema.SchemaError(f"line {i}.id", f"repeats the record id of line {first[rid]}")
      first[rid] = i
  masks = {g: [m in g for m in manifest_lib.MODALITIES] for g in set(columns["modalities"])}
  return manifest_lib.Manifest(
      record_ids=np.array(columns["id"], dtype=object).astype(str),
      labels=labels.astype(np.int32),
      modality_mask=np.array([masks[g] for g in columns["modalities"]],
                             dtype=bool).reshape(-1, 3),
      num_images=np.array(columns["num_images"], dtype=np.int32),
      cost=np.array(columns["cost_ms"], dtype=np.float32),
      split=np.array(columns["split"], dtype="<U5"),
      image_files=[list(files) for files in columns["image_files"]],
      class_names=list(header["class_names"]))


def _types(column: list) -> set:
  return set(map(type, column))


def _columns_look_right(columns: dict[str, list]) -> bool:
  """Whether every row is a `_ROW`, checked a column at a time (False: the caller checks row by
  row, to name the first wrong one)."""
  wanted = {"id": {str}, "label": {int}, "label_name": {str, type(None)}, "modalities": {str},
            "num_images": {int}, "image_files": {list}, "cost_ms": {int, float},
            "split": {str}}
  if any(_types(columns[key]) - types for key, types in wanted.items()):
    return False
  every_file = [f for files in columns["image_files"] for f in files]
  if _types(every_file) - {str} or not all(every_file) or not all(columns["id"]):
    return False
  if not all(_MODALITIES.test(g) for g in set(columns["modalities"])):
    return False
  if set(columns["split"]) - set(manifest_lib.SPLITS):
    return False
  if columns["label"] and (min(columns["label"]) < -1 or min(columns["num_images"]) < 0):
    return False
  costs_N = np.asarray(columns["cost_ms"], np.float64)
  return bool(np.isfinite(costs_N).all() and (costs_N >= 0).all())


# -- tables.npz, quarantine.jsonl, summary.json -------------------------------------------------

def _tables_problem(tables: dict[str, np.ndarray], manifest: manifest_lib.Manifest) -> str:
  """What is wrong with tables.npz given the manifest ('' : nothing): the arrays ingest writes
  (`ingest._assemble`), of their dtypes, with one row per manifest row, in its order."""
  n = len(manifest)
  names = {"record_ids": "U", "analytes": "U", "channels": "U"}
  floats = ("labs", "labs_mean", "labs_std", "vitals", "vitals_mean", "vitals_std")
  masks = ("labs_mask", "vitals_mask")
  missing = [k for k in (*names, *floats, *masks) if k not in tables]
  if missing:
    return f"no {missing[0]!r} array"
  for key, kind in names.items():
    if tables[key].dtype.kind != kind or tables[key].ndim != 1:
      return f"{key!r} is {tables[key].dtype}{list(tables[key].shape)}, not a list of strings"
  for key, dtype in [*((k, np.float32) for k in floats), *((k, np.bool_) for k in masks)]:
    if tables[key].dtype != dtype:
      return f"{key!r} is {tables[key].dtype}, not {np.dtype(dtype)}"
  a, c = len(tables["analytes"]), len(tables["channels"])
  vitals = tables["vitals"]
  if vitals.ndim != 3 or vitals.shape[0] != n or vitals.shape[2] != c:
    return (f"'vitals' has shape {list(vitals.shape)}, not [{n}, steps, {c}] ({n} manifest rows, "
            f"{c} vitals channels)")
  wanted = {"labs": (n, a), "labs_mask": (n, a), "labs_mean": (a,), "labs_std": (a,),
            "vitals_mask": vitals.shape, "vitals_mean": (c,), "vitals_std": (c,)}
  for key, shape in wanted.items():
    if tables[key].shape != shape:
      return (f"{key!r} has shape {list(tables[key].shape)}, not {list(shape)} ({n} manifest "
              f"rows, {a} analytes, {c} vitals channels)")
  if not np.array_equal(tables["record_ids"], manifest.record_ids):
    return "its record ids are not the manifest's, in its order"
  for key in floats:   # a missing value is a mask's False over a 0, never a NaN
    if not np.isfinite(tables[key]).all():
      return f"{key!r} holds non-finite values"
  if (tables["labs_std"] <= 0).any() or (tables["vitals_std"] <= 0).any():
    return "a normaliser's std is not positive"
  return ""


_QUARANTINE = schema.List(schema.Object({"stage": schema.STR, "reason": schema.STR}))
# summary.json (`ingest_summary.summarize`): what `ingest_summary.format_summary` reads.
_SUMMARY = schema.Object({
    "patients": schema.COUNT,
    "splits": schema.Object({s: schema.COUNT for s in manifest_lib.SPLITS}),
    "groups": schema.Map(schema.COUNT), "missing": schema.Map(schema.Num(min=0)),
    "images": schema.COUNT, "classes": schema.Map(schema.COUNT), "dicom_files": schema.COUNT,
    "quarantined": schema.COUNT, "quarantine_reasons": schema.Map(schema.COUNT)},
    optional={"tables": schema.Map(schema.ANY)})
