"""A table's time column: hours since admission, ISO 8601 timestamps, and dates as exports
write them ('03/01/2020 10:00 PM', '01.03.2020 10:00'), their day and month order decided per
file (config.data.date_order)."""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd

from medjax import errors
from medjax.data.tables import csvfile
from medjax.data.tables import values as values_lib

DATE_ORDERS = ("auto", "month_first", "day_first")
# A table's date column: a lab draw's when it has no time, or the date beside a time of day
# ('Date' 2024-01-01 beside 'Time' 08:30, as a flowsheet export splits them: `with_dates`).
DATE_COLUMNS = ("date", "collection_date", "collected_date", "collected", "draw_date",
                "drawn_date", "specimen_date", "sample_date", "result_date", "lab_date",
                "test_date", "recorded_date", "record_date", "measurement_date",
                "observation_date", "obs_date", "chart_date", "charted_date", "event_date",
                "visit_date", "service_date")
# A time of day: '08:30', '8:30:15', '8:30 PM'; and a date written with midnight, as a
# spreadsheet writes a date cell ('2024-01-01 00:00:00').
_CLOCK = r"(?i)^(\d{1,2}):(\d{2})(?::(\d{2})(?:[.,]\d+)?)?\s*(?:([ap])\.?m\.?)?$"
_MIDNIGHT = r"[ T]0?0:00(?::00(?:\.0+)?)?$"
# A number of hours with its unit: '2 h', '+3h', '3.5 hrs', '12 hours'.
_HOURS = r"(?i)^([+-]?\d+(?:[.,]\d+)?)\s*(?:h|hr|hrs|hour|hours)\.?$"
# A date written with its day and month as numbers, and an optional time of day.
_WRITTEN = (r"(?i)^(\d{1,2})([/.\-])(\d{1,2})\2(\d{4}|\d{2})(?:[ T,]+(\d{1,2}):(\d{2})"
            r"(?::(\d{2})(?:[.,]\d+)?)?\s*([ap])?\.?m?\.?)?$")


def times(col: pd.Series, decimal_comma: bool = False, order: str = "auto",
          info: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
  """(hours, kind): kind 1 for a finite number of hours ('2', '2 h'), 2 for a timestamp (hours
  since the epoch, naive times taken as UTC): ISO 8601, or a date with its day and month as
  numbers (`_written`), or HL7's compact form (`_compact_stamps`); 0 for anything else."""
  hours, kinds, _ = values_lib.numbers(col, decimal_comma)   # '0,5' in a ';' file is 0.5
  ok = np.where(~np.isnan(hours), 1, 0)
  _compact_stamps(col, hours, ok)
  rest = np.flatnonzero((ok == 0) & (kinds == values_lib.NOT_A_NUMBER))
  if not len(rest):
    return hours, ok
  text = col.iloc[rest].astype(str).str.strip()
  in_hours = pd.to_numeric(text.str.extract(_HOURS, expand=False).str.replace(",", "."),
                           errors="coerce").to_numpy(np.float64)
  given = np.isfinite(in_hours)
  if given.any():   # '2 h', '3.5 hrs': hours with their unit
    hours[rest[given]], ok[rest[given]] = in_hours[given], 1
    rest, text = rest[~given], text[~given]
    if not len(rest):
      return hours, ok
  stamps = pd.to_datetime(text, format="ISO8601", errors="coerce", utc=True)
  stamps = stamps.dt.tz_localize(None)
  unread = stamps.isna().to_numpy()
  if unread.any():
    stamps = stamps.copy()
    stamps[unread] = _written(text[unread], order, info if info is not None else {}).to_numpy()
  valid = stamps.notna().to_numpy()
  hours[rest[valid]] = _hours_since_epoch(stamps[valid])
  ok[rest[valid]] = 2
  return hours, ok


def _hours_since_epoch(stamps: pd.Series) -> np.ndarray:
  """Timestamps as hours since the epoch. In microseconds, not via nanosecond Timedeltas: a
  placeholder date ('9999-12-31', '1600-01-01') is a valid timestamp, outside the series like a
  mistyped year, and subtracting the epoch in nanoseconds overflowed for the whole file."""
  return stamps.to_numpy().astype("datetime64[us]").astype(np.int64) / 3.6e9


def _on_24h_clock(hour: pd.Series, half: pd.Series) -> tuple[pd.Series, pd.Series]:
  """Hours of a 12-hour clock ('p' or 'a' in `half`; '' for a 24-hour one) on a 24-hour clock
  (12 AM is 0, 1 PM is 13), and whether each is an hour of its clock."""
  pm, am = half == "p", half == "a"
  valid = (hour >= 0) & (hour <= np.where(pm | am, 12, 23))
  return hour.where(~(pm & (hour < 12)), hour + 12).where(~(am & (hour == 12)), 0), valid


# HL7's compact timestamps, read as numbers: YYYYMMDD, YYYYMMDDHHMM or YYYYMMDDHHMMSS.
_COMPACT = {8: "%Y%m%d", 12: "%Y%m%d%H%M", 14: "%Y%m%d%H%M%S"}


def _compact_stamps(col: pd.Series, hours: np.ndarray, ok: np.ndarray) -> None:
  """Numbers of 8, 12 or 14 digits that are HL7 timestamps (20240101, 202401010830: a valid
  date from 1800 to 2199 and time) made timestamps, in place (hours since the epoch, `ok` 2):
  no number of hours since admission has that shape, nor do epoch seconds (10 digits) or
  milliseconds (13)."""
  big = np.flatnonzero((ok == 1) & (hours >= 1e7))
  if not len(big):
    return
  digits = col.iloc[big].astype(str).str.strip().str.replace(r"\.0+$", "", regex=True)
  shaped = digits.str.fullmatch(r"(?:1[89]|2[01])\d+").to_numpy(bool)
  for length, form in _COMPACT.items():
    of = shaped & (digits.str.len() == length).to_numpy(bool)
    if not of.any():
      continue
    stamps = pd.to_datetime(digits[of], format=form, errors="coerce")
    valid = stamps.notna().to_numpy()
    at = big[of][valid]
    hours[at] = _hours_since_epoch(stamps[valid])
    ok[at] = 2


def with_dates(frame: csvfile.Frame, time: int | None, header, info: dict) -> None:
  """The `time` column's times of day ('08:30', '8:30 PM') given, in the frame, the date of
  the row's date column (`DATE_COLUMNS`), where the file has one and most of its times are
  times of day: '2024-01-01 20:30', read as a timestamp (a date written with midnight counts as
  its date). Without it, every row's time was unreadable and set aside. Counted as
  info['times_dated'] (the date column's name and the rows)."""
  j = csvfile.column_index(header, DATE_COLUMNS)
  if time is None or j is None or j == time or not (
      frame.frame[time].iloc[:1000].astype(str).str.strip().str.match(_CLOCK).mean() > 0.5):
    return   # the first rows say whether the whole column is worth a look
  parts = frame.frame[time].astype(str).str.strip().str.extract(_CLOCK)
  clock = parts[0].notna().to_numpy(bool)
  dates = frame.frame[j].astype(str).str.strip().str.replace(_MIDNIGHT, "", regex=True)
  dated = clock & (dates != "").to_numpy(bool) & frame.frame[j].notna().to_numpy(bool)
  if not clock.mean() > 0.5 or not dated.any():
    return
  hour, _ = _on_24h_clock(parts[0].fillna("0").astype(int), parts[3].fillna("").str.lower())
  stamp = (dates + " " + hour.map("{:02d}".format) + ":" + parts[1] + ":"
           + parts[2].fillna("00"))
  frame.frame[time] = frame.frame[time].astype(object).where(~dated, stamp)
  info["times_dated"] = {"date_column": str(header[j]), "rows": int(dated.sum())}


def _written(text: pd.Series, order: str, info: dict) -> pd.Series:
  """Dates written 'mm/dd/yyyy', 'dd.mm.yyyy' or 'dd-mm-yy' (a time of day after, am/pm too) as
  timestamps (NaT where not). The day and month order is config.data.date_order's, or where
  'auto', the file's: a first number past 12 is a day, so is a second; where none is, a '.' or
  '-' file is day/month and a '/' file month/day (pandas' and a US export's), assumed and said
  (info['date_order'] and a warning)."""
  if order not in DATE_ORDERS:
    raise errors.InputError(f"config.data.date_order={order!r}: use one of {list(DATE_ORDERS)}")
  parts = text.str.extract(_WRITTEN)
  found = parts[0].notna().to_numpy(bool)
  out = pd.Series(pd.NaT, index=text.index, dtype="datetime64[us]")
  if not found.any():
    return out
  parts = parts[found]
  a, b = parts[0].astype(int), parts[2].astype(int)   # day and month, in some order
  day_first = order == "day_first"
  if order == "auto":
    late_first, late_second = bool((a > 12).any()), bool((b > 12).any())
    day_first = late_first if late_first != late_second else (parts[1] != "/").all()
    said = "day/month" if day_first else "month/day"
    info["date_order"] = said if late_first != late_second else f"{said} (assumed)"
    if late_first == late_second:
      logging.warning("tables: dates read as %s: no day past 12 says which; set "
                      "config.data.date_order if they are not", said)
  day, month = (a, b) if day_first else (b, a)
  year = parts[3].astype(int)
  year = year.where(parts[3].str.len() == 4, year + np.where(year <= 68, 2000, 1900))
  hour, clock = _on_24h_clock(parts[4].fillna("0").astype(int),
                              parts[7].fillna("").astype(str).str.lower())
  minute, second = parts[5].fillna("0").astype(int), parts[6].fillna("0").astype(int)
  stamps = pd.to_datetime(pd.DataFrame({
      "year": year, "month": month, "day": day, "hour": hour, "minute": minute,
      "second": second}), errors="coerce")
  stamps = stamps.where(clock & (minute <= 59) & (second <= 59))   # '25:00' is no time
  out[found] = stamps.to_numpy().astype("datetime64[us]")
  return out
