"""Restore: the newest committed, readable checkpoint, or a fresh start.

A step counts as committed once Orbax finalized it on every process and its lineage record is in
the lineage store. Restore takes the newest committed step whose Orbax metadata agrees with the
store, skipping (with a warning) any step that is damaged or incomplete; checkpoints newer than
the newest committed step are work a failure discarded, and are deleted first.
"""

from __future__ import annotations

import hashlib
import logging
import os

import numpy as np

from medjax import errors
from medjax import lineage as lineage_lib
from medjax import schema
from medjax.checkpoint import checkpointer
from medjax.checkpoint import retention


def restore_committed(directory: str, store: lineage_lib.LineageStore, abstract_state,
                      ckpt: "checkpointer.Checkpointer | None" = None, *,
                      damaged: list | None = None):
  """(state, lineage, step) from the newest good committed checkpoint, or None.

  A step counts only if its lineage record is in `store` and Orbax's copy of the lineage agrees;
  a step that fails to restore (truncated or missing files) is skipped for the previous one, and
  (step, reason) is appended to `damaged` when given. Pass `ckpt` to restore through a
  Checkpointer that training will go on saving with.
  """
  # Every process must take the same path (Orbax synchronises processes inside), so decide from
  # the lineage store, which no one writes while a generation starts.
  committed = store.committed_steps()
  if not committed or not os.path.isdir(directory):
    return None
  own = ckpt is None
  ckpt = ckpt or checkpointer.Checkpointer(directory, async_save=False)
  # A damaged step can make a TensorStore callback fail later on an Orbax event loop that is
  # already closed; Python reports it through sys.unraisablehook, which runlog sends to the log.
  try:
    on_disk = set(ckpt.steps())
    for step in reversed(committed):
      if step not in on_disk:
        continue
      def skip(reason: str, step=step) -> None:
        logging.warning("checkpoint %d %s; trying the previous committed one", step, reason)
        if damaged is not None:
          damaged.append((step, reason))
      try:
        record = store.record(step)
      except lineage_lib.LineageError as e:
        skip(f"has an unreadable lineage record ({e})")
        continue
      try:
        saved = ckpt.lineage(step)
      except Exception as e:  # pylint: disable=broad-except
        skip(f"is damaged or incomplete (metadata unreadable: {_short(e)})")
        continue
      if saved != record:
        skip(f"has an Orbax lineage that disagrees with the lineage store ({saved} vs {record})")
        continue
      try:
        state = ckpt.restore(step, abstract_state)
      except Exception as e:  # pylint: disable=broad-except
        skip(f"is damaged or incomplete ({type(e).__name__}: {_short(e)})")
        continue
      logging.info("checkpoint: restored committed step %d from %s", step, directory)
      return state, saved, step
    return None
  finally:
    if own:
      ckpt.close()


def restore_or_start(ckpt: checkpointer.Checkpointer, store: lineage_lib.LineageStore,
                     abstract_state, *, placement: str, hosts: tuple[str, ...], seed: int,
                     num_records: int, is_chief: bool, barrier,
                     if_all_damaged: str = "stop", records: str = "", snapshot=None) -> tuple:
  """(state or None, lineage, restored step or None): where training goes on from.

  `snapshot(after_step)`, if given, is asked first (after uncommitted checkpoints are discarded)
  for a host-local snapshot newer than the newest committed step (`medjax.checkpoint.snapshots`):
  when it gives one ((state, lineage, step)), that is where training goes on, no checkpoint is
  read, and the restored step returned is the newest committed one (what is on disk).

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
  _check_the_store_is_this_runs(ckpt, store, is_chief=is_chief, if_all_damaged=if_all_damaged)
  _check_the_records(store, records, num_records, is_chief=is_chief)
  if is_chief:
    dropped = retention.discard_uncommitted(ckpt.directory, store.committed_steps())
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
  restored = _restore_newest_good(ckpt, store, abstract_state, is_chief=is_chief,
                                  barrier=barrier, if_all_damaged=if_all_damaged)
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


def _check_the_store_is_this_runs(ckpt: checkpointer.Checkpointer,
                                  store: lineage_lib.LineageStore, *, is_chief: bool,
                                  if_all_damaged: str) -> None:
  """No commit and no trace of a start in the store, yet steps on disk: the store is not this
  run's (deleted, or config.ckpt.lineage_store changed). Discarding them as uncommitted would
  delete trained work: refused, unless told to start fresh (then they are set aside)."""
  if store.committed_steps() or _records_state(store) is not None:
    return
  on_disk = retention.step_dirs(ckpt.directory)
  if on_disk and if_all_damaged != "start_fresh":
    raise errors.InputError(
        f"{ckpt.directory} holds checkpoints (steps {on_disk[:3]}"
        f"{'...' if len(on_disk) > 3 else ''}) but the lineage store {store.location} knows "
        "none of them (deleted, or config.ckpt.lineage_store changed?); point ckpt.lineage_store "
        "at the run's store, or rerun with --config.ckpt.if_all_damaged=start_fresh to train "
        f"from step 0 (they are then moved to {ckpt.directory}-damaged)")
  if on_disk and is_chief:
    retention.set_aside(ckpt.directory, on_disk)


def _check_the_records(store: lineage_lib.LineageStore, records: str, num_records: int, *,
                       is_chief: bool) -> None:
  """The manifest's fingerprint against the one the run's first start stored (stored now if
  this is the first)."""
  if not records:
    return
  saved = _records_state(store)
  if saved is not None and saved["fingerprint"] != records:
    raise errors.InputError(
        f"the cohort's records changed since this run's checkpoints were written (ingest "
        f"fingerprint {saved['fingerprint']} in {store.location}, now {records}: re-ingested "
        "with another salt, cohort or table rules); resume with the ingest they were trained "
        "on, or start a new --workdir")
  if saved is None and is_chief:
    store.put_state("records", {"fingerprint": records, "count": num_records})


# The store's state "records": the manifest's fingerprint (`records_fingerprint`) and length,
# as the run's first start stored them.
RECORDS = schema.Object({"fingerprint": schema.Str(nonempty=True), "count": schema.COUNT})


def _records_state(store: lineage_lib.LineageStore) -> dict | None:
  """The state "records", or None; a damaged one (not JSON, or not `RECORDS`) stops the run with
  one line: without it, nothing tells whether the checkpoints belong to this ingest."""
  try:
    return store.get_state("records", RECORDS)
  except lineage_lib.LineageError as e:
    raise lineage_lib.LineageError(
        f"{e}; restore it from a backup, or delete it if this run's ingest is the one its "
        "checkpoints were trained on (the next start stores that ingest's fingerprint again)"
    ) from None


def _restore_newest_good(ckpt: checkpointer.Checkpointer, store: lineage_lib.LineageStore,
                         abstract_state, *, is_chief: bool, barrier, if_all_damaged: str):
  """(state, lineage, step) of the newest committed, readable checkpoint, or None. Damaged
  committed steps newer than it are set aside and their records retracted; when every committed
  step is damaged or gone, an InputError unless `if_all_damaged` is 'start_fresh'."""
  committed = store.committed_steps()
  damaged: list[tuple[int, str]] = []
  restored = restore_committed(ckpt.directory, store, abstract_state, ckpt, damaged=damaged)
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
      where = retention.set_aside(ckpt.directory, newer)
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
  return restored


def _short(e: BaseException) -> str:
  return " ".join(str(e).split())[:200]


def records_fingerprint(record_ids) -> str:
  """The manifest's record ids in row order, hashed: what a lineage bitmap's rows mean."""
  return hashlib.sha256("\n".join(record_ids).encode()).hexdigest()[:16]
