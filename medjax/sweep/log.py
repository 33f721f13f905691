"""The sweep's lines: `say` plain on stdout and in the sweep's log file, `detail` in the file only.

(Through `logging`, the root logger's absl handler would also print them on stderr with its
prefix; the file handlers are the ones medjax.cli adds.)
"""

from __future__ import annotations

import logging


def say(message: str) -> None:
  print(message, flush=True)
  detail(message)


def detail(message: str, level: int = logging.INFO) -> None:
  record = logging.getLogger().makeRecord("medjax.sweep", level, __file__, 0, message, (), None)
  for handler in logging.getLogger().handlers:
    if isinstance(handler, logging.FileHandler):
      handler.handle(record)
