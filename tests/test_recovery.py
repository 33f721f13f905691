"""Fast recovery's parts without a run: the layout choice, which standby serves a generation,
the phase report a worker sends, the per-failure breakdown in summary.json, and how soon an
agent sees a worker exit (one short real process).

tests/test_fault.py runs them for real (a crash recovered through a warm standby).
"""

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import ml_collections
import pytest

from configs import default
from medjax.fault import agent as agent_lib
from medjax.fault import forking
from medjax.fault import layout
from medjax.fault import protocol
from medjax.fault import report
from medjax.fault import run_state
from medjax.fault import spawn
from medjax.fault import standbys as standbys_lib
from medjax.runtime import context
from medjax.runtime import phases as phases_lib
from tests import test_coordinator_policy as policy_tests


def _fault(**overrides):
  f = ml_collections.ConfigDict(default.get_config().fault.to_dict())
  f.update(overrides)
  return f


def test_auto_layout_is_one_process_on_a_cpu_host():
  chosen = layout.resolve(_fault(), environ={"JAX_PLATFORMS": "cpu"})
  assert (chosen.workers_per_host, chosen.devices_per_worker, chosen.platform) == (1, 1, "cpu")
  assert chosen.reason.startswith("auto: CPU only, one worker process")
  # An explicit count is kept (the multi-process paths and their tests).
  assert layout.resolve(_fault(workers_per_host=2), {"JAX_PLATFORMS": "cpu"}).workers_per_host == 2


def test_auto_layout_is_one_process_per_gpu(monkeypatch):
  gpus = [f"/proc/driver/nvidia/gpus/0000:0{i}:00.0" for i in range(4)]
  monkeypatch.setattr(layout.glob, "glob",
                      lambda pattern: gpus if pattern.startswith("/proc/driver/nvidia") else [])
  chosen = layout.resolve(_fault(), environ={})
  assert (chosen.workers_per_host, chosen.devices_per_worker, chosen.platform) == (4, 1, "gpu")
  assert layout.resolve(_fault(), environ={"CUDA_VISIBLE_DEVICES": "1,3"}).workers_per_host == 2
  # JAX_PLATFORMS=cpu pins the CPU whatever the machine has.
  assert layout.resolve(_fault(), environ={"JAX_PLATFORMS": "cpu"}).platform == "cpu"


def test_each_gpu_worker_of_a_host_takes_its_own_gpus(monkeypatch):
  gpus = [f"/proc/driver/nvidia/gpus/0000:0{i}:00.0" for i in range(4)]
  monkeypatch.setattr(layout.glob, "glob",
                      lambda pattern: gpus if pattern.startswith("/proc/driver/nvidia") else [])
  # Host 1 of a 4-GPU-per-host job: processes 4..7 are its local workers 0..3.
  assert [layout.local_device_ids(p, 4, 1, environ={}) for p in range(4, 8)] == [[0], [1], [2], [3]]
  assert layout.local_device_ids(3, 2, 2, environ={}) == [2, 3]
  # One worker per host, or CPU workers (their own fake devices): jax.distributed's default.
  assert layout.local_device_ids(0, 1, 1, environ={}) is None
  assert layout.local_device_ids(1, 2, 1, environ={"JAX_PLATFORMS": "cpu"}) is None


def test_resolve_config_writes_the_layout_into_the_config():
  config = default.get_config()
  fault, chosen = layout.resolved(config.fault, environ={"JAX_PLATFORMS": "cpu"})
  assert fault.workers_per_host == 1 and config.fault.workers_per_host == 0   # a copy
  layout.resolve_config(config, environ={"JAX_PLATFORMS": "cpu"})
  assert config.fault.workers_per_host == chosen.workers_per_host == 1


SPEC = {"generation": 3, "hosts": ["host-0"], "host_history": [["host-0"]],
        "workers_per_host": 1, "num_processes": 1, "devices_per_worker": 1,
        "jax_address": "127.0.0.1:1"}


def test_generations_of_one_cpu_host_get_warm_standbys():
  warm_key = standbys_lib.warm_key
  assert warm_key(SPEC, "host-0", "cpu") is not None
  assert warm_key({**SPEC, "generation": 9, "jax_address": "x:2"}, "host-0", "cpu") == \
      warm_key(SPEC, "host-0", "cpu")   # the same shape, whatever the generation
  two = {**SPEC, "workers_per_host": 2, "num_processes": 2}
  # Several processes of one host: a group that joins jax.distributed ahead; not over hosts.
  assert warm_key(two, "host-0", "cpu") not in (None, warm_key(SPEC, "host-0", "cpu"))
  over_two = {**SPEC, "hosts": ["host-0", "host-1"], "host_history": [["host-0", "host-1"]],
              "num_processes": 2}
  assert warm_key(over_two, "host-0", "cpu") is None
  assert warm_key(SPEC, "host-0", "gpu") is not None   # beside the running worker
  assert warm_key(SPEC, "host-0", "tpu") is None       # one process per chip
  shrunk = {**SPEC, "host_history": [["host-0", "host-1"], ["host-0"]]}
  assert warm_key(shrunk, "host-0", "cpu") != warm_key(SPEC, "host-0", "cpu")


def test_a_standby_prepares_after_a_failure_by_default():
  first = {**SPEC, "generation": 1}
  assert standbys_lib.warm_key(first, "host-0", "cpu", "after_failure") is None
  assert standbys_lib.warm_key(first, "host-0", "cpu", "always") is not None
  # From the second generation on it prepares, for the same shape as 'always' would.
  assert standbys_lib.warm_key(SPEC, "host-0", "cpu", "after_failure") == \
      standbys_lib.warm_key(SPEC, "host-0", "cpu", "always")
  assert standbys_lib.warm_key(SPEC, "host-0", "cpu", "never") is None


class _Proc:
  def __init__(self):
    self.killed = False
    self.pid = 0

  def poll(self):
    return -9 if self.killed else None

  def kill(self):
    self.killed = True

  def wait(self, timeout=None):
    return self.poll()


def _agent(tmp_path, workers_per_host: int = 1) -> agent_lib.Agent:
  config = default.get_config()
  config.fault.workers_per_host = workers_per_host
  return agent_lib.Agent("127.0.0.1:1", "token", host="host-0", workdir=str(tmp_path),
                         fault_config=config.fault)


def test_a_cpu_worker_keeps_the_users_xla_flags_with_its_own_device_count(tmp_path, monkeypatch):
  """The agent gives each CPU worker its device count and keeps the user's other XLA flags (a
  dump folder, the backend's optimisation level); a device count the user set is replaced."""
  agent = _agent(tmp_path)
  monkeypatch.setenv("XLA_FLAGS", "--xla_backend_optimization_level=0 "
                     "--xla_force_host_platform_device_count=8 --xla_dump_to=/tmp/d")
  assert agent._env(2)["XLA_FLAGS"].split() == [
      "--xla_backend_optimization_level=0", "--xla_dump_to=/tmp/d",
      "--xla_force_host_platform_device_count=2"]
  monkeypatch.delenv("XLA_FLAGS")
  assert agent._env(1)["XLA_FLAGS"] == "--xla_force_host_platform_device_count=1"


def test_on_a_gpu_only_spares_started_beside_a_running_worker_prepare(tmp_path, monkeypatch):
  """JAX takes 75% of a GPU's memory at its start: a spare started while a generation trains
  allocates what it uses instead, so that it can prepare beside the worker on the same GPU;
  workers started before anything trains keep JAX's default, and a spare without the room is
  not told to prepare."""
  agent = _agent(tmp_path)
  monkeypatch.delenv("XLA_PYTHON_CLIENT_PREALLOCATE", raising=False)
  assert "XLA_PYTHON_CLIENT_PREALLOCATE" not in agent._env(1, beside=True)   # a CPU host
  agent.layout = layout.Layout(1, 1, "gpu", "test")
  agent.standbys.platform = "gpu"
  assert "XLA_PYTHON_CLIENT_PREALLOCATE" not in agent._env(1)
  assert agent._env(1, beside=True)["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
  monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "true")
  assert agent._env(1, beside=True)["XLA_PYTHON_CLIENT_PREALLOCATE"] == "true"
  started = []
  monkeypatch.setattr(agent.standbys, "popen_standby",
                      lambda low_priority, beside=False, fork_spare=False:
                      started.append(beside) or _Proc())
  told = []
  monkeypatch.setattr(agent.standbys, "tell", lambda s, message, close: told.append(s) or True)
  agent.standbys.warm_when = "always"
  agent.standbys.pool = [standbys_lib.Standby(_Proc())]   # left from the start: not beside
  running = {**SPEC, "generation": 1}
  agent.standbys.replenish(running)
  assert started == told == [] and agent.standbys.pool[0].prepared_for is None
  agent.standbys.pool = []
  agent.standbys.replenish(running)
  assert started == [True] and agent.standbys.pool[0].beside and told == agent.standbys.pool
  assert agent.standbys.pool[0].prepared_for == standbys_lib.warm_key(running, "host-0", "gpu")


def test_a_generation_takes_the_standby_prepared_for_its_shape(tmp_path):
  agent = _agent(tmp_path)
  key = standbys_lib.warm_key(SPEC, "host-0", agent.layout.platform)
  bare, warm, stale = (standbys_lib.Standby(_Proc()), standbys_lib.Standby(_Proc(), key),
                       standbys_lib.Standby(_Proc(), "another shape"))
  agent.standbys.pool = [bare, stale, warm]
  assert agent.standbys.take(SPEC) == (warm, "warm_standby")
  assert agent.standbys.take(SPEC) == (bare, "standby")
  # One prepared for another shape cannot serve (its JAX is initialised for that one).
  assert agent.standbys.take(SPEC) == (None, "relaunch")
  two = {**SPEC, "workers_per_host": 2, "num_processes": 2}
  agent.standbys.pool = [standbys_lib.Standby(_Proc(), key), standbys_lib.Standby(_Proc())]
  assert agent.standbys.take(two)[1] == "standby"


def _pidfds() -> list[str]:
  """This process's open pidfds (counting all its fds failed when another test's fd closed)."""
  found = []
  for fd in os.listdir("/proc/self/fd"):
    try:
      if os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:[pidfd]":
        found.append(fd)
    except OSError:   # the listing's own fd, or one closed meanwhile
      pass
  return found


def test_an_agent_wakes_as_soon_as_a_worker_exits(tmp_path):
  # Between heartbeats the agent waits on its workers' pidfds: a crash (or the end of the run)
  # is reported within milliseconds, not at the next interval.
  agent = _agent(tmp_path)
  pidfds = _pidfds()
  worker = agent_lib.Worker(0, subprocess.Popen([sys.executable, "-c",
                                                 "import time; time.sleep(0.3)"]))
  agent.workers = [worker]
  t0 = time.monotonic()
  agent._nap(20.0)
  assert time.monotonic() - t0 < 10.0 and worker.proc.poll() == 0
  t0 = time.monotonic()
  agent._nap(0.2)   # the exit was seen: nothing left to watch, a plain sleep
  assert time.monotonic() - t0 >= 0.19
  assert _pidfds() == pidfds   # no pidfd left open
  agent._forget_workers()
  assert agent.workers == []


def test_an_agent_adopts_the_spare_a_standby_forked_or_starts_one(tmp_path, monkeypatch):
  # A standby forks its spare once imported and the spare writes its pid on the socket pair the
  # agent made (worker._fork_spare; tests/test_fault.py runs it for real): the agent keeps it as
  # a standby that reads its lines from that socket. A standby that closes its end without
  # forking gets a spare started anew.
  agent = _agent(tmp_path)
  started = []
  monkeypatch.setattr(spawn, "popen", lambda *a, **k: started.append(k) or _Proc())
  forked, silent, quiet = socket.socketpair(), socket.socketpair(), socket.socketpair()
  agent.standbys.pending_spares = [forked[0], silent[0], quiet[0]]
  forked[1].sendall(b"4242\n")
  silent[1].close()
  agent.standbys.adopt_spares()
  assert agent.standbys.pending_spares == [quiet[0]]   # nothing written yet: still pending
  spare = next(s for s in agent.standbys.pool if s.proc.pid == 4242)
  assert isinstance(spare.proc, forking.Forked) and spare.prepared_for is None
  assert agent.standbys.tell(spare, {"generation": 2}, close=True)
  assert forked[1].makefile().readline() == '{"generation": 2}\n'
  assert len(started) == 1 and len(agent.standbys.pool) == 2   # the silent standby's replacement
  assert started[0]["stdin"] == subprocess.PIPE and not started[0]["pass_fds"]
  for sock in (*forked, *silent[:1], *quiet):
    sock.close()


def _spawn(code: str) -> int:
  """A child process's pid, with no Popen object that could collect its status first (and no
  fork of this process, whose JAX threads a fork would leave behind)."""
  return os.posix_spawn(sys.executable, [sys.executable, "-c", code], os.environ)


@pytest.mark.parametrize("code, reason", [
    ("import jax; jax.devices()", "fatal: Unknown flag in XLA_FLAGS: --xla_medjax_no_such_flag=1"),
    ("import ctypes; ctypes.string_at(0)", "fatal: Segmentation fault"),
    ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", ""),
])
def test_a_workers_fatal_line_is_read_from_its_log(tmp_path, code, reason):
  """Real exits from native code: XLA refusing a flag, a segmentation fault (faulthandler on, as
  absl's app.run has it in workers), and a SIGKILL, which leaves nothing to read."""
  log = tmp_path / "gen-001-proc-000.log"
  env = {**os.environ, "XLA_FLAGS": "--xla_medjax_no_such_flag=1", "JAX_PLATFORMS": "cpu"}
  with open(log, "w") as out:
    out.write("I1129 04:05:59.387455 140700453243776 worker.py:293] worker 0: generation 1\n")
    out.flush()
    run = subprocess.run([sys.executable, "-X", "faulthandler", "-c", code], stdout=out,
                         stderr=out, env=env, timeout=60, check=False)
  assert run.returncode != 0
  assert agent_lib.fatal_line(str(log)) == reason, log.read_text()[-2000:]


def test_a_forked_handle_reads_its_childs_status_like_popen():
  child = forking.Forked(_spawn("import time; time.sleep(0.5); raise SystemExit(3)"))
  assert child.poll() is None
  with pytest.raises(subprocess.TimeoutExpired):
    child.wait(timeout=0.05)
  assert child.wait(timeout=30) == 3 and child.returncode == 3
  child.kill()   # gone: nothing to signal
  child = forking.Forked(_spawn("import time; time.sleep(60)"))
  child.terminate()
  assert child.wait(timeout=30) == -signal.SIGTERM


def _group_agent(tmp_path, monkeypatch):
  """An agent of 2 workers per host whose standbys and processes are fakes; what it tells them."""
  agent = _agent(tmp_path, workers_per_host=2)
  told = []
  monkeypatch.setattr(agent.standbys, "tell",
                      lambda s, message, close: told.append((s, message)) or True)
  monkeypatch.setattr(spawn, "popen", lambda *a, **k: _Proc())
  return agent, told


def test_a_group_of_standbys_joins_one_address_and_becomes_the_next_generation(
    tmp_path, monkeypatch):
  agent, told = _group_agent(tmp_path, monkeypatch)
  running = {**SPEC, "workers_per_host": 2, "num_processes": 2}
  agent.standbys.replenish(running)
  prepares = [m for _, m in told if "prepare" in m]
  assert [m["distributed"]["process_id"] for m in prepares] == [0, 1]
  (address,) = {m["distributed"]["address"] for m in prepares}
  assert all(m["distributed"]["num_processes"] == 2 for m in prepares)
  # Offered as this host's port, so that the coordinator's next spec uses it.
  assert f"127.0.0.1:{agent.standbys.free_port()}" == address
  agent.standbys.replenish(running)   # the group is there: nothing told again
  assert len([m for _, m in told if "prepare" in m]) == 2
  group = sorted(agent.standbys.pool, key=lambda s: s.process_id)
  told.clear()
  agent._start({**running, "generation": 4, "jax_address": address})
  assigned = [(s, m["process_id"], m["path"]) for s, m in told]
  assert assigned == [(group[0], 0, "warm_standby"), (group[1], 1, "warm_standby")]
  assert agent.standbys.group_port is None and not agent.standbys.pool


def test_a_group_that_cannot_serve_the_generation_is_ended(tmp_path, monkeypatch):
  agent, told = _group_agent(tmp_path, monkeypatch)
  running = {**SPEC, "workers_per_host": 2, "num_processes": 2}
  agent.standbys.replenish(running)
  group = list(agent.standbys.pool)
  # Another address (the coordinator chose before the group existed): the group joined its own.
  told.clear()
  agent._start({**running, "generation": 4, "jax_address": "127.0.0.1:1"})
  assert all(s.proc.killed for s in group) and agent.standbys.group_port is None
  assert [m.get("path") for _, m in told] == []   # new processes, not the group's
  assert [w.process_id for w in agent.workers] == [0, 1]
  # A member that exits takes its group with it; a new group is tried, at most MAX_GROUPS.
  agent.workers = []
  agent.standbys.replenish(running)
  first = [s for s in agent.standbys.pool if s.process_id is not None]
  assert len(first) == 2
  first[1].proc.kill()
  agent.standbys.replenish(running)
  assert first[0].proc.killed and agent.standbys.group_port is None
  agent.standbys.replenish(running)
  assert len([s for s in agent.standbys.pool if s.process_id is not None]) == 2
  agent.standbys.pool[0].proc.kill()
  agent.standbys.replenish(running)
  agent.standbys.replenish(running)
  # Two groups lost this generation: its standbys stay unprepared ('standby' at the next start).
  assert agent.standbys.groups_tried == standbys_lib.Standbys.MAX_GROUPS
  assert [s.prepared_for for s in agent.standbys.pool] == [None, None]


def test_the_phase_report_rides_on_one_heartbeat_once_the_first_step_is_done():
  sent = []

  class Client:
    address = "127.0.0.1:1"

    def call(self, method, msg=None):
      sent.append((method, msg))
      return {}

  phases = phases_lib.Phases("warm_standby", assigned_at=100.0)
  client = phases_lib.Reporting(Client(), phases)
  with phases.phase("restore"):
    pass
  client.call("WorkerHeartbeat", {"phase": "restoring"})
  phases.start_first_step()
  phases.first_step_done()
  client.call("WorkerHeartbeat", {"phase": "training"})
  client.call("WorkerHeartbeat", {"phase": "training"})
  client.call("Commit", {"record": {}})
  carried = [msg.get("phases") for _, msg in sent]
  assert carried[0] is None and carried[2] is None and carried[3] is None
  report_ = carried[1]
  assert report_["path"] == "warm_standby" and set(report_["phases"]) == {"restore",
                                                                         "first_step"}
  assert report_["total_s"] == pytest.approx(report_["first_step_at"] - 100.0)


def test_the_coordinator_writes_each_workers_phases_once():
  run = policy_tests.Run()
  run.start(train=False)
  sent = {"path": "standby", "phases": {"compile": 1.5}, "assigned_at": 1.0}
  run.beat(0, "compiling")
  run.beat(0, "training", phases=sent)
  run.beat(0, "training", phases=sent)
  run.beat(1, "training", phases={**sent, "path": "relaunch"})
  events = run.named("generation_phases")
  assert [(e["process_id"], e["path"]) for e in events] == [(0, "standby"), (1, "relaunch")]
  assert events[0]["phases"] == {"compile": 1.5}
  assert set(run.state.gen_stats["1"]["phases"]) == {"0", "1"}


def _failure(t_detect: float, recovered_s: float | None) -> run_state.Failure:
  return run_state.Failure(kind="crash", worker=0, host="host-0", generation=1, step=40,
                        committed_step=36, detected_s=0.2, t_detect=t_detect,
                        recovered_s=recovered_s)


def test_a_failures_recovery_is_broken_down_by_phase():
  events = [
      {"time": 99.0, "event": "first_step", "generation": 1},
      {"time": 100.0, "event": "failure", "generation": 1},
      {"time": 100.05, "event": "generation_stopped", "generation": 1},
      {"time": 100.1, "event": "generation_start", "generation": 2},
      {"time": 100.6, "event": "generation_phases", "generation": 2, "process_id": 0,
       "path": "warm_standby", "assigned_at": 100.15, "first_step_at": 100.58,
       "phases": {"handover": 0.01, "data_takeover": 0.02, "restore": 0.2, "first_step": 0.15},
       "prepared": {"compile": 1.1, "prepared_before_s": 30.0}, "compile_cache": "hit"},
      {"time": 100.6, "event": "first_step", "generation": 2},
  ]
  r = report.recovery(events, _failure(100.0, 0.6))
  assert r["path"] == "warm_standby" and r["generation"] == 2
  assert list(r["phases_s"]) == ["stop", "backoff", "agent", "handover", "data_takeover",
                                 "restore", "first_step", "report", "other"]
  assert r["phases_s"]["stop"] == pytest.approx(0.05)
  assert r["phases_s"]["agent"] == pytest.approx(0.05)
  assert r["phases_s"]["report"] == pytest.approx(0.02)
  assert sum(r["phases_s"].values()) == pytest.approx(0.6, abs=1e-3)
  assert r["prepared_ahead_s"]["compile"] == 1.1 and r["compile_cache"] == "hit"
  # A failure the run never recovered from (it ended, or gave up) has no breakdown.
  assert report.recovery(events[:3], _failure(100.0, None)) is None


def test_a_process_other_than_0_waits_for_the_jax_distributed_service_to_listen():
  """A gRPC client that connects before its server listens retries only after a second:
  `wait_for_listener` returns as soon as the port accepts connections, and False when nothing
  ever listens."""
  port = protocol.free_port()
  listener = socket.socket()
  listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
  timer = threading.Timer(0.3, lambda: (listener.bind(("127.0.0.1", port)), listener.listen()))
  timer.start()
  try:
    t0 = time.monotonic()
    assert protocol.wait_for_listener(f"127.0.0.1:{port}", timeout_s=10.0)
    assert 0.25 < time.monotonic() - t0 < 2.0
  finally:
    timer.join()
    listener.close()
  t0 = time.monotonic()
  assert not protocol.wait_for_listener(f"127.0.0.1:{protocol.free_port()}", timeout_s=0.2)
  assert time.monotonic() - t0 < 2.0


def test_a_phase_change_rides_on_the_next_heartbeat_without_a_call_of_its_own():
  """A checkpoint flips the phase twice in under a millisecond: no heartbeat is sent for it;
  the next regular one carries the phase then current and the counter moved by the flips (a
  phase change is progress)."""
  beats = []

  class Client:
    address = "127.0.0.1:1"

    def call(self, method, msg=None):
      if method == "WorkerHeartbeat":
        beats.append((time.monotonic(), msg["phase"], msg["counter"]))
      return {}

  ctx = context.Remote(Client(), generation=1, process_id=0, interval_s=0.5)
  try:
    time.sleep(0.1)
    flipped_at = time.monotonic()
    for _ in range(20):
      ctx.set_phase("checkpointing")
      ctx.set_phase("training")
    ctx.set_phase("validating")
    time.sleep(0.05)
    assert [b for b in beats if b[0] >= flipped_at] == []
    deadline = time.monotonic() + 2.0
    while not [b for b in beats if b[0] >= flipped_at] and time.monotonic() < deadline:
      time.sleep(0.01)
    after = [b for b in beats if b[0] >= flipped_at]
    assert after and after[0][1] == "validating" and after[0][2] == 41
  finally:
    ctx.close()


def test_back_to_training_while_the_coordinator_hears_the_phase_before_is_told_at_once():
  """A beat carrying 'epoch_end' is still under way when the phase goes back to training (the
  call takes a while): once it returns, 'training' follows at once, not with the next regular
  beat. (A worker frozen in between was held to the epoch end's 600 s timeout.)"""
  beats, answered, sent = [], threading.Event(), threading.Event()

  class Client:
    address = "127.0.0.1:1"

    def call(self, method, msg=None):
      if method == "WorkerHeartbeat":
        beats.append((time.monotonic(), msg["phase"]))
        if msg["phase"] == "epoch_end":
          sent.set()
          answered.wait(5)
      return {}

  ctx = context.Remote(Client(), generation=1, process_id=0, interval_s=1.5)
  try:
    ctx.set_phase("epoch_end")
    assert sent.wait(10)
    ctx.set_phase("training")   # the coordinator has not heard 'epoch_end' yet
    back_at = time.monotonic()
    answered.set()
    deadline = time.monotonic() + 10.0
    while len(beats) < 2 and time.monotonic() < deadline:
      time.sleep(0.01)
    assert [phase for _, phase in beats[:2]] == ["epoch_end", "training"]
    assert beats[1][0] - back_at < 0.75
  finally:
    answered.set()
    ctx.close()


def test_back_to_training_after_a_phase_the_coordinator_heard_is_told_at_once():
  """A beat fell inside an epoch end: the coordinator holds the worker to that phase's fixed
  timeout (minutes) until it hears 'training' again, so that comes at once, not with the next
  regular beat; a flip it never heard costs no call."""
  beats = []

  class Client:
    address = "127.0.0.1:1"

    def call(self, method, msg=None):
      if method == "WorkerHeartbeat":
        beats.append((time.monotonic(), msg["phase"]))
      return {}

  ctx = context.Remote(Client(), generation=1, process_id=0, interval_s=1.5)
  try:
    ctx.set_phase("epoch_end")
    deadline = time.monotonic() + 10.0
    while not beats and time.monotonic() < deadline:
      time.sleep(0.01)
    assert beats and beats[0][1] == "epoch_end"
    back_at = time.monotonic()
    ctx.set_phase("training")
    while len(beats) < 2 and time.monotonic() < deadline:
      time.sleep(0.01)
    assert beats[1][1] == "training" and beats[1][0] - back_at < 0.75
    ctx.set_phase("checkpointing")
    ctx.set_phase("training")
    time.sleep(0.3)
    assert len(beats) == 2
  finally:
    ctx.close()

