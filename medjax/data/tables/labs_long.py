"""labs.csv in the long format: one row per measurement (a patient, an analyte by name or
code, a value, optionally a unit and a time): MIMIC's labevents, OMOP's measurement, Epic's."""

from __future__ import annotations

import numpy as np
import pandas as pd

from medjax.data.tables import analytes as analytes_lib
from medjax.data.tables import categories as categories_lib
from medjax.data.tables import columns as columns_lib
from medjax.data.tables import csvfile
from medjax.data.tables import timestamps
from medjax.data.tables import values as values_lib


# A lab row's draw time, in order of preference: a time (`values.TIME_COLUMNS`: MIMIC's
# charttime, OMOP's measurement_datetime), else a date (an export's collection or result date),
# so that a patient's earliest draw is the one kept, wide or long.
DRAW_TIME_COLUMNS = values_lib.TIME_COLUMNS + (
    "collection_datetime", "collected_datetime", "specimen_datetime", "result_datetime",
    "date_time") + timestamps.DATE_COLUMNS


def read_long(lines, frame, cols, analytes, rename, problems, ranges,
              fold_case) -> tuple[list, np.ndarray, np.ndarray]:
  """A long labs.csv (an analyte and a value column: `labs.read_labs`): (analytes, patient
  ids, (P, L) values), each patient's earliest usable value of each analyte."""
  ids, id_set = values_lib.read_ids(frame, lines, cols["pid"], fold_case, problems)
  source, found = frame.source, list(frame.problems)   # now with their patients
  names = values_lib.one_spelling(
      values_lib.map_unique(frame.frame[cols["analyte"]].to_numpy(object),
                            lambda s: rename.get(s.strip(), s.strip())),
      analytes, lines.info, "analytes_merged_by_case")
  names = columns_lib.long_units(frame, cols, names, analytes, lines.info)
  names = one_name_per_analyte(names, analytes, problems.known_ids, lines.info)
  frame, names, ids = categories_lib.long_rows(frame, cols, names, ids, analytes or None,
                                               problems.known_ids, lines.info)
  if not analytes:
    # Analytes from the cells: a name that may identify a patient (an id in the wrong column)
    # becomes no analyte, which would carry it into tables.npz; its rows are set aside below.
    # A code ('50912') is one unless it is a patient's id.
    identifying = ((lambda n: n.casefold() in problems.known_ids) if cols["codes"] else
                   (lambda n: values_lib.withheld(n, problems.known_ids)))
    analytes = sorted(n for n in set(names[(ids != "") & (names != "")]) if not identifying(n))
  if cols["codes"]:
    lines.info["analyte_codes"] = frame.columns[cols["analyte"]]
  index = {a: i for i, a in enumerate(analytes)}
  empty = ids == ""
  for i in np.flatnonzero(empty):
    found.append(csvfile.Problem(source, int(frame.lines[i]),
                                 f"empty {frame.columns[cols['pid']]!r}; the row is set aside"))
  column = np.array([index.get(n, -1) for n in names], np.int64)
  unknown = ~empty & (column < 0)
  for i in np.flatnonzero(unknown):
    found.append(csvfile.Problem(
        source, int(frame.lines[i]), f"analyte {values_lib.shown(names[i], id_set)} not in "
        f"config.data.analytes ({len(analytes)} names); add it or map it with "
        "config.data.rename; the row is set aside", patient=ids[i]))
  if cols["text"] is not None:
    values_lib.fill_from_text(frame, cols["value"], cols["text"], lines.info)
  rows = np.flatnonzero(~empty & ~unknown)
  if cols["unit"] is not None:
    _in_conventional_units(frame, cols, rows, column[rows], analytes, lines.info)
  values = np.full(len(rows), np.nan)
  order = np.argsort(column[rows], kind="stable")
  bounds = np.flatnonzero(np.diff(column[rows][order])) + 1
  for sel in np.split(order, bounds) if len(rows) else []:
    name = analytes[column[rows[sel[0]]]]
    if cols["unit"] is not None:
      sel = _in_one_unit(frame, cols, rows, sel, name, ids, id_set, lines.info, found)
    v, probs, counts, notes = values_lib.read_values(frame, cols["value"], name, "analyte",
                                                     ranges, id_set, rows[sel])
    values[sel] = v
    found += probs
    values_lib.count_values(lines.info, counts, name)
    values_lib.add_counts(lines.info, notes)
  usable = ~np.isnan(values)
  rows, values = rows[usable], values[usable]
  codes, patients = pd.factorize(pd.Series(ids[rows], dtype=object))
  out = np.full((len(patients), len(analytes)), np.nan, np.float32)
  keys = codes.astype(np.int64) * max(len(analytes), 1) + column[rows]
  kept = _earliest_draws(frame, cols, rows, keys, names, ids, id_set, lines.info, found)
  out[codes[kept], column[rows[kept]]] = values[kept]
  problems.files[source] = lines.info
  problems.extend(found)
  return list(analytes), np.asarray(patients, dtype=object), out


def one_name_per_analyte(names, analytes, known_ids, info) -> np.ndarray:
  """The names exports give one analyte (`analytes.same_analyte`: 'Platelets', 'PLT' and
  'Platelet Count', as two lab systems' rows merged into one file spell them; a long file's
  rows' or a wide file's columns') as one, spelt as config.data.analytes spells it, else as
  most rows do (ties: the first seen); a name that
  config.data.analytes lists, or that may identify a patient, stays itself. The merges go to
  info['analytes_merged_by_name'] (summary.json's tables.labs.csv)."""
  codes, uniques = pd.factorize(pd.Series(names, dtype=object))
  counts = np.bincount(codes[codes >= 0], minlength=len(uniques))
  mergeable = [n for n in uniques[np.argsort(-counts, kind="stable")]   # most rows first
               if n and n not in analytes and not values_lib.withheld(n, known_ids)]
  spelling = {}
  for name in [*analytes, *mergeable]:
    spelling.setdefault(analytes_lib.same_analyte(name), name)
  merged = {n: spelling[analytes_lib.same_analyte(n)] for n in sorted(mergeable)}
  merged = {n: spelt for n, spelt in merged.items() if spelt != n}
  if not merged:
    return names
  info["analytes_merged_by_name"] = merged
  return values_lib.map_unique(names, lambda n: merged.get(n, n))


def _in_conventional_units(frame, cols, rows, analyte_of, names, info) -> None:
  """The values of `rows` (of analytes `names[analyte_of]`) in an SI unit of their analyte's
  (`analytes.si_conversion`: creatinine µmol/L, haemoglobin g/L, a European export's) converted
  in the frame to the conventional unit the plausible ranges use, their unit cells with them,
  where each such value was out of range or set aside as in another unit than its other rows;
  counted as info['si_units_converted']."""
  units = values_lib.map_unique(frame.frame[cols["unit"]].to_numpy(object)[rows],
                                analytes_lib.unit)
  factor = np.full(len(rows), np.nan)
  unit = np.empty(len(rows), object)
  for a, name in enumerate(names):
    conversion = analytes_lib.si_conversion(name)
    if conversion:
      of = analyte_of == a
      factor[of] = values_lib.map_unique(units[of], lambda u, f=conversion[1]: f.get(u, np.nan))
      unit[of] = conversion[0]
  at = values_lib.convert(frame, cols["value"], rows, factor, info)
  if len(at):
    values_lib.set_cells(frame, cols["unit"], rows[at], unit[at])
    info["si_units_converted"] = len(at)


def _in_one_unit(frame, cols, rows, sel, name, ids, id_set, info, found) -> np.ndarray:
  """Of analyte `name`'s rows (`rows[sel]`), those in its unit: the unit most of its rows give
  (ties: the first seen). A row in a multiple of it (`analytes.rescale`: mg/dL beside mg/L) is
  converted to it, counted as info['units_rescaled']; a row in another unit is set aside, its
  value on another scale; a row without a unit is kept (pH, INR and many exports have none).
  The units go to info['analyte_units'] (summary.json's tables.labs.csv)."""
  written = frame.frame[cols["unit"]].to_numpy(object)[rows[sel]]
  units = values_lib.map_unique(written, analytes_lib.unit)
  if analytes_lib.key(name) in analytes_lib.MONOVALENT:   # 1 mEq/L of a monovalent ion is 1 mmol/L
    units[units == "meq/l"] = "mmol/l"
  given = units != ""
  if not given.any():
    return sel
  codes, uniques = pd.factorize(pd.Series(units[given], dtype=object))
  most = np.bincount(codes).argmax()   # ties: the first seen
  major, spelt = uniques[most], written[given][codes == most][0]
  # A unit cell may hold what identifies a patient (a shifted row): summary.json never has it.
  info.setdefault("analyte_units", {})[name] = (values_lib.shown(spelt, id_set)
                                               if values_lib.withheld(spelt, id_set)
                                               else str(spelt).strip())
  other = given & (units != major)
  factor = _rescaled(frame, cols["value"], rows[sel], units, major, other)
  at = np.flatnonzero(other)[values_lib.convert(frame, cols["value"], rows[sel[other]],
                                                factor[other], info)]
  if len(at):
    other[at] = False
    info["units_rescaled"] = info.get("units_rescaled", 0) + len(at)
  for i, text in zip(rows[sel[other]], written[other]):
    found.append(csvfile.Problem(
        frame.source, int(frame.lines[i]), f"analyte {values_lib.shown(name, id_set)} in "
        f"{values_lib.shown(text, id_set)}, where most of its rows are in "
        f"{values_lib.shown(spelt, id_set)}; convert the values to that unit or give them "
        "another analyte name; the row is set aside", patient=ids[i]))
  return sel[~other]


def _rescaled(frame, value_column, rows, units, major, other) -> np.ndarray:
  """Per row of `rows` (one analyte's), the factor taking its value from its unit to `major`
  where its unit is an `other` one and a multiple of `major` (`analytes.rescale`), and where
  its values, so converted, lie nearer (their median, on a log scale) to the major unit's rows
  than as written, or its unit is `major` spelt another way (µg/mL and mg/L): a wrong unit cell
  (haemoglobin 13.5 'mg/dL' among g/dL rows) leaves its rows to be set aside. NaN elsewhere."""
  factor = np.full(len(rows), np.nan)
  if not other.any():
    return factor
  v, kinds, _ = values_lib.numbers(frame.frame[value_column].iloc[rows],
                                   frame.delimiter != ",", limits=True)
  positive = (kinds == values_lib.OK) & (v > 0)
  def median_log(sel):
    return np.median(np.log(v[sel & positive])) if (sel & positive).any() else None
  typical = median_log(units == major)
  for u in set(units[other].tolist()):
    scale, of = analytes_lib.rescale(u, major), other & (units == u)
    written = median_log(of)
    if scale and (np.isclose(scale, 1.0) or typical is not None and written is not None and (
        abs(written + np.log(scale) - typical) < abs(written - typical))):
      factor[of] = scale
  return factor


def draw_hours(frame, cols, rows, info) -> np.ndarray:
  """The draw times of `rows` in hours by the file's time column (cols['time'], of
  `DRAW_TIME_COLUMNS`), an unreadable one after every readable one; all 0 without one."""
  if cols.get("time") is None:
    return np.zeros(len(rows))
  hours, kind = timestamps.times(frame.frame[cols["time"]].iloc[rows], frame.delimiter != ",",
                                 cols.get("date_order", "auto"), info)
  return np.where(kind > 0, hours, np.inf)


def _earliest_draws(frame, cols, rows, keys, names, ids, id_set, info, found) -> np.ndarray:
  """Of a long file's usable `rows`, the one kept for each patient and analyte (`keys`), as an
  index into `rows`: the earliest by the file's time column (a charttime), if it has one, else
  the first in the file. A later draw is what such a file holds (MIMIC's labevents: hundreds per
  patient), counted as info['later_draws']; a second value at the same time, or in a file
  without times, is a duplicate, set aside with its reason."""
  hours = draw_hours(frame, cols, rows, info)
  order = np.lexsort((np.arange(len(rows)), hours, keys))
  dup = np.zeros(len(rows), bool)
  dup[order[1:]] = keys[order[1:]] == keys[order[:-1]]
  kept = order[~dup[order]]
  first = np.empty(len(rows), np.int64)
  first[order] = kept[np.cumsum(~dup[order]) - 1]   # each row's kept row
  same_time = dup & (hours == hours[first])
  # A categorical analyte's row is one row per indicator (`categories.long_rows`), all at its
  # line: counted and reported once, under the analyte's name.
  if cols["time"] is not None and (dup & ~same_time).any():
    info["later_draws"] = len(pd.unique(frame.lines[rows[dup & ~same_time]]))
  parents = info.get("categorical_analytes", {})
  reported = set()
  for j in np.flatnonzero(same_time):
    i = rows[j]
    if int(frame.lines[i]) in reported:
      continue
    reported.add(int(frame.lines[i]))
    name = names[i].rsplit("=", 1)[0] if names[i].rsplit("=", 1)[0] in parents else names[i]
    found.append(csvfile.Problem(
        frame.source, int(frame.lines[i]), f"duplicate value for analyte "
        f"{values_lib.shown(name, id_set)} (line {int(frame.lines[rows[first[j]]])} has "
        "it for this patient" + (" at this time" if cols["time"] is not None else "")
        + "); the row is set aside", patient=ids[i]))
  return np.sort(kept)
