"""medjax started as a child process: the local launcher's coordinator and agents, an agent's
workers and standbys. It runs the medjax its parent runs (`lifeline.child_env`), in a session
of its own, and dies with its parent."""

from __future__ import annotations

import subprocess
import sys

from medjax import lifeline

# The command a child runs: this medjax's (`lifeline.child_env` points the child at it).
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
