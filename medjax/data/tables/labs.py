"""labs.csv: lab panels, wide (one column per analyte) or long (one row per measurement)."""

from __future__ import annotations

import collections
import dataclasses
from typing import Sequence

import numpy as np
import pandas as pd

from medjax.data.tables import analytes as analytes_lib
from medjax.data.tables import categories as categories_lib
from medjax.data.tables import columns as columns_lib
from medjax.data.tables import csvfile
from medjax.data.tables import labs_long
from medjax.data.tables import problems as problems_lib
from medjax.data.tables import timestamps
from medjax.data.tables import values as values_lib


# A wide file's columns that are neither analytes nor identifiers (by `csvfile.column_key`):
# the draw's date or time (MIMIC's charttime too).
_NOT_ANALYTES = frozenset({""} | {csvfile.column_key(c) for c in labs_long.DRAW_TIME_COLUMNS})


@dataclasses.dataclass
class Labs:
  """labs.csv: analyte names (L), patient ids (P,), float32 (P, L) values (NaN: not measured)."""
  analytes: list[str]
  ids: np.ndarray
  values: np.ndarray


def read_labs(path: str, analytes: Sequence[str], rename: dict[str, str],
              problems: problems_lib.Problems, ranges: dict[str, tuple[float, float]] | None = None,
              fold_case: bool = False, date_order: str = "auto",
              max_bytes: int = csvfile.MAX_BYTES) -> Labs:
  """labs.csv, wide (one column per analyte) or long (`analyte`, `value` columns).

  Args:
    path: the CSV file.
    analytes: the expected analyte names, in model order; empty to take them from the file.
    rename: file column or analyte name -> analyte name.
    problems: where malformed rows and values go.
    ranges: `tables.value_ranges()` (analyte key -> plausible (low, high)); values outside are
      set to missing.
    fold_case: casefold patient ids (config.data.ids_case_insensitive).
    date_order: the draw time column's dates ('03/01/2020'), config.data.date_order.
    max_bytes: the most the file may hold, unpacked (config.data.max_file_mb).

  Returns:
    Labs with one row per patient: each analyte's earliest usable value by the file's draw
    time, else its first in the file (later rows fill what earlier ones left missing); columns
    naming one analyte ('Na', 'SODIUM') are one, the first column's value used first.
  """
  ranges = ranges or {}
  cols = {"date_order": date_order}

  def text_columns(lines):
    cols["header"] = header = values_lib.renamed(lines.header, rename)
    cols["pid"] = csvfile.find_column(lines, values_lib.PATIENT_COLUMNS, "patient id", header)
    cols.update(values_lib.long_columns(header))
    cols["time"] = csvfile.column_index(header, labs_long.DRAW_TIME_COLUMNS)
    if "analyte" in cols:
      return [j for j in range(len(header)) if j != cols["value"]]
    return [cols["pid"]] + [j for j, h in enumerate(header)
                            if csvfile.column_key(h) in _NOT_ANALYTES
                            or values_lib.identifier_column(h)]

  lines, frame = csvfile.load(path, text_columns, max_bytes)
  timestamps.with_dates(frame, cols["time"], cols["header"], lines.info)
  if "analyte" in cols:
    return Labs(*labs_long.read_long(lines, frame, cols, analytes, rename, problems, ranges,
                                     fold_case))
  frame, row_units = columns_lib.without_units_row(frame, cols["pid"], lines.info)
  ids, id_set = values_lib.read_ids(frame, lines, cols["pid"], fold_case, problems)
  source, found = frame.source, list(frame.problems)   # now with their patients
  header = cols["header"]   # as config.data.rename maps it
  named = [(j, h) for j, h in enumerate(header)
            if j != cols["pid"] and h and csvfile.column_key(h) not in _NOT_ANALYTES]
  columns = _measurements(frame, lines, named, problems.known_ids, found)
  cell_units = _units_in_cells(frame, columns, lines.info)
  columns, categories = categories_lib.as_indicators(frame, columns, problems.known_ids,
                                                     lines.info)
  columns = _with_numbers(frame, lines, columns, categories, problems.known_ids, found)
  names, units = _names_and_units(frame.columns, columns, categories, rename, analytes)
  units.update({j: u for j, u in row_units.items() if j in columns and j not in units})
  units.update(cell_units)
  columns, names = _in_known_units(frame, lines, columns, names, units, problems.known_ids,
                                   found)
  names = list(labs_long.one_name_per_analyte(np.array(names, object), analytes,
                                              problems.known_ids, lines.info))
  if not analytes:
    # Analytes from the header: a name that may identify a patient (a shifted row, a pasted
    # id) becomes no analyte, which would carry it into tables.npz and the summary (an
    # indicator's name is its column's and a category checked alike).
    analytes = list(dict.fromkeys(n for j, n in zip(columns, names) if j in categories
                                  or not values_lib.withheld(n, problems.known_ids)))
  index = {a: i for i, a in enumerate(analytes)}
  found += [_ignored(frame, lines, j, problems.known_ids, "not in config.data.analytes "
                     f"({len(analytes)} names); add it or map it with config.data.rename; its "
                     "values are ignored") for j, name in zip(columns, names) if name not in index]
  found += _unnamed(frame, lines)
  empty = ids == ""
  found += [csvfile.Problem(source, int(frame.lines[i]), f"empty {frame.columns[cols['pid']]!r}; "
                            "the row is set aside") for i in np.flatnonzero(empty)]
  read = [(j, name) for j, name in zip(columns, names) if name in index]
  _wide_in_conventional_units(frame, read, units, ranges, problems.known_ids, lines.info)
  patients, values = _one_row_per_patient(frame, lines, cols, read, index, ids,
                                          np.flatnonzero(~empty), ranges, id_set, found)
  problems.files[source] = lines.info
  problems.extend(found)
  return Labs(list(analytes), patients, values)


def _measurements(frame, lines, named, ids, found) -> list[int]:
  """The columns of `named` ((column, header name) pairs) that may be measurements: not one that
  identifies patients or records (`values.identifier_column`), nor one of dates or times
  (`columns.dates`: a birth date must not become an analyte); each of those is a 'column'
  problem, and the dates' count goes to info['date_columns']."""
  columns = []
  for j, h in named:
    if values_lib.identifier_column(h):
      what = ("identifies patients rather than measuring them" if csvfile.column_key(h)
              in values_lib.IDENTIFIER_COLUMNS else "identifies records (its name ends in "
              "'id'), not a measurement")
    elif columns_lib.dates(frame.frame[j], h):
      what = "holds dates or times, not measurements"
      lines.info["date_columns"] = lines.info.get("date_columns", 0) + 1
    else:
      columns.append(j)
      continue
    found.append(_ignored(frame, lines, j, ids, f"{what}; its values are ignored"))
  _not_long(frame, lines, columns, ids)
  return columns


# Analytes by `analytes.key`: what a long file's analyte column names.
_KNOWN_ANALYTES = frozenset(analytes_lib.key(n) for n in analytes_lib.LAB_RANGES)


def _not_long(frame, lines, columns, ids) -> None:
  """Refuses a long file read as wide: a column whose cells name analytes ('Sodium',
  'Potassium') under a name that is none of `values.ANALYTE_COLUMNS` (an HL7 export's
  'observation_identifier'), whose values would be one analyte mixing them all."""
  for j in columns:
    if pd.api.types.is_numeric_dtype(frame.frame[j].dtype):
      continue
    names = pd.unique(frame.frame[j].iloc[:5000].dropna().astype(str).str.strip())
    known = [n for n in names if analytes_lib.key(n) in _KNOWN_ANALYTES]
    if known and (len(known) == len(names) or len(known) >= max(2, len(names) / 2)):
      shown = values_lib.shown(frame.columns[j], ids)
      raise csvfile.refuse(
          lines.path, f"column {j + 1} ({shown}) names analytes "
          f"({', '.join(values_lib.shown(n, ids) for n in known[:3])}, ...) as a long file's "
          f"analyte column does, under a name none of {list(values_lib.ANALYTE_COLUMNS)}; map "
          f"it and its value column with config.data.rename, e.g. {{{shown}: 'analyte', "
          "<the value column>: 'value'} (or, in a wide file, remove the column)")


def _units_in_cells(frame, columns, info) -> dict[int, str]:
  """`columns.cell_units` of the `columns` (their units then read as a header's are), but not
  where plain numbers beside the cells with a unit may be in another unit (an analyte medjax
  converts, its header giving no unit or another): which is which is unknown, so each cell
  with a unit stays a value that is not a number."""
  def keep(j, unit, plain):
    name, header_unit = analytes_lib.name_and_unit(frame.columns[j])
    return not (plain and analytes_lib.si_conversion(name)
                and analytes_lib.unit(header_unit) != analytes_lib.unit(unit))
  return columns_lib.cell_units(frame, columns, info, keep)


def _with_numbers(frame, lines, columns, categories, ids, found) -> list[int]:
  """`columns` without those of text and no number (`columns.only_text`: free text, or words
  that are not categories), which would be analytes no patient has; each is a 'column'
  problem, counted as info['text_columns']."""
  kept = []
  for j in columns:
    if j in categories or not columns_lib.only_text(frame.frame[j], frame.delimiter != ","):
      kept.append(j)
      continue
    lines.info["text_columns"] = lines.info.get("text_columns", 0) + 1
    found.append(_ignored(frame, lines, j, ids, "holds text and no number, and not categories "
                          f"(at most {categories_lib.MAX_CATEGORIES} distinct values, 5 rows each "
                          "on average, none that may identify a patient); its values are "
                          "ignored"))
  return kept


def _names_and_units(header, columns, categories, rename, analytes) -> tuple[list, dict]:
  """Each wide column's analyte name, and {column: unit} where its header gives one in brackets
  ('Creatinine (umol/L)': `analytes.name_and_unit`). A header config.data.rename maps or
  config.data.analytes names is that whole; so are two whose names without the unit would be
  one ('Glucose (mg/dL)' beside 'Glucose (mmol/L)')."""
  names, units = [], {}
  for j in columns:
    name, unit = header[j], ""
    if j not in categories and name not in rename and name not in analytes:
      name, unit = analytes_lib.name_and_unit(name)
    names.append(rename.get(name, name))
    if unit:
      units[j] = unit
  seen = collections.Counter(names)
  for i, j in enumerate(columns):
    if j in units and (seen[names[i]] > 1 or names[i] in header):
      names[i] = rename.get(header[j], header[j])
      del units[j]
  return names, units


def _in_known_units(frame, lines, columns, names, units, ids, found) -> tuple[list, list]:
  """`columns` and their `names` without those whose header gives a unit that is neither their
  analyte's conventional unit nor an SI unit of it medjax converts (`analytes.si_conversion`):
  'Creatinine (mmol/L)' read as mg/dL would be 11 times too small, plausible and wrong. Each
  is a 'column' problem, counted as info['units_not_converted']; a config.data.rename of the
  whole header reads its values as they are."""
  kept = []
  for j, name in zip(columns, names):
    conversion = analytes_lib.si_conversion(name)
    given = analytes_lib.unit(units.get(j, ""))
    if (not conversion or not given or given == analytes_lib.unit(conversion[0])
        or given in conversion[1]):
      kept.append((j, name))
      continue
    lines.info["units_not_converted"] = lines.info.get("units_not_converted", 0) + 1
    shown = lambda text: values_lib.shown(text, ids)
    found.append(_ignored(
        frame, lines, j, ids, f"is in {shown(units[j])}; medjax reads {shown(name)} in "
        f"{conversion[0]} and converts only {' or '.join(conversion[1])} to it, so its values "
        f"are ignored (convert them, or map the whole header to {shown(name)} with "
        f"config.data.rename to read them as {conversion[0]})"))
  return [j for j, _ in kept], [n for _, n in kept]


def _wide_in_conventional_units(frame, read, units, ranges, ids, info) -> None:
  """A wide column's values in an SI unit (`analytes.si_conversion`) converted in the frame to
  the conventional unit the plausible ranges use: where its header gives that unit
  (info['si_units_converted']), or, without one, where most of its values lie in the plausible
  range only read in it (haemoglobin 140 for 14.0 g/dL; info['si_units_by_value']). The unit
  decided, every value of the column is converted: a creatinine column mostly in µmol/L has
  its 35 µmol/L too. Each read column's unit goes to info['analyte_units'] (summary.json)."""
  rows = np.arange(len(frame.frame))
  for j, name in read:
    conversion = analytes_lib.si_conversion(name)
    if not conversion:
      factor = None
    elif j in units:
      factor = conversion[1].get(analytes_lib.unit(units[j]))
    else:
      factor = _si_by_value(frame, j, conversion[1], analytes_lib.range_for(ranges, name))
    if factor is not None:
      key = "si_units_converted" if j in units else "si_units_by_value"
      at = values_lib.convert(frame, j, rows, np.full(len(rows), factor), info)
      info[key] = info.get(key, 0) + len(at)
    unit = conversion[0] if factor is not None else units.get(j, "")
    if unit and not values_lib.withheld(unit, ids):
      info.setdefault("analyte_units", {})[name] = unit


def _si_by_value(frame, j, factors: dict[str, float], bounds) -> float | None:
  """The factor of the SI unit (of `factors`) column `j` is in, judged by its values: more of
  them lie in the plausible range `bounds` only read in it than in the conventional unit;
  None where none is, or without a range."""
  if bounds is None:
    return None
  v, kinds, _ = values_lib.numbers(frame.frame[j], frame.delimiter != ",", limits=True)
  v = v[(kinds == values_lib.OK) & ~np.isnan(v)]
  inside = (v >= bounds[0]) & (v <= bounds[1])
  best, most = None, int(inside.sum())
  for factor in factors.values():
    only = int(np.sum(~inside & (v * factor >= bounds[0]) & (v * factor <= bounds[1])))
    if only > most:
      best, most = factor, only
  return best


def _column_values(frame, read, index, rows, ranges, id_set) -> tuple[np.ndarray, list, dict]:
  """The (rows, analytes) values of the columns `read` ((column, analyte) pairs) in `rows`, their
  problems, and what they add to the file's info (bad values' counts, decimal commas, values
  at an assay's limit). Of columns giving one analyte, the first's value is used where both
  give one; where they differ, that is a 'values' problem."""
  values = np.full((len(rows), len(index)), np.nan, np.float32)
  found, info, first = [], {}, {}
  for j, name in read:
    # A column merged by name ('Sodium' into 'Na') is named as the file spells it.
    spelt = (frame.columns[j] if analytes_lib.key(frame.columns[j]) == analytes_lib.key(name)
             else name)
    v, probs, counts, notes = values_lib.read_values(frame, j, spelt, "column", ranges, id_set,
                                                     rows)
    a = index[name]
    if name in first:
      merged = info.setdefault("columns_merged", {})
      merged[name] = merged.get(name, 1) + 1
      differ = ~np.isnan(values[:, a]) & ~np.isnan(v) & ~np.isclose(values[:, a], v, rtol=1e-3)
      if differ.any():
        found.append(_differing(frame, (first[name], j), name, frame.lines[rows[differ]],
                                id_set))
      v = np.where(np.isnan(values[:, a]), v, values[:, a])
    first.setdefault(name, j)
    values[:, a] = v
    found += probs
    values_lib.count_values(info, counts, name)
    values_lib.add_counts(info, notes)
  return values, found, info


def _differing(frame, columns, name, at, ids) -> csvfile.Problem:
  """The 'values' problem of two columns giving analyte `name` different values on lines `at`."""
  kept, other = (values_lib.shown(frame.columns[j], ids) for j in columns)
  more = f" ({len(at)} rows, first on lines {', '.join(map(str, at[:5]))})" if len(at) > 1 else ""
  return csvfile.Problem(
      frame.source, int(at[0]), f"columns {kept} and {other} both give analyte "
      f"{values_lib.shown(name, ids)} and differ{more}; the value in {kept} is used",
      "values", len(at), tuple(int(x) for x in at[:values_lib.SHOWN_LINES]))


def _in_draw_order(frame, cols, rows, ids, info) -> tuple[np.ndarray, np.ndarray]:
  """`rows` with each patient's in the order of their draw times (`labs_long.draw_hours`; file
  order between equals), where the file has a draw time and a patient has several rows; and
  whether each (in that order) is a later draw than its patient's row before it."""
  later = np.zeros(len(rows), bool)
  if cols["time"] is None or not pd.Series(ids[rows]).duplicated().any():
    return rows, later
  codes, _ = pd.factorize(pd.Series(ids[rows], dtype=object))
  hours = labs_long.draw_hours(frame, cols, rows, info)
  order = np.lexsort((np.arange(len(rows)), hours, codes))
  codes, hours = codes[order], hours[order]
  later[1:] = (codes[1:] == codes[:-1]) & (hours[1:] > hours[:-1])
  return rows[order], later


def _one_row_per_patient(frame, lines, cols, read, index, ids, rows, ranges, id_set, found):
  """A wide file's (patients, values), one row per patient, as a long file's: each analyte's
  first usable value in draw order (`_in_draw_order`) wins, so a patient's later row (a later
  draw) fills the analytes its earlier rows left missing. A later row that adds none is set
  aside, a "duplicate patient row" unless drawn later (info['later_draws'] counts those); a
  later value of an analyte already given is not used, and reported unless drawn later."""
  rows, drawn_later = _in_draw_order(frame, cols, rows, ids, lines.info)
  values, probs, info = _column_values(frame, read, index, rows, ranges, id_set)
  codes, patients = pd.factorize(pd.Series(ids[rows], dtype=object))
  usable = ~np.isnan(values)
  later = pd.Series(codes).duplicated().to_numpy()
  given_before = ((pd.DataFrame(usable).groupby(codes).cumsum().to_numpy() - usable) > 0
                  if later.any() else np.zeros_like(usable))
  wins = usable & ~given_before
  aside = later & ~wins.any(axis=1)
  duplicate = aside & ~drawn_later
  first = values_lib.first_lines(ids[rows], frame.lines[rows], np.flatnonzero(duplicate))
  for i, line in zip(rows[duplicate], first):
    found.append(csvfile.Problem(frame.source, int(frame.lines[i]), "duplicate patient row (line "
                                 f"{line} has this patient); the row is set aside",
                                 patient=ids[i]))
  if aside.any():   # the values' problems and counts are of the rows kept only
    _, probs, info = _column_values(frame, read, index, rows[~aside], ranges, id_set)
  found += probs
  for key, n in info.items():   # the wide path is the only one to count the file's values
    lines.info[key] = lines.info.get(key, 0) + n if isinstance(n, int) else n
  repeated = usable & given_before & ~(aside | drawn_later)[:, None]
  for name, a in index.items():
    at = np.sort(frame.lines[rows[repeated[:, a]]])
    if len(at):
      more = (f" ({len(at)} such values, first on lines {', '.join(map(str, at[:5]))})"
              if len(at) > 1 else "")
      found.append(csvfile.Problem(
          frame.source, int(at[0]), f"column {name!r}: a later row of a patient gives it again "
          f"(the patient's first value is used){more}", "values",
          len(at), tuple(int(x) for x in at[:values_lib.SHOWN_LINES])))
  if (later & ~aside).any():
    lines.info["rows_merged"] = int(np.sum(later & ~aside))
  if drawn_later.any():
    lines.info["later_draws"] = int(drawn_later.sum())
  out = np.full((len(patients), len(index)), np.nan, np.float32)
  r, a = np.nonzero(wins)
  out[codes[r], a] = values[r, a]
  return np.asarray(patients, dtype=object), out


def _ignored(frame, lines, j: int, ids: set[str], what: str) -> csvfile.Problem:
  """A 'column' problem at the header line: "column <j + 1> (<its name as `values.shown` shows
  it>) <what>"."""
  return csvfile.Problem(frame.source, lines.header_line,
                         f"column {j + 1} ({values_lib.shown(frame.columns[j], ids)}) {what}",
                         "column")


def _unnamed(frame: csvfile.Frame, lines: csvfile.Lines) -> list[csvfile.Problem]:
  """Columns without a name are ignored; reported when they hold values."""
  out = []
  for j, name in enumerate(frame.columns):
    if not name:
      lines.info["unnamed_columns"] = lines.info.get("unnamed_columns", 0) + 1
      if (frame.frame[j].astype(str).str.strip() != "").any():
        out.append(csvfile.Problem(frame.source, lines.header_line, f"column {j + 1} has no "
                                   "name in the header; its values are ignored", "column"))
  return out


