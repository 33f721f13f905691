"""Decoding a cache fill on all of the host's cores.

Decoding a record is mostly Python (pydicom's parsing, the pixel arithmetic, the letterbox), so
threads would take turns on one core: a fill decodes in a pool of processes instead, one per
core by default (config.data.decode_processes), each handed the record's file names and the
decoder's budgets, and returning its images. The cache itself (the index, the writes, the
counters, the quarantine) stays in the calling process. Compressed files are still decoded in
the decoder's own isolated children (`medjax.data.dicom.decoder`), now from every pool process.

Small fills decode in-process: starting the pool (a forkserver that imports the decoding code
once, `medjax.data.pools`, then a fork per process) costs about a second.
"""

from __future__ import annotations

import concurrent.futures
import logging
from concurrent.futures.process import BrokenProcessPool
from typing import Callable

import numpy as np

from medjax.data import pools
from medjax.data import records

MIN_RECORDS = 256   # fewer records than this decode in the calling process


def decode_stored(job: tuple) -> tuple[dict[str, np.ndarray], list[dict], int, float]:
  """`records.decode_images_timed`, images in the dtype the cache stores (float16): a fill's
  process sends half the bytes back, and the writing process casts nothing."""
  images, rejected, nbytes, seconds = records.decode_images_timed(job)
  images["images"] = images["images"].astype(records.IMAGE_DTYPE)
  return images, rejected, nbytes, seconds


def processes_for(configured: int) -> int:
  """config.data.decode_processes: 0 means one per core this process may use (`pools.cores`)."""
  return int(configured) if configured and configured > 0 else pools.cores()


class DecodePool:
  """`decode(jobs)`: `records.decode_images_timed` of each job, in order; in a process pool when
  `processes` > 1 and the fill has at least MIN_RECORDS records, else here."""

  def __init__(self, processes: int, records_to_decode: int):
    self.processes = processes if records_to_decode >= MIN_RECORDS else 1
    self._pool = None
    if self.processes > 1:
      self._pool = concurrent.futures.ProcessPoolExecutor(self.processes,
                                                          mp_context=pools.context())

  def decode(self, jobs: list[tuple]) -> list[tuple]:
    return self.start(jobs)()

  def start(self, jobs: list[tuple], fn: Callable[[tuple], tuple] = records.decode_images_timed
            ) -> Callable[[], list[tuple]]:
    """Starts decoding `jobs` with `fn` (`records.decode_images_timed` or `decode_stored`; in
    the pool: they are under way when this returns); the returned function waits for and
    returns their results, in order.

    A pool process that dies (the kernel's OOM killer, a signal) breaks the pool: the fill goes
    on in this process from the chunk that was lost, with a warning, instead of failing.
    """
    here = lambda: [fn(job) for job in jobs]
    if self._pool is None:
      return here
    chunk = max(1, len(jobs) // (4 * self.processes))
    try:
      results = self._pool.map(fn, jobs, chunksize=chunk)
    except BrokenProcessPool:
      self._broken()
      return here

    def collect() -> list[tuple]:
      try:
        return list(results)
      except BrokenProcessPool:
        self._broken()
        return here()
    return collect

  def _broken(self) -> None:
    logging.warning("cache fill: a decoding process died; decoding the rest in this process "
                    "(one core)")
    self._pool.shutdown(wait=False, cancel_futures=True)
    self._pool, self.processes = None, 1

  def __enter__(self) -> DecodePool:
    return self

  def __exit__(self, *exc) -> None:
    if self._pool is not None:
      self._pool.shutdown(wait=True, cancel_futures=True)
