"""Owner-only files for secrets (the pseudonymisation salt, the coordinator token)."""

from __future__ import annotations

import os
from typing import Callable


def read_or_create(path: str, make: Callable[[], bytes]) -> bytes:
  """The file's bytes; if it does not exist, writes `make()` there first (mode 0600, exclusive)."""
  if not os.path.exists(path):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    try:
      fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
      pass  # another process made it first; read theirs
    else:
      with os.fdopen(fd, "wb") as f:
        f.write(make())
  with open(path, "rb") as f:
    return f.read()
