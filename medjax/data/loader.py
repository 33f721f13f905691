"""Batches: plan steps -> this process's rows -> cached records -> global jax arrays.

A plan step is an int32 [W, b] array of manifest rows (host-major, -1 = padding). The global batch
is its W*b rows in that order; process k of a host with n processes feeds rows [k*b/n, (k+1)*b/n)
of its host's slice, so the global batch is the same whatever the process count.

Reading overlaps the training step in one of two ways (`batches`): on a Grain prefetch thread
(accelerators: the host's cores are free while the device computes), or, when XLA computes on
the same CPU cores, on the training thread between dispatching a step and waiting for it
(`Ahead`), since a second busy thread competes with XLA for those cores. On 2 cores a quickstart
step fed this way takes 1.02-1.05x the time of one fed from batches already on device
(experiments/bench_train.py).
"""

from __future__ import annotations

import grain
import jax
import numpy as np

from medjax import errors
from medjax.data import pools
from medjax.data import records


class BatchReader:
  """Reads this process's share of plan steps from its host's cache.

  Args:
    cache: the host's `cache.Cache`.
    manifest: the ingest manifest.
    tables: the ingested tables (normalisation statistics).
    host_index: this host's column in plan steps.
    local_index: this process's index among its host's processes.
    local_count: how many processes its host runs.
    class_weight_K: per-class loss weight (ones for an unweighted loss).
    complete_only: weight 0 for records missing any modality (the 'drop' ablation).
  """

  def __init__(self, cache, manifest, tables, *, host_index: int = 0, local_index: int = 0,
               local_count: int = 1, class_weight_K: np.ndarray | None = None,
               complete_only: bool = False):
    self.cache, self.manifest, self.tables = cache, manifest, tables
    self.host_index, self.local_index, self.local_count = host_index, local_index, local_count
    k = max(len(manifest.class_names), 1)
    self.class_weight = (np.ones(k, np.float32) if class_weight_K is None
                         else np.asarray(class_weight_K, np.float32))
    self.complete_only = complete_only

  def local_rows(self, step_Wxb: np.ndarray) -> np.ndarray:
    b = step_Wxb.shape[1]
    if b % self.local_count:
      raise errors.InputError(
          f"host batch {b} does not split over {self.local_count} processes; make "
          "config.data.batch_size a multiple of hosts x processes per host")
    per = b // self.local_count
    return step_Wxb[self.host_index, self.local_index * per:(self.local_index + 1) * per]

  def read(self, rows: np.ndarray) -> dict[str, np.ndarray]:
    batch = records.normalize(self.cache.read(rows), self.tables)
    valid = rows >= 0
    safe = np.where(valid, rows, 0)
    labels = np.where(valid, self.manifest.labels[safe], 0).astype(np.int32)
    weight = valid * self.class_weight[labels]
    if self.complete_only:
      weight = weight * self.manifest.modality_mask[safe].all(axis=1)
    return _labelled(batch, labels, weight.astype(np.float32), rows.astype(np.int32))


def _labelled(batch: dict, label, weight, row) -> dict[str, np.ndarray]:
  """A read batch's records with what the step and the ledger need beside them."""
  batch.update(label=label, weight=weight, row=row)
  return batch


def padding_batch(shapes: records.Shapes, tables, sharding, global_batch: int) -> dict:
  """A global batch of padding records (weight 0) of the real batches' types, shapes and
  sharding (`to_global` of what `BatchReader.read` returns), from the data's shapes alone: a
  step compiled for it before the cache holds a record serves the first real batch as is."""
  none = np.full(global_batch // jax.process_count(), -1, np.int32)
  local = _labelled(records.normalize(records.empty(shapes, len(none)), tables), none.clip(0),
                    np.zeros(len(none), np.float32), none)
  return to_global(local, sharding, global_batch)


def read_threads() -> int:
  """Prefetch threads for the 'thread' path: a quarter of the host's cores, 1 to 4.

  A batch of 512 paper-size records is ~17 MB (float16 images) gathered, normalised and copied
  to the device; numpy and the transfer release the GIL, so a few threads read several steps at
  once (one thread read a 512-slot batch in 6.7 ms on a 16-core H100 host when it held only ~90 real
  records: about the step's time at full batches). More would take cores from the host's other
  work (decoding children, the saver, the monitor).
  """
  return max(1, min(4, pools.cores() // 4))


def prefetched(reader: BatchReader, steps_SxWxb: np.ndarray, *, start: int = 0,
               buffer: int = 4, sharding=None, global_batch: int = 0,
               threads: int | None = None):
  """Yields (step index, host-local batch, global batch) for steps[start:], read ahead.

  Reading, and with a `sharding` also assembling the global jax arrays (`to_global`), runs on
  prefetch threads (`read_threads()` by default; the order of the steps is kept), so the
  training loop's thread only dispatches steps. Without a sharding the global batch is None.
  """
  def load(s):
    local = reader.read(reader.local_rows(steps_SxWxb[s]))
    return s, local, (to_global(local, sharding, global_batch) if sharding is not None else None)

  indices = list(range(start, len(steps_SxWxb)))
  dataset = grain.MapDataset.source(indices).map(load)
  threads = threads or read_threads()
  return iter(dataset.to_iter_dataset(grain.ReadOptions(
      num_threads=threads, prefetch_buffer_size=max(buffer, threads + 1))))


class Ahead:
  """Yields (step index, host-local batch, global batch); `read_ahead()` prepares the next one.

  Call `read_ahead()` right after dispatching a step (JAX dispatch is asynchronous) and before
  waiting for its results, so that the next batch is read while the step runs.
  """

  def __init__(self, reader: BatchReader, steps_SxWxb: np.ndarray, *, start: int, sharding,
               global_batch: int):
    self.reader, self.steps, self.sharding, self.global_batch = (reader, steps_SxWxb, sharding,
                                                                 global_batch)
    self._next_s, self._ready = start, None

  def _load(self, s: int):
    local = self.reader.read(self.reader.local_rows(self.steps[s]))
    return s, local, to_global(local, self.sharding, self.global_batch)

  def read_ahead(self) -> None:
    if self._ready is None and self._next_s < len(self.steps):
      self._ready = self._load(self._next_s)

  def __iter__(self):
    return self

  def __next__(self):
    if self._next_s >= len(self.steps):
      raise StopIteration
    item, self._ready = self._ready or self._load(self._next_s), None
    self._next_s += 1
    return item


class _Threaded:
  """`prefetched` with the same interface as `Ahead`: `read_ahead` starts the prefetch threads'
  reading (Grain's iterator reads nothing until asked for its first batch, so a reader made
  ahead of its epoch would read that batch only once the device waited for it)."""

  def __init__(self, iterator):
    self._iterator = iterator
    self._started = False

  def read_ahead(self) -> None:
    if not self._started:
      self._iterator.start_prefetch()
      self._started = True

  def __iter__(self):
    return self._iterator


def batches(reader: BatchReader, steps_SxWxb: np.ndarray, *, start: int, sharding,
          global_batch: int, how: str = "auto"):
  """Training batches for steps[start:], read ahead by `how`.

  `how`: 'thread' (a Grain prefetch thread), 'inline' (`Ahead`), or 'auto' (inline when XLA runs
  on the CPU, else thread). Either way the caller calls `read_ahead()` after dispatching a step.
  """
  if how == "auto":
    how = "inline" if jax.default_backend() == "cpu" else "thread"
  if how == "inline":
    return Ahead(reader, steps_SxWxb, start=start, sharding=sharding, global_batch=global_batch)
  if how != "thread":
    raise errors.InputError(f"config.data.prefetch={how!r}; use 'auto', 'inline' or 'thread'")
  return _Threaded(prefetched(reader, steps_SxWxb, start=start, sharding=sharding,
                              global_batch=global_batch))


def to_global(local: dict[str, np.ndarray], sharding, global_batch: int) -> dict:
  """The global batch of jax arrays from every process's local share (no 'row': it stays local).

  On one process with XLA on the CPU the host arrays themselves are returned: the jitted step
  places them by its input sharding when it is called, in C++ (0.05 ms for a quickstart batch,
  against 0.3 ms for a `device_put` of its fields), so reading ahead takes less of the cores the
  step runs on. The arrays are fresh per batch and never written again.
  """
  local = {k: v for k, v in local.items() if k != "row"}
  if jax.process_count() == 1 and jax.default_backend() == "cpu":
    return local
  return jax.make_array_from_process_local_data(
      sharding, local, {k: (global_batch, *v.shape[1:]) for k, v in local.items()})
