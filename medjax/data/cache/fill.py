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
from medjax.data.dicom import decoder as decoder_lib

MIN_RECORDS = 256   # fewer records than this decode in the calling process


def decode_stored(job: tuple) -> tuple[dict[str, np.ndarray], list[dict], int, float]:
  """`records.decode_images_timed`, images in the dtype the cache stores (float16): a fill's
  process sends half the bytes back, and the writing process casts nothing."""
  images, rejected, nbytes, seconds = records.decode_images_timed(job)
  images["images"] = images["images"].astype(records.IMAGE_DTYPE)
  return images, rejected, nbytes, seconds


def time_limit(job: tuple) -> float:
  """How long a record's job may take in a decoding process: its decoder's per-file timeout
  (config.data.decode_timeout_s) for each file, and one more."""
  image_files, _, _, decoder = job
  return (decoder or decoder_lib.default()).timeout_s * (len(image_files) + 1)


def stalled(job: tuple) -> tuple[dict[str, np.ndarray], list[dict], int, float]:
  """A job's result in place of one that ran past `time_limit`: no images, each of its files
  quarantined."""
  image_files, _, shapes, _ = job
  s, m = shapes.image_size, shapes.max_images
  reason = (f"decoding its record's {len(image_files)} file(s) took longer than "
            f"{time_limit(job):g} s (config.data.decode_timeout_s a file, and one more): the "
            "storage did not answer")
  return ({"images": np.zeros((m, s, s), records.IMAGE_DTYPE), "image_mask": np.zeros(m, bool)},
          [{"path": rel, "stage": "decode", "reason": reason} for rel in image_files],
          0, time_limit(job))


def processes_for(configured: int) -> int:
  """config.data.decode_processes: 0 means one per core this process may use (`pools.cores`)."""
  return int(configured) if configured and configured > 0 else pools.cores()


class DecodePool(pools.Pool):
  """`decode(jobs)`: `records.decode_images_timed` of each job, in order; in a process pool when
  `processes` > 1 and the fill has at least MIN_RECORDS records, else here. A decoding process
  that dies costs the pool, not the fill; one stuck on a record past its time (its decoder's
  timeout_s a file, and one more: a read the storage never answers) is killed and the record's
  files quarantined (`pools.Pool`, `stalled`)."""

  def __init__(self, processes: int, records_to_decode: int):
    super().__init__(processes if records_to_decode >= MIN_RECORDS else 1,
                     "cache fill: a decoding process died; decoding the rest in this process "
                     "(one core)",
                     stall=pools.Stall(seconds=time_limit, result=stalled,
                                       name=lambda job: job[0][0] if job[0] else "a record",
                                       what="cache fill"))

  def decode(self, jobs: list[tuple]) -> list[tuple]:
    return self.start(jobs)()

  def start(self, jobs: list[tuple], fn: Callable[[tuple], tuple] = records.decode_images_timed
            ) -> Callable[[], list[tuple]]:
    """Starts decoding `jobs` with `fn` (`records.decode_images_timed` or `decode_stored`; in
    the pool: they are under way when this returns); the returned function waits for and
    returns their results, in order."""
    results = self.map(fn, jobs, chunksize=max(1, len(jobs) // (4 * self.processes)))
    return lambda: list(results)
