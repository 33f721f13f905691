"""vitals.csv: vital-sign series (patient, time, channels), resampled to fixed steps."""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np
import pandas as pd

from medjax.data.tables import csvfile
from medjax.data.tables import values as values_lib


@dataclasses.dataclass
class Vitals:
  """vitals.csv: ids (P,), float32 (P, T, C) values (NaN: not observed), rows past the last step."""
  ids: np.ndarray
  values: np.ndarray
  late: int


def read_vitals(path: str, channels: Sequence[str], steps: int, hours_per_step: float,
                problems: values_lib.Problems, ranges: dict[str, tuple[float, float]] | None = None,
                fold_case: bool = False) -> Vitals:
  """vitals.csv, long: one row per patient and time, one column per channel.

  Times are hours since admission (numbers, >= 0) or ISO 8601 timestamps counted from the
  patient's first row; the file's first valid time decides which. A row whose time is empty,
  unparseable, negative, of the other kind, earlier than (out of order) or equal to (duplicate)
  a previous row's of the same patient is set aside. Rows are resampled into `steps` bins of
  `hours_per_step` hours (mean of the rows in a bin); rows past the last bin are counted.
  """
  ranges = values_lib.DEFAULT_VALUE_RANGES if ranges is None else ranges
  cols = {}

  def text_columns(lines):
    cols["pid"] = csvfile.find_column(lines, values_lib.PATIENT_COLUMNS, "patient id")
    cols["time"] = csvfile.find_column(lines, values_lib.TIME_COLUMNS, "time")
    missing = [c for c in channels if c not in lines.header]
    if missing:
      raise csvfile.refuse(lines.path, f"channel columns {missing} not found (config.data."
                           f"vitals_channels={list(channels)}; header {lines.header}); rename the "
                           "columns or set config.data.vitals_channels")
    return [cols["pid"]] + [j for j, h in enumerate(lines.header)
                            if j != cols["time"] and h not in channels]

  lines, frame = csvfile.load(path, text_columns)
  found = list(frame.problems)
  ids, id_set = values_lib.read_ids(frame, cols["pid"], fold_case, problems)
  hours, kind = _times(frame.frame[cols["time"]])
  # The file's first valid time decides whether its times are hours or timestamps.
  valid = np.flatnonzero((kind > 0) & (ids != ""))
  numeric_file = not len(valid) or kind[valid[0]] == 1
  rows = _rows_in_time_order(frame, cols, ids, id_set, hours, kind, numeric_file, found)
  codes, patients = pd.factorize(pd.Series(ids[rows], dtype=object))
  offset = hours[rows]
  if not numeric_file:  # Timestamps count from the patient's first (earliest) row.
    offset = offset - pd.Series(offset).groupby(codes).transform("min").to_numpy()
  step_f = np.floor(offset / hours_per_step)
  inside = step_f < steps
  late = int(np.sum(~inside))
  bins = (rows[inside], codes[inside] * steps + step_f[inside].astype(np.int64))
  values = np.full((len(patients), steps, len(channels)), np.nan, np.float32)
  for c, channel in enumerate(channels):
    v, probs, counts, commas = values_lib.read_values(
        frame, frame.columns.index(channel), channel, "column", ranges, id_set, bins[0])
    found += probs
    values_lib.count_values(lines.info, counts, channel)
    if commas:
      lines.info["decimal_commas"] = lines.info.get("decimal_commas", 0) + commas
    values[:, :, c] = _bin_means(v, bins[1], len(patients) * steps).reshape(len(patients), steps)
  lines.info["rows_past_last_step"] = late
  problems.files[frame.source] = lines.info
  problems.extend(found)
  return Vitals(np.asarray(patients, dtype=object), values, late)


def _rows_in_time_order(frame: csvfile.Frame, cols: dict, ids: np.ndarray, id_set: set[str],
                        hours: np.ndarray, kind: np.ndarray, numeric_file: bool,
                        found: list) -> np.ndarray:
  """The rows with a patient and a valid time, each later than the patient's earlier rows (in
  file order); every other row is set aside with its reason (a Problem in `found`)."""
  tcells = frame.frame[cols["time"]].to_numpy(object)
  shown = lambda i: values_lib.shown(tcells[i], id_set)

  def set_aside(mask, reason_of):
    for i in np.flatnonzero(mask):
      found.append(csvfile.Problem(frame.source, int(frame.lines[i]), reason_of(i)))
    return ~mask

  pid_name, time_name = frame.columns[cols["pid"]], frame.columns[cols["time"]]
  kept = set_aside(ids == "", lambda i: f"empty {pid_name!r}; the row is set aside")
  kept &= set_aside(kept & (kind == 0), lambda i: (
      f"time {shown(i)} is neither hours nor an ISO timestamp; the row is set aside"))
  kept &= set_aside(kept & (kind == (2 if numeric_file else 1)), lambda i: (
      f"time {shown(i)} is {'a timestamp' if numeric_file else 'hours'} but the file's first "
      f"time is {'hours' if numeric_file else 'a timestamp'}; the row is set aside"))
  kept &= set_aside(kept & (kind == 1) & (hours < 0), lambda i: (
      f"negative time {shown(i)}; the row is set aside"))
  # In file order per patient, a time below the running maximum of the earlier rows is out of
  # order and one equal to it a duplicate (that maximum is the last accepted row's time).
  rows = np.flatnonzero(kept)
  codes, _ = pd.factorize(pd.Series(ids[rows], dtype=object))
  h = pd.Series(hours[rows])
  previous = h.groupby(codes).cummax().groupby(codes).shift(1).to_numpy()
  early, same = h.to_numpy() < previous, h.to_numpy() == previous
  mask = np.zeros(len(ids), bool)
  mask[rows[early]] = True
  set_aside(mask, lambda i: f"row out of time order ({time_name} {shown(i)} comes after a later "
            "time for this patient); the row is set aside")
  mask[:] = False
  mask[rows[same]] = True
  set_aside(mask, lambda i: f"duplicate time {shown(i)} for this patient; the row is set aside")
  return rows[~early & ~same]


def _bin_means(v: np.ndarray, flat: np.ndarray, cells: int) -> np.ndarray:
  """The mean of the observed values `v` in each of `cells` bins (`flat`: each value's bin);
  NaN where a bin has none."""
  seen = ~np.isnan(v)
  total = np.bincount(flat[seen], weights=v[seen], minlength=cells)
  count = np.bincount(flat[seen], minlength=cells)
  with np.errstate(invalid="ignore", divide="ignore"):
    return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def _times(col: pd.Series) -> tuple[np.ndarray, np.ndarray]:
  """(hours, kind): kind 1 for a finite number of hours, 2 for an ISO timestamp (hours since the
  epoch, naive times taken as UTC), 0 for anything else."""
  hours, kinds, _ = values_lib.numbers(col, False)
  ok = np.where(~np.isnan(hours), 1, 0)
  rest = np.flatnonzero((ok == 0) & (kinds == values_lib.NOT_A_NUMBER))
  if len(rest):
    text = col.iloc[rest].astype(str).str.strip()
    stamps = pd.to_datetime(text, format="ISO8601", errors="coerce", utc=True)
    valid = stamps.notna().to_numpy()
    epoch = pd.Timestamp(0, tz="UTC")
    hours[rest[valid]] = ((stamps[valid] - epoch) / pd.Timedelta(hours=1)).to_numpy(np.float64)
    ok[rest[valid]] = 2
  return hours, ok
