"""Processes made by os.fork instead of a new Python: the local launcher's agents and the spare
standbys that a standby forks once it has imported everything (`medjax.fault.agent`).

A new Python process spends its first seconds importing (JAX and the trainer: ~1.5-2 s of a
core); a fork of a process that has imported them spends none, and shares their memory until
either writes to it. Forking is safe only where no other thread holds a lock the copy would
inherit held, so each caller checks (`single_threaded`) or knows which threads it has.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import psutil

from medjax import lifeline

_PR_SET_CHILD_SUBREAPER = 36

# A standby started with this variable (a socket's fd) forks a spare for its agent once it has
# imported (`medjax.fault.worker._fork_spare`, `medjax.fault.agent.Agent._adopt_spares`).
SPARE_FD_ENV = "MEDJAX_SPARE_FD"


def single_threaded() -> bool:
  """No other thread, Python's or a library's (numpy's OpenBLAS pool, gRPC's poller)."""
  try:
    return len(os.listdir("/proc/self/task")) == 1
  except OSError:
    return False   # not Linux: start processes anew


def become_subreaper() -> bool:
  """Makes this process the parent of its orphaned descendants (Linux 3.4+): a grandchild whose
  parent exits is reparented here, not to init. Returns whether it worked."""
  return lifeline.prctl(_PR_SET_CHILD_SUBREAPER, 1)


def children() -> list[int]:
  """This process's children (of every thread: /proc's per-thread lists, a few small reads)."""
  try:
    pids = []
    for tid in os.listdir("/proc/self/task"):
      with open(f"/proc/self/task/{tid}/children") as f:
        pids += [int(p) for p in f.read().split()]
    return pids
  except OSError:   # no per-thread child lists (CONFIG_PROC_CHILDREN): scan every process
    try:
      return [p.pid for p in psutil.Process().children()]
    except psutil.Error:
      return []


def reap_orphans(known: set[int]) -> None:
  """Collects the exit status of this (subreaper) process's children that are not in `known`
  (handles that read their own status: Popen, Forked) and have exited: the orphans it adopted,
  e.g. a dead worker's decoder child."""
  for pid in children():
    if pid not in known:
      try:
        os.waitpid(pid, os.WNOHANG)
      except ChildProcessError:
        pass


class Forked:
  """A child of this process that it did not start through subprocess (a fork, or an adopted
  orphan), with the part of subprocess.Popen's interface medjax uses: pid, poll, wait,
  send_signal, terminate, kill, returncode, and `stdin` (a binary file, or None)."""

  def __init__(self, pid: int, stdin=None):
    self.pid, self.stdin, self.returncode = pid, stdin, None

  def poll(self) -> int | None:
    if self.returncode is None:
      try:
        pid, status = os.waitpid(self.pid, os.WNOHANG)
      except ChildProcessError:   # not ours (any more): gone as far as we can tell
        self.returncode = -signal.SIGKILL
        return self.returncode
      if pid:
        self.returncode = os.waitstatus_to_exitcode(status)
    return self.returncode

  def wait(self, timeout: float | None = None) -> int:
    deadline = None if timeout is None else time.monotonic() + timeout
    while self.poll() is None:
      left = None if deadline is None else deadline - time.monotonic()
      if left is not None and left <= 0:
        raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
      lifeline.wait_any([self.pid], 0.05 if left is None else min(left, 0.05))   # wakes at its exit
    return self.returncode

  def send_signal(self, sig: int) -> None:
    if self.poll() is None:
      os.kill(self.pid, sig)

  def terminate(self) -> None:
    self.send_signal(signal.SIGTERM)

  def kill(self) -> None:
    self.send_signal(signal.SIGKILL)
