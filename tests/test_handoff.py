"""A save never waits for the checkpoint writer: a busy writer coalesces saves (issue 33).

The hand-off's rules with threads (a slow writer, a follower applying process 0's decisions), the
Checkpointer with a slow write on real Orbax files, and two real jax.distributed processes whose
writers take different times and still write the same steps.
"""

import json
import os
import random
import subprocess
import sys
import textwrap
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from medjax import lineage
from medjax.checkpoint import checkpointer
from medjax.checkpoint import handoff
from medjax.fault import protocol

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _Store:
  """jax.distributed's key-value store, in memory: what process 0 publishes, followers read."""

  def __init__(self):
    self._values, self._cond = {}, threading.Condition()

  def publish(self, kind, index, step):
    with self._cond:
      assert (kind, index) not in self._values
      self._values[kind, index] = step
      self._cond.notify_all()

  def read(self, kind, index, timeout_s):
    with self._cond:
      self._cond.wait_for(lambda: (kind, index) in self._values, timeout=timeout_s)
      return self._values.get((kind, index))


def _writer(side, written, write_s):
  def loop():
    while (item := side.take()) is not None:
      time.sleep(write_s())
      written.append(item.step)
      side.done()
  thread = threading.Thread(target=loop, daemon=True)
  thread.start()
  return thread


def test_a_busy_writer_coalesces_and_a_follower_writes_the_same_steps():
  store, rng = _Store(), random.Random(0)
  leader, follower = handoff.Leader(publish=store.publish), handoff.Follower(store.read)
  written = {"leader": [], "follower": []}
  threads = [_writer(leader, written["leader"], lambda: 0.1),
             _writer(follower, written["follower"], lambda: rng.choice([0.0, 0.15]))]
  steps = list(range(1, 41))
  held_most, slowest_put = 0, 0.0

  def train(side, pause):
    nonlocal held_most, slowest_put
    for step in steps:
      t0 = time.perf_counter()
      side.put(handoff.Item(step, payload=None))
      slowest_put = max(slowest_put, time.perf_counter() - t0)
      held_most = max(held_most, len(getattr(side, "_pending", [])))
      time.sleep(pause)
    side.join()
    side.close()

  trainers = [threading.Thread(target=train, args=(leader, 0.004)),
              threading.Thread(target=train, args=(follower, 0.002))]
  for t in trainers:
    t.start()
  for t in trainers + threads:
    t.join(timeout=30)
  assert written["leader"] == written["follower"]
  assert written["leader"][-1] == 40                        # the newest is always written
  assert sorted(written["leader"] + leader.coalesced) == steps   # each saved or coalesced once
  assert leader.coalesced == follower.coalesced and leader.coalesced   # the writer was busy
  assert held_most <= 3                                     # a follower holds two or three
  assert slowest_put < 0.05                                 # a put never waits for a write


def test_a_resting_writer_writes_at_most_its_duty_and_a_join_cuts_the_rest_short():
  """A duty of 0.2 with 50 ms writes: 200 ms of rest after each, saves handed meanwhile
  coalesce (the newest written); the leader's follower writes the same steps; the end's join
  does not wait out the rest."""
  store = _Store()
  leader = handoff.Leader(publish=store.publish, duty=0.2)
  follower = handoff.Follower(store.read)
  written = {"leader": [], "follower": []}
  threads = [_writer(leader, written["leader"], lambda: 0.05),
             _writer(follower, written["follower"], lambda: 0.0)]
  t0 = time.perf_counter()
  times = []
  for step in range(1, 61):       # a save every 10 ms for 0.6 s
    for side in (leader, follower):
      side.put(handoff.Item(step, payload=None))
    if len(written["leader"]) > len(times):
      times.append(time.perf_counter() - t0)
    time.sleep(0.01)
  joined = time.perf_counter()
  for side in (leader, follower):
    side.join()
  join_s = time.perf_counter() - joined
  for side in (leader, follower):
    side.close()
  for t in threads:
    t.join(timeout=10)
  assert written["leader"] == written["follower"] and written["leader"][-1] == 60
  assert sorted(written["leader"] + leader.coalesced) == list(range(1, 61))
  # 0.6 s of saves at 0.25 s a write-and-rest: 3 or 4 writes, then the end's; without the rest
  # a 50 ms writer would have written about a dozen.
  assert 3 <= len(written["leader"]) <= 5
  assert join_s < 0.15   # the end's save is written at once (one 50 ms write), not after a rest


def test_optional_saves_are_not_made_while_the_writer_writes_or_rests_past_the_next():
  """Process 0 answers whether to make an optional save (and copy the state for it) from its
  writer: not while it writes, nor while its rest outlasts the pace of the questions; a follower
  gets the same answers from the key-value store. A duty of 1 always wants one."""
  store, now = _Store(), [0.0]
  leader = handoff.Leader(publish=store.publish, duty=0.2, clock=lambda: now[0])
  follower = handoff.Follower(store.read)
  answers = []

  def ask(t):
    now[0] = t
    answers.append(leader.wanted())
  ask(0.0)                       # idle: yes
  leader.put(handoff.Item(1, payload=None))
  assert leader.take().step == 1
  ask(0.1)                       # writing: no
  now[0] = 0.5
  leader.done()                  # a 0.5 s write: rests 2 s, to 2.5
  ask(0.6)                       # rests 1.9 s more, questions come every 0.5 s: no
  ask(2.2)                       # 0.3 s more, at a pace of 1.6 s: yes (it waits out the rest)
  assert answers == [True, False, False, True]
  assert [follower.wanted() for _ in answers] == answers
  assert handoff.Leader().wanted()


def test_an_urgent_save_is_written_without_the_rest():
  """An epoch's validated checkpoint (urgent) must exist for keep_best: it is not left waiting
  out the writer's rest, where the next save would coalesce it."""
  leader = handoff.Leader(duty=0.01)
  written = []
  thread = _writer(leader, written, lambda: 0.05)
  leader.put(handoff.Item(1, payload=None))
  time.sleep(0.2)                 # written; resting ~5 s
  leader.put(handoff.Item(2, payload=None, urgent=True))
  time.sleep(0.3)
  assert written == [1, 2]
  leader.put(handoff.Item(3, payload=None))   # an ordinary one rests
  time.sleep(0.3)
  assert written == [1, 2]
  leader.close()
  thread.join(timeout=10)
  assert written == [1, 2, 3]     # closing cuts the rest short


def test_a_duty_of_one_never_rests():
  leader = handoff.Leader(duty=1.0)
  written = []
  thread = _writer(leader, written, lambda: 0.02)
  for step in range(1, 21):
    leader.put(handoff.Item(step, payload=None))
    time.sleep(0.03)   # longer than a write: each is written
  leader.join()
  leader.close()
  thread.join(timeout=10)
  assert written == list(range(1, 21)) and not leader.coalesced


def _state(value: float):
  return {"w": jnp.full((64,), value), "step": jnp.asarray(int(value), jnp.int32)}


def _lineage(step):
  return lineage.Lineage.start(epoch=0, global_step=step, seed=0, placement="p", hosts=("h",),
                               base_N=np.zeros(10, bool))


def test_checkpointer_saves_do_not_wait_for_a_slow_write(tmp_path, monkeypatch):
  real = checkpointer.Checkpointer._save_now   # pylint: disable=protected-access
  written = []

  def slow(self, packed, layout, saved, guard=None):
    time.sleep(0.4)
    real(self, packed, layout, saved, guard)
    written.append(saved.global_step)
  monkeypatch.setattr(checkpointer.Checkpointer, "_save_now", slow)
  ckpt = checkpointer.Checkpointer(str(tmp_path / "ckpt"))
  ckpt.save(_state(0.0), _lineage(0))   # the packer's first call compiles
  ckpt.wait()
  first = ckpt.blocked_s
  for step in range(1, 9):
    ckpt.save(_state(float(step)), _lineage(step))
  assert ckpt.blocked_s - first < 0.4   # 8 saves took less than one write
  ckpt.wait()
  assert written[-1] == 8 and len(written) <= 3
  assert sorted(written[1:] + ckpt.coalesced) == list(range(1, 9))
  assert ckpt.steps() == sorted(written)
  restored = ckpt.restore(8, jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), _state(0.0)))
  np.testing.assert_array_equal(np.asarray(restored["w"]), 8.0)
  ckpt.close()


SCRIPT = textwrap.dedent("""
    import json, sys, time, random
    import jax, jax.numpy as jnp, numpy as np
    process, port, directory = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=process)
    from medjax import lineage
    from medjax.checkpoint import checkpointer
    real, written = checkpointer.Checkpointer._save_now, []
    rng = random.Random(process)
    def slow(self, packed, layout, saved, guard=None):
      time.sleep(rng.choice([0.05, 0.3]) if process == 1 else 0.1)   # process 1 lags at times
      real(self, packed, layout, saved, guard)
      written.append(saved.global_step)
    checkpointer.Checkpointer._save_now = slow
    mesh = jax.make_mesh((2,), ("d",))
    whole = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    def state(v):
      return {"w": jax.make_array_from_process_local_data(whole, np.full((16,), v, np.float32))}
    ckpt = checkpointer.Checkpointer(directory)
    blocked = []
    for step in range(1, 25):
      t0 = time.perf_counter()
      ckpt.save(state(float(step)), lineage.Lineage.start(
          epoch=0, global_step=step, seed=0, placement="p", hosts=("h",),
          base_N=np.zeros(4, bool)))
      blocked.append(time.perf_counter() - t0)
      time.sleep(0.02)
    ckpt.wait()
    ckpt.close()
    print(json.dumps({"written": written, "coalesced": ckpt.coalesced,
                      "slowest_save_s": max(blocked[1:])}))
    jax.distributed.shutdown()
""")


@pytest.mark.slow
def test_two_processes_coalesce_the_same_saves(tmp_path):
  port = protocol.free_port()
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1",
             JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  procs = [subprocess.Popen([sys.executable, "-c", SCRIPT, str(p), str(port),
                             str(tmp_path / "ckpt")], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True) for p in (0, 1)]
  out = []
  for proc in procs:
    stdout, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 0, stderr[-3000:]
    out.append(json.loads(stdout.strip().splitlines()[-1]))
  assert out[0]["written"] == out[1]["written"]
  assert out[0]["coalesced"] == out[1]["coalesced"] != []
  assert out[0]["written"][-1] == 24
  assert sorted(out[0]["written"] + out[0]["coalesced"]) == list(range(1, 25))
  assert sorted(int(d) for d in os.listdir(tmp_path / "ckpt") if d.isdigit()) == \
      sorted(out[0]["written"])
