"""The agent: one per host; starts, watches, stops and restarts that host's worker processes.

It registers with the coordinator and heartbeats every fault.agent_interval_s; each reply says
which generation to run. It starts the generation's workers (their jax.distributed address, process
ids and count come from the coordinator), reports any worker exit at once, and stops workers when
told: asked at a step boundary first (the coordinator's reply to their heartbeats), then SIGTERM,
then SIGKILL. If the coordinator is unreachable, workers keep running and the agent keeps trying;
a restarted coordinator hears from it again and learns what it runs.

So that a restart does not wait for Python to import JAX and the rest (seconds), the agent keeps
`fault.workers_per_host` standby worker processes that have imported everything and wait for an
assignment on stdin; a new generation's workers are standbys given their process ids. Used
standbys are replaced once the generation trains, so replacing them does not slow recovery.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import time
import uuid

import grpc

from medjax import paths
from medjax.fault import protocol

LAUNCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))), "launch.py")


_PR_SET_PDEATHSIG = 1
try:  # looked up here: the child between fork and exec must not load libraries
  _PRCTL = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):
  _PRCTL = None  # not Linux: the launcher's own clean-up is the only guard


def _die_with_parent() -> None:
  """In the child before exec: SIGKILL when the parent dies (Linux), so a launcher or agent
  that is killed leaves no orphan behind; and a session of its own, so a terminal's Ctrl-C
  reaches only the launcher, which stops the rest."""
  os.setsid()
  if _PRCTL is not None:
    _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL)


def popen(args: list[str], *, log: str, env: dict | None = None,
          stdin=None) -> subprocess.Popen:
  """Starts `launch.py args` with stdout and stderr appended to `log`; it dies with us."""
  with open(log, "a") as out:
    # The child has its own copy of the descriptor; ours closes here.
    return subprocess.Popen([sys.executable, LAUNCH, *args], env=env, stdin=stdin, stdout=out,
                            stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)


@dataclasses.dataclass
class Worker:
  process_id: int
  proc: subprocess.Popen
  reported: bool = False
  term_sent: float = 0.0


class Agent:
  """Supervises one host's workers for the coordinator at `address`."""

  def __init__(self, address: str, token: str, *, host: str, workdir: str, fault_config,
               advertise: str = "127.0.0.1", tls_ca: str = ""):
    self.client = protocol.Client(address, token, tls_ca=tls_ca, timeout_s=2.0)
    self.host, self.workdir, self.f, self.advertise = host, workdir, fault_config, advertise
    self.run_paths = paths.RunPaths(workdir)
    self.agent_id = uuid.uuid4().hex[:8]
    self.generation = -1
    self.workers: list[Worker] = []
    self.stopping_since = 0.0
    self.registered = False
    self.standby: list[subprocess.Popen] = []

  def _worker_status(self) -> list[dict]:
    return [{"process_id": w.process_id, "pid": w.proc.pid, "running": w.proc.poll() is None,
             "exit_code": w.proc.poll()} for w in self.workers]

  def _register(self) -> None:
    self.client.call("RegisterAgent", {
        "host": self.host, "agent_id": self.agent_id, "address": self.advertise,
        "free_port": protocol.free_port(), "generation": self.generation,
        "workers": self._worker_status()})
    self.registered = True

  def _env(self, devices: int) -> dict:
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    env.setdefault("JAX_PLATFORMS", "cpu")
    return env

  def _replenish(self) -> None:
    """Starts standby workers until `workers_per_host` are ready (or getting ready)."""
    if not self.f.standby_workers:
      return
    self.standby = [p for p in self.standby if p.poll() is None]
    os.makedirs(self.run_paths.logs, exist_ok=True)
    while len(self.standby) < self.f.workers_per_host:
      self.standby.append(popen(["--role=worker", "--standby", f"--workdir={self.workdir}"],
                                log=self.run_paths.process_log(f"standby-{self.host}"),
                                env=self._env(self.f.devices_per_worker), stdin=subprocess.PIPE))

  def _start(self, spec: dict) -> None:
    self.generation = spec["generation"]
    host_index = spec["hosts"].index(self.host)
    os.makedirs(self.run_paths.logs, exist_ok=True)
    ready = [p for p in self.standby if p.poll() is None]
    if spec["devices_per_worker"] != self.f.devices_per_worker:
      ready = []
    used = 0
    for local in range(spec["workers_per_host"]):
      pid = host_index * spec["workers_per_host"] + local
      assignment = {"generation": self.generation, "process_id": pid, "host_name": self.host,
                    "coordinator": self.client.address}
      proc = ready.pop(0) if ready else None
      if proc is not None:
        try:
          proc.stdin.write((json.dumps(assignment) + "\n").encode())
          proc.stdin.close()
          self.standby.remove(proc)
          used += 1
        except (BrokenPipeError, OSError):
          proc = None
      if proc is None:
        proc = popen(["--role=worker", f"--workdir={self.workdir}",
                      f"--generation={self.generation}", f"--process_id={pid}",
                      f"--host_name={self.host}", f"--coordinator={self.client.address}"],
                     log=self.run_paths.worker_output(self.generation, pid),
                     env=self._env(spec["devices_per_worker"]))
      self.workers.append(Worker(pid, proc))
    logging.info("agent %s: started generation %d (%d workers, %d of them standbys)", self.host,
                 self.generation, len(self.workers), used)

  def _stop_workers(self, now: float) -> bool:
    """Escalates SIGTERM -> SIGKILL on live workers; True once none is running."""
    alive = [w for w in self.workers if w.proc.poll() is None]
    if not alive:
      return True
    if not self.stopping_since:
      self.stopping_since = now
    waited = now - self.stopping_since
    for w in alive:
      if waited > self.f.stop_grace_s * 2:
        w.proc.send_signal(signal.SIGKILL)
      elif waited > self.f.stop_grace_s and not w.term_sent:
        w.term_sent = now
        w.proc.send_signal(signal.SIGTERM)
    return False

  def _reap(self) -> None:
    # A worker killed by a signal is more likely the cause than a peer that then errored out.
    exited = [w for w in self.workers if w.proc.poll() is not None and not w.reported]
    for w in sorted(exited, key=lambda w: (w.proc.returncode >= 0, w.process_id)):
      try:
        self.client.call("ReportExit", {"host": self.host, "generation": self.generation,
                                        "process_id": w.process_id,
                                        "exit_code": w.proc.returncode,
                                        "reason": self._reason(w)})
        w.reported = True
      except grpc.RpcError:
        pass  # reported on a later pass

  def _reason(self, w: Worker) -> str:
    """The worker's one-line error, if it left one (a worker killed by a signal leaves none)."""
    try:
      with open(self.run_paths.worker_error(self.generation, w.process_id)) as f:
        return f.readline().strip()[:600]
    except OSError:
      return ""

  def run(self) -> int:
    """Runs until the coordinator says the run is over."""
    self._replenish()
    try:
      return self._loop()
    finally:
      for proc in self.standby:
        proc.kill()

  def _loop(self) -> int:
    unreachable_since = None
    while True:
      now = time.time()
      self._reap()
      try:
        if not self.registered:
          self._register()
        reply = self.client.call("AgentHeartbeat", {
            "host": self.host, "agent_id": self.agent_id, "generation": self.generation,
            "free_port": protocol.free_port(), "workers": self._worker_status()})
        unreachable_since = None
      except grpc.RpcError:
        if unreachable_since is None:
          unreachable_since = now
          logging.warning("agent %s: coordinator unreachable; workers keep running", self.host)
        if now - unreachable_since > self.f.coordinator_lost_s:
          logging.error("agent %s: coordinator gone for %.0fs; stopping", self.host,
                        now - unreachable_since)
          while not self._stop_workers(time.time()):
            time.sleep(0.1)
          return 3
        self.registered = False
        time.sleep(self.f.agent_interval_s)
        continue
      action = reply.get("action")
      if action == "register":
        self.registered = False
      elif action == "run":
        if reply["generation"] != self.generation or not self.workers:
          if self._stop_workers(now):
            self.workers, self.stopping_since = [], 0.0
            self._start(reply["spec"])
        elif reply.get("training"):
          self._replenish()
      elif action in ("stop", "exit"):
        if self._stop_workers(now):
          self.workers, self.stopping_since = [], 0.0
          if action == "exit":
            return 0
      time.sleep(self.f.agent_interval_s)
