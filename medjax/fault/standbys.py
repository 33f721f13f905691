"""An agent's standby workers: processes that have imported everything and wait for an assignment
on stdin, so that a new generation's workers need not start Python and import JAX (seconds).

The agent keeps `fault.workers_per_host` of them (`replenish`); a generation takes them (`take`,
or a prepared group whole: `group_for`). Where the generation runs on one host, they are told to
prepare for the next generation of the same shape (`warm_key`): data, model, state and compiled
step built ahead, so that a restart only restores and goes on. Several processes prepare as a
group that joins jax.distributed at a port of this host (`free_port` offers it to the
coordinator). Standbys started while a generation trains run at the lowest CPU priority where it
can be given back (`priority_restorable`); one imported standby forks a spare instead of a second
import where the agent is a subreaper (`adopt_spares`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
import subprocess
import threading
from typing import Callable

from medjax import paths
from medjax.fault import forking
from medjax.fault import layout as layout_lib
from medjax.fault import protocol
from medjax.fault import spawn


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


class Standbys:
  """One host's standby workers (`pool`), and the group a set of them joined.

  Args:
    host: this host's name.
    workdir: the run directory.
    fault_config: config.fault, resolved for this machine.
    platform: what the workers compute on ('cpu', 'gpu', 'tpu').
    advertise: this host's address as the other hosts reach it (a group's jax.distributed).
    env: `env(devices, beside=...)`, a worker's environment (`Agent._env`).
  """

  # Groups tried per generation: a group whose member cannot join or prepare is not retried
  # without end (its standbys stay unprepared).
  MAX_GROUPS = 2

  def __init__(self, *, host: str, workdir: str, fault_config, platform: str, advertise: str,
               env: Callable[..., dict]):
    self.host, self.workdir, self.f, self.platform = host, workdir, fault_config, platform
    self.advertise, self.env = advertise, env
    self.run_paths = paths.RunPaths(workdir)
    self.pool: list[Standby] = []
    # The port of the jax.distributed service a group of standbys joined (its process 0 holds
    # it), offered to the coordinator as this host's free port; groups tried this generation.
    self.group_port: int | None = None
    self.groups_tried = 0
    self.low_priority = priority_restorable()
    # Our ends of the socket pairs of standbys that will fork a spare once imported, until the
    # spare writes its pid (`adopt_spares`).
    self.pending_spares: list[socket.socket] = []
    # A config.json from before the field existed means what the default means.
    self.warm_when = fault_config.get("warm_standby", "after_failure")

  def warm_key(self, spec: dict) -> str | None:
    return warm_key(spec, self.host, self.platform, self.warm_when)

  def spare_waits(self, generation: int) -> bool:
    """True while a CPU host starts no spare standby during training and prepares none
    (fault.warm_standby 'after_failure', until the run restarts): on CPU that work takes the
    cores training uses, which a run that never fails pays for nothing. The spare for the first
    restart imports while the run starts (`run`); from the first restart on, a spare is
    started and prepared ahead during training."""
    return (self.platform == "cpu" and generation <= 1
            and self.warm_when == "after_failure")

  def _can_prepare(self, standby: Standby) -> bool:
    """Unprepared, running, and (on a GPU) started to fit beside a running worker."""
    return (standby.prepared_for is None and standby.proc.poll() is None
            and (standby.beside or self.platform != "gpu"))

  def replenish(self, spec: dict | None = None, *, fork_spares: bool = False) -> None:
    """Starts standby workers until `workers_per_host` are ready (or getting ready); with the
    running generation's `spec`, at low priority, and tells them to prepare for the next
    generation of its shape when they can (`warm_key`). With `fork_spares`, each new standby
    forks a spare once it has imported (`_adopt_spares`)."""
    if not self.f.standby_workers:
      return
    if spec is not None and self.spare_waits(spec["generation"]):
      return
    self.pool = [s for s in self.pool if s.proc.poll() is None]
    key = self.warm_key(spec) if spec is not None else None
    if any(s.prepared_for != key for s in self.group_members()):
      self.drop_group()
    for s in [s for s in self.pool if s.prepared_for not in (None, key)]:
      s.proc.kill()   # prepared for a generation that will not come (the host set changed)
      self.pool.remove(s)
    os.makedirs(self.run_paths.logs, exist_ok=True)
    wanted = spec["workers_per_host"] if spec is not None else self.f.workers_per_host
    while len(self.pool) < wanted:
      beside = spec is not None
      self.pool.append(Standby(self.popen_standby(
          low_priority=beside and self.low_priority, beside=beside, fork_spare=fork_spares),
          beside=beside))
    if key is None:
      return
    expected = {"hosts": spec["hosts"], "host_history": spec["host_history"], "host": self.host}
    if spec["num_processes"] > 1:
      self._prepare_group(key, expected, spec["num_processes"])
      return
    for s in self.pool:
      if self._can_prepare(s) and self.tell(s, {"prepare": expected}, close=False):
        s.prepared_for = key

  def _prepare_group(self, key: str, expected: dict, n: int) -> None:
    """Tells `n` unprepared standbys to join jax.distributed at a port of this host as
    processes 0..n-1 of the next generation and to prepare for it. A group with a member gone
    is of no use (its service, or a peer, is missing): it is replaced."""
    members = self.group_members()
    if members and (len(members) < n or any(s.proc.poll() is not None for s in members)):
      logging.warning("agent %s: a standby of the prepared group exited; replacing the group",
                      self.host)
      self.drop_group()
      return
    if members or self.groups_tried >= self.MAX_GROUPS:
      return
    bare = [s for s in self.pool if self._can_prepare(s)]
    if len(bare) < n:
      return
    self.groups_tried += 1
    port = protocol.free_port()
    address = f"{self.advertise}:{port}"
    for i, s in enumerate(bare[:n]):
      s.prepared_for, s.process_id = key, i
      job = {"prepare": expected,
             "distributed": {"address": address, "num_processes": n, "process_id": i}}
      if not self.tell(s, job, close=False):
        self.drop_group()
        return
    self.group_port = port
    logging.info("agent %s: %d standbys join jax.distributed at %s and prepare for the next "
                 "generation", self.host, n, address)

  def group_members(self) -> list[Standby]:
    """The standbys that joined the prepared group, by process id."""
    return sorted((s for s in self.pool if s.process_id is not None),
                  key=lambda s: s.process_id)

  def drop_group(self) -> None:
    """Ends the standbys that joined a group, and waits for them: the group's process 0 holds
    the port offered to the coordinator, which the next generation's process 0 may need."""
    members = self.group_members()
    for s in members:
      s.proc.kill()
    for s in members:
      try:
        s.proc.wait(timeout=5)
      except subprocess.TimeoutExpired:
        logging.warning("agent %s: standby %d did not exit after SIGKILL", self.host, s.proc.pid)
      self.pool.remove(s)
    self.group_port = None

  def free_port(self) -> int:
    """The port this host offers for the next generation's jax.distributed service: the one a
    prepared group joined, else any free one."""
    if self.group_port is not None and any(s.process_id == 0 and s.proc.poll() is None
                                           for s in self.group_members()):
      return self.group_port
    return protocol.free_port()

  def group_for(self, spec: dict) -> list[Standby] | None:
    """The prepared group that can be `spec`'s processes 0..n-1, in order, or None."""
    n = spec["num_processes"]
    key = self.warm_key(spec)
    members = self.group_members()
    if (n == 1 or key is None or self.group_port is None
        or spec["jax_address"] != f"{self.advertise}:{self.group_port}"
        or [s.process_id for s in members] != list(range(n))
        or any(s.prepared_for != key or s.proc.poll() is not None for s in members)):
      return None
    return members

  def popen_standby(self, *, low_priority: bool, beside: bool = False,
                    fork_spare: bool = False) -> subprocess.Popen:
    env = self.env(self.f.devices_per_worker, beside=beside)
    ours = theirs = None
    if fork_spare:
      ours, theirs = socket.socketpair()
      env[forking.SPARE_FD_ENV] = str(theirs.fileno())
    try:
      proc = spawn.popen(["--role=worker", "--standby", f"--workdir={self.workdir}"],
                         log=self.run_paths.process_log(f"standby-{self.host}"), env=env,
                         stdin=subprocess.PIPE, low_priority=low_priority,
                         pass_fds=(theirs.fileno(),) if theirs else ())
    finally:
      if theirs is not None:
        theirs.close()
    if ours is not None:
      self.pending_spares.append(ours)
    return proc

  def adopt_spares(self) -> None:
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
        self.pool.append(Standby(self.popen_standby(low_priority=self.low_priority)))
        continue
      pid = int(data.split()[0])
      self.pool.append(Standby(forking.Forked(pid, stdin=os.fdopen(sock.detach(), "wb"))))
      logging.info("agent %s: spare standby %d forked from an imported standby", self.host, pid)

  @staticmethod
  def tell(standby: Standby, message: dict, *, close: bool) -> bool:
    """Writes one line to a standby's stdin; False if it is gone."""
    try:
      standby.proc.stdin.write((json.dumps(message) + "\n").encode())
      standby.proc.stdin.flush()
      if close:
        standby.proc.stdin.close()
      return True
    except (BrokenPipeError, OSError, ValueError):
      return False

  def take(self, spec: dict) -> tuple[Standby | None, str]:
    """The standby for one worker of `spec` and the recovery path it makes: one prepared for
    this generation's shape ('warm_standby'), else an unprepared one ('standby'), else none
    ('relaunch'). Standbys prepared for another shape cannot serve it and are replaced."""
    key = self.warm_key(spec)
    alive = [s for s in self.pool if s.proc.poll() is None]
    if spec["devices_per_worker"] != self.f.devices_per_worker:
      alive = []   # they were started with another device count
    single = spec["num_processes"] == 1   # a group is handed over whole (`_group_for`)
    for path, pick in (("warm_standby",
                        lambda s: single and key is not None and s.prepared_for == key),
                       ("standby", lambda s: s.prepared_for is None)):
      for s in alive:
        if pick(s):
          self.pool.remove(s)
          return s, path
    return None, "relaunch"
