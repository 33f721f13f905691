"""Host-local snapshots (medjax.checkpoint.snapshots): real files, written by the writer thread, restored,
rotated, damaged. tests/test_fault.py restores from them after real crashes and hangs."""

import dataclasses
import glob
import json
import logging
import os
import re
import signal
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from medjax import lineage
from medjax.checkpoint import checkpointer
from medjax.checkpoint import snapshots
from tests import runs


def _state(value: float, sharding=None):
  state = {"params": {"w": jnp.full((4, 3), value), "b": jnp.full((3,), value)},
           "opt": {"count": jnp.asarray(int(value), jnp.int32)}}
  return jax.device_put(state, sharding) if sharding is not None else state


def _abstract(state):
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                      state)


def _lineage(step, placement="p"):
  start = lineage.Lineage.start(epoch=0, global_step=step, seed=0, placement=placement,
                                hosts=("h",), base_N=np.zeros(10, bool))
  return dataclasses.replace(start, offset=step % 5)


def _snapshots(tmp_path, every=1, keep=2):
  return snapshots.Snapshots(str(tmp_path / "run"), host="host-0", process=0, every_steps=every,
                             keep=keep)


def _save(snaps, steps, sharding=None):
  for step in steps:
    assert snaps.save(_state(float(step), sharding), _lineage(step))
    snaps.wait()


def test_restores_the_newest_snapshot_and_deletes_the_others(tmp_path):
  snaps = _snapshots(tmp_path, keep=2)
  _save(snaps, [2, 4, 6, 8])
  # Two kept; the file of the oldest was written over, not left behind.
  assert snapshots.step_files(snaps.directory) == [6, 8]
  assert sorted(os.listdir(snaps.directory)) == ["step-6.snap", "step-8.snap"]
  assert snaps.counters() == {"every_steps": 1, "stride": 1, "written": 4, "skipped": 0,
                              "write_s": pytest.approx(snaps.write_s, abs=1e-3)}
  state, saved, step = snaps.restore(_abstract(_state(0.0)), after_step=5, placement="p")
  assert step == 8 and saved == _lineage(8)
  np.testing.assert_array_equal(np.asarray(state["params"]["w"]), 8.0)
  assert int(state["opt"]["count"]) == 8 and state["opt"]["count"].dtype == jnp.int32
  # The one restored stays (a second failure before the next snapshot needs it again).
  assert snapshots.step_files(snaps.directory) == [8]
  snaps.close(remove=True)
  assert not os.path.exists(snaps.root)


def test_a_checkpoint_as_new_wins_and_the_snapshots_are_dropped(tmp_path):
  snaps = _snapshots(tmp_path)
  _save(snaps, [3, 4])
  assert snaps.restore(_abstract(_state(0.0)), after_step=4, placement="p") is None
  assert snapshots.step_files(snaps.directory) == []


def test_another_placement_is_not_resumed_from(tmp_path):
  """A snapshot planned for another host set: the checkpoint's re-planning applies instead."""
  snaps = _snapshots(tmp_path)
  _save(snaps, [4])
  assert snaps.restore(_abstract(_state(0.0)), after_step=-1, placement="other") is None


@pytest.mark.parametrize("damage", ["truncate", "garbage", "longer"])
def test_a_damaged_snapshot_falls_back_to_the_previous_one(tmp_path, caplog, damage):
  snaps = _snapshots(tmp_path)
  _save(snaps, [4, 6])
  path = os.path.join(snaps.directory, "step-6.snap")
  size = os.path.getsize(path)
  if damage == "truncate":
    os.truncate(path, size - 100)
  elif damage == "garbage":
    with open(path, "r+b") as f:
      f.write(b"\x00" * 64)
  else:
    with open(path, "ab") as f:
      f.write(b"\x00" * 8)
  with caplog.at_level(logging.WARNING):
    _, saved, step = snaps.restore(_abstract(_state(0.0)), after_step=-1, placement="p")
  assert step == 4 and saved.global_step == 4
  assert "snapshot 6" in caplog.text and "damaged" in caplog.text
  assert snapshots.step_files(snaps.directory) == [4]


def _rewrite_header(path: str, change) -> None:
  """Rewrites a snapshot file's header through `change(header, layout)` (the layout parsed from
  its JSON string, written back unless `change` replaced it), its vectors kept."""
  def with_layout(header):
    original = header["layout"]
    layout = json.loads(original)
    change(header, layout)
    if header.get("layout") == original:   # (unless `change` replaced it)
      header["layout"] = json.dumps(layout)
  runs.rewrite_snapshot_header(path, with_layout)


def _leaf(layout, path="['params']['w']"):
  return next(e for e in layout["leaves"] if e["path"] == path)


@pytest.mark.parametrize("change, problem", [
    (lambda h, l: h.update(groups={"float32": 15}), "field 'groups'"),
    (lambda h, l: h["groups"][0].update(size="15"), "field 'groups[0].size'"),
    (lambda h, l: h["groups"][0].update(size=-1), "field 'groups[0].size'"),
    (lambda h, l: h["groups"][0].update(dtype="float99"), "field 'groups[0].dtype'"),
    (lambda h, l: h["groups"][0].update(dtype=32), "field 'groups[0].dtype'"),
    (lambda h, l: h["groups"][0].pop("name"), "field 'groups[0].name'"),
    (lambda h, l: h.update(layout={"leaves": []}), "field 'layout'"),
    (lambda h, l: h.pop("layout"), "field 'layout'"),
    (lambda h, l: l.update(leaves="all"), "field 'layout.leaves'"),
    (lambda h, l: _leaf(l).update(shape=[4, "3"]), "field 'layout.leaves[2].shape[1]'"),
    (lambda h, l: _leaf(l).update(offset=-3), "field 'layout.leaves[2].offset'"),
    (lambda h, l: _leaf(l).update(group=None), "field 'layout.leaves[2].group'"),
    (lambda h, l: _leaf(l).update(group="float64"), "field 'layout.leaves[2]'"),  # no such vector
    (lambda h, l: _leaf(l).update(offset=10**6), "field 'layout.leaves[2]'"),     # past its vector
    (lambda h, l: h["lineage"].update(global_step="6"), "lineage field 'global_step'"),
    (lambda h, l: h["lineage"]["segment"].update(hosts=[0]), "lineage field 'segment.hosts[0]'"),
    (lambda h, l: h.update(lineage=[6]), "lineage record is a list"),
])
def test_a_snapshot_header_of_another_shape_falls_back_to_the_previous_one(tmp_path, caplog,
                                                                          change, problem):
  snaps = _snapshots(tmp_path)
  _save(snaps, [4, 6])
  _rewrite_header(os.path.join(snaps.directory, "step-6.snap"), change)
  with caplog.at_level(logging.WARNING):
    state, saved, step = snaps.restore(_abstract(_state(0.0)), after_step=-1, placement="p")
  assert step == 4 and saved.global_step == 4
  np.testing.assert_array_equal(np.asarray(state["params"]["w"]), 4.0)
  warning = next(r.getMessage() for r in caplog.records if "snapshot 6" in r.getMessage())
  assert f"is damaged ({problem}" in warning, warning
  assert snapshots.step_files(snaps.directory) == [4]


def test_another_state_structure_is_not_restored(tmp_path, caplog):
  """A rerun with another model config in the same workdir: the checkpoints decide."""
  snaps = _snapshots(tmp_path)
  _save(snaps, [4])
  other = {"params": {"w": jnp.zeros((4, 3))}}
  with caplog.at_level(logging.WARNING):
    assert snaps.restore(_abstract(other), after_step=-1, placement="p") is None
  assert "another state structure" in caplog.text


def test_a_busy_writer_skips_the_step_and_training_does_not_wait(tmp_path, monkeypatch):
  snaps = _snapshots(tmp_path)
  writing, release = threading.Event(), threading.Event()
  write = snaps._write
  monkeypatch.setattr(snaps, "_write",
                      lambda *a: (writing.set(), release.wait(10), write(*a)))
  assert snaps.save(_state(1.0), _lineage(1))
  assert writing.wait(10)
  # The writer is busy with step 1: step 2 waits in the queue, step 3 finds it full.
  assert [snaps.save(_state(float(s)), _lineage(s)) for s in (2, 3)] == [True, False]
  assert snaps.skipped == 1
  release.set()
  snaps.wait()
  assert snapshots.step_files(snaps.directory) == [1, 2]
  snaps.close(remove=True)


def test_every_steps_says_which_steps_are_due(tmp_path):
  snaps = _snapshots(tmp_path, every=4)
  assert [s for s in range(1, 13) if snaps.due(s)] == [4, 8, 12]
  off = snapshots.Snapshots("", host="h", process=0, every_steps=0)
  assert not off.due(4) and off.save(_state(1.0), _lineage(4)) is False
  assert off.restore(_abstract(_state(0.0)), after_step=-1, placement="p") is None
  off.close(remove=False)


def test_the_interval_widens_until_the_writer_works_at_most_its_duty(tmp_path):
  """Steps of 10 ms, writes of (pretended) 0.5 s, every 4 steps, a duty of 5%: the writer may
  write 0.5 s per 10 s, i.e. every 1000 steps; the stride is the smallest power-of-two multiple
  of 4 at or above (1024). Slower steps (1 s) bring it back down to 16 (10 steps). A duty
  of 1 keeps every 4 steps."""
  now = [0.0]
  snaps = snapshots.Snapshots(str(tmp_path / "run"), host="h", process=0, every_steps=4,
                              duty=0.05, clock=lambda: now[0])
  snaps._last_write_s = 0.5   # pylint: disable=protected-access  (the writer's measurement)
  snaps._adapt(4)             # pylint: disable=protected-access  (the first: no pace yet)
  assert snaps.stride == 4
  now[0] += 0.04              # 4 steps of 10 ms
  snaps._adapt(8)             # pylint: disable=protected-access
  assert snaps.stride == 1024 and [s for s in range(1, 2049) if snaps.due(s)] == [1024, 2048]
  now[0] += 1024 * 1.0        # steps of 1 s: 0.5 s per 10 s is 10 steps, the next power 16
  snaps._adapt(8 + 1024)      # pylint: disable=protected-access
  assert snaps.stride == 16
  snaps.close(remove=True)
  every = snapshots.Snapshots(str(tmp_path / "run2"), host="h", process=0, every_steps=4,
                              clock=lambda: now[0])
  every._last_write_s = 0.5   # pylint: disable=protected-access
  for step in (4, 8, 12):
    now[0] += 0.04
    every._adapt(step)        # pylint: disable=protected-access
  assert every.stride == 4
  every.close(remove=True)


def test_an_unwritable_snapshot_dir_leaves_training_to_the_checkpoints(tmp_path, caplog):
  (tmp_path / "file").write_text("not a folder")
  with caplog.at_level(logging.WARNING):
    snaps = snapshots.Snapshots(str(tmp_path / "file" / "run"), host="h", process=0,
                                every_steps=2)
  assert "cannot write" in caplog.text and "snapshot_dir" in caplog.text
  assert not snaps.due(2) and snaps.save(_state(1.0), _lineage(2)) is False
  assert snaps.restore(_abstract(_state(0.0)), after_step=-1, placement="p") is None
  snaps.close(remove=True)


def test_an_fsdp_sharded_state_is_left_to_the_checkpoints(tmp_path, caplog):
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("fsdp",))
  sharded = {"w": jax.device_put(jnp.zeros((4, 3)), NamedSharding(mesh, PartitionSpec("fsdp")))}
  snaps = _snapshots(tmp_path)
  with caplog.at_level(logging.INFO):
    assert snaps.save(sharded, _lineage(1)) is False
  assert "sharded" in caplog.text and snapshots.step_files(snaps.directory) == []


def test_replicated_over_a_mesh_restores_onto_its_sharding(tmp_path):
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]), ("data",))
  replicated = NamedSharding(mesh, PartitionSpec())
  snaps = _snapshots(tmp_path)
  _save(snaps, [5], sharding=replicated)
  state, _, _ = snaps.restore(_abstract(_state(0.0, replicated)), after_step=-1, placement="p")
  assert state["params"]["w"].sharding == replicated
  np.testing.assert_array_equal(np.asarray(state["params"]["w"]), 5.0)


def test_the_run_root_belongs_to_one_run_of_one_workdir(tmp_path):
  store = lineage.LineageStore(str(tmp_path / "lineage"))
  first = snapshots.run_id(store, is_chief=True, barrier=lambda name: None)
  assert snapshots.run_id(store, is_chief=True, barrier=lambda name: None) == first
  fresh = snapshots.run_id(lineage.LineageStore(str(tmp_path / "lineage2")), is_chief=True,
                           barrier=lambda name: None)
  assert fresh != first   # a new store (a new run in the same workdir): other snapshots
  a = snapshots.run_root("/base", str(tmp_path / "a"), first)
  assert a != snapshots.run_root("/base", str(tmp_path / "b"), first)
  assert a != snapshots.run_root("/base", str(tmp_path / "a"), fresh)
  assert a.startswith("/base/medjax-snapshots-")
  assert snapshots.run_root("", "w", first).startswith(snapshots.default_base())
  # A new run in the workdir drops the earlier run's snapshots, not other workdirs'.
  earlier = snapshots.run_root(str(tmp_path / "base"), str(tmp_path / "a"), first)
  other_workdir = snapshots.run_root(str(tmp_path / "base"), str(tmp_path / "b"), first)
  new = snapshots.run_root(str(tmp_path / "base"), str(tmp_path / "a"), fresh)
  for root in (earlier, other_workdir, new):
    os.makedirs(os.path.join(root, "host-0", "proc-0"))
  assert snapshots.drop_earlier_runs(new) == [os.path.basename(earlier)]
  assert not os.path.exists(earlier) and os.path.exists(other_workdir) and os.path.exists(new)


@pytest.mark.slow
def test_a_killed_unsupervised_run_rerun_resumes_from_its_snapshot(tmp_path):
  """A single-process run SIGKILLed mid-partition, then run again as a user would: it resumes
  from the host-local snapshot, not the partition's start, and ends where an uninterrupted run
  does; the finished run leaves nothing in host memory."""
  # One partition per epoch (15 steps): a boundary checkpoint at every epoch end only.
  common = ["--config.fault.supervised=False", "--config.optim.epochs=4",
            "--config.data.num_partitions=1", "--config.ckpt.every_steps=0",
            "--config.ckpt.snapshot_every_steps=1", "--config.ckpt.writer_duty=1.0",
            f"--config.data.salt_file={tmp_path / 'id_salt'}"]
  clean, killed = str(tmp_path / "clean"), str(tmp_path / "killed")
  assert runs.run(clean, *common) == 0, runs.tail(clean)
  # SIGKILLed in epoch 2 (steps 31-45), a few steps after its start: by the fault injector, at
  # a step of its own (killed from outside once the ledger reached step 35, a loaded machine let
  # the run reach the epoch's checkpoint at 45 before the signal landed).
  code = runs.run(killed, *common, "--config.fault.inject=kill@step=37:process=0")
  assert code == -signal.SIGKILL, (code, runs.tail(killed))
  ledger = os.path.join(killed, "ledger", "gen-000-proc-000.jsonl")
  killed_at = len(open(ledger).readlines())
  assert 35 <= killed_at < 45, killed_at   # before the epoch's checkpoint
  assert runs.run(killed, *common) == 0, runs.tail(killed)
  log = open(os.path.join(killed, "launcher.log")).read()
  found = re.search(r"snapshot: restored step (\d+) from host memory", log)
  assert found, runs.tail(killed)
  # Newer than the checkpoint at 30 that it would otherwise have resumed from; at most the
  # step it was killed at.
  assert 30 < int(found.group(1)) <= killed_at, (found.group(0), killed_at)
  a, step_a = checkpointer.load_arrays(os.path.join(clean, "checkpoints"))
  b, step_b = checkpointer.load_arrays(os.path.join(killed, "checkpoints"))
  assert step_a == step_b and sorted(a) == sorted(b)
  for k in (k for k in a if k.startswith("['params']")):
    np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-6, err_msg=k)
  # The finished run's snapshots are gone from host memory.
  store = lineage.LineageStore(os.path.join(killed, "lineage"))
  run = snapshots.run_id(store, is_chief=False, barrier=lambda name: None)
  assert not glob.glob(os.path.join(snapshots.run_root("", killed, run), "*", "*", "*"))


@pytest.mark.parametrize("saved, problem", [
    ({"run": 5}, "field 'run' is 5, not a string"),
    ({"run": "../../etc"}, "field 'run' is '../../etc', not a run id (letters and digits)"),
    ({"run": ""}, "field 'run' is '', not a run id"),
    ({"id": "3fa1c0"}, "field 'run' is missing"),
    (["3fa1c0"], "holds list, not a record"),
])
def test_a_run_id_of_another_shape_is_refused_with_what_to_do(tmp_path, saved, problem):
  store = lineage.LineageStore(str(tmp_path / "lineage"))
  first = snapshots.run_id(store, is_chief=True, barrier=lambda name: None)
  assert first.isalnum() and snapshots.run_id(store, is_chief=False,
                                                  barrier=lambda name: None) == first
  with open(tmp_path / "lineage" / "state" / "snapshots", "w") as f:
    json.dump(saved, f)
  passed = []
  for chief in (True, False):   # every process refuses it alike, after the barrier
    with pytest.raises(lineage.LineageError) as e:
      snapshots.run_id(store, is_chief=chief, barrier=passed.append)
    assert str(e.value).startswith(f"{tmp_path / 'lineage'}/state/snapshots: "), str(e.value)
    assert problem in str(e.value) and str(e.value).endswith(
        "; delete it (this run's host-local snapshots are then not resumed from: training goes "
        "on from the newest committed checkpoint)")
  assert passed == ["snapshot run id", "snapshot run id"]
