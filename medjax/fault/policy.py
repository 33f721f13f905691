"""The coordinator's policy: what failed, whether to restart, on which hosts, after what back-off.

A state machine with no I/O and no clock of its own: every entry point takes an incoming event (an
RPC's message, a commit, a tick of the control loop) and `now` (seconds on the caller's clock), and
returns `Effects` for the caller to carry out: events to write, whether to persist the state, a
generation spec to write, the RPC's reply. `medjax.fault.coordinator` is the shell around it (gRPC,
events.jsonl, the lineage store); tests/test_coordinator_policy.py drives it with a fake clock.

  WAITING     -> RUNNING     enough hosts alive (the same, a replacement, or fewer if elastic)
              -> FAILED      no replacement host within fault.replacement_wait_s
  RUNNING     -> STOPPING    a worker exited non-zero, hung, or its host was lost
              -> DONE        every worker exited 0
  STOPPING    -> BACKOFF     every host's workers are gone (or the stop timed out)
              -> FAILED      more than fault.max_failures_without_progress failures in a row
  BACKOFF     -> WAITING     at once after the first failure in a row, then after
                             fault.backoff_s * 2**(failures in a row - 2), capped
  RECOVERING  -> RUNNING     (a restarted coordinator) the agents still run the generation
              -> STOPPING    they do not, within 2 * fault.host_timeout_s
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Callable

from medjax.fault import run_state

Status = run_state.Status


class Policy:
  """The coordinator's decisions over a `run_state.State`.

  Args:
    fault_config: config.fault.
    now: the time the coordinator (re)started.
    saved: the state persisted by an earlier coordinator of this run (`run_state.State.to_json`),
      if any.
    last_commit: the newest committed step in the lineage store.
    fault_times: returns the faults that fired so far ({name, time, process or host}, oldest
      first; `medjax.runtime.inject.fired`), so that detection is timed from the fault itself.
  """

  def __init__(self, fault_config, now: float, *, saved: dict | None = None,
               last_commit: int = 0, fault_times: Callable[[], list[dict]] = list):
    self.f = fault_config
    self.fault_times = fault_times
    self.restored = bool(saved)
    self.state = run_state.State.from_json(saved) if saved else run_state.State()
    self.state.last_commit = last_commit
    self.state.waiting_since = now
    if self.restored:
      # The generation that ran (or was being stopped) may still run: hear from the agents first.
      running = self.state.status in (Status.RUNNING, Status.STOPPING)
      self.state.status = Status.RECOVERING if running else Status.WAITING
      self.state.recover_until = now + self.f.host_timeout_s * 2
    self._out = run_state.Effects()

  @property
  def finished(self) -> bool:
    return self.state.status in (Status.DONE, Status.FAILED)

  @property
  def training(self) -> bool:
    """The current generation runs and has taken its first step."""
    s = self.state
    return (s.status == Status.RUNNING and bool(s.spec)
            and "first_step" in s.gen_stats.get(str(s.spec["generation"]), {}))

  # -- effects -------------------------------------------------------------------------------

  def _emit(self, event: str, **fields) -> None:
    self._out.events.append((event, fields))

  def _persist(self) -> None:
    self._out.persist = True

  def _take(self, reply: dict | None = None) -> run_state.Effects:
    out, self._out = self._out, run_state.Effects()
    out.reply = reply
    return out

  # -- incoming events -----------------------------------------------------------------------

  def register_agent(self, msg: dict, now: float) -> run_state.Effects:
    s = self.state
    new = msg["host"] not in s.agents
    s.agents[msg["host"]] = run_state.Agent(host=msg["host"], last_seen=now,
                                            agent_id=msg.get("agent_id"),
                                            address=msg.get("address", "127.0.0.1"),
                                            free_port=msg.get("free_port"),
                                            generation=msg.get("generation", -1),
                                            workers=msg.get("workers", []))
    if new:
      self._emit("agent_registered", host=msg["host"], generation=msg.get("generation", -1))
    return self._take({"ok": True})

  def agent_heartbeat(self, msg: dict, now: float) -> run_state.Effects:
    """Notes the agent's report; the reply says what its host should run."""
    s, host = self.state, msg["host"]
    agent = s.agents.get(host)
    if agent is None:
      return self._take({"action": "register"})
    agent.last_seen, agent.free_port = now, msg.get("free_port")
    agent.generation, agent.workers = msg.get("generation", -1), msg.get("workers", [])
    if self.finished:
      if not agent.running():
        s.dismissed.add(host)
      return self._take({"action": "exit"})
    spec = s.spec
    if spec and s.status == Status.RUNNING and host in spec["hosts"]:
      return self._take({"action": "run", "generation": spec["generation"], "spec": spec,
                         "training": self.training})
    if (s.status in (Status.STOPPING, Status.WAITING, Status.BACKOFF)
        or (spec and host not in spec["hosts"])):
      return self._take({"action": "stop", "generation": s.generation})
    return self._take({"action": "idle"})

  def report_exit(self, msg: dict, now: float) -> run_state.Effects:
    """A worker exited (its agent saw it at once): a failure, or one more worker done."""
    s = self.state
    pid, gen, code = msg["process_id"], msg["generation"], msg["exit_code"]
    self._emit("worker_exit", generation=gen, process_id=pid, exit_code=code,
               host=msg.get("host"), reason=msg.get("reason", ""))
    if gen != s.generation:
      return self._take({"ok": True})
    worker = s.workers.setdefault(pid, run_state.Worker(pid))
    worker.exit_code = code
    if s.status == Status.RUNNING:
      if code == 0:
        # A worker exits 0 only after training and evaluation returned (worker.run); its last
        # "done" heartbeat may not have reached a coordinator that restarted meanwhile.
        worker.phase = "done"
        if self._all_workers_done():
          self._finish()
      else:
        reason = msg.get("reason", "")
        self._fail(run_state.EXIT_KINDS.get(code, f"exit {code}"), pid, msg.get("host"), now,
                   reason)
        if code == run_state.EXIT_INPUT:
          # Bad input or damaged state: the next generation would fail the same way.
          self._give_up(reason or f"worker {pid} refused its input", error=reason)
    elif (s.status in (Status.STOPPING, Status.BACKOFF, Status.WAITING)
          and code in run_state.CAUSE_SIGNALS and not msg.get("signalled")):
      self._reclassify_as_crash(pid, msg.get("host"), code, now)
    return self._take({"ok": True})

  def worker_heartbeat(self, msg: dict, now: float) -> run_state.Effects:
    """Notes a worker's progress; the reply asks it to stop when its generation is over."""
    s = self.state
    gen, pid = msg["generation"], msg["process_id"]
    if gen != s.generation or s.status not in (Status.RUNNING, Status.RECOVERING):
      return self._take({"stop": True})
    w = s.workers.setdefault(pid, run_state.Worker(pid, last_progress=now))
    if msg["counter"] != w.counter or msg["phase"] != w.phase:
      w.last_progress = now
    w.last_seen, w.phase, w.step, w.counter = now, msg["phase"], msg["step"], msg["counter"]
    w.epoch, w.partition = msg.get("epoch"), msg.get("partition")
    w.gap_s, w.gaps, w.beat_s = msg.get("gap_s"), msg.get("gaps", 0), msg.get("beat_s", 0.0)
    w.gap_steps = msg.get("gap_steps", w.gaps)
    w.beat_gap_s = msg.get("beat_gap_s")
    stats = s.gen_stats.setdefault(str(gen), {"started": now})
    if msg.get("phases") and str(pid) not in stats.get("phases", {}):
      # Sent once, with its first step: how the worker got here, phase by phase.
      stats.setdefault("phases", {})[str(pid)] = msg["phases"]
      self._emit("generation_phases", generation=gen, process_id=pid, **msg["phases"])
    if msg["phase"] == "training" and msg.get("executed", 0) > 0 and "first_step" not in stats:
      self._first_step(gen, msg["step"], stats, now)
    if pid == 0:
      stats.update(executed=msg.get("executed", 0), blocked_s=msg.get("blocked_s", 0.0),
                   writes=msg.get("writes", 0), write_s=msg.get("write_s", 0.0),
                   last_step=msg["step"])
      if msg["phase"] == "training":
        stats["training_s"] = now - stats.get("first_step", now)
    return self._take({"stop": False})

  def committed(self, step: int) -> run_state.Effects:
    """A step's lineage record is in the store: progress, for the back-off and the crash loop."""
    self.state.last_commit = max(self.state.last_commit, step)
    return self._take()

  def tick(self, now: float) -> run_state.Effects:
    """One pass of the control loop: the decisions that time alone can trigger."""
    step = {Status.RECOVERING: self._recover, Status.WAITING: self._start_generation,
            Status.BACKOFF: self._wait_backoff, Status.RUNNING: self._watch,
            Status.STOPPING: self._settle_stop}.get(self.state.status)
    if step is not None:
      step(now)
    return self._take()

  # -- queries -------------------------------------------------------------------------------

  def status(self) -> dict:
    s = self.state
    return {"status": s.status.value, "generation": s.generation, "spec": s.spec,
            "agents": sorted(s.agents), "error": s.error,
            "failures": [dataclasses.asdict(f) for f in s.failures],
            "workers": {str(pid): dataclasses.asdict(w) for pid, w in s.workers.items()}}

  def alive_hosts(self, now: float) -> list[str]:
    return sorted(h for h, a in self.state.agents.items()
                  if now - a.last_seen < self.f.host_timeout_s)

  def all_dismissed(self, now: float) -> bool:
    """Every live agent has been told that the run is over."""
    return not set(self.alive_hosts(now)) - self.state.dismissed

  # -- decisions -----------------------------------------------------------------------------

  def _all_workers_done(self) -> bool:
    workers = self.state.workers.values()
    return (len(workers) == self.state.spec["num_processes"]
            and all(w.exit_code == 0 for w in workers))

  def _watch(self, now: float) -> None:
    """RUNNING: a lost host first (its workers' silence is a symptom), then hangs."""
    lost = [h for h in self.state.spec["hosts"] if h in self.state.agents
            and now - self.state.agents[h].last_seen > self.f.host_timeout_s]
    if lost:
      self._fail("host_lost", lost[0], lost[0], now)
    else:
      self._detect_hang(now)

  def _phase_timeout(self, phase: str | None) -> float:
    f = self.f
    return {"compiling": f.timeout_compile_s, "restoring": f.timeout_compile_s,
            "checkpointing": f.timeout_compile_s,
            "training": f.timeout_training_s}.get(phase, f.timeout_start_s)

  def hang_limits(self, w: run_state.Worker) -> tuple[float, float]:
    """(silent, stuck) timeouts of a worker: no heartbeat at all, or heartbeats without progress.

    Outside training, or before `fault.hang_warmup_steps` finished steps were seen in this
    generation (counted in steps: where steps run ahead of the host, one progress report may
    span ten), both are the phase's fixed timeout. Then they are learned, each from what it
    watches:
    - silent: a live worker's heartbeat thread beats every `beat_s` whatever its steps take, so
      silence past `fault.hang_factor` x its longest recent gap between heartbeats (at least
      `fault.hang_floor_s`) means the process is frozen (stopped, swapped out, wedged holding
      the interpreter): a hang, caught in about the floor.
    - stuck: heartbeats without a finished step may only be a slow step, so it gets twice
      `fault.hang_factor` x its longest recent gap between finished steps plus the heartbeat
      interval (at least twice the floor): a collective whose peer is gone, a deadlock.
    The fixed timeout bounds both.
    """
    fixed = self._phase_timeout(w.phase)
    f = self.f
    if (w.phase != "training" or not f.hang_factor or w.gap_s is None
        or w.gap_steps < f.hang_warmup_steps):
      return fixed, fixed
    beat_gap = w.beat_gap_s if w.beat_gap_s is not None else f.hang_factor * w.gap_s + w.beat_s
    silent = max(f.hang_floor_s, f.hang_factor * beat_gap)
    stuck = max(2 * f.hang_floor_s, 2 * (f.hang_factor * w.gap_s + w.beat_s))
    return min(fixed, silent), min(fixed, stuck)

  def _detect_hang(self, now: float) -> None:
    """A worker silent, or alive without progress, past its timeout (`hang_limits`).

    The culprit is the live worker silent longest, stale or not: when one process of a
    collective is frozen its peers block, still beating, and a peer's stuck timeout (learned
    from its step times) can run out before the frozen one's silence timeout (learned from its
    heartbeat gaps) does. Only where no worker is silent longer than its heartbeat interval
    allows (every one beats; a deadlock) is it the stale worker stuck longest.
    """
    live, stale = [], []
    for pid, w in self.state.workers.items():
      if w.exit_code is not None:
        continue
      silent_limit, stuck_limit = self.hang_limits(w)
      silent = now - (w.last_seen if w.last_seen is not None else now)
      stuck = now - (w.last_progress if w.last_progress is not None else now)
      row = (silent, stuck, pid, silent_limit, stuck_limit)
      live.append(row)
      if silent > silent_limit or stuck > stuck_limit:
        stale.append(row)
    if not stale:
      return
    quiet = [r for r in live if r[0] > max(2 * self.state.workers[r[2]].beat_s, 0.5)]
    silent, stuck, pid, silent_limit, stuck_limit = max(quiet or stale, key=lambda r: r[:2])
    w = self.state.workers[pid]
    self._fail("hang", pid, self._host_of(pid), now,
               detail={"silent_s": round(silent, 3), "silent_limit_s": round(silent_limit, 3),
                       "stuck_s": round(stuck, 3), "stuck_limit_s": round(stuck_limit, 3),
                       "tripped_by": sorted(r[2] for r in stale), "phase": w.phase,
                       "learned_from": {"gaps": w.gaps, "gap_steps": w.gap_steps,
                                        "gap_s": w.gap_s,
                                        "beat_gap_s": w.beat_gap_s}})

  def _host_of(self, pid: int) -> str | None:
    hosts = (self.state.spec or {}).get("hosts", [])
    index = pid // self.f.workers_per_host
    return hosts[index] if index < len(hosts) else None

  def _fail(self, kind: str, worker: int | str, host: str | None, now: float,
            reason: str = "", detail: dict | None = None) -> None:
    """Records a failure and stops the generation (`detail`: a hang's timeouts, for the event)."""
    s = self.state
    w = s.workers.get(worker) if isinstance(worker, int) else None
    fault_time, fault_name = self._fault_time(worker, w, now)
    failure = run_state.Failure(
        kind=kind, worker=worker, host=host, generation=s.generation,
        step=w.step if w is not None and w.step is not None else s.last_commit,
        committed_step=s.last_commit, detected_s=round(now - fault_time, 3), t_detect=now,
        fault=fault_name, reason=reason)
    s.failures.append(failure)
    self._emit("failure", kind=kind, worker=worker, host=host, generation=s.generation,
               step=failure.step, committed_step=s.last_commit, detected_s=failure.detected_s,
               recovered_s=None, fault=fault_name, kind_detail=kind, reason=reason,
               **({"timeouts": detail} if detail else {}))
    s.strikes = s.strikes + 1 if s.last_commit <= s.commits_at_failure else 1
    s.commits_at_failure = s.last_commit
    s.status = Status.STOPPING
    s.stop_started, s.stop_deadline = now, now + self.f.stop_grace_s * 3
    self._persist()

  def _fault_time(self, worker: int | str, w: run_state.Worker | None,
                  now: float) -> tuple[float, str | None]:
    """When the fault happened: its marker's time (injected or recorded from outside), else the
    worker's last heartbeat, else now."""
    used = {f.fault for f in self.state.failures}
    for marker in reversed(self.fault_times()):
      if marker["name"] not in used and marker.get("time", 0) <= now and (
          marker.get("process") == worker or marker.get("host") == worker):
        return marker["time"], marker["name"]
    return (w.last_seen if w is not None and w.last_seen is not None else now), None

  def _settle_stop(self, now: float) -> None:
    """STOPPING: once every host of the generation reported (after the stop began) that its
    workers are gone, or went silent long enough to count as lost, back off; or give up."""
    s = self.state
    lost, settled = [], True
    for h in (s.spec or {}).get("hosts", []):
      agent = s.agents.get(h)
      if agent is None or now - agent.last_seen > self.f.host_timeout_s:
        lost.append(h)
      elif agent.last_seen < s.stop_started or agent.running():
        settled = False
    if lost:
      self._reclassify_as_host_lost(lost[0])
    timeout = s.stop_deadline + self.f.stop_grace_s * 4 + self.f.host_timeout_s
    if not settled and now <= timeout:
      return
    self._emit("generation_stopped", generation=s.generation)
    limit = self.f.max_failures_without_progress
    if s.strikes > limit:
      self._give_up(f"{s.strikes} failures in a row without a new committed checkpoint "
                    f"(config.fault.max_failures_without_progress={limit})")
      return
    s.status, s.backoff_until = Status.BACKOFF, now + self.backoff_s()
    self._persist()

  def _reclassify_as_host_lost(self, host: str) -> None:
    """A peer's crash or hang was the symptom; the host going away was the cause."""
    s = self.state
    last = s.failures[-1] if s.failures else None
    if last is None or last.kind == "host_lost" or last.generation != s.generation:
      return
    last.observed, last.kind, last.worker, last.host = last.kind, "host_lost", host, host
    self._emit("failure_reclassified", kind="host_lost", host=host)

  def _reclassify_as_crash(self, pid: int, host: str | None, code: int, now: float) -> None:
    """A worker killed by a signal that its agent did not send, seen after a peer's error had
    stopped the generation (its exit may be seen after the stop settled): the peer's error (its collective lost this worker) was the symptom,
    this worker's death the cause; the failure becomes its crash, timed from its fault."""
    s = self.state
    last = s.failures[-1] if s.failures else None
    if (last is None or last.kind != "error" or last.generation != s.generation
        or last.worker == pid):
      return
    w = s.workers.get(pid)
    fault_time, fault_name = self._fault_time(pid, w, last.t_detect)
    last.observed, last.worker, last.host = f"error of worker {last.worker}", pid, host
    last.step = w.step if w is not None and w.step is not None else last.step
    last.kind, last.reason = run_state.EXIT_KINDS[code], ""
    last.fault, last.detected_s = fault_name, round(last.t_detect - fault_time, 3)
    self._emit("failure_reclassified", kind=last.kind, worker=pid, host=host,
               detected_s=last.detected_s, fault=fault_name)
    self._persist()

  def backoff_s(self) -> float:
    """0 after the first failure since progress (a new committed step, or the run's first
    failure): that restart waits for nothing. Then fault.backoff_s, doubled per further
    failure without a new committed step, capped."""
    strikes = self.state.strikes
    if strikes <= 1:
      return 0.0
    return min(self.f.backoff_s * 2 ** (strikes - 2), self.f.backoff_max_s)

  def _wait_backoff(self, now: float) -> None:
    if now >= self.state.backoff_until:
      self.state.status, self.state.waiting_since = Status.WAITING, now
      self._start_generation(now)

  def _choose_hosts(self, now: float) -> list[str] | None:
    """The next generation's hosts, or None to wait (or to give up, past the wait)."""
    s, f = self.state, self.f
    alive = self.alive_hosts(now)
    wanted = f.hosts or f.local_hosts
    previous = s.history[-1] if s.history else []
    if len(alive) < wanted and not (f.elastic and previous and len(alive) >= f.min_hosts):
      if now > s.waiting_since + f.replacement_wait_s:
        self._give_up(f"only {len(alive)} of {wanted} hosts alive after waiting "
                      f"{f.replacement_wait_s}s for a replacement, and config.fault.elastic is "
                      f"{f.elastic} (min_hosts {f.min_hosts})")
      return None
    # The previous generation's surviving hosts first, then replacements, in name order.
    survivors = [h for h in previous if h in alive]
    hosts = sorted((survivors + [h for h in alive if h not in survivors])[:wanted])
    return hosts or None

  def _start_generation(self, now: float) -> None:
    """WAITING: the next generation, once its hosts are alive and the first one has a port."""
    s = self.state
    hosts = self._choose_hosts(now)
    if hosts is None:
      return
    first = s.agents[hosts[0]]
    if not first.free_port:
      return
    s.generation += 1
    if not s.history or sorted(s.history[-1]) != hosts:
      s.history.append(hosts)
    wph = self.f.workers_per_host
    s.spec = {"generation": s.generation, "hosts": hosts, "host_history": s.history,
              "workers_per_host": wph, "num_processes": len(hosts) * wph,
              "devices_per_worker": self.f.devices_per_worker,
              "jax_address": f"{first.address}:{first.free_port}"}
    self._out.spec = s.spec
    s.workers = {}
    s.gen_stats[str(s.generation)] = {"started": now, "hosts": hosts}
    s.status = Status.RUNNING
    self._emit("generation_start", generation=s.generation, hosts=hosts,
               num_processes=s.spec["num_processes"])
    self._persist()

  def _first_step(self, gen: int, step: int, stats: dict, now: float) -> None:
    """The generation's first training step: the end of the last failure's recovery."""
    stats.update(first_step=now, first_global_step=step)
    self._emit("first_step", generation=gen, step=step)
    last = self.state.failures[-1] if self.state.failures else None
    if last is not None and last.recovered_s is None and last.generation < gen:
      last.recovered_s = round(now - last.t_detect, 3)
      self._emit("recovered", generation=gen, step=step, recovered_s=last.recovered_s)
      self._persist()

  def _recover(self, now: float) -> None:
    """RECOVERING: carry on if every host still runs the generation; restart after the window."""
    s = self.state
    running = [a for a in s.agents.values() if a.generation == s.generation and a.running()]
    if s.spec and len(running) == len(s.spec["hosts"]):
      s.status = Status.RUNNING
      self._emit("resumed_generation", generation=s.generation)
      self._persist()
    elif now > s.recover_until:
      s.status, s.stop_started, s.stop_deadline = Status.STOPPING, now, now
      self._emit("recovery_restart", generation=s.generation)

  def _give_up(self, why: str, *, error: str = "") -> None:
    """Stops the run; `error` (else a line from `why` and the failures) is what the user reads."""
    s = self.state
    lines = [f"{f.kind} of worker {f.worker} at step {f.step}"
             + (f" ({f.reason})" if f.reason else "") for f in s.failures[-3:]]
    # The same failure each time (a worker that cannot start) is said once, with its count.
    failures = "; ".join(line + (f" ({n} times)" if n > 1 else "")
                         for line, n in collections.Counter(lines).items())
    s.error = error or f"training stopped: {why}. Last failures: {failures or 'none'}"
    s.status = Status.FAILED
    self._emit("gave_up", error=s.error)
    self._persist()

  def _finish(self) -> None:
    self.state.status = Status.DONE
    self._emit("done", generation=self.state.generation)
    self._persist()
