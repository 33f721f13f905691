"""`Barrier`: Orbax's public barrier in jax.distributed's coordination service."""

from __future__ import annotations

import jax
import orbax.checkpoint as ocp


class Barrier:
  """Waits until every process of the generation gets here (a no-op with one process).

  A key-value barrier in jax.distributed's coordination service (Orbax's public barrier).
  Unlike multihost_utils.sync_global_devices, a collective whose first use gives up after 30 s
  while gloo connects, it waits up to `timeout_s`, e.g. while one host fills a large cache.
  Every process must call it with the same names in the same order.
  """

  def __init__(self, timeout_s: float):
    self.timeout_s = timeout_s
    self._calls = 0

  def __call__(self, name: str, timeout_s: float | None = None) -> None:
    self._calls += 1
    if jax.process_count() == 1:
      return
    sync = ocp.multihost.get_barrier_sync_fn()
    sync(key=f"medjax/{name}/{self._calls}",
         timeout_ms=int((timeout_s or self.timeout_s) * 1000))
