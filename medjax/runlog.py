"""Where a process's log lines go: its own file in the run's logs (the launcher's: log.txt)."""

from __future__ import annotations

import logging
import os

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
