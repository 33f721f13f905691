"""The agent: one per host; starts, watches, stops and restarts that host's worker processes.

It registers with the coordinator and heartbeats every fault.agent_interval_s; each reply says
which generation to run. It starts the generation's workers (their jax.distributed address, process
ids and count come from the coordinator), reports any worker exit at once, and stops workers when
told: asked at a step boundary first (the coordinator's reply to their heartbeats), then SIGTERM,
then SIGKILL. If the coordinator is unreachable, workers keep running and the agent keeps trying;
a restarted coordinator hears from it again and learns what it runs.

So that a restart does not wait for Python to import JAX and the rest (seconds), a new
generation's workers are standby processes given their process ids (`medjax.fault.standbys`:
kept ready, prepared ahead where they can be, replaced once the generation trains), else new
processes ('relaunch').
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import signal
import subprocess
import time
import uuid

import grpc

import psutil

from medjax import lifeline
from medjax import paths
from medjax.fault import forking
from medjax.fault import layout as layout_lib
from medjax.fault import protocol
from medjax.fault import spawn
from medjax.fault import standbys as standbys_lib
from medjax.runtime import phases as phases_lib

def main(config, workdir: str, *, host: str, coordinator: str,
         advertise: str = "127.0.0.1") -> int:
  """Runs `host`'s agent for the coordinator at `coordinator` (HOST:PORT) until the run is over;
  its exit code."""
  token = protocol.load_token(paths.RunPaths(workdir, config).token)
  return Agent(coordinator, token, host=host, workdir=workdir, fault_config=config.fault,
               advertise=advertise, tls_ca=config.fault.tls_ca).run()


@dataclasses.dataclass
class Worker:
  process_id: int
  proc: subprocess.Popen
  reported: bool = False
  term_sent: float = 0.0
  signalled: bool = False   # the agent sent it SIGTERM or SIGKILL (stopping its generation)


# An abseil FATAL line (XLA's and the runtime's LOG(FATAL), a failed CHECK: severity F, the date
# and time, the thread, the source line, then the message), or the first line of Python's
# faulthandler report of a fatal signal (absl's app.run enables it in every worker).
_FATAL = re.compile(r"^(?:F\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ [^\]]+\] |Fatal Python error: )(.+)$")
_TAIL_BYTES = 64 << 10


def fatal_line(log_path: str) -> str:
  """The message of the last FATAL line near the end of `log_path`, as 'fatal: <message>';
  '' without one."""
  try:
    with open(log_path, "rb") as f:
      f.seek(max(os.fstat(f.fileno()).st_size - _TAIL_BYTES, 0))
      tail = f.read().decode("utf-8", "replace")
  except OSError:
    return ""
  for line in reversed(tail.splitlines()):
    match = _FATAL.match(line)
    if match:
      return f"fatal: {match.group(1).strip()}"[:600]
  return ""


def _suspended(pid: int) -> bool:
  try:
    return psutil.Process(pid).status() == psutil.STATUS_STOPPED
  except psutil.Error:
    return False


def with_device_count(xla_flags: str, devices: int) -> str:
  """The user's XLA_FLAGS with the CPU device count a worker gets (any count they held
  replaced): flags such as --xla_dump_to or the backend's optimisation level reach the workers."""
  return " ".join([*without_device_count(xla_flags).split(),
                   f"--xla_force_host_platform_device_count={devices}"])


def without_device_count(xla_flags: str) -> str:
  """XLA_FLAGS without a CPU device count: what a process that starts runs of its own (a test, a
  benchmark) passes on, its fake devices not being theirs."""
  return " ".join(f for f in xla_flags.split()
                  if not f.startswith("--xla_force_host_platform_device_count"))


class Agent:
  """Supervises one host's workers for the coordinator at `address`."""

  def __init__(self, address: str, token: str, *, host: str, workdir: str, fault_config,
               advertise: str = "127.0.0.1", tls_ca: str = ""):
    self.client = protocol.Client(address, token, tls_ca=tls_ca, timeout_s=2.0)
    # A config that says "auto" (fault.workers_per_host=0) is resolved for this machine; the
    # local launcher resolved it already (medjax.fault.layout).
    fault_config, self.layout = layout_lib.resolved(fault_config)
    self.host, self.workdir, self.f, self.advertise = host, workdir, fault_config, advertise
    self.run_paths = paths.RunPaths(workdir)
    self.agent_id = uuid.uuid4().hex[:8]
    self.generation = -1
    self.workers: list[Worker] = []
    self.stopping_since = 0.0
    self.registered = False
    self.standbys = standbys_lib.Standbys(host=host, workdir=workdir, fault_config=fault_config,
                                          platform=self.layout.platform, advertise=advertise,
                                          env=self._env)
    # Whether orphans (the spares standbys fork) are reparented to us.
    self.subreaper = False
    self._reaped_at = 0.0

  def _worker_status(self) -> list[dict]:
    return [{"process_id": w.process_id, "pid": w.proc.pid, "running": w.proc.poll() is None,
             "exit_code": w.proc.poll()} for w in self.workers]

  def _register(self) -> None:
    self.client.call("RegisterAgent", {
        "host": self.host, "agent_id": self.agent_id, "address": self.advertise,
        "free_port": self.standbys.free_port(), "generation": self.generation,
        "workers": self._worker_status()})
    self.registered = True

  def _env(self, devices: int, *, beside: bool = False) -> dict:
    """A worker's environment. On a GPU, JAX takes 75% of its memory at the start; a spare
    started `beside` a running worker of the same GPU, whose state, compiled step and CUDA
    context must fit in what is left, allocates what it uses instead (unless the user's
    environment says otherwise), and keeps doing so if it takes over. Workers started before
    anything trains keep JAX's default: a run that never fails runs as it always did."""
    env = dict(os.environ)
    if self.layout.platform == "cpu":
      env["XLA_FLAGS"] = with_device_count(env.get("XLA_FLAGS", ""), devices)
      env.setdefault("JAX_PLATFORMS", "cpu")
    elif self.layout.platform == "gpu" and beside:
      env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    return env

  def _reap_orphans(self, now: float) -> None:
    """As a subreaper, collects the orphans it adopted once they exit (at most once a second)."""
    if self.subreaper and now - self._reaped_at >= 1.0:
      self._reaped_at = now
      forking.reap_orphans({w.proc.pid for w in self.workers}
                           | {s.proc.pid for s in self.standbys.pool})

  def _start(self, spec: dict) -> None:
    self.generation = spec["generation"]
    self.standbys.groups_tried = 0
    host_index = spec["hosts"].index(self.host)
    os.makedirs(self.run_paths.logs, exist_ok=True)
    group = self.standbys.group_for(spec)
    if group is None:
      self.standbys.drop_group()
    paths_taken = []
    for local in range(spec["workers_per_host"]):
      pid = host_index * spec["workers_per_host"] + local
      if group is not None:
        standby, path = group[local], "warm_standby"
        self.standbys.pool.remove(standby)
      else:
        standby, path = self.standbys.take(spec)
      proc = None
      if standby is not None:
        assignment = {"generation": self.generation, "process_id": pid, "host_name": self.host,
                      "coordinator": self.client.address, "assigned_at": time.time(),
                      "path": path, "nice": os.getpriority(os.PRIO_PROCESS, 0)}
        if self.standbys.tell(standby, assignment, close=True):
          proc = standby.proc
        else:
          standby.proc.kill()
          path = "relaunch"
      if proc is None:
        env = self._env(spec["devices_per_worker"])
        env[phases_lib.ASSIGNED_AT_ENV] = repr(time.time())
        proc = spawn.popen(["--role=worker", f"--workdir={self.workdir}",
                            f"--generation={self.generation}", f"--process_id={pid}",
                            f"--host_name={self.host}", f"--coordinator={self.client.address}"],
                           log=self.run_paths.worker_output(self.generation, pid), env=env)
      paths_taken.append(path)
      self.workers.append(Worker(pid, proc))
    if group is not None:
      self.standbys.group_port = None   # its service is the generation's now
    # Standbys prepared for another shape will not serve the next generation either.
    for s in [s for s in self.standbys.pool if s.prepared_for is not None
              and s.prepared_for != self.standbys.warm_key(spec)]:
      s.proc.kill()
      self.standbys.pool.remove(s)
    logging.info("agent %s: started generation %d (%d workers, %d of them standbys; paths %s)",
                 self.host, self.generation, len(self.workers),
                 sum(p != "relaunch" for p in paths_taken), paths_taken)

  def _stop_workers(self, now: float) -> bool:
    """Escalates SIGTERM -> SIGKILL on live workers; True once none is running."""
    alive = [w for w in self.workers if w.proc.poll() is None]
    if not alive:
      return True
    if not self.stopping_since:
      self.stopping_since = now
    waited = now - self.stopping_since
    for w in alive:
      if waited > self.f.stop_grace_s * 2 or _suspended(w.proc.pid):
        # A stopped process (SIGSTOP) can act on nothing else: no need to wait for it.
        w.signalled = True
        w.proc.send_signal(signal.SIGKILL)
      elif waited > self.f.stop_grace_s and not w.term_sent:
        w.term_sent, w.signalled = now, True
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
                                        "signalled": w.signalled, "reason": self._reason(w)})
        w.reported = True
      except grpc.RpcError:
        pass  # reported on a later pass

  def _reason(self, w: Worker) -> str:
    """The worker's one-line error, if it left one; else the FATAL line its native code logged
    last before it exited (an XLA flag it does not know, a failed check, a segmentation fault),
    if any. A worker killed by SIGKILL or SIGTERM leaves neither."""
    try:
      with open(self.run_paths.worker_error(self.generation, w.process_id)) as f:
        return f.readline().strip()[:600]
    except OSError:
      pass
    if w.proc.returncode == 0:
      return ""
    return fatal_line(self.run_paths.worker_output(self.generation, w.process_id))

  def run(self) -> int:
    """Runs until the coordinator says the run is over."""
    # The spares for the first restart are made while the run starts, not later while training
    # takes every core; they are not prepared ahead until the run has restarted. Each standby
    # forks one once it has imported (no import of their own; we adopt them, as a subreaper);
    # where that cannot be, they import now, at low priority, beside the start (its standbys'
    # imports, the coordinator, the data: single threads that leave a core idle).
    spares = self.f.standby_workers and self.standbys.spare_waits(generation=0)
    self.subreaper = spares and forking.become_subreaper()
    self.standbys.replenish(fork_spares=self.subreaper)
    if spares and not self.subreaper:
      self.standbys.pool += [
          standbys_lib.Standby(self.standbys.popen_standby(low_priority=self.standbys.low_priority))
          for _ in range(self.f.workers_per_host)]
    try:
      return self._loop()
    finally:
      for s in self.standbys.pool:
        s.proc.kill()

  def _loop(self) -> int:
    unreachable_since, reached = None, False
    while True:
      now = time.time()
      self.standbys.adopt_spares()
      self._reap_orphans(now)
      self._reap()
      try:
        if not self.registered:
          self._register()
        reply = self.client.call("AgentHeartbeat", {
            "host": self.host, "agent_id": self.agent_id, "generation": self.generation,
            "free_port": self.standbys.free_port(), "workers": self._worker_status()})
        unreachable_since, reached = None, True
      except grpc.RpcError:
        if unreachable_since is None:
          unreachable_since = now
          if reached:
            logging.warning("agent %s: coordinator unreachable; workers keep running", self.host)
          else:   # it is starting beside us
            logging.info("agent %s: waiting for the coordinator at %s", self.host,
                         self.client.address)
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
            self._forget_workers()
            self._start(reply["spec"])
        elif reply.get("training"):
          self.standbys.replenish(reply["spec"])
      elif action in ("stop", "exit"):
        if self._stop_workers(now):
          self._forget_workers()
          if action == "exit":
            return 0
      # While a generation is being stopped or awaited, ask again soon: the next one starts as
      # soon as the coordinator has it.
      waiting = action == "stop" or (action == "run" and not self.workers)
      self._nap(self.f.agent_interval_s / 4 if waiting else self.f.agent_interval_s)

  def _nap(self, seconds: float) -> None:
    """Sleeps `seconds`, or less if a worker exits meanwhile (the next pass reports the exit at
    once: a failure's detection, or the end of the run, without waiting out the interval) or a
    standby's spare writes its pid (adopted at once)."""
    lifeline.wait_any([w.proc.pid for w in self.workers if w.proc.returncode is None], seconds,
                      fds=self.standbys.pending_spares)

  def _forget_workers(self) -> None:
    """The generation's workers have all exited and are dropped."""
    self.workers, self.stopping_since = [], 0.0
