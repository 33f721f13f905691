"""Cells and values shared by the table readers: ids, numbers, range checks, problems.

Reasons never carry patient ids, and cell values only when they cannot be identifying (see
`shown`). Ids are stripped of surrounding whitespace and NFC-normalised (casefolded too when
`fold_case`); ingest hashes them right away.
"""
from __future__ import annotations

import collections
import dataclasses
import re
import unicodedata
from typing import Sequence

import numpy as np
import pandas as pd

from medjax.data.tables import analytes as analytes_lib
from medjax.data.tables import csvfile
from medjax.data.tables import problems as problems_lib

# The names a role's column may have, in order of preference, compared by `csvfile.column_key`
# (case, spaces, '_', '-' and '.' ignored): MIMIC's subject_id, OMOP's person_id, R's pid, the
# bare 'id' of R's datasets (the PBC trial's, SUPPORT's), then a study's participant_id and
# REDCap's record_id. config.data.rename maps any other name to one ({'study_no': 'patient_id'}).
PATIENT_COLUMNS = ("patient_id", "patient", "mrn", "subject_id", "person_id", "pid", "id",
                   "patient_number", "medical_record_number", "participant_id", "record_id")
# Columns that identify a patient rather than measure one (compared by `csvfile.column_key`):
# an export's MRN beside its PatientID, names, birth dates, addresses. Left out of
# the analytes (and out of tables.npz), whatever config.data.analytes says.
IDENTIFIER_COLUMNS = frozenset({csvfile.column_key(c) for c in PATIENT_COLUMNS} | {
    "medicalrecordnumber", "name", "patientname", "firstname", "lastname", "surname",
    "givenname", "familyname", "middlename", "fullname", "dob", "dateofbirth", "birthdate",
    "birthday", "ssn", "socialsecuritynumber", "nhsnumber", "nationalid", "address", "street",
    "city", "zip", "zipcode", "postcode", "postalcode", "phone", "telephone", "email",
    "accession", "accessionnumber", "encounterid", "visitid", "admissionid", "hadmid",
    "subjectid", "stayid", "insuranceid", "birthdt", "birthdatetime", "dobdt"})
LABEL_COLUMNS = ("diagnosis", "label", "class", "outcome", "target", "dx", "class_label")
# labels.csv's optional split column (a cohort's own train/val/test split, e.g. MIMIC-CXR's):
# where there is one it decides each patient's split, config.data.split does not.
SPLIT_COLUMNS = ("split", "data_split", "subset")
SPLIT_NAMES = {"train": "train", "training": "train", "val": "val", "valid": "val",
               "validation": "val", "validate": "val", "dev": "val", "tune": "val",
               "tuning": "val", "test": "test", "testing": "test", "holdout": "test",
               "hold-out": "test", "heldout": "test"}
# A time column: hours, or ISO timestamps as MIMIC (charttime), OMOP (measurement_datetime) and
# Epic (result_time, specimen_taken_time) name them.
TIME_COLUMNS = ("hour", "hours", "time", "timestamp", "charttime", "datetime",
                "measurement_datetime", "observation_datetime", "result_time",
                "specimen_taken_time", "collection_time", "recorded_time", "recorded_datetime",
                "chart_time", "charted_time", "charted_datetime", "measurement_time",
                "observation_time", "obs_time", "event_time", "event_datetime")
# A long labs.csv's analyte and value columns: MIMIC's labevents joined to d_labitems ('label',
# 'valuenum' beside the text 'value', so the numeric one first), OMOP's measurement
# ('measurement_source_value', 'value_as_number'), Epic's ('component_name', 'ord_num_value').
ANALYTE_COLUMNS = ("analyte", "test", "test_name", "label", "lab_name", "component_name",
                   "measurement_source_value", "component", "observation_identifier",
                   "observation_name", "observation", "lab_test", "lab_test_name",
                   "test_description", "result_name", "analyte_name")
# A long file's analyte column by code where it names none (raw MIMIC labevents' and
# chartevents' 'itemid', before d_labitems or d_items is joined; OMOP's concept id; a LOINC
# code): the codes are the analytes (a long vitals.csv's: CHANNEL_NAMES or data.rename).
ANALYTE_CODE_COLUMNS = ("itemid", "item_id", "loinc_code", "loinc", "test_code",
                        "measurement_concept_id")
VALUE_COLUMNS = ("valuenum", "value_as_number", "ord_num_value", "numeric_value", "value",
                 "result", "result_value", "observation_value", "numeric_result", "lab_value",
                 "test_value", "measurement_value", "result_numeric")
# A long labs.csv's unit column (MIMIC's valueuom, OMOP's unit_source_value).
UNIT_COLUMNS = ("unit", "units", "uom", "valueuom", "unit_of_measure", "result_unit",
                "unit_source_value", "reference_unit", "result_units", "observation_units",
                "unit_name")
# Every value is stored as float32: a finite float64 beyond this is not a number the tables hold.
FLOAT32_MAX = float(np.finfo(np.float32).max)
# Text read as a missing value but counted, like inf and nan, as a non-finite value.
# A spreadsheet's error values ('#DIV/0!', '#VALUE!') too: a formula's cell with no value.
MISSING_MARKERS = frozenset({"nan", "-nan", "+nan", "na", "n/a", "#n/a", "null", "none", "<na>",
                             "#div/0!", "#value!", "#ref!", "#num!", "#name?", "#null!",
                             "#n/a!", "#calc!", "#spill!"})
_FLOAT_ID = re.compile(r"\d+\.0+")
# A number grouped in threes by spaces (a European export's '250 000', its no-break spaces
# folded to spaces) or apostrophes (a Swiss one's "1'234.5"); a decimal point or comma after.
_SPACED = r"[+-]?\d{1,3}(?:[ '’]\d{3})+(?:[.,]\d+)?"
_TEXT_FORMULA = re.compile(r'="(.*)"')
_MINUS = str.maketrans({"\u2212": "-", "\u2012": "-", "\u2013": "-", "\ufe63": "-",
                        "\uff0d": "-"})
_ID_SUFFIX = re.compile(r"(?:[\s_\-.][iI][dD]|[a-z]I[dD])$")
_NON_FINITE_WORDS = frozenset({"inf", "infinity"} | {m.lstrip("+-") for m in MISSING_MARKERS})
# A value reported beyond an assay's limit: '<0.01', '<= 5', '>60', '≥90' (the limit follows).
_LIMIT = r"^(?:[<>]=?|[≤≥])\s*(\S.*)$"
# A value with the lab's abnormal flag after it: '5.6 H', '140 (L)', '7.8*', '2.1 HH', '9 !'.
_FLAG_WORDS = r"hh?|ll?|aa?|crit(?:ical)?|high|low|abn(?:ormal)?"
_FLAGGED = (rf"(?i)^((?:[<>]=?|[≤≥])?\s*[+-]?[\d.,]*\d)\s*"
            rf"(?:\((?:{_FLAG_WORDS})\)|(?:{_FLAG_WORDS})|\*+|!+)$")
SHOWN_LINES = 20   # line numbers listed in one values entry of the quarantine report
OK, NON_FINITE, NOT_A_NUMBER, OUT_OF_RANGE, BEYOND_FLOAT32, AMBIGUOUS_COMMA = range(6)
_VALUE_KINDS = {NON_FINITE: "non_finite", NOT_A_NUMBER: "not_a_number",
                OUT_OF_RANGE: "out_of_range", BEYOND_FLOAT32: "beyond_float32",
                AMBIGUOUS_COMMA: "ambiguous_comma"}


def normalize_ids(ids, fold_case: bool = False) -> np.ndarray:
  """Ids as joined across tables and DICOM: stripped, Unicode NFC, casefolded if `fold_case`;
  a missing-value marker ('NULL', '#N/A': `MISSING_MARKERS`) is no id (''), not a patient that
  every row without an id would join; an all-digit id written as a float ('123.0': pandas
  writes an integer column with a missing cell so) is its digits, and one written as a
  spreadsheet's text formula ('="00123"', which keeps its leading zeros) is its text."""
  def clean(u):
    text = "" if u is None or (isinstance(u, float) and np.isnan(u)) else str(u)
    text = unicodedata.normalize("NFC", text.strip())
    if text.casefold() in MISSING_MARKERS:
      return ""
    formula = _TEXT_FORMULA.fullmatch(text)
    if formula:   # ="00123": a spreadsheet's way to keep leading zeros
      text = formula[1].strip()
    if _FLOAT_ID.fullmatch(text):
      text = text.split(".")[0]
    return text.casefold() if fold_case else text
  return map_unique(ids, clean)


def id_spellings(ids) -> dict[str, int]:
  """Of the distinct `ids` (as read), how many `normalize_ids` reads as digits written as a
  float, and as a spreadsheet's text formula: {'ids_written_as_floats': n,
  'ids_as_text_formulas': n}, the nonzero ones."""
  cells = pd.Series(pd.unique(pd.Series(ids, dtype=object)), dtype=object).astype(str).str.strip()
  counts = {"ids_written_as_floats": int(cells.str.fullmatch(_FLOAT_ID.pattern).sum()),
            "ids_as_text_formulas": int(cells.str.fullmatch(_TEXT_FORMULA.pattern).sum())}
  return {k: n for k, n in counts.items() if n}


def map_unique(values, fn) -> np.ndarray:
  """fn applied to each distinct value once (object array in, object array out)."""
  codes, uniques = pd.factorize(pd.Series(values, dtype=object), use_na_sentinel=False)
  return np.array([fn(u) for u in uniques] + [None], dtype=object)[codes]


def one_spelling(names: np.ndarray, preferred: Sequence[str], info: dict, key: str
                 ) -> np.ndarray:
  """Names that differ only in letter case are one ('Normal', 'NORMAL'; 'Na', 'NA'), spelt as
  `preferred` (config.data.classes, data.analytes) spells it, else as most cells do (ties: the
  first seen); the merges go to `info[key]` (summary.json's tables.<file>)."""
  counts = collections.Counter(n for n in names.tolist() if n)
  spelling = {name.casefold(): name for name in preferred}
  for name, _ in counts.most_common():
    spelling.setdefault(name.casefold(), name)
  merged = {n: spelling[n.casefold()] for n in sorted(counts) if spelling[n.casefold()] != n}
  if not merged:
    return names
  # Recorded without a name that may identify a patient (an id in the wrong column).
  recorded = {n: spelt for n, spelt in merged.items()
              if not withheld(n, set()) and not withheld(spelt, set())}
  if recorded:
    info[key] = recorded
  return np.array([merged.get(n, n) for n in names.tolist()], dtype=object)


# -- cells ----------------------------------------------------------------------------------------

def shown(text, ids: set[str]) -> str:
  """A cell value fit for a reason, in single quotes; withheld when it could identify a patient
  (an id seen so far, four digits in a row as in ids and dates, long text, quotes)."""
  text = unicodedata.normalize("NFC", str(text).strip())
  if (len(text) > 24 or re.search(r"\d{4}", text) or text.casefold() in ids
      or not text.isprintable() or "'" in text or '"' in text or "\\" in text):
    return problems_lib.WITHHELD
  return f"'{text}'"


def identifier_column(name: str) -> bool:
  """Whether a column named `name` identifies patients (`IDENTIFIER_COLUMNS`) or records (a
  name ending in an 'id' of its own: 'specimen_id', 'labevent_id', 'OrderID'; not 'lipid')."""
  return csvfile.column_key(name) in IDENTIFIER_COLUMNS or bool(_ID_SUFFIX.search(name.strip()))


def shown_value(text, ids: set[str]) -> str:
  """`shown` for a cell that should have held a number: also withheld when it holds no digit
  (a name in a shifted row: 'Smith^John') or looks like a date ('01/10/67')."""
  stripped = str(text).strip()
  if stripped.casefold().lstrip("+-") in _NON_FINITE_WORDS:
    return shown(text, ids)
  if (not re.search(r"\d", stripped)
      or re.search(r"\d{1,2}[/.\-]\d{1,2}[/.\-]\d{2}", stripped)):
    return problems_lib.WITHHELD
  return shown(text, ids)


def withheld(text, ids: set[str]) -> bool:
  """Whether `shown` withholds `text` (it could identify a patient)."""
  return shown(text, ids) == problems_lib.WITHHELD


def numbers(col: pd.Series, decimal_comma: bool,
            limits: bool = False) -> tuple[np.ndarray, np.ndarray, dict[str, int]]:
  """(float64 values with NaN for missing or bad, kind per cell, what was read besides plain
  numbers: {'decimal_commas': n, 'values_at_limit': n, 'missing_dots': n, ...}, the nonzero
  ones). A value is checked as float64 before anything narrows it: finite, and within what
  float32 holds. `limits`: a value reported as beyond a limit of the assay ('<0.01', '>60',
  '≥ 90') is read at the limit, and one with the lab's abnormal flag ('5.6 H', '140 (L)',
  '7.8*': `_FLAGGED`) as its number ('values_flagged'). SAS's and Stata's '.' is a missing
  value, as an empty cell is."""
  if col.dtype.kind in "fiu":
    values = col.to_numpy(np.float64, copy=True)
    kinds = np.where(np.isinf(values), NON_FINITE, OK)
    kinds[np.isfinite(values) & (np.abs(values) > FLOAT32_MAX)] = BEYOND_FLOAT32
    values[kinds != OK] = np.nan
    return values, kinds, {}
  # Text as read (a column pandas took for booleans, or mixed with floats, as text again).
  if col.dtype.kind == "b":
    cells = pd.Series(np.where(col.to_numpy(bool), "True", "False"), dtype=object)
  elif col.dtype == object:
    cells = pd.Series(["" if x is None or (isinstance(x, float) and np.isnan(x)) else str(x)
                       for x in col.to_numpy(object)], dtype=object)
  else:
    cells = pd.Series(col.to_numpy(object), dtype=object).fillna("")
  values = pd.to_numeric(cells, errors="coerce").to_numpy(np.float64, copy=True)
  failed = np.flatnonzero(np.isnan(values))
  text = cells.iloc[failed].str.strip()   # Unicode spaces too: '105\xa0' is 105
  # Full-width digits ('１４０') and the Unicode minus sign ('−2.5', a word processor's) as
  # ASCII: NFKC folds the first, not the second.
  odd = ~text.map(str.isascii).to_numpy(bool)
  unicode_numbers = failed[:0]
  if odd.any():
    folded = text[odd].map(lambda t: unicodedata.normalize("NFKC", t).translate(_MINUS))
    unicode_numbers = failed[odd][pd.to_numeric(folded, errors="coerce").notna().to_numpy()]
    text = text.copy()
    text[odd] = folded
  limited = flagged = failed[:0]
  if limits and len(text):
    flag = text.str.extract(_FLAGGED, expand=False)
    flagged = failed[flag.notna().to_numpy(bool)]
    text = text.where(flag.isna(), flag)
    limit = text.str.extract(_LIMIT, expand=False)
    limited = failed[limit.notna().to_numpy(bool)]
    text = text.where(limit.isna(), limit)
  again = pd.to_numeric(text, errors="coerce").to_numpy(np.float64)
  values[failed] = again
  failed, text = failed[np.isnan(again)], text[np.isnan(again)]
  kinds = np.full(len(values), OK)
  kinds[np.isinf(values)] = NON_FINITE
  marker = text.str.lower().isin(MISSING_MARKERS).to_numpy(bool)
  kinds[failed[marker]] = NON_FINITE
  # SAS's and Stata's missing values ('.', '.A'-'.Z', '._'): an empty cell as those write it.
  dots = text.str.fullmatch(r"\.[A-Za-z_]?").to_numpy(bool)
  rest = ~marker & ~dots & (text != "").to_numpy(bool)
  thousands = _thousands(text, rest, decimal_comma)
  values[failed[thousands]] = text[thousands].str.replace(",", "").astype(float).to_numpy()
  spaced = rest & ~thousands & text.str.fullmatch(_SPACED).to_numpy(bool)   # '250 000'
  values[failed[spaced]] = (text[spaced].str.replace(r"[ '’]", "", regex=True)
                            .str.replace(",", ".").astype(float).to_numpy())
  thousands = thousands | spaced
  rest = rest & ~thousands
  commas = 0
  if decimal_comma and rest.any():
    comma = rest & text.str.fullmatch(r"[+-]?\d+,\d+").to_numpy(bool)
    # '1,050' in a tab file (a US export): 1.05, or 1050 with a thousands separator? Only a
    # decimal comma elsewhere in the column ('36,6', '1,05') says which.
    grouped = comma & text.str.fullmatch(r"[+-]?\d{1,3},\d{3}").to_numpy(bool)
    if grouped.any() and not (comma & ~grouped).any():
      kinds[failed[grouped]] = AMBIGUOUS_COMMA
      comma, rest = comma & ~grouped, rest & ~grouped
    values[failed[comma]] = text[comma].str.replace(",", ".").astype(float).to_numpy()
    commas, rest = int(comma.sum()), rest & ~comma
  kinds[failed[rest]] = NOT_A_NUMBER
  kinds[(kinds == OK) & np.isfinite(values) & (np.abs(values) > FLOAT32_MAX)] = BEYOND_FLOAT32
  values[kinds != OK] = np.nan
  read = {"decimal_commas": commas, "values_at_limit": int((kinds[limited] == OK).sum()),
          "missing_dots": int(dots.sum()), "thousands_separators": int(thousands.sum()),
          "values_flagged": int((kinds[flagged] == OK).sum()),
          "unicode_numbers": int((kinds[unicode_numbers] == OK).sum())}
  return values, kinds, {k: n for k, n in read.items() if n}


def _thousands(text: pd.Series, rest: np.ndarray, decimal_comma: bool) -> np.ndarray:
  """Which of the `rest` cells of `text` are numbers with thousands separators: where no comma
  can be a decimal one ('1,234,567', '1,234.5'), and in a comma file (a spreadsheet's number
  format, quoted: '250,000') those in groups of three ('1,050') unless another cell of the
  column has a comma that is not ('36,6': decimal commas, so which is which is unknown)."""
  if not rest.any():
    return rest
  sure = text.str.fullmatch(r"[+-]?\d{1,3}(?:,\d{3}){2,}(?:\.\d+)?|[+-]?\d{1,3}(?:,\d{3})+"
                            r"\.\d+").to_numpy(bool)
  if decimal_comma:
    return rest & sure
  grouped = text.str.fullmatch(r"[+-]?\d{1,3}(?:,\d{3})+").to_numpy(bool)
  other = rest & text.str.contains(r"\d,\d").to_numpy(bool) & ~sure & ~grouped
  return rest & (sure | (grouped & ~other.any()))


def add_counts(info: dict, counts: dict[str, int]) -> None:
  """Adds `counts` (what `numbers` read besides plain numbers) to a file's info."""
  for key, n in counts.items():
    info[key] = info.get(key, 0) + n


def renamed(header: Sequence[str], rename: dict[str, str] | None) -> list[str]:
  """A header's names as config.data.rename maps them, for finding the columns' roles."""
  return [rename.get(h, h) for h in header] if rename else list(header)


def long_columns(header: list[str]) -> dict[str, int | None]:
  """A long file's analyte (a name, else a code: `codes`), value and (optional) unit columns,
  and a second value column if it has one (MIMIC's text 'value' beside 'valuenum'); empty
  when it has no analyte or no value column (a wide file)."""
  find = lambda names: csvfile.column_index(header, names)
  analyte, value = find(ANALYTE_COLUMNS), find(VALUE_COLUMNS)
  codes = analyte is None and find(ANALYTE_CODE_COLUMNS) is not None
  analyte = find(ANALYTE_CODE_COLUMNS) if codes else analyte
  if analyte is None or value is None:
    return {}
  chosen = csvfile.column_key(header[value])
  return {"analyte": analyte, "codes": codes, "value": value, "unit": find(UNIT_COLUMNS),
          "text": find([n for n in VALUE_COLUMNS if csvfile.column_key(n) != chosen])}


def set_cells(frame: csvfile.Frame, column: int, rows: np.ndarray, values: np.ndarray) -> None:
  """The frame's `column` with its cells at positions `rows` replaced by `values`: numbers keep
  a numeric column numeric; a text column, or text, makes it one of objects."""
  col = frame.frame[column]
  numeric = col.dtype.kind in "fiu" and np.asarray(values).dtype.kind in "fiu"
  cells = col.to_numpy(np.float64 if numeric else object, copy=True)
  cells[rows] = values
  frame.frame[column] = pd.Series(cells, index=frame.frame.index)


def convert(frame: csvfile.Frame, column: int, rows: np.ndarray, factor: np.ndarray,
            info: dict) -> np.ndarray:
  """The numbers of `column` in `rows` multiplied in the frame by `factor` (NaN: left as they
  are; a value at an assay's limit is converted at it); returns the positions in `rows` of the
  values converted. What was read of those besides plain numbers (`numbers`: a thousands
  separator, a limit) goes to `info`, as the numbers they become will not say it."""
  maybe = np.flatnonzero(~np.isnan(factor))
  if not len(maybe):
    return maybe
  v, kinds, read = numbers(frame.frame[column].iloc[rows[maybe]], frame.delimiter != ",",
                           limits=True)
  ok = (kinds == OK) & ~np.isnan(v)
  at = maybe[ok]
  if read and len(at):   # of the values converted only: the others are read again later
    add_counts(info, numbers(frame.frame[column].iloc[rows[at]], frame.delimiter != ",",
                             limits=True)[2])
  if len(at):
    set_cells(frame, column, rows[at], v[ok] * factor[at])
  return at


def fill_from_text(frame: csvfile.Frame, value: int, text: int, info: dict) -> None:
  """Where the value column is empty and the second value column holds what reads as a value, it
  is taken: MIMIC leaves 'valuenum' empty where 'value' is '<0.1' or '>1000' (an assay's limit,
  `numbers`), and would lose those measured patients quietly. Text that is no value
  ('___') stays missing, as the export meant (an analyte whose results are words, 'NEG' and
  'POS', is categorical: `categories.long_rows`). Counted as info['values_from_text']."""
  column = frame.frame[value]
  empty = column.isna().to_numpy(bool)
  if column.dtype == object:
    empty = empty | (column.astype(str).str.strip() == "").to_numpy(bool)
  if not empty.any():
    return
  cells = frame.frame[text].iloc[np.flatnonzero(empty)]
  parsed, kinds, read = numbers(cells, frame.delimiter != ",", limits=True)
  usable = (kinds == OK) & ~np.isnan(parsed)
  if usable.any():
    set_cells(frame, value, np.flatnonzero(empty)[usable], parsed[usable])
    info["values_from_text"] = int(usable.sum())
    add_counts(info, read)


def _value_problems(source: str, label: str, name: str, kinds: np.ndarray, lines: np.ndarray,
                    cells, ids: set[str],
                    bounds=None) -> tuple[list[csvfile.Problem], dict[str, int]]:
  """One 'values' problem per kind of bad value in a column, and the counts per kind."""
  out, counts = [], {}
  for kind, key in _VALUE_KINDS.items():
    rows = np.flatnonzero(kinds == kind)
    if not len(rows):
      continue
    counts[key] = len(rows)
    first = rows[0]
    value = shown_value(cells[first], ids)
    if kind == NOT_A_NUMBER:
      what = f"value {value} is not a number"
    elif kind == NON_FINITE:
      what = f"value {value} is not a finite number"
    elif kind == AMBIGUOUS_COMMA:
      what = (f"value {value} may hold a decimal comma or a thousands separator, and no other "
              "value in the column says which")
    elif kind == BEYOND_FLOAT32:
      what = f"value {value} is beyond what float32 holds (magnitude over {FLOAT32_MAX:.4g})"
    else:
      what = (f"value {value} is outside the plausible range [{bounds[0]:g}, {bounds[1]:g}] "
              f"(config.data.value_ranges.{name})")
    more = (f" ({len(rows)} such values in this {label}, first on lines "
            f"{', '.join(str(int(x)) for x in lines[rows[:5]])})" if len(rows) > 1 else "")
    shown_lines = tuple(int(x) for x in lines[rows[:SHOWN_LINES]])
    out.append(csvfile.Problem(source, int(lines[first]),
                               f"{label} {name!r}: {what}; set to missing{more}", "values",
                               len(rows), shown_lines))
  return out, counts


def read_values(frame: csvfile.Frame, column: int, name: str, label: str, ranges, ids: set[str],
                rows=None):
  """A numeric column's values (NaN where missing or bad), its problems, their counts and what
  was read besides plain numbers (`numbers`; a value beyond an assay's limit is read at it)."""
  col = frame.frame[column] if rows is None else frame.frame[column].iloc[rows]
  lines = frame.lines if rows is None else frame.lines[rows]
  values, kinds, read = numbers(col, frame.delimiter != ",", limits=True)
  bounds = analytes_lib.range_for(ranges, name)
  if bounds is not None:
    outside = ~np.isnan(values) & ((values < bounds[0]) | (values > bounds[1]))
    kinds[outside] = OUT_OF_RANGE
    values[outside] = np.nan
  if not (kinds != OK).any():
    return values, [], {}, read
  probs, counts = _value_problems(frame.source, label, name, kinds, lines,
                                  col.to_numpy(object), ids, bounds)
  return values, probs, counts, read


def name_malformed(frame: csvfile.Frame, lines: csvfile.Lines, column: int,
                   fold_case: bool) -> None:
  """Gives the rows set aside as malformed (`frame.problems`) their patient where the line still
  shows it in the file's `column`."""
  for i, p in enumerate(frame.problems):
    if p.what == "row" and not p.patient:
      pid = normalize_ids([csvfile.field_of(lines, p.line, column)], fold_case)[0]
      frame.problems[i] = dataclasses.replace(p, patient=pid)


def read_ids(frame: csvfile.Frame, lines: csvfile.Lines, column: int, fold_case: bool,
             problems: problems_lib.Problems) -> tuple[np.ndarray, set[str]]:
  """Normalised ids of a column; their spellings join `problems.known_ids` (for `shown`) and
  `problems.named`. The rows set aside as malformed (`frame.problems`) are given their
  patient where the line still shows it, and it is named too."""
  ids = normalize_ids(frame.frame[column].to_numpy(object), fold_case)
  lines.info.update(id_spellings(frame.frame[column].to_numpy(object)))
  name_malformed(frame, lines, column, fold_case)
  recovered = {p.patient for p in frame.problems if p.patient}
  problems.known_ids.update(str(x).casefold() for x in pd.unique(ids))
  problems.known_ids.update(p.casefold() for p in recovered)
  first = problems.first_line.setdefault(frame.source, {})
  for p in frame.problems:
    if p.patient:
      first[p.patient] = min(first.get(p.patient, p.line), p.line)
  if len(ids):
    order = pd.Series(ids, dtype=object).drop_duplicates()
    for pid, i in zip(order.to_numpy(), order.index):
      if pid:
        first[pid] = min(first.get(pid, int(frame.lines[i])), int(frame.lines[i]))
  problems.named.update(first)
  return ids, problems.known_ids


def first_rows(ids: np.ndarray, kept: np.ndarray, lines: np.ndarray, source: str,
               found: list) -> np.ndarray:
  """`kept` without later rows of a patient already kept; each such row is a csvfile.Problem."""
  dup = pd.Series(ids[kept], dtype=object).duplicated(keep="first").to_numpy()
  first = first_lines(ids[kept], lines[kept], np.flatnonzero(dup))
  for i, line in zip(kept[dup], first):
    found.append(csvfile.Problem(source, int(lines[i]), f"duplicate patient row (line {line} has "
                                 "this patient); the row is set aside", patient=ids[i]))
  return kept[~dup]


def first_lines(keys: np.ndarray, lines: np.ndarray, rows: np.ndarray) -> np.ndarray:
  """For each of `rows`, the line of the first row (in `lines` order) with the same key."""
  codes, _ = pd.factorize(np.asarray(keys))
  first = pd.Series(lines).groupby(codes).transform("first").to_numpy()
  return first[rows]


def count_values(info: dict, counts: dict[str, int], name: str) -> None:
  for kind, k in counts.items():
    info.setdefault("values", {}).setdefault(kind, {})
    info["values"][kind][name] = info["values"][kind].get(name, 0) + k


# -- the tables -----------------------------------------------------------------------------------


