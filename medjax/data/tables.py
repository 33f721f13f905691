"""Reading the clinical tables: labels, lab panels and vital-sign series.

Each reader returns values keyed by the raw PatientID (ingest hashes them right away) and reports
every malformed row or value through `Problems`, which either raises at once (`on_error='raise'`)
or sets the row or value aside with its file, line and reason (`on_error='quarantine'`). Reasons
name lines, columns and values, never patient identifiers.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime
import math
import os
from typing import Iterator, Sequence

import numpy as np

PATIENT_COLUMNS = ("patient_id", "patientid", "patient", "mrn")
LABEL_COLUMNS = ("diagnosis", "label", "class")
TIME_COLUMNS = ("hour", "hours", "time", "timestamp", "charttime")


class TableError(ValueError):
  """A malformed table row or value, when the config asks to stop on bad input."""


@dataclasses.dataclass(frozen=True)
class Problem:
  source: str
  line: int
  reason: str

  def as_dict(self) -> dict:
    return {"path": self.source, "line": self.line, "stage": "tables", "reason": self.reason}


class Problems:
  """Collects set-aside rows and values, or raises on the first one."""

  def __init__(self, on_error: str):
    if on_error not in ("raise", "quarantine"):
      raise ValueError(f"config.data.on_error={on_error!r}: use 'raise' or 'quarantine'")
    self.on_error = on_error
    self.items: list[Problem] = []

  def report(self, source: str, line: int, reason: str) -> None:
    if self.on_error == "raise":
      raise TableError(f"{source}:{line}: {reason} (set config.data.on_error='quarantine' to set "
                       "such rows aside and go on)")
    self.items.append(Problem(source, line, reason))


def _rows(path: str) -> Iterator[tuple[int, dict[str, str]]]:
  """(line number, row) pairs; the header is line 1. Column names are stripped."""
  with open(path, newline="") as f:
    reader = csv.reader(f)
    try:
      header = [h.strip() for h in next(reader)]
    except StopIteration:
      return
    for lineno, values in enumerate(reader, start=2):
      if not any(v.strip() for v in values):
        continue
      yield lineno, dict(zip(header, (v.strip() for v in values)))


def _header(path: str) -> list[str]:
  with open(path, newline="") as f:
    return [h.strip() for h in next(csv.reader(f), [])]


def _find_column(path: str, header: Sequence[str], names: Sequence[str], what: str) -> str:
  lower = {h.lower(): h for h in header}
  for name in names:
    if name in lower:
      return lower[name]
  raise TableError(f"{path}: no {what} column; expected one of {list(names)}, found {list(header)}")


def _number(text: str) -> float | None:
  """float(text), or None when it is not a finite number."""
  try:
    value = float(text)
  except ValueError:
    return None
  return value if math.isfinite(value) else None


def _cell(row: dict[str, str], column: str, problems: Problems, source: str, lineno: int,
          absent: str) -> float | None:
  """A numeric cell's value; None when it is empty or (reported as `absent`) not a number."""
  text = row.get(column, "")
  if not text:
    return None
  number = _number(text)
  if number is None:
    problems.report(source, lineno, f"column {column!r}: value {text!r} is not a number; it is "
                    f"treated as {absent}")
  return number


def read_labels(path: str, problems: Problems) -> tuple[dict[str, str], dict[str, int]]:
  """labels.csv: (patient -> class name, patient -> line) (columns `patient_id`, `diagnosis`)."""
  source = os.path.basename(path)
  header = _header(path)
  pid_col = _find_column(path, header, PATIENT_COLUMNS, "patient id")
  label_col = _find_column(path, header, LABEL_COLUMNS, "label")
  labels: dict[str, str] = {}
  lines: dict[str, int] = {}
  for lineno, row in _rows(path):
    pid, label = row.get(pid_col, ""), row.get(label_col, "")
    if not pid or not label:
      problems.report(source, lineno, f"empty {pid_col!r} or {label_col!r}")
    elif pid in labels:
      problems.report(source, lineno, "duplicate patient row (an earlier line has this patient)")
    else:
      labels[pid], lines[pid] = label, lineno
  return labels, lines


def read_labs(path: str, analytes: Sequence[str], rename: dict[str, str],
              problems: Problems) -> tuple[list[str], dict[str, np.ndarray]]:
  """labs.csv, wide (one column per analyte) or long (`analyte`, `value` columns).

  Args:
    path: the CSV file.
    analytes: the expected analyte names, in model order; empty to take them from the file.
    rename: file column or analyte name -> analyte name.
    problems: where malformed rows and values go.

  Returns:
    (analyte names, patient -> float32 (L,) values with NaN for not measured).
  """
  source = os.path.basename(path)
  header = _header(path)
  pid_col = _find_column(path, header, PATIENT_COLUMNS, "patient id")
  lower = [h.lower() for h in header]
  if "analyte" in lower and "value" in lower:
    return _read_labs_long(path, header, pid_col, analytes, rename, problems)
  columns = [h for h in header if h != pid_col and h.lower() not in ("date", "time", "timestamp")]
  names = [rename.get(c, c) for c in columns]
  if not analytes:
    analytes = names
  index = {a: i for i, a in enumerate(analytes)}
  col_index = {}
  for column, name in zip(columns, names):
    if name in index:
      col_index[column] = index[name]
    else:
      problems.report(source, 1, f"column {column!r} not in config.data.analytes "
                      f"({len(analytes)} names); add it or map it with config.data.rename; "
                      "its values are ignored")
  values: dict[str, np.ndarray] = {}
  for lineno, row in _rows(path):
    pid = row.get(pid_col, "")
    if not pid:
      problems.report(source, lineno, f"empty {pid_col!r}")
      continue
    if pid in values:
      problems.report(source, lineno, "duplicate patient row (an earlier line has this patient); "
                      "this row is set aside")
      continue
    v = np.full(len(analytes), np.nan, np.float32)
    for column, j in col_index.items():
      number = _cell(row, column, problems, source, lineno, "not measured")
      if number is not None:
        v[j] = number
    values[pid] = v
  return list(analytes), values


def _read_labs_long(path, header, pid_col, analytes, rename, problems):
  source = os.path.basename(path)
  lower = {h.lower(): h for h in header}
  analyte_col, value_col = lower["analyte"], lower["value"]
  rows = list(_rows(path))
  if not analytes:
    analytes = sorted({rename.get(r[analyte_col], r[analyte_col]) for _, r in rows})
  index = {a: i for i, a in enumerate(analytes)}
  values: dict[str, np.ndarray] = {}
  seen: set[tuple[str, int]] = set()
  for lineno, row in rows:
    pid, name, text = row.get(pid_col, ""), row.get(analyte_col, ""), row.get(value_col, "")
    name = rename.get(name, name)
    if not pid:
      problems.report(source, lineno, f"empty {pid_col!r}")
      continue
    if name not in index:
      problems.report(source, lineno, f"analyte {name!r} not in config.data.analytes "
                      f"({len(analytes)} names); add it or map it with config.data.rename")
      continue
    number = _number(text) if text else None
    if number is None:
      if text:
        problems.report(source, lineno, f"analyte {name!r}: value {text!r} is not a number")
      continue
    if (pid, index[name]) in seen:
      problems.report(source, lineno, f"duplicate value for analyte {name!r} (an earlier line has "
                      "it for this patient); this row is set aside")
      continue
    seen.add((pid, index[name]))
    values.setdefault(pid, np.full(len(analytes), np.nan, np.float32))[index[name]] = number
  return list(analytes), values


def _hours(text: str) -> float | None:
  """A time cell as hours: a number of hours, or an ISO 8601 timestamp (hours since the epoch)."""
  number = _number(text)
  if number is not None:
    return number
  try:
    stamp = datetime.datetime.fromisoformat(text)
  except ValueError:
    return None
  if stamp.tzinfo is None:
    stamp = stamp.replace(tzinfo=datetime.timezone.utc)
  return stamp.timestamp() / 3600.0


def read_vitals(path: str, channels: Sequence[str], steps: int, hours_per_step: float,
                problems: Problems) -> tuple[dict[str, np.ndarray], int]:
  """vitals.csv, long: one row per patient and time, one column per channel.

  Times are hours since admission (a number) or ISO timestamps, counted from the patient's first
  row. Rows are resampled into `steps` bins of `hours_per_step` hours (mean of the rows in a bin).

  Returns:
    (patient -> float32 (T, C) values with NaN where not observed, rows past the last bin).
  """
  source = os.path.basename(path)
  header = _header(path)
  pid_col = _find_column(path, header, PATIENT_COLUMNS, "patient id")
  time_col = _find_column(path, header, TIME_COLUMNS, "time")
  numeric_time = None
  missing = [c for c in channels if c not in header]
  if missing:
    raise TableError(f"{path}: channel columns {missing} not found (config.data.vitals_channels="
                     f"{list(channels)}; header {header})")
  sums: dict[str, np.ndarray] = {}
  counts: dict[str, np.ndarray] = {}
  last: dict[str, tuple[float, float]] = {}
  late = 0
  for lineno, row in _rows(path):
    pid, text = row.get(pid_col, ""), row.get(time_col, "")
    hours = _hours(text) if text else None
    if not pid or hours is None:
      problems.report(source, lineno, f"empty {pid_col!r}, or time {text!r} is neither hours nor "
                      "an ISO timestamp; the row is set aside")
      continue
    if numeric_time is None:
      numeric_time = _number(text) is not None
    if pid in last:
      start, previous = last[pid]
      if hours < previous:
        problems.report(source, lineno, f"row out of time order ({time_col} {text!r} comes after "
                        "a later time for this patient); the row is set aside")
        continue
      if hours == previous:
        problems.report(source, lineno, f"duplicate time {text!r} for this patient; the row is set "
                        "aside")
        continue
    else:
      # Numeric times are hours since admission; timestamps count from the first row.
      start = 0.0 if numeric_time else hours
    last[pid] = (start, hours)
    step = int((hours - start) // hours_per_step)
    if step < 0 or step >= steps:
      late += 1
      continue
    if pid not in sums:
      sums[pid] = np.zeros((steps, len(channels)), np.float64)
      counts[pid] = np.zeros((steps, len(channels)), np.int32)
    for c, channel in enumerate(channels):
      number = _cell(row, channel, problems, source, lineno, "not observed")
      if number is None:
        continue
      sums[pid][step, c] += number
      counts[pid][step, c] += 1
  series = {}
  for pid, total in sums.items():
    with np.errstate(invalid="ignore", divide="ignore"):
      series[pid] = np.where(counts[pid] > 0, total / np.maximum(counts[pid], 1),
                             np.nan).astype(np.float32)
  return series, late
