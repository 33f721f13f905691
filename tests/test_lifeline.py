"""medjax.lifeline: children die with their parent and take a low priority when asked, set up in
the child after exec (no preexec_fn in a threaded parent)."""

import os
import signal
import subprocess
import sys
import time

import psutil

from medjax import lifeline

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHILD = ("import os, time\nfrom medjax import lifeline\nlifeline.settle()\n"
         "print(os.getpid(), os.getpriority(os.PRIO_PROCESS, 0), os.sched_getscheduler(0), "
         "os.environ.get(lifeline.PARENT_ENV), flush=True)\ntime.sleep(60)\n")
# A parent that starts CHILD as medjax's agents do, prints its line, then waits.
PARENT = ("import subprocess, sys\nfrom medjax import lifeline\n"
          "low = sys.argv[1] == 'low'\n"
          "p = subprocess.Popen([sys.executable, '-c', sys.argv[2]], stdout=subprocess.PIPE,\n"
          "                     env=lifeline.child_env(low_priority=low), start_new_session=True)\n"
          "print(p.stdout.readline().decode().strip(), flush=True)\np.wait()\n")


def _start(priority: str) -> tuple[subprocess.Popen, list[str]]:
  parent = subprocess.Popen([sys.executable, "-c", PARENT, priority, CHILD], cwd=ROOT,
                            stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": ROOT})
  return parent, parent.stdout.readline().decode().split()


def test_a_child_dies_with_its_parent_and_keeps_nothing_for_its_own_children():
  parent, (pid, nice, policy, inherited) = _start("normal")
  child = psutil.Process(int(pid))
  assert inherited == "None"   # taken out of its environment: its children get their own
  assert child.ppid() == parent.pid and os.getsid(child.pid) != os.getsid(0)
  assert int(policy) == os.SCHED_OTHER
  parent.send_signal(signal.SIGKILL)
  parent.wait()
  child.wait(timeout=10)   # raises psutil.TimeoutExpired if it outlived its parent


def test_a_spare_starts_at_the_lowest_priority():
  parent, (pid, nice, policy, _) = _start("low")
  try:
    assert int(nice) == 19 and int(policy) == os.SCHED_IDLE
  finally:
    parent.kill()
    parent.wait()
    psutil.Process(int(pid)).wait(timeout=10)


def test_a_child_whose_parent_is_already_gone_exits():
  env = {**os.environ, "PYTHONPATH": ROOT, lifeline.PARENT_ENV: "1"}   # not its parent
  t0 = time.monotonic()
  code = subprocess.run([sys.executable, "-c", CHILD], env=env, cwd=ROOT, timeout=30,
                        stdout=subprocess.PIPE).returncode
  assert code == 0 and time.monotonic() - t0 < 20


def test_wait_any_returns_when_a_child_exits_or_an_fd_is_readable_else_after_the_timeout():
  fds = len(os.listdir("/proc/self/fd"))
  child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
  t0 = time.monotonic()
  lifeline.wait_any([child.pid], 20.0)
  assert time.monotonic() - t0 < 10.0 and child.poll() == 0
  t0 = time.monotonic()
  lifeline.wait_any([child.pid], 0.2)   # reaped: no pidfd, nothing watched, the whole timeout
  assert time.monotonic() - t0 >= 0.19
  read, write = os.pipe()
  os.write(write, b"x")
  t0 = time.monotonic()
  lifeline.wait_any([], 20.0, fds=[read])
  assert time.monotonic() - t0 < 10.0
  os.close(read)
  os.close(write)
  assert len(os.listdir("/proc/self/fd")) == fds   # its pidfds are closed
