"""A CSV file read strictly: one physical line is one record, but for a quoted field's line
breaks (`load` -> header, rows, set-aside lines).

The first pass works on bytes and physical lines: it settles the encoding (UTF-8 with or without
BOM, UTF-16 with BOM, else cp1252), the line endings (LF, CRLF, CR), the delimiter (`,` `;` tab
`|`, from the header line) and which lines are malformed (a control byte such as NUL, an odd
number of quotes, the wrong number of fields, bytes that do not decode). A quoted field spans
lines only where its lines cannot be rows of their own (`_spanning_fields`: a comment with line
breaks), so one bad line never takes its neighbours with it. The second pass parses the good
lines with pandas' C reader (lines holding quotes with the csv module, one at a time).
`medjax.data.tables` gives the columns their meaning (ids, classes, values, times).
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import io
import os
import re
import unicodedata
import zipfile
import zlib
from typing import Sequence

import numpy as np
import pandas as pd

from medjax import errors
from medjax.data.tables import other_lines

DELIMITERS = (",", ";", "\t", "|")


class TableError(errors.InputError):
  """A table that cannot be read, or a bad row or value when the config asks to stop on one."""


@dataclasses.dataclass(frozen=True)
class Problem:
  """A row set aside (`what='row'`), values set to missing ('values') or a column ignored."""
  source: str
  line: int
  reason: str
  what: str = "row"
  count: int = 1
  lines: tuple[int, ...] = ()
  # The row's patient id (normalised), where it could be read: in memory only, never written
  # (ingest links the rejection to that patient's other data and files by it).
  patient: str = dataclasses.field(default="", compare=False, repr=False)

  def as_dict(self) -> dict:
    d = {"path": self.source, "line": self.line, "stage": "tables", "reason": self.reason,
         "set_aside": self.what}
    if self.what == "values":
      d.update(count=self.count, lines=list(self.lines))
    return d


# -- the first pass: bytes -> checked physical lines ---------------------------------------------

@dataclasses.dataclass
class Lines:
  """A table's header and body lines after the line-level checks."""
  path: str
  source: str
  header: list[str]
  header_line: int
  delimiter: str
  body: list[str]            # physical lines after the header (text)
  first_line: int            # physical line number of body[0]
  blank: np.ndarray          # (len(body),) bool
  bad: dict[int, str]        # body index -> reason the line is set aside
  quoted: np.ndarray         # (len(body),) bool: holds a quote (parsed with the csv module)
  info: dict
  # body index -> why the line is no row (`_not_rows`: a repeated header, a SQL tool's rule)
  not_rows: dict[int, str] = dataclasses.field(default_factory=dict)


def refuse(path: str, what: str) -> TableError:
  return TableError(f"{path}: {what}")


def _decode(path: str, raw: bytes) -> tuple[str, dict, set[int]]:
  """(text with '\\n' line ends, format info, indices of lines that are not valid UTF-8)."""
  info = {"encoding": "utf-8", "bom": False}
  if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
    try:
      text = raw.decode("utf-16")
    except UnicodeDecodeError:
      raise refuse(path, "the file starts with a UTF-16 byte order mark but is not valid "
                   "UTF-16; save it as CSV (UTF-8)") from None
    info.update(encoding="utf-16", bom=True)
    return _line_ends(text, info), info, set()
  if raw.startswith(b"\xef\xbb\xbf"):
    raw, info["bom"] = raw[3:], True
  crlf = raw.count(b"\r\n")
  info["line_endings"] = _ending_name(crlf, raw.count(b"\r") - crlf, raw.count(b"\n") - crlf)
  raw = raw.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
  try:
    return raw.decode("utf-8"), info, set()
  except UnicodeDecodeError:
    pass
  # Not UTF-8 throughout. A file with valid multi-byte UTF-8 on at least as many lines as lines
  # that fail is UTF-8 with damaged lines (set aside); otherwise it is cp1252 (Latin-1 for the
  # five bytes cp1252 leaves undefined), as spreadsheet exports on Windows write it.
  lines = raw.split(b"\n")
  bad, good = set(), 0
  for i, line in enumerate(lines):
    if not line.isascii():
      try:
        line.decode("utf-8")
        good += 1
      except UnicodeDecodeError:
        bad.add(i)
  header = next((i for i, line in enumerate(lines) if line.strip(b" \t")), 0)
  if good and good >= len(bad) and header not in bad:
    text = "\n".join("" if i in bad else line.decode("utf-8") for i, line in enumerate(lines))
    return text, info, bad
  try:
    text, info["encoding"] = raw.decode("cp1252"), "cp1252"
  except UnicodeDecodeError:
    text, info["encoding"] = raw.decode("latin-1"), "latin-1"
  return text, info, set()


def _ending_name(crlf: int, cr: int, lf: int) -> str:
  kinds = [name for name, n in (("CRLF", crlf), ("CR", cr), ("LF", lf)) if n]
  return "+".join(kinds) if kinds else "none"


def _line_ends(text: str, info: dict) -> str:
  crlf = text.count("\r\n")
  info["line_endings"] = _ending_name(crlf, text.count("\r") - crlf, text.count("\n") - crlf)
  return text.replace("\r\n", "\n").replace("\r", "\n")


def _outside_quotes(line: str) -> str:
  return re.sub(r'"[^"]*"', "", line)


_SEP_LINE = re.compile(r'\s*"?sep=([,;\t|])"?\s*', re.IGNORECASE)


def _header_line(path: str, lines: list[str], info: dict) -> tuple[int, str, str, bool]:
  """(index of the header line, its text, the delimiter, whether an Excel 'sep=;' line before it
  named the delimiter); the delimiter to info['delimiter']. Refuses a file of blank lines or
  whose header holds control bytes."""
  h = next((i for i, line in enumerate(lines) if line.strip(" \t")), None)
  if h is None:
    raise refuse(path, "the file holds only blank lines; a table needs a header line naming "
                 "its columns (or remove the file: every table is optional)")
  sep = _SEP_LINE.fullmatch(lines[h])   # Excel's 'sep=;' before the header
  if sep:
    info["sep_line"] = 1
    h = next((i for i in range(h + 1, len(lines)) if lines[i].strip(" \t")), None)
    if h is None:
      raise refuse(path, "holds only a 'sep=' line; a table needs a header line naming its "
                   "columns (or remove the file: every table is optional)")
  header_text = lines[h]
  if any(ord(ch) < 32 and ch != "\t" for ch in header_text):
    raise refuse(path, "not a text table (control or NUL bytes; binary data, or UTF-16 "
                 "without a byte order mark?); export it as CSV (UTF-8)")
  counts = {d: _outside_quotes(header_text).count(d) for d in DELIMITERS}
  delimiter = max(DELIMITERS, key=lambda d: counts[d])   # ties: the earlier in DELIMITERS
  if sep:
    delimiter = sep[1]
  elif counts[delimiter] == 0:
    delimiter = ","
  info["delimiter"] = delimiter
  return h, header_text, delimiter, bool(sep)


def _split_lines(path: str, raw: bytes) -> Lines:
  # labs.csv.gz's and labs.csv.zip's rows are labs.csv's
  source = os.path.basename(path).removesuffix(".gz").removesuffix(".zip")
  if not raw:
    raise refuse(path, "the file is empty; a table needs a header line naming its columns (or "
                 "remove the file: every table is optional)")
  text, info, undecodable = _decode(path, raw)
  lines = text.split("\n")
  if lines and lines[-1] == "":
    lines.pop()
  h, header_text, delimiter, sep = _header_line(path, lines, info)
  try:
    header = next(csv.reader([header_text], delimiter=delimiter, strict=True,
                             skipinitialspace=True))
  except csv.Error:
    raise refuse(path, f"line {h + 1} (the header) has malformed quoting; fix the header "
                 "line") from None
  header = [unicodedata.normalize("NFC", name.strip()) for name in header]

  body, text = lines[h + 1:], "\n".join(lines[h + 1:])
  joined = {}
  if '"' in text:
    body, joined = other_lines.spanning_fields(body, delimiter, len(header), text)
    text = "\n".join(body) if joined else text
  n = len(body)
  body_bytes = np.frombuffer((text + "\n" if n else "").encode("utf-8"), np.uint8)
  delims, quotes, controls, content, first = _line_metrics(body_bytes, n, delimiter)
  bad: dict[int, str] = {}
  for i in sorted(undecodable):
    if i > h:
      bad[i - h - 1] = ("bytes that are not valid UTF-8 (the rest of the file is UTF-8); the row "
                        "is set aside")
  blank = (content == 0) & ~np.isin(np.arange(n), list(bad))
  for i in np.flatnonzero((controls > 0) & ~blank):
    byte = next(ord(ch) for ch in body[i] if _is_control(ch))
    bad.setdefault(int(i), f"control character (byte 0x{byte:02x}) in the line; the row is set "
                   "aside")
  for i in np.flatnonzero((quotes % 2 == 1) & ~blank):
    bad.setdefault(int(i), "unbalanced quote (an odd number of '\"', and no next lines close it "
                   "as a field's line breaks would); the row is set aside")
  plain = (quotes == 0) & ~blank
  for i in np.flatnonzero(plain & (delims + 1 != len(header))):
    bad.setdefault(int(i), f"{int(delims[i]) + 1} fields, the header has {len(header)}; the row "
                   "is set aside")
  not_rows = other_lines.not_rows(body, header, header_text, delimiter, info, first, delims)
  for i in not_rows:
    bad.pop(i, None)
  quoted = (quotes > 0) & ~blank
  quoted[list(bad)] = False
  # A quoted field's later lines: reported with the line they were read with, so every line of
  # the file is a row or an entry.
  for first, more in joined.items():
    for k in range(first + 1, first + more + 1):
      not_rows[k] = (f"continues the quoted field of line {first + h + 2} (a line break inside "
                     "it); read with that line")
      bad.pop(k, None)
  if joined:
    info["fields_across_lines"] = len(joined)
  info["rows"] = int(n - blank.sum() - len(not_rows))
  info["blank_lines"] = int(blank.sum() + h - sep)
  return Lines(path, source, header, h + 1, delimiter, body, h + 2, blank, bad, quoted, info,
               not_rows)


def _is_control(ch: str) -> bool:
  """A control character no table cell holds: C0 but tab, and DEL (line ends are gone)."""
  return (ord(ch) < 32 and ch != "\t") or ord(ch) == 127


def _line_metrics(body_bytes: np.ndarray, n: int, delimiter: str):
  """Per line: delimiters, quotes, control characters (C0 but tab, and DEL), other characters
  (bytes) outside whitespace, and its first byte."""
  if n == 0:
    return (np.zeros(0, np.int64),) * 4 + (np.zeros(0, np.uint8),)
  data = body_bytes  # every line ends with "\n"
  starts = np.concatenate([[0], np.flatnonzero(data == 10)[:-1] + 1])
  assert len(starts) == n, (len(starts), n)
  d = ord(delimiter)

  def per_line(mask):
    return np.add.reduceat(mask, starts, dtype=np.int64)

  quote = data == ord('"')
  empty = (data == 32) | (data == 9) | (data == 10) | (data == d)
  control = ((data < 32) & (data != 9) & (data != 10)) | (data == 127)
  return (per_line(data == d), per_line(quote), per_line(control), per_line(~empty),
          data[starts])


# -- the second pass: good lines -> a frame of cells ---------------------------------------------

@dataclasses.dataclass
class Frame:
  source: str
  delimiter: str
  columns: list[str]       # header names ('' for an unnamed column)
  frame: pd.DataFrame      # columns 0..k-1 as in `columns`; text columns as str, others inferred
  lines: np.ndarray        # (rows,) physical line of each frame row, ascending
  problems: list[Problem]  # the set-aside lines


def column_key(name: str) -> str:
  """A header name as compared with the names a column's role allows: casefolded, without
  spaces, '_', '-' or '.' ('Patient ID', 'PATIENT_ID', 'patient.id' and 'patientid' are one)."""
  return re.sub(r"[\s_\-.]", "", str(name)).casefold()


def column_index(header: Sequence[str], names: Sequence[str]) -> int | None:
  """The index of the first `header` column whose `column_key` is one of `names`' (in `names`'
  order of preference); None when there is none."""
  keys = [column_key(h) for h in header]
  return next((keys.index(k) for k in map(column_key, names) if k in keys), None)


def find_column(lines: Lines, names: Sequence[str], what: str,
                header: Sequence[str] | None = None) -> int:
  """`column_index` of a column the file must have, or a refusal naming the spellings allowed;
  in `header` where given (the file's, each name as config.data.rename maps it)."""
  j = column_index(lines.header if header is None else header, names)
  if j is not None:
    return j
  # The header is not echoed: a file without one would show its first row (patient ids).
  comment = lines.header and lines.header[0].lstrip().startswith("#")
  raise refuse(lines.path, f"line {lines.header_line} is not a header with a {what} column "
               f"(one of {list(names)}, compared ignoring case, spaces, '_', '-' and '.'; "
               f"{len(lines.header)} columns found); "
               + ("remove the comment lines ('#') above the header" if comment else
                  f"name the file's {what} column one of these or map its name to one with "
                  f"config.data.rename (e.g. {{'{_EXAMPLE.get(what, 'name')}': "
                  f"'{names[0]}'}}), or add a header line naming the columns if the file has "
                  "none"))


# A column name of each role that cohorts use and no built-in spelling covers, for the
# refusal's example (REDCap names the participant 'record_id', the PBC trial its outcome
# 'status').
_EXAMPLE = {"patient id": "record_id", "label": "status", "time": "draw_time"}


def _check_header(lines: Lines) -> None:
  seen: dict[str, int] = {}
  for j, name in enumerate(lines.header):
    if not name:
      continue
    key = name.casefold()
    if key in seen:
      # The name is not echoed: a header cell may hold anything, an identifier included.
      raise refuse(lines.path, f"columns {seen[key] + 1} and {j + 1} of the header have the same "
                   "name (compared ignoring case); remove or rename one")
    seen[key] = j


def _parse(lines: Lines, text_columns: Sequence[int]) -> Frame:
  """Parses the good lines; unquoted ones with pandas, quoted ones one by one with csv."""
  k = len(lines.header)
  bad = dict(lines.bad)
  good = ~lines.blank
  good[list(bad) + list(lines.not_rows)] = False
  plain_idx = np.flatnonzero(good & ~lines.quoted)
  numeric = [j for j in range(k) if j not in set(text_columns)]
  if len(plain_idx):
    body = np.array(lines.body, dtype=object)
    plain = pd.read_csv(
        io.StringIO("\n".join(body[plain_idx])), sep=lines.delimiter, header=None,
        names=list(range(k)), quoting=csv.QUOTE_NONE, engine="c", low_memory=False,
        dtype={j: str for j in text_columns}, keep_default_na=False,
        na_values={j: [""] for j in numeric}, skip_blank_lines=False)
    if len(plain) != len(plain_idx):
      raise RuntimeError(f"{lines.path}: parsed {len(plain)} rows from {len(plain_idx)} lines")
  else:
    plain = pd.DataFrame({j: pd.Series([], dtype=object) for j in range(k)})
  rows, row_idx = [], []
  for i in np.flatnonzero(good & lines.quoted):
    try:
      fields = next(csv.reader([lines.body[i]], delimiter=lines.delimiter, strict=True,
                               skipinitialspace=True))
    except csv.Error as e:
      bad[int(i)] = f"malformed quoting ({e}); the row is set aside"
      continue
    if len(fields) != k:
      bad[int(i)] = f"{len(fields)} fields, the header has {k}; the row is set aside"
      continue
    rows.append(fields)
    row_idx.append(i)
  frame, idx = plain, plain_idx
  if rows:
    quoted = pd.DataFrame(rows, columns=list(range(k)), dtype=object)
    frame = pd.concat([plain.astype(object), quoted], ignore_index=True)
    idx = np.concatenate([plain_idx, np.array(row_idx, np.int64)])
    order = np.argsort(idx, kind="stable")
    frame, idx = frame.iloc[order].reset_index(drop=True), idx[order]
  for j in text_columns:
    frame[j] = frame[j].fillna("").astype(object)
  problems = [Problem(lines.source, i + lines.first_line, reason) for i, reason in bad.items()]
  problems += [Problem(lines.source, i + lines.first_line, reason, "line")
               for i, reason in lines.not_rows.items()]
  lines.info["malformed_lines"] = len(bad)
  return Frame(lines.source, lines.delimiter, list(lines.header), frame,
               idx.astype(np.int64) + lines.first_line, problems)


def field_of(lines: Lines, line: int, column: int) -> str:
  """Column `column`'s text in physical line `line` of the body, read leniently (a line set
  aside as malformed: split at the delimiter, quotes dropped); '' where it has none."""
  i = line - lines.first_line
  if not 0 <= i < len(lines.body):
    return ""
  fields = lines.body[i].split(lines.delimiter)
  if column >= len(fields):
    return ""
  return "".join(ch for ch in fields[column] if not _is_control(ch)).strip().strip('"').strip()


MAX_BYTES = 2048 << 20   # a table's, read or unpacked: the default config.data.max_file_mb


def _unzipped(path: str, max_bytes: int) -> bytes:
  """The one file of a zipped table (a Mac's __MACOSX/ and ._ entries aside), at most
  `max_bytes` + 1 of it."""
  with zipfile.ZipFile(path) as z:
    members = [m for m in z.infolist() if not m.is_dir()
               and not m.filename.startswith("__MACOSX/")
               and not os.path.basename(m.filename).startswith("._")]
    if len(members) != 1:
      raise refuse(path, f"holds {len(members)} files where a zipped table holds one; unpack "
                   "the table's file to its name (or remove it: every table is optional)")
    with z.open(members[0]) as f:
      return f.read(max_bytes + 1)


def load(path: str, text_columns_of, max_bytes: int = MAX_BYTES) -> tuple[Lines, Frame]:
  """Reads `path` (gzipped where it ends in .gz, zipped where in .zip), refused past
  `max_bytes` (config.data.max_file_mb) unpacked; `text_columns_of(lines)` names the columns
  kept as text (the rest numeric)."""
  packing = "zip" if path.endswith(".zip") else "gzip"
  try:
    if path.endswith(".zip"):
      raw = _unzipped(path, max_bytes)
    else:
      with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
        raw = f.read(max_bytes + 1)
  except (gzip.BadGzipFile, zipfile.BadZipFile, EOFError, zlib.error):
    raise refuse(path, f"is a {packing} file cut short or damaged; copy or export it again (or "
                 "remove it: every table is optional)") from None
  except (NotImplementedError, RuntimeError):   # zipfile: Deflate64, or an encrypted member
    raise refuse(path, "is zipped encrypted or by a method Python cannot unpack; unpack it to "
                 f"{os.path.basename(path).removesuffix('.zip')} (or remove it: every table is "
                 "optional)") from None
  except OSError as e:
    raise refuse(path, f"cannot be read ({e.strerror or type(e).__name__}); give the process "
                 "read permission on it (or remove it: every table is optional)") from None
  if len(raw) > max_bytes:
    raise refuse(path, f"unpacks to more than config.data.max_file_mb={max_bytes >> 20} MiB; "
                 "check that it is the table meant, and raise it if so")
  lines = _split_lines(path, raw)
  text_columns = text_columns_of(lines)
  _check_header(lines)
  return lines, _parse(lines, text_columns)
