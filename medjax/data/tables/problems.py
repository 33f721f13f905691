"""`Problems`: what the table readers set aside (rows, values) and count, shared by them."""

from __future__ import annotations

import dataclasses
import re
from typing import Sequence

from medjax.data.tables import csvfile


# What a reason or a file's counts show in place of text that could identify a patient.
WITHHELD = "(withheld: it may identify a patient)"


class Problems:
  """Collects set-aside rows and values, or raises on the first one; keeps per-file counts."""

  def __init__(self, on_error: str):
    if on_error not in ("raise", "quarantine"):
      raise ValueError(f"config.data.on_error={on_error!r}: use 'raise' or 'quarantine'")
    self.on_error = on_error
    self.items: list[csvfile.Problem] = []
    self.files: dict[str, dict] = {}   # file name -> counts and format (ingest summary)
    self.known_ids: set[str] = set()   # casefolded ids seen so far: never shown in a reason
    # Every patient id a table names in a row, accepted or set aside (normalised as joined):
    # ingest accounts for each (the manifest, or the quarantine report with the reason).
    self.named: set[str] = set()
    self.first_line: dict[str, dict[str, int]] = {}   # table file -> id -> its first line

  def report(self, source: str, line: int, reason: str) -> None:
    self.extend([csvfile.Problem(source, line, reason)])

  def redact(self) -> None:
    """Withholds any value shown in a reason, and any name in the files' counts (a merge of
    spellings, a category), that turned out to be an id (of a table read later or of a DICOM
    file): `values.shown` only knew the ids read before it."""
    def withhold(match):
      return WITHHELD if match.group(1).strip().casefold() in self.known_ids else match.group(0)
    self.items = [dataclasses.replace(p, reason=re.sub(r"'([^']*)'", withhold, p.reason))
                  for p in self.items]
    self.files = {name: _without_ids(info, self.known_ids) for name, info in self.files.items()}

  def extend(self, found: Sequence[csvfile.Problem]) -> None:
    """Adds problems in line order; with on_error='raise', raises the first."""
    found = sorted(found, key=lambda p: p.line)
    if found and self.on_error == "raise":
      p = found[0]
      raise csvfile.TableError(f"{p.source}:{p.line}: {p.reason} (set "
                               "config.data.on_error='quarantine' to set such rows and values "
                               "aside and go on)")
    self.items.extend(found)


def _without_ids(value, ids: set[str]):
  """A file's counts (dicts, lists, text, numbers) with every text that is one of `ids`
  (casefolded) withheld, and every entry keyed by one left out."""
  def known(text):
    return isinstance(text, str) and text.strip().casefold() in ids
  if isinstance(value, dict):
    return {k: _without_ids(v, ids) for k, v in value.items() if not known(k)}
  if isinstance(value, (list, tuple)):
    return type(value)(_without_ids(v, ids) for v in value)
  return WITHHELD if known(value) else value
