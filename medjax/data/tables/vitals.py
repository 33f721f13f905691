"""vitals.csv: vital-sign series (patient, time, channels), resampled to fixed steps."""

from __future__ import annotations

import bisect
import dataclasses
from typing import Sequence

import numpy as np
import pandas as pd

from medjax.data.tables import analytes as analytes_lib
from medjax.data.tables import columns as columns_lib
from medjax.data.tables import csvfile
from medjax.data.tables import pressure
from medjax.data.tables import problems as problems_lib
from medjax.data.tables import timestamps
from medjax.data.tables import values as values_lib


@dataclasses.dataclass
class Vitals:
  """vitals.csv: ids (P,), float32 (P, T, C) values (NaN: not observed), rows past the last step."""
  ids: np.ndarray
  values: np.ndarray
  late: int


# A long file's names (by `csvfile.column_key`) of the default channels besides their own:
# what exports call them, and MIMIC-IV's chartevents itemids (d_items: 220045 Heart Rate,
# 220179/220180 and 220050/220051 non-invasive and arterial blood pressure systolic/diastolic,
# 220210 Respiratory Rate, 220277 O2 saturation pulseoxymetry, 223762 Temperature Celsius).
CHANNEL_NAMES = {
    "hr": ("heart rate", "heartrate", "pulse", "pulse rate", "ecg heart rate", "hr bpm",
           "220045"),
    "sbp": ("systolic blood pressure", "systolic bp", "non invasive blood pressure systolic",
            "arterial blood pressure systolic", "nbp systolic", "nbps", "sysbp", "nibp systolic",
            "nibp sys", "nibps", "bp systolic", "blood pressure systolic", "systolic",
            "systolic pressure", "sys bp", "abp systolic", "art bp systolic", "220179",
            "220050"),
    "dbp": ("diastolic blood pressure", "diastolic bp", "non invasive blood pressure diastolic",
            "arterial blood pressure diastolic", "nbp diastolic", "nbpd", "diasbp",
            "nibp diastolic", "nibp dia", "nibpd", "bp diastolic", "blood pressure diastolic",
            "diastolic", "diastolic pressure", "dia bp", "abp diastolic", "art bp diastolic",
            "220180", "220051"),
    "rr": ("respiratory rate", "resp rate", "respiration rate", "breathing rate", "resp",
           "respirations", "220210"),
    "spo2": ("o2 saturation pulseoxymetry", "oxygen saturation", "o2 saturation", "o2 sat",
             "pulse oximetry", "spo2 %", "pulse ox", "sp o2", "220277"),
    "temp": ("temperature", "temperature celsius", "temperature c", "body temperature",
             "temp c", "body temp", "temp celsius", "223762")}
# Temperatures given in Fahrenheit (MIMIC-IV charts most as 223761, Temperature Fahrenheit), by
# name or by unit: a long file's are converted to the 'temp' channel's Celsius.
FAHRENHEIT_NAMES = ("temperature fahrenheit", "temperature f", "temp f", "223761")
_FAHRENHEIT_UNITS = frozenset({"°f", "degf", "f", "degreesf", "fahrenheit", "℉"})


def read_vitals(path: str, channels: Sequence[str], steps: int, hours_per_step: float,
                problems: problems_lib.Problems,
                ranges: dict[str, tuple[float, float]] | None = None,
                fold_case: bool = False, rename: dict[str, str] | None = None,
                date_order: str = "auto", max_bytes: int = csvfile.MAX_BYTES) -> Vitals:
  """vitals.csv, wide: one row per patient and time, one column per channel (by its name,
  data.rename or the names exports give it: `_channel_columns`); or long: one row per
  measurement (patient, time, a name or code, a value: MIMIC's chartevents), its channels' rows
  gathered into one row per patient and time (`_gathered`). Temperatures are read in Celsius.

  Times are hours since admission (numbers, >= 0) or timestamps (`timestamps.times`: ISO
  8601, or '03/01/2020 10:00' in `date_order`) counted from the patient's first row; the kind
  most of the file's valid times have decides which. A row costs only itself: one whose time
  is empty, unparseable, negative or of the other kind is set aside;
  of a patient's timestamps, one cut off before the run holding most of the patient's rows by a
  gap over `steps` x `hours_per_step` hours is set aside (a mistyped year must not move the
  series); of the rest, the longest run in time order (in file order) is kept, and a row out of
  that order or repeating a kept row's time is set aside. Rows are resampled into `steps` bins of
  `hours_per_step` hours (mean of the rows in a bin); rows past the last bin are counted.
  """
  ranges = analytes_lib.value_ranges() if ranges is None else ranges
  cols = {}

  def text_columns(lines):
    cols["header"] = header = values_lib.renamed(lines.header, rename)
    cols["pid"] = csvfile.find_column(lines, values_lib.PATIENT_COLUMNS, "patient id", header)
    cols["time"] = csvfile.find_column(lines, values_lib.TIME_COLUMNS, "time", header)
    cols["channels"], cols["fahrenheit"], cols["named"] = _channel_columns(
        lines.header, channels, rename or {})
    missing = _missing_channels(lines.header, channels, cols)
    cols["long"] = values_lib.long_columns(header) if missing else {}
    if cols["long"]:
      return [j for j in range(len(lines.header))
              if j not in (cols["time"], cols["long"]["value"])]
    if missing:
      # The header is not echoed: a cell of it may hold anything, an identifier included.
      raise csvfile.refuse(
          lines.path, f"channel columns {missing} not found among its {len(lines.header)} "
          f"columns (config.data.vitals_channels={list(channels)}, compared ignoring case, "
          "spaces, '_', '-' and '.'); rename the columns or set config.data.vitals_channels (a "
          "long file, one row per measurement, names them in an analyte column, one of "
          f"{list(values_lib.ANALYTE_COLUMNS)} or by code {list(values_lib.ANALYTE_CODE_COLUMNS)}, "
          f"beside a value column, one of {list(values_lib.VALUE_COLUMNS)})")
    return [cols["pid"]] + [j for j in range(len(lines.header))
                            if j != cols["time"] and j not in cols["channels"]]

  lines, frame = csvfile.load(path, text_columns, max_bytes)
  timestamps.with_dates(frame, cols["time"], cols["header"], lines.info)
  frame = _channels_frame(frame, lines, cols, channels, ranges, rename or {}, fold_case)
  ids, id_set = values_lib.read_ids(frame, lines, cols["pid"], fold_case, problems)
  found = list(frame.problems)   # now with their patients
  hours, kind = timestamps.times(frame.frame[cols["time"]], frame.delimiter != ",", date_order,
                                 lines.info)
  # Most of the file's valid times decide whether its times are hours or timestamps: a row of
  # the other kind is a typo that costs its own row, wherever it is.
  named = ids != ""
  numeric_file = int(np.sum(named & (kind == 1))) >= int(np.sum(named & (kind == 2)))
  window = steps * hours_per_step
  rows = _rows_in_time_order(frame, cols, ids, id_set, hours, kind, numeric_file, window, found)
  codes, patients = pd.factorize(pd.Series(ids[rows], dtype=object))
  offset = hours[rows]
  if not numeric_file:  # Timestamps count from the patient's first (earliest) row.
    offset = offset - pd.Series(offset).groupby(codes).transform("min").to_numpy()
  step_f = np.floor(offset / hours_per_step)
  inside = step_f < steps
  late = int(np.sum(~inside))
  if numeric_file and late and not inside.any():
    found.append(csvfile.Problem(
        frame.source, lines.header_line, f"every row's {frame.columns[cols['time']]!r} lies past "
        f"the last step ({window:g} hours: data.vitals_steps x vitals_hours_per_step): are they "
        "hours since admission? Epoch seconds or milliseconds and spreadsheet day numbers are "
        "not; the rows are counted as past the last step", "column"))
  bins = (rows[inside], codes[inside] * steps + step_f[inside].astype(np.int64))
  values = _binned(frame, lines, cols, channels, ranges, id_set, bins, (len(patients), steps),
                   found)
  lines.info["rows_past_last_step"] = late
  problems.files[frame.source] = lines.info
  problems.extend(found)
  return Vitals(np.asarray(patients, dtype=object), values, late)


def _binned(frame, lines, cols, channels, ranges, id_set, bins, shape, found) -> np.ndarray:
  """The (patients, steps, channels) means of each channel's values in the rows `bins[0]`, each
  in its bin `bins[1]` (patient x steps + step); the values' problems go to `found`."""
  values = np.full((*shape, len(channels)), np.nan, np.float32)
  for c, (channel, j) in enumerate(zip(channels, cols["channels"])):
    v, probs, counts, notes = values_lib.read_values(
        frame, j, channel, "column", ranges, id_set, bins[0])
    found += probs
    values_lib.count_values(lines.info, counts, channel)
    values_lib.add_counts(lines.info, notes)
    values[:, :, c] = _bin_means(v, bins[1], shape[0] * shape[1]).reshape(shape)
  return values


def _rows_in_time_order(frame: csvfile.Frame, cols: dict, ids: np.ndarray, id_set: set[str],
                        hours: np.ndarray, kind: np.ndarray, numeric_file: bool, window: float,
                        found: list) -> np.ndarray:
  """The rows kept (see `read_vitals`), in file order; every other row is set aside with its
  reason (a Problem in `found`)."""
  tcells = frame.frame[cols["time"]].to_numpy(object)
  shown = lambda i: values_lib.shown(tcells[i], id_set)

  def set_aside(mask, reason_of):
    for i in np.flatnonzero(mask):
      found.append(csvfile.Problem(frame.source, int(frame.lines[i]), reason_of(i),
                                   patient=ids[i]))
    return ~mask

  pid_name, time_name = frame.columns[cols["pid"]], frame.columns[cols["time"]]
  kept = set_aside(ids == "", lambda i: f"empty {pid_name!r}; the row is set aside")
  empty = pd.isna(tcells) | (pd.Series(tcells, dtype=object).astype(str).str.strip() == "")
  kept &= set_aside(kept & empty.to_numpy(bool), lambda i: (
      f"empty {time_name!r}; the row is set aside"))
  kept &= set_aside(kept & (kind == 0), lambda i: (
      f"time {shown(i)} is neither hours nor an ISO timestamp; the row is set aside"))
  kept &= set_aside(kept & (kind == (2 if numeric_file else 1)), lambda i: (
      f"time {shown(i)} is {'a timestamp' if numeric_file else 'hours'} but most of the "
      f"file's times are {'hours' if numeric_file else 'timestamps'}; the row is set aside"))
  kept &= set_aside(kept & (kind == 1) & (hours < 0), lambda i: (
      f"negative time {shown(i)}; the row is set aside"))
  if not numeric_file:
    early = _before_the_series(ids, hours, kept, window)
    kept &= set_aside(early, lambda i: (
        f"time {shown(i)} lies more than {window:g} hours before the run of times that holds "
        "most of this patient's rows (a mistyped date?); the row is set aside"))
  out_of_order, repeated = _off_the_longest_run(ids, hours, kept)
  set_aside(out_of_order, lambda i: f"row out of time order ({time_name} {shown(i)} among this "
            "patient's rows in time order); the row is set aside")
  set_aside(repeated, lambda i: f"duplicate time {shown(i)} for this patient; the row is set "
            "aside")
  return np.flatnonzero(kept & ~out_of_order & ~repeated)


def _gathered(frame: csvfile.Frame, lines: csvfile.Lines, cols: dict, channels: Sequence[str],
              rename: dict[str, str], fold_case: bool) -> csvfile.Frame:
  """A long file's frame as a wide one: a row per patient and time (as written; at its first
  line), a column per channel holding its value as written, for the wide path to read. A row's
  name is a channel by `rename`, by its own name or by `CHANNEL_NAMES`; rows of other
  measurements (chartevents' hundreds of items) are counted (info['rows_other_items']), and a
  channel given twice for one patient and time keeps its first value, the later row set aside
  with its reason. `cols` then names the wide frame's columns."""
  long = cols["long"]
  values_lib.name_malformed(frame, lines, cols["pid"], fold_case)   # by the file's own column
  if long["text"] is not None:
    values_lib.fill_from_text(frame, long["value"], long["text"], lines.info)
  keys = {csvfile.column_key(c): i for i, c in enumerate(channels)}
  keys.update({csvfile.column_key(n): keys[c] for c, names in CHANNEL_NAMES.items()
               if c in keys for n in names})
  keys.update({csvfile.column_key(n): keys["temp"] for n in FAHRENHEIT_NAMES if "temp" in keys})
  keys.update({csvfile.column_key(n): keys[csvfile.column_key(c)] for n, c in rename.items()
               if csvfile.column_key(c) in keys})
  frame = pressure.split_rows(frame, lines, long, channels, keys)
  names = columns_lib.long_units(frame, long, frame.frame[long["analyte"]].to_numpy(object), (),
                                 lines.info)
  channel = values_lib.map_unique(
      names, lambda s: keys.get(csvfile.column_key(s), -1)).astype(np.int64)
  value = _in_celsius(frame, long, names, channel == keys.get("temp", -1), lines.info)
  pid = values_lib.normalize_ids(frame.frame[cols["pid"]].to_numpy(object), fold_case)
  when = frame.frame[cols["time"]].astype(str).str.strip().to_numpy(object)
  rows = np.flatnonzero(channel >= 0)
  lines.info["rows_other_items"] = int(np.sum((channel < 0) & (pid != "")))
  group, _ = pd.factorize(pd.Series(pid[rows] + "\x1f" + when[rows], dtype=object))
  first = rows[np.unique(group, return_index=True)[1]]
  dup = pd.Series(group * len(channels) + channel[rows]).duplicated().to_numpy()
  cell = np.flatnonzero(~dup)
  wide = np.full((len(first), len(channels)), "", object)
  wide[group[cell], channel[rows[cell]]] = value[rows[cell]]
  for i in rows[dup]:
    frame.problems.append(csvfile.Problem(
        frame.source, int(frame.lines[i]), f"duplicate value for channel "
        f"{channels[channel[i]]!r} at this time for this patient; the row is set aside",
        patient=pid[i]))
  out = pd.DataFrame({0: frame.frame[cols["pid"]].iloc[first].to_numpy(object),
                      1: frame.frame[cols["time"]].iloc[first].to_numpy(),
                      **{2 + c: wide[:, c] for c in range(len(channels))}})
  names = [frame.columns[cols["pid"]], frame.columns[cols["time"]], *channels]
  cols.update(pid=0, time=1, channels=list(range(2, 2 + len(channels))), fahrenheit=None)
  return dataclasses.replace(frame, columns=names, frame=out, lines=frame.lines[first])


def _missing_channels(header: Sequence[str], channels: Sequence[str], cols: dict) -> list[str]:
  """The channels without a column in a wide header; sbp and dbp not among them where a
  combined pressure column ('BP': 120/80) gives them (cols['pressure'])."""
  split = ("sbp", "dbp")
  cols["pressure"] = None
  if any(j is None and csvfile.column_key(c) in split
         for c, j in zip(channels, cols["channels"])):
    cols["pressure"] = pressure.column(header, cols["channels"])
  return [c for c, j in zip(channels, cols["channels"]) if j is None
          and not (cols["pressure"] is not None and csvfile.column_key(c) in split)]


def _channels_frame(frame: csvfile.Frame, lines: csvfile.Lines, cols: dict,
                    channels: Sequence[str], ranges, rename: dict[str, str],
                    fold_case: bool) -> csvfile.Frame:
  """The file's frame with a column per channel (a long file's gathered, `_gathered`; a wide
  file's columns named, `_channel_columns`, without a line of units under the header,
  `columns.without_units_row`), temperatures in Celsius."""
  row_units = {}
  if cols["long"]:
    frame = _gathered(frame, lines, cols, channels, rename, fold_case)
  else:
    frame, row_units = columns_lib.without_units_row(frame, cols["pid"], lines.info)
    if cols["named"]:
      lines.info["channel_columns"] = cols["named"]
    if cols["pressure"] is not None:
      pressure.split_column(frame, lines, cols, channels)
  units = {} if cols["long"] else {**row_units,
                                   **columns_lib.cell_units(frame, cols["channels"], lines.info)}
  temp = [c for c, name in enumerate(channels) if csvfile.column_key(name) == "temp"]
  if temp and cols["channels"][temp[0]] is not None:
    j = cols["channels"][temp[0]]
    fahrenheit = (cols["fahrenheit"] is not None
                  or csvfile.column_key(units.get(j, "")) in _FAHRENHEIT_UNITS)
    _temperatures_in_celsius(frame, j, fahrenheit,
                             analytes_lib.range_for(ranges, channels[temp[0]]), lines.info)
  return frame


def _channel_columns(header: Sequence[str], channels: Sequence[str],
                     rename: dict[str, str]) -> tuple[list, int | None, dict[str, str]]:
  """Each channel's column in a wide file (None where it has none): by the channel's own name, a
  name config.data.rename maps to it, or a name exports give a default channel (`CHANNEL_NAMES`:
  'Heart Rate' for hr), each as the whole header cell or before a unit in brackets ('Heart Rate
  (bpm)', 'SpO2 [%]'). The temp channel's may be a column in Fahrenheit (`FAHRENHEIT_NAMES`, or a
  unit of °F), returned second: its values are converted. A column serves one channel. Third:
  {channel: column's name} where it is not named as its channel, for the ingest table (a header
  cell shown only where it spells a name of those lists or the config's, so without its unit)."""
  split = [analytes_lib.UNIT_SUFFIX.match(str(h)) for h in header]
  bases = [m[1] if m else str(h) for m, h in zip(split, header)]
  units = [csvfile.column_key(m[2]) if m else "" for m in split]
  keys = ([csvfile.column_key(h) for h in header], [csvfile.column_key(b) for b in bases])
  aliases = {csvfile.column_key(c): names for c, names in CHANNEL_NAMES.items()}
  taken, found, fahrenheit, named = set(), [], None, {}

  def first(names):
    return next((j for k in map(csvfile.column_key, names) for spelt in keys
                 for j, x in enumerate(spelt) if x == k and j not in taken), None)

  for channel in channels:
    key = csvfile.column_key(channel)
    j = first([channel, *(n for n, to in rename.items() if csvfile.column_key(to) == key),
               *aliases.get(key, ())])
    if j is None and key == "temp":
      j = fahrenheit = first(FAHRENHEIT_NAMES)
    elif j is not None and key == "temp" and units[j] in _FAHRENHEIT_UNITS:
      fahrenheit = j
    if j is not None:
      taken.add(j)
      if keys[0][j] != key:
        named[channel] = bases[j].strip()
    found.append(j)
  return found, fahrenheit, named


def _temperatures_in_celsius(frame: csvfile.Frame, j: int, fahrenheit: bool, bounds,
                             info: dict) -> None:
  """The temp channel's column `j` in Celsius: every value of a column named as Fahrenheit
  (counted as info['fahrenheit_to_celsius']); and where most of a column's values lie outside
  the plausible range `bounds` in Celsius but inside it read as Fahrenheit (98.6: a US export's
  column), those values (info['fahrenheit_by_value']). A column mostly in Celsius keeps its odd
  Fahrenheit value, set aside as out of range: one value says nothing of the column's unit."""
  col = frame.frame[j]
  v, kinds, _ = values_lib.numbers(col, frame.delimiter != ",")
  usable = (kinds == values_lib.OK) & ~np.isnan(v)
  celsius = (v - 32.0) * 5.0 / 9.0
  if fahrenheit:
    convert, key = usable, "fahrenheit_to_celsius"
  elif bounds is None:
    return
  else:
    inside = usable & (v >= bounds[0]) & (v <= bounds[1])
    convert = usable & ~inside & (celsius >= bounds[0]) & (celsius <= bounds[1])
    if convert.sum() <= inside.sum():
      return
    key = "fahrenheit_by_value"
  values_lib.set_cells(frame, j, np.flatnonzero(convert), celsius[convert])
  info[key] = info.get(key, 0) + int(convert.sum())


def _in_celsius(frame: csvfile.Frame, long: dict, names: np.ndarray, temp: np.ndarray,
                info: dict) -> np.ndarray:
  """A long file's value cells, its temperatures in Fahrenheit (`FAHRENHEIT_NAMES`, or a unit
  of °F) converted to Celsius (counted as info['fahrenheit_to_celsius']); a cell that is no
  number stays as written, for the wide path to report."""
  value = frame.frame[long["value"]].to_numpy(object).copy()
  fahrenheit = {csvfile.column_key(n) for n in FAHRENHEIT_NAMES}
  given_f = values_lib.map_unique(names, lambda s: csvfile.column_key(s) in fahrenheit)
  if long["unit"] is not None:
    given_f = given_f | values_lib.map_unique(
        frame.frame[long["unit"]].to_numpy(object),
        lambda s: csvfile.column_key(s) in _FAHRENHEIT_UNITS)
  rows = np.flatnonzero(temp & given_f.astype(bool))
  if len(rows):
    v, kinds, _ = values_lib.numbers(pd.Series(value[rows], dtype=object),
                                     frame.delimiter != ",")
    ok = kinds == values_lib.OK
    value[rows[ok]] = (v[ok] - 32.0) * 5.0 / 9.0
    info["fahrenheit_to_celsius"] = int(np.sum(ok & ~np.isnan(v)))
  return value


def _patient_order(ids: np.ndarray, rows: np.ndarray, hours: np.ndarray) -> tuple:
  """`rows` sorted by (patient, time) and each one's patient code (stable: file order breaks
  ties)."""
  codes, _ = pd.factorize(pd.Series(ids[rows], dtype=object))
  order = np.lexsort((hours[rows], codes))
  return rows[order], codes[order]


def _before_the_series(ids: np.ndarray, hours: np.ndarray, kept: np.ndarray,
                       window: float) -> np.ndarray:
  """Rows (a mask) of patients' timestamps cut off before their series: a patient's times,
  sorted, split into runs wherever two are more than `window` hours apart; the series starts
  at the run holding most rows (the earliest of equals), and rows of runs before it are cut
  off (a mistyped year would otherwise move the series' origin years away). A stay longer
  than the window, recorded without such a gap, is one run: it starts at its first row."""
  rows = np.flatnonzero(kept)
  out = np.zeros(len(ids), bool)
  if not len(rows):
    return out
  sorted_rows, codes = _patient_order(ids, rows, hours)
  t = hours[sorted_rows]
  new_patient = np.concatenate([[True], codes[1:] != codes[:-1]])
  gap = np.concatenate([[0.0], np.diff(t)]) > window
  run = np.cumsum(new_patient | gap)          # a run id, unique across patients
  size = np.bincount(run)[run]
  best = pd.Series(size).groupby(codes).transform("max").to_numpy()
  first_best = pd.Series(np.where(size == best, run, np.iinfo(np.int64).max)).groupby(
      codes).transform("min").to_numpy()
  out[sorted_rows[run < first_best]] = True
  return out


def _off_the_longest_run(ids: np.ndarray, hours: np.ndarray,
                         kept: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(out of order, repeated): masks of the kept rows off each patient's longest run of rows
  in strictly increasing time (in file order), split by whether the row's time equals a kept
  row's. Patients whose rows are in order already (the usual case) cost no Python loop.

  The order is the file's: a file written newest first (three or more of its steps, and three
  quarters of them, go back in time) runs backwards. Where a patient's longest run holds under
  half of its rows, the file keeps no order for that patient (an export without ORDER BY), so
  its order shows no typo: every row is kept but those repeating an earlier row's time."""
  out_of_order, repeated = np.zeros(len(ids), bool), np.zeros(len(ids), bool)
  rows = np.flatnonzero(kept)
  if not len(rows):
    return out_of_order, repeated
  codes, _ = pd.factorize(pd.Series(ids[rows], dtype=object))
  step = pd.Series(hours[rows]).groupby(codes).diff().to_numpy()
  back, forward = int(np.sum(step < 0)), int(np.sum(step > 0))
  sign = -1.0 if back >= 3 and back >= 3 * forward else 1.0
  unordered = np.flatnonzero(
      pd.Series(sign * step <= 0).groupby(codes).transform("any").to_numpy())
  # Each such patient's rows, in file order, by one stable sort: selecting them patient by
  # patient took rows x patients (200,000 patients newest first: 165 s).
  by_patient = unordered[np.argsort(codes[unordered], kind="stable")]
  for group in np.split(by_patient, np.flatnonzero(np.diff(codes[by_patient])) + 1):
    if not len(group):
      continue
    mine = rows[group]
    longest = _longest_increasing(sign * hours[mine])
    if 2 * len(longest) < len(mine):
      longest = np.unique(hours[mine], return_index=True)[1]   # each time's first row
    run = set(mine[longest].tolist())
    times = {hours[i] for i in run}
    for i in mine:
      if i not in run:
        (repeated if hours[i] in times else out_of_order)[i] = True
  return out_of_order, repeated


def _longest_increasing(values: np.ndarray) -> np.ndarray:
  """Indices of the longest strictly increasing subsequence of `values`; of several, the one
  that keeps the earliest rows (a later row contradicting earlier ones is the odd one)."""

  def run_lengths(v):   # the longest strictly increasing run ending at each element
    tails, out = [], []
    for x in v:
      j = bisect.bisect_left(tails, x)
      tails[j:j + 1] = [x]
      out.append(j + 1)
    return np.array(out)

  ending = run_lengths(values)
  starting = run_lengths(-values[::-1])[::-1]   # the longest run starting at each element
  length = int(ending.max()) if len(values) else 0
  on_a_longest = ending + starting - 1 == length
  picked, need, last = [], 1, -np.inf
  for i, x in enumerate(values):
    if need <= length and on_a_longest[i] and ending[i] == need and x > last:
      picked.append(i)
      need, last = need + 1, x
  return np.array(picked, np.int64)


def _bin_means(v: np.ndarray, flat: np.ndarray, cells: int) -> np.ndarray:
  """The mean of the observed values `v` in each of `cells` bins (`flat`: each value's bin);
  NaN where a bin has none."""
  seen = ~np.isnan(v)
  total = np.bincount(flat[seen], weights=v[seen], minlength=cells)
  count = np.bincount(flat[seen], minlength=cells)
  with np.errstate(invalid="ignore", divide="ignore"):
    return np.where(count > 0, total / np.maximum(count, 1), np.nan)
