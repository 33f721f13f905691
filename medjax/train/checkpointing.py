"""The trainer's checkpoint concerns: when to save, the commit path, preemption, restore.

- `SavePolicy` says when to save (config.ckpt): a pure function of the position in the plan.
- `Saver` saves (never the same step twice), hands what Orbax finalized to the context's commit
  (the coordinator's, or the single process's own), and on preemption saves, waits and commits.
- `Preemption` says when every process has agreed to stop for a SIGTERM.
- `restore_or_start` gives the newest committed state and its lineage, or a fresh start.
"""

from __future__ import annotations

import logging
import signal
import threading

import jax
import numpy as np

from medjax import checkpoint as checkpoint_lib
from medjax import lineage as lineage_lib


class Preempted(Exception):
  """SIGTERM: a checkpoint was saved and committed; the process should exit."""


class SavePolicy:
  """When to checkpoint, from config.ckpt.

  Args:
    ckpt_config: config.ckpt (`partition_boundaries`, `every_steps`).
    epochs: the run's epochs (the end of training is always saved).
  """

  def __init__(self, ckpt_config, *, epochs: int):
    self.every_steps = int(ckpt_config.every_steps)
    self.partition_boundaries = bool(ckpt_config.partition_boundaries)
    self.epochs = epochs

  def after_step(self, global_step: int, offset: int, partition_steps: int) -> bool:
    """Inside a partition: every `every_steps` global steps (its last step is a boundary)."""
    k = self.every_steps
    return bool(k) and global_step % k == 0 and offset < partition_steps

  def at_boundary(self, epoch_after: int) -> bool:
    """At a partition boundary, with `epoch_after` the epoch the next step belongs to."""
    return self.partition_boundaries or epoch_after >= self.epochs


class Saver:
  """Saves checkpoints and commits the ones Orbax finalized on every process.

  Args:
    ckpt: the `checkpoint.Checkpointer`.
    ctx: the fault-tolerance context (`medjax.fault.context`): its `commit` writes the lineage
      record (and applies retention), its phase says 'checkpointing' while a save blocks.
    is_chief: only process 0 commits (every process saves its shards).
    last_saved: the step already on disk (a restored checkpoint's), never saved again.
    before_save: called first (e.g. the metrics flush that checks the loss is finite, so that no
      non-finite state is saved).
  """

  def __init__(self, ckpt: checkpoint_lib.Checkpointer, ctx, *, is_chief: bool,
               last_saved: int | None, before_save=lambda: None):
    self.ckpt, self.ctx, self.is_chief = ckpt, ctx, is_chief
    self.last_saved = last_saved
    self._before_save = before_save

  def save(self, state, lineage: lineage_lib.Lineage) -> None:
    if lineage.global_step == self.last_saved:
      return  # e.g. a partition boundary reached right after restoring there
    self._before_save()
    self.last_saved = lineage.global_step
    phase = self.ctx.phase
    self.ctx.set_phase("checkpointing")
    self.ckpt.save(state, lineage)
    self.ctx.blocked_s = self.ckpt.blocked_s
    self.ctx.set_phase(phase)

  def commit_finalized(self) -> None:
    for lineage in self.ckpt.finalized():
      if self.is_chief:
        self.ctx.commit(lineage)

  def finish(self) -> None:
    """Waits for every save, commits them, and for the commits to reach the coordinator."""
    self.ckpt.wait()
    self.commit_finalized()
    self.ctx.flush()

  def preempt(self, state, lineage: lineage_lib.Lineage) -> None:
    """Saves and commits `lineage`'s state, then raises Preempted."""
    self.save(state, lineage)
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
      return checkpoint_lib.Checkpointer.reached_preemption(global_step)
    return self._flag.is_set()


def restore_or_start(ckpt: checkpoint_lib.Checkpointer, store: lineage_lib.LineageStore,
                     abstract_state, *, placement: str, hosts: tuple[str, ...], seed: int,
                     num_records: int, is_chief: bool, barrier) -> tuple:
  """(state or None, lineage, restored step or None): where training goes on from.

  Checkpoints newer than the newest committed step are work a failure discarded: the chief
  deletes them first. The newest committed, readable checkpoint whose two lineage copies agree
  is restored; when it was planned under another placement (the host set changed), the rest of
  its epoch is planned again under this one. Without one, training starts at epoch 0 (state
  None: the caller keeps its fresh state).
  """
  if is_chief:
    dropped = checkpoint_lib.discard_uncommitted(ckpt.directory, store.committed_steps())
    if dropped:
      logging.info("checkpoints %s were never committed; deleted", dropped)
  barrier("uncommitted checkpoints discarded")
  # The manager listed the steps when it was opened; those just deleted would otherwise make the
  # save of the same step fail (StepAlreadyExistsError).
  ckpt.reload()
  restored = checkpoint_lib.restore_committed(ckpt.directory, store, abstract_state, ckpt)
  if restored is None:
    return None, lineage_lib.Lineage.start(
        epoch=0, global_step=0, seed=seed, placement=placement, hosts=hosts,
        base_N=np.zeros(num_records, bool)), None
  state, lineage, step = restored
  if lineage.segment.placement != placement:
    processed_N = lineage.processed_N(num_records)
    logging.info("resume: hosts changed; re-planning the rest of epoch %d (%d records done)",
                 lineage.epoch, int(processed_N.sum()))
    lineage = lineage_lib.Lineage.start(epoch=lineage.epoch, global_step=lineage.global_step,
                                        seed=seed, placement=placement, hosts=hosts,
                                        base_N=processed_N)
  return state, lineage, step
