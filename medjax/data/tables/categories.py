"""Results written as words, read as categories: a wide labs column or a long file's analyte
whose values are text (sex, smoking status, a urine dipstick's 'NEG' and 'POS', bands such as a
tumour's size '<=20', '20-50', '>50') becomes a 0/1 indicator per category,
'<name>=<category>', where each of its values was 'not a number', set to missing."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from medjax.data.tables import csvfile
from medjax.data.tables import values as values_lib

# Text is categorical when it holds at most this many distinct values (compared without case)
# and at least 5 rows per value on average.
MAX_CATEGORIES = 20


def of(cells: pd.Series, decimal_comma: bool, name: str, known_ids: set[str]):
  """{casefolded category: its first spelling}, sorted, where the non-empty `cells` (of column
  or analyte `name`) are categories: nine in ten of them text, or bands (at most one in ten a
  plain number and over one in ten text with digits that is no value at a limit), at most
  `MAX_CATEGORIES` of them, 5 rows per category on average, the name and each category fit to
  show (`values.shown`); else None. Values at an assay's limit ('<0.01') among a few words
  ('hemolysed') are numbers."""
  if not len(cells):
    return None
  spelling = cells.groupby(cells.str.casefold(), sort=False).first()
  text = values_lib.numbers(cells, decimal_comma, limits=True)[1] == values_lib.NOT_A_NUMBER
  plain = values_lib.numbers(cells, decimal_comma)[1] != values_lib.NOT_A_NUMBER
  bands = text & cells.str.contains(r"\d").to_numpy(bool)   # '20-50' beside '<=20', '>50'
  if (np.mean(~text) > 0.1 and (np.mean(plain) > 0.1 or np.mean(bands) <= 0.1)
      or len(spelling) > MAX_CATEGORIES or len(cells) < 5 * len(spelling)
      or any(values_lib.withheld(x, known_ids) for x in [name, *spelling])):
    return None
  return spelling.sort_index()


def as_indicators(frame: csvfile.Frame, columns: list[int], known_ids: set[str],
                  info: dict) -> tuple[list[int], set[int]]:
  """A wide file's `columns` with each categorical one (`of`) replaced by a 0/1 indicator
  column per category, named '<column>=<category>' (its first spelling) and added to `frame`,
  empty where the cell is. A column pandas read as True/False is one 0/1 column. The
  categorical columns go to info['categorical_columns'] (name: categories); returns the
  columns and the indicators among them."""
  out, indicators = [], set()
  for j in columns:
    col = frame.frame[j]
    if pd.api.types.is_bool_dtype(col.dtype):
      frame.frame[j] = col.astype(np.float64)
    if pd.api.types.is_numeric_dtype(frame.frame[j].dtype):
      out.append(j)
      continue
    cells = pd.Series(values_lib.normalize_ids(col.to_numpy(object)), dtype=object)
    keys = cells.str.casefold()
    spelling = of(cells[cells != ""], frame.delimiter != ",", frame.columns[j], known_ids)
    if spelling is None:
      out.append(j)
      continue
    info.setdefault("categorical_columns", {})[frame.columns[j]] = spelling.tolist()
    for key, shown in spelling.items():
      new = len(frame.columns)
      frame.frame[new] = np.where(cells == "", "", np.where(keys == key, "1", "0")).astype(object)
      frame.columns.append(f"{frame.columns[j]}={shown}")
      out.append(new)
      indicators.add(new)
  return out, indicators


def long_rows(frame: csvfile.Frame, cols: dict, names: np.ndarray, ids: np.ndarray,
              wanted, known_ids: set[str], info: dict):
  """A long file's rows of each categorical analyte (`of`, its value or, where that is empty,
  its text value: MIMIC's 'NEG' beside an empty valuenum) as one row per category, analyte
  '<analyte>=<category>', value 1 or 0, at the row's line; where `wanted` (the expected
  analytes; None: any) names one of its indicators. Returns (frame, names, ids) so expanded;
  the analytes go to info['categorical_analytes'] (name: categories)."""
  cells = values_lib.normalize_ids(frame.frame[cols["value"]].to_numpy(object))
  if cols["text"] is not None:
    text = values_lib.normalize_ids(frame.frame[cols["text"]].to_numpy(object))
    cells = np.where(cells == "", text, cells)
  rows = np.flatnonzero((ids != "") & (names != ""))
  codes, _ = pd.factorize(pd.Series(names[rows], dtype=object))
  order = np.argsort(codes, kind="stable")
  category = np.full(len(names), -1, np.int64)   # a row's category in its analyte's (-1: none)
  first = np.zeros(len(names), np.int64)         # its analyte's first indicator in `indicators`
  copies = np.ones(len(names), np.int64)
  member = np.zeros(len(names), bool)            # a row of a categorical analyte
  indicators = []
  for at in np.split(rows[order], np.flatnonzero(np.diff(codes[order])) + 1) if len(rows) else []:
    name = names[at[0]]
    if wanted is not None and not any(str(w).startswith(f"{name}=") for w in wanted):
      continue
    given = cells[at][cells[at] != ""]
    spelling = of(pd.Series(given, dtype=object), frame.delimiter != ",", name, known_ids)
    if spelling is None:
      continue
    info.setdefault("categorical_analytes", {})[name] = spelling.tolist()
    keys = values_lib.map_unique(cells[at], str.casefold)
    category[at] = pd.Index(spelling.index).get_indexer(keys)   # an empty cell: -1, no value
    first[at], copies[at], member[at] = len(indicators), len(spelling), True
    indicators += [f"{name}={s}" for s in spelling]
  if not indicators:
    return frame, names, ids
  source = np.repeat(np.arange(len(names)), copies)
  position = np.arange(len(source)) - np.repeat(np.cumsum(copies) - copies, copies)
  expanded = member[source]
  new_names = names[source].copy()
  new_names[expanded] = np.asarray(indicators, object)[first[source] + position][expanded]
  if wanted is not None:   # only the indicators config.data.analytes names (the rest: no rows)
    keep = ~expanded | pd.Series(new_names, dtype=object).isin(set(wanted)).to_numpy(bool)
    source, position, expanded, new_names = (source[keep], position[keep], expanded[keep],
                                             new_names[keep])
  out = frame.frame.iloc[source].reset_index(drop=True)
  value = out[cols["value"]].to_numpy(object).copy()
  value[expanded] = np.where(category[source] < 0, "", np.where(
      position == category[source], "1", "0"))[expanded]
  out[cols["value"]] = pd.Series(value, dtype=object)
  if cols["text"] is not None:
    out[cols["text"]] = pd.Series(np.where(expanded, "", out[cols["text"]].to_numpy(object)),
                                  dtype=object)
  return dataclasses.replace(frame, frame=out, lines=frame.lines[source]), new_names, ids[source]
