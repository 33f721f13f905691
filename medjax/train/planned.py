"""The planned steps, epoch by epoch and partition by partition, each batch read ahead: what
the training loop (`medjax.train.loop`) iterates over."""

from __future__ import annotations

import concurrent.futures
import dataclasses
from typing import Any, Callable

import numpy as np

from medjax import lineage as lineage_lib
from medjax.train import prepare as prepare_lib

Prepared = prepare_lib.Prepared


@dataclasses.dataclass(frozen=True)
class Step:
  """One planned step, or an empty partition's end (`batch` None)."""
  epoch: int
  partition: int
  num_partitions: int        # of its epoch's plan
  partition_steps: int       # steps in its partition
  rows: np.ndarray           # the global step's manifest rows, [W, host batch] (-1: padding)
  local: dict | None         # this process's share, as read (its 'row' field: its rows)
  batch: Any                 # the global batch the step trains on
  ends_partition: bool       # the partition's last step: a boundary follows


NEXT_EPOCH_AHEAD = 4   # steps before an epoch's end at which the next one's reading starts
# Plans the next epoch while this one trains (`PlannedSteps._plan_ahead`); one thread for the
# process, idle but for a plan an epoch.
_PLANNER = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="medjax-planner")


class PlannedSteps:
  """The planned steps from the cursor's position, epoch by epoch, each batch read ahead.

  Each epoch is planned when it starts (`HostData.plan` of the cursor's epoch and segment), or,
  on the planning thread while the epoch before it trains, as a new segment (nothing processed,
  so its plan is known), and its reading starts `NEXT_EPOCH_AHEAD` steps before the epoch before
  it ends; its partitions' batches come from one `prepare.data_batches` reader, and `read_ahead`
  reads the next one while a step runs (and the next epoch's first, once it is planned).
  `on_partition(partition, global_step, epoch)` is called as a partition starts. A partition the
  plan left empty still ends (one `Step` without a batch).
  """

  def __init__(self, prepared: Prepared, cursor: lineage_lib.Cursor, epochs: int,
               on_partition: Callable[[int, int, int], None], *, plan_ahead: bool = True):
    self.p, self.cursor, self.epochs, self.on_partition = prepared, cursor, epochs, on_partition
    self.plan_ahead = plan_ahead   # False: each epoch planned on the caller's thread (measuring)
    self._batches = self._next = None
    self._following: tuple[int, concurrent.futures.Future] | None = None

  def __iter__(self):
    p, cursor = self.p, self.cursor
    while cursor.epoch < self.epochs and not cursor.stopped:
      reader = None
      if self._next is not None and cursor.partition == 0 and cursor.offset == 0 and not (
          cursor.base_N is not None and cursor.base_N.any()):
        plan, reader = self._next   # planned and started NEXT_EPOCH_AHEAD steps early
      else:
        plan = p.data.plan(cursor.epoch, cursor.base_N)
      self._next = None
      if self.plan_ahead and cursor.epoch + 1 < self.epochs:
        self._plan_ahead(cursor.epoch + 1)
      if cursor.partition >= plan.num_partitions > 0:
        # A lineage at a finished segment's end (before 2026-11-28, 'local' mode saved a round's
        # deferred save there): its last partition's end comes again, so that the segment's
        # end (a catch-up, the next epoch) follows instead of a plan with nothing in it, forever.
        last = plan.num_partitions - 1
        cursor.partition, cursor.offset = last, len(plan.steps[last])
      starts = _starts(plan, cursor.partition, cursor.offset)
      self._batches = reader if reader is not None else self._reader(plan, starts)
      batches = iter(self._batches)
      left = total = sum(max(len(plan.steps[part]) - start, 0) for part, start in starts)
      for part, start in starts:
        if cursor.stopped:
          return
        self.on_partition(part, cursor.global_step, cursor.epoch)
        steps = plan.steps[part]
        at = dict(epoch=cursor.epoch, partition=part, num_partitions=plan.num_partitions,
                  partition_steps=len(steps))
        if start >= len(steps):
          yield Step(**at, rows=steps[:0], local=None, batch=None, ends_partition=True)
        for s in range(start, len(steps)):
          _, local, batch = next(batches)
          left -= 1
          if left == min(NEXT_EPOCH_AHEAD, total - 1) and cursor.epoch + 1 < self.epochs:
            # NEXT_EPOCH_AHEAD steps before the epoch's end: the next epoch (a new segment,
            # nothing processed yet) is planned and its reading starts, so that its first batch
            # is ready when the epoch's end is done (a batch took longer to read than a step).
            following = self._planned(cursor.epoch + 1)
            self._next = (following, self._reader(following, _starts(following, 0, 0)))
          yield Step(**at, rows=steps[s], local=local, batch=batch,
                     ends_partition=s == len(steps) - 1)

  def _plan_ahead(self, epoch: int) -> None:
    """Starts planning `epoch` as a new segment (nothing processed: its plan is known) on the
    planning thread, unless it is under way: at the paper's 53,420 records a plan takes ~20 ms
    of numpy, which the training thread would spend while the device ran out of queued steps."""
    if self._following is None or self._following[0] != epoch:
      self._following = (epoch, _PLANNER.submit(self.p.data.plan, epoch, None))

  def _planned(self, epoch: int):
    """`epoch`'s plan as a new segment: the planning thread's (waited for), or made here."""
    following, self._following = self._following, None
    if following is not None and following[0] == epoch:
      return following[1].result()
    return self.p.data.plan(epoch, None)

  def _reader(self, plan, starts: list[tuple[int, int]]):
    """One reader over the plan's partitions from `starts` on, so that reading ahead crosses
    their boundaries (a reader per partition started cold at each: its first batch read while
    the device waited, at ~5 steps a partition on a GPU at the paper's size)."""
    chunks = [plan.steps[part][start:] for part, start in starts]
    steps = np.concatenate(chunks) if chunks else np.zeros((0, 0, 0), np.int32)
    return prepare_lib.data_batches(self.p.config, self.p.reader, steps, 0, self.p.batch_sharding)

  def read_ahead(self) -> None:
    self._batches.read_ahead()
    if self._next is not None:
      self._next[1].read_ahead()


def _starts(plan, partition: int, offset: int) -> list[tuple[int, int]]:
  """(partition, first step) of each of the plan's partitions from (`partition`, `offset`) on."""
  return [(part, offset if part == partition else 0)
          for part in range(partition, plan.num_partitions)]
