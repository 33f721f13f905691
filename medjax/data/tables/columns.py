"""What a table's columns hold besides measurements: dates or times (a birth date must not
become an analyte), free text, numbers written with their unit ('140 mmol/L'), units in a long
file's names, and a line of the columns' units under the header."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pandas as pd

from medjax.data.tables import analytes as analytes_lib
from medjax.data.tables import csvfile
from medjax.data.tables import values as values_lib

# A column of dates or times of day (`dates`): its name ends in one of these (by
# `csvfile.column_key`), or nine in ten of its cells match `_DATE`.
_DATE_NAMES = ("date", "datetime", "dttm", "timestamp")
_MONTH = r"(?:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]*\.?"
_CLOCK = r"\d{1,2}:[0-5]\d(?::[0-5]\d(?:[.,]\d+)?)?(?:\s?[ap]\.?m\.?)?"
# A time of day alone: two digits for the hour, or am/pm ('1:40' is a titre, as '1:320').
_TIME_OF_DAY = r"\d{2}:[0-5]\d(?::[0-5]\d(?:[.,]\d+)?)?|\d{1,2}:[0-5]\d\s?[ap]\.?m\.?"
_DATE = re.compile(
    r"(?:\d{4}[-/]\d{1,2}[-/]\d{1,2}|\d{1,2}[/.\-]\d{1,2}[/.\-]\d{2}(?:\d{2})?"
    rf"|\d{{1,2}}[\s\-/]?{_MONTH}[\s\-/,]*\d{{2}}(?:\d{{2}})?|{_MONTH}\s\d{{1,2}},?\s\d{{4}})"
    rf"(?:[\sT:]{_CLOCK}(?:Z|[+-]\d{{2}}:?\d{{2}})?)?|{_TIME_OF_DAY}", re.IGNORECASE)

# A number written with its unit in the cell: '140 mmol/L', '<0.01 ng/mL', '88umol/L', '37 %'.
WITH_UNIT = (r"^((?:[<>]=?|[≤≥])?\s*[+-]?(?:\d[\d,]*(?:\.\d*)?|\.\d+))\s*"
             r"([^\d\s.,+\-<>][^<>]*?)\s*$")


def dates(col: pd.Series, name: str) -> bool:
  """Whether column `name` holds dates or times rather than measurements: its name ends in
  'date' ('admit_date', 'DateTime', 'charttime' aside: those are `TIME_COLUMNS`), or nine in
  ten of its non-empty cells are dates ('2020-03-01', '03/01/2020 10:00', '01-Mar-2020',
  SAS's '01MAR2020', 'Mar 1, 2020'), times of day ('10:30') or, read as numbers, days written
  YYYYMMDD (19670110). A date may be a birth date: its values must not become an analyte's."""
  if csvfile.column_key(name).endswith(_DATE_NAMES):
    return True
  if col.dtype.kind in "fiu":
    v = col.to_numpy(np.float64)
    v = v[np.isfinite(v)]   # an 'inf' cell is no date (and would warn in the // below)
    if not len(v) or np.max(v) < 18_500_101:   # no value is a day of 1850 or after
      return False
    month, day = v // 100 % 100, v % 100
    days = ((v == np.round(v)) & (v >= 18_500_101) & (v <= 21_001_231) & (month >= 1)
            & (month <= 12) & (day >= 1) & (day <= 31))
    return bool(len(v)) and float(np.mean(days)) >= 0.9
  cells = col.dropna().astype(str).str.strip()
  cells = cells[(cells != "") & ~cells.str.lower().isin(values_lib.MISSING_MARKERS)]
  return bool(len(cells)) and float(cells.str.fullmatch(_DATE).mean()) >= 0.9


def only_text(col: pd.Series, decimal_comma: bool) -> bool:
  """Whether a column holds text and not one number: no cell that reads as a number (or a value
  at an assay's limit), and cells that do not, most of them words (with a letter: '1,050'
  beside '36,6' is numbers unread, each reported)."""
  if col.dtype.kind in "fiub":
    return False
  values, kinds, _ = values_lib.numbers(col, decimal_comma, limits=True)
  text = kinds == values_lib.NOT_A_NUMBER
  if ((kinds == values_lib.OK) & ~np.isnan(values)).any() or not text.any():
    return False
  words = col[text].astype(str).str.contains(r"[^\W\d_]").to_numpy(bool)
  return float(np.mean(words)) >= 0.5


def with_units(col: pd.Series) -> tuple[pd.Series, str, int, bool] | None:
  """(the cells without their unit, the unit as first written, how many cells had it, whether
  others are plain numbers) where half or more of the column's non-empty cells are a number
  followed by one unit ('140 mmol/L', '<0.01 ng/mL', '88umol/L': `analytes.is_unit`); cells in
  another unit are left as they are (no numbers, each reported). None where its cells hold no
  unit."""
  if col.dtype.kind in "fiub":
    return None
  cells = col.fillna("").astype(str).str.strip()
  parts, known = _numbers_and_units(cells)
  if not known.any():
    return None
  units = pd.Series(values_lib.map_unique(parts[1].fillna("").to_numpy(object),
                                          analytes_lib.unit), dtype=object)
  unit = units[known].value_counts().index[0]
  mine = known & (units == unit).to_numpy(bool)
  if mine.sum() < 0.5 * (cells != "").sum():
    return None
  first = parts[1][mine].iloc[0].strip()
  plain = bool(((pd.to_numeric(cells, errors="coerce").notna()).to_numpy(bool) & ~mine).any())
  return (cells.where(~mine, parts[0].str.strip()).astype(object), first, int(mine.sum()),
          plain)


def cell_units(frame: csvfile.Frame, columns, info: dict, keep=None) -> dict[int, str]:
  """{column: unit} of the `columns` (None: no column) whose cells carry their unit
  (`with_units`: '140 mmol/L', '80 bpm'), the frame's cells left with their numbers; the cells
  are counted as info['units_in_cells']. `keep(j, unit, plain)`, where given, says whether to
  read column j so (False: its cells stay as written, each unit cell no number)."""
  out = {}
  for j in columns:
    found = None if j is None else with_units(frame.frame[j])
    if not found or (keep is not None and not keep(j, found[1], found[3])):
      continue
    frame.frame[j], out[j] = found[0], found[1]
    info["units_in_cells"] = info.get("units_in_cells", 0) + found[2]
  return out


def _numbers_and_units(cells: pd.Series) -> tuple[pd.DataFrame, np.ndarray]:
  """`cells` (stripped text) split into a number and the text after it (`WITH_UNIT`), and which
  of them are a number and a unit (the text reads as one: `analytes.is_unit`)."""
  parts = cells.str.extract(WITH_UNIT)
  known = parts[1].notna().to_numpy(bool) & values_lib.map_unique(
      parts[1].fillna("").to_numpy(object), analytes_lib.is_unit).astype(bool)
  return parts, known


def long_units(frame: csvfile.Frame, cols: dict, names: np.ndarray, analytes,
               info: dict) -> np.ndarray:
  """A long file's analyte or channel names without a unit in brackets ('Creatinine (umol/L)',
  unless `analytes`, config.data.analytes, names it whole) and its value cells without a unit
  after the number ('140 mmol/L'), those units put in the unit column (one made where the file
  has none) where its cell is empty, to be read as a unit column's are; counted as
  info['units_in_names'] and info['units_in_cells']. Returns the names."""
  given = set(analytes)
  base = values_lib.map_unique(names, lambda n: n if n in given else
                               analytes_lib.name_and_unit(n)[0])
  from_name = values_lib.map_unique(names, lambda n: "" if n in given else
                                    analytes_lib.name_and_unit(n)[1])
  units = np.where(from_name != "", from_name, "").astype(object)
  value = frame.frame[cols["value"]]
  if value.dtype.kind not in "fiub":
    cells = value.fillna("").astype(str).str.strip()
    parts, suffix = _numbers_and_units(cells)
    if suffix.any():
      frame.frame[cols["value"]] = cells.where(~suffix, parts[0].str.strip()).astype(object)
      units[suffix] = parts[1][suffix].str.strip().to_numpy(object)
      info["units_in_cells"] = int(suffix.sum())
  if (from_name != "").any():
    info["units_in_names"] = int(np.sum(from_name != ""))
  if not (units != "").any():
    return base
  if cols["unit"] is None:
    cols["unit"] = len(frame.columns)
    frame.columns.append("unit")
    frame.frame[cols["unit"]] = pd.Series(units, dtype=object)
  else:
    written = frame.frame[cols["unit"]].fillna("").astype(str).str.strip().to_numpy(object)
    frame.frame[cols["unit"]] = pd.Series(np.where(written == "", units, written), dtype=object)
  return base


# What a units line's patient id cell may say (by `csvfile.column_key`).
_UNITS_ROW_IDS = frozenset({"", "unit", "units", "uom", "unitofmeasure", "unitsofmeasure"})


def without_units_row(frame: csvfile.Frame, pid: int,
                      info: dict) -> tuple[csvfile.Frame, dict[int, str]]:
  """The frame without its first row where that row gives the columns' units (a report's second
  header line: ',mmol/L,mmol/L,%'): its id cell empty or 'units', every other non-empty cell a
  unit (`analytes.is_unit`), one at least; and {column: unit} (empty where it does not). The
  line is a 'line' problem of the frame's, naming no patient, and info['units_line'] its
  number (no longer counted in info['rows'])."""
  if not len(frame.frame):
    return frame, {}
  row = frame.frame.iloc[0]
  text = {j: "" if pd.isna(v) else str(v).strip() for j, v in row.items()}
  units = {j: t for j, t in text.items() if j != pid and t}
  if (csvfile.column_key(text[pid]) not in _UNITS_ROW_IDS or not units
      or not all(analytes_lib.is_unit(t) for t in units.values())):
    return frame, {}
  line = int(frame.lines[0])
  info["units_line"], info["rows"] = line, info.get("rows", 1) - 1
  rest = frame.frame.iloc[1:].reset_index(drop=True)
  problem = csvfile.Problem(frame.source, line, "the columns' units (a second header line), not a "
                            "row: read as their units; the line is set aside", "line")
  return dataclasses.replace(frame, frame=rest, lines=frame.lines[1:],
                             problems=[*frame.problems, problem]), units
