"""Checkpoints: the only module that imports Orbax.

An Orbax CheckpointManager with async saves. Each step's custom metadata is a deep copy of its
lineage (which records the saved state has trained on), so a checkpoint says what it contains.
"""

from __future__ import annotations

import copy
import logging
import os

import jax
import orbax.checkpoint as ocp


class Checkpointer:
  """Saves and restores the training state (a pytree) with its lineage.

  Args:
    directory: where step directories go (shared storage in multi-host runs).
    max_to_keep: retention; None keeps all.
    async_save: save in the background (training goes on while Orbax writes).
  """

  def __init__(self, directory: str, *, max_to_keep: int | None = 3, async_save: bool = True):
    self.directory = os.path.abspath(directory)
    self._manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                             enable_async_checkpointing=async_save),
        item_names=("state",))

  def save(self, step: int, state, lineage: dict, *, force: bool = True) -> bool:
    """Starts saving `state` at `step` (returns before the write completes when async)."""
    return self._manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state)),
                              custom_metadata=copy.deepcopy(lineage), force=force)

  def steps(self) -> list[int]:
    self._manager.reload()
    return sorted(self._manager.all_steps())

  def latest(self) -> int | None:
    steps = self.steps()
    return steps[-1] if steps else None

  def lineage(self, step: int) -> dict:
    return dict(self._manager.metadata(step).custom_metadata or {})

  def restore(self, step: int, abstract_state):
    """The state at `step`, laid out as `abstract_state` says (any device count)."""
    restored = self._manager.restore(
        step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state)))
    return restored["state"]

  def wait(self) -> None:
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()


def restore_latest(directory: str, abstract_state):
  """(state, lineage, step) from the newest checkpoint in `directory`, or None if there is none."""
  if not os.path.isdir(directory):
    return None
  ckpt = Checkpointer(directory, async_save=False)
  try:
    step = ckpt.latest()
    if step is None:
      return None
    logging.info("checkpoint: restoring step %d from %s", step, directory)
    return ckpt.restore(step, abstract_state), ckpt.lineage(step), step
  finally:
    ckpt.close()


def block_until_ready(state) -> None:
  jax.block_until_ready(state)
