"""The trainer's checkpoint concerns: when to save, the commit path, preemption, restore.

- `SavePolicy` says when to save (config.ckpt.strategy): from the position in the plan (or, for
  the time-based strategy, the clock).
- `Saver` saves (never the same step twice), hands what Orbax finalized to the context's commit
  (the coordinator's, or the single process's own), and on preemption saves, waits and commits.
- `Preemption` says when every process has agreed to stop for a SIGTERM.
- `restore_or_start` gives the newest committed state and its lineage, or a fresh start.
"""

from __future__ import annotations

import logging
import signal
import threading
import time

import jax
import numpy as np
from jax.experimental import multihost_utils

from medjax import checkpoint as checkpoint_lib
from medjax import errors
from medjax import lineage as lineage_lib


STRATEGIES = ("lineage", "epoch", "time", "none")   # config.ckpt.strategy


class Preempted(Exception):
  """SIGTERM: a checkpoint was saved and committed; the process should exit."""


class SavePolicy:
  """When to checkpoint, from config.ckpt (README, "Checkpoint strategies").

  `strategy` is one of the lineage paper's Table I rows: 'lineage' (every partition boundary when
  `partition_boundaries`, and every `every_steps` global steps inside a partition), 'epoch' (at
  epoch ends), 'time' (the first step `every_seconds` after the last save or the start), 'none'
  (only the end of training: a failure restarts from step 0). Every strategy saves the end.

  Under 'lineage', `min_interval_s` > 0 skips a boundary's or a k-step save that would come
  sooner than that after the previous save (the next boundary or k-step point then saves): a
  save costs the saver thread tens of milliseconds of CPU whatever the state's size, which
  partitions of a fraction of a second turn into a third more training time; partitions of
  minutes never meet the floor. Every checkpoint still lies at a partition boundary or a k-step
  point and carries its lineage, so exactly-once does not depend on which ones were skipped.

  Args:
    ckpt_config: config.ckpt (`strategy`, `partition_boundaries`, `every_steps`, `every_seconds`,
      `min_interval_s`).
    epochs: the run's epochs.
    agree: for the clock's decisions ('time', `min_interval_s`) in a multi-process run, makes
      every process take process 0's decision (a broadcast; each process's clock would otherwise
      pick its own step and the collective save would wait for ever). None: the decision is
      this process's.
    clock: seconds, monotonic (tests pass their own).
  """

  def __init__(self, ckpt_config, *, epochs: int, agree=None, clock=time.monotonic):
    self.strategy = str(ckpt_config.get("strategy", "lineage"))
    if self.strategy not in STRATEGIES:
      raise ValueError(f"ckpt.strategy={self.strategy!r}: use one of {STRATEGIES}")
    lineage_rules = self.strategy == "lineage"
    self.every_steps = int(ckpt_config.every_steps) if lineage_rules else 0
    self.partition_boundaries = bool(ckpt_config.partition_boundaries) and lineage_rules
    self.every_seconds = float(ckpt_config.get("every_seconds", 0.0))
    self.min_interval_s = float(ckpt_config.get("min_interval_s", 0.0)) if lineage_rules else 0.0
    self.epochs = epochs
    self._agree, self._clock = agree, clock
    self._last = clock()

  def after_step(self, global_step: int, offset: int, partition_steps: int) -> bool:
    """Inside a partition (`offset` steps into its `partition_steps`); its last step is a
    boundary, which `at_boundary` decides."""
    if offset >= partition_steps:
      return False  # the next step starts a partition: a save here would be the boundary's
    if self.strategy == "time":
      due = self._elapsed(self.every_seconds)
    else:
      k = self.every_steps
      due = bool(k) and global_step % k == 0 and self._elapsed(self.min_interval_s)
    if due:
      self.saved()
    return due

  def at_boundary(self, epoch_after: int, epoch_done: bool = False) -> bool:
    """At a partition boundary, with `epoch_after` the epoch the next step belongs to and
    `epoch_done` whether the boundary ends an epoch."""
    if epoch_after >= self.epochs:
      return True
    if self.strategy == "epoch":
      return epoch_done
    return self.partition_boundaries and self._elapsed(self.min_interval_s)

  def _elapsed(self, seconds: float) -> bool:
    """Whether `seconds` have passed since the last save (always, for 0), by process 0's clock
    where `agree` is given (then a collective: every process asks at the same point)."""
    if seconds <= 0:
      return True
    due = self._clock() - self._last >= seconds
    if self._agree is not None:
      due = bool(self._agree(due))
    return due

  def saved(self) -> None:
    """A save happened (any reason): the time strategy's interval and `min_interval_s` count
    from now. `after_step` calls it for the saves it decides; a boundary's caller calls it."""
    self._last = self._clock()


def agree_with_chief(flag: bool) -> bool:
  """Process 0's `flag`, in every process (a collective: every process must call it)."""
  return bool(multihost_utils.broadcast_one_to_all(np.int32(flag)))


class Saver:
  """Saves checkpoints and commits the ones Orbax finalized on every process.

  Args:
    ckpt: the `checkpoint.Checkpointer`.
    ctx: the fault-tolerance context (`medjax.fault.context`): its `commit` writes the lineage
      record (and applies retention), its phase says 'checkpointing' while a save blocks.
    is_chief: only process 0 commits (every process saves its shards).
    last_saved: the step already on disk (a restored checkpoint's), never saved again.
    before_save: called first (e.g. the metrics check that every loss is finite, so that no
      non-finite state is saved).
    after_save: called once the save is handed to the saver (e.g. writing those metrics, which
      would otherwise compete with the save's packing for the GIL).
  """

  def __init__(self, ckpt: checkpoint_lib.Checkpointer, ctx, *, is_chief: bool,
               last_saved: int | None, before_save=lambda: None, after_save=lambda: None):
    self.ckpt, self.ctx, self.is_chief = ckpt, ctx, is_chief
    self.last_saved = last_saved
    self._before_save, self._after_save = before_save, after_save
    # A save is committed as soon as it is finalized, from the saver thread. Committed from the
    # training thread between steps, it waited while that thread was blocked on the device (the
    # steps run ahead of it, then it waits for them at the next partition boundary), often until
    # the next save: a failure in between lost two partitions where it should lose one.
    ckpt.on_finalized = self._commit if is_chief else (lambda lineage, write_s: None)

  def save(self, state, lineage: lineage_lib.Lineage) -> None:
    if lineage.global_step == self.last_saved:
      return  # e.g. a partition boundary reached right after restoring there
    self._before_save()
    self.last_saved = lineage.global_step
    phase = self.ctx.phase
    self.ctx.set_phase("checkpointing")
    try:
      self.ckpt.save(state, lineage)
    finally:
      self._after_save()
    self.ctx.blocked_s = self.ckpt.blocked_s
    self.ctx.set_phase(phase)

  def _commit(self, lineage: lineage_lib.Lineage, write_s: float) -> None:
    self.ctx.commit(lineage, write_s=write_s)

  def commit_finalized(self) -> None:
    """Passes the write counters on to the context (for heartbeats); commits what a
    Checkpointer without `on_finalized` queued."""
    for lineage in self.ckpt.finalized():
      if self.is_chief:
        self.ctx.commit(lineage)
    self.ctx.writes, self.ctx.write_s = self.ckpt.writes, self.ckpt.write_s

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
                     num_records: int, is_chief: bool, barrier,
                     if_all_damaged: str = "stop", records: str = "", snapshot=None) -> tuple:
  """(state or None, lineage, restored step or None): where training goes on from.

  `snapshot(after_step)`, if given, is asked first (after uncommitted checkpoints are discarded)
  for a host-local snapshot newer than the newest committed step (`medjax.snapshots`): when it
  gives one ((state, lineage, step)), that is where training goes on, no checkpoint is read, and
  the restored step returned is the newest committed one (what is on disk).

  Checkpoints newer than the newest committed step are work a failure discarded: the chief
  deletes them first. The newest committed, readable checkpoint whose two lineage copies agree
  is restored; when it was planned under another placement (the host set changed), the rest of
  its epoch is planned again under this one. Committed checkpoints newer than it that turned out
  damaged are moved aside and their records retracted, so training saves those steps again.
  Without any committed checkpoint, training starts at epoch 0 (state None: the caller keeps its
  fresh state); when there are committed steps but every one is damaged, it stops with an
  InputError unless `if_all_damaged` is 'start_fresh' (config.ckpt.if_all_damaged).

  `records` fingerprints the manifest's record ids in order: lineage bitmaps index manifest rows,
  so checkpoints of one ingest must never be resumed under another (a re-ingest with another
  salt or another cohort export); the first run stores it, later ones must match.
  """
  committed = store.committed_steps()
  if not committed and store.get_state("records") is None:
    # No commit and no trace of a start in this store, yet steps on disk: the store is not this
    # run's (deleted, or config.ckpt.lineage_store changed). Discarding them as uncommitted
    # would delete trained work.
    on_disk = checkpoint_lib.step_dirs(ckpt.directory)
    if on_disk and if_all_damaged != "start_fresh":
      raise errors.InputError(
          f"{ckpt.directory} holds checkpoints (steps {on_disk[:3]}"
          f"{'...' if len(on_disk) > 3 else ''}) but the lineage store {store.location} knows "
          "none of them (deleted, or config.ckpt.lineage_store changed?); point ckpt.lineage_store at the run's store, or "
          "rerun with --config.ckpt.if_all_damaged=start_fresh to train from step 0 (they are "
          f"then moved to {ckpt.directory}-damaged)")
    if on_disk and is_chief:
      checkpoint_lib.set_aside(ckpt.directory, on_disk)
  if records:
    saved = store.get_state("records")
    if saved is not None and saved.get("fingerprint") != records:
      raise errors.InputError(
          f"the cohort's records changed since this run's checkpoints were written (ingest "
          f"fingerprint {saved.get('fingerprint')} in {store.location}, now {records}: re-ingested "
          "with another salt, cohort or table rules); resume with the ingest they were trained "
          "on, or start a new --workdir")
    if saved is None and is_chief:
      store.put_state("records", {"fingerprint": records, "count": num_records})
  if is_chief:
    dropped = checkpoint_lib.discard_uncommitted(ckpt.directory, store.committed_steps())
    if dropped:
      logging.info("checkpoints %s were never committed; deleted", dropped)
  barrier("uncommitted checkpoints discarded")
  # The manager listed the steps when it was opened; those just deleted would otherwise make the
  # save of the same step fail (StepAlreadyExistsError).
  ckpt.reload()
  committed = store.committed_steps()
  if snapshot is not None:
    newer = snapshot(committed[-1] if committed else -1)
    if newer is not None:
      state, lineage, _ = newer
      return state, lineage, committed[-1] if committed else None
  damaged: list[tuple[int, str]] = []
  restored = checkpoint_lib.restore_committed(ckpt.directory, store, abstract_state, ckpt,
                                              damaged=damaged)
  newest = restored[2] if restored is not None else -1
  newer = sorted(step for step, _ in damaged if step > newest)
  if newer:
    if restored is None and if_all_damaged != "start_fresh":
      step, reason = damaged[0]
      reason = reason if len(reason) <= 120 else reason[:117] + "...)"
      raise errors.InputError(
          f"every committed checkpoint left in {ckpt.directory} is damaged ({len(damaged)} "
          f"checked; the newest, step {step}, {reason}); restore them from a backup, or "
          "rerun with --config.ckpt.if_all_damaged=start_fresh to train from step 0 (they are "
          f"then moved to {ckpt.directory}-damaged)")
    if is_chief:
      where = checkpoint_lib.set_aside(ckpt.directory, newer)
      for step in newer:
        store.retract(step)
      logging.warning("checkpoints %s are damaged: moved to %s, their lineage records retracted; "
                      "training goes on from %s", newer, where,
                      f"step {newest}" if restored is not None else "step 0")
    barrier("damaged checkpoints set aside")
    ckpt.reload()
  elif restored is None and committed and if_all_damaged != "start_fresh":
    raise errors.InputError(
        f"the lineage store {store.location} has committed steps (newest {committed[-1]}) but "
        f"{ckpt.directory} holds none of them (deleted or moved?); put them back, or rerun "
        "with --config.ckpt.if_all_damaged=start_fresh to train from step 0")
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
