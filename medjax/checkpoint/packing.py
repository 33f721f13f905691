"""Packing: a training state as one vector per dtype, the unit Orbax and the snapshots save.

Orbax's cost is per array (about 1.3 ms each on CPU: a 138-leaf state took 200 ms a save, one
array of the same size 20 ms), so replicated leaves are raveled and packed into one vector per
dtype; sharded (fsdp) leaves are saved as they are. The packing (`layout`, saved beside the state)
records each leaf's path, place, shape and dtype; restore unpacks onto the target's shardings,
whatever the device and process count.
"""

from __future__ import annotations

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np

from medjax import programs


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
