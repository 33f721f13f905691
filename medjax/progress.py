"""Progress for long work: a tqdm bar on a terminal, plain log lines (every few seconds)
otherwise."""

from __future__ import annotations

import logging
import sys
import time

import tqdm


class Progress:
  """`with Progress(total, 'decoding') as p: p.update(n)`."""

  def __init__(self, total: int, desc: str, *, unit: str = "it", every_s: float = 10.0):
    self.total, self.desc, self.unit, self.every_s = total, desc, unit, every_s
    self.done = 0
    self._bar = (tqdm.tqdm(total=total, desc=desc, unit=unit, dynamic_ncols=True, leave=False)
                 if sys.stderr.isatty() else None)
    self._start = self._last = time.monotonic()

  def update(self, n: int = 1, **postfix) -> None:
    self.done += n
    if self._bar is not None:
      self._bar.update(n)
      if postfix:
        self._bar.set_postfix(postfix, refresh=False)
      return
    now = time.monotonic()
    if now - self._last >= self.every_s or self.done >= self.total:
      self._last = now
      rate = self.done / max(now - self._start, 1e-9)
      extra = "".join(f" {k}={v}" for k, v in postfix.items())
      logging.info("%s: %d/%d %s (%.1f %s/s)%s", self.desc, self.done, self.total, self.unit,
                   rate, self.unit, extra)

  def close(self) -> None:
    if self._bar is not None:
      self._bar.close()

  def __enter__(self) -> "Progress":
    return self

  def __exit__(self, *exc) -> None:
    self.close()
