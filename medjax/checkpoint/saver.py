"""Saving: checkpoints handed to the saver, committed once finalized; preemption (SIGTERM).

- `Saver` saves (never the same step twice), hands what Orbax finalized to the context's commit
  (the coordinator's, or the single process's own), and on preemption saves, waits and commits.
- `Preemption` says when every process has agreed to stop for a SIGTERM.
"""

from __future__ import annotations

import signal
import threading

import jax

from medjax import lineage as lineage_lib
from medjax.checkpoint import checkpointer


class Preempted(Exception):
  """SIGTERM: a checkpoint was saved and committed; the process should exit."""


class Saver:
  """Saves checkpoints and commits the ones Orbax finalized on every process.

  Args:
    ckpt: the `checkpoint.Checkpointer`.
    ctx: the fault-tolerance context (`medjax.runtime.context`): its `commit` writes the lineage
      record (and applies retention), its phase says 'checkpointing' while a save blocks.
    is_chief: only process 0 commits (every process saves its shards).
    last_saved: the step already on disk (a restored checkpoint's), never saved again.
    before_save: called first (e.g. the metrics check that every loss is finite, so that no
      non-finite state is saved).
    after_save: called once the save is handed to the saver (e.g. writing those metrics, which
      would otherwise compete with the save's packing for the GIL).
    guard: returns a check that the checkpointer runs where it writes (`Checkpointer.save`'s
      guard): the training thread then does not wait for the device at a save (the
      `Reporter.finite_guard`, in place of `before_save`'s check). A preemption's save still
      calls `before_save` (it must be committed before the process exits).
  """

  def __init__(self, ckpt: checkpointer.Checkpointer, ctx, *, is_chief: bool,
               last_saved: int | None, before_save=lambda: None, after_save=lambda: None,
               guard=None):
    self.ckpt, self.ctx, self.is_chief = ckpt, ctx, is_chief
    self.last_saved = last_saved
    self._before_save, self._after_save, self._guard = before_save, after_save, guard
    self.saved: list[int] = []       # steps handed to the checkpointer
    self.committed: list[int] = []   # ... of those, committed (process 0's count)
    self.rested: list[int] = []      # optional saves not made: the writer was busy or resting
    # A save is committed as soon as it is finalized, from the saver thread. Committed from the
    # training thread between steps, it waited while that thread was blocked on the device (the
    # steps run ahead of it, then it waits for them at the next partition boundary), often until
    # the next save: a failure in between lost two partitions where it should lose one.
    ckpt.on_finalized = self._commit if is_chief else (lambda lineage, write_s: None)

  def save(self, state, lineage: lineage_lib.Lineage, *, check_now: bool = False,
           optional: bool = False) -> bool:
    """Hands `lineage`'s state to the checkpointer; an `optional` one (a boundary's or k-step
    save that neither ends training nor carries an epoch's validation) only when the writer
    wants it (`Checkpointer.wanted`), else its step is listed in `rested`; any other is written
    without the writer's rest (`handoff.Item.urgent`). Whether it saved."""
    if lineage.global_step == self.last_saved:
      return False  # e.g. a partition boundary reached right after restoring there
    if optional and not self.ckpt.wanted():
      self.rested.append(lineage.global_step)
      return False
    guard = None if check_now or self._guard is None else self._guard()
    if guard is None:
      self._before_save()
    self.last_saved = lineage.global_step
    self.saved.append(lineage.global_step)
    phase = self.ctx.phase
    self.ctx.set_phase("checkpointing")
    try:
      self.ckpt.save(state, lineage, guard=guard, urgent=not optional)
    finally:
      self._after_save()
    self.ctx.blocked_s = self.ckpt.blocked_s
    self.ctx.set_phase(phase)
    return True

  def _commit(self, lineage: lineage_lib.Lineage, write_s: float | None) -> None:
    self.ctx.commit(lineage, write_s=write_s)
    self.committed.append(lineage.global_step)

  def commit_finalized(self) -> None:
    """Passes the write counters on to the context (for heartbeats); commits what a
    Checkpointer without `on_finalized` queued."""
    for lineage in self.ckpt.finalized():
      if self.is_chief:
        self._commit(lineage, None)
    self.ctx.writes, self.ctx.write_s = self.ckpt.writes, self.ckpt.write_s

  def finish(self) -> None:
    """Waits for every save, commits them, and for the commits to reach the coordinator."""
    self.ckpt.wait()
    self.commit_finalized()
    self.ctx.flush()

  def summary(self) -> dict:
    """summary.json's train.checkpoints: the steps saved, committed, coalesced (replaced by a
    newer save while the writer was busy: never written), refused (their guard failed) and
    rested (due, not made: the writer was busy or resting, `writer_duty`), the writes and their
    seconds, and the seconds training waited in save calls."""
    ckpt = self.ckpt
    return {"saved": list(self.saved), "committed": sorted(self.committed),
            "rested": list(self.rested),
            "coalesced": ckpt.coalesced, "refused": list(ckpt.refused), "writes": ckpt.writes,
            "write_s": round(ckpt.write_s, 3), "blocked_s": round(ckpt.blocked_s, 3)}

  def preempt(self, state, lineage: lineage_lib.Lineage) -> None:
    """Saves and commits `lineage`'s state, then raises Preempted."""
    self.save(state, lineage, check_now=True)
    self.finish()
    raise Preempted(f"SIGTERM: checkpoint {lineage.global_step} saved and committed")


class Preemption:
  """Whether to stop for a SIGTERM at a step: on the same step in every process.

  Multi-process runs use jax.distributed's preemption sync point (every process agrees on the
  step, a few steps after the signal); a single process sets a flag on SIGTERM and stops at the
  next step boundary. Ask at every step, from one thread, with increasing steps.
  """

  def __init__(self):
    self._distributed = jax.distributed.is_initialized()
    self._flag = threading.Event()
    if not self._distributed and threading.current_thread() is threading.main_thread():
      signal.signal(signal.SIGTERM, lambda *_: self._flag.set())

  def reached(self, global_step: int) -> bool:
    if self._distributed:
      return checkpointer.Checkpointer.reached_preemption(global_step)
    return self._flag.is_set()
