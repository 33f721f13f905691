"""Checkpoints and lineage commits: real Orbax files, damage, retention, the lineage store."""

import dataclasses
import glob
import logging
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from medjax import lineage
from medjax.checkpoint import checkpointer
from medjax.checkpoint import packing
from medjax.checkpoint import restore
from medjax.checkpoint import retention


def _state(value: float):
  return {"params": {"w": jnp.full((4, 3), value), "b": jnp.full((3,), value)},
          "step": jnp.asarray(int(value), jnp.int32)}


def _abstract():
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                     sharding=jax.sharding.SingleDeviceSharding(
                                                         jax.devices()[0])), _state(0.0))


def _lineage(step, partition=None):
  start = lineage.Lineage.start(epoch=0, global_step=step, seed=0, placement="p", hosts=("h",),
                                base_N=np.zeros(10, bool))
  return dataclasses.replace(start, partition=step if partition is None else partition)


def _save_and_commit(directory, store, steps):
  ckpt = checkpointer.Checkpointer(directory)
  for step in steps:
    ckpt.save(_state(float(step)), _lineage(step))
    ckpt.wait()
    for saved in ckpt.finalized():
      store.commit(saved, committed_at=1.0)
  ckpt.close()


def test_restore_takes_newest_committed_and_skips_uncommitted(tmp_path):
  store = lineage.LineageStore(str(tmp_path / "lineage"))
  directory = str(tmp_path / "ckpt")
  _save_and_commit(directory, store, [1, 2])
  ckpt = checkpointer.Checkpointer(directory)
  ckpt.save(_state(3.0), _lineage(3))
  ckpt.close()  # finalized by Orbax, never committed
  state, saved, step = restore.restore_committed(directory, store, _abstract())
  assert step == 2 and saved.partition == 2 and saved == _lineage(2)
  np.testing.assert_array_equal(np.asarray(state["params"]["w"]), 2.0)
  assert retention.discard_uncommitted(directory, store.committed_steps()) == [3]


@pytest.mark.parametrize("damage", ["truncate", "delete"])
def test_damaged_newest_checkpoint_falls_back_to_previous(tmp_path, caplog, damage):
  store = lineage.LineageStore(str(tmp_path / "lineage"))
  directory = str(tmp_path / "ckpt")
  _save_and_commit(directory, store, [1, 2])
  files = [f for f in glob.glob(os.path.join(directory, "2", "state", "**", "*"), recursive=True)
           if os.path.isfile(f) and os.path.getsize(f) > 0 and "d/" in f.replace(os.sep, "/")]
  assert files, os.listdir(os.path.join(directory, "2", "state"))
  for f in files:
    if damage == "truncate":
      with open(f, "r+b") as fh:
        fh.truncate(os.path.getsize(f) // 3)
    else:
      os.remove(f)
  with caplog.at_level(logging.WARNING):
    state, _, step = restore.restore_committed(directory, store, _abstract())
  assert step == 1
  np.testing.assert_array_equal(np.asarray(state["params"]["b"]), 1.0)
  assert "checkpoint 2 is damaged or incomplete" in caplog.text


def test_lineage_disagreement_is_not_trusted(tmp_path, caplog):
  store = lineage.LineageStore(str(tmp_path / "lineage"))
  directory = str(tmp_path / "ckpt")
  _save_and_commit(directory, store, [1, 2])
  store.commit(_lineage(2, partition=99), committed_at=2.0)
  with caplog.at_level(logging.WARNING):
    _, _, step = restore.restore_committed(directory, store, _abstract())
  assert step == 1 and "disagrees with the lineage store" in caplog.text


def test_retention_keeps_newest_committed(tmp_path):
  store = lineage.LineageStore(str(tmp_path / "lineage"))
  directory = str(tmp_path / "ckpt")
  _save_and_commit(directory, store, [1, 2, 3, 4])
  removed = retention.prune(directory, store.committed_steps(), keep=2)
  assert removed == [1, 2]
  assert sorted(int(d) for d in os.listdir(directory) if d.isdigit()) == [3, 4]


def test_lineage_store_bitmap_round_trip(tmp_path):
  bits = np.random.default_rng(0).random(1001) < 0.3
  np.testing.assert_array_equal(lineage.unpack_bitmap(lineage.pack_bitmap(bits), 1001), bits)
  store = lineage.LineageStore(str(tmp_path / "l"))
  assert store.latest() is None and store.committed_steps() == []
  store.commit(_lineage(7), committed_at=1.0)
  store.commit(_lineage(12), committed_at=2.0)
  assert store.committed_steps() == [7, 12] and store.latest() == _lineage(12)
  store.put_state("coordinator", {"generation": 3})
  assert store.get_state("coordinator") == {"generation": 3}


def test_states_of_one_layout_are_laid_out_once_and_another_shape_anew(monkeypatch):
  """A run's saves pack states of one layout: worked out at the first, then only the packing
  program runs; a state of other shapes (the same structure) is caught where the program is
  traced again, and packed by a layout of its own."""
  calls = []
  real = packing.state_layout
  monkeypatch.setattr(packing, "state_layout", lambda state: calls.append(1) or real(state))
  packer = packing.StatePacker()
  for value in (1.0, 2.0, 3.0):
    packed = packer(_state(value))
    np.testing.assert_array_equal(np.asarray(packed["packed"]["float32"]),
                                  np.full(15, value, np.float32))
  assert len(calls) == 1
  wider = {"params": {"w": jnp.full((4, 5), 7.0), "b": jnp.full((5,), 7.0)},
           "step": jnp.asarray(7, jnp.int32)}
  packed = packer(wider)
  assert len(calls) == 2
  assert [e["shape"] for e in packer.layout["leaves"]] == [[5], [4, 5], []]
  np.testing.assert_array_equal(np.asarray(packed["packed"]["float32"]),
                                np.full(25, 7.0, np.float32))


def test_a_packer_warmed_on_the_abstract_state_saves_without_laying_it_out_again(
    tmp_path, monkeypatch):
  """The trainer warms one packer on the state's shapes and shardings and hands it to its
  checkpoints and snapshots: their first save packs by that layout instead of working it out."""
  packer = packing.StatePacker()
  packer.warm(_abstract())
  calls = []
  real = packing.state_layout
  monkeypatch.setattr(packing, "state_layout", lambda state: calls.append(1) or real(state))
  store = lineage.LineageStore(str(tmp_path / "lineage"))
  directory = str(tmp_path / "ckpt")
  ckpt = checkpointer.Checkpointer(directory, packer=packer)
  ckpt.save(jax.device_put(_state(5.0), jax.devices()[0]), _lineage(5))
  ckpt.wait()
  for saved in ckpt.finalized():
    store.commit(saved, committed_at=1.0)
  ckpt.close()
  assert calls == []
  state, _, step = restore.restore_committed(directory, store, _abstract())
  assert step == 5
  np.testing.assert_array_equal(np.asarray(state["params"]["w"]), 5.0)


def test_a_primed_packer_packs_the_first_save_from_jits_own_cache():
  """Warming compiles the packing program, but jax.jit fills its dispatch cache only at a call:
  the trainer primes the packer on its first state, so the first save only dispatches."""
  device = jax.devices()[0]
  state = lambda v: jax.device_put({"w": jnp.full((3, 7), v, jnp.float32), "step": jnp.int32(v)},
                                   device)
  packer = packing.StatePacker()
  # Shapes of this test's own: the packing programs of one layout are shared (lru_cache).
  packer.warm(jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                           state(0)))
  assert packer._pack._cache_size() == 0   # pylint: disable=protected-access
  packer.prime(state(2))
  assert packer._pack._cache_size() == 1   # pylint: disable=protected-access
  packed = packer(state(3))
  assert packer._pack._cache_size() == 1   # pylint: disable=protected-access
  np.testing.assert_array_equal(np.asarray(packed["packed"]["float32"]),
                                np.full(21, 3.0, np.float32))


def test_on_cpu_the_pack_is_costed_to_run_off_the_training_thread():
  """XLA:CPU runs programs it estimates under 1000 flops inline on the dispatching thread, and a
  copy of any size counts none: the packing program carries a partial sum that puts it over."""
  state = {"w": jnp.ones((64, 100)), "step": jnp.int32(1)}
  packer = packing.StatePacker()
  packed = packer(state)
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                          state)
  costs = packer._pack.lower(abstract).compile().cost_analysis()   # pylint: disable=protected-access
  assert costs["flops"] >= 1000, costs
  np.testing.assert_array_equal(np.asarray(packed["packed"]["float32"]), np.ones(6400))
  np.testing.assert_array_equal(np.asarray(packed["packed"]["int32"]), [1])


def test_a_changed_state_structure_gets_its_own_layout(tmp_path):
  """The saver keeps the last state's layout; another structure or sharding is laid out anew."""
  mesh = jax.make_mesh((8,), ("fsdp",))
  sharded = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("fsdp"))
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  directory = str(tmp_path / "ckpt")
  ckpt = checkpointer.Checkpointer(directory)
  first = jax.device_put(_state(1.0), replicated)
  second = jax.device_put({**_state(2.0), "extra": jnp.arange(8.0)}, replicated)
  third = {**second, "extra": jax.device_put(jnp.arange(8.0) + 1, sharded)}
  for step, state in ((1, first), (2, second), (3, third), (4, first)):
    ckpt.save(state, _lineage(step))
    ckpt.wait()   # each one written (a save waiting for the writer is replaced by the next)
  groups = {step: [e["group"] for e in ckpt.layout(step)["leaves"]] for step in (1, 2, 3, 4)}
  assert groups[1] == groups[4] == ["float32", "float32", "int32"]
  assert groups[2] == ["float32", "float32", "float32", "int32"]
  assert groups[3] == [None, "float32", "float32", "int32"]   # 'extra' sharded: saved as it is
  for step, state in ((2, second), (3, third), (4, first)):
    target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                          state)
    restored = ckpt.restore(step, target)
    for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(state)):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  ckpt.close()


def test_packed_state_restores_onto_other_shardings(tmp_path):
  mesh = jax.make_mesh((8,), ("fsdp",))
  sharded = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("fsdp"))
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  state = {"w": jax.device_put(jnp.arange(16.0).reshape(8, 2), sharded),
           "b": jax.device_put(jnp.arange(3.0), replicated),
           "c": jax.device_put(jnp.full((8,), 7.0), replicated),
           "step": jax.device_put(jnp.asarray(5, jnp.int32), replicated)}
  directory = str(tmp_path / "ckpt")
  ckpt = checkpointer.Checkpointer(directory)
  ckpt.save(state, _lineage(1))
  ckpt.wait()
  layout = ckpt.layout(1)
  ckpt.close()
  # Replicated leaves share one vector per dtype; the sharded one is saved as it is.
  assert layout["sizes"] == {"float32": 11, "int32": 1}
  assert [e["group"] for e in layout["leaves"]] == ["float32", "float32", "int32", None]
  # Each leaf comes back with another sharding than it was saved with.
  target = {"w": jax.ShapeDtypeStruct((8, 2), jnp.float32, sharding=replicated),
            "b": jax.ShapeDtypeStruct((3,), jnp.float32, sharding=replicated),
            "c": jax.ShapeDtypeStruct((8,), jnp.float32, sharding=sharded),
            "step": jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated)}
  restored = checkpointer.Checkpointer(directory, async_save=False).restore(1, target)
  for k in state:
    np.testing.assert_array_equal(np.asarray(restored[k]), np.asarray(state[k]))
    assert restored[k].sharding == target[k].sharding
  arrays, step = checkpointer.load_arrays(directory)
  assert step == 1 and sorted(arrays) == ["['b']", "['c']", "['step']", "['w']"]
  np.testing.assert_array_equal(arrays["['w']"], np.arange(16.0).reshape(8, 2))
  with pytest.raises(ValueError, match="another state structure"):
    checkpointer.Checkpointer(directory, async_save=False).restore(1, {"w": target["w"]})
