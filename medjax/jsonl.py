"""JSON-lines files (events, metrics, ledgers, quarantine reports): one reader for all of them."""

from __future__ import annotations

import json
import os


def read(path: str) -> list[dict]:
  """Every complete line of `path` as a dict ([] when the file does not exist).

  A line cut short, as when a writer is SIGKILLed mid-write, is skipped: readers of a live run's
  files must not fail on it.
  """
  if not os.path.exists(path):
    return []
  out = []
  with open(path) as f:
    for line in f:
      if not line.strip():
        continue
      try:
        out.append(json.loads(line))
      except json.JSONDecodeError:
        continue
  return out
