"""The Checkpointer: Orbax's CheckpointManager with saves on a thread of ours.

An Orbax CheckpointManager with async saves. Each step's custom metadata is its lineage
(`medjax.lineage.Lineage`: which records the saved state has trained on), so a checkpoint says
what it contains. States are saved packed (`medjax.checkpoint.packing`).

A step is committed when Orbax has finalized it on every process and its lineage record is in the
lineage store (`medjax.lineage`); `medjax.checkpoint.restore` restores the newest committed one.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from absl import flags
from jax.experimental import multihost_utils

from medjax import errors
from medjax import lineage as lineage_lib
from medjax.checkpoint import handoff as handoff_lib
from medjax.checkpoint import packing


# Orbax's barriers between processes are device collectives by default (a jitted all-gather, run
# by our saver thread while the training thread's steps are in flight). Queued in another order on
# two processes than the steps' own collectives, they deadlock both. The coordination service's
# key-value barrier, which this option selects, does not touch the devices.
flags.FLAGS.experimental_orbax_use_distributed_barrier = True


class _Manager(ocp.CheckpointManager):
  """A CheckpointManager that leaves preemption to the training loop.

  Orbax's `save` asks for jax.distributed's preemption sync point of the step it saves, and the
  manager has no option to turn that off. Called from our saver thread, it would interleave older
  steps with the training thread's calls and break the protocol, which needs each process's steps
  in order; the training loop asks (`Checkpointer.reached_preemption`) instead.
  """

  def reached_preemption(self, step: int) -> bool:
    del step
    return False


_instances = itertools.count()   # every process opens its async Checkpointers in the same order


class Checkpointer:
  """Saves and restores the training state (a pytree) with its lineage.

  With `async_save`, `save` only snapshots the state on its devices (a copy the next, donating,
  training step cannot touch) and hands it to a saver thread, which makes the Orbax calls
  (their cross-process barriers, the device-to-host copy, the writes, the finalization) in order;
  training goes on meanwhile. A save that finds the saver busy waits, and a newer one replaces
  it (`medjax.checkpoint.handoff`: coalesced, listed in `coalesced`): a save never waits for a
  write. Every process writes the same steps in the same order, so the barriers meet. The
  preemption sync point is asked by the training thread only (`reached_preemption`):
  jax.distributed's protocol needs each process's steps in order.

  Args:
    directory: where step directories go (shared storage in multi-host runs).
    async_save: save in the background (training goes on while Orbax writes).
    packer: the `packing.StatePacker` to use (one warmed for the state's shape: the first save then
      only dispatches its program); None: a new one, which works out its layout at the first
      save.
    duty: with `async_save`, the most of the time the saver thread writes: it rests between
      writes (`handoff.Leader`; config.ckpt.writer_duty).
  """

  def __init__(self, directory: str, *, async_save: bool = True,
               packer: packing.StatePacker | None = None, duty: float = 1.0):
    self.directory = os.path.abspath(directory)
    # Orbax keeps everything; `prune` applies retention to committed steps only. Orbax saves
    # synchronously, on our saver thread when async.
    self._manager = _Manager(
        self.directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=None, create=True,
                                             enable_async_checkpointing=False),
        item_handlers={"state": ocp.StandardCheckpointHandler(),
                       "layout": ocp.JsonCheckpointHandler()})
    self._pending: list[lineage_lib.Lineage] = []   # finalized, not yet reported
    self._lock = threading.Lock()
    self._handoff = None
    self._error: BaseException | None = None
    if async_save:
      # At most two copies of the state: the one being written and the newest waiting.
      self._handoff = handoff_lib.for_this_process(f"ckpt{next(_instances)}", duty=duty)
      self._saver = threading.Thread(target=self._save_loop, name="checkpoint-saver",
                                     daemon=True)
      self._saver.start()
    self.blocked_s = 0.0
    # Saves written and finalized, and the seconds their writes took (async: on the saver
    # thread, one after another; a failure before a save is finalized loses what it would keep).
    self.writes, self.write_s = 0, 0.0
    self.refused: list[int] = []   # steps a save's guard kept from being written
    self._packer = packer or packing.StatePacker()
    # Called as on_finalized(lineage, write_s) once a save is finalized on every process (on the
    # saver thread when async), instead of queueing it for `finalized`: see `Saver`.
    self.on_finalized = None

  def wanted(self) -> bool:
    """Whether an optional save should be made now (`handoff.Leader.wanted`: not while the
    writer writes or rests past the next one); a synchronous checkpointer always wants it."""
    return self._handoff is None or self._handoff.wanted()

  def save(self, state, lineage: lineage_lib.Lineage, guard=None, *,
           urgent: bool = False) -> None:
    """Starts saving `state` at `lineage.global_step`; returns at once (async) or once written.

    `guard`: called where the state is written (the saver thread when async); False means the
    state must not be kept (e.g. a loss before it was not finite: `Reporter.finite_guard`), and
    the step is not written. Its answer must be the same on every process.
    """
    t0 = time.perf_counter()
    self._raise_saver_error()
    # Packing copies: the next (donating) training step cannot touch what is being saved.
    packed = self._packer(state)
    layout = self._packer.layout
    if self._handoff is None:
      self._save_now(packed, layout, lineage, guard)
    else:
      self._handoff.put(handoff_lib.Item(lineage.global_step, (packed, layout, lineage, guard),
                                         urgent=urgent))
    self.blocked_s += time.perf_counter() - t0

  def _save_now(self, packed, layout: dict, lineage: lineage_lib.Lineage, guard=None) -> None:
    """Writes and finalizes one step (every process), then hands it to `on_finalized` (which
    commits it) or, without one, to `finalized`."""
    if guard is not None and not guard():
      logging.warning("checkpoint: step %d not written: a training loss before it is not "
                      "finite", lineage.global_step)
      with self._lock:
        self.refused.append(lineage.global_step)
      return
    t0 = time.perf_counter()
    self._manager.save(lineage.global_step,
                       args=ocp.args.Composite(state=ocp.args.StandardSave(packed),
                                               layout=ocp.args.JsonSave(layout)),
                       custom_metadata=lineage.to_dict(), force=True)
    write_s = time.perf_counter() - t0
    with self._lock:
      self.writes += 1
      self.write_s += write_s
      if self.on_finalized is None:
        self._pending.append(lineage)
    if self.on_finalized is not None:
      self.on_finalized(lineage, write_s)

  def _save_loop(self) -> None:
    while (item := self._handoff.take()) is not None:
      try:
        if self._error is None:
          self._save_now(*item.payload)
      except BaseException as e:  # pylint: disable=broad-except  (re-raised on the main thread)
        logging.exception("checkpoint: saving step %d failed", item.step)
        self._error = e
      finally:
        self._handoff.done()

  @property
  def coalesced(self) -> list[int]:
    """Steps whose saves a newer save replaced while they waited for the writer."""
    return list(self._handoff.coalesced) if self._handoff is not None else []

  def _raise_saver_error(self) -> None:
    if self._error is not None:
      raise RuntimeError(f"checkpoint saving failed in the background: {self._error!r}; see the "
                         "log above for the step and the cause") from self._error

  def finalized(self) -> list[lineage_lib.Lineage]:
    """Lineages of the saves Orbax has finalized on every process since the last call."""
    self._raise_saver_error()
    with self._lock:
      done, self._pending = self._pending, []
    return done

  @staticmethod
  def reached_preemption(step: int) -> bool:
    """True on every process at the same step once any process got SIGTERM (jax.distributed).

    Call it at every step, from one thread, with increasing steps.
    """
    try:
      return multihost_utils.reached_preemption_sync_point(step)
    except RuntimeError:  # no preemption service (single process)
      return False

  def reload(self) -> None:
    """Lists the step directories again (after another party deleted or added some)."""
    self._manager.reload()

  def steps(self) -> list[int]:
    self.reload()
    return sorted(self._manager.all_steps())

  def latest(self) -> int | None:
    steps = self.steps()
    return steps[-1] if steps else None

  def lineage(self, step: int) -> lineage_lib.Lineage:
    """The lineage saved with `step` (raises LineageError if it is unreadable)."""
    return lineage_lib.Lineage.from_dict(dict(self._manager.metadata(step).custom_metadata or {}))

  def layout(self, step: int) -> dict:
    return self._manager.restore(step, args=ocp.args.Composite(
        layout=ocp.args.JsonRestore()))["layout"]

  def restore(self, step: int, abstract_state):
    """The state at `step`, laid out as `abstract_state` says (any device count)."""
    layout = self.layout(step)
    paths_and_targets, treedef = jax.tree_util.tree_flatten_with_path(abstract_state)
    targets = [t for _, t in paths_and_targets]
    saved_paths = [e["path"] for e in layout["leaves"]]
    wanted = [jax.tree_util.keystr(p) for p, _ in paths_and_targets]
    if saved_paths != wanted:
      missing = sorted(set(wanted) - set(saved_paths))[:5]
      extra = sorted(set(saved_paths) - set(wanted))[:5]
      raise errors.InputError(
          f"checkpoint {step} in {self.directory} holds another state structure "
          f"(not in it: {missing}; only in it: {extra}); was it saved with another "
          "model config?")
    whole = packing.replicated_like(targets[0].sharding)
    saved = {"packed": {g: jax.ShapeDtypeStruct((n,), jnp.dtype(g), sharding=whole)
                        for g, n in layout["sizes"].items()},
             "own": [t for e, t in zip(layout["leaves"], targets) if e["group"] is None]}
    restored = self._manager.restore(
        step, args=ocp.args.Composite(state=ocp.args.StandardRestore(saved)))["state"]
    # Each process holds the whole of every packed vector (replicated): unpacked on the host, as
    # a snapshot is (a compiled unpacking took up to 1.2 s of a restart to compile).
    host = {g: np.asarray(x.addressable_data(0)) for g, x in restored["packed"].items()}
    own = iter(restored["own"])
    leaves = [next(own) if e["group"] is None else leaf
              for e, leaf in zip(layout["leaves"],
                                 packing.unpack_on_host(host, layout["leaves"], targets))]
    return treedef.unflatten(leaves)

  def wait(self) -> None:
    """Blocks until every save so far is written and finalized."""
    t0 = time.perf_counter()
    if self._handoff is not None:
      self._handoff.join()
    self._raise_saver_error()
    self._manager.wait_until_finished()
    self.blocked_s += time.perf_counter() - t0

  def close(self) -> None:
    if self._handoff is not None and self._saver.is_alive():
      self._handoff.join()
      self._handoff.close()
      self._saver.join()
    self._manager.wait_until_finished()
    self._manager.close()


def load_arrays(directory: str, step: int | None = None) -> tuple[dict[str, np.ndarray], int]:
  """The saved state as {leaf path: host array} (e.g. "['params']['head']..."), and its step.

  Needs no restore target: for inspection and tests.
  """
  ckpt = Checkpointer(directory, async_save=False)
  try:
    step = ckpt.latest() if step is None else step
    layout = ckpt.layout(step)
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = {e["path"]: jax.ShapeDtypeStruct(tuple(e["shape"]), jnp.dtype(e["dtype"]),
                                              sharding=device) for e in layout["leaves"]}
    # A flat dict's paths are "['<path>']"; restore through the layout's own order.
    state = ckpt.restore(step, _Flat(target))
  finally:
    ckpt.close()
  return {path: np.asarray(x) for path, x in zip(target, jax.tree.leaves(state))}, step


class _Flat(dict):
  """A dict whose leaf paths are its keys as written (load_arrays's restore target)."""


jax.tree_util.register_pytree_with_keys(
    _Flat, lambda d: ([(_FlatKey(k), v) for k, v in d.items()], tuple(d)),
    lambda keys, values: _Flat(zip(keys, values)))


@dataclasses.dataclass(frozen=True)
class _FlatKey:
  key: str

  def __str__(self) -> str:
    return self.key


