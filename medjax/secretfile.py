"""Owner-only files for secrets (the pseudonymisation salt, the coordinator token)."""

from __future__ import annotations

import os
from typing import Callable


def read_or_create(path: str, make: Callable[[], bytes]) -> bytes:
  """The file's bytes; if it does not exist, writes `make()` there first (mode 0600).

  The file appears whole or not at all (written beside it, then linked into place, which fails
  if another process made it first: theirs is read), so that a process starting beside the
  creator never reads a half-written secret.
  """
  if not os.path.exists(path):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    partial = f"{path}.{os.getpid()}.partial"
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
      with os.fdopen(fd, "wb") as f:
        f.write(make())
        f.flush()
        os.fsync(f.fileno())
      try:
        os.link(partial, path)
      except FileExistsError:
        pass  # another process made it first; read theirs
      except OSError:   # no hard links here (some network or FUSE filesystems): exclusive create
        _create_exclusive(path, partial)
    finally:
      os.unlink(partial)
  with open(path, "rb") as f:
    return f.read()


def _create_exclusive(path: str, partial: str) -> None:
  with open(partial, "rb") as f:
    value = f.read()
  try:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
  except FileExistsError:
    return
  with os.fdopen(fd, "wb") as f:
    f.write(value)
