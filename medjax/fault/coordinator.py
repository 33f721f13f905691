"""The coordinator: membership, generations, failure detection, recovery, the lineage commit.

One process, a gRPC server (`protocol`). Agents (one per host) register and heartbeat; it tells
them which generation to run (hosts, process ids, the jax.distributed address). Workers heartbeat
their progress and send commits, which it writes to the lineage store, pruning the checkpoints
that fall out of config.ckpt.max_to_keep (in supervised runs it is the only party that prunes).

The decisions (what failed, whether and where to restart, after what back-off, when to give up)
are `medjax.fault.policy`'s; this module is the shell around it: it feeds the policy the RPCs and
a tick every 50 ms with the wall clock, and carries out its effects: events to events.jsonl,
generation specs, and the policy's state to the lineage store, so that a restarted coordinator
picks up the run where it was (agents re-register with the generation they run, and the workers
of that generation train on).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time

from medjax import errors
from medjax import lineage as lineage_lib
from medjax import paths
from medjax.checkpoint import retention
from medjax.fault import layout
from medjax.fault import policy as policy_lib
from medjax.fault import protocol
from medjax.fault import report
from medjax.fault import run_state
from medjax.runtime import inject

_TICK_S = 0.05


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


class Coordinator:
  """The coordinator of the run in `workdir`; `serve()` runs it until the run ends."""

  def __init__(self, config, workdir: str, *, token: str, host: str = "127.0.0.1",
               port: int = 0):
    # fault.workers_per_host=0 ("auto"): this machine's layout (the local launcher saved it
    # resolved already; a coordinator started with --config resolves it here).
    layout.resolve_config(config)
    self.config, self.run = config, paths.RunPaths(workdir, config)
    self.token, self.bind_host, self.port = token, host, port
    self.store = lineage_lib.LineageStore(self.run.lineage_store)
    self.events = EventLog(self.run.events)
    self.lock = threading.Lock()
    self._over = threading.Event()   # set once the policy has finished the run
    # The training split's rows for the summary's exactly-once check, read while the run trains
    # (this process is idle then) rather than after the last worker exited.
    self._train_rows = None
    committed = self.store.committed_steps()

    def policy(saved):
      return policy_lib.Policy(config.fault, time.time(), saved=saved,
                               last_commit=committed[-1] if committed else 0,
                               fault_times=lambda: inject.fired(workdir))
    try:
      self.policy = policy(self.store.get_state("coordinator", run_state.SAVED))
    except (lineage_lib.LineageError, KeyError, ValueError, TypeError, AttributeError) as e:
      # Garbled state, or JSON of another shape (a disk that filled up, a bad copy, a hand
      # edit): start over from what is on disk, here rather than in a crash later that would
      # restart into the same state. The committed checkpoints are in the store; generations go
      # on after the newest spec written; only the failure history of the summary is lost, and
      # the event says so (naming the field that was wrong).
      self.policy = policy(None)
      self.policy.state.generation = self._newest_generation()
      self.store.put_state("coordinator", self.policy.state.to_json())
      self.events.write("coordinator_state_damaged", error=errors.one_line(str(e))[:300],
                        generation=self.policy.state.generation,
                        note="started from a fresh state; failures before this are not in the "
                             "summary")
      logging.error("coordinator: its saved state is damaged (%s); starting from a fresh state "
                    "after generation %d", e, self.policy.state.generation)
    if self.policy.restored:
      self.events.write("coordinator_restarted", generation=self.policy.state.generation)

  def _newest_generation(self) -> int:
    names = os.listdir(self.run.generations) if os.path.isdir(self.run.generations) else []
    numbers = [int(n[4:-5]) for n in names if n.startswith("gen-") and n[4:-5].isdigit()]
    return max(numbers, default=0)

  def _apply(self, effects: run_state.Effects) -> dict | None:
    """Carries out the policy's effects (the caller holds the lock); returns the reply."""
    if effects.spec is not None:
      os.makedirs(self.run.generations, exist_ok=True)
      with open(self.run.generation_spec(effects.spec["generation"]), "w") as f:
        json.dump(effects.spec, f, indent=2)
    for event, fields in effects.events:
      self.events.write(event, **fields)
    if effects.persist:
      self.store.put_state("coordinator", self.policy.state.to_json())
    if self.policy.finished:
      self._over.set()
    return effects.reply

  def _handler(self, decide):
    """An RPC handler: the policy's decision on the message, now."""
    def handle(msg: dict) -> dict:
      with self.lock:
        return self._apply(decide(msg, time.time()))
    return handle

  def commit(self, msg: dict) -> dict:
    """Writes a finalized checkpoint's lineage record, then prunes the checkpoints."""
    try:
      record = lineage_lib.Lineage.from_dict(msg.get("record"))
    except lineage_lib.LineageError as e:
      # Acknowledged, so the worker does not resend it forever; the step stays uncommitted.
      logging.error("coordinator: refusing a commit from generation %s: %s", msg.get("generation"),
                    e)
      return {"ok": False, "error": str(e)}
    with self.lock:
      self.store.commit(record, committed_at=time.time())
      best = lineage_lib.best_step(record) if self.config.ckpt.keep_best else None
      removed = retention.prune(self.run.checkpoints, self.store.committed_steps(),
                                self.config.ckpt.max_to_keep,
                                also_keep=() if best is None else (best,))
      self.events.write("commit", generation=msg.get("generation"), step=record.global_step,
                        epoch=record.epoch, partition=record.partition, offset=record.offset,
                        write_s=msg.get("write_s"), pruned=removed)
      self._apply(self.policy.committed(record.global_step))
    return {"ok": True}

  def _read_train_rows(self) -> None:
    try:
      self._train_rows = report.train_rows(self.run)
    except Exception:  # pylint: disable=broad-except  # the summary reads it again, and reports
      logging.exception("coordinator: could not read the manifest's training rows")
      self._train_rows = False   # not tried again

  def status(self, msg: dict) -> dict:  # pylint: disable=unused-argument
    with self.lock:
      return self.policy.status()

  def tick(self) -> None:
    """One pass of the control loop."""
    with self.lock:
      self._apply(self.policy.tick(time.time()))

  def serve(self) -> int:
    """Serves until the run is done (returns 0) or the policy gave up (returns 2)."""
    p = self.policy
    handlers = {"RegisterAgent": self._handler(p.register_agent),
                "AgentHeartbeat": self._handler(p.agent_heartbeat),
                "ReportExit": self._handler(p.report_exit),
                "WorkerHeartbeat": self._handler(p.worker_heartbeat),
                "Commit": self.commit, "Status": self.status}
    f = self.config.fault
    server, self.port = protocol.serve(handlers, host=self.bind_host, port=self.port,
                                       token=self.token, tls_cert=f.tls_cert, tls_key=f.tls_key)
    address = f"{self.bind_host}:{self.port}"
    with open(self.run.coordinator_address, "w") as out:
      json.dump({"address": address, "pid": os.getpid()}, out)
    self.events.write("coordinator_started", address=address)
    try:
      while not p.finished:
        self.tick()
        if self._train_rows is None and p.training:
          self._read_train_rows()
        self._over.wait(_TICK_S)   # the last worker's exit ends the wait at once
      if p.state.status == run_state.Status.DONE:
        try:
          rows = self._train_rows if self._train_rows is not False else None
          report.write_summary(self.run, p.state, self.store, rows)
        except Exception:  # pylint: disable=broad-except
          logging.exception("coordinator: could not add the fault-tolerance block to summary.json")
      # Serve until every live agent has heard 'exit' (or a while has passed).
      deadline = time.time() + max(10.0, 5 * f.agent_interval_s)
      while time.time() < deadline:
        with self.lock:
          if p.all_dismissed(time.time()):
            break
        time.sleep(_TICK_S)
    finally:
      server.stop(grace=1.0)
    if p.state.status == run_state.Status.FAILED:
      logging.error("%s", p.state.error)
      return 2
    return 0
