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


class DecodePool(pools.Pool):
  """`decode(jobs)`: `records.decode_images_timed` of each job, in order; in a process pool when
  `processes` > 1 and the fill has at least MIN_RECORDS records, else here. A decoding process
  that dies costs the pool, not the fill (`pools.Pool`)."""

  def __init__(self, processes: int, records_to_decode: int):
    super().__init__(processes if records_to_decode >= MIN_RECORDS else 1,
                     "cache fill: a decoding process died; decoding the rest in this process "
                     "(one core)")

  def decode(self, jobs: list[tuple]) -> list[tuple]:
    return self.start(jobs)()

  def start(self, jobs: list[tuple], fn: Callable[[tuple], tuple] = records.decode_images_timed
            ) -> Callable[[], list[tuple]]:
    """Starts decoding `jobs` with `fn` (`records.decode_images_timed` or `decode_stored`; in
    the pool: they are under way when this returns); the returned function waits for and
    returns their results, in order."""
    results = self.map(fn, jobs, chunksize=max(1, len(jobs) // (4 * self.processes)))
    return lambda: list(results)
