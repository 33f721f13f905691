"""Epoch plans: an epoch's records split into partitions (the unit of lineage) and global steps.

An epoch over `rows` (default: the train split) is split into P partitions. Each host's rows are
ordered by (modality group, label, seeded key) and dealt round-robin into the partitions, so every
partition holds a stratified sample of every host's records and each host's count per partition
differs by at most 1 across partitions. The deal runs on from host to host, so partition sizes
differ by at most 1 as well.

Inside a partition each host's rows are shuffled and cut into slices of `host_batch_size`; global
step s feeds slice s of every host at once (steps_SxWxB[s, w] are host w's rows). A host with fewer
rows than the longest pads its last slices with -1 (masked records with zero loss weight); padding
is always a suffix of a host's sequence.

A plan is a pure function of (manifest, placement, seed, epoch, num_partitions, host_batch_size,
rows). After a host-set change mid-epoch, re-plan with `rows` = the records not yet processed
(`EpochPlan.remaining_rows`) under the new placement.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Iterable

import numpy as np

from medjax import errors
from medjax.data import manifest as manifest_lib
from medjax.data.cache import placement as placement_lib

# Stream tags that keep the seeded draws of a plan independent of each other.
_DEAL_KEY, _DEAL_OFFSET, _STEP_SEED = 1, 2, 3


@dataclasses.dataclass(frozen=True)
class EpochPlan:
  """One epoch's partitions and steps for one placement generation.

  Attributes:
    epoch: the epoch this plan is for.
    generation: the placement generation it was planned for.
    partitions: per partition, its manifest rows, sorted.
    steps: per partition, int32 [S_p, W, host_batch] manifest rows, -1 = padding.
    hosts: the placement's hosts; column w of every step belongs to hosts[w].
  """
  epoch: int
  generation: int
  partitions: tuple[np.ndarray, ...] = dataclasses.field(repr=False)
  steps: tuple[np.ndarray, ...] = dataclasses.field(repr=False)
  hosts: tuple[str, ...]

  def __eq__(self, other: object) -> bool:
    if not isinstance(other, EpochPlan):
      return NotImplemented
    return self.fingerprint() == other.fingerprint()

  @property
  def num_partitions(self) -> int:
    return len(self.partitions)

  @property
  def num_steps(self) -> int:
    """Global steps in the whole epoch (all partitions)."""
    return int(sum(s.shape[0] for s in self.steps))

  @property
  def steps_per_partition(self) -> tuple[int, ...]:
    return tuple(int(s.shape[0]) for s in self.steps)

  @property
  def host_batch_size(self) -> int:
    return int(self.steps[0].shape[2])

  @property
  def rows(self) -> np.ndarray:
    """All planned manifest rows, sorted."""
    return np.sort(np.concatenate(self.partitions))

  @property
  def padding_fraction(self) -> float:
    """Share of step slots that are padding."""
    slots = sum(s.size for s in self.steps)
    return float(sum(int((s < 0).sum()) for s in self.steps) / max(slots, 1))

  def global_step_index(self, partition: int, step: int) -> int:
    """Index of (partition, step) in the epoch when partitions run in order."""
    self._check_position(partition, step, allow_end=False)
    return int(sum(self.steps_per_partition[:partition]) + step)

  def locate(self, global_step: int) -> tuple[int, int]:
    """(partition, step within it) of a global step index; inverse of `global_step_index`."""
    if not 0 <= global_step < self.num_steps:
      raise ValueError(f"global step {global_step} is outside epoch {self.epoch}'s plan "
                       f"(0..{self.num_steps - 1})")
    ends = np.cumsum(self.steps_per_partition)
    p = int(np.searchsorted(ends, global_step, side="right"))
    return p, int(global_step - (ends[p - 1] if p else 0))

  def processed_rows(self, completed: Iterable[int] = (), in_progress: int | None = None,
                     step: int = 0) -> np.ndarray:
    """Rows trained on so far: all of the `completed` partitions plus the first `step` steps of
    partition `in_progress` (sorted, without padding)."""
    done = [self.partitions[self._check_position(p, 0, allow_end=False)] for p in completed]
    if in_progress is not None:
      self._check_position(in_progress, step, allow_end=True)
      done.append(self.steps[in_progress][:step].reshape(-1))
    if not done:
      return np.zeros(0, np.int64)
    rows = np.concatenate(done)
    return np.unique(rows[rows >= 0]).astype(np.int64)

  def remaining_rows(self, completed: Iterable[int] = (), in_progress: int | None = None,
                     step: int = 0) -> np.ndarray:
    """Planned rows not yet trained on (the `rows` to re-plan with after a host-set change)."""
    return np.setdiff1d(self.rows, self.processed_rows(completed, in_progress, step))

  def fingerprint(self) -> str:
    """sha256 over the plan's contents; equal plans have equal fingerprints."""
    h = hashlib.sha256(repr((self.epoch, self.generation, self.hosts)).encode())
    for part, steps in zip(self.partitions, self.steps):
      h.update(np.ascontiguousarray(part, dtype=np.int64).tobytes())
      h.update(repr(steps.shape).encode())
      h.update(np.ascontiguousarray(steps, dtype=np.int32).tobytes())
    return h.hexdigest()

  def _check_position(self, partition: int, step: int, *, allow_end: bool) -> int:
    if not 0 <= partition < self.num_partitions:
      raise ValueError(f"partition {partition} is outside epoch {self.epoch}'s plan "
                       f"(0..{self.num_partitions - 1})")
    limit = self.steps_per_partition[partition]
    if not 0 <= step <= limit or (step == limit and not allow_end):
      raise ValueError(f"step {step} is outside partition {partition} of epoch {self.epoch} "
                       f"({limit} steps)")
    return partition


def _check_placement(manifest: manifest_lib.Manifest,
                     placement: placement_lib.Placement) -> None:
  if len(placement.owner_N) != len(manifest):
    raise ValueError(f"placement generation {placement.generation} covers "
                     f"{len(placement.owner_N)} rows but the manifest has {len(manifest)}; "
                     f"place the manifest you are planning for")


def _check_rows(rows, num_rows: int, what: str) -> np.ndarray:
  rows = np.asarray(rows)
  if rows.ndim != 1 or not (rows.size == 0 or np.issubdtype(rows.dtype, np.integer)):
    raise ValueError(f"{what} must be a 1-D array of integer manifest row indices, got "
                     f"dtype {rows.dtype} shape {rows.shape}")
  rows = np.sort(rows.astype(np.int64))
  bad = rows[(rows < 0) | (rows >= num_rows)]
  if bad.size:
    raise ValueError(f"{what}: {bad.size} row indices outside the manifest's 0..{num_rows - 1} "
                     f"(e.g. {bad[:3].tolist()}); pass manifest row indices")
  dup = rows[1:][rows[1:] == rows[:-1]]
  if dup.size:
    raise ValueError(f"{what}: rows {np.unique(dup)[:3].tolist()} appear more than once; each "
                     f"record is planned once per epoch (np.unique them)")
  return rows


def _check_sizes(num_partitions: int, host_batch_size: int) -> None:
  if num_partitions < 1:
    raise errors.InputError(
        f"num_partitions={num_partitions}: an epoch needs at least one partition")
  if host_batch_size < 1:
    raise errors.InputError(
        f"host_batch_size={host_batch_size}: each host needs at least one record "
        f"per step")


def _step_seed(seed: int, epoch: int, partition: int) -> int:
  return int(np.random.SeedSequence([seed, epoch, _STEP_SEED, partition]).generate_state(
      1, np.uint64)[0])


def partition_steps(rows: np.ndarray, placement: placement_lib.Placement, *, host_batch_size: int,
                    seed: int) -> np.ndarray:
  """Cuts one partition's rows into global steps.

  Each host's rows are shuffled (by a per-row key drawn from `seed`, so a subset keeps the relative
  order it had in the full set) and cut into slices of `host_batch_size`.

  Args:
    rows: manifest row indices of the partition (any order, each once).
    placement: says which host owns (and so feeds) each row.
    host_batch_size: records per host per step.
    seed: shuffle seed.

  Returns:
    int32 [S, W, host_batch_size] manifest rows, -1 for padding, where
    S = ceil(max rows of one host / host_batch_size).
  """
  _check_sizes(1, host_batch_size)
  num_rows, w = len(placement.owner_N), placement.num_hosts
  rows = _check_rows(rows, num_rows, "partition_steps rows")
  key_N = np.random.default_rng(seed).random(num_rows)
  owner_R = placement.owner_N[rows]
  order = np.lexsort((rows, key_N[rows], owner_R))
  rows, owner_R = rows[order], owner_R[order]
  count_W = np.bincount(owner_R, minlength=w)
  num_steps = -(-int(count_W.max(initial=0)) // host_batch_size)
  rank_R = np.arange(len(rows)) - np.searchsorted(owner_R, owner_R, side="left")
  steps_SxWxB = np.full((num_steps, w, host_batch_size), -1, np.int32)
  steps_SxWxB[rank_R // host_batch_size, owner_R, rank_R % host_batch_size] = rows
  return steps_SxWxB


def plan_epoch(manifest: manifest_lib.Manifest, placement: placement_lib.Placement, *, seed: int,
               epoch: int, num_partitions: int, host_batch_size: int,
               rows: np.ndarray | None = None) -> EpochPlan:
  """Plans one epoch: stratified partitions, then each partition's global steps.

  Args:
    manifest: the cohort.
    placement: the current placement (its generation is recorded in the plan).
    seed: run seed; with `epoch` it seeds every shuffle.
    epoch: epoch number.
    num_partitions: P, the number of partitions (lineage units).
    host_batch_size: records per host per step.
    rows: manifest rows to plan; default all rows of the 'train' split. A resumed epoch passes
      the rows not yet processed.

  Returns:
    The plan; identical inputs give identical plans.
  """
  _check_sizes(num_partitions, host_batch_size)
  _check_placement(manifest, placement)
  if seed < 0 or epoch < 0:
    raise ValueError(f"seed={seed}, epoch={epoch}: both must be >= 0")
  rows_R = manifest.indices("train") if rows is None else _check_rows(rows, len(manifest), "rows")
  if num_partitions > len(rows_R):
    raise errors.InputError(
        f"config.data.num_partitions={num_partitions}, but only {len(rows_R)} training "
        f"record{'' if len(rows_R) == 1 else 's'} to plan for epoch {epoch}; lower it to at most "
        f"{len(rows_R)}"
        + (" (rows is empty: nothing left to plan)" if not len(rows_R) else ""))
  key_N = np.random.default_rng([seed, epoch, _DEAL_KEY]).random(len(manifest))
  owner_R = placement.owner_N[rows_R]
  # One stream: host by host, each host's rows by (group, label, key); position i of the stream
  # goes to partition (offset + i) % P.
  stream = np.lexsort((rows_R, key_N[rows_R], manifest.labels[rows_R], manifest.groups[rows_R],
                       owner_R))
  offset = int(np.random.default_rng([seed, epoch, _DEAL_OFFSET]).integers(num_partitions))
  part_R = np.empty(len(rows_R), np.int64)
  part_R[stream] = (offset + np.arange(len(rows_R))) % num_partitions
  partitions = tuple(rows_R[part_R == p] for p in range(num_partitions))
  steps = tuple(
      partition_steps(part, placement, host_batch_size=host_batch_size,
                      seed=_step_seed(seed, epoch, p)) for p, part in enumerate(partitions))
  return EpochPlan(epoch=epoch, generation=placement.generation, partitions=partitions,
                   steps=steps, hosts=placement.hosts)
