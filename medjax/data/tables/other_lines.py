"""A table file's lines that are not one row each: a record whose quoted field spans lines (an
EHR comment with line breaks), the header repeated mid-file (files joined end to end) and a SQL
tool's rules and row counts. `csvfile` splits the file; these find which of its lines are which.
"""

from __future__ import annotations

import csv
import re
import unicodedata

import numpy as np


# Lines a quoted field may span (a free-text comment with line breaks) before it must close.
MAX_FIELD_LINES = 50


def spanning_fields(body: list[str], delimiter: str, fields: int,
                    text: str) -> tuple[list[str], dict]:
  """`body` with each record whose quoted field spans lines (an EHR export's comment with line
  breaks: 'P1,140,"called' then 'the doctor"') on its first line, the breaks as spaces (its
  other lines as they were); and {first line's index: lines joined after it}. Only where the
  field closes within `MAX_FIELD_LINES`, every line it takes holds fewer delimiters than a
  whole record (it is no row of its own) and the record has the header's `fields`: a stray
  quote still costs its own line only. `text`: the lines joined by line ends."""
  body, joined = list(body), {}
  done = -1
  for i in _lines_matching(body, text, '"'):
    if i <= done or body[i].count('"') % 2 == 0:
      continue
    quotes, j = body[i].count('"'), i
    while quotes % 2 and j + 1 < len(body) and j - i < MAX_FIELD_LINES:
      j += 1
      if body[j].count(delimiter) + 1 >= fields:
        break
      quotes += body[j].count('"')
    record = " ".join(body[i:j + 1])
    if quotes % 2 == 0 and body[j].count(delimiter) + 1 < fields and _fields(
        record, delimiter) == fields:
      body[i] = record
      joined[i] = j - i
      done = j
  return body, joined


def _lines_matching(body: list[str], text: str, pattern: str) -> list[int]:
  """The indices of `body`'s lines (`text`, joined by line ends) where `pattern` matches: one
  regex pass over the whole text, where a Python loop over millions of lines would not do."""
  at = [m.start() for m in re.finditer(pattern, text)]
  if not at:
    return []
  starts = np.cumsum([0, *(n + 1 for n in map(len, body[:-1]))])
  return np.unique(np.searchsorted(starts, at, side="right") - 1).tolist()


def _fields(line: str, delimiter: str) -> int:
  """How many fields the csv module reads in `line` (0 where its quoting is malformed)."""
  try:
    return len(next(csv.reader([line], delimiter=delimiter, strict=True,
                               skipinitialspace=True)))
  except (csv.Error, StopIteration):
    return 0


# What a SQL tool's text output puts around the rows: a rule under the header (sqlcmd's and
# psql's '-----', '+----+') and a row count after them ('(42 rows affected)', psql's
# '(42 rows)', SQL*Plus's '42 rows selected.', MySQL's '42 rows in set (0.01 sec)', SSMS's
# 'Completion time: ...').
_RULE = re.compile(r"[\s|+:=\-]*(?:-{3,}|={3,})[\s|+:=\-]*")
_ROW_COUNT = re.compile(r"\(\s*\d[\d,]*\s+rows?(?:\s+affected)?\s*\)|\d[\d,]*\s+rows?\s+"
                        r"(?:affected|selected|in set\b.*)\.?|completion time: .*", re.IGNORECASE)


def not_rows(body: list[str], header: list[str], header_text: str, delimiter: str, info: dict,
             first: np.ndarray, delims: np.ndarray) -> dict[int, str]:
  """Body lines that are no rows, each with its reason: those repeating the header (`_repeats`)
  and a SQL tool's rule and row count (`_RULE`, `_ROW_COUNT`); counted as
  info['repeated_headers'] and info['sql_tool_lines']. Only lines whose first byte (`first`)
  and delimiter count (`delims`) allow it are looked at: a file of millions of rows costs
  a few numpy passes, not a Python loop over them."""
  fold = np.where((first >= 65) & (first <= 90), first + 32, first)   # ASCII lower case
  lead = header_text.lstrip("\ufeff\"").encode("utf-8")[:1].lower()
  maybe_header = (np.isin(fold, np.frombuffer(lead + b'"\xef', np.uint8))
                  & (delims + 1 == len(header)))
  out = {i: "repeats the header line (files joined end to end?); the line is set aside"
         for i in _repeats(body, header, delimiter, np.flatnonzero(maybe_header))}
  info.update({"repeated_headers": len(out)} if out else {})
  tool = 0
  short = delims + 1 < len(header)   # a row count has fewer fields than a row; a rule need not
  maybe_tool = (np.isin(fold, np.frombuffer(b"-=+|", np.uint8))
                | (short & (np.isin(fold, np.frombuffer(b"(c", np.uint8))
                            | ((fold >= 48) & (fold <= 57)))))
  for i in np.flatnonzero(maybe_tool).tolist():
    if i in out:
      continue
    text = body[i].replace(delimiter, " ").strip()
    if _RULE.fullmatch(text) or _ROW_COUNT.fullmatch(text):
      out[i] = ("a rule or row count of a SQL tool's text output, not a row (export the query "
                "as CSV to leave it out); the line is set aside")
      tool += 1
  info.update({"sql_tool_lines": tool} if tool else {})
  return out


def _repeats(body: list[str], header: list[str], delimiter: str,
             candidates: np.ndarray) -> tuple[int, ...]:
  """Of the `candidates` body lines, those that repeat the header (files joined end to end, `cat
  a.csv b.csv`: each part's header, a byte order mark or quotes around its names too),
  compared ignoring case."""
  if not header or not header[0]:
    return ()
  want = [h.casefold() for h in header]
  out = []
  for i in candidates.tolist():
    if header[0].casefold() not in body[i][:256].casefold():
      continue
    try:
      fields = next(csv.reader([body[i].lstrip("\ufeff")], delimiter=delimiter,
                               skipinitialspace=True))
    except (csv.Error, StopIteration):
      continue
    if [unicodedata.normalize("NFC", f.strip()).casefold() for f in fields] == want:
      out.append(i)
  return tuple(out)
