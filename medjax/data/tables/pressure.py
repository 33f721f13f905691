"""Blood pressure charted as one value, systolic/diastolic ('120/80'), as Epic's flowsheets and
many exports give it: found by name and split into the sbp and dbp channels."""

from __future__ import annotations

import re
from typing import Sequence

import numpy as np

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
  text = np.array(["" if c is None or c != c else str(c).strip() for c in cells], object)
  systolic, diastolic = np.full(len(text), "", object), np.full(len(text), "", object)
  empty = values_lib.normalize_ids(text) == ""
  bad = ~empty
  for i in np.flatnonzero(~empty):
    m = _SLASHED.match(text[i])
    if m:
      systolic[i], diastolic[i], bad[i] = m[1], m[2], False
  return systolic, diastolic, bad


def problem(source: str, name: str, lines: np.ndarray, ids: set[str]) -> csvfile.Problem:
  """The values problem of a pressure column's or analyte's bad cells (at `lines`)."""
  more = f" ({len(lines)} such values)" if len(lines) > 1 else ""
  return csvfile.Problem(
      source, int(lines[0]), f"{values_lib.shown(name, ids)}: a blood pressure not written as "
      f"systolic/diastolic ('120/80'); sbp and dbp set to missing{more}", "values", len(lines),
      tuple(int(x) for x in lines[:values_lib.SHOWN_LINES]))
