"""Host-local snapshots: the training state every few steps, in host memory, under the checkpoints.

The persistent tier (Orbax checkpoints on shared storage, `medjax.checkpoint`) is written at
partition boundaries: a failure loses the steps since the last one. This tier keeps a copy of the
state every `every_steps` steps in host memory (/dev/shm, a tmpfs, by default): a crashed or
hung worker's replacement on the same host resumes from the newest snapshot instead of the
newest checkpoint (Orbax's emergency checkpointing and Gemini's in-memory checkpoints have the
same two tiers). A snapshot never replaces a checkpoint: it is not committed to the lineage store
and is lost with its host, where recovery falls back to the newest committed checkpoint.

A snapshot is one file per process, `<root>/<run>/<host>/proc-<p>/step-<N>.snap`: a JSON header
(its lineage, the state's layout, each packed vector's dtype and size) and the raw vectors. The
state is packed on its devices as a checkpoint is (`packing.StatePacker`: one copy, which the
next donating step cannot touch); a writer thread copies it to the host and writes it under a
temporary name, then renames it (atomic: a process killed mid-write leaves no partial snapshot),
so training only dispatches the copy. When the writer is still busy with the previous snapshot,
the step is not snapshotted (training never waits); and the interval widens, in powers of two of
`every_steps`, until the writer works at most `duty` of the time (config.ckpt.writer_duty):
where steps are fast and the state large, a writer that never rests slows the loop. A file is
checked for its format and sizes, not checksummed (a checksum cost as much as the write); a
snapshot with non-finite values is caught as any state is, by the loss check at the next metrics
flush.

Restore (`restore`) takes the newest step that every process of the generation holds, whose
lineage was planned under this generation's placement and is newer than the restored checkpoint,
and whose files check out; then every other snapshot of the process is deleted: newer ones are
steps that the restart discards, older ones will not be needed.

Only states whose leaves are all replicated are snapshotted (each process then holds all of it);
fsdp-sharded states keep the persistent tier alone (logged once).

`<run>` is the workdir's path hashed and the lineage store's run id (`run_id`): a new run in the
same workdir (its store deleted) never resumes from an old run's snapshots, and deletes them
(`drop_earlier_runs`). A finished run deletes its own; a killed run that is never resumed leaves
its newest two per process in host memory (`rm -r /dev/shm/medjax-snapshots-<uid>` frees them).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import shutil
import tempfile
import threading
import time
import uuid

import jax
import numpy as np
from jax.experimental import multihost_utils

from medjax import lineage as lineage_lib
from medjax import schema
from medjax.checkpoint import packing

SUFFIX = ".snap"
_MAX_DOUBLINGS = 20   # the widest interval `duty` sets: every_steps * 2**20
_MAGIC = b"MEDJAXSNAP1\n"


def default_base() -> str:
  """/dev/shm (host memory) where there is one, else the temporary directory."""
  shm = "/dev/shm"
  if os.path.isdir(shm) and os.access(shm, os.W_OK):
    return shm
  return tempfile.gettempdir()


# The lineage store's state "snapshots": the run's id (`run_id`), a name in a folder's name.
RUN_STATE = schema.Object({"run": schema.Satisfies(
    schema.STR, lambda run: run.isalnum(), "a run id (letters and digits)")})


def run_id(store: lineage_lib.LineageStore, *, is_chief: bool, barrier) -> str:
  """This run's id, kept in its lineage store (the chief makes it on the first start).

  Raises:
    LineageError: the stored id is damaged (not JSON, or not `RUN_STATE`).
  """
  def read() -> dict | None:
    try:
      return store.get_state("snapshots", RUN_STATE)
    except lineage_lib.LineageError as e:
      raise lineage_lib.LineageError(
          f"{e}; delete it (this run's host-local snapshots are then not resumed from: "
          "training goes on from the newest committed checkpoint)") from None

  try:
    if is_chief and read() is None:
      store.put_state("snapshots", {"run": uuid.uuid4().hex[:12]})
  finally:   # every process reaches the barrier, then reads (and refuses a damaged id) alike
    barrier("snapshot run id")
  return read()["run"]


def user_root(base: str = "") -> str:
  """This user's snapshot folder under `base` (config.ckpt.snapshot_dir or `default_base`):
  every run's root (`run_root`) sits in it."""
  return os.path.join(base or default_base(), f"medjax-snapshots-{os.getuid()}")


def workdir_tag(workdir: str) -> str:
  """What a run root's name starts with for runs in `workdir` (a hash: no path in /dev/shm)."""
  return hashlib.sha256(os.path.abspath(workdir).encode()).hexdigest()[:12]


def run_root(base: str, workdir: str, run: str) -> str:
  """Where one run's snapshots go, under `base` (config.ckpt.snapshot_dir or `default_base`)."""
  return os.path.join(user_root(base), f"{workdir_tag(workdir)}-{run}")


def drop_earlier_runs(root: str) -> list[str]:
  """Deletes the snapshots of earlier runs in the same workdir (`root`'s siblings with the same
  workdir hash): a run killed and then replaced by a new one left them in host memory."""
  parent, name = os.path.split(root)
  prefix = name.split("-")[0] + "-"
  dropped = []
  for other in (os.listdir(parent) if os.path.isdir(parent) else []):
    if other.startswith(prefix) and other != name:
      shutil.rmtree(os.path.join(parent, other), ignore_errors=True)
      dropped.append(other)
  return dropped


def step_files(directory: str) -> list[int]:
  """The steps with a complete snapshot file in `directory`, ascending."""
  try:
    names = os.listdir(directory)
  except OSError:   # none yet, or not a folder we can read
    return []
  steps = []
  for name in names:
    if name.startswith("step-") and name.endswith(SUFFIX):
      try:
        steps.append(int(name[len("step-"):-len(SUFFIX)]))
      except ValueError:
        pass
  return sorted(steps)


class Snapshots:
  """One process's snapshots.

  Args:
    root: the run's root (`run_root`); this process writes `<root>/<host>/proc-<process>`.
    host, process: this process's host and jax process index.
    every_steps: snapshot global steps that are multiples of it (0: never).
    keep: snapshot files kept (the newest).
    packer: the state packer to use (one the trainer warmed, shared with its checkpoints); None:
      a new one.
  """

  def __init__(self, root: str, *, host: str, process: int, every_steps: int, keep: int = 2,
               packer: packing.StatePacker | None = None, duty: float = 1.0,
               clock=time.perf_counter):
    self.root = root
    self.directory = os.path.join(root, host, f"proc-{process}") if root else ""
    self.every_steps, self.keep = int(every_steps), max(int(keep), 1)
    self.duty, self._clock = min(max(float(duty), 1e-6), 1.0), clock
    self.stride = self.every_steps   # steps between snapshots now (`_adapt`)
    self._last: tuple[int, float] | None = None   # the last snapshot's (step, time)
    self._last_write_s = 0.0
    self.written = self.skipped = 0
    self.write_s = 0.0
    self._packer = packer or packing.StatePacker()
    self._checked = ""   # the layout whose leaves were checked (all replicated)
    self._unsupported = False
    self._queue: queue.Queue = queue.Queue(maxsize=1)
    self._error: BaseException | None = None
    self._thread: threading.Thread | None = None
    if self.every_steps > 0:
      try:
        os.makedirs(self.directory, exist_ok=True)
      except OSError as e:   # e.g. config.ckpt.snapshot_dir not writable: training goes on
        logging.warning("snapshots: cannot write %s (%s); recovery uses the checkpoints alone "
                        "(config.ckpt.snapshot_dir sets where they go)", self.directory, e)
        return
      self._thread = threading.Thread(target=self._write_loop, name="snapshot-writer",
                                      daemon=True)
      self._thread.start()

  # -- writing ---------------------------------------------------------------------------------

  def due(self, global_step: int) -> bool:
    return self._thread is not None and global_step % self.stride == 0

  def _adapt(self, global_step: int) -> None:
    """Sets `stride`: the smallest power-of-two multiple of `every_steps` at which the last
    write's seconds are at most `duty` of the seconds between snapshots, at the steps' pace
    since the last one. On a GPU the paper's state (380 MB) took 0.45 s to write against 9 ms
    steps: every 4 steps the writer never stopped, and the loop ran at 0.24 of the step's speed
    beside it and the checkpoint writer, 0.56 without it (experiments/results/gpu_h100_loop).
    Powers of two keep the processes' strides nested, so that they still share snapshot steps
    when their measurements differ (`restore` takes a step every process holds). A duty of 1:
    every `every_steps`."""
    if self.duty >= 1.0:
      return
    now = self._clock()
    if self._last is not None and global_step > self._last[0] and self._last_write_s > 0:
      step_s = (now - self._last[1]) / (global_step - self._last[0])
      need = self._last_write_s / max(self.duty * step_s * self.every_steps, 1e-12)
      self.stride = self.every_steps * (1 << min(max(int(np.ceil(np.log2(max(need, 1.0)))),
                                                     0), _MAX_DOUBLINGS))
    self._last = (global_step, now)

  def save(self, state, lineage: lineage_lib.Lineage) -> bool:
    """Dispatches the copy of `state` at `lineage.global_step` and hands it to the writer;
    False (nothing done) when the writer is still busy or the state cannot be snapshotted."""
    if self._thread is None or self._unsupported:
      return False
    if self._error is not None:
      logging.warning("snapshots: writing failed (%r); the checkpoints alone go on",
                      self._error)
      self._unsupported = True
      return False
    self._adapt(lineage.global_step)
    if self._queue.full() or (self.duty < 1.0 and self._queue.unfinished_tasks):
      # Still writing: one waits at most (duty 1), else none, and the interval doubles (the
      # writer is behind before its first write has been measured).
      self.skipped += 1
      if self.duty < 1.0:
        self.stride = min(self.stride * 2, self.every_steps << _MAX_DOUBLINGS)
      return False
    packed = self._packer(state)
    layout_json = self._packer.layout_json
    if layout_json != self._checked:
      self._checked = layout_json
      if any(e["group"] is None for e in self._packer.layout["leaves"]):
        logging.info("snapshots: the state has sharded (fsdp) leaves; host-local snapshots are "
                     "off, recovery uses the checkpoints")
        self._unsupported = True
        return False
    self._queue.put_nowait((packed["packed"], layout_json, lineage))
    return True

  def _write_loop(self) -> None:
    while True:
      item = self._queue.get()
      try:
        if item is None:
          return
        t0 = time.perf_counter()
        self._write(*item)
        self._last_write_s = time.perf_counter() - t0
        self.write_s += self._last_write_s
        self.written += 1
      except BaseException as e:  # pylint: disable=broad-except  (reported by the next save)
        self._error = e
      finally:
        self._queue.task_done()

  def _write(self, packed: dict, layout_json: str, lineage: lineage_lib.Lineage) -> None:
    # Waits for the copy with the GIL released; converting an array that is not ready yet waits
    # holding it, and the training thread could not dispatch the steps meanwhile.
    jax.block_until_ready(packed)
    arrays = {g: np.asarray(x.addressable_data(0)) for g, x in sorted(packed.items())}
    groups = [{"name": g, "dtype": str(a.dtype), "size": int(a.size)}
              for g, a in arrays.items()]
    header = json.dumps({"lineage": lineage.to_dict(), "layout": layout_json,
                         "groups": groups}).encode()
    final = self._path(lineage.global_step)
    tmp = final + ".tmp"
    # The oldest snapshot's file is written over (renamed first, so it no longer counts):
    # writing into a tmpfs file's pages took a fifth of the time of allocating new ones.
    held = step_files(self.directory)
    if len(held) >= self.keep:
      os.replace(self._path(held[0]), tmp)
    with open(tmp, "r+b" if os.path.exists(tmp) else "wb") as f:
      f.write(_MAGIC)
      f.write(len(header).to_bytes(8, "little"))
      f.write(header)
      for a in arrays.values():
        f.write(memoryview(a).cast("B"))
      f.truncate()
    os.replace(tmp, final)
    for old in step_files(self.directory)[:-self.keep]:
      _remove(self._path(old))

  def _path(self, step: int) -> str:
    return os.path.join(self.directory, f"step-{step}{SUFFIX}")

  def counters(self) -> dict:
    """summary.json's train.snapshots: the interval (configured, and the last one `duty` set),
    snapshots written and skipped (the writer was busy), and the writer's seconds."""
    return {"every_steps": self.every_steps, "stride": self.stride, "written": self.written,
            "skipped": self.skipped, "write_s": round(self.write_s, 3)}

  def wait(self) -> None:
    """Until the writer has written what it was handed."""
    if self._thread is not None:
      self._queue.join()

  def close(self, *, remove: bool) -> None:
    """Stops the writer; `remove` (a finished run): deletes the run's snapshots on this host,
    every process's and host's (the processes of a finished run have all finished training;
    hosts that left the run earlier left theirs here too, when they shared this machine)."""
    if self._thread is not None:
      self._queue.join()
      self._queue.put(None)
      self._thread.join()
      self._thread = None
    if remove and self.root:
      shutil.rmtree(self.root, ignore_errors=True)

  # -- restoring -------------------------------------------------------------------------------

  def restore(self, abstract_state, *, after_step: int, placement: str):
    """(state, lineage, step) from the newest snapshot newer than `after_step` (the restored
    checkpoint's step, -1 for none) that every process holds and planned under `placement`;
    None when there is none. A collective: every process calls it. Deletes this process's other
    snapshots either way."""
    if self.every_steps <= 0:
      return None   # off (every process of the run has the same config: none asks the others)
    steps = [s for s in step_files(self.directory) if s > after_step]
    usable = []
    for step in reversed(steps):
      try:
        loaded = self._read(step)
      except (OSError, ValueError, KeyError, lineage_lib.LineageError) as e:
        logging.warning("snapshot %d in %s is damaged (%s); trying an older one", step,
                        self.directory, e)
        continue
      if loaded[1].segment.placement != placement:
        continue   # planned for another host set: the checkpoints' re-planning applies
      usable.append((step, loaded))
    chosen = _agreed([s for s, _ in usable], self.keep + 1)
    loaded = dict(usable).get(chosen) if chosen is not None else None
    result = None
    if loaded is not None:
      arrays, lineage, layout_json = loaded
      try:
        result = (self._unpack(arrays, layout_json, abstract_state, chosen), lineage, chosen)
      except ValueError as e:   # the same on every process: they all fall back
        logging.warning("snapshot %d not restored: %s (another model config?); the checkpoints "
                        "decide", chosen, e)
        chosen = None
    for step in step_files(self.directory):
      if step != chosen:
        _remove(self._path(step))
    if result is not None:
      logging.info("snapshot: restored step %d from host memory (%s)", chosen, self.directory)
    return result

  def _read(self, step: int):
    with open(self._path(step), "rb") as f:
      data = f.read()
    if not data.startswith(_MAGIC):
      raise ValueError("not a medjax snapshot")
    at = len(_MAGIC)
    size = int.from_bytes(data[at:at + 8], "little")
    header = json.loads(data[at + 8:at + 8 + size])
    at += 8 + size
    _check_header(header)
    arrays = {}
    for g in header["groups"]:
      dtype = np.dtype(g["dtype"])
      end = at + g["size"] * dtype.itemsize
      if end > len(data):
        raise ValueError(f"truncated ({len(data)} bytes)")
      arrays[g["name"]] = np.frombuffer(memoryview(data)[at:end], dtype)
      at = end
    if at != len(data):
      raise ValueError(f"{len(data) - at} bytes more than its header describes")
    return arrays, lineage_lib.Lineage.from_dict(header["lineage"]), header["layout"]

  def _unpack(self, arrays: dict, layout_json: str, abstract_state, step: int):
    """The state from the packed host vectors, leaf by leaf onto the targets' shardings (on the
    host: a compiled unpacking cost a compilation, 0.75 s, at the first restore of a process)."""
    paths_and_targets, treedef = jax.tree_util.tree_flatten_with_path(abstract_state)
    entries = json.loads(layout_json)["leaves"]
    if [e["path"] for e in entries] != [jax.tree_util.keystr(p) for p, _ in paths_and_targets]:
      raise ValueError(f"snapshot {step} holds another state structure")
    for e, (_, target) in zip(entries, paths_and_targets):
      if tuple(e["shape"]) != tuple(target.shape) or e["dtype"] != str(target.dtype):
        raise ValueError(f"snapshot {step} holds another state structure ({e['path']}: "
                         f"{e['dtype']}{e['shape']}, not {target.dtype}{list(target.shape)})")
    leaves = packing.unpack_on_host(arrays, entries, [t for _, t in paths_and_targets])
    return treedef.unflatten(leaves)


_DTYPE = schema.Satisfies(schema.STR, lambda name: str(np.dtype(name)) == name,
                         "a dtype's name")
# A snapshot file's JSON header (`Snapshots._write`): the lineage (checked by
# `Lineage.from_dict`), the packing layout as JSON text (`packing.state_layout`; every leaf of a
# snapshot is packed in a group), each packed vector's name, dtype and length.
_HEADER = schema.Object({
    "lineage": schema.ANY, "layout": schema.STR,
    "groups": schema.List(schema.Object({"name": schema.STR, "dtype": _DTYPE,
                                         "size": schema.COUNT}))})
_LAYOUT = schema.Object({"leaves": schema.List(schema.Object({
    "path": schema.STR, "shape": schema.List(schema.COUNT), "dtype": _DTYPE,
    "group": schema.STR, "offset": schema.COUNT}))})


def _check_header(header) -> None:
  """A snapshot header of the shape `_write` writes, whose layout's leaves lie inside their
  packed vectors (ValueError naming what is wrong: the snapshot is damaged)."""
  schema.check(header, _HEADER)
  layout = schema.check(json.loads(header["layout"]), _LAYOUT, "layout")
  groups = {g["name"]: g for g in header["groups"]}
  for i, leaf in enumerate(layout["leaves"]):
    group = groups.get(leaf["group"])
    end = leaf["offset"] + int(np.prod(leaf["shape"], dtype=np.int64))
    if group is None or group["dtype"] != leaf["dtype"] or end > group["size"]:
      raise schema.SchemaError(f"layout.leaves[{i}]", f"({leaf['path']}) is not inside a "
                               "packed vector of its dtype")


def _agreed(steps: list[int], width: int) -> int | None:
  """The newest of `steps` that every process has (a collective with several processes)."""
  if jax.process_count() == 1:
    return max(steps) if steps else None
  mine = np.full(width, -1, np.int32)
  newest = sorted(steps)[-width:]
  mine[:len(newest)] = newest
  every = np.asarray(multihost_utils.process_allgather(mine))
  common = set(every[0].tolist())
  for row in every[1:]:
    common &= set(row.tolist())
  common.discard(-1)
  return max(common) if common else None


def _remove(path: str) -> None:
  try:
    os.remove(path)
  except FileNotFoundError:
    pass


def open_for_run(ckpt_config, workdir: str, host: str, store: lineage_lib.LineageStore, *,
                 is_chief: bool, barrier, packer: packing.StatePacker) -> Snapshots:
  """This process's host-local snapshots (config.ckpt.snapshot_every_steps; 0: none), in a
  folder of this run's (earlier runs' folders in the same place are dropped)."""
  every = int(ckpt_config.get("snapshot_every_steps", 0))
  root = ""
  if every:
    root = run_root(ckpt_config.get("snapshot_dir", ""), workdir,
                    run_id(store, is_chief=is_chief, barrier=barrier))
    drop_earlier_runs(root)
  return Snapshots(root, host=host, process=jax.process_index(), every_steps=every,
                   packer=packer, duty=float(ckpt_config.get("writer_duty", 1.0)))
