"""Checkpoints: the only module that imports Orbax.

An Orbax CheckpointManager with async saves. Each step's custom metadata is its lineage
(`medjax.lineage.Lineage`: which records the saved state has trained on), so a checkpoint says
what it contains.

Orbax's cost is per array (about 1.3 ms each on CPU: a 138-leaf state took 200 ms a save, one
array of the same size 20 ms), so replicated leaves are raveled and packed into one vector per
dtype; sharded (fsdp) leaves are saved as they are. The packing (`layout`, saved beside the state)
records each leaf's path, place, shape and dtype; restore unpacks onto the target's shardings,
whatever the device and process count.

A step is committed when Orbax has finalized it on every process and its lineage record is in the
lineage store (`medjax.lineage`). Restore takes the newest committed step whose Orbax metadata
agrees with the store, skipping (with a warning) any step that is damaged or incomplete.
Retention (`prune`) is applied to committed steps only, so an uncommitted newer step never
pushes the last committed one out; whoever commits prunes (the coordinator in supervised runs).

`Barrier` is here too: it is Orbax's public barrier in jax.distributed's coordination service.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import queue
import shutil
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
from medjax import programs


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


class Barrier:
  """Waits until every process of the generation gets here (a no-op with one process).

  A key-value barrier in jax.distributed's coordination service (Orbax's public barrier).
  Unlike multihost_utils.sync_global_devices, a collective whose first use gives up after 30 s
  while gloo connects, it waits up to `timeout_s`, e.g. while one host fills a large cache.
  Every process must call it with the same names in the same order.
  """

  def __init__(self, timeout_s: float):
    self.timeout_s = timeout_s
    self._calls = 0

  def __call__(self, name: str, timeout_s: float | None = None) -> None:
    self._calls += 1
    if jax.process_count() == 1:
      return
    sync = ocp.multihost.get_barrier_sync_fn()
    sync(key=f"medjax/{name}/{self._calls}",
         timeout_ms=int((timeout_s or self.timeout_s) * 1000))


class Checkpointer:
  """Saves and restores the training state (a pytree) with its lineage.

  With `async_save`, `save` only snapshots the state on its devices (a copy the next, donating,
  training step cannot touch) and hands it to a saver thread, which makes the Orbax calls
  (their cross-process barriers, the device-to-host copy, the writes, the finalization) in order;
  training goes on meanwhile. Every process saves the same steps in the same order, so the
  barriers meet. The preemption sync point is asked by the training thread only
  (`reached_preemption`): jax.distributed's protocol needs each process's steps in order.

  Args:
    directory: where step directories go (shared storage in multi-host runs).
    async_save: save in the background (training goes on while Orbax writes).
    packer: the `StatePacker` to use (one warmed for the state's shape: the first save then
      only dispatches its program); None: a new one, which works out its layout at the first
      save.
  """

  def __init__(self, directory: str, *, async_save: bool = True,
               packer: StatePacker | None = None):
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
    self._queue: queue.Queue | None = None
    self._error: BaseException | None = None
    if async_save:
      # At most two snapshots wait: a saver that falls behind slows training, not memory.
      self._queue = queue.Queue(maxsize=2)
      self._saver = threading.Thread(target=self._save_loop, name="checkpoint-saver",
                                     daemon=True)
      self._saver.start()
    self.blocked_s = 0.0
    # Saves written and finalized, and the seconds their writes took (async: on the saver
    # thread, one after another; a failure before a save is finalized loses what it would keep).
    self.writes, self.write_s = 0, 0.0
    self._packer = packer or StatePacker()
    # Called as on_finalized(lineage, write_s) once a save is finalized on every process (on the
    # saver thread when async), instead of queueing it for `finalized`: see `Saver`.
    self.on_finalized = None

  def save(self, state, lineage: lineage_lib.Lineage) -> None:
    """Starts saving `state` at `lineage.global_step`; returns at once (async) or once written."""
    t0 = time.perf_counter()
    self._raise_saver_error()
    # Packing copies: the next (donating) training step cannot touch what is being saved.
    packed = self._packer(state)
    layout = self._packer.layout
    if self._queue is None:
      self._save_now(packed, layout, lineage)
    else:
      self._queue.put((packed, layout, lineage))
    self.blocked_s += time.perf_counter() - t0

  def _save_now(self, packed, layout: dict, lineage: lineage_lib.Lineage) -> None:
    """Writes and finalizes one step (every process), then hands it to `on_finalized` (which
    commits it) or, without one, to `finalized`."""
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
    while True:
      item = self._queue.get()
      try:
        if item is None:
          return
        if self._error is None:
          self._save_now(*item)
      except BaseException as e:  # pylint: disable=broad-except  (re-raised on the main thread)
        logging.exception("checkpoint: saving step %d failed", item[2].global_step)
        self._error = e
      finally:
        self._queue.task_done()

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
    whole = replicated_like(targets[0].sharding)
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
                                 unpack_on_host(host, layout["leaves"], targets))]
    return treedef.unflatten(leaves)

  def wait(self) -> None:
    """Blocks until every save so far is written and finalized."""
    t0 = time.perf_counter()
    if self._queue is not None:
      self._queue.join()
    self._raise_saver_error()
    self._manager.wait_until_finished()
    self.blocked_s += time.perf_counter() - t0

  def close(self) -> None:
    if self._queue is not None:
      self._queue.join()
      self._queue.put(None)
      self._saver.join()
      self._queue = None
    self._manager.wait_until_finished()
    self._manager.close()


def restore_committed(directory: str, store: lineage_lib.LineageStore, abstract_state,
                      ckpt: "Checkpointer | None" = None, *, damaged: list | None = None):
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
  ckpt = ckpt or Checkpointer(directory, async_save=False)
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


def state_layout(state) -> dict:
  """Where each leaf goes: replicated leaves packed per dtype, the others saved as they are."""
  leaves, sizes = [], {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
    entry = {"path": jax.tree_util.keystr(path), "shape": list(leaf.shape),
             "dtype": str(leaf.dtype), "group": None, "offset": 0}
    if leaf.sharding.is_fully_replicated:
      entry["group"] = entry["dtype"]
      entry["offset"] = sizes.get(entry["group"], 0)
      sizes[entry["group"]] = entry["offset"] + int(np.prod(leaf.shape, dtype=np.int64))
    leaves.append(entry)
  return {"version": 1, "leaves": leaves, "sizes": sizes}


def _sharded_in_type(x) -> bool:
  spec = getattr(getattr(jax.typeof(x), "sharding", None), "spec", ())
  return any(axis is not None for axis in spec)


class LayoutChanged(Exception):
  """A state that a packer's layout does not describe (raised while the packer is traced)."""


class StatePacker:
  """Packs states on their devices as `state_layout` lays them out: one copy per dtype of the
  replicated leaves, a copy of each other leaf ({"packed": {dtype: vector}, "own": [...]}).

  A run packs states of one structure every time (the training step's output), so the layout is
  worked out for the first state and kept (`layout`, `layout_json`): a pack then only dispatches
  the program. Its program checks, whenever it is traced for a new signature, that the state
  still has the layout's leaves (paths, shapes, dtypes, and a replicated leaf's replication where
  its type says: explicit mesh axes); a state that does not gets a new layout. (Where types carry
  no sharding, a leaf whose sharding alone changed keeps its group: its values are packed all
  the same, gathered or copied.) Checking the state's signature in Python at every save, as it was,
  took a third of a save's blocking time on the quickstart.
  """

  def __init__(self):
    self.layout: dict | None = None
    self.layout_json = ""
    self._pack = None

  def warm(self, state) -> None:
    """Works out the layout and compiles (or loads) the packing program for states like `state`
    (abstract: shapes, dtypes, shardings) now, without running it: the first save then only
    dispatches (the compile took ~70 ms of the quickstart's first checkpoint, the layout
    ~2-3 ms more; pass the warmed packer to the Checkpointer and the Snapshots)."""
    self._relayout(state)
    programs.warm(self._pack, state)

  def prime(self, state) -> None:
    """Packs `state` once and drops the result, before training: jax.jit fills its own dispatch
    cache at a call, not at `warm`'s compile, so the first pack of a run otherwise traced,
    lowered and looked its program up again (3-4 ms of the first checkpoint's or snapshot's
    blocking with the persistent cache; ~80 ms of compiling without one)."""
    self(state)

  def _relayout(self, state) -> None:
    self.layout = state_layout(state)
    self.layout_json = json.dumps(self.layout)
    self._pack = _packer(self.layout_json, jax.default_backend() == "cpu")

  def __call__(self, state) -> dict:
    if self._pack is not None:
      try:
        return self._pack(state)[0]
      except LayoutChanged:
        pass
    self._relayout(state)
    return self._pack(state)[0]


# XLA:CPU runs a program it estimates at under 1000 flops inline, on the thread that dispatches it
# (PjRt's CPU client, `cheap_computation_`), and a copy counts no flops whatever its size: the
# pack copied the whole state on the training thread (0.5 ms for the quickstart's, 3.3 ms for
# 10x it). A sum over this many of the packed values puts it over the line, so that it runs on
# XLA's threads like the training step: its dispatch takes 0.15-0.2 ms at either size.
_ASYNC_FLOPS = 4096


@functools.lru_cache(maxsize=8)
def _packer(layout_json: str, offload: bool):
  """The packing program for a layout: (packed state, a scalar that is only there to make XLA:CPU
  run it off the dispatching thread where `offload`, else None)."""
  entries = json.loads(layout_json)["leaves"]
  described = [(e["path"], tuple(e["shape"]), e["dtype"]) for e in entries]

  def pack(state):
    flat = jax.tree_util.tree_flatten_with_path(state)[0]
    if [(jax.tree_util.keystr(p), tuple(x.shape), str(x.dtype)) for p, x in flat] != described:
      raise LayoutChanged()
    # A leaf laid out as replicated that is sharded in its type (an explicit mesh's axis).
    if any(e["group"] is not None and _sharded_in_type(x) for e, (_, x) in zip(entries, flat)):
      raise LayoutChanged()
    leaves = [x for _, x in flat]
    groups: dict[str, list] = {}
    for e, x in zip(entries, leaves):
      if e["group"] is not None:
        groups.setdefault(e["group"], []).append(x.ravel())
    packed = {"packed": {g: jnp.concatenate(v) for g, v in groups.items()},
              "own": [jnp.copy(x) for e, x in zip(entries, leaves) if e["group"] is None]}
    vectors = [x.ravel() for x in (*packed["packed"].values(), *packed["own"])] if offload else []
    if not vectors:
      return packed, None
    return packed, jnp.sum(max(vectors, key=lambda v: v.size)[:_ASYNC_FLOPS].astype(jnp.float32))
  return programs.cached(jax.jit(pack))


def unpack_on_host(host: dict[str, np.ndarray], entries: list[dict], targets: list) -> list:
  """The packed leaves of `entries` (a layout's) from the host vectors `host` (group -> vector),
  each placed as its target says; None for the leaves saved as they are (group None)."""
  leaves = []
  for e, target in zip(entries, targets):
    if e["group"] is None:
      leaves.append(None)
      continue
    n = int(np.prod(e["shape"], dtype=np.int64))
    value = host[e["group"]][e["offset"]:e["offset"] + n].reshape(e["shape"])
    leaves.append(jax.make_array_from_callback(value.shape, target.sharding,
                                               lambda index, value=value: value[index]))
  return leaves


def replicated_like(sharding):
  """A sharding that puts a whole array on every device of `sharding`'s devices."""
  if isinstance(sharding, jax.sharding.NamedSharding):
    return jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec())
  return sharding


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


def _short(e: BaseException) -> str:
  return " ".join(str(e).split())[:200]


def set_aside(directory: str, steps: list[int]) -> str | None:
  """Moves damaged step directories to `<directory>-damaged/` (kept for inspection, never
  deleted, and out of the way of the same steps saved again); returns where they went."""
  if not steps:
    return None
  target = directory.rstrip("/") + "-damaged"
  os.makedirs(target, exist_ok=True)
  for step in steps:
    source = os.path.join(directory, str(step))
    if os.path.isdir(source):
      os.replace(source, os.path.join(target, f"{step}.{time.strftime('%Y%m%d-%H%M%S')}"))
  return target


def step_dirs(directory: str) -> list[int]:
  """The step directories in `directory` (finalized or not), in order."""
  names = os.listdir(directory) if os.path.isdir(directory) else []
  return sorted(int(n.split(".")[0]) for n in names if n.split(".")[0].isdigit())


def discard_uncommitted(directory: str, committed_steps: list[int]) -> list[int]:
  """Deletes step directories newer than the newest committed step: work a failure discarded.

  Call on one process while no generation is saving (before training resumes).
  """
  newest = max(committed_steps, default=-1)
  removed = []
  for name in os.listdir(directory) if os.path.isdir(directory) else []:
    step = name.split(".")[0]
    if step.isdigit() and int(step) > newest:
      shutil.rmtree(os.path.join(directory, name), ignore_errors=True)
      removed.append(int(step))
  return sorted(removed)
