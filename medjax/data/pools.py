"""The data layer's process pools (the header scan, the cache fill, the synthetic writer): `Pool`
maps jobs in order on processes from one forkserver, finishes in this process when one of them
dies, and replaces one stuck on a job past its time (`Stall`: the scan's and the fill's, whose
jobs read files a stalled mount may never return); `cores` is how many processes "one per core"
means.

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

import collections
import concurrent.futures
import dataclasses
import itertools
import json
import logging
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import forkserver
from multiprocessing import spawn
from typing import Any

from medjax import errors

# What the forkserver imports once, in this order; `pool_main` runs the caller's main module
# (named in MAIN_ENV) there.
PRELOAD = ("medjax.data.pool_main", "medjax.data.cache.fill", "medjax.data.dicom.scan")
MAIN_ENV = "MEDJAX_POOL_MAIN"
FAULT_ENV = "MEDJAX_POOL_FAULT"
_starting = threading.Lock()


def cores() -> int:
  """The cores this process may run on: its CPU affinity (what a SLURM allocation, a cpuset or
  `taskset` gives it), not the machine's count, which a job given 4 cores of a 128-core node
  would otherwise fill with 128 processes."""
  try:
    return len(os.sched_getaffinity(0)) or 1
  except (AttributeError, OSError):   # no affinity API (macOS)
    return os.cpu_count() or 1


@dataclasses.dataclass(frozen=True)
class Stall:
  """What a pool does with a job that runs past its time in a pool process: a read the storage
  never answers (a stalled NFS or FUSE mount), a process stopped by a signal. The process is
  killed, `result(job)` stands for the job's result (a quarantine entry), the map goes on in
  fresh processes, and past `max_jobs` such jobs in one pool the map fails with
  `errors.InputError` (the storage itself is not answering).

  Args:
    seconds: the job's time limit.
    result: the job's result in its place.
    name: the job's name in the warning and the error (its file).
    what: what the pool does, for the messages ("dicom scan").
    max_jobs: jobs that may stall before the map fails.
  """
  seconds: Callable[[Any], float]
  result: Callable[[Any], Any]
  name: Callable[[Any], str]
  what: str
  max_jobs: int = 8


class Pool:
  """`map` runs jobs in order on `processes` processes from the data layer's forkserver, or in
  this process where `processes` is 1.

  A pool process that dies (the kernel's OOM killer, a signal) breaks the pool: each map under
  way goes on in this process from the first result it had not returned, after one warning
  (`on_death`), instead of failing. The data layer's jobs (a file's name and settings) give the
  same result wherever they run, so a map's results are the same either way.

  With a `stall`, each pool process notes which job it runs since when (in shared memory), and a
  map that waits checks them: a job past its `stall.seconds` has its process killed and
  `stall.result` in its place, and the map's other unfinished jobs run again in new processes
  (at most a chunk a process is done twice). In this process (`processes` 1) nothing times out.
  """

  def __init__(self, processes: int, on_death: str, stall: Stall | None = None):
    self.processes, self.on_death, self.stall = max(1, int(processes)), on_death, stall
    self._pool = None
    self._generation = 0     # executors started: a map's futures of an older one are void
    self._slots = None       # the running job of each pool process (`_SLOT` doubles each)
    self._maps: dict[int, _Map] = {}
    self._ids = itertools.count()
    self._stalled: list[str] = []
    if self.processes > 1:
      self._start()

  def _start(self) -> None:
    ctx = context()
    self._slots = ctx.Array("d", _SLOT * self.processes, lock=False)
    claimed = ctx.Value("i", 0)
    self._pool = concurrent.futures.ProcessPoolExecutor(
        self.processes, mp_context=ctx, initializer=_claim_slot, initargs=(self._slots, claimed))
    self._generation += 1

  def map(self, fn: Callable, jobs: Iterable, chunksize: int = 1) -> Iterator:
    """`fn` of each job, in order. In the pool, every job is handed out before this returns
    (under way while the caller does something else); here, each runs as it is reached."""
    jobs = list(jobs)
    if self._pool is None:
      return map(fn, jobs)
    m = _Map(next(self._ids), fn, jobs, max(1, int(chunksize)))
    if self.stall is not None:
      m.limits = [float(self.stall.seconds(job)) for job in jobs]
    try:
      self._submit(m, range(len(jobs)))
    except BrokenProcessPool:
      self._broken()
      return map(fn, jobs)
    self._maps[m.id] = m
    return self._collect(m)

  def _submit(self, m: _Map, indices) -> None:
    indices = [i for i in indices if i not in m.done]
    for at in range(0, len(indices), m.chunksize):
      chunk = indices[at:at + m.chunksize]
      m.futures.append((chunk, self._generation, self._pool.submit(
          _run_chunk, m.fn, m.id, self.stall and self.stall.what,
          [(i, m.jobs[i]) for i in chunk])))

  def _collect(self, m: _Map) -> Iterator:
    poll = None if self.stall is None else _POLL_S
    try:
      for i in range(len(m.jobs)):
        while i not in m.done:
          if self._pool is None:   # broken: what is left runs here, as it is reached
            m.harvest()
            if i not in m.done:
              m.done[i] = m.fn(m.jobs[i])
            break
          chunk, generation, future = m.futures[0]
          if generation != self._generation:   # started again after a stall
            m.harvest()
            self._submit(m, range(i, len(m.jobs)))
            continue
          try:
            results = future.result(timeout=poll)
          except concurrent.futures.TimeoutError:
            self._check_stalls()
          except (BrokenProcessPool, concurrent.futures.CancelledError):
            if generation == self._generation:   # a death (cancelled: by another map's)
              self._broken()
          else:
            m.futures.popleft()
            m.done.update(zip(chunk, results))
        yield m.done.pop(i)
    finally:
      self._maps.pop(m.id, None)

  def _check_stalls(self) -> None:
    """Kills the pool processes whose job is past its time; their jobs' results become
    `stall.result`, and the pool starts again (the maps under way hand their unfinished jobs to
    it)."""
    now, slots, stalled = time.monotonic(), self._slots, []
    for k in range(self.processes):
      pid, map_id, index, since = slots[_SLOT * k:_SLOT * (k + 1)]
      m = self._maps.get(int(map_id))
      index = int(index)
      if (since and m is not None and index < len(m.jobs) and index not in m.done
          and now - since > m.limits[index]):
        stalled.append((int(pid), m, index))
    if not stalled:
      return
    for pid, m, index in stalled:
      job = m.jobs[index]
      m.done[index] = self.stall.result(job)
      self._stalled.append(self.stall.name(job))
      logging.warning("%s: %s took more than %g s in a pool process (pid %d): that process is "
                      "killed, the job's files quarantined, and the rest goes on in new "
                      "processes", self.stall.what, self.stall.name(job), m.limits[index], pid)
      try:
        os.kill(pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
    self._abandon()
    if len(self._stalled) > self.stall.max_jobs:
      self._pool = None
      raise errors.InputError(
          f"{self.stall.what}: {len(self._stalled)} files took longer than their time limit to "
          f"read ({', '.join(self._stalled[:3])}, ...): the storage they are on is not "
          "answering; check it (or raise config.data.decode_timeout_s) and rerun")
    self._start()

  def _abandon(self) -> None:
    """Stops using the executor without waiting for its processes (one may be stuck in the
    kernel, where even SIGKILL waits for its read to return)."""
    for process in list((getattr(self._pool, "_processes", None) or {}).values()):
      try:
        process.kill()
      except (OSError, ValueError):
        pass
    self._pool.shutdown(wait=False, cancel_futures=True)

  def _broken(self) -> None:
    if self._pool is None:   # another map of this pool found it broken first
      return
    logging.warning(self.on_death)
    self._pool.shutdown(wait=False, cancel_futures=True)
    self._pool, self.processes = None, 1

  def __enter__(self) -> Pool:
    return self

  def __exit__(self, *exc) -> None:
    if self._pool is None:
      return
    if self._stalled:
      self._abandon()
    else:
      self._pool.shutdown(wait=True, cancel_futures=True)


# A pool process's slot: its pid, the map and index of the job it runs, since when
# (time.monotonic(), the same clock in every process on Linux; 0: idle).
_SLOT = 4
_POLL_S = 0.25
_slot: tuple | None = None   # in a pool process: (the pool's slots, this process's index)


@dataclasses.dataclass
class _Map:
  id: int
  fn: Callable
  jobs: list
  chunksize: int
  limits: list[float] = dataclasses.field(default_factory=list)
  futures: collections.deque = dataclasses.field(default_factory=collections.deque)
  done: dict = dataclasses.field(default_factory=dict)   # index -> result, not yet yielded

  def harvest(self) -> None:
    """Keeps the results of the chunks that finished; forgets the other futures (void)."""
    for chunk, _, future in self.futures:
      if future.done() and not future.cancelled() and future.exception() is None:
        self.done.update(zip(chunk, future.result()))
    self.futures.clear()


def _claim_slot(slots, claimed) -> None:
  global _slot
  with claimed.get_lock():
    k = claimed.value
    claimed.value += 1
  _slot = (slots, k) if _SLOT * (k + 1) <= len(slots) else None


def _run_chunk(fn: Callable, map_id: int, what: str | None, items: list[tuple[int, Any]]) -> list:
  """In a pool process: `fn` of each (index, job), each noted in this process's slot."""
  out = []
  for index, job in items:
    if _slot is not None:
      slots, k = _slot
      slots[_SLOT * k + 3] = 0.0
      slots[_SLOT * k:_SLOT * k + 3] = [os.getpid(), map_id, index]
      slots[_SLOT * k + 3] = time.monotonic()
    _fault(what, job)
    try:
      out.append(fn(job))
    finally:
      if _slot is not None:
        _slot[0][_SLOT * _slot[1] + 3] = 0.0
  return out


def _fault(what: str | None, job) -> None:
  """Tests' hook: FAULT_ENV holds "<what>:<text>" entries (';' between them); a pool process
  of that pool (its `Stall.what`) whose job's repr holds the text stops itself (SIGSTOP), as a
  read the storage never answers would leave it. Read where the forkserver started."""
  spec = os.environ.get(FAULT_ENV)
  if spec and what:
    for entry in spec.split(";"):
      pool, _, text = entry.partition(":")
      if pool == what and text and text in repr(job):
        os.kill(os.getpid(), signal.SIGSTOP)


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
