"""A trial's medjax process, a child of the sweep: started, waited for, stopped, and its
failure in one line.

A child dies with the sweep process (Linux PR_SET_PDEATHSIG, `medjax.lifeline`), so a sweep
killed with SIGKILL leaves no trial training behind; the child's own children (coordinator,
agents, workers) die with it in turn. Each child has a session of its own: a terminal's Ctrl-C
reaches only the sweep, which stops the child as a terminal would (SIGINT), then kills it.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time

from medjax import lifeline

# A trial runs this medjax (`lifeline.child_env` points the child at it).
COMMAND = (sys.executable, "-m", "medjax")
STOP_GRACE_S = 30.0   # a stopped child's launcher stops its run within this, or is killed

@dataclasses.dataclass(frozen=True)
class Outcome:
  returncode: int | None   # None: stopped at its time limit
  reason: str              # '' when it exited 0; else why, in one line
  wall_s: float


def run(args: list[str], log_path: str, *, timeout_s: float = 0.0, on_start=None) -> Outcome:
  """Runs `medjax args` (stdout and stderr appended to `log_path`) to its end.

  Must be called from the main thread: the kernel's parent-death signal follows the thread that
  started the child. `on_start(pid)` is called once the child runs.
  """
  t0 = time.monotonic()
  with open(log_path, "ab") as log:
    proc = subprocess.Popen([*COMMAND, *args], stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, env=lifeline.child_env(),
                            start_new_session=True)
  if on_start is not None:
    on_start(proc.pid)
  try:
    rc = proc.wait(timeout=timeout_s or None)
  except subprocess.TimeoutExpired:
    stop(proc)
    return Outcome(None, f"stopped after config.trials.timeout_s={timeout_s:g} s",
                   time.monotonic() - t0)
  except BaseException:  # KeyboardInterrupt, or anything that ends the sweep: no orphan left
    stop(proc)
    raise
  wall = time.monotonic() - t0
  return Outcome(rc, "" if rc == 0 else describe_exit(rc, log_path), wall)


def stop(proc: subprocess.Popen) -> None:
  """SIGINT (the launcher stops its run), then SIGKILL after STOP_GRACE_S."""
  if proc.poll() is not None:
    return
  try:
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=STOP_GRACE_S)
  except subprocess.TimeoutExpired:
    proc.kill()  # its children die with it (PR_SET_PDEATHSIG)
    proc.wait()
  except ProcessLookupError:
    pass


def describe_exit(returncode: int, log_path: str) -> str:
  """Why the trial's process ended: its one-line error, or the signal that killed it."""
  if returncode < 0:
    name = signal.Signals(-returncode).name if -returncode in signal.valid_signals() else (
        f"signal {-returncode}")
    hint = " (out of memory? the kernel's OOM killer sends SIGKILL)" if (
        -returncode == signal.SIGKILL) else ""
    return f"killed by {name}{hint}"
  line = error_line(log_path)
  return f"exit {returncode}: {line}" if line else f"exit {returncode} (see {log_path})"


def error_line(log_path: str) -> str | None:
  """The last `error: ...` line the trial's process printed, without the prefix."""
  try:
    with open(log_path, "rb") as f:
      f.seek(0, os.SEEK_END)
      f.seek(max(0, f.tell() - 65536))
      lines = f.read().decode("utf-8", "replace").splitlines()
  except OSError:
    return None
  for line in reversed(lines):
    if line.startswith("error: "):
      return " ".join(line[len("error: "):].split())[:400]
  return None
