"""The coordinator: membership, generations, failure detection, recovery, the lineage commit.

One process, a gRPC server (`protocol`). Agents (one per host) register and heartbeat; it tells
them which generation to run (hosts, process ids, the jax.distributed address). Workers heartbeat
their progress and send commits, which it writes to the lineage store. Every event goes to
<workdir>/events.jsonl. Its own state lives in the lineage store, so a restarted coordinator picks
up the run where it was: agents re-register with the generation they are running, and the workers
of that generation train on.

Failures: a worker exit (reported by its agent at once), a hang (no heartbeat, or no progress,
past the phase's timeout), a lost host (no agent heartbeat past fault.host_timeout_s). Recovery:
stop the generation (workers asked to stop at a step boundary; their agents then SIGTERM and
SIGKILL), start the next one on the same hosts, a replacement, or fewer hosts if
fault.elastic allows; workers restore the newest committed checkpoint. Failures without committed
progress in between back off, and past fault.max_failures_without_progress the run stops.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time

from medjax import checkpoint as checkpoint_lib
from medjax import jsonl
from medjax import lineage as lineage_lib
from medjax.fault import context
from medjax.fault import inject
from medjax.fault import protocol

EXIT_KINDS = {-9: "crash", -15: "sigterm", -19: "hang", -6: "crash", 1: "error",
              context.EXIT_PREEMPTED: "preemption", context.EXIT_OOM: "oom",
              context.EXIT_STOPPED: "stopped", 0: "exit"}


class EventLog:
  """Appends {time, event, ...} lines to events.jsonl."""

  def __init__(self, path: str):
    self.path = path
    self._lock = threading.Lock()

  def write(self, event: str, **fields) -> dict:
    entry = {"time": time.time(), "event": event, **fields}
    with self._lock, open(self.path, "a") as f:
      f.write(json.dumps(entry) + "\n")
    logging.info("event %s %s", event, {k: v for k, v in fields.items() if k != "spec"})
    return entry


def read_events(workdir: str) -> list[dict]:
  return jsonl.read(os.path.join(workdir, "events.jsonl"))


class Coordinator:
  """The coordinator's state machine; `serve()` runs it until the run ends (returns exit code)."""

  def __init__(self, config, workdir: str, *, token: str, host: str = "127.0.0.1",
               port: int = 0):
    self.config, self.workdir, self.f = config, workdir, config.fault
    self.token, self.bind_host, self.port = token, host, port
    self.store = lineage_lib.LineageStore(config.ckpt.lineage_store
                                          or os.path.join(workdir, "lineage"))
    self.events = EventLog(os.path.join(workdir, "events.jsonl"))
    self.lock = threading.RLock()
    saved = self.store.get_state("coordinator") or {}
    self.generation = saved.get("generation", 0)
    self.history: list[list[str]] = saved.get("history", [])
    self.failures: list[dict] = saved.get("failures", [])
    self.gen_stats: dict[str, dict] = saved.get("gen_stats", {})
    self.strikes = saved.get("strikes", 0)
    self.commits_at_failure = saved.get("commits_at_failure", -1)
    self.status = "recovering" if saved.get("status") in ("running", "stopping") else "waiting"
    self.spec: dict | None = saved.get("spec")
    self.agents: dict[str, dict] = {}
    self.workers: dict[int, dict] = {}
    self.stop_deadline = 0.0
    self.stop_started = 0.0
    self.next_start = 0.0
    self.waiting_since = time.time()
    self.error = ""
    self.recover_until = time.time() + self.f.host_timeout_s * 2
    self.pending_recovery: dict | None = None
    self.dismissed: set[str] = set()   # agents told to exit once the run is over
    if saved:
      self.events.write("coordinator_restarted", generation=self.generation)

  # -- persistence ---------------------------------------------------------------------------

  def _persist(self) -> None:
    self.store.put_state("coordinator", {
        "generation": self.generation, "history": self.history, "failures": self.failures,
        "gen_stats": self.gen_stats, "strikes": self.strikes,
        "commits_at_failure": self.commits_at_failure, "status": self.status, "spec": self.spec})

  # -- RPC handlers --------------------------------------------------------------------------

  def register_agent(self, msg: dict) -> dict:
    with self.lock:
      new = msg["host"] not in self.agents
      self.agents[msg["host"]] = {"host": msg["host"], "agent_id": msg.get("agent_id"),
                                  "last_seen": time.time(), "free_port": msg.get("free_port"),
                                  "address": msg.get("address", "127.0.0.1"),
                                  "generation": msg.get("generation", -1),
                                  "workers": msg.get("workers", [])}
      if new:
        self.events.write("agent_registered", host=msg["host"],
                          generation=msg.get("generation", -1))
    return {"ok": True}

  def agent_heartbeat(self, msg: dict) -> dict:
    with self.lock:
      host = msg["host"]
      if host not in self.agents:
        return {"action": "register"}
      a = self.agents[host]
      a.update(last_seen=time.time(), free_port=msg.get("free_port"),
               generation=msg.get("generation", -1), workers=msg.get("workers", []))
      if self.status in ("done", "failed"):
        if not any(w.get("running") for w in a["workers"]):
          self.dismissed.add(host)
        return {"action": "exit"}
      spec = self.spec
      if spec and self.status == "running" and host in spec["hosts"]:
        training = "first_step" in self.gen_stats.get(str(spec["generation"]), {})
        return {"action": "run", "generation": spec["generation"], "spec": spec,
                "training": training}
      if self.status in ("stopping", "waiting", "backoff") or (spec and host not in spec["hosts"]):
        return {"action": "stop", "generation": self.generation}
      return {"action": "idle"}

  def report_exit(self, msg: dict) -> dict:
    with self.lock:
      pid, gen, code = msg["process_id"], msg["generation"], msg["exit_code"]
      self.events.write("worker_exit", generation=gen, process_id=pid, exit_code=code,
                        host=msg.get("host"), reason=msg.get("reason", ""))
      if gen != self.generation:
        return {"ok": True}
      w = self.workers.setdefault(pid, {"process_id": pid})
      w["exit_code"] = code
      if self.status == "running":
        if code == 0:
          # A worker exits 0 only after training and evaluation returned (worker.run); its last
          # "done" heartbeat may not have reached a coordinator that restarted meanwhile.
          w["phase"] = "done"
          if all(x.get("exit_code") == 0 for x in self.workers.values()) and \
              len(self.workers) == self.spec["num_processes"]:
            self._finish()
        else:
          self._fail(EXIT_KINDS.get(code, f"exit {code}"), pid, msg.get("host"))
    return {"ok": True}

  def worker_heartbeat(self, msg: dict) -> dict:
    with self.lock:
      gen, pid = msg["generation"], msg["process_id"]
      if gen != self.generation or self.status not in ("running", "recovering"):
        return {"stop": True}
      now = time.time()
      w = self.workers.setdefault(pid, {"process_id": pid, "counter": -1, "last_progress": now})
      if msg["counter"] != w.get("counter") or msg["phase"] != w.get("phase"):
        w["last_progress"] = now
      w.update(last_seen=now, phase=msg["phase"], step=msg["step"], counter=msg["counter"],
               epoch=msg.get("epoch"), partition=msg.get("partition"))
      stats = self.gen_stats.setdefault(str(gen), {"started": now})
      if msg["phase"] == "training" and msg.get("executed", 0) > 0 and "first_step" not in stats:
        stats["first_step"] = now
        stats["first_global_step"] = msg["step"]
        self.events.write("first_step", generation=gen, step=msg["step"])
        if self.pending_recovery is not None:
          self.pending_recovery["recovered_s"] = round(now - self.pending_recovery["t_detect"], 3)
          self.events.write("recovered", generation=gen, step=msg["step"],
                            recovered_s=self.pending_recovery["recovered_s"])
          self.pending_recovery = None
          self._persist()
      if pid == 0:
        stats.update(executed=msg.get("executed", 0), blocked_s=msg.get("blocked_s", 0.0),
                     last_step=msg["step"])
        if msg["phase"] == "training":
          stats["training_s"] = now - stats.get("first_step", now)
      return {"stop": self.status not in ("running", "recovering")}

  def commit(self, msg: dict) -> dict:
    record = msg["record"]
    with self.lock:
      self.store.commit(record)
      committed = self.store.committed_steps()
      removed = checkpoint_lib.prune(os.path.join(self.workdir, "checkpoints"), committed,
                                     self.config.ckpt.max_to_keep)
      self.events.write("commit", generation=msg.get("generation"),
                        step=record["global_step"], epoch=record["epoch"],
                        partition=record["partition"], offset=record["offset"], pruned=removed)
    return {"ok": True}

  def status_rpc(self, msg: dict) -> dict:
    with self.lock:
      return {"status": self.status, "generation": self.generation, "spec": self.spec,
              "agents": sorted(self.agents), "failures": self.failures, "error": self.error,
              "workers": {str(k): {kk: vv for kk, vv in v.items()}
                          for k, v in self.workers.items()}}

  # -- decisions -----------------------------------------------------------------------------

  def _alive_hosts(self) -> list[str]:
    now = time.time()
    return sorted(h for h, a in self.agents.items() if now - a["last_seen"] < self.f.host_timeout_s)

  def _fail(self, kind: str, worker, host=None) -> None:
    """Records a failure and stops the generation."""
    now = time.time()
    w = self.workers.get(worker, {}) if isinstance(worker, int) else {}
    fault_time, fault_name = self._fault_time(worker, now, w)
    committed = self.store.committed_steps()
    last_commit = committed[-1] if committed else 0
    entry = {"kind": kind, "worker": worker, "host": host, "generation": self.generation,
             "step": w.get("step", last_commit), "committed_step": last_commit,
             "detected_s": round(now - fault_time, 3), "recovered_s": None, "t_detect": now,
             "fault": fault_name}
    self.failures.append(entry)
    self.pending_recovery = entry
    self.events.write("failure", **{k: v for k, v in entry.items() if k != "t_detect"},
                      kind_detail=kind)
    self.strikes = self.strikes + 1 if last_commit <= self.commits_at_failure else 1
    self.commits_at_failure = last_commit
    self.status = "stopping"
    self.stop_started = now
    self.stop_deadline = now + self.f.stop_grace_s * 3
    self._persist()

  def _fault_time(self, worker, now: float, w: dict) -> tuple[float, str | None]:
    """When the fault happened: an injected or recorded fault's own time, else the last heartbeat.
    """
    used = {f.get("fault") for f in self.failures}
    for f in reversed(inject.fired(self.workdir)):
      if f["name"] not in used and f.get("time", 0) <= now and (
          f.get("process") == worker or f.get("host") == worker):
        return f["time"], f["name"]
    return w.get("last_seen", now), None

  def _check_hangs(self, now: float) -> None:
    timeouts = {"starting": self.f.timeout_start_s, "preparing": self.f.timeout_start_s,
                "compiling": self.f.timeout_compile_s, "restoring": self.f.timeout_compile_s,
                "training": self.f.timeout_training_s, "checkpointing": self.f.timeout_compile_s,
                "evaluating": self.f.timeout_start_s, "done": self.f.timeout_start_s}
    stale = []
    for pid, w in self.workers.items():
      if "exit_code" in w:
        continue
      limit = timeouts.get(w.get("phase", "starting"), self.f.timeout_start_s)
      silent, stuck = now - w.get("last_seen", now), now - w.get("last_progress", now)
      if silent > limit or stuck > limit:
        stale.append((-silent, -stuck, pid))
    if stale:
      # The culprit is the worker silent longest; others are blocked waiting on it.
      _, _, pid = min(stale)
      self._fail("hang", pid, self.workers[pid].get("host"))

  def _start_generation(self, now: float) -> None:
    alive = self._alive_hosts()
    wanted = self.f.hosts or self.f.local_hosts
    previous = self.history[-1] if self.history else []
    if len(alive) < wanted:
      if not (self.f.elastic and previous and len(alive) >= self.f.min_hosts):
        if now > max(self.next_start, self.waiting_since) + self.f.replacement_wait_s:
          self._give_up(f"only {len(alive)} of {wanted} hosts alive after waiting "
                        f"{self.f.replacement_wait_s}s for a replacement, and config.fault.elastic"
                        f" is {self.f.elastic} (min_hosts {self.f.min_hosts})")
        return
    # Prefer the previous generation's surviving hosts, then replacements, in name order.
    survivors = [h for h in previous if h in alive]
    hosts = (survivors + [h for h in alive if h not in survivors])[:wanted]
    hosts = sorted(hosts)
    first = self.agents[hosts[0]]
    if not first.get("free_port"):
      return
    self.generation += 1
    if not self.history or sorted(self.history[-1]) != hosts:
      self.history.append(hosts)
    wph = self.f.workers_per_host
    self.spec = {"generation": self.generation, "hosts": hosts, "host_history": self.history,
                 "workers_per_host": wph, "num_processes": len(hosts) * wph,
                 "devices_per_worker": self.f.devices_per_worker,
                 "jax_address": f"{first['address']}:{first['free_port']}"}
    path = os.path.join(self.workdir, "generations")
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, f"gen-{self.generation:03d}.json"), "w") as f:
      json.dump(self.spec, f, indent=2)
    self.workers = {}
    self.gen_stats[str(self.generation)] = {"started": now, "hosts": hosts}
    self.status = "running"
    self.events.write("generation_start", generation=self.generation, hosts=hosts,
                      num_processes=self.spec["num_processes"])
    self._persist()

  def _give_up(self, why: str) -> None:
    failures = "; ".join(f"{f['kind']} of worker {f['worker']} at step {f['step']}"
                         for f in self.failures[-8:])
    self.error = f"training stopped: {why}. Failures: {failures or 'none'}"
    self.status = "failed"
    self.events.write("gave_up", error=self.error)
    self._persist()

  def _finish(self) -> None:
    self.status = "done"
    self.events.write("done", generation=self.generation)
    self._persist()

  def fault_tolerance(self) -> dict:
    """The summary's fault_tolerance block (see README, "What the summary numbers mean")."""
    from medjax.data import ingest  # pylint: disable=import-outside-toplevel
    from medjax.fault import ledger  # pylint: disable=import-outside-toplevel
    committed = self.store.committed_steps()
    final = self.store.record(committed[-1]) if committed else {"global_step": 0, "epoch": 0}
    executed = sum(int(g.get("executed", 0)) for g in self.gen_stats.values())
    blocked = sum(float(g.get("blocked_s", 0.0)) for g in self.gen_stats.values())
    training = sum(float(g.get("training_s", 0.0)) for g in self.gen_stats.values())
    manifest = ingest.load(self.workdir).manifest
    check = ledger.exactly_once(self.workdir, final["global_step"], manifest.indices("train"),
                                final["epoch"])
    return {
        "failures": [{k: f.get(k) for k in ("kind", "worker", "step", "detected_s",
                                            "recovered_s", "generation", "host")}
                     for f in self.failures],
        "restarts": max(self.generation - 1, 0),
        "steps_executed": executed,
        "steps_committed": int(final["global_step"]),
        "waste_fraction": round(max(executed - final["global_step"], 0) / max(executed, 1), 5),
        "checkpoint_blocking_fraction": round(blocked / training, 5) if training else None,
        "exactly_once": check["exactly_once"],
        "exactly_once_detail": check,
        "generations": self.gen_stats,
    }

  def finalize_summary(self) -> None:
    from medjax import evaluate  # pylint: disable=import-outside-toplevel
    from medjax.data import ingest  # pylint: disable=import-outside-toplevel
    path = os.path.join(self.workdir, "summary.json")
    summary = {}
    if os.path.exists(path):
      with open(path) as f:
        summary = json.load(f)
    summary["fault_tolerance"] = self.fault_tolerance()
    with open(path, "w") as f:
      json.dump(summary, f, indent=2, default=float)
    marks = [{"kind": "failure", "step": f["step"]} for f in self.failures]
    marks += [{"kind": "recovered", "step": e["step"]} for e in read_events(self.workdir)
              if e["event"] == "recovered"]
    evaluate.write_plots(self.workdir, summary, ingest.load(self.workdir).manifest.class_names,
                         events=marks)

  def tick(self) -> None:
    """One pass of the control loop."""
    with self.lock:
      now = time.time()
      if self.status == "recovering":
        # After a coordinator restart: if the agents still run the generation, carry on.
        running = [a for a in self.agents.values() if a.get("generation") == self.generation
                   and any(w.get("running") for w in a.get("workers", []))]
        if self.spec and len(running) == len(self.spec["hosts"]):
          self.status = "running"
          self.events.write("resumed_generation", generation=self.generation)
          self._persist()
        elif now > self.recover_until:
          self.status = "stopping"
          self.stop_deadline = now
          self.events.write("recovery_restart", generation=self.generation)
        return
      if self.status == "waiting":
        if now >= self.next_start:
          self._start_generation(now)
        return
      if self.status == "running":
        lost = [h for h in self.spec["hosts"]
                if h in self.agents and now - self.agents[h]["last_seen"] > self.f.host_timeout_s]
        if lost:
          self._fail("host_lost", lost[0], lost[0])
          return
        self._check_hangs(now)
        return
      if self.status == "stopping":
        # Every host of the stopped generation either reported (after the stop began) that its
        # workers are gone, or has been silent long enough to count as lost.
        settled, lost = True, []
        for h in (self.spec or {}).get("hosts", []):
          a = self.agents.get(h)
          if a is None or now - a["last_seen"] > self.f.host_timeout_s:
            lost.append(h)
          elif a["last_seen"] < self.stop_started or any(w.get("running")
                                                         for w in a.get("workers", [])):
            settled = False
        if lost and self.failures and self.failures[-1]["kind"] != "host_lost":
          # A peer's crash or hang was the symptom; the host going away was the cause.
          self.failures[-1].update(observed=self.failures[-1]["kind"], kind="host_lost",
                                   worker=lost[0], host=lost[0])
          self.events.write("failure_reclassified", kind="host_lost", host=lost[0])
        timeout = self.stop_deadline + self.f.stop_grace_s * 4 + self.f.host_timeout_s
        if settled or now > timeout:
          self.events.write("generation_stopped", generation=self.generation)
          if self.strikes > self.f.max_failures_without_progress:
            self._give_up(f"{self.strikes} failures in a row without a new committed checkpoint "
                          f"(config.fault.max_failures_without_progress="
                          f"{self.f.max_failures_without_progress})")
            return
          backoff = min(self.f.backoff_s * 2 ** max(self.strikes - 1, 0), self.f.backoff_max_s)
          self.next_start = now + backoff
          self.waiting_since = now
          self.status = "waiting"
          self._persist()

  def serve(self) -> int:
    handlers = {"RegisterAgent": self.register_agent, "AgentHeartbeat": self.agent_heartbeat,
                "ReportExit": self.report_exit, "WorkerHeartbeat": self.worker_heartbeat,
                "Commit": self.commit, "Status": self.status_rpc}
    server, port = protocol.serve(handlers, host=self.bind_host, port=self.port, token=self.token,
                                  tls_cert=self.f.tls_cert, tls_key=self.f.tls_key)
    self.port = port
    with open(os.path.join(self.workdir, "coordinator.json"), "w") as f:
      json.dump({"address": f"{self.bind_host}:{port}", "pid": os.getpid()}, f)
    self.events.write("coordinator_started", address=f"{self.bind_host}:{port}")
    try:
      while self.status not in ("done", "failed"):
        self.tick()
        time.sleep(0.05)
      if self.status == "done":
        try:
          self.finalize_summary()
        except Exception:  # pylint: disable=broad-except
          logging.exception("coordinator: could not add the fault-tolerance block to summary.json")
      # Serve until every live agent has heard 'exit' (or a while has passed).
      deadline = time.time() + max(10.0, 5 * self.f.agent_interval_s)
      while time.time() < deadline and set(self._alive_hosts()) - self.dismissed:
        time.sleep(0.05)
    finally:
      server.stop(grace=1.0)
    if self.status == "failed":
      logging.error("%s", self.error)
      return 2
    return 0
