"""Processes medjax starts die with the process that started them, set up in the child.

The parent names itself in the child's environment (`child_env`); the child, first thing after
exec (medjax.cli calls `settle` before anything else), asks Linux for SIGKILL when that parent
dies (PR_SET_PDEATHSIG) and exits at once if it already has; a child started as a spare takes
the lowest CPU priority there too (nice 19 and SCHED_IDLE, inherited by every thread it starts).

Not in a `preexec_fn`: that runs Python in the forked copy of a parent whose other threads (an
agent's gRPC event engine, a sweep's Optuna heartbeat) were not copied, which the Python docs warn
can deadlock; in the report's runs it aborted a spare standby in two of six supervised runs
(gRPC's poller: "epoll_wait error: Bad file descriptor", then "Fatal Python error: Aborted").
Popen's own `start_new_session` gives the child its session (a terminal's Ctrl-C reaches only
the launcher) without Python in between.
"""

from __future__ import annotations

import ctypes
import logging
import os
import select
import signal
import sys
import time
from typing import NoReturn

PARENT_ENV = "MEDJAX_PARENT_PID"
LOW_PRIORITY_ENV = "MEDJAX_LOW_PRIORITY"
_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15


def child_env(env: dict | None = None, *, low_priority: bool = False) -> dict:
  """`env` (default: ours) for a child that is to die with this process and run our code."""
  env = same_code(dict(os.environ if env is None else env))
  env[PARENT_ENV] = str(os.getpid())
  if low_priority:
    env[LOW_PRIORITY_ENV] = "1"
  else:
    env.pop(LOW_PRIORITY_ENV, None)
  return env


def same_code(env: dict) -> dict:
  """`env` with PYTHONPATH led by the directory this medjax was imported from, so that a child
  started as `python -m medjax...` runs the same code as its parent (a checkout run as
  `python launch.py`, an editable or a regular install), wherever it was started from."""
  package_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
  return env


def prctl(option: int, arg) -> bool:
  """Linux's prctl(option, arg); False where it failed or there is none (not Linux's libc)."""
  if not sys.platform.startswith("linux"):
    return False
  try:
    return ctypes.CDLL(None, use_errno=True).prctl(option, arg, 0, 0, 0) == 0
  except (OSError, AttributeError):
    return False


def die_with(parent: int) -> None:
  """SIGKILL this process when `parent` dies (Linux); exits now if it has died already. Without
  prctl, the parent's own clean-up is the only guard."""
  prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
  if os.getppid() != parent:
    os._exit(0)  # pylint: disable=protected-access  # the parent died before prctl took effect


def name_process(name: str) -> None:
  """Names this process for `ps -o comm`, top and psutil's name() (Linux; 15 bytes at most): a
  fork keeps its parent's command line."""
  prctl(_PR_SET_NAME, name.encode()[:15])


def wait_any(pids, timeout_s: float, fds=()) -> None:
  """Returns as soon as one of `pids` (this process's children, not yet reaped) has exited or
  one of `fds` is readable, at the latest after `timeout_s`: through pidfds (Linux 5.3+), where
  `Popen.wait(timeout)` checks every 50 ms. A pid without a pidfd (none here, or reaped
  already) is not watched: the caller's next pass sees its exit; with nothing to watch, a sleep.
  Opens and closes its pidfds on each call (a system call each; the callers wait 0.05-0.2 s)."""
  poller = select.poll()
  opened = []
  try:
    for pid in pids:
      try:
        fd = os.pidfd_open(pid)
      except (AttributeError, OSError):
        continue
      opened.append(fd)
      poller.register(fd, select.POLLIN)
    for fd in fds:
      poller.register(fd, select.POLLIN)
    if opened or fds:
      poller.poll(timeout_s * 1000)
    else:
      time.sleep(timeout_s)
  finally:
    for fd in opened:
      os.close(fd)


def settle() -> None:
  """What `child_env` asked for, taken out of the environment (our own children get theirs
  from us)."""
  parent = os.environ.pop(PARENT_ENV, None)
  if parent:
    die_with(int(parent))
  if os.environ.pop(LOW_PRIORITY_ENV, None):
    os.nice(19)
    try:
      # SCHED_IDLE: it runs only on a core nothing else wants (nice 19 alone still takes a share).
      os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (OSError, AttributeError):
      pass


def leave(code: int) -> NoReturn:
  """Exits with `code` without Python's teardown of JAX's, Orbax's and TensorStore's threads and
  objects (~0.8 s on 2 cores after a quickstart run): for a process that has written and closed
  everything (checkpoints, summary, plots, commits); its logs and output are flushed first."""
  for handler in logging.getLogger().handlers:
    handler.flush()
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(code)  # pylint: disable=protected-access
