"""The clinical tables (labels, lab panels, vital-sign series), read strictly with pandas.

  csvfile  a file as checked physical lines (encoding, line endings, delimiter, malformed lines
           set aside; one line is one record), the good ones parsed; gzipped too
  other_lines  lines that are not one row each (a quoted field's line breaks, a repeated
           header, a SQL tool's rules and row counts)
  analytes what is known of analytes and channels by name: aliases, plausible ranges, units
  problems `Problems`: the rows and values the readers set aside, and their counts
  values   ids, numbers, range checks
  categories results written as words (a wide column, a long file's analyte) as 0/1 indicators
  labels   labels.csv
  labs     labs.csv, wide or long
  vitals   vitals.csv, resampled to fixed steps
  pressure blood pressure charted as one value ('BP': 120/80), split into sbp and dbp

What cannot be read at all (an empty or binary file, no header naming the needed columns, a column
named twice) is refused with a `TableError` (an `errors.InputError`). Everything else is accounted
for through `Problems`: a malformed row is set aside with its file, line and reason, a bad value is
set to missing and counted per column, and `on_error='raise'` turns the first of them (lowest
line) into a `TableError` naming file and line.
"""

from medjax.data.tables.analytes import DEFAULT_VALUE_RANGES
from medjax.data.tables.analytes import value_ranges
from medjax.data.tables.csvfile import Problem
from medjax.data.tables.csvfile import TableError
from medjax.data.tables.labels import Labels
from medjax.data.tables.labels import read_labels
from medjax.data.tables.labs import Labs
from medjax.data.tables.labs import read_labs
from medjax.data.tables.values import normalize_ids
from medjax.data.tables.problems import Problems
from medjax.data.tables.vitals import read_vitals
from medjax.data.tables.vitals import Vitals
