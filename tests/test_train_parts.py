"""The trainer's per-step helpers on their own: save policy, commit path, metrics reporter,
and which party commits and prunes."""

import glob
import os
import struct
import threading
import time
import types

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from medjax import errors
from medjax import lineage
from medjax import paths
from medjax.checkpoint import checkpointer
from medjax.checkpoint import packing
from medjax.checkpoint import policy
from medjax.checkpoint import restore
from medjax.checkpoint import saver as saver_lib
from medjax.runtime import context
from medjax.train import loop as loop_lib
from medjax.train import reporting


def _lineage(step):
  return lineage.Lineage.start(epoch=0, global_step=step, seed=0, placement="p", hosts=("h",),
                               base_N=np.zeros(4, bool))


def test_save_policy_every_k_inside_partitions_and_boundaries():
  every = policy.SavePolicy(ml_collections.ConfigDict(
      {"every_steps": 4, "partition_boundaries": True}), epochs=2)
  # Inside a partition of 10 steps: global steps 4 and 8; never on the partition's last step
  # (the boundary saves it).
  assert [g for g in range(1, 11) if every.after_step(g, g, 10)] == [4, 8]
  assert not every.after_step(12, 10, 10)
  assert every.at_boundary(1) and every.at_boundary(2)
  ends_only = policy.SavePolicy(ml_collections.ConfigDict(
      {"every_steps": 0, "partition_boundaries": False}), epochs=2)
  assert not any(ends_only.after_step(g, g, 100) for g in range(1, 100))
  assert not ends_only.at_boundary(1) and ends_only.at_boundary(2)


def _policy(strategy, *, every_steps=0, every_seconds=0.0, epochs=3, min_interval_s=0.0,
            **kwargs):
  return policy.SavePolicy(ml_collections.ConfigDict(
      {"strategy": strategy, "every_steps": every_steps, "partition_boundaries": True,
       "every_seconds": every_seconds, "min_interval_s": min_interval_s}), epochs=epochs,
      **kwargs)


def test_save_policy_strategies_of_table_one():
  # Epoch-level: epoch ends only (and the end), never inside a partition.
  epoch = _policy("epoch", every_steps=4)
  assert not any(epoch.after_step(g, g, 100) for g in range(1, 100))
  assert [epoch.at_boundary(e, done) for e, done in ((0, False), (1, True), (1, False),
                                                     (2, True), (3, True))] == [
      False, True, False, True, True]
  # None: only the end of training.
  none = _policy("none", every_steps=4)
  assert not any(none.after_step(g, g, 100) for g in range(1, 100))
  assert [none.at_boundary(e, True) for e in (1, 2, 3)] == [False, False, True]
  # Lineage: as configured (the test above).
  assert _policy("lineage", every_steps=4).after_step(4, 4, 10)


def test_save_policy_time_based_counts_from_the_last_save():
  now = [0.0]
  timed = _policy("time", every_seconds=10.0, clock=lambda: now[0])
  due = []
  for step in range(1, 40):
    now[0] += 1.0
    if timed.after_step(step, step, 1000):
      due.append(step)
    if step == 25:
      timed.saved()   # e.g. a boundary save resets the interval
  assert due == [10, 20, 35]
  assert not timed.at_boundary(1, True) and timed.at_boundary(3, True)


def test_save_policy_floor_skips_saves_sooner_than_it_after_the_last():
  now = [0.0]
  floored = _policy("lineage", every_steps=4, epochs=9, clock=lambda: now[0],
                    min_interval_s=1.0)
  saved = []
  # A 10-step partition per 0.5 s: boundaries at 0.5, 1.0, ... s, k-step points in between.
  for step in range(1, 41):
    now[0] += 0.05
    offset = (step - 1) % 10 + 1
    if floored.after_step(step, offset, 10):
      saved.append(step)
    if offset == 10 and floored.at_boundary(step // 10):
      floored.saved()
      saved.append(step)
  # 1 s after the start: step 20 (a boundary), then step 40; the k-step points 4, 8, 12, 16
  # and 24...36 came sooner.
  assert saved == [20, 40]
  # The end of training always saves; the floor is the lineage strategy's alone.
  assert floored.at_boundary(9)
  timed = _policy("time", every_seconds=10.0, clock=lambda: now[0], min_interval_s=100.0)
  assert timed.min_interval_s == 0.0
  # 0 (the default): every boundary, as the paper's policy.
  assert all(_policy("lineage", clock=lambda: now[0]).at_boundary(1) for _ in range(3))


def test_save_policy_floor_takes_the_chiefs_decision():
  asked, now = [], [50.0]
  floored = _policy("lineage", every_steps=4, clock=lambda: now[0], min_interval_s=1.0,
                    agree=lambda flag: asked.append(flag) or True)
  # Process 0 says save, though this process's clock says too soon.
  assert floored.at_boundary(1) and asked == [False]
  # Without a floor no collective is made.
  plain = _policy("lineage", agree=lambda flag: asked.append(flag) or False)
  assert plain.at_boundary(1) and asked == [False]


def test_save_policy_time_based_takes_the_chiefs_decision():
  asked = []

  def chief_says_no(flag):
    asked.append(flag)
    return False

  now = [100.0]
  timed = _policy("time", every_seconds=1.0, clock=lambda: now[0], agree=chief_says_no)
  now[0] += 5
  assert not timed.after_step(1, 1, 10) and asked == [True]


class _FakeCheckpointer:
  """Finalizes a save at once, handing it to `on_finalized` (which `Saver` sets) with a write
  time of 0.01 s per step, as `checkpointer.Checkpointer` does from its saver thread."""
  writes, write_s = 0, 0.0

  def __init__(self):
    self.saved, self.finalized_queue, self.blocked_s, self.waits = [], [], 0.0, 0
    self.on_finalized, self.want, self.urgent = None, True, []

  def wanted(self):
    return self.want

  def save(self, state, lineage_now, guard=None, *, urgent=False):
    if guard is not None and not guard():
      return
    self.urgent.append(urgent)
    self.saved.append(lineage_now.global_step)
    if self.on_finalized is None:
      self.finalized_queue.append(lineage_now)
    else:
      self.on_finalized(lineage_now, 0.01 * lineage_now.global_step)

  def finalized(self):
    out, self.finalized_queue = self.finalized_queue, []
    return out

  def wait(self):
    self.waits += 1


class _FakeContext:
  phase = "training"
  blocked_s = 0.0

  def __init__(self):
    self.commits, self.phases, self.flushed, self.commit_write_s = [], [], 0, []

  def set_phase(self, phase):
    self.phases.append(phase)
    self.phase = phase

  def commit(self, lineage_now, write_s=None):
    self.commits.append(lineage_now.global_step)
    self.commit_write_s.append(write_s)

  def flush(self):
    self.flushed += 1


@pytest.mark.parametrize("is_chief", [True, False])
def test_saver_saves_once_per_step_and_only_the_chief_commits(is_chief):
  ckpt, ctx, calls = _FakeCheckpointer(), _FakeContext(), []
  saver = saver_lib.Saver(ckpt, ctx, is_chief=is_chief, last_saved=5,
                              before_save=lambda: calls.append(("before", list(ckpt.saved))),
                              after_save=lambda: calls.append(("after", list(ckpt.saved))))
  saver.save({}, _lineage(5))      # restored there: not saved again
  saver.save({}, _lineage(8))
  saver.save({}, _lineage(8))
  assert ckpt.saved == [8] and calls == [("before", []), ("after", [8])]
  assert ctx.phases == ["checkpointing", "training"] and ctx.phase == "training"
  saver.commit_finalized()
  assert ctx.commits == ([8] if is_chief else [])
  with pytest.raises(saver_lib.Preempted, match="checkpoint 11 saved and committed"):
    saver.preempt({}, _lineage(11))
  assert ckpt.saved == [8, 11] and ckpt.waits == 1 and ctx.flushed == 1
  assert ctx.commits == ([8, 11] if is_chief else [])
  # Each commit carries its save's write time (for the coordinator's commit events).
  assert ctx.commit_write_s == ([0.08, 0.11] if is_chief else [])


def test_an_optional_save_is_made_only_when_the_writer_wants_it_and_others_are_urgent():
  """Boundary saves are optional (made when the checkpointer's writer wants one, else listed as
  rested in summary.json); the end's, an epoch's validated one and a preemption's are always made
  and written without the writer's rest."""
  ckpt, ctx = _FakeCheckpointer(), _FakeContext()
  saver = saver_lib.Saver(ckpt, ctx, is_chief=True, last_saved=None)
  assert saver.save({}, _lineage(4), optional=True)
  ckpt.want = False
  assert not saver.save({}, _lineage(8), optional=True)
  assert saver.save({}, _lineage(12))             # the end or a validated epoch: always
  assert ckpt.saved == [4, 12] and ckpt.urgent == [False, True]
  assert saver.rested == [8] and saver.saved == [4, 12]


def test_a_guarded_save_checks_where_it_is_written_and_a_preemption_checks_at_once():
  """With a guard the training thread does not wait for the device at a save (the check runs
  where the state is written, and a failing one keeps it from disk); a preemption's save, which
  must be committed before the process exits, checks on the training thread."""
  ckpt, ctx, calls, ok = _FakeCheckpointer(), _FakeContext(), [], [True]
  saver = saver_lib.Saver(ckpt, ctx, is_chief=True, last_saved=None,
                          before_save=lambda: calls.append("checked now"),
                          guard=lambda: (lambda: calls.append("guard") or ok[0]))
  saver.save({}, _lineage(4))
  ok[0] = False
  saver.save({}, _lineage(8))
  assert calls == ["guard", "guard"] and ckpt.saved == [4] and ctx.commits == [4]
  with pytest.raises(saver_lib.Preempted):
    saver.preempt({}, _lineage(9))
  assert calls[-1] == "checked now" and ckpt.saved == [4, 9]


def test_the_checkpointer_does_not_write_a_state_its_guard_refuses(tmp_path):
  ckpt = checkpointer.Checkpointer(str(tmp_path / "ckpt"))
  ckpt.save({"w": jnp.ones((2,))}, _lineage(3), guard=lambda: False)
  ckpt.wait()   # (else the next save may replace it before the writer takes it)
  ckpt.save({"w": jnp.ones((2,))}, _lineage(4), guard=lambda: True)
  ckpt.wait()
  assert ckpt.steps() == [4] and ckpt.refused == [3]
  ckpt.close()


@pytest.mark.parametrize("is_chief", [True, False])
def test_a_save_is_committed_when_its_write_is_finalized(tmp_path, is_chief):
  """From the saver thread, not at the training thread's next commit_finalized: that thread may
  be blocked on the device for most of a partition."""
  ckpt, ctx = checkpointer.Checkpointer(str(tmp_path / "ckpt")), _FakeContext()
  saver = saver_lib.Saver(ckpt, ctx, is_chief=is_chief, last_saved=None)
  saver.save({"w": jnp.ones((3,)), "step": jnp.asarray(4, jnp.int32)}, _lineage(4))
  ckpt.wait()   # the write is done; commit_finalized was never called
  assert ctx.commits == ([4] if is_chief else [])
  assert all(w > 0 for w in ctx.commit_write_s)
  saver.commit_finalized()   # nothing left to commit twice
  assert ctx.commits == ([4] if is_chief else []) and ckpt.writes == 1
  ckpt.close()


class _Writer:
  def __init__(self):
    self.rows = []

  def write(self, step, scalars, kind="train"):
    self.rows.append((kind, step, scalars))

  def write_interval(self, rows, kind="train"):
    for step, scalars in rows:
      self.write(step, scalars, kind)


class _Bar:
  def __init__(self):
    self.done = 0

  def update(self, n, **_):
    self.done += n


def _metrics(loss):
  return {"loss": jnp.float32(loss), "accuracy": jnp.float32(0.5), "weight": jnp.float32(4.0),
          "grad_norm": jnp.float32(1.0), "learning_rate": jnp.float32(1e-3)}


def test_reporter_writes_every_step_at_the_interval():
  writer, bar, progress = _Writer(), _Bar(), []
  reporter = reporting.Reporter(writer, bar, every=3, processes=2,
                                record_ids=np.array(["r-a", "r-b"]), resume_hint=lambda: "",
                                on_progress=lambda *a: progress.append(a))
  rows = np.array([0, 1, -1])
  written = []
  for step in range(1, 6):
    reporter.step(global_step=step, epoch=0, partition=1, offset=step, rows=rows,
                  metrics=_metrics(step / 10))
    written.append(len(writer.rows))
  # The first step at once (it ends compiling), then one device fetch per 3 steps.
  assert written == [1, 1, 1, 4, 4]
  reporter.flush()
  assert [r[1] for r in writer.rows] == [1, 2, 3, 4, 5] and bar.done == 5
  # Progress is reported of finished steps only: at each flush, and in between for the newest
  # queued step already computed (these are).
  assert progress == [(1, 0, 1), (2, 0, 1), (4, 0, 1), (5, 0, 1)]
  kind, step, scalars = writer.rows[3]
  assert kind == "train" and scalars["loss"] == pytest.approx(0.4)
  assert scalars["learning_rate"] == pytest.approx(1e-3) and "weight" not in scalars
  assert scalars["examples_per_s"] > 0 and scalars["partition"] == 1


def test_reporters_interval_flush_leaves_the_steps_in_flight_queued():
  """With a lag of 2 (the loop's max_steps_in_flight) an interval's flush fetches only the steps
  older than the newest two, which the in-flight bound has already waited for: the device's queue
  is never drained by logging. The end's flush fetches everything, in order."""
  writer, bar = _Writer(), _Bar()
  reporter = reporting.Reporter(writer, bar, every=3, processes=1, record_ids=np.array(["r-a"]),
                                resume_hint=lambda: "", lag=2)
  fetched = []
  real_get = reporting.jax.device_get

  def device_get(tree):
    fetched.append(len(tree))
    return real_get(tree)
  reporting.jax.device_get = device_get
  try:
    written = []
    for step in range(1, 10):
      reporter.step(global_step=step, epoch=0, partition=0, offset=step, rows=np.array([0]),
                    metrics=_metrics(step / 10))
      written.append(len(writer.rows))
    reporter.flush()
  finally:
    reporting.jax.device_get = real_get
  # Step 1 at once; at 5 queued (steps 2-6) steps 2-4 are fetched and 5-6 stay; at 5 queued
  # again (5-9) steps 5-7; the end's flush fetches 8-9.
  assert written == [1, 1, 1, 1, 1, 4, 4, 4, 7]
  assert fetched == [1, 3, 3, 2]
  assert [r[1] for r in writer.rows] == list(range(1, 10)) and bar.done == 9


class _NotReady:
  def __init__(self, value):
    self.value = value

  def is_ready(self):
    return False

  def __array__(self, dtype=None, copy=None):
    return np.asarray(self.value, dtype)


def test_reporter_reports_no_progress_for_steps_still_computing():
  progress = []
  reporter = reporting.Reporter(_Writer(), _Bar(), every=10, processes=1,
                                record_ids=np.array(["r-a"]), resume_hint=lambda: "",
                                on_progress=lambda *a: progress.append(a))
  for step in range(1, 5):
    metrics = {"loss": _NotReady(0.5), "learning_rate": np.float32(1e-3)} if step > 1 else \
        _metrics(0.5)
    reporter.step(global_step=step, epoch=0, partition=0, offset=step, rows=np.array([0]),
                  metrics=metrics)
  assert progress == [(1, 0, 0)]   # the first step's flush only


def test_reporter_checks_before_a_save_and_writes_after_it():
  # check() fetches and checks (before a checkpoint is handed over); write() writes (after it).
  writer, bar, progress = _Writer(), _Bar(), []
  reporter = reporting.Reporter(writer, bar, every=10, processes=1, record_ids=np.array(["r-a"]),
                                resume_hint=lambda: "", on_progress=lambda *a: progress.append(a))
  for step in (1, 2, 3):
    reporter.step(global_step=step, epoch=0, partition=0, offset=step, rows=np.array([0]),
                  metrics=_metrics(0.5))
  reporter.check()
  assert [r[1] for r in writer.rows] == [1] and bar.done == 1   # the first step's own flush
  reporter.write()
  assert [r[1] for r in writer.rows] == [1, 2, 3] and bar.done == 3 and progress[-1] == (3, 0, 0)
  reporter.write()   # nothing left
  assert len(writer.rows) == 3


def test_reporter_names_the_first_non_finite_step_by_pseudonym():
  reporter = reporting.Reporter(_Writer(), _Bar(), every=10, processes=1,
                                record_ids=np.array(["r-a", "r-b", "r-c"]),
                                resume_hint=lambda: "last good checkpoint: 4 in /x")
  reporter.step(global_step=7, epoch=1, partition=2, offset=3, rows=np.array([0, 2]),
                metrics=_metrics(0.3))
  reporter.step(global_step=8, epoch=1, partition=2, offset=4, rows=np.array([1, -1]),
                metrics=_metrics(float("nan")))
  with pytest.raises(errors.InputError) as e:   # a TrainingError: one line, exit 2, no retry
    reporter.check()
  assert isinstance(e.value, reporting.TrainingError)
  assert "non-finite loss nan at step 8 (epoch 1, partition 2, offset 3)" in str(e.value)
  assert "['r-b']" in str(e.value) and "last good checkpoint: 4 in /x" in str(e.value)


def _save_steps(directory, steps):
  ckpt = checkpointer.Checkpointer(directory, async_save=False)
  for step in steps:
    ckpt.save({"w": jnp.full((2,), float(step))}, _lineage(step))
  ckpt.close()


def test_local_commit_writes_the_record_and_prunes(tmp_path):
  directory = str(tmp_path / "checkpoints")
  _save_steps(directory, [1, 2, 3])
  store = lineage.LineageStore(str(tmp_path / "lineage"))
  ctx = context.Local(store, directory, max_to_keep=2)
  for step in (1, 2, 3):
    ctx.commit(_lineage(step))
  assert store.committed_steps() == [1, 2, 3]
  assert sorted(int(d) for d in os.listdir(directory) if d.isdigit()) == [2, 3]


class _Client:
  def __init__(self):
    self.calls = []

  def call(self, method, message=None, timeout_s=None):
    self.calls.append((method, message))
    return {}


def test_remote_commit_sends_the_record_and_leaves_pruning_to_the_coordinator(tmp_path):
  directory = str(tmp_path / "checkpoints")
  _save_steps(directory, [1, 2, 3])
  client = _Client()
  ctx = context.Remote(client, generation=2, process_id=0, interval_s=60)
  try:
    for step in (1, 2, 3):
      ctx.commit(_lineage(step))
    assert ctx.flush(timeout_s=1.0)
  finally:
    ctx.close()
  commits = [m for method, m in client.calls if method == "Commit"]
  assert [lineage.Lineage.from_dict(m["record"]).global_step for m in commits] == [1, 2, 3]
  assert all(m["generation"] == 2 for m in commits)
  assert sorted(int(d) for d in os.listdir(directory) if d.isdigit()) == [1, 2, 3]


def test_remote_commit_goes_out_at_once_without_holding_the_caller():
  # The coordinator takes its time (it writes the record and prunes before it answers): the
  # saver thread that commits does not wait for it, and the commit does not wait for a
  # heartbeat (every 60 s here) or a flush.
  class SlowClient(_Client):
    def call(self, method, message=None, timeout_s=None):
      if method == "Commit":
        time.sleep(0.5)
      return super().call(method, message, timeout_s)

  client = SlowClient()
  ctx = context.Remote(client, generation=2, process_id=0, interval_s=60)
  try:
    t0 = time.monotonic()
    ctx.commit(_lineage(4), write_s=0.05)
    assert time.monotonic() - t0 < 0.25
    while not any(method == "Commit" for method, _ in client.calls):
      assert time.monotonic() - t0 < 5.0, "the commit was not sent"
      time.sleep(0.01)
  finally:
    ctx.close()
  (sent,) = [m for method, m in client.calls if method == "Commit"]
  assert lineage.Lineage.from_dict(sent["record"]).global_step == 4 and sent["write_s"] == 0.05


def test_remote_heartbeats_count_the_steps_their_gaps_span():
  # Progress in bursts (a report per ten steps, as when steps run ahead of the host): the
  # coordinator's hang warm-up sees the steps, not only the reports.
  client = _Client()
  ctx = context.Remote(client, generation=2, process_id=0, interval_s=60)
  try:
    for step in (1, 11, 21, 31):
      ctx.progress(step, 0, 0)
    ctx.set_phase("checkpointing")   # a gap across another phase spans nothing
    ctx.progress(41, 0, 0)
    ctx.set_phase("training")
    ctx._beat()  # pylint: disable=protected-access  # the heartbeat thread's next beat, now
  finally:
    ctx.close()
  beat = [m for method, m in client.calls if method == "WorkerHeartbeat"][-1]
  assert (beat["gaps"], beat["gap_steps"]) == (3, 30)


def test_a_step_left_uncommitted_by_a_crash_is_saved_again_after_restart(tmp_path):
  # A crash after Orbax wrote step 4 and before it was committed: the next generation discards
  # step 4, starts from zero, and reaches and saves step 4 again.
  directory = str(tmp_path / "checkpoints")
  _save_steps(directory, [4])
  store = lineage.LineageStore(str(tmp_path / "lineage"))
  store.put_state("records", {"fingerprint": "f", "count": 4})  # written by the first start
  ckpt = checkpointer.Checkpointer(directory, async_save=False)   # opened before the discard
  abstract = {"w": jax.ShapeDtypeStruct((2,), jnp.float32,
                                        sharding=jax.sharding.SingleDeviceSharding(
                                            jax.devices()[0]))}
  state, start, step = restore.restore_or_start(
      ckpt, store, abstract, placement="p", hosts=("h",), seed=0, num_records=4,
      is_chief=True, barrier=lambda name: None, records="f")
  assert state is None and step is None and start.global_step == 0
  ckpt.save({"w": jnp.full((2,), 9.0)}, _lineage(4))
  ckpt.wait()
  assert [x.global_step for x in ckpt.finalized()] == [4]
  ckpt.close()


def _abstract_w():
  return {"w": jax.ShapeDtypeStruct((2,), jnp.float32, sharding=jax.sharding.SingleDeviceSharding(
      jax.devices()[0]))}


def _damage(directory, step):
  """Truncates every array data file of a saved step (a machine that crashed mid-copy)."""
  hit = 0
  for dirpath, _, names in os.walk(os.path.join(directory, str(step), "state")):
    for name in names:
      path = os.path.join(dirpath, name)
      if "/d/" in path.replace(os.sep, "/") and os.path.getsize(path) > 0:
        with open(path, "r+b") as f:
          f.truncate(os.path.getsize(path) // 3)
        hit += 1
  assert hit, f"no array data files under {directory}/{step}"


def _committed_run(tmp_path, steps):
  directory = str(tmp_path / "checkpoints")
  _save_steps(directory, steps)
  store = lineage.LineageStore(str(tmp_path / "lineage"))
  for step in steps:
    store.commit(_lineage(step), committed_at=1.0)
  return directory, store


def _restore(directory, store, **kw):
  ckpt = checkpointer.Checkpointer(directory, async_save=False)
  return ckpt, restore.restore_or_start(
      ckpt, store, _abstract_w(), placement="p", hosts=("h",), seed=0, num_records=4,
      is_chief=True, barrier=lambda name: None, **kw)


def test_a_damaged_newest_checkpoint_is_set_aside_and_its_step_saved_again(tmp_path):
  directory, store = _committed_run(tmp_path, [2, 4])
  _damage(directory, 4)
  ckpt, (state, start, step) = _restore(directory, store)
  assert step == 2 and start.global_step == 2
  np.testing.assert_array_equal(np.asarray(state["w"]), 2.0)
  assert store.committed_steps() == [2]                       # step 4's record retracted
  moved = os.listdir(directory + "-damaged")
  assert len(moved) == 1 and moved[0].startswith("4.")        # kept, not deleted
  ckpt.save({"w": jnp.full((2,), 9.0)}, _lineage(4))         # no StepAlreadyExistsError
  ckpt.wait()
  assert [x.global_step for x in ckpt.finalized()] == [4]
  ckpt.close()


def test_every_checkpoint_damaged_stops_with_one_line_unless_told_to_start_fresh(tmp_path):
  directory, store = _committed_run(tmp_path, [2, 4])
  _damage(directory, 2)
  _damage(directory, 4)
  with pytest.raises(errors.InputError) as e:
    _restore(directory, store)
  message = str(e.value)
  assert "\n" not in message
  assert message.startswith(f"every committed checkpoint left in {directory} is damaged (2 "
                            "checked; the newest, step 4, is damaged or incomplete (")
  assert message.endswith("rerun with --config.ckpt.if_all_damaged=start_fresh to train from "
                          f"step 0 (they are then moved to {directory}-damaged)")
  assert sorted(os.listdir(directory)) == ["2", "4"]          # nothing touched
  ckpt, (state, start, step) = _restore(directory, store, if_all_damaged="start_fresh")
  assert state is None and step is None and start.global_step == 0
  assert store.committed_steps() == []
  assert sorted(n.split(".")[0] for n in os.listdir(directory + "-damaged")) == ["2", "4"]
  ckpt.close()


def test_committed_steps_without_checkpoints_stop_the_run(tmp_path):
  directory, store = _committed_run(tmp_path, [2])
  import shutil  # pylint: disable=import-outside-toplevel
  shutil.rmtree(os.path.join(directory, "2"))
  with pytest.raises(errors.InputError, match=r"has committed steps \(newest 2\) but .* holds "
                     "none of them"):
    _restore(directory, store)


@pytest.mark.parametrize("garbage", [b"\x00\xff garbage", b"[1, 2]", b'{"global_step": "x"}'])
def test_a_garbled_lineage_record_is_skipped_for_the_previous_step(tmp_path, garbage):
  directory, store = _committed_run(tmp_path, [2, 4])
  with open(os.path.join(str(tmp_path / "lineage"), "log", f"{4:012d}"), "wb") as f:
    f.write(garbage)
  with open(os.path.join(str(tmp_path / "lineage"), "log", "notes.txt~"), "wb") as f:
    f.write(b"a stray file")
  ckpt, (state, _, step) = _restore(directory, store)
  assert step == 2
  np.testing.assert_array_equal(np.asarray(state["w"]), 2.0)
  ckpt.close()


def test_checkpoints_of_another_ingest_are_refused(tmp_path):
  directory, store = _committed_run(tmp_path, [2])
  ckpt, (_, _, step) = _restore(directory, store, records="aaaa")
  assert step == 2
  ckpt.close()
  ckpt, _ = _restore(directory, store, records="aaaa")     # the same ingest: fine
  ckpt.close()
  with pytest.raises(errors.InputError, match=r"^the cohort's records changed since this run's "
                     r"checkpoints were written \(ingest fingerprint aaaa in .*, now bbbb"):
    _restore(directory, store, records="bbbb")


def test_checkpoints_unknown_to_the_lineage_store_are_never_deleted(tmp_path):
  directory = str(tmp_path / "checkpoints")
  _save_steps(directory, [2, 4])
  store = lineage.LineageStore(str(tmp_path / "elsewhere"))   # a mistyped ckpt.lineage_store
  with pytest.raises(errors.InputError, match=r"holds checkpoints \(steps \[2, 4\]\) but the "
                     r"lineage store .* knows none of them"):
    _restore(directory, store, records="f")
  assert sorted(os.listdir(directory)) == ["2", "4"]
  ckpt, (state, _, step) = _restore(directory, store, records="f", if_all_damaged="start_fresh")
  assert state is None and step is None
  assert sorted(n.split(".")[0] for n in os.listdir(directory + "-damaged")) == ["2", "4"]
  ckpt.close()


def test_standby_lists_checkpoints_again_when_one_is_pruned_meanwhile(monkeypatch, tmp_path):
  # CI saw it: the running generation's coordinator deleted step 208 while the standby's Orbax
  # read its metadata, and the standby gave up preparing ahead.
  from medjax.train import prepare  # pylint: disable=import-outside-toplevel
  calls = []

  def flaky(directory, *, async_save, packer, duty):
    calls.append(directory)
    if len(calls) < 3:
      raise FileNotFoundError(f"{directory}/208")
    return "opened"

  monkeypatch.setattr(checkpointer, "Checkpointer", flaky)
  config = ml_collections.ConfigDict({"ckpt": {"async_save": True}})
  open_while_pruned = prepare._open_while_pruned  # pylint: disable=protected-access
  packer = packing.StatePacker()
  assert open_while_pruned(paths.RunPaths(str(tmp_path)), config, packer) == "opened"
  assert len(calls) == 3
  calls.clear()
  monkeypatch.setattr(checkpointer, "Checkpointer", lambda *a, **k: (_ for _ in ()).throw(
      FileNotFoundError("gone")))
  with pytest.raises(FileNotFoundError):
    open_while_pruned(paths.RunPaths(str(tmp_path)), config, packer, attempts=2)


def test_a_newer_snapshot_is_resumed_from_without_reading_a_checkpoint(tmp_path, monkeypatch):
  directory, store = _committed_run(tmp_path, [2, 4])
  asked = []
  snap = ({"w": jnp.full((2,), 6.0)}, _lineage(6), 6)
  read = []
  monkeypatch.setattr(checkpointer.Checkpointer, "restore",
                      lambda self, step, abstract: read.append(step))
  ckpt, (state, start, step) = _restore(
      directory, store, snapshot=lambda after: (asked.append(after), snap)[1])
  # Asked for one newer than the newest committed step; the checkpoint on disk is still 4.
  assert asked == [4] and start.global_step == 6 and step == 4 and read == []
  np.testing.assert_array_equal(np.asarray(state["w"]), 6.0)
  ckpt.close()
  # Without one, the newest committed checkpoint.
  monkeypatch.undo()
  ckpt, (state, start, step) = _restore(directory, store, snapshot=lambda after: None)
  assert step == 4 and start.global_step == 4
  np.testing.assert_array_equal(np.asarray(state["w"]), 4.0)
  ckpt.close()


def test_metric_writes_do_not_wait_for_tensorboards_writer_thread(tmp_path, monkeypatch):
  # TensorBoard's writer thread serializes each event in Python; the training thread must not
  # wait for it (tensorboardX's default queue of 10 events made it wait ~11% of its time). Every
  # event still reaches the file by close().
  from tensorboardX import record_writer  # pylint: disable=import-outside-toplevel
  from medjax.train import writers  # pylint: disable=import-outside-toplevel
  written = []
  slow = record_writer.RecordWriter.write

  def write(self, data):
    time.sleep(0.005)
    written.append(len(data))
    return slow(self, data)

  monkeypatch.setattr(record_writer.RecordWriter, "write", write)
  writer = writers.MetricWriter(str(tmp_path))
  t0 = time.monotonic()
  for step in range(40):
    writer.write(step, {f"m{i}": float(i) for i in range(10)})
  took = time.monotonic() - t0
  writer.close()
  assert took < 1.0   # 400 events at 5 ms each would have taken ~2 s behind a queue of 10
  assert len(written) >= 400   # each scalar's event (the file's header event besides)
  assert len(writers.read_metrics(str(tmp_path))) == 40


def _tensorboard_scalars(directory: str) -> list[tuple[str, int, float]]:
  """(tag, step, value) of every scalar in the event files under `directory` (TFRecord framing:
  length, its checksum, the Event, its checksum)."""
  from tensorboardX.proto import event_pb2  # pylint: disable=import-outside-toplevel
  found = []
  for path in sorted(glob.glob(os.path.join(directory, "events.out.tfevents.*"))):
    with open(path, "rb") as f:
      data = f.read()
    at = 0
    while at < len(data):
      (length,) = struct.unpack("<Q", data[at:at + 8])
      event = event_pb2.Event.FromString(data[at + 12:at + 12 + length])
      at += 12 + length + 4
      found += [(v.tag, event.step, v.simple_value) for v in event.summary.value]
  return found


def test_tensorboard_gets_each_intervals_mean_and_metrics_jsonl_every_step(tmp_path):
  from medjax.train import writers  # pylint: disable=import-outside-toplevel
  writer = writers.MetricWriter(str(tmp_path))
  writer.write_interval([(1, {"loss": 4.0, "epoch": 0.0, "time": 1.0}),
                         (2, {"loss": 2.0, "epoch": 1.0, "time": 2.0, "grad_norm": 3.0})])
  writer.write(7, {"cpu_percent": 50.0}, kind="monitor")
  writer.close()
  rows = writers.read_metrics(str(tmp_path))
  assert [(r["kind"], r["step"]) for r in rows] == [("train", 1), ("train", 2), ("monitor", 7)]
  assert rows[1]["loss"] == 2.0 and rows[1]["grad_norm"] == 3.0
  # One point per interval, at its last step: the mean (of the steps that have the value), the
  # last step's epoch; where-from fields such as the time are not scalars.
  assert sorted(_tensorboard_scalars(str(tmp_path / "tensorboard"))) == [
      ("monitor/cpu_percent", 7, 50.0), ("train/epoch", 2, 1.0), ("train/grad_norm", 2, 3.0),
      ("train/loss", 2, 3.0)]


class _Plans:
  """`HostData.plan` of a fixed layout: epoch e, partition k holds steps of rows 100e + 10k + s
  (one host, host batch 1); partition 1 of every epoch is empty."""

  def __init__(self, steps_per_partition=(3, 0, 2)):
    self.sizes = steps_per_partition
    self.threads = []   # (epoch, the name of the thread that planned it)

  def plan(self, epoch, base_N=None):
    self.threads.append((epoch, threading.current_thread().name))
    steps = [np.array([[[100 * epoch + 10 * k + s]] for s in range(n)], np.int32).reshape(n, 1, 1)
             for k, n in enumerate(self.sizes)]
    return types.SimpleNamespace(steps=steps, num_partitions=len(steps))


class _Reader:
  def __init__(self, log):
    self.log = log

  def local_rows(self, step):
    return step[0]

  def read(self, rows):
    self.log.append(("read", int(rows[0])))
    return {"x": rows.astype(np.float32), "row": rows}


def _walk(prefetch, cursor, epochs=2, log=None, plans=None, reader=None, on_end=None):
  """Runs PlannedSteps as the loop does (dispatch, read_ahead, then advance the cursor);
  `on_end(step)` at each partition's end."""
  from medjax.train import loop as loop_lib  # pylint: disable=import-outside-toplevel
  log = [] if log is None else log
  config = ml_collections.ConfigDict({"data": {"batch_size": 1, "prefetch": prefetch}})
  prepared = types.SimpleNamespace(config=config, reader=reader or _Reader(log),
                                   batch_sharding=object(), data=plans or _Plans())
  plan = loop_lib.PlannedSteps(prepared, cursor, epochs, on_partition=lambda *a: None)
  for step in plan:
    if step.batch is not None:
      log.append(("step", int(step.rows[0, 0])))
      plan.read_ahead()
      cursor.offset += 1
    if step.ends_partition:
      log.append(("end", step.epoch, step.partition))
      if on_end is not None:
        on_end(step)
      cursor.partition, cursor.offset = cursor.partition + 1, 0
      if cursor.partition == step.num_partitions:
        cursor.epoch, cursor.partition = cursor.epoch + 1, 0
        cursor.base_N = np.zeros(8, bool)
  return log


def _cursor(epoch=0, partition=0, offset=0):
  return types.SimpleNamespace(epoch=epoch, partition=partition, offset=offset, base_N=None,
                               stopped=False, global_step=0)


@pytest.mark.parametrize("prefetch", ["inline", "thread"])
def test_planned_steps_read_one_reader_across_partitions_and_the_next_epoch_ahead(prefetch):
  """Every planned step once, in order, an empty partition still ending; on the inline path the
  reads show that each batch is read while the step before it runs, across a partition's
  boundary, and the next epoch's first batch a few steps before the epoch ends."""
  log = _walk(prefetch, _cursor(), epochs=3)
  steps = [e[1] for e in log if e[0] == "step"]
  assert steps == [0, 1, 2, 20, 21, 100, 101, 102, 120, 121, 200, 201, 202, 220, 221]
  ends = [e[1:] for e in log if e[0] == "end"]
  assert ends == [(e, k) for e in range(3) for k in range(3)]
  assert sorted(e[1] for e in log if e[0] == "read") == steps   # each batch read once
  if prefetch == "inline":
    order = [e for e in log if e[0] in ("read", "step")]
    # After the first, each batch is read right after the step before it was dispatched.
    assert order[:2] == [("read", 0), ("step", 0)]
    assert order[order.index(("step", 2)) + 1] == ("read", 20)        # across the boundary
    # The next epoch's first batch: read NEXT_EPOCH_AHEAD (4) steps before the epoch's end,
    # here right after its first of five steps.
    assert order[order.index(("step", 0)) + 1:][:2] == [("read", 1), ("read", 100)]
    assert order[order.index(("step", 100)) + 1:][:2] == [("read", 101), ("read", 200)]
    assert log.index(("read", 100)) < log.index(("end", 0, 2))


def test_on_the_thread_path_the_next_epochs_first_batch_is_read_before_the_epoch_ends():
  """The prefetch threads read the next epoch's first batch while this epoch's last steps run,
  not once the loop asks for it (Grain reads nothing before it is asked, unless started)."""
  read = threading.Event()

  class Reader(_Reader):
    def read(self, rows):
      if int(rows[0]) == 100:   # epoch 1's first step
        read.set()
      return super().read(rows)

  seen = []
  _walk("thread", _cursor(), epochs=2, reader=Reader([]),
        on_end=lambda step: (step.epoch, step.partition) == (0, 2) and seen.append(read.wait(5)))
  assert seen == [True]


def test_steps_in_flight_are_2_on_the_cpu_and_4_on_an_accelerator_unless_set(monkeypatch):
  from medjax.train import loop as loop_lib  # pylint: disable=import-outside-toplevel
  config = ml_collections.ConfigDict({"max_steps_in_flight": -1})
  assert loop_lib.steps_in_flight(config) == 2   # the tests' CPU
  monkeypatch.setattr(loop_lib.jax, "default_backend", lambda: "gpu")
  assert loop_lib.steps_in_flight(config) == 4
  for value in (0, 1, 3):
    config.max_steps_in_flight = value
    assert loop_lib.steps_in_flight(config) == value


def test_the_next_epoch_is_planned_off_the_training_thread():
  """At the paper's size a plan is ~20 ms of numpy: each epoch after the first is planned on
  the planning thread while the one before it trains, each once."""
  plans = _Plans()
  _walk("inline", _cursor(), epochs=3, plans=plans)
  here = threading.current_thread().name
  assert [e for e, _ in plans.threads] == [0, 1, 2]
  assert plans.threads[0] == (0, here)
  assert all(name.startswith("medjax-planner") for _, name in plans.threads[1:])


def test_planned_steps_resume_inside_a_partition():
  log = _walk("inline", _cursor(epoch=0, partition=0, offset=2))
  assert [e[1] for e in log if e[0] == "step"] == [2, 20, 21, 100, 101, 102, 120, 121]


def test_planned_steps_at_a_finished_segments_end_end_it_instead_of_planning_nothing_forever():
  """A lineage saved after its segment's last partition ended but before the epoch moved on
  (older 'local' runs saved a round's deferred save there): its last partition ends once more,
  with no step, and the next epoch follows."""
  log = _walk("inline", _cursor(epoch=0, partition=3, offset=0))
  assert log[0] == ("end", 0, 2)
  assert [e[1] for e in log if e[0] == "step"] == [100, 101, 102, 120, 121]


def test_boundaries_publish_the_cache_counters_at_most_every_interval_and_epoch_ends_always(
    monkeypatch):
  """A partition's boundary publishes this process's cache counters only when the last
  publication is `COUNTERS_EVERY_S` old; an epoch's end publishes, waits for every process and
  has the chief log every host's."""
  now = [100.0]
  monkeypatch.setattr(loop_lib.time, "monotonic", lambda: now[0])
  calls = []
  data = types.SimpleNamespace(publish_counters=lambda: calls.append("publish"),
                               gathered_counters=lambda: {"total": {}})
  config = ml_collections.ConfigDict({"fault": {"timeout_compile_s": 5.0}})
  ctx = types.SimpleNamespace(phase="training", set_phase=lambda phase: None)
  loop = types.SimpleNamespace(
      p=types.SimpleNamespace(data=data, config=config,
                              barrier=lambda name, timeout: calls.append("barrier")),
      ctx=ctx, is_chief=True, cursor=types.SimpleNamespace(global_step=7),
      reporter=types.SimpleNamespace(cache_counters=lambda *a: calls.append("log")),
      counters_published_at=float("-inf"))

  def publish(epoch_end):
    loop_lib._Loop._publish_cache_counters(loop, epoch_end=epoch_end)

  publish(epoch_end=None)
  assert calls == ["publish"]
  now[0] += loop_lib.COUNTERS_EVERY_S / 2
  publish(epoch_end=None)
  assert calls == ["publish"]                       # too soon: nothing written
  publish(epoch_end=0)
  assert calls == ["publish", "publish", "barrier", "log"]
  now[0] += loop_lib.COUNTERS_EVERY_S
  publish(epoch_end=None)
  assert calls[-1] == "publish" and len(calls) == 5


def test_the_compilation_cache_is_the_configs_else_jaxs_environment_setting_else_the_workdirs(
    monkeypatch):
  config = ml_collections.ConfigDict({"mesh": {"compilation_cache_dir": ""}})
  monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
  assert paths.RunPaths("/w", config).compilation_cache == "/w/jax_cache"
  monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "/machine/jax_cache")
  assert paths.RunPaths("/w", config).compilation_cache == "/machine/jax_cache"
  assert paths.RunPaths("/w").compilation_cache == "/machine/jax_cache"
  config.mesh.compilation_cache_dir = "/shared/jax_cache"
  assert paths.RunPaths("/w", config).compilation_cache == "/shared/jax_cache"
