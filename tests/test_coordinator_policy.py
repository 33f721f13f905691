"""The coordinator's policy, transition by transition, on a fake clock in milliseconds.

No processes, no gRPC, no jax: `Run` feeds `medjax.fault.policy.Policy` the messages that agents
and workers would send and carries out its effects in memory (events, persisted state, specs).
"""

import collections
import json
import signal

import ml_collections
import pytest

from configs import default
from medjax import schema
from medjax.fault import policy as policy_lib
from medjax.fault import run_state

T0_MS = 1_000_000
Status = run_state.Status


def fault_config(**overrides) -> ml_collections.ConfigDict:
  f = ml_collections.ConfigDict(default.get_config().fault.to_dict())
  # The coordinator resolves the default (0, auto: medjax.fault.layout) before the policy sees
  # it; these generations have 2 workers per host unless a test says otherwise.
  f.workers_per_host = 2
  f.update(overrides)
  return f


class Run:
  """A policy driven by hand: agents and workers as messages, time in milliseconds."""

  def __init__(self, *, saved=None, last_commit=0, ms=T0_MS, **overrides):
    self.f = fault_config(**overrides)
    self.ms = ms
    self.faults: list[dict] = []      # fault markers, as medjax.runtime.inject.fired returns them
    self.events: list[tuple[str, dict]] = []
    self.saved: dict | None = None    # the last persisted state, through JSON
    self.specs: list[dict] = []
    self.counter = collections.Counter()
    self.step = collections.Counter()
    self.executed = collections.Counter()
    self.phase: dict[int, str] = {}
    self.settled_ms = 0
    self.policy = policy_lib.Policy(self.f, self.now, saved=saved, last_commit=last_commit,
                                fault_times=lambda: list(self.faults))

  @property
  def now(self) -> float:
    return self.ms / 1000

  @property
  def state(self) -> run_state.State:
    return self.policy.state

  @property
  def status(self) -> Status:
    return self.state.status

  def _do(self, effects: run_state.Effects):
    if effects.spec is not None:
      self.specs.append(json.loads(json.dumps(effects.spec)))
    self.events.extend(effects.events)
    if effects.persist:
      self.saved = json.loads(json.dumps(self.state.to_json()))
      # Every state a policy persists is one a restarted coordinator accepts (run_state.SAVED).
      assert run_state.State.from_json(self.saved).to_json() == self.saved
    return effects.reply

  def named(self, name: str) -> list[dict]:
    return [fields for event, fields in self.events if event == name]

  def names(self) -> list[str]:
    return [event for event, _ in self.events]

  # -- what agents and workers send --------------------------------------------------------

  def register(self, host: str, *, generation: int = -1, running: bool = False) -> dict:
    return self._do(self.policy.register_agent(
        {"host": host, "agent_id": host, "free_port": 7000, "address": "10.0.0.1",
         "generation": generation, "workers": [{"process_id": 0, "running": running}]},
        self.now))

  def agent_beat(self, host: str, *, running: bool = True) -> dict:
    return self._do(self.policy.agent_heartbeat(
        {"host": host, "free_port": 7000, "generation": self.state.generation,
         "workers": [{"process_id": 0, "running": running}]}, self.now))

  def beat(self, pid: int, phase: str | None = None, *, progress: bool = True,
           generation: int | None = None, **extra) -> dict:
    """A worker's heartbeat, in `phase` (default: its last one, else training)."""
    phase = self.phase[pid] = phase or self.phase.get(pid, "training")
    if progress:
      self.counter[pid] += 1
      if phase == "training":
        self.step[pid] += 1
        self.executed[pid] += 1
    return self._do(self.policy.worker_heartbeat(
        {"generation": self.state.generation if generation is None else generation,
         "process_id": pid, "phase": phase, "step": self.step[pid], "counter": self.counter[pid],
         "executed": self.executed[pid], "blocked_s": 0.5, **extra}, self.now))

  def exit(self, pid: int, code: int, host: str = "host-0", *,
           generation: int | None = None, reason: str = "", signalled: bool = False) -> dict:
    return self._do(self.policy.report_exit(
        {"host": host, "generation": self.state.generation if generation is None else generation,
         "process_id": pid, "exit_code": code, "signalled": signalled, "reason": reason},
        self.now))

  def commit(self, step: int) -> None:
    self._do(self.policy.committed(step))

  def tick(self) -> None:
    self._do(self.policy.tick(self.now))

  def wait(self, ms: int, *, agents=(), running: bool = True, progress=(), alive=(),
           every: int = 100) -> None:
    """Advances the clock by `ms`, ticking every `every` ms (and at the end); `agents`
    heartbeat, `progress` workers heartbeat with progress, `alive` workers heartbeat without."""
    end = self.ms + ms
    while self.ms < end:
      self.ms = min(self.ms + every, end)
      for host in agents:
        self.agent_beat(host, running=running)
      for pid in progress:
        self.beat(pid)
      for pid in alive:
        self.beat(pid, progress=False)
      self.tick()

  # -- scenarios ---------------------------------------------------------------------------

  def start(self, hosts=("host-0",), *, train: bool = True) -> None:
    """Registers `hosts` and starts a generation on them; `train`: one step on each worker."""
    for host in hosts:
      if host not in self.state.agents:
        self.register(host)
    self.tick()
    assert self.status == Status.RUNNING, self.names()
    for pid in range(self.state.spec["num_processes"]) if train else ():
      self.beat(pid, "compiling")
      self.beat(pid, "training")

  def settle(self, hosts=("host-0",)) -> float:
    """After a failure: the hosts report their workers gone; returns the back-off chosen."""
    assert self.status == Status.STOPPING
    self.ms += 1
    for host in hosts:
      self.agent_beat(host, running=False)
    self.tick()
    assert self.status == Status.BACKOFF, self.names()
    self.settled_ms = self.ms
    return self.state.backoff_until - self.now

  def end_backoff(self) -> int:
    """Ticks every millisecond until the back-off is over; returns how long it took (ms)."""
    while self.status == Status.BACKOFF:
      self.ms += 1
      self.tick()
    return self.ms - self.settled_ms

  def restart(self, hosts=("host-0",), *, train: bool = True) -> int:
    """Waits out the back-off and starts the next generation; returns the back-off (ms)."""
    waited = self.end_backoff()
    self.start(hosts, train=train)
    return waited


def test_generation_starts_once_every_host_is_alive():
  run = Run(local_hosts=2, workers_per_host=1)
  run.register("host-0")
  run.tick()
  assert run.status == Status.WAITING and not run.specs
  assert run.agent_beat("host-0") == {"action": "stop", "generation": 0}
  run.register("host-1")
  run.tick()
  assert run.status == Status.RUNNING
  assert run.specs == [{"generation": 1, "hosts": ["host-0", "host-1"],
                        "host_history": [["host-0", "host-1"]], "workers_per_host": 1,
                        "num_processes": 2, "devices_per_worker": 1,
                        "jax_address": "10.0.0.1:7000"}]
  assert run.named("generation_start") == [{"generation": 1, "hosts": ["host-0", "host-1"],
                                            "num_processes": 2}]
  assert run.saved["status"] == "running" and run.saved["generation"] == 1
  reply = run.agent_beat("host-0")
  assert reply["action"] == "run" and reply["generation"] == 1 and not reply["training"]
  run.beat(0, "training")
  assert run.agent_beat("host-1")["training"] is True
  assert run.named("first_step") == [{"generation": 1, "step": 1}]


@pytest.mark.parametrize("code, kind", [(-9, "crash"), (run_state.EXIT_ERROR, "error"),
                                        (run_state.EXIT_OOM, "oom"),
                                        (run_state.EXIT_PREEMPTED, "preemption"), (77, "exit 77")])
def test_worker_exit_is_a_failure_of_its_kind(code, kind):
  run = Run()
  run.start()
  for _ in range(4):
    run.beat(1)
  run.ms += 300
  run.exit(1, code)
  assert run.status == Status.STOPPING
  assert run.named("worker_exit") == [{"generation": 1, "process_id": 1, "exit_code": code,
                                       "host": "host-0", "reason": ""}]
  assert run.named("failure") == [{
      "kind": kind, "worker": 1, "host": "host-0", "generation": 1, "step": 5,
      "committed_step": 0, "detected_s": 0.3, "recovered_s": None, "fault": None,
      "kind_detail": kind, "reason": ""}]
  assert run.saved["status"] == "stopping" and run.saved["failures"][0]["kind"] == kind
  # Healthy workers are asked to stop at a step boundary, agents to stop their workers.
  assert run.beat(0) == {"stop": True}
  assert run.agent_beat("host-0")["action"] == "stop"


@pytest.mark.parametrize("phase, limit_s", [("training", 4), ("compiling", 7), ("restoring", 7),
                                            ("checkpointing", 7), ("starting", 12),
                                            ("evaluating", 12)])
def test_a_silent_worker_hangs_after_its_phase_timeout(phase, limit_s):
  run = Run(timeout_training_s=4, timeout_compile_s=7, timeout_start_s=12)
  run.start()
  run.beat(0, phase)
  run.wait(limit_s * 1000 - 1, agents=["host-0"], progress=[1])
  assert run.status == Status.RUNNING, run.named("failure")
  run.ms += 2
  run.tick()
  assert run.status == Status.STOPPING
  (failure,) = run.named("failure")
  assert (failure["kind"], failure["worker"], failure["host"]) == ("hang", 0, "host-0")
  assert failure["detected_s"] == pytest.approx(limit_s + 0.001)  # from its last heartbeat


def test_a_live_worker_without_progress_hangs():
  run = Run(timeout_training_s=4)
  run.start()
  run.wait(4000 - 1, agents=["host-0"], progress=[1], alive=[0])
  assert run.status == Status.RUNNING
  run.ms += 2
  run.beat(0, progress=False)
  run.tick()
  assert run.status == Status.STOPPING
  assert [(f["kind"], f["worker"]) for f in run.named("failure")] == [("hang", 0)]


def test_a_phase_change_is_progress():
  run = Run(timeout_training_s=4, timeout_compile_s=7)
  run.start()
  run.wait(3000, agents=["host-0"], progress=[1], alive=[0])
  run.beat(0, "checkpointing", progress=False)   # the same counter, a new phase
  run.wait(6000, agents=["host-0"], progress=[1], alive=[0])
  assert run.status == Status.RUNNING


def test_the_culprit_of_a_hang_is_the_worker_silent_longest():
  run = Run(timeout_training_s=4)
  run.start()
  run.beat(1)
  run.ms += 500
  run.beat(0)
  # Worker 1 silent for 4.6 s, worker 0 for 4.1 s: both past the timeout at this tick.
  run.ms += 4100
  run.agent_beat("host-0")
  run.tick()
  assert [(f["kind"], f["worker"]) for f in run.named("failure")] == [("hang", 1)]

  # A silent worker is the culprit, not a live one without progress that waits on it.
  run = Run(timeout_training_s=4)
  run.start()
  run.beat(1)
  run.wait(4000 + 1, agents=["host-0"], alive=[0])
  assert [(f["kind"], f["worker"]) for f in run.named("failure")] == [("hang", 1)]


def test_a_lost_host_is_a_failure_named_by_the_host():
  run = Run(local_hosts=2, workers_per_host=1)
  run.start(("host-0", "host-1"))
  run.faults.append({"name": "external-host_lost", "host": "host-1", "time": run.now + 0.05})
  run.wait(5000 - 1, agents=["host-0"], progress=[0, 1])
  assert run.status == Status.RUNNING
  run.ms += 2
  run.agent_beat("host-0")
  run.tick()
  (failure,) = run.named("failure")
  assert (failure["kind"], failure["worker"], failure["host"]) == ("host_lost",) + ("host-1",) * 2
  assert failure["fault"] == "external-host_lost"
  assert failure["detected_s"] == pytest.approx(5.001 - 0.05)


def test_a_peer_crash_is_reclassified_when_its_host_turns_out_lost():
  run = Run(local_hosts=2, workers_per_host=1)
  run.start(("host-0", "host-1"))
  host1_last_seen = run.ms
  run.wait(1000, agents=["host-0"], progress=[0])
  run.exit(0, run_state.EXIT_ERROR)   # gloo noticed that its peer is gone before we did
  assert run.named("failure")[0]["kind"] == "error"
  run.ms = host1_last_seen + 5000 - 1
  run.agent_beat("host-0", running=False)
  run.tick()
  assert run.status == Status.STOPPING and not run.named("failure_reclassified")
  run.ms += 2
  run.agent_beat("host-0", running=False)
  run.tick()
  assert run.named("failure_reclassified") == [{"kind": "host_lost", "host": "host-1"}]
  (failure,) = run.state.failures
  assert (failure.kind, failure.worker, failure.host, failure.observed) == (
      "host_lost", "host-1", "host-1", "error")
  # host-0 reported its workers gone and host-1 is lost: the stop is over.
  assert run.named("generation_stopped") == [{"generation": 1}]
  assert run.status == Status.BACKOFF
  assert run.saved["failures"][0]["kind"] == "host_lost"


@pytest.mark.parametrize("seen_after_the_stop", [False, True])
def test_a_peers_error_is_reclassified_as_the_crash_that_caused_it(seen_after_the_stop):
  run = Run()
  run.start()
  run.faults.append({"name": "0-kill@step=4:process=1", "process": 1, "time": run.now - 0.02})
  run.ms += 10
  # Worker 1's sockets closed before its exit was seen: worker 0's collective failed first.
  run.exit(0, run_state.EXIT_ERROR, reason="gloo: connection closed by peer")
  assert run.named("failure")[0]["kind"] == "error"
  run.ms += 15
  if seen_after_the_stop:
    run.settle()
    assert run.status == Status.BACKOFF
  run.exit(1, -signal.SIGKILL)
  assert run.named("failure_reclassified") == [{
      "kind": "crash", "worker": 1, "host": "host-0", "detected_s": 0.03,
      "fault": "0-kill@step=4:process=1"}]
  (failure,) = run.state.failures
  assert (failure.kind, failure.worker, failure.observed, failure.reason) == (
      "crash", 1, "error of worker 0", "")
  assert failure.step == run.step[1]
  assert run.saved["failures"][0]["kind"] == "crash"


@pytest.mark.parametrize("code,signalled", [
    (-signal.SIGKILL, True),      # its agent killed it, stopping the generation
    (-signal.SIGABRT, False),     # an abort can be a peer's symptom too (a failed check)
    (run_state.EXIT_ERROR, False),
    (run_state.EXIT_STOPPED, False)])
def test_a_peers_error_stays_the_failure_when_the_other_exit_is_no_cause(code, signalled):
  run = Run()
  run.start()
  run.exit(0, run_state.EXIT_ERROR, reason="ValueError: a bug")
  run.ms += 15
  run.exit(1, code, signalled=signalled)
  assert not run.named("failure_reclassified")
  (failure,) = run.state.failures
  assert (failure.kind, failure.worker, failure.reason) == ("error", 0, "ValueError: a bug")


def _lose_host_1(run: Run) -> None:
  run.start(("host-0", "host-1"))
  run.wait(5100, agents=["host-0"], progress=[0])
  assert run.named("failure")[0]["kind"] == "host_lost"
  run.settle()
  run.end_backoff()


def test_elastic_shrink_goes_on_with_the_surviving_host():
  run = Run(local_hosts=2, workers_per_host=1, elastic=True, min_hosts=1)
  _lose_host_1(run)
  assert run.status == Status.RUNNING
  assert run.specs[-1]["hosts"] == ["host-0"] and run.specs[-1]["num_processes"] == 1
  assert run.specs[-1]["host_history"] == [["host-0", "host-1"], ["host-0"]]


def test_elastic_shrink_stops_at_min_hosts():
  run = Run(local_hosts=2, workers_per_host=1, elastic=True, min_hosts=2)
  _lose_host_1(run)
  assert run.status == Status.WAITING and len(run.specs) == 1


def test_a_replacement_host_takes_the_lost_ones_place():
  run = Run(local_hosts=2, workers_per_host=1)
  _lose_host_1(run)
  assert run.status == Status.WAITING and len(run.specs) == 1
  run.wait(2000, agents=["host-0"], running=False)
  assert run.status == Status.WAITING
  run.register("host-2")
  run.tick()
  assert run.status == Status.RUNNING
  assert run.specs[-1]["hosts"] == ["host-0", "host-2"] and run.state.generation == 2


def test_without_a_replacement_the_run_gives_up():
  run = Run(local_hosts=2, workers_per_host=1, replacement_wait_s=3.0)
  _lose_host_1(run)
  run.wait(3000 - 1, agents=["host-0"], running=False)
  assert run.status == Status.WAITING
  run.ms += 2
  run.agent_beat("host-0", running=False)
  run.tick()
  assert run.status == Status.FAILED
  expected = ("training stopped: only 1 of 2 hosts alive after waiting 3.0s for a replacement, "
              "and config.fault.elastic is False (min_hosts 1). Last failures: host_lost of worker "
              "host-1 at step 0")
  assert run.state.error == expected
  assert run.named("gave_up") == [{"error": expected}]
  assert run.agent_beat("host-0", running=False) == {"action": "exit"}
  assert run.policy.all_dismissed(run.now)


def test_stop_waits_for_the_workers_to_be_gone():
  run = Run()
  run.start()
  run.exit(0, -9)
  run.wait(1000, agents=["host-0"], running=True)   # the agent still SIGTERMs its workers
  assert run.status == Status.STOPPING
  run.agent_beat("host-0", running=False)
  run.tick()
  assert run.status == Status.BACKOFF


def test_stop_gives_up_waiting_on_an_agent_that_never_says():
  run = Run(stop_grace_s=2.0, host_timeout_s=5.0)
  run.start()
  run.exit(0, -9)
  limit_ms = (2 * 3 + 2 * 4 + 5) * 1000    # the stop deadline, SIGKILL grace, a lost host's wait
  run.wait(limit_ms - 1, agents=["host-0"], running=True)
  assert run.status == Status.STOPPING
  run.ms += 2
  run.tick()
  assert run.status == Status.BACKOFF


def test_back_off_doubles_without_progress_and_resets_after_a_commit():
  run = Run(backoff_s=1.0, backoff_max_s=30.0, max_failures_without_progress=10)
  run.start()
  waited = []
  for _ in range(3):
    run.exit(0, -9)
    run.settle()
    assert run.agent_beat("host-0", running=False)["action"] == "stop"
    waited.append(run.restart())
  # No wait after the first failure (the next tick starts the next generation), then doubling.
  assert waited == [1, 1000, 2000]   # the first tick not before the back-off's end
  assert run.state.strikes == 3
  run.commit(12)    # a new committed checkpoint: progress
  run.exit(1, -9)
  assert run.state.strikes == 1
  assert run.settle() == 0.0
  assert run.named("failure")[-1]["committed_step"] == 12
  assert run.end_backoff() == 1
  run.exit(1, -9)   # a second failure without progress waits fault.backoff_s
  assert run.settle() == pytest.approx(1.0)


def test_back_off_is_capped():
  run = Run(backoff_s=1.0, backoff_max_s=3.0, max_failures_without_progress=10)
  run.start()
  backoffs = []
  for _ in range(4):
    run.exit(0, -9)
    backoffs.append(run.settle())
    run.restart()
  assert backoffs == pytest.approx([0.0, 1.0, 2.0, 3.0])


def test_a_crash_loop_stops_the_run_with_the_failures_named():
  run = Run(max_failures_without_progress=2)
  run.start()
  for attempt in range(3):
    run.beat(0)
    run.beat(0)
    run.exit(0, -9)
    if attempt < 2:
      run.settle()
      run.step.clear()
      run.executed.clear()
      run.restart()
  run.agent_beat("host-0", running=False)
  run.tick()
  assert run.status == Status.FAILED
  expected = ("training stopped: 3 failures in a row without a new committed checkpoint "
              "(config.fault.max_failures_without_progress=2). Last failures: crash of worker 0 at "
              "step 3 (3 times)")
  assert run.state.error == expected
  assert run.names()[-2:] == ["generation_stopped", "gave_up"]
  assert run.named("gave_up") == [{"error": expected}]
  assert len(run.named("failure")) == 3 and run.saved["status"] == "failed"


def test_done_when_every_worker_exits_zero():
  run = Run()
  run.start()
  run.beat(0, "done")
  run.exit(0, 0)
  assert run.status == Status.RUNNING
  # Worker 1's 'done' heartbeat never arrived; its exit code says it finished.
  run.exit(1, 0)
  assert run.status == Status.DONE
  assert run.named("done") == [{"generation": 1}] and run.saved["status"] == "done"
  assert not run.named("failure")
  assert run.agent_beat("host-0", running=True) == {"action": "exit"}
  assert not run.policy.all_dismissed(run.now)   # its workers still run: not dismissed yet
  assert run.agent_beat("host-0", running=False) == {"action": "exit"}
  assert run.policy.all_dismissed(run.now)


def test_an_exited_worker_is_not_a_hang():
  run = Run(timeout_training_s=4)
  run.start()
  run.exit(1, 0)
  run.wait(5000, agents=["host-0"], progress=[0])
  assert run.status == Status.RUNNING


def test_reports_of_an_earlier_generation_change_nothing():
  run = Run()
  run.start()
  assert run.beat(0, generation=0) == {"stop": True}
  run.exit(0, -9)
  run.settle()
  run.restart()
  run.exit(1, -15, generation=1)   # its agent SIGTERMed it while the stop went on
  assert run.named("worker_exit")[-1]["generation"] == 1
  assert run.status == Status.RUNNING and len(run.named("failure")) == 1
  assert run.beat(1, generation=1) == {"stop": True}


def test_detection_is_timed_from_the_fault_marker():
  run = Run()
  run.start()
  run.faults.append({"name": "0-kill@step=6:process=1", "process": 1, "time": run.now - 0.25})
  run.faults.append({"name": "1-kill@step=9:process=1", "process": 1, "time": run.now + 5})
  run.ms += 10
  run.exit(1, -9)
  (failure,) = run.named("failure")
  assert failure["fault"] == "0-kill@step=6:process=1"
  assert failure["detected_s"] == pytest.approx(0.26)
  # A marker counts for one failure only, and never one from the future: the last heartbeat.
  run.settle()
  run.restart()
  run.ms += 40
  run.exit(1, -9)
  assert run.named("failure")[-1]["fault"] is None
  assert run.named("failure")[-1]["detected_s"] == pytest.approx(0.04)


def test_recovery_ends_at_the_next_generations_first_step():
  run = Run()
  run.start()
  run.exit(0, -9)
  t_detect = run.now
  run.settle()
  run.restart(train=False)
  assert run.state.generation == 2
  run.ms += 2000
  run.beat(0, "restoring")
  assert not run.named("recovered")
  run.ms += 1500
  run.beat(0, "training")
  (recovered,) = run.named("recovered")
  assert recovered == {"generation": 2, "step": run.step[0],
                       "recovered_s": pytest.approx(run.now - t_detect, abs=1e-3)}
  assert run.state.failures[0].recovered_s == recovered["recovered_s"]
  assert run.saved["failures"][0]["recovered_s"] == recovered["recovered_s"]
  run.beat(1, "training")
  assert len(run.named("recovered")) == 1 and len(run.named("first_step")) == 2


def test_state_round_trips_through_json():
  run = Run(local_hosts=2, workers_per_host=1)
  run.start(("host-0", "host-1"))
  run.exit(1, -9, host="host-1")
  saved = json.loads(json.dumps(run.state.to_json()))
  assert run_state.State.from_json(saved).to_json() == saved
  assert saved["status"] == "stopping" and saved["failures"][0]["worker"] == 1


def _saved_after_a_recovery() -> dict:
  """A persisted state with every field filled: two generations, a crash and its recovery, a
  lost host, the workers' phase reports."""
  run = Run(local_hosts=2, workers_per_host=1)
  run.start(("host-0", "host-1"))
  run.beat(0, "training", phases={"path": "relaunch", "phases": {"compile": 1.5}})
  run.exit(1, -9, host="host-1")
  run.settle(("host-0", "host-1"))
  run.restart(("host-0", "host-1"))
  saved = json.loads(json.dumps(run.state.to_json()))
  assert saved["failures"][0]["recovered_s"] is not None and saved["spec"]["generation"] == 2
  assert saved["gen_stats"]["1"]["phases"]["0"]["path"] == "relaunch"
  return saved


def _failure(saved: dict) -> dict:
  return saved["failures"][0]


@pytest.mark.parametrize("change, field", [
    # Each persisted field, each with values of other types and out of its range.
    (lambda s: s.update(status=7), "status"),
    (lambda s: s.update(status="exploded"), "status"),
    (lambda s: s.update(generation="2"), "generation"),
    (lambda s: s.update(generation=2.0), "generation"),
    (lambda s: s.update(generation=True), "generation"),
    (lambda s: s.update(generation=-1), "generation"),
    (lambda s: s.pop("generation"), "generation"),
    (lambda s: s.update(history="host-0"), "history"),
    (lambda s: s.update(history=[["host-0", 1]]), "history[0][1]"),
    (lambda s: s.update(failures=[1, 2]), "failures[0]"),
    (lambda s: s.update(failures={"0": {}}), "failures"),
    (lambda s: _failure(s).update(step="5"), "failures[0].step"),
    (lambda s: _failure(s).update(worker=[1]), "failures[0].worker"),
    (lambda s: _failure(s).update(worker=-3), "failures[0].worker"),
    (lambda s: _failure(s).update(kind=None), "failures[0].kind"),
    (lambda s: _failure(s).update(host=5), "failures[0].host"),
    (lambda s: _failure(s).update(detected_s=float("nan")), "failures[0].detected_s"),
    (lambda s: _failure(s).update(recovered_s="1.5"), "failures[0].recovered_s"),
    (lambda s: _failure(s).update(reason=None), "failures[0].reason"),
    (lambda s: _failure(s).pop("t_detect"), "failures[0].t_detect"),
    (lambda s: s.update(gen_stats=[]), "gen_stats"),
    (lambda s: s.update(gen_stats={"1": "started"}), "gen_stats.1"),
    (lambda s: s.update(gen_stats={"one": {}}), "gen_stats"),
    (lambda s: s["gen_stats"]["1"].update(executed="30"), "gen_stats.1.executed"),
    (lambda s: s["gen_stats"]["1"].update(started=None), "gen_stats.1.started"),
    (lambda s: s["gen_stats"]["1"].update(phases=[]), "gen_stats.1.phases"),
    (lambda s: s.update(strikes=-1), "strikes"),
    (lambda s: s.update(strikes="1"), "strikes"),
    (lambda s: s.update(commits_at_failure=None), "commits_at_failure"),
    (lambda s: s.update(commits_at_failure=-2), "commits_at_failure"),
    (lambda s: s.update(spec=[]), "spec"),
    (lambda s: s.update(spec="gen-002.json"), "spec"),
    (lambda s: s["spec"].update(hosts="host-0"), "spec.hosts"),
    (lambda s: s["spec"].update(hosts=[]), "spec.hosts"),
    (lambda s: s["spec"].update(num_processes="2"), "spec.num_processes"),
    (lambda s: s["spec"].update(num_processes=3), "spec"),        # not hosts x workers_per_host
    (lambda s: s["spec"].update(workers_per_host=0), "spec.workers_per_host"),
    (lambda s: s["spec"].update(host_history=[["host-0"], "host-1"]), "spec.host_history[1]"),
    (lambda s: s["spec"].pop("jax_address"), "spec.jax_address"),
    (lambda s: s["spec"].update(generation=5), "spec.generation"),  # not the state's
])
def test_a_saved_state_of_another_shape_is_refused_naming_the_field(change, field):
  saved = _saved_after_a_recovery()
  change(saved)
  with pytest.raises(schema.SchemaError) as e:
    run_state.State.from_json(saved)
  assert e.value.field == field, str(e.value)
  assert str(e.value).startswith(f"field {field!r} "), str(e.value)
  with pytest.raises(schema.SchemaError):
    Run(saved=saved)   # the coordinator then starts from a fresh state (test_bad_state.py)


def test_saved_states_of_every_status_are_accepted():
  saved = _saved_after_a_recovery()
  for status in Status:
    restored = Run(saved={**saved, "status": status.value})
    assert restored.policy.restored and restored.state.generation == 2
  # An earlier coordinator's failure without the optional fields, and a host as the worker.
  failure = {k: v for k, v in _failure(saved).items()
             if k not in ("fault", "recovered_s", "observed", "reason")}
  state = run_state.State.from_json({**saved, "failures": [{**failure, "worker": "host-1"}]})
  assert state.failures[0].worker == "host-1" and state.failures[0].reason == ""


def _persisted_mid_run() -> tuple[dict, int]:
  run = Run()
  run.start()
  run.wait(1000, agents=["host-0"], progress=[0, 1])
  run.commit(8)
  return run.saved, run.ms


def test_a_restarted_coordinator_resumes_the_running_generation():
  saved, ms = _persisted_mid_run()
  run = Run(saved=saved, last_commit=8, ms=ms + 3000)
  assert run.status == Status.RECOVERING and run.state.generation == 1
  # Workers heartbeat the restarted coordinator before their agents re-register.
  assert run.beat(0) == {"stop": False}
  run.tick()
  assert run.status == Status.RECOVERING
  assert run.agent_beat("host-0") == {"action": "register"}
  run.register("host-0", generation=1, running=True)
  assert run.agent_beat("host-0") == {"action": "idle"}
  run.tick()
  assert run.status == Status.RUNNING
  assert run.named("resumed_generation") == [{"generation": 1}]
  assert not run.named("generation_start") and run.saved["status"] == "running"
  # The workers finish; their exits alone say so.
  run.exit(0, 0)
  run.exit(1, 0)
  assert run.status == Status.DONE and run.state.failures == []


def test_a_restarted_coordinator_restarts_a_generation_nobody_runs():
  saved, ms = _persisted_mid_run()
  run = Run(saved=saved, last_commit=8, ms=ms + 3000)
  run.register("host-0", generation=1, running=False)
  run.wait(2 * 5000 - 1, agents=["host-0"], running=False)   # the window: 2 * host_timeout_s
  assert run.status == Status.RECOVERING
  run.ms += 2
  run.tick()
  assert run.named("recovery_restart") == [{"generation": 1}]
  assert run.status == Status.STOPPING
  run.settle()
  run.restart()
  assert run.state.generation == 2 and run.state.failures == []
  assert run.specs[-1]["host_history"] == [["host-0"]]


def test_a_restarted_coordinator_that_was_backing_off_waits_for_hosts():
  run = Run()
  run.start()
  run.exit(0, -9)
  run.settle()
  assert run.saved["status"] == "backoff"
  restarted = Run(saved=run.saved, ms=run.ms + 500)
  assert restarted.status == Status.WAITING
  assert restarted.state.strikes == 1 and len(restarted.state.failures) == 1
  restarted.register("host-0")
  restarted.tick()
  assert restarted.status == Status.RUNNING and restarted.state.generation == 2


def test_status_reports_the_state():
  run = Run()
  run.start()
  status = run.policy.status()
  assert status["status"] == "running" and status["generation"] == 1
  assert status["agents"] == ["host-0"] and set(status["workers"]) == {"0", "1"}
  json.dumps(status)


def test_bad_input_in_a_worker_stops_the_run_at_once_with_its_line():
  run = Run()
  run.start()
  run.beat(0)
  line = "checkpoints: every committed checkpoint is damaged; see the docs"
  run.exit(0, run_state.EXIT_INPUT, reason=line)
  assert run.status == Status.FAILED
  assert run.state.error == line
  assert run.named("gave_up") == [{"error": line}]
  assert run.state.failures[-1].kind == "input" and run.state.failures[-1].reason == line


@pytest.mark.parametrize("signum", [signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE,
                                    signal.SIGABRT, signal.SIGKILL])
def test_a_worker_dead_of_a_fatal_signal_is_a_crash_with_its_reason(signum):
  run = Run()
  run.start()
  run.beat(0)
  run.exit(0, -signum, reason="fatal: Segmentation fault")
  failure = run.state.failures[-1]
  assert (failure.kind, failure.reason) == ("crash", "fatal: Segmentation fault")


def test_a_crash_loop_error_carries_the_workers_reasons():
  run = Run(max_failures_without_progress=0)
  run.start()
  run.beat(0)
  run.exit(0, run_state.EXIT_ERROR, reason="TypeError: bad operand")
  run.agent_beat("host-0", running=False)
  run.tick()
  assert run.status == Status.FAILED
  assert run.state.error.endswith("Last failures: error of worker 0 at step 2 (TypeError: bad "
                                  "operand)")


def _warm(run, pid=0, gap_s=0.05, beats=25, beat_gap_s=0.27):
  """A worker whose steps took `gap_s` for `beats` heartbeats of 0.25 s (`beat_gap_s` apart at
  most)."""
  for i in range(beats):
    run.ms += 250
    run.agent_beat("host-0")
    run.beat(pid, gap_s=gap_s, gaps=min(i + 1, 200), beat_s=0.25, beat_gap_s=beat_gap_s)
    run.tick()


def test_hang_timeouts_are_learned_from_step_gaps_after_a_warm_up():
  run = Run(workers_per_host=1)
  run.start()
  w = run.state.workers[0]
  run.beat(0, gap_s=0.05, gaps=3, beat_s=0.25)
  assert run.policy.hang_limits(w) == (10.0, 10.0)   # warming up: the fixed timeout
  _warm(run)
  # Silent: 5 x 0.27 s between heartbeats = 1.35 s, under the floor: 1.5 s. Stuck:
  # 2 x (5 x 0.05 + 0.25) = 1 s, under twice the floor: 3 s.
  assert run.policy.hang_limits(w) == (1.5, 3.0)
  # Steps with long gaps (a slow partition boundary) lengthen only the stuck timeout; a worker
  # whose heartbeats came late (a loaded machine) gets longer silence.
  _warm(run, gap_s=0.9)
  assert run.policy.hang_limits(w) == pytest.approx((1.5, 9.5))
  _warm(run, beat_gap_s=0.6)
  assert run.policy.hang_limits(w) == pytest.approx((3.0, 3.0))
  # Progress reported in bursts (steps run ahead of the host; a report per ten steps): the
  # warm-up counts the steps the gaps spanned, not the reports.
  run.beat(0, gap_s=0.5, gaps=4, gap_steps=40, beat_s=0.25, beat_gap_s=0.26)
  assert run.policy.hang_limits(w) == pytest.approx((1.5, 5.5))
  run.beat(0, gap_s=0.5, gaps=4, gap_steps=12, beat_s=0.25, beat_gap_s=0.26)
  assert run.policy.hang_limits(w) == (10.0, 10.0)
  run.beat(0, "checkpointing", gap_s=0.05, gaps=25, beat_s=0.25)
  assert run.policy.hang_limits(w) == (180.0, 180.0)  # other phases keep their fixed timeouts


def test_a_silent_worker_is_a_hang_in_under_two_seconds_once_warm():
  run = Run(workers_per_host=1)
  run.start()
  _warm(run, gap_s=0.9)   # even with a slow step among the recent ones
  stopped_ms = run.ms
  while run.status == Status.RUNNING:          # SIGSTOP: no heartbeat, no progress
    run.ms += 50
    run.agent_beat("host-0")
    run.tick()
  assert run.named("failure")[0]["kind"] == "hang"
  assert (run.ms - stopped_ms) / 1000 < 2.0


def test_a_frozen_worker_is_the_culprit_when_its_blocked_peer_trips_first():
  # Two workers of one collective, warm. Worker 0 saw a slow step and late heartbeats now and
  # then (stuck after 2 x (5 x 0.5 + 0.25) = 5.5 s, silent after 5 x 0.8 = 4 s); worker 1's
  # steps are quick (stuck after 3 s). Worker 0 is frozen (SIGSTOP), worker 1 blocks in the
  # step's all-reduce and goes on beating: its stuck timeout runs out first, and the failure
  # must still name worker 0.
  run = Run(workers_per_host=2)
  run.start()
  for i in range(25):
    run.ms += 250
    run.agent_beat("host-0")
    run.beat(0, gap_s=0.5, gaps=i + 1, beat_s=0.25, beat_gap_s=0.8)
    run.beat(1, gap_s=0.05, gaps=i + 1, beat_s=0.25, beat_gap_s=0.27)
    run.tick()
  frozen_ms = run.ms
  while run.status == Status.RUNNING:
    run.ms += 50
    run.agent_beat("host-0")
    if (run.ms - frozen_ms) % 250 == 0:
      run.beat(1, progress=False, gap_s=0.05, gaps=25, beat_s=0.25, beat_gap_s=0.27)
    run.tick()
  (failure,) = run.named("failure")
  assert (failure["kind"], failure["worker"]) == ("hang", 0)
  assert 3.0 < (run.ms - frozen_ms) / 1000 < 3.2             # when worker 1's stuck limit ran out
  assert failure["timeouts"]["tripped_by"] == [1]
  assert failure["timeouts"]["silent_limit_s"] == pytest.approx(4.0)


def test_a_slow_but_live_worker_is_not_a_hang():
  run = Run(workers_per_host=1)
  run.start()
  _warm(run)
  # Steps now take 2.5 s each (50x slower), heartbeats go on every 0.25 s.
  gap, last_step_ms = 0.05, run.ms
  for _ in range(400):                        # 100 s
    run.ms += 250
    run.agent_beat("host-0")
    done = run.ms - last_step_ms >= 2500
    if done:
      gap, last_step_ms = 2.5, run.ms
    run.beat(0, progress=done, gap_s=gap, gaps=200, beat_s=0.25)
    run.tick()
  assert run.status == Status.RUNNING and run.named("failure") == []


def test_learned_timeouts_can_be_turned_off():
  run = Run(workers_per_host=1, hang_factor=0.0)
  run.start()
  _warm(run)
  assert run.policy.hang_limits(run.state.workers[0]) == (10.0, 10.0)
