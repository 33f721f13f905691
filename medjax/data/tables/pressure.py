"""Blood pressure charted as one value, systolic/diastolic ('120/80'), as Epic's flowsheets and
many exports give it: found by name and split into the sbp and dbp channels."""

from __future__ import annotations

import dataclasses
import re
from typing import Sequence

import numpy as np
import pandas as pd

from medjax.data.tables import analytes as analytes_lib
from medjax.data.tables import csvfile
from medjax.data.tables import values as values_lib

# The names of a combined pressure (by `csvfile.column_key`; a wide header's before a unit).
PRESSURE_NAMES = ("bp", "blood pressure", "nibp", "nbp", "non invasive blood pressure",
                  "abp", "arterial blood pressure", "arterial bp", "art bp")
_KEYS = frozenset(map(csvfile.column_key, PRESSURE_NAMES))
_SLASHED = re.compile(r"^\s*(\d+(?:[.,]\d+)?)\s*/\s*(\d+(?:[.,]\d+)?)\s*(?:mm\s*hg)?\s*$",
                      re.IGNORECASE)


def named(name) -> bool:
  """Whether `name` (a header, with or without a unit, or a long file's analyte) is a combined
  pressure's."""
  m = analytes_lib.UNIT_SUFFIX.match(str(name))
  return csvfile.column_key(m[1] if m else name) in _KEYS


def column(header: Sequence[str], taken: Sequence[int | None]) -> int | None:
  """A wide header's combined pressure column ('BP', 'Blood Pressure (mmHg)'), not a channel's."""
  return next((j for j, h in enumerate(header) if j not in taken and named(h)), None)


def split(cells: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(systolic, diastolic, bad) of cells as written: '120/80' is '120' and '80', an empty cell
  (or a missing-value marker) two empty ones; any other (a lone '120', 'see note') is bad, two
  empty ones too."""
  text = pd.Series(values_lib.normalize_ids(cells), dtype=object)
  parts = text.str.extract(_SLASHED)
  slashed = parts[0].notna().to_numpy(bool)
  systolic = np.where(slashed, parts[0].to_numpy(object), "").astype(object)
  diastolic = np.where(slashed, parts[1].to_numpy(object), "").astype(object)
  return systolic, diastolic, ~slashed & (text != "").to_numpy(bool)


def report(frame: csvfile.Frame, info: dict, name: str, systolic: np.ndarray, bad: np.ndarray,
           lines: np.ndarray) -> None:
  """Counts the pressures split (info['pressures_split']) and reports the bad cells of column or
  analyte `name` (at `lines`) as one values problem of the frame's, counted under `name`."""
  info["pressures_split"] = int(np.sum(systolic != ""))
  if not bad.any():
    return
  at = lines[bad]
  more = f" ({len(at)} such values)" if len(at) > 1 else ""
  frame.problems.append(csvfile.Problem(
      frame.source, int(at[0]), f"{values_lib.shown(name, set())}: a blood pressure not written "
      f"as systolic/diastolic ('120/80'); sbp and dbp set to missing{more}", "values", len(at),
      tuple(int(x) for x in at[:values_lib.SHOWN_LINES])))
  values_lib.count_values(info, {"not_a_number": len(at)}, name)


def split_column(frame: csvfile.Frame, lines: csvfile.Lines, cols: dict,
                           channels: Sequence[str]) -> None:
  """A wide file's combined pressure column ('BP': 120/80) as the sbp and dbp channels' columns
  where they have none of their own (added to the frame; info['pressures_split']); a cell not
  written so is reported, both set to missing."""
  j = cols["pressure"]
  systolic, diastolic, bad = split(frame.frame[j].to_numpy(object))
  for name, cells in (("sbp", systolic), ("dbp", diastolic)):
    c = next((c for c, ch in enumerate(channels) if csvfile.column_key(ch) == name), None)
    if c is not None and cols["channels"][c] is None:
      cols["channels"][c] = len(frame.columns)
      frame.frame[len(frame.columns)] = cells
      frame.columns.append(channels[c])
  report(frame, lines.info, frame.columns[j], systolic, bad, frame.lines)


def split_rows(frame: csvfile.Frame, lines: csvfile.Lines, long: dict,
                   channels: Sequence[str], keys: dict[str, int]) -> csvfile.Frame:
  """A long file's rows of a combined pressure ('BP', 120/80) as an sbp and a dbp row each, at
  its line (the first of a channel's rows at one time wins, as ever), where the channels have
  sbp and dbp and no name maps the row to a channel (info['pressures_split']); a value not
  written so is reported, both set to missing."""
  if "sbp" not in keys or "dbp" not in keys:
    return frame
  names = frame.frame[long["analyte"]].to_numpy(object)
  rows = np.flatnonzero(values_lib.map_unique(
      names, lambda s: csvfile.column_key(s) not in keys and named(s)).astype(bool))
  if not len(rows):
    return frame
  systolic, diastolic, bad = split(frame.frame[long["value"]].to_numpy(object)[rows])
  first_bad = names[rows[bad]][0] if bad.any() else ""
  report(frame, lines.info, first_bad, systolic, bad, frame.lines[rows])
  parts = [frame.frame.drop(index=frame.frame.index[rows])]
  for key, cells in (("sbp", systolic), ("dbp", diastolic)):
    part = frame.frame.iloc[rows].copy()
    part[long["analyte"]], part[long["value"]] = channels[keys[key]], cells
    parts.append(part)
  row_lines = np.concatenate([np.delete(frame.lines, rows), frame.lines[rows], frame.lines[rows]])
  order = np.argsort(row_lines, kind="stable")   # a frame's lines ascend
  out = pd.concat(parts, ignore_index=True).iloc[order].reset_index(drop=True)
  return dataclasses.replace(frame, frame=out, lines=row_lines[order])
