"""The data layer's process pools (the header scan, the cache fill, the synthetic writer): `Pool`
maps jobs in order on processes from one forkserver, and finishes in this process when one of
them dies; `cores` is how many processes "one per core" means.

Not fork: the caller may have started JAX's threads, and a forked copy can deadlock on them. The
forkserver is a fresh interpreter, started once per process, and it imports the decoding code
(NumPy, pydicom, PIL, TensorStore) before it forks any pool process: each pool process then
starts with it imported instead of importing it again (about 0.6 CPU seconds a process, and
the pool's start on a host with many cores).

It also runs the caller's main module once, as a pool process would
(`medjax.data.pool_main`). Each pool process runs the parent's main module (a script, or a `-m`
module other than a package's `__main__`) before its first job, unless the forkserver ran it.
Preloading '__main__' was meant to do that, and on Python before 3.13 it does nothing
(CPython gh-126631): every process of a pool started from `python launch.py` or `python -m
experiments.bench_data` ran that module's imports again. `python -m medjax`, the workers'
command, runs a package's `__main__`, which pool processes skip in any case.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import multiprocessing
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import forkserver
from multiprocessing import spawn

# What the forkserver imports once, in this order; `pool_main` runs the caller's main module
# (named in MAIN_ENV) there.
PRELOAD = ("medjax.data.pool_main", "medjax.data.cache.fill", "medjax.data.dicom.scan")
MAIN_ENV = "MEDJAX_POOL_MAIN"
_starting = threading.Lock()


def cores() -> int:
  """The cores this process may run on: its CPU affinity (what a SLURM allocation, a cpuset or
  `taskset` gives it), not the machine's count, which a job given 4 cores of a 128-core node
  would otherwise fill with 128 processes."""
  try:
    return len(os.sched_getaffinity(0)) or 1
  except (AttributeError, OSError):   # no affinity API (macOS)
    return os.cpu_count() or 1


class Pool:
  """`map` runs jobs in order on `processes` processes from the data layer's forkserver, or in
  this process where `processes` is 1.

  A pool process that dies (the kernel's OOM killer, a signal) breaks the pool: each map under
  way goes on in this process from the first result it had not returned, after one warning
  (`on_death`), instead of failing. The data layer's jobs (a file's name and settings) give the
  same result wherever they run, so a map's results are the same either way.
  """

  def __init__(self, processes: int, on_death: str):
    self.processes, self.on_death = max(1, int(processes)), on_death
    self._pool = None
    if self.processes > 1:
      self._pool = concurrent.futures.ProcessPoolExecutor(self.processes, mp_context=context())

  def map(self, fn: Callable, jobs: Iterable, chunksize: int = 1) -> Iterator:
    """`fn` of each job, in order. In the pool, every job is handed out before this returns
    (under way while the caller does something else); here, each runs as it is reached."""
    jobs = list(jobs)
    if self._pool is not None:
      try:
        return self._collect(fn, jobs, self._pool.map(fn, jobs, chunksize=chunksize))
      except BrokenProcessPool:
        self._broken()
    return map(fn, jobs)

  def _collect(self, fn: Callable, jobs: list, results: Iterator) -> Iterator:
    done = 0
    try:
      for result in results:
        yield result
        done += 1
    except (BrokenProcessPool, concurrent.futures.CancelledError):   # cancelled: by _broken
      self._broken()
      yield from map(fn, jobs[done:])

  def _broken(self) -> None:
    if self._pool is None:   # another map of this pool found it broken first
      return
    logging.warning(self.on_death)
    self._pool.shutdown(wait=False, cancel_futures=True)
    self._pool, self.processes = None, 1

  def __enter__(self) -> Pool:
    return self

  def __exit__(self, *exc) -> None:
    if self._pool is not None:
      self._pool.shutdown(wait=True, cancel_futures=True)


def context() -> multiprocessing.context.ForkServerContext:
  """The forkserver context of the data layer's pools, its forkserver running: started here
  with the preload (and this process's main module named to `pool_main`, for that start only)
  where it was not running yet."""
  ctx = multiprocessing.get_context("forkserver")
  ctx.set_forkserver_preload(list(PRELOAD))
  with _starting:   # two threads' pools: neither removes the name while the other starts
    previous = os.environ.get(MAIN_ENV)
    os.environ[MAIN_ENV] = main_entry()   # the forkserver inherits it when it starts
    try:
      forkserver.ensure_running()
    finally:
      if previous is None:
        del os.environ[MAIN_ENV]
      else:
        os.environ[MAIN_ENV] = previous
  return ctx


def main_entry() -> str:
  """How a pool process would set up this process's main module, as JSON: {"name": module}
  (`python -m`) or {"path": script}, with "argv"; {} where there is nothing to run (an
  interactive session, `python -c`)."""
  data = spawn.get_preparation_data("pool")
  for key, kind in (("init_main_from_name", "name"), ("init_main_from_path", "path")):
    if key in data:
      return json.dumps({kind: data[key], "argv": data["sys_argv"]})
  return "{}"
