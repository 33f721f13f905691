"""Reading the clinical tables (labels, lab panels, vital-sign series) strictly, with pandas.

`medjax.data.csvfile` reads a file as checked physical lines (encoding, line endings, delimiter,
malformed lines set aside; one line is one record) and parses the good ones. This module gives the
columns their meaning and checks values in bulk: ids, classes, numbers, times, plausible ranges,
duplicates.

What cannot be read at all (an empty or binary file, no header naming the needed columns, a column
named twice) is refused with a `TableError` (an `errors.InputError`). Everything else is accounted
for through `Problems`: a malformed row is set aside with its file, line and reason, a bad value is
set to missing and counted per column, and `on_error='raise'` turns the first of them (lowest
line) into a `TableError` naming file and line. Reasons never carry patient ids, and cell values
only when they cannot be identifying (see `_shown`).

Readers return ids stripped of surrounding whitespace and NFC-normalised (casefolded too when
`fold_case`); ingest hashes them right away.
"""

from __future__ import annotations

import dataclasses
import re
import unicodedata
from typing import Sequence

import numpy as np
import pandas as pd

from medjax import errors
from medjax.data import csvfile
from medjax.data.csvfile import Problem, TableError  # pylint: disable=unused-import

PATIENT_COLUMNS = ("patient_id", "patientid", "patient", "mrn")
LABEL_COLUMNS = ("diagnosis", "label", "class")
TIME_COLUMNS = ("hour", "hours", "time", "timestamp", "charttime")
# Built-in plausible ranges (inclusive) of the known vitals channels: wide enough for any real
# patient and for the synthetic generator (which writes SpO2 up to ~103 and heart rates down to
# ~7), narrow enough to catch unit slips (temperature in Fahrenheit, SpO2 as a fraction).
DEFAULT_VALUE_RANGES = {"hr": (0.0, 350.0), "sbp": (0.0, 400.0), "dbp": (0.0, 300.0),
                        "rr": (0.0, 150.0), "spo2": (20.0, 105.0), "temp": (25.0, 45.0)}
# Text read as a missing value but counted, like inf and nan, as a non-finite value.
MISSING_MARKERS = frozenset({"nan", "-nan", "+nan", "na", "n/a", "#n/a", "null", "none", "<na>"})
_WITHHELD = "(withheld: it may identify a patient)"
SHOWN_LINES = 20   # line numbers listed in one values entry of the quarantine report
_OK, _NON_FINITE, _NOT_A_NUMBER, _OUT_OF_RANGE = range(4)
_VALUE_KINDS = {_NON_FINITE: "non_finite", _NOT_A_NUMBER: "not_a_number",
                _OUT_OF_RANGE: "out_of_range"}




class Problems:
  """Collects set-aside rows and values, or raises on the first one; keeps per-file counts."""

  def __init__(self, on_error: str):
    if on_error not in ("raise", "quarantine"):
      raise ValueError(f"config.data.on_error={on_error!r}: use 'raise' or 'quarantine'")
    self.on_error = on_error
    self.items: list[Problem] = []
    self.files: dict[str, dict] = {}   # file name -> counts and format (ingest summary)
    self.known_ids: set[str] = set()   # casefolded ids seen so far: never shown in a reason

  def report(self, source: str, line: int, reason: str) -> None:
    self.extend([Problem(source, line, reason)])

  def redact(self) -> None:
    """Withholds any value shown in a reason that turned out to be an id (of a table read later
    or of a DICOM file): `_shown` only knew the ids read before it."""
    def withhold(match):
      return _WITHHELD if match.group(1).strip().casefold() in self.known_ids else match.group(0)
    self.items = [dataclasses.replace(p, reason=re.sub(r"'([^']*)'", withhold, p.reason))
                  for p in self.items]

  def extend(self, found: Sequence[Problem]) -> None:
    """Adds problems in line order; with on_error='raise', raises the first."""
    found = sorted(found, key=lambda p: p.line)
    if found and self.on_error == "raise":
      p = found[0]
      raise TableError(f"{p.source}:{p.line}: {p.reason} (set config.data.on_error='quarantine' "
                       "to set such rows and values aside and go on)")
    self.items.extend(found)


def value_ranges(config_ranges=None) -> dict[str, tuple[float, float]]:
  """`DEFAULT_VALUE_RANGES` updated by config.data.value_ranges (name -> (low, high) or None)."""
  ranges = dict(DEFAULT_VALUE_RANGES)
  for name, bounds in dict(config_ranges or {}).items():
    if bounds is None:
      ranges.pop(name, None)
      continue
    try:
      low, high = (float(b) for b in bounds)
      valid = low <= high
    except (TypeError, ValueError):
      valid = False
    if not valid:
      raise errors.InputError(f"config.data.value_ranges.{name}={bounds!r}: give (low, high) with "
                              "low <= high, or None for no check")
    ranges[name] = (low, high)
  return ranges


def normalize_ids(ids, fold_case: bool = False) -> np.ndarray:
  """Ids as joined across tables and DICOM: stripped, Unicode NFC, casefolded if `fold_case`."""
  def clean(u):
    text = "" if u is None or (isinstance(u, float) and np.isnan(u)) else str(u)
    text = unicodedata.normalize("NFC", text.strip())
    return text.casefold() if fold_case else text
  return _map_unique(ids, clean)


def _map_unique(values, fn) -> np.ndarray:
  """fn applied to each distinct value once (object array in, object array out)."""
  codes, uniques = pd.factorize(pd.Series(values, dtype=object), use_na_sentinel=False)
  return np.array([fn(u) for u in uniques] + [None], dtype=object)[codes]


# -- cells ----------------------------------------------------------------------------------------

def _shown(text, ids: set[str]) -> str:
  """A cell value fit for a reason, in single quotes; withheld when it could identify a patient
  (an id seen so far, four digits in a row as in ids and dates, long text, quotes)."""
  text = unicodedata.normalize("NFC", str(text).strip())
  if (len(text) > 24 or re.search(r"\d{4}", text) or text.casefold() in ids
      or not text.isprintable() or "'" in text or '"' in text or "\\" in text):
    return _WITHHELD
  return f"'{text}'"


def _numbers(col: pd.Series, decimal_comma: bool) -> tuple[np.ndarray, np.ndarray, int]:
  """(float64 values with NaN for missing or bad, kind per cell, decimal commas read)."""
  if col.dtype.kind in "fiu":
    values = col.to_numpy(np.float64, copy=True)
    kinds = np.where(np.isinf(values), _NON_FINITE, _OK)
    values[kinds != _OK] = np.nan
    return values, kinds, 0
  # Text as read (a column pandas took for booleans, or mixed with floats, as text again).
  if col.dtype.kind == "b":
    cells = pd.Series(np.where(col.to_numpy(bool), "True", "False"), dtype=object)
  elif col.dtype == object:
    cells = pd.Series(["" if x is None or (isinstance(x, float) and np.isnan(x)) else str(x)
                       for x in col.to_numpy(object)], dtype=object)
  else:
    cells = pd.Series(col.to_numpy(object), dtype=object).fillna("")
  values = pd.to_numeric(cells, errors="coerce").to_numpy(np.float64, copy=True)
  kinds = np.full(len(values), _OK)
  kinds[np.isinf(values)] = _NON_FINITE
  failed = np.flatnonzero(np.isnan(values))
  text = cells.iloc[failed].str.strip()
  marker = text.str.lower().isin(MISSING_MARKERS).to_numpy(bool)
  kinds[failed[marker]] = _NON_FINITE
  rest = ~marker & (text != "").to_numpy(bool)
  commas = 0
  if decimal_comma and rest.any():
    comma = rest & text.str.fullmatch(r"[+-]?\d+,\d+").to_numpy(bool)
    values[failed[comma]] = text[comma].str.replace(",", ".").astype(float).to_numpy()
    commas, rest = int(comma.sum()), rest & ~comma
  kinds[failed[rest]] = _NOT_A_NUMBER
  values[kinds != _OK] = np.nan
  return values, kinds, commas


def _value_problems(source: str, label: str, name: str, kinds: np.ndarray, lines: np.ndarray,
                    cells, ids: set[str], bounds=None) -> tuple[list[Problem], dict[str, int]]:
  """One 'values' problem per kind of bad value in a column, and the counts per kind."""
  out, counts = [], {}
  for kind, key in _VALUE_KINDS.items():
    rows = np.flatnonzero(kinds == kind)
    if not len(rows):
      continue
    counts[key] = len(rows)
    first = rows[0]
    value = _shown(cells[first], ids)
    if kind == _NOT_A_NUMBER:
      what = f"value {value} is not a number"
    elif kind == _NON_FINITE:
      what = f"value {value} is not a finite number"
    else:
      what = (f"value {value} is outside the plausible range [{bounds[0]:g}, {bounds[1]:g}] "
              f"(config.data.value_ranges.{name})")
    more = (f" ({len(rows)} such values in this {label}, first on lines "
            f"{', '.join(str(int(x)) for x in lines[rows[:5]])})" if len(rows) > 1 else "")
    shown_lines = tuple(int(x) for x in lines[rows[:SHOWN_LINES]])
    out.append(Problem(source, int(lines[first]), f"{label} {name!r}: {what}; set to missing{more}",
                       "values", len(rows), shown_lines))
  return out, counts


def _read_values(frame: csvfile.Frame, column: int, name: str, label: str, ranges, ids: set[str],
                 rows=None):
  """A numeric column's values (NaN where missing or bad) and its problems and counts."""
  col = frame.frame[column] if rows is None else frame.frame[column].iloc[rows]
  lines = frame.lines if rows is None else frame.lines[rows]
  values, kinds, commas = _numbers(col, frame.delimiter != ",")
  bounds = ranges.get(name)
  if bounds is not None:
    outside = ~np.isnan(values) & ((values < bounds[0]) | (values > bounds[1]))
    kinds[outside] = _OUT_OF_RANGE
    values[outside] = np.nan
  if not (kinds != _OK).any():
    return values, [], {}, commas
  probs, counts = _value_problems(frame.source, label, name, kinds, lines,
                                  col.to_numpy(object), ids, bounds)
  return values, probs, counts, commas


def _ids(frame: csvfile.Frame, column: int, fold_case: bool,
         problems: Problems) -> tuple[np.ndarray, set[str]]:
  """Normalised ids of a column; their spellings join `problems.known_ids` (for `_shown`)."""
  ids = normalize_ids(frame.frame[column].to_numpy(object), fold_case)
  problems.known_ids.update(str(x).casefold() for x in pd.unique(ids))
  return ids, problems.known_ids


def _first_rows(ids: np.ndarray, kept: np.ndarray, lines: np.ndarray, source: str,
                found: list) -> np.ndarray:
  """`kept` without later rows of a patient already kept; each such row is a Problem."""
  dup = pd.Series(ids[kept], dtype=object).duplicated(keep="first").to_numpy()
  first = _first_lines(ids[kept], lines[kept], np.flatnonzero(dup))
  for i, line in zip(kept[dup], first):
    found.append(Problem(source, int(lines[i]), f"duplicate patient row (line {line} has "
                         "this patient); the row is set aside"))
  return kept[~dup]


def _first_lines(keys: np.ndarray, lines: np.ndarray, rows: np.ndarray) -> np.ndarray:
  """For each of `rows`, the line of the first row (in `lines` order) with the same key."""
  codes, _ = pd.factorize(np.asarray(keys))
  first = pd.Series(lines).groupby(codes).transform("first").to_numpy()
  return first[rows]


def _info_values(info: dict, counts: dict[str, int], name: str) -> None:
  for kind, k in counts.items():
    info.setdefault("values", {}).setdefault(kind, {})
    info["values"][kind][name] = info["values"][kind].get(name, 0) + k


# -- the tables -----------------------------------------------------------------------------------

@dataclasses.dataclass
class Labels:
  """labels.csv's accepted rows: ids (P,), class names (P,), physical lines (P,)."""
  ids: np.ndarray
  classes: np.ndarray
  lines: np.ndarray

  def as_dicts(self) -> tuple[dict[str, str], dict[str, int]]:
    return (dict(zip(self.ids.tolist(), self.classes.tolist())),
            dict(zip(self.ids.tolist(), self.lines.tolist())))


@dataclasses.dataclass
class Labs:
  """labs.csv: analyte names (L), patient ids (P,), float32 (P, L) values (NaN: not measured)."""
  analytes: list[str]
  ids: np.ndarray
  values: np.ndarray


@dataclasses.dataclass
class Vitals:
  """vitals.csv: ids (P,), float32 (P, T, C) values (NaN: not observed), rows past the last step."""
  ids: np.ndarray
  values: np.ndarray
  late: int


def read_labels(path: str, problems: Problems, classes: Sequence[str] = (),
                fold_case: bool = False) -> Labels:
  """labels.csv (columns `patient_id`, `diagnosis`): one accepted row per patient.

  Rows with an empty id or class, a class not in `classes` (when given) or a patient an earlier
  line already has are set aside with their line.
  """
  cols = {}

  def text_columns(lines):
    cols["pid"] = csvfile.find_column(lines, PATIENT_COLUMNS, "patient id")
    cols["label"] = csvfile.find_column(lines, LABEL_COLUMNS, "label")
    return [cols["pid"], cols["label"]]

  lines, frame = csvfile.load(path, text_columns)
  source, found = frame.source, list(frame.problems)
  pid_name, label_name = frame.columns[cols["pid"]], frame.columns[cols["label"]]
  ids, id_set = _ids(frame, cols["pid"], fold_case, problems)
  names = _map_unique(frame.frame[cols["label"]].to_numpy(object),
                      lambda s: unicodedata.normalize("NFC", s.strip()))
  keep = np.ones(len(ids), bool)
  empty = (ids == "") | (names == "")
  for i in np.flatnonzero(empty):
    found.append(Problem(source, int(frame.lines[i]), f"empty {pid_name!r} or {label_name!r}; "
                         "the row is set aside"))
  keep &= ~empty
  if classes:
    unknown = keep & ~np.isin(names, list(classes))
    for i in np.flatnonzero(unknown):
      found.append(Problem(source, int(frame.lines[i]), f"class {_shown(names[i], id_set)} not in "
                           f"config.data.classes ({len(classes)} names); add it or fix the row; "
                           "the row is set aside"))
    keep &= ~unknown
  kept = np.flatnonzero(keep)
  kept = _first_rows(ids, kept, frame.lines, source, found)
  problems.files[source] = lines.info
  problems.extend(found)
  return Labels(ids[kept], names[kept], frame.lines[kept])


def read_labs(path: str, analytes: Sequence[str], rename: dict[str, str], problems: Problems,
              ranges: dict[str, tuple[float, float]] | None = None,
              fold_case: bool = False) -> Labs:
  """labs.csv, wide (one column per analyte) or long (`analyte`, `value` columns).

  Args:
    path: the CSV file.
    analytes: the expected analyte names, in model order; empty to take them from the file.
    rename: file column or analyte name -> analyte name.
    problems: where malformed rows and values go.
    ranges: analyte -> plausible (low, high); values outside are set to missing.
    fold_case: casefold patient ids (config.data.ids_case_insensitive).

  Returns:
    Labs with one row per patient (the first row of a patient; later ones are set aside).
  """
  ranges = ranges or {}
  cols = {}

  def text_columns(lines):
    cols["pid"] = csvfile.find_column(lines, PATIENT_COLUMNS, "patient id")
    lower = [h.lower() for h in lines.header]
    if "analyte" in lower and "value" in lower:
      cols["analyte"], cols["value"] = lower.index("analyte"), lower.index("value")
      return [j for j in range(len(lower)) if j != cols["value"]]
    return [cols["pid"]] + [j for j, h in enumerate(lower)
                            if h in ("date", "time", "timestamp", "")]

  lines, frame = csvfile.load(path, text_columns)
  if "analyte" in cols:
    return _read_labs_long(lines, frame, cols, analytes, rename, problems, ranges, fold_case)
  source, found = frame.source, list(frame.problems)
  skip = {"date", "time", "timestamp"}
  columns = [j for j, h in enumerate(frame.columns)
             if j != cols["pid"] and h and h.lower() not in skip]
  names = [rename.get(frame.columns[j], frame.columns[j]) for j in columns]
  _check_renamed(lines.path, [frame.columns[j] for j in columns], names)
  analytes = list(analytes) or names
  index = {a: i for i, a in enumerate(analytes)}
  for j, name in zip(columns, names):
    if name not in index:
      found.append(Problem(source, lines.header_line, f"column {frame.columns[j]!r} not in "
                           f"config.data.analytes ({len(analytes)} names); add it or map it with "
                           "config.data.rename; its values are ignored", "column"))
  found += _unnamed(frame, lines)
  ids, id_set = _ids(frame, cols["pid"], fold_case, problems)
  empty = ids == ""
  for i in np.flatnonzero(empty):
    found.append(Problem(source, int(frame.lines[i]), f"empty {frame.columns[cols['pid']]!r}; the "
                         "row is set aside"))
  kept = np.flatnonzero(~empty)
  kept = _first_rows(ids, kept, frame.lines, source, found)
  values = np.full((len(kept), len(analytes)), np.nan, np.float32)
  commas = 0
  for j, name in zip(columns, names):
    if name in index:
      v, probs, counts, c = _read_values(frame, j, name, "column", ranges, id_set, kept)
      values[:, index[name]] = v
      found += probs
      commas += c
      _info_values(lines.info, counts, name)
  if commas:
    lines.info["decimal_commas"] = commas
  problems.files[source] = lines.info
  problems.extend(found)
  return Labs(list(analytes), ids[kept], values)


def _check_renamed(path: str, columns: list[str], names: list[str]) -> None:
  seen = {}
  for column, name in zip(columns, names):
    if name in seen:
      raise csvfile.refuse(path, f"columns {seen[name]!r} and {column!r} both give analyte "
                           f"{name!r} (config.data.rename); keep one")
    seen[name] = column


def _unnamed(frame: csvfile.Frame, lines: csvfile.Lines) -> list[Problem]:
  """Columns without a name are ignored; reported when they hold values."""
  out = []
  for j, name in enumerate(frame.columns):
    if not name:
      lines.info["unnamed_columns"] = lines.info.get("unnamed_columns", 0) + 1
      if (frame.frame[j].astype(str).str.strip() != "").any():
        out.append(Problem(frame.source, lines.header_line, f"column {j + 1} has no name in the "
                           "header; its values are ignored", "column"))
  return out


def _read_labs_long(lines, frame, cols, analytes, rename, problems, ranges, fold_case) -> Labs:
  source, found = frame.source, list(frame.problems)
  ids, id_set = _ids(frame, cols["pid"], fold_case, problems)
  names = _map_unique(frame.frame[cols["analyte"]].to_numpy(object),
                      lambda s: rename.get(s.strip(), s.strip()))
  if not analytes:
    analytes = sorted(set(names[(ids != "") & (names != "")]))
  index = {a: i for i, a in enumerate(analytes)}
  empty = ids == ""
  for i in np.flatnonzero(empty):
    found.append(Problem(source, int(frame.lines[i]), f"empty {frame.columns[cols['pid']]!r}; the "
                         "row is set aside"))
  column = np.array([index.get(n, -1) for n in names], np.int64)
  unknown = ~empty & (column < 0)
  for i in np.flatnonzero(unknown):
    found.append(Problem(source, int(frame.lines[i]), f"analyte {_shown(names[i], id_set)} not in "
                         f"config.data.analytes ({len(analytes)} names); add it or map it with "
                         "config.data.rename; the row is set aside"))
  rows = np.flatnonzero(~empty & ~unknown)
  values = np.full(len(rows), np.nan)
  order = np.argsort(column[rows], kind="stable")
  bounds = np.flatnonzero(np.diff(column[rows][order])) + 1
  for sel in np.split(order, bounds) if len(rows) else []:
    name = analytes[column[rows[sel[0]]]]
    v, probs, counts, _ = _read_values(frame, cols["value"], name, "analyte", ranges, id_set,
                                       rows[sel])
    values[sel] = v
    found += probs
    _info_values(lines.info, counts, name)
  usable = ~np.isnan(values)
  rows, values = rows[usable], values[usable]
  codes, patients = pd.factorize(pd.Series(ids[rows], dtype=object))
  keys = codes.astype(np.int64) * max(len(analytes), 1) + column[rows]
  dup = pd.Series(keys).duplicated(keep="first").to_numpy()
  first = _first_lines(keys, frame.lines[rows], np.flatnonzero(dup))
  for i, line in zip(rows[dup], first):
    found.append(Problem(source, int(frame.lines[i]), f"duplicate value for analyte "
                         f"{_shown(names[i], id_set)} (line {line} has it for this patient); "
                         "the row is set aside"))
  out = np.full((len(patients), len(analytes)), np.nan, np.float32)
  out[codes[~dup], column[rows[~dup]]] = values[~dup]
  problems.files[source] = lines.info
  problems.extend(found)
  return Labs(list(analytes), np.asarray(patients, dtype=object), out)


def read_vitals(path: str, channels: Sequence[str], steps: int, hours_per_step: float,
                problems: Problems, ranges: dict[str, tuple[float, float]] | None = None,
                fold_case: bool = False) -> Vitals:
  """vitals.csv, long: one row per patient and time, one column per channel.

  Times are hours since admission (numbers, >= 0) or ISO 8601 timestamps counted from the
  patient's first row; the file's first valid time decides which. A row whose time is empty,
  unparseable, negative, of the other kind, earlier than (out of order) or equal to (duplicate)
  a previous row's of the same patient is set aside. Rows are resampled into `steps` bins of
  `hours_per_step` hours (mean of the rows in a bin); rows past the last bin are counted.
  """
  ranges = DEFAULT_VALUE_RANGES if ranges is None else ranges
  cols = {}

  def text_columns(lines):
    cols["pid"] = csvfile.find_column(lines, PATIENT_COLUMNS, "patient id")
    cols["time"] = csvfile.find_column(lines, TIME_COLUMNS, "time")
    missing = [c for c in channels if c not in lines.header]
    if missing:
      raise csvfile.refuse(lines.path, f"channel columns {missing} not found (config.data."
                           f"vitals_channels={list(channels)}; header {lines.header}); rename the "
                           "columns or set config.data.vitals_channels")
    return [cols["pid"]] + [j for j, h in enumerate(lines.header)
                            if j != cols["time"] and h not in channels]

  lines, frame = csvfile.load(path, text_columns)
  source, found = frame.source, list(frame.problems)
  time_name = frame.columns[cols["time"]]
  ids, id_set = _ids(frame, cols["pid"], fold_case, problems)
  hours, kind = _times(frame.frame[cols["time"]])
  tcells = frame.frame[cols["time"]].to_numpy(object)
  # The file's first valid time decides whether its times are hours or timestamps.
  valid = np.flatnonzero((kind > 0) & (ids != ""))
  numeric_file = not len(valid) or kind[valid[0]] == 1

  def set_aside(mask, reason_of):
    for i in np.flatnonzero(mask):
      found.append(Problem(source, int(frame.lines[i]), reason_of(i)))
    return ~mask

  kept = set_aside(ids == "", lambda i: f"empty {frame.columns[cols['pid']]!r}; the row is set "
                   "aside")
  kept &= set_aside(kept & (kind == 0), lambda i: f"time {_shown(tcells[i], id_set)} is neither "
                    "hours nor an ISO timestamp; the row is set aside")
  kept &= set_aside(kept & (kind == (2 if numeric_file else 1)), lambda i: (
      f"time {_shown(tcells[i], id_set)} is {'a timestamp' if numeric_file else 'hours'} but the "
      f"file's first time is {'hours' if numeric_file else 'a timestamp'}; the row is set aside"))
  kept &= set_aside(kept & (kind == 1) & (hours < 0), lambda i: f"negative time "
                    f"{_shown(tcells[i], id_set)}; the row is set aside")
  # In file order per patient, a time below the running maximum of the earlier rows is out of
  # order and one equal to it a duplicate (that maximum is the last accepted row's time).
  rows = np.flatnonzero(kept)
  codes, _ = pd.factorize(pd.Series(ids[rows], dtype=object))
  h = pd.Series(hours[rows])
  previous = h.groupby(codes).cummax().groupby(codes).shift(1).to_numpy()
  early, same = h.to_numpy() < previous, h.to_numpy() == previous
  rows_mask = np.zeros(len(ids), bool)
  rows_mask[rows[early]] = True
  set_aside(rows_mask, lambda i: f"row out of time order ({time_name} {_shown(tcells[i], id_set)} "
            "comes after a later time for this patient); the row is set aside")
  rows_mask[:] = False
  rows_mask[rows[same]] = True
  set_aside(rows_mask, lambda i: f"duplicate time {_shown(tcells[i], id_set)} for this patient; "
            "the row is set aside")
  rows = rows[~early & ~same]
  codes, patients = pd.factorize(pd.Series(ids[rows], dtype=object))
  offset = hours[rows]
  if not numeric_file:  # Timestamps count from the patient's first (earliest) row.
    offset = offset - pd.Series(offset).groupby(codes).transform("min").to_numpy()
  step_f = np.floor(offset / hours_per_step)
  inside = step_f < steps
  late = int(np.sum(~inside))
  rows, codes, step = rows[inside], codes[inside], step_f[inside].astype(np.int64)
  cells = len(patients) * steps
  flat = codes * steps + step
  values = np.full((len(patients), steps, len(channels)), np.nan, np.float32)
  for c, channel in enumerate(channels):
    v, probs, counts, commas = _read_values(frame, frame.columns.index(channel), channel, "column",
                                            ranges, id_set, rows)
    found += probs
    _info_values(lines.info, counts, channel)
    if commas:
      lines.info["decimal_commas"] = lines.info.get("decimal_commas", 0) + commas
    seen = ~np.isnan(v)
    total = np.bincount(flat[seen], weights=v[seen], minlength=cells)
    count = np.bincount(flat[seen], minlength=cells)
    with np.errstate(invalid="ignore", divide="ignore"):
      values[:, :, c] = np.where(count > 0, total / np.maximum(count, 1),
                                 np.nan).reshape(len(patients), steps)
  lines.info["rows_past_last_step"] = late
  problems.files[source] = lines.info
  problems.extend(found)
  return Vitals(np.asarray(patients, dtype=object), values, late)


def _times(col: pd.Series) -> tuple[np.ndarray, np.ndarray]:
  """(hours, kind): kind 1 for a finite number of hours, 2 for an ISO timestamp (hours since the
  epoch, naive times taken as UTC), 0 for anything else."""
  hours, kinds, _ = _numbers(col, False)
  ok = np.where(~np.isnan(hours), 1, 0)
  rest = np.flatnonzero((ok == 0) & (kinds == _NOT_A_NUMBER))
  if len(rest):
    text = col.iloc[rest].astype(str).str.strip()
    stamps = pd.to_datetime(text, format="ISO8601", errors="coerce", utc=True)
    valid = stamps.notna().to_numpy()
    epoch = pd.Timestamp(0, tz="UTC")
    hours[rest[valid]] = ((stamps[valid] - epoch) / pd.Timedelta(hours=1)).to_numpy(np.float64)
    ok[rest[valid]] = 2
  return hours, ok
