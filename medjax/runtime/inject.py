"""Fault injection from config: real signals and errors at a chosen step or partition.

config.fault.inject is a ';'-separated list of KIND@WHEN:process=P, e.g.
  "kill@step=30:process=1; sigstop@step=60:process=0; sigterm@partition=2:process=1"
Kinds: kill (SIGKILL itself), sigstop (SIGSTOP itself: a hang with no heartbeats), hang (the
training thread blocks forever while heartbeats go on: a live hang), oom (raises an out-of-memory
error), sigterm (SIGTERM itself: a preemption), host (SIGKILL its host's agent and every worker
of the host: a lost machine; supervised runs only), slow (from then on, every step the process
trains takes config.fault.slow_step_s longer: a straggler), pause (SIGSTOP itself, and a helper
process SIGCONTs it config.fault.pause_s later: a freeze shorter than hang detection). WHEN is
step=N (after global step N), partition=N (when partition N of an epoch starts) or epoch=N (when
epoch N starts). Each fault fires once per run: a marker in <workdir>/faults/ keeps a restarted
generation from firing it again, and records when it fired.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import threading
import time

import psutil

from medjax import errors
from medjax import paths

KINDS = ("kill", "sigstop", "hang", "oom", "sigterm", "host", "slow", "pause")


class InjectedOutOfMemory(MemoryError):
  """Raised by an injected 'oom' fault (stands in for XLA's RESOURCE_EXHAUSTED)."""


@dataclasses.dataclass(frozen=True)
class Fault:
  kind: str
  when: str    # 'step', 'partition' or 'epoch'
  at: int
  process: int
  index: int

  @property
  def name(self) -> str:
    return f"{self.index}-{self.kind}@{self.when}={self.at}:process={self.process}"


def parse(text: str) -> list[Fault]:
  faults = []
  for i, item in enumerate(x.strip() for x in text.split(";")):
    if not item:
      continue
    try:
      kind, rest = item.split("@", 1)
      when, proc = rest.split(":", 1)
      key, value = when.split("=")
      pkey, pvalue = proc.split("=")
      assert kind in KINDS and key in ("step", "partition", "epoch") and pkey == "process"
      faults.append(Fault(kind, key, int(value), int(pvalue), i))
    except (ValueError, AssertionError) as e:
      raise errors.InputError(
          f"config.fault.inject: cannot read {item!r}; write KIND@step=N:process=P, "
          f"KIND@partition=N:process=P or KIND@epoch=N:process=P with KIND in "
          f"{KINDS}") from e
  return faults


class Injector:
  """Fires this process's faults when training reaches them."""

  def __init__(self, text: str, process_id: int, workdir: str, host: str | None = None,
               slow_step_s: float = 0.0, pause_s: float = 0.0):
    self.faults = [f for f in parse(text) if f.process == process_id]
    self.host, self.slow_step_s, self.pause_s = host, slow_step_s, pause_s
    self.slowed = False   # a 'slow' fault fired in this generation
    self.dir = paths.RunPaths(workdir).faults
    os.makedirs(self.dir, exist_ok=True)

  def _fire(self, fault: Fault, global_step: int) -> None:
    marker = os.path.join(self.dir, fault.name)
    try:
      fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    except FileExistsError:
      return  # fired in an earlier generation
    with os.fdopen(fd, "w") as f:
      json.dump({"kind": fault.kind, "process": fault.process, "step": global_step,
                 "time": time.time(), "pid": os.getpid(),
                 **({"host": self.host} if fault.kind == "host" else {})}, f)
    if fault.kind == "kill":
      os.kill(os.getpid(), signal.SIGKILL)
    elif fault.kind == "sigstop":
      os.kill(os.getpid(), signal.SIGSTOP)
    elif fault.kind == "sigterm":
      os.kill(os.getpid(), signal.SIGTERM)
    elif fault.kind == "hang":
      threading.Event().wait()
    elif fault.kind == "host":
      _kill_host()
    elif fault.kind == "oom":
      raise InjectedOutOfMemory(f"RESOURCE_EXHAUSTED: injected out of memory at step {global_step}")
    elif fault.kind == "slow":
      self.slowed = True   # a replacement (a later generation) is not slow
    elif fault.kind == "pause":
      subprocess.Popen(["/bin/sh", "-c", f"sleep {self.pause_s}; kill -CONT {os.getpid()}"],
                       start_new_session=True)
      os.kill(os.getpid(), signal.SIGSTOP)

  def after_step(self, global_step: int, ready=None, trained: bool = True) -> None:
    """Fires the faults of `global_step`, after `ready()` (which waits for the step's result):
    steps are dispatched ahead of the computation, and a fault 'after step N' comes once step N
    is computed, not while it is still queued. A slowed process sleeps after each step it
    trained (`trained`: not one a late replica skipped)."""
    due = [f for f in self.faults if f.when == "step" and f.at == global_step]
    if due and ready is not None:
      ready()
    for f in due:
      self._fire(f, global_step)
    if self.slowed and trained:
      time.sleep(self.slow_step_s)

  def at_partition(self, partition: int, global_step: int, epoch: int = 0) -> None:
    for f in self.faults:
      if ((f.when == "partition" and f.at == partition)
          or (f.when == "epoch" and f.at == epoch and partition == 0)):
        self._fire(f, global_step)


def _kill_host() -> None:
  """SIGKILLs this worker's agent, the agent's other workers, then itself."""
  agent = psutil.Process(os.getppid())
  if "--role=agent" not in agent.cmdline():
    raise errors.InputError("config.fault.inject: a 'host' fault needs a supervised run (a worker "
                       "started by an agent); set config.fault.supervised=True")
  for proc in agent.children(recursive=True):
    if proc.pid != os.getpid():
      proc.kill()
  agent.kill()
  os.kill(os.getpid(), signal.SIGKILL)


def record_external(workdir: str, kind: str, *, process=None, host=None, pid=None) -> None:
  """Notes a fault delivered from outside (a test or an operator's kill), for detection times."""
  d = paths.RunPaths(workdir).faults
  os.makedirs(d, exist_ok=True)
  now = time.time()
  with open(os.path.join(d, f"external-{now:.6f}-{kind}"), "w") as f:
    json.dump({"kind": kind, "process": process, "host": host, "pid": pid, "time": now}, f)


def fired(workdir: str) -> list[dict]:
  """Every fault that fired, with when (for detection times in the summary)."""
  d = paths.RunPaths(workdir).faults
  out = []
  for name in sorted(os.listdir(d)) if os.path.isdir(d) else []:
    with open(os.path.join(d, name)) as f:
      try:
        out.append({"name": name, **json.load(f)})
      except json.JSONDecodeError:
        continue
  return sorted(out, key=lambda f: f.get("time", 0))
