"""Where a process's log lines go: its own file in the run's logs (the launcher's: log.txt)."""

from __future__ import annotations

import logging
import os
import sys
import traceback

from medjax import errors
from medjax import paths


def setup(workdir: str, name: str) -> None:
  """Sends this process's log records to `workdir`'s log for `name` ("log": the launcher's
  log.txt; else logs/<name>.txt), in place of any log file it wrote to before (a forked agent's
  parent's)."""
  run = paths.RunPaths(workdir)
  os.makedirs(run.logs, exist_ok=True)
  path = run.log if name == "log" else run.role_log(name)
  root, quiet = logging.getLogger(), logging.getLogger("asyncio")
  for logger in (root, quiet):
    for old in [h for h in logger.handlers if isinstance(h, logging.FileHandler)]:
      logger.removeHandler(old)
      old.close()
  handler = logging.FileHandler(path)
  handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
  root.addHandler(handler)
  root.setLevel(logging.INFO)
  # Orbax and JAX log through absl at INFO for every save; keep their warnings, drop the chatter.
  logging.getLogger("absl").setLevel(logging.WARNING)
  # asyncio reports exceptions no one retrieved from Orbax's and TensorStore's internal event
  # loops (e.g. a read of a damaged checkpoint that was already skipped for the previous one),
  # when they are garbage-collected, tracebacks included: library detail for the log file, not
  # the terminal.
  quiet.addHandler(handler)
  quiet.propagate = False
  if not errors.debug():
    sys.unraisablehook = _unraisable_to_log


def _unraisable_to_log(unraisable) -> None:
  """sys.unraisablehook: an exception Python can only report, not raise (in a coroutine
  garbage-collected unfinished, a TensorStore callback on an event loop Orbax already closed,
  e.g. after a damaged checkpoint was skipped), goes to the log files, not the terminal, where it
  printed a traceback after the one-line error (`--debug` keeps Python's own report). Not through
  logging's other handlers: absl's writes warnings to stderr."""
  files = [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]
  if not files:
    sys.__unraisablehook__(unraisable)
    return
  where = f" in {unraisable.object!r}" if unraisable.object is not None else ""
  text = "".join(traceback.format_exception(unraisable.exc_type, unraisable.exc_value,
                                            unraisable.exc_traceback))
  record = logging.LogRecord("medjax", logging.WARNING, __file__, 0,
                             "(library output) exception ignored%s: %s", (where, text), None)
  for handler in files:
    handler.handle(record)
