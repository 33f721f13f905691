"""Checkpoints and lineage commits: real Orbax files, damage, retention, the lineage store."""

import glob
import logging
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from medjax import checkpoint
from medjax import lineage


def _state(value: float):
  return {"params": {"w": jnp.full((4, 3), value), "b": jnp.full((3,), value)},
          "step": jnp.asarray(int(value), jnp.int32)}


def _abstract():
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                     sharding=jax.sharding.SingleDeviceSharding(
                                                         jax.devices()[0])), _state(0.0))


def _save_and_commit(directory, store, steps):
  ckpt = checkpoint.Checkpointer(directory)
  for step in steps:
    record = {"global_step": step, "epoch": 0, "partition": step, "offset": 0}
    ckpt.save(step, _state(float(step)), record)
    ckpt.wait()
    for _, saved in ckpt.finalized():
      store.commit(dict(saved, committed_at=1.0))
  ckpt.close()


def test_restore_takes_newest_committed_and_skips_uncommitted(tmp_path):
  store = lineage.LineageStore(str(tmp_path / "lineage"))
  directory = str(tmp_path / "ckpt")
  _save_and_commit(directory, store, [1, 2])
  ckpt = checkpoint.Checkpointer(directory)
  ckpt.save(3, _state(3.0), {"global_step": 3, "epoch": 0, "partition": 3, "offset": 0})
  ckpt.close()  # finalized by Orbax, never committed
  state, saved, step = checkpoint.restore_committed(directory, store, _abstract())
  assert step == 2 and saved["partition"] == 2
  np.testing.assert_array_equal(np.asarray(state["params"]["w"]), 2.0)
  assert checkpoint.discard_uncommitted(directory, store.committed_steps()) == [3]


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
    state, _, step = checkpoint.restore_committed(directory, store, _abstract())
  assert step == 1
  np.testing.assert_array_equal(np.asarray(state["params"]["b"]), 1.0)
  assert "checkpoint 2 is damaged or incomplete" in caplog.text


def test_lineage_disagreement_is_not_trusted(tmp_path, caplog):
  store = lineage.LineageStore(str(tmp_path / "lineage"))
  directory = str(tmp_path / "ckpt")
  _save_and_commit(directory, store, [1, 2])
  store.commit({"global_step": 2, "epoch": 0, "partition": 99, "offset": 0})
  with caplog.at_level(logging.WARNING):
    _, _, step = checkpoint.restore_committed(directory, store, _abstract())
  assert step == 1 and "disagrees with the lineage store" in caplog.text


def test_retention_keeps_newest_committed(tmp_path):
  store = lineage.LineageStore(str(tmp_path / "lineage"))
  directory = str(tmp_path / "ckpt")
  _save_and_commit(directory, store, [1, 2, 3, 4])
  removed = checkpoint.prune(directory, store.committed_steps(), keep=2)
  assert removed == [1, 2]
  assert sorted(int(d) for d in os.listdir(directory) if d.isdigit()) == [3, 4]


def test_lineage_store_bitmap_round_trip(tmp_path):
  bits = np.random.default_rng(0).random(1001) < 0.3
  np.testing.assert_array_equal(lineage.unpack_bitmap(lineage.pack_bitmap(bits), 1001), bits)
  store = lineage.LineageStore(str(tmp_path / "l"))
  assert store.latest() is None and store.committed_steps() == []
  store.commit({"global_step": 7, "x": 1})
  store.commit({"global_step": 12, "x": 2})
  assert store.committed_steps() == [7, 12] and store.latest()["x"] == 2
  store.put_state("coordinator", {"generation": 3})
  assert store.get_state("coordinator") == {"generation": 3}
