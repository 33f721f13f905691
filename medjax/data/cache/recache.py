"""What each host caches in a generation, and the background recacher.

A host caches the records it owns under the generation's placement (and, with
`config.data.replicas = 2`, the records it is second owner of: where each would move if its owner
left). When the host set changes, a host keeps what it still wants, and decodes what is new to it
from shared storage once, in the background, in the order the partition plan will read it; a
training read that needs a record first decodes it itself and the recacher skips it (the cache
makes sure no record is decoded twice). In a run's first host set nothing has moved, and the host
fills its cache before training.

`config.data.cache_policy = 'redirect'` is the cache paper's first approach, a baseline: records
a host did not own in the first host set are read from shared storage at every read and never
cached.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import logging
import os
import threading
import time
import numpy as np

from medjax.data import cache as cache_lib
from medjax.data.cache import placement as placement_lib

POLICIES = ("recache", "redirect")


@dataclasses.dataclass(frozen=True)
class HostRows:
  """Manifest rows (sorted) one host caches in one generation.

  Attributes:
    wanted: rows it owns, plus (replicas = 2) the rows it is second owner of.
    moved_in: rows it owns now but did not own before the latest membership change.
    background: wanted rows that are new since the latest membership change, decoded in the
      background (empty in the run's first host set).
    no_cache: rows read from shared storage at every read, never cached (redirect baseline).
    membership: how many membership changes this generation's host set follows.
  """
  wanted: np.ndarray
  moved_in: np.ndarray
  background: np.ndarray
  no_cache: np.ndarray
  membership: int

  @property
  def prefill(self) -> np.ndarray:
    """Rows to have cached before training: wanted, neither new nor never cached."""
    return np.setdiff1d(self.wanted, np.union1d(self.background, self.no_cache))


def _owned(manifest, place: placement_lib.Placement, host: str,
           replicas: int) -> tuple[np.ndarray, np.ndarray]:
  """(primary_N, wanted_N) bool masks of `host` under `place`."""
  n = len(manifest)
  if host not in place.hosts:
    return np.zeros(n, bool), np.zeros(n, bool)
  w = place.host_index(host)
  primary_N = place.owner_N == w
  wanted_N = primary_N.copy()
  if replicas == 2:
    wanted_N |= placement_lib.replica_owners(place, manifest) == w
  return primary_N, wanted_N


def host_rows(data_config, manifest, walk: placement_lib.Walk, host: str) -> HostRows:
  """What `host` caches after the host history that `walk` placed (its latest host set)."""
  policy, replicas = data_config.cache_policy, int(data_config.replicas)
  if policy not in POLICIES:
    raise ValueError(f"config.data.cache_policy={policy!r}; use one of {POLICIES}")
  if replicas not in (1, 2):
    raise ValueError(f"config.data.replicas={replicas}; use 1 or 2")
  if policy == "redirect" and replicas != 1:
    raise ValueError("config.data.cache_policy='redirect' never caches moved records, so "
                     "config.data.replicas must be 1")
  primary_N, wanted_N = _owned(manifest, walk.current, host, replicas)
  empty = np.zeros(0, np.int64)
  if not walk.changes:
    return HostRows(np.flatnonzero(wanted_N), empty, empty, empty, 0)
  prev_primary_N, prev_wanted_N = _owned(manifest, walk.previous, host, replicas)
  no_cache_N = np.zeros(len(manifest), bool)
  if policy == "redirect":
    no_cache_N = primary_N & ~_owned(manifest, walk.first, host, 1)[0]
  return HostRows(wanted=np.flatnonzero(wanted_N & ~no_cache_N),
                  moved_in=np.flatnonzero(primary_N & ~prev_primary_N),
                  background=np.flatnonzero(wanted_N & ~prev_wanted_N & ~no_cache_N),
                  no_cache=np.flatnonzero(no_cache_N), membership=walk.changes)


def plan_order(first_rows: np.ndarray, rows: np.ndarray) -> np.ndarray:
  """`rows`, those in `first_rows` first in that order (e.g. the plan's upcoming reads)."""
  first = np.asarray(first_rows, np.int64).ravel()
  first = first[first >= 0]
  wanted = np.zeros(int(max(rows.max(initial=-1), first.max(initial=-1))) + 1, bool)
  wanted[rows] = True
  _, keep = np.unique(first, return_index=True)
  head = first[np.sort(keep)]
  head = head[wanted[head]]
  return np.concatenate([head, np.setdiff1d(rows, head)])


class Recacher:
  """Decodes rows into a cache on a background thread, in order, each at most once.

  Args:
    cache: the host's writable `cache.Cache`.
    rows: manifest rows in the order to decode them.
    chunk: records decoded between checks of the stop flag (and index writes).
  """

  def __init__(self, cache, rows: np.ndarray, *, chunk: int = 16):
    self.cache, self.rows, self.chunk = cache, np.asarray(rows, np.int64), chunk
    self.done = threading.Event()
    self.decoded = 0
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, name="recache", daemon=True)

  def start(self) -> "Recacher":
    if len(self.rows):
      logging.info("recache: decoding %d newly owned records in the background", len(self.rows))
      self._thread.start()
    else:
      self.done.set()
    return self

  def _run(self) -> None:
    t0 = time.perf_counter()
    try:
      self.decoded = self.cache.ensure(self.rows, batch=self.chunk, stop=self._stop,
                                       processes=1)   # beside training: one core
    except Exception:  # pylint: disable=broad-except  (training reads decode what they need)
      logging.exception("recache: failed; training reads will decode what they need")
    finally:
      logging.info("recache: %d records decoded in %.1f s", self.decoded,
                   time.perf_counter() - t0)
      self.done.set()

  def close(self) -> None:
    self._stop.set()
    if self._thread.is_alive():
      self._thread.join()


def publish(directory: str, host: str, process: int, counters: dict) -> None:
  """Copies one process's cache counters to shared storage (`RunPaths.cache_stats`)."""
  os.makedirs(directory, exist_ok=True)
  cache_lib.write_json(os.path.join(directory, f"{host}.{process}.json"), counters)


def gathered(directory: str) -> dict:
  """Every host's published counters, summed over its processes: {'hosts': ..., 'total': ...}.

  Hosts that left the run keep the counts they published before leaving.
  """
  hosts: dict[str, dict] = {}
  for path in sorted(glob.glob(os.path.join(directory, "*.json"))):
    host = os.path.basename(path).rsplit(".", 2)[0]
    with open(path) as f:
      counters = json.load(f)
    mine = hosts.setdefault(host, dict.fromkeys(cache_lib.COUNTERS, 0))
    for k in cache_lib.COUNTERS:
      mine[k] += counters.get(k, 0)
  total = {k: sum(h[k] for h in hosts.values()) for k in cache_lib.COUNTERS}
  rounded = lambda c: {k: round(v, 3) if isinstance(v, float) else v for k, v in c.items()}
  return {"hosts": {h: rounded(c) for h, c in hosts.items()}, "total": rounded(total)}
