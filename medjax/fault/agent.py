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
Where the generation runs on a CPU host alone (one process, the default layout there,
`medjax.fault.layout`, or several), the agent also tells its standbys to prepare for the next
generation of the same shape (`warm_key`): they build the data, the model, the state and the
compiled step ahead, so that a restart only restores the checkpoint and goes on
('warm_standby'). Several processes prepare as a group: the agent picks a port, each standby
joins jax.distributed there as the process it will be, and the agent offers that port to the
coordinator as the next generation's address; the group serves a generation only if its
address, process count and hosts are the ones the group joined for, and is replaced otherwise. A
standby prepared for another shape (the host set changed) is replaced; other generations take
unprepared standbys ('standby'), or new processes ('relaunch'). Replacement standbys run
at the lowest CPU priority until they are handed a generation, where that priority can be given
back (`priority_restorable`), so that their start-up does not slow the training that goes on.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid

import grpc

import psutil

from medjax import lifeline
from medjax import paths
from medjax.fault import forking
from medjax.fault import layout as layout_lib
from medjax.runtime import phases as phases_lib
from medjax.fault import protocol

# The command a worker runs: this medjax's (`lifeline.child_env` points the child at it).
COMMAND = (sys.executable, "-m", "medjax")


def popen(args: list[str], *, log: str, env: dict | None = None, stdin=None,
          low_priority: bool = False, pass_fds: tuple[int, ...] = ()) -> subprocess.Popen:
  """Starts `medjax args` with stdout and stderr appended to `log`, in a session of its own;
  it dies with us (`medjax.lifeline`).

  `low_priority`: at nice 19 and SCHED_IDLE (a standby restores its priority when it is handed
  a generation).
  """
  with open(log, "a") as out:
    # The child has its own copy of the descriptor; ours closes here.
    return subprocess.Popen([*COMMAND, *args],
                            env=lifeline.child_env(env, low_priority=low_priority), stdin=stdin,
                            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                            pass_fds=pass_fds)


def main(config, workdir: str, *, host: str, coordinator: str,
         advertise: str = "127.0.0.1") -> int:
  """Runs `host`'s agent for the coordinator at `coordinator` (HOST:PORT) until the run is over;
  its exit code."""
  token = protocol.load_token(paths.RunPaths(workdir, config).token)
  return Agent(coordinator, token, host=host, workdir=workdir, fault_config=config.fault,
               advertise=advertise, tls_ca=config.fault.tls_ca).run()


def priority_restorable() -> bool:
  """Whether a process of ours may take its priority back after lowering it (root with
  CAP_SYS_NICE, or RLIMIT_NICE): asked of a throwaway thread, since nice values and scheduling
  policies are per thread on Linux."""
  result = []

  def probe():
    tid = threading.get_native_id()
    try:
      nice = os.getpriority(os.PRIO_PROCESS, tid)
      os.setpriority(os.PRIO_PROCESS, tid, min(nice + 1, 19))
      os.setpriority(os.PRIO_PROCESS, tid, nice)
      os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
      os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
      result.append(nice < 19)
    except (OSError, AttributeError):
      result.append(False)
  thread = threading.Thread(target=probe, name="nice-probe")
  thread.start()
  thread.join()
  return bool(result and result[0])


def warm_key(spec: dict, host: str, platform: str, when: str = "always") -> str | None:
  """What a warm standby of `host` prepares for after generation `spec`: the next generation if
  it has the same hosts and history. None where no standby can prepare: several processes over
  several hosts (jax.distributed must start before JAX does, at an address the first host's
  agent offers; a group of standbys joins it ahead only where one agent owns every process), or
  a TPU (a chip opens in one process at a time; a GPU is shared: a spare started beside a
  running worker allocates memory as it needs it, `Agent._env`, and one that finds too little
  prepares nothing); and where `when`
  (config.fault.warm_standby) says not yet: 'after_failure' prepares from the second generation
  on. Preparing takes about 2 CPU-seconds from a CPU host's training (measured on 2 cores: the
  quickstart trained 10-30% longer), and a run that never fails gains nothing from it; one that
  has failed once is the one likely to fail again."""
  if host not in spec["hosts"] or platform not in layout_lib.PREPARE_AHEAD_ON:
    return None
  if spec["num_processes"] != 1 and spec["hosts"] != [host]:
    return None
  if when == "never" or (when == "after_failure" and spec["generation"] <= 1):
    return None
  return json.dumps({"hosts": spec["hosts"], "host_history": spec["host_history"],
                     "host": host, "devices_per_worker": spec["devices_per_worker"],
                     "num_processes": spec["num_processes"]}, sort_keys=True)


@dataclasses.dataclass
class Standby:
  """A standby worker process; `prepared_for`: the `warm_key` it was told to prepare for;
  `process_id`: the jax.distributed process it joined as, in a group (`Agent._prepare_group`);
  `beside`: started while a generation trains, to prepare beside its workers (`Agent._env`)."""
  proc: subprocess.Popen
  prepared_for: str | None = None
  process_id: int | None = None
  beside: bool = False


@dataclasses.dataclass
class Worker:
  process_id: int
  proc: subprocess.Popen
  reported: bool = False
  term_sent: float = 0.0


def _suspended(pid: int) -> bool:
  try:
    return psutil.Process(pid).status() == psutil.STATUS_STOPPED
  except psutil.Error:
    return False


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
    self.standby: list[Standby] = []
    # The port of the jax.distributed service a group of standbys joined (its process 0 holds
    # it), offered to the coordinator as this host's free port; groups tried this generation.
    self.group_port: int | None = None
    self.groups_tried = 0
    self.low_priority = priority_restorable()
    # Our ends of the socket pairs of standbys that will fork a spare once imported, until the
    # spare writes its pid (`_adopt_spares`); whether orphans are reparented to us.
    self.pending_spares: list[socket.socket] = []
    self.subreaper = False
    self._reaped_at = 0.0
    # A config.json from before the field existed means what the default means.
    self.warm_when = fault_config.get("warm_standby", "after_failure")

  def _warm_key(self, spec: dict) -> str | None:
    return warm_key(spec, self.host, self.layout.platform, self.warm_when)

  def _spare_waits(self, generation: int) -> bool:
    """True while a CPU host starts no spare standby during training and prepares none
    (fault.warm_standby 'after_failure', until the run restarts): on CPU that work takes the
    cores training uses, which a run that never fails pays for nothing. The spare for the first
    restart imports while the run starts (`run`); from the first restart on, a spare is
    started and prepared ahead during training."""
    return (self.layout.platform == "cpu" and generation <= 1
            and self.warm_when == "after_failure")

  def _worker_status(self) -> list[dict]:
    return [{"process_id": w.process_id, "pid": w.proc.pid, "running": w.proc.poll() is None,
             "exit_code": w.proc.poll()} for w in self.workers]

  def _register(self) -> None:
    self.client.call("RegisterAgent", {
        "host": self.host, "agent_id": self.agent_id, "address": self.advertise,
        "free_port": self._free_port(), "generation": self.generation,
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
      env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
      env.setdefault("JAX_PLATFORMS", "cpu")
    elif self.layout.platform == "gpu" and beside:
      env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    return env

  def _can_prepare(self, standby: Standby) -> bool:
    """Unprepared, running, and (on a GPU) started to fit beside a running worker."""
    return (standby.prepared_for is None and standby.proc.poll() is None
            and (standby.beside or self.layout.platform != "gpu"))

  def _replenish(self, spec: dict | None = None, *, fork_spares: bool = False) -> None:
    """Starts standby workers until `workers_per_host` are ready (or getting ready); with the
    running generation's `spec`, at low priority, and tells them to prepare for the next
    generation of its shape when they can (`warm_key`). With `fork_spares`, each new standby
    forks a spare once it has imported (`_adopt_spares`)."""
    if not self.f.standby_workers:
      return
    if spec is not None and self._spare_waits(spec["generation"]):
      return
    self.standby = [s for s in self.standby if s.proc.poll() is None]
    key = self._warm_key(spec) if spec is not None else None
    if any(s.prepared_for != key for s in self._group_members()):
      self._drop_group()
    for s in [s for s in self.standby if s.prepared_for not in (None, key)]:
      s.proc.kill()   # prepared for a generation that will not come (the host set changed)
      self.standby.remove(s)
    os.makedirs(self.run_paths.logs, exist_ok=True)
    wanted = spec["workers_per_host"] if spec is not None else self.f.workers_per_host
    while len(self.standby) < wanted:
      beside = spec is not None
      self.standby.append(Standby(self._popen_standby(
          low_priority=beside and self.low_priority, beside=beside, fork_spare=fork_spares),
          beside=beside))
    if key is None:
      return
    expected = {"hosts": spec["hosts"], "host_history": spec["host_history"], "host": self.host}
    if spec["num_processes"] > 1:
      self._prepare_group(key, expected, spec["num_processes"])
      return
    for s in self.standby:
      if self._can_prepare(s) and self._tell(s, {"prepare": expected}, close=False):
        s.prepared_for = key

  # Groups tried per generation: a group whose member cannot join or prepare is not retried
  # without end (its standbys stay unprepared).
  MAX_GROUPS = 2

  def _prepare_group(self, key: str, expected: dict, n: int) -> None:
    """Tells `n` unprepared standbys to join jax.distributed at a port of this host as
    processes 0..n-1 of the next generation and to prepare for it. A group with a member gone
    is of no use (its service, or a peer, is missing): it is replaced."""
    members = self._group_members()
    if members and (len(members) < n or any(s.proc.poll() is not None for s in members)):
      logging.warning("agent %s: a standby of the prepared group exited; replacing the group",
                      self.host)
      self._drop_group()
      return
    if members or self.groups_tried >= self.MAX_GROUPS:
      return
    bare = [s for s in self.standby if self._can_prepare(s)]
    if len(bare) < n:
      return
    self.groups_tried += 1
    port = protocol.free_port()
    address = f"{self.advertise}:{port}"
    for i, s in enumerate(bare[:n]):
      s.prepared_for, s.process_id = key, i
      job = {"prepare": expected,
             "distributed": {"address": address, "num_processes": n, "process_id": i}}
      if not self._tell(s, job, close=False):
        self._drop_group()
        return
    self.group_port = port
    logging.info("agent %s: %d standbys join jax.distributed at %s and prepare for the next "
                 "generation", self.host, n, address)

  def _group_members(self) -> list[Standby]:
    """The standbys that joined the prepared group, by process id."""
    return sorted((s for s in self.standby if s.process_id is not None),
                  key=lambda s: s.process_id)

  def _drop_group(self) -> None:
    """Ends the standbys that joined a group, and waits for them: the group's process 0 holds
    the port offered to the coordinator, which the next generation's process 0 may need."""
    members = self._group_members()
    for s in members:
      s.proc.kill()
    for s in members:
      try:
        s.proc.wait(timeout=5)
      except subprocess.TimeoutExpired:
        logging.warning("agent %s: standby %d did not exit after SIGKILL", self.host, s.proc.pid)
      self.standby.remove(s)
    self.group_port = None

  def _free_port(self) -> int:
    """The port this host offers for the next generation's jax.distributed service: the one a
    prepared group joined, else any free one."""
    if self.group_port is not None and any(s.process_id == 0 and s.proc.poll() is None
                                           for s in self._group_members()):
      return self.group_port
    return protocol.free_port()

  def _group_for(self, spec: dict) -> list[Standby] | None:
    """The prepared group that can be `spec`'s processes 0..n-1, in order, or None."""
    n = spec["num_processes"]
    key = self._warm_key(spec)
    members = self._group_members()
    if (n == 1 or key is None or self.group_port is None
        or spec["jax_address"] != f"{self.advertise}:{self.group_port}"
        or [s.process_id for s in members] != list(range(n))
        or any(s.prepared_for != key or s.proc.poll() is not None for s in members)):
      return None
    return members

  def _popen_standby(self, *, low_priority: bool, beside: bool = False,
                     fork_spare: bool = False) -> subprocess.Popen:
    env = self._env(self.f.devices_per_worker, beside=beside)
    ours = theirs = None
    if fork_spare:
      ours, theirs = socket.socketpair()
      env[forking.SPARE_FD_ENV] = str(theirs.fileno())
    try:
      proc = popen(["--role=worker", "--standby", f"--workdir={self.workdir}"],
                   log=self.run_paths.process_log(f"standby-{self.host}"), env=env,
                   stdin=subprocess.PIPE, low_priority=low_priority,
                   pass_fds=(theirs.fileno(),) if theirs else ())
    finally:
      if theirs is not None:
        theirs.close()
    if ours is not None:
      self.pending_spares.append(ours)
    return proc

  def _adopt_spares(self) -> None:
    """Takes on the spares that standbys forked once imported (`worker._fork_spare`): each
    writes its pid on its socket once it is our child, and reads its lines from it from then
    on. A standby that closed its end without forking (it exited, or could not fork) gets a
    spare started anew instead, at low priority."""
    for sock in list(self.pending_spares):
      try:
        data = sock.recv(64, socket.MSG_DONTWAIT)
      except BlockingIOError:
        continue
      except OSError:
        data = b""
      self.pending_spares.remove(sock)
      if not data.strip():
        sock.close()
        logging.info("agent %s: a standby forked no spare; starting one", self.host)
        self.standby.append(Standby(self._popen_standby(low_priority=self.low_priority)))
        continue
      pid = int(data.split()[0])
      self.standby.append(Standby(forking.Forked(pid, stdin=os.fdopen(sock.detach(), "wb"))))
      logging.info("agent %s: spare standby %d forked from an imported standby", self.host, pid)

  def _reap_orphans(self, now: float) -> None:
    """As a subreaper, collects the orphans it adopted once they exit (at most once a second)."""
    if self.subreaper and now - self._reaped_at >= 1.0:
      self._reaped_at = now
      forking.reap_orphans({w.proc.pid for w in self.workers}
                           | {s.proc.pid for s in self.standby})

  @staticmethod
  def _tell(standby: Standby, message: dict, *, close: bool) -> bool:
    """Writes one line to a standby's stdin; False if it is gone."""
    try:
      standby.proc.stdin.write((json.dumps(message) + "\n").encode())
      standby.proc.stdin.flush()
      if close:
        standby.proc.stdin.close()
      return True
    except (BrokenPipeError, OSError, ValueError):
      return False

  def _take_standby(self, spec: dict) -> tuple[Standby | None, str]:
    """The standby for one worker of `spec` and the recovery path it makes: one prepared for
    this generation's shape ('warm_standby'), else an unprepared one ('standby'), else none
    ('relaunch'). Standbys prepared for another shape cannot serve it and are replaced."""
    key = self._warm_key(spec)
    alive = [s for s in self.standby if s.proc.poll() is None]
    if spec["devices_per_worker"] != self.f.devices_per_worker:
      alive = []   # they were started with another device count
    single = spec["num_processes"] == 1   # a group is handed over whole (`_group_for`)
    for path, pick in (("warm_standby",
                        lambda s: single and key is not None and s.prepared_for == key),
                       ("standby", lambda s: s.prepared_for is None)):
      for s in alive:
        if pick(s):
          self.standby.remove(s)
          return s, path
    return None, "relaunch"

  def _start(self, spec: dict) -> None:
    self.generation = spec["generation"]
    self.groups_tried = 0
    host_index = spec["hosts"].index(self.host)
    os.makedirs(self.run_paths.logs, exist_ok=True)
    group = self._group_for(spec)
    if group is None:
      self._drop_group()
    paths_taken = []
    for local in range(spec["workers_per_host"]):
      pid = host_index * spec["workers_per_host"] + local
      if group is not None:
        standby, path = group[local], "warm_standby"
        self.standby.remove(standby)
      else:
        standby, path = self._take_standby(spec)
      proc = None
      if standby is not None:
        assignment = {"generation": self.generation, "process_id": pid, "host_name": self.host,
                      "coordinator": self.client.address, "assigned_at": time.time(),
                      "path": path, "nice": os.getpriority(os.PRIO_PROCESS, 0)}
        if self._tell(standby, assignment, close=True):
          proc = standby.proc
        else:
          standby.proc.kill()
          path = "relaunch"
      if proc is None:
        env = self._env(spec["devices_per_worker"])
        env[phases_lib.ASSIGNED_AT_ENV] = repr(time.time())
        proc = popen(["--role=worker", f"--workdir={self.workdir}",
                      f"--generation={self.generation}", f"--process_id={pid}",
                      f"--host_name={self.host}", f"--coordinator={self.client.address}"],
                     log=self.run_paths.worker_output(self.generation, pid), env=env)
      paths_taken.append(path)
      self.workers.append(Worker(pid, proc))
    if group is not None:
      self.group_port = None   # its service is the generation's now
    # Standbys prepared for another shape will not serve the next generation either.
    for s in [s for s in self.standby if s.prepared_for is not None
              and s.prepared_for != self._warm_key(spec)]:
      s.proc.kill()
      self.standby.remove(s)
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
    # The spares for the first restart are made while the run starts, not later while training
    # takes every core; they are not prepared ahead until the run has restarted. Each standby
    # forks one once it has imported (no import of their own; we adopt them, as a subreaper);
    # where that cannot be, they import now, at low priority, beside the start (its standbys'
    # imports, the coordinator, the data: single threads that leave a core idle).
    spares = self.f.standby_workers and self._spare_waits(generation=0)
    self.subreaper = spares and forking.become_subreaper()
    self._replenish(fork_spares=self.subreaper)
    if spares and not self.subreaper:
      self.standby += [Standby(self._popen_standby(low_priority=self.low_priority))
                       for _ in range(self.f.workers_per_host)]
    try:
      return self._loop()
    finally:
      for s in self.standby:
        s.proc.kill()

  def _loop(self) -> int:
    unreachable_since, reached = None, False
    while True:
      now = time.time()
      self._adopt_spares()
      self._reap_orphans(now)
      self._reap()
      try:
        if not self.registered:
          self._register()
        reply = self.client.call("AgentHeartbeat", {
            "host": self.host, "agent_id": self.agent_id, "generation": self.generation,
            "free_port": self._free_port(), "workers": self._worker_status()})
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
          self._replenish(reply["spec"])
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
                      fds=self.pending_spares)

  def _forget_workers(self) -> None:
    """The generation's workers have all exited and are dropped."""
    self.workers, self.stopping_since = [], 0.0
