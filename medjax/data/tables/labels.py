"""labels.csv: one row per patient, its class name."""

from __future__ import annotations

import dataclasses
import re
import unicodedata
from typing import Sequence

import numpy as np

from medjax.data.tables import csvfile
from medjax.data.tables import problems as problems_lib
from medjax.data.tables import values as values_lib


@dataclasses.dataclass
class Labels:
  """labels.csv's accepted rows: ids (P,), class names (P,), physical lines (P,), and splits
  (P,: 'train', 'val' or 'test') where the file has a split column, else None."""
  ids: np.ndarray
  classes: np.ndarray
  lines: np.ndarray
  splits: np.ndarray | None = None

  def as_dicts(self) -> tuple[dict[str, str], dict[str, int]]:
    return (dict(zip(self.ids.tolist(), self.classes.tolist())),
            dict(zip(self.ids.tolist(), self.lines.tolist())))


def read_labels(path: str, problems: problems_lib.Problems, classes: Sequence[str] = (),
                fold_case: bool = False, rename: dict[str, str] | None = None,
                max_bytes: int = csvfile.MAX_BYTES) -> Labels:
  """labels.csv (columns `patient_id`, `diagnosis`, optionally `split`, as named or as
  `rename` (config.data.rename) maps a column's name: {'status': 'diagnosis'}): one accepted
  row per patient.

  Rows with an empty id or class, a class not in `classes` (when given), a split that is not
  train, val or test (where the file has a split column) or a patient an earlier line already
  has are set aside with their line.
  """
  cols = {}

  def text_columns(lines):
    header = values_lib.renamed(lines.header, rename)
    cols["pid"] = csvfile.find_column(lines, values_lib.PATIENT_COLUMNS, "patient id", header)
    cols["label"] = csvfile.find_column(lines, values_lib.LABEL_COLUMNS, "label", header)
    cols["split"] = csvfile.column_index(header, values_lib.SPLIT_COLUMNS)
    return [j for j in (cols["pid"], cols["label"], cols["split"]) if j is not None]

  lines, frame = csvfile.load(path, text_columns, max_bytes)
  ids, id_set = values_lib.read_ids(frame, lines, cols["pid"], fold_case, problems)
  source, found = frame.source, list(frame.problems)   # now with their patients
  pid_name, label_name = frame.columns[cols["pid"]], frame.columns[cols["label"]]
  names = values_lib.one_spelling(
      values_lib.map_unique(frame.frame[cols["label"]].to_numpy(object), _class_name), classes,
      lines.info, "classes_merged_by_case")
  keep = np.ones(len(ids), bool)
  empty = (ids == "") | (names == "")
  for i in np.flatnonzero(empty):
    found.append(csvfile.Problem(source, int(frame.lines[i]), f"empty {pid_name!r} or "
                                 f"{label_name!r} (or a missing-value marker such as '#N/A'); "
                                 "the row is set aside", patient=ids[i]))
  keep &= ~empty
  if classes:
    unknown = keep & ~np.isin(names, list(classes))
    for i in np.flatnonzero(unknown):
      found.append(csvfile.Problem(
          source, int(frame.lines[i]), f"class {values_lib.shown(names[i], id_set)} not in "
          f"config.data.classes ({len(classes)} names); add it or fix the row; the row is set "
          "aside", patient=ids[i]))
    keep &= ~unknown
  else:
    keep &= ~_ids_as_classes(frame, names, keep, problems.known_ids, found, ids)
  # Other columns are not read (an export's age or sex beside the class): said, never quietly.
  others = [values_lib.shown(h, problems.known_ids) for j, h in enumerate(frame.columns)
            if h and j not in (cols["pid"], cols["label"], cols["split"])]
  if others:
    lines.info["columns_not_read"] = others
  splits = None
  if cols["split"] is not None:
    splits = _splits(frame, cols["split"], ids, id_set, keep, lines.info, found)
    keep &= splits != ""
  kept = np.flatnonzero(keep)
  kept = values_lib.first_rows(ids, kept, frame.lines, source, found)
  problems.files[source] = lines.info
  problems.extend(found)
  return Labels(ids[kept], names[kept], frame.lines[kept],
                None if splits is None else splits[kept])


def _ids_as_classes(frame, names, keep, known_ids: set[str], found: list, ids) -> np.ndarray:
  """The kept rows whose class is a patient's id (a shifted row, the id pasted twice), each a
  problem: as a class it would name the patient in the manifest, summary.json and every
  per-class metric. An integer is a class (outcomes are written 0 and 1, and so are ids)."""
  bad = keep & values_lib.map_unique(
      names, lambda n: n.casefold() in known_ids and not re.fullmatch(r"[+-]?\d+", n)
  ).astype(bool)
  for i in np.flatnonzero(bad):
    found.append(csvfile.Problem(
        frame.source, int(frame.lines[i]), "class (withheld: it is a patient's id; a shifted "
        "row?) is no class; fix the row; the row is set aside", patient=ids[i]))
  return bad


def _splits(frame, column: int, ids, id_set, keep, info: dict, found: list) -> np.ndarray:
  """The split column's 'train', 'val' or 'test' per row ('' where it names none: that row, if
  still kept, is set aside with its reason)."""
  cells = frame.frame[column].to_numpy(object)
  splits = values_lib.map_unique(
      cells, lambda c: values_lib.SPLIT_NAMES.get(str(c).strip().casefold(), ""))
  name = frame.columns[column]
  info["split_column"] = name
  for i in np.flatnonzero(keep & (splits == "")):
    what = (f"empty {name!r}" if not str(cells[i]).strip() else
            f"{name!r} {values_lib.shown(cells[i], id_set)} is not a split")
    found.append(csvfile.Problem(
        frame.source, int(frame.lines[i]), f"{what} (train, val or test; training, valid, "
        "validation, validate, dev, tune, testing or holdout); give one, or drop the column to let "
        "config.data.split decide; the row is set aside", patient=ids[i]))
  return splits


def _class_name(cell: str) -> str:
  """A class cell as a class name: stripped, NFC; '' for a missing-value marker ('#N/A'); an
  integer written as a float ('1.0': pandas writes an outcome column with a gap so) is the
  integer, one class with '1'."""
  name = unicodedata.normalize("NFC", cell.strip())
  if re.fullmatch(r"[+-]?\d+\.0+", name):
    name = name.split(".")[0]
  return "" if name.casefold() in values_lib.MISSING_MARKERS else name

