"""When to save (config.ckpt.strategy): from the position in the plan, or the clock."""

from __future__ import annotations

import time

import numpy as np
from jax.experimental import multihost_utils


STRATEGIES = ("lineage", "epoch", "time", "none")   # config.ckpt.strategy


class SavePolicy:
  """When to checkpoint, from config.ckpt (docs/checkpoints.md, "Checkpoint strategies").

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

  def after_step(self, global_step: int, offset: int, partition_steps: int, *,
                 agree: bool = True) -> bool:
    """Inside a partition (`offset` steps into its `partition_steps`); its last step is a
    boundary, which `at_boundary` decides. `agree=False`: by this process's clock alone (no
    collective), where processes may be at different steps ('local' mode's rounds reconcile
    their saves at the round's end)."""
    if offset >= partition_steps:
      return False  # the next step starts a partition: a save here would be the boundary's
    if self.strategy == "time":
      due = self._elapsed(self.every_seconds, agree)
    else:
      k = self.every_steps
      due = bool(k) and global_step % k == 0 and self._elapsed(self.min_interval_s, agree)
    if due:
      self.saved()
    return due

  def at_boundary(self, epoch_after: int, epoch_done: bool = False, *,
                  agree: bool = True) -> bool:
    """At a partition boundary, with `epoch_after` the epoch the next step belongs to and
    `epoch_done` whether the boundary ends an epoch (`agree`: as in `after_step`)."""
    if epoch_after >= self.epochs:
      return True
    if self.strategy == "epoch":
      return epoch_done
    return self.partition_boundaries and self._elapsed(self.min_interval_s, agree)

  def _elapsed(self, seconds: float, agree: bool = True) -> bool:
    """Whether `seconds` have passed since the last save (always, for 0), by process 0's clock
    where the policy was given `agree` and this call's `agree` is True (then a collective: every
    process asks at the same point), else by this process's."""
    if seconds <= 0:
      return True
    due = self._clock() - self._last >= seconds
    if self._agree is not None and agree:
      due = bool(self._agree(due))
    return due

  def saved(self) -> None:
    """A save happened (any reason): the time strategy's interval and `min_interval_s` count
    from now. `after_step` calls it for the saves it decides; a boundary's caller calls it."""
    self._last = self._clock()


def agree_with_chief(flag: bool) -> bool:
  """Process 0's `flag`, in every process (a collective: every process must call it)."""
  return bool(multihost_utils.broadcast_one_to_all(np.int32(flag)))


