"""From the training thread to the checkpoint writer: a save never waits for the writer.

A save hands the writer a copy of the state (on its devices). The writer writes one at a time;
a save that finds the writer busy waits in one slot, and a newer save replaces it there: the
older one is *coalesced* (never written, never committed; the newest is written as soon as the
writer frees). Training never blocks on a write, at any partition length, and at most two copies
of the state are held: the one being written and the newest waiting (CheckFreq's and Gemini's
answer; the lineage paper's 1.1% overhead assumes the writer keeps up). A writer that never
rests still slows training where steps are fast and the state large (its device-to-host copies,
its Python under the GIL: on an H100 the paper's model trained at two-thirds speed beside it), so
the writer rests between writes to work at most `duty` of the time (config.ckpt.writer_duty).

Exactly-once does not depend on which saves were coalesced: every checkpoint carries its
lineage, and steps after the newest committed one are replayed after a failure. What a failure
can lose is bounded: the newest committed state is at most about two writes and a rest old (the
write in progress, its rest, then the newest boundary's write), or one write, one rest and one
partition when partitions are longer; a rest is a write's seconds times (1/duty - 1).

Several processes save collectively (Orbax's barriers meet only if every process writes the
same steps in the same order), so they must agree on what is coalesced. Process 0 decides
(`Leader`) and publishes, in jax.distributed's key-value store (never a device collective):
for its i-th save, which waiting save that one replaced; for its writer's j-th write, which step
it took. The others (`Follower`) apply the same decisions: a follower keeps a save until process
0 says it was replaced or taken, so its waiting saves stay at two or three.
"""

from __future__ import annotations

import abc
import dataclasses
import threading
import time
from typing import Any, Callable

import jax
from jax._src import distributed

NONE = -1             # "no save was replaced"
_READ_TIMEOUT_S = 3600.0   # process 0's saves are the same as ours: a hang is the coordinator's
_POLL_S = 0.5


@dataclasses.dataclass
class Item:
  step: int
  payload: Any
  urgent: bool = False   # written as soon as the writer is free, without its rest


class _Handoff(abc.ABC):
  """What the two sides share: the lock, whether the writer is busy, closing."""

  def __init__(self):
    self._cond = threading.Condition()
    self._busy = self._closed = False
    self._joining = 0   # callers in `join`: the writer's rest is cut short for them
    self._saves = self._takes = self._asks = 0
    self.coalesced: list[int] = []   # steps replaced while waiting (never written)

  @abc.abstractmethod
  def _waiting(self) -> bool:
    """Whether a save waits for the writer (lock held)."""

  @abc.abstractmethod
  def wanted(self) -> bool:
    """Training thread, before an optional save (a boundary's, a k-step one): whether to make
    it at all. Not while the writer writes or rests past the next such save (at the pace of
    these questions): its state copy would only be coalesced, and a copy of a large state is
    not free (a memcpy of 380 MB on a CPU host). Every process gets process 0's answer."""

  def done(self) -> None:
    """Writer thread: the item taken last is written (or failed)."""
    with self._cond:
      self._busy = False
      self._finished()
      self._cond.notify_all()

  def _finished(self) -> None:
    """A write ended (lock held)."""

  def join(self) -> None:
    """Waits until nothing waits and the writer is idle (a resting writer writes at once)."""
    with self._cond:
      self._joining += 1
      self._cond.notify_all()
      try:
        while self._waiting() or self._busy:
          self._cond.wait()
      finally:
        self._joining -= 1

  def close(self) -> None:
    with self._cond:
      self._closed = True
      self._cond.notify_all()


class Leader(_Handoff):
  """The hand-off of a single process, or process 0's (then `publish(kind, index, step)` tells
  the other processes).

  `duty` < 1: after each write of w seconds the writer rests w * (1/duty - 1) seconds before it
  takes the next save (those handed meanwhile coalesce: the newest is written), so that it writes
  at most `duty` of the time; an urgent save (one that must not wait: an epoch's validated
  checkpoint), a `join` (the end of training, a preemption) or `close` cuts the rest short.
  Followers take what process 0 took, so they rest with it.
  """

  def __init__(self, publish: Callable[[str, int, int], None] | None = None, *,
               duty: float = 1.0, clock=time.monotonic):
    super().__init__()
    self._held: Item | None = None
    self._publish = publish
    self.duty, self._clock = min(max(float(duty), 1e-6), 1.0), clock
    self._taken_at = self._rest_until = 0.0
    self._asked_at: float | None = None

  def wanted(self) -> bool:
    with self._cond:
      now = self._clock()
      pace = now - self._asked_at if self._asked_at is not None else 0.0
      self._asked_at = now
      want = self.duty >= 1.0 or (not self._busy and self._rest_until - now <= pace)
      if self._publish is not None:
        self._publish("want", self._asks, int(want))
      self._asks += 1
      return want

  def _finished(self) -> None:
    now = self._clock()
    self._rest_until = now + (now - self._taken_at) * (1.0 / self.duty - 1.0)

  def _resting(self) -> float:
    """Seconds the writer still rests (lock held); 0 when a join or close is waiting or the
    waiting save is urgent."""
    if self._joining or self._closed or (self._held is not None and self._held.urgent):
      return 0.0
    return max(self._rest_until - self._clock(), 0.0)

  def _waiting(self) -> bool:
    return self._held is not None

  def put(self, item: Item) -> None:
    """Training thread: `item` waits for the writer, replacing a waiting one."""
    with self._cond:
      replaced, self._held = self._held, item
      if replaced is not None:
        self.coalesced.append(replaced.step)
      if self._publish is not None:
        self._publish("save", self._saves, NONE if replaced is None else replaced.step)
      self._saves += 1
      self._cond.notify_all()

  def take(self) -> Item | None:
    """Writer thread: the newest waiting save (waits for one); None once closed and empty."""
    with self._cond:
      while (self._held is None and not self._closed) or (self._held is not None
                                                          and self._resting() > 0):
        self._cond.wait(self._resting() if self._held is not None else None)
      if self._held is None:
        return None
      item, self._held = self._held, None
      self._busy = True
      self._taken_at = self._clock()
      if self._publish is not None:
        self._publish("write", self._takes, item.step)
      self._takes += 1
      return item


class Follower(_Handoff):
  """A hand-off that applies process 0's decisions: `read(kind, index, timeout_s)` is the step
  process 0 published (None when it has not within `timeout_s`)."""

  def __init__(self, read: Callable[[str, int, float], int | None]):
    super().__init__()
    self._pending: list[Item] = []   # in save order; each is either replaced or written later
    self._read = read

  def _waiting(self) -> bool:
    return bool(self._pending)

  def wanted(self) -> bool:
    want = self._read("want", self._asks, _READ_TIMEOUT_S)
    if want is None:
      raise RuntimeError(f"checkpoint: process 0 did not reach save question {self._asks} within "
                         f"{_READ_TIMEOUT_S:.0f} s")
    self._asks += 1
    return bool(want)

  def put(self, item: Item) -> None:
    replaced = self._read("save", self._saves, _READ_TIMEOUT_S)
    if replaced is None:
      raise RuntimeError(f"checkpoint: process 0 did not reach save {self._saves} (step "
                         f"{item.step}) within {_READ_TIMEOUT_S:.0f} s")
    self._saves += 1
    with self._cond:
      if replaced != NONE:
        self._pending = [p for p in self._pending if p.step != replaced]
        self.coalesced.append(replaced)
      self._pending.append(item)
      self._cond.notify_all()

  def take(self) -> Item | None:
    while True:
      with self._cond:
        while not self._pending and not self._closed:
          self._cond.wait()
        if not self._pending:
          return None
      # Something waits: process 0's writer takes it (or a newer save replaces it).
      step = self._read("write", self._takes, _POLL_S)
      if step is None:
        continue
      self._takes += 1
      with self._cond:
        while not any(p.step == step for p in self._pending):
          self._cond.wait()   # process 0's save of `step` ran ahead of ours
        i = next(i for i, p in enumerate(self._pending) if p.step == step)
        item, self._pending = self._pending[i], self._pending[i + 1:]
        self._busy = True
        return item


def for_this_process(name: str, duty: float = 1.0):
  """A Leader for a single process or process 0 (writing at most `duty` of the time), else a
  Follower, agreeing through jax.distributed's key-value store under `name` (the same on every
  process)."""
  if jax.process_count() == 1:
    return Leader(duty=duty)
  client = distributed.global_state.client

  def key(kind: str, index: int) -> str:
    return f"medjax/handoff/{name}/{kind}/{index}"

  if jax.process_index() == 0:
    return Leader(publish=lambda kind, index, step: client.key_value_set(key(kind, index),
                                                                         str(step)), duty=duty)

  def read(kind: str, index: int, timeout_s: float) -> int | None:
    try:
      return int(client.blocking_key_value_get(key(kind, index), int(timeout_s * 1000)))
    except Exception:  # pylint: disable=broad-except  (a timeout: DEADLINE_EXCEEDED)
      return None
  return Follower(read)
