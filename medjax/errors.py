"""The error a user sees: one line, exit code 2, no traceback.

Anything wrong with what the user gave medjax (a config field, a cohort file, a table row, a run
directory left in a bad state) is raised as `InputError` (or a subclass) with a message that says
what is wrong, which file, field or value, and what to do, in one line and without raw patient
identifiers (use "row 17 of labels.csv" or the pseudonym). `medjax.cli` prints it as
`error: <message>` and exits with `EXIT_INPUT`; `--debug` (or MEDJAX_DEBUG=1) shows the traceback.
"""

from __future__ import annotations

import os
import sys

EXIT_INPUT = 2   # bad input, bad config or damaged run state: the user must act


class InputError(ValueError):
  """Bad input, bad config or damaged state; str(e) is the one line the user reads."""

  def __init__(self, message: str):
    super().__init__(one_line(message))


def one_line(message: str, limit: int = 600) -> str:
  """Whitespace (newlines included) collapsed, bounded: an error is one line."""
  text = " ".join(str(message).split())
  return text if len(text) <= limit else text[:limit - 3] + "..."


def print_error(message: str) -> None:
  """The line a user reads on stderr: `error: <message>`."""
  print(f"error: {one_line(message)}", file=sys.stderr, flush=True)


def debug() -> bool:
  """Whether errors should show their traceback (MEDJAX_DEBUG=1, set by --debug)."""
  return os.environ.get("MEDJAX_DEBUG", "") not in ("", "0")
