"""From the training thread to the checkpoint writer: a save never waits for the writer.

A save hands the writer a copy of the state (on its devices). The writer writes one at a time;
a save that finds the writer busy waits in one slot, and a newer save replaces it there: the
older one is *coalesced* (never written, never committed; the newest is written as soon as the
writer frees). Training never blocks on a write, at any partition length, and at most two copies
of the state are held: the one being written and the newest waiting (CheckFreq's and Gemini's
answer; the lineage paper's 1.1% overhead assumes the writer keeps up).

Exactly-once does not depend on which saves were coalesced: every checkpoint carries its
lineage, and steps after the newest committed one are replayed after a failure. What a failure
can lose is bounded: the newest committed state is at most about two writes old (the write in
progress, then the newest boundary's), or one write and one partition when partitions are
longer than writes.

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


class _Handoff(abc.ABC):
  """What the two sides share: the lock, whether the writer is busy, closing."""

  def __init__(self):
    self._cond = threading.Condition()
    self._busy = self._closed = False
    self._saves = self._takes = 0
    self.coalesced: list[int] = []   # steps replaced while waiting (never written)

  @abc.abstractmethod
  def _waiting(self) -> bool:
    """Whether a save waits for the writer (lock held)."""

  def done(self) -> None:
    """Writer thread: the item taken last is written (or failed)."""
    with self._cond:
      self._busy = False
      self._cond.notify_all()

  def join(self) -> None:
    """Waits until nothing waits and the writer is idle."""
    with self._cond:
      while self._waiting() or self._busy:
        self._cond.wait()

  def close(self) -> None:
    with self._cond:
      self._closed = True
      self._cond.notify_all()


class Leader(_Handoff):
  """The hand-off of a single process, or process 0's (then `publish(kind, index, step)` tells
  the other processes)."""

  def __init__(self, publish: Callable[[str, int, int], None] | None = None):
    super().__init__()
    self._held: Item | None = None
    self._publish = publish

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
      while self._held is None and not self._closed:
        self._cond.wait()
      if self._held is None:
        return None
      item, self._held = self._held, None
      self._busy = True
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


def for_this_process(name: str):
  """A Leader for a single process or process 0, else a Follower, agreeing through
  jax.distributed's key-value store under `name` (the same on every process)."""
  if jax.process_count() == 1:
    return Leader()
  client = distributed.global_state.client

  def key(kind: str, index: int) -> str:
    return f"medjax/handoff/{name}/{kind}/{index}"

  if jax.process_index() == 0:
    return Leader(publish=lambda kind, index, step: client.key_value_set(key(kind, index),
                                                                         str(step)))

  def read(kind: str, index: int, timeout_s: float) -> int | None:
    try:
      return int(client.blocking_key_value_get(key(kind, index), int(timeout_s * 1000)))
    except Exception:  # pylint: disable=broad-except  (a timeout: DEADLINE_EXCEEDED)
      return None
  return Follower(read)
