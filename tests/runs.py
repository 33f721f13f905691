"""Running launch.py for real in tests: subprocesses, workdirs, events, ledgers, snapshots."""

import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from medjax import jsonl
from medjax.checkpoint import snapshots
from medjax.fault import agent

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCH = os.path.join(ROOT, "launch.py")
TINY = "configs/quickstart.py:tiny"
_tiny_cohort: list[str] = []   # the session's generated tiny cohort, made on first use


def env() -> dict:
  e = dict(os.environ)
  # Workers get their device count from their agent; the test process's 8 fake devices stay here
  # (its other flags, conftest.py's optimisation level, go on).
  e["XLA_FLAGS"] = agent.without_device_count(e.get("XLA_FLAGS", ""))
  e["JAX_PLATFORMS"] = "cpu"
  return e


def start(workdir: str, *overrides: str, config: str = TINY, extra_env: dict | None = None):
  """Starts `launch.py` (the local role) in the background; stdout/stderr to workdir/launcher.log.
  `extra_env`: variables set in its environment beside `env()`'s."""
  os.makedirs(workdir, exist_ok=True)
  if config == TINY:
    _seed_tiny_cohort(workdir)
  log = open(os.path.join(workdir, "launcher.log"), "w")
  return subprocess.Popen([sys.executable, LAUNCH, f"--config={config}", f"--workdir={workdir}",
                           *overrides], cwd=ROOT, env={**env(), **(extra_env or {})}, stdout=log,
                          stderr=subprocess.STDOUT, start_new_session=True)


def _seed_tiny_cohort(workdir: str) -> None:
  """A new workdir of the tiny config gets a copy of the session's generated cohort: its marker
  matches, so the run reuses it instead of generating the same 300 patients again (2.4 s a run).
  A run whose overrides change data.synthetic finds another marker there and generates its own,
  as a user's would."""
  target = os.path.join(workdir, "cohort")
  if os.path.exists(target):
    return
  if not _tiny_cohort:
    # pylint: disable-next=import-outside-toplevel  (the launcher's imports, once a run starts)
    from configs import quickstart
    from medjax.data import pipeline  # pylint: disable=import-outside-toplevel
    base = tempfile.mkdtemp(prefix="medjax-tests-cohort-")
    atexit.register(shutil.rmtree, base, ignore_errors=True)
    _tiny_cohort.append(pipeline.cohort_root(quickstart.get_config("tiny"), base))
  shutil.copytree(_tiny_cohort[0], target)


def run(workdir: str, *overrides: str, timeout: float = 600, **kw) -> int:
  proc = start(workdir, *overrides, **kw)
  try:
    return proc.wait(timeout=timeout)
  except subprocess.TimeoutExpired:
    os.killpg(proc.pid, signal.SIGKILL)
    raise AssertionError(f"launch.py did not finish in {timeout}s; see {workdir}/launcher.log, "
                         f"{workdir}/logs") from None


def events(workdir: str) -> list[dict]:
  return jsonl.read(os.path.join(workdir, "events.jsonl"))


def wait_for(predicate, timeout: float, what: str, poll: float = 0.2):
  deadline = time.time() + timeout
  while time.time() < deadline:
    value = predicate()
    if value:
      return value
    time.sleep(poll)
  raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def summary(workdir: str) -> dict:
  with open(os.path.join(workdir, "summary.json")) as f:
    return json.load(f)


def tail(workdir: str, name: str = "launcher.log", n: int = 40) -> str:
  path = os.path.join(workdir, name)
  if not os.path.exists(path):
    return ""
  with open(path) as f:
    return "".join(f.readlines()[-n:])


def rewrite_snapshot_header(path: str, change) -> dict:
  """Rewrites a snapshot file's JSON header through `change(header)`, its vectors kept; returns
  the header written."""
  with open(path, "rb") as f:
    data = f.read()
  at = len(snapshots._MAGIC)  # pylint: disable=protected-access
  size = int.from_bytes(data[at:at + 8], "little")
  header = json.loads(data[at + 8:at + 8 + size])
  change(header)
  text = json.dumps(header).encode()
  with open(path, "wb") as f:
    f.write(data[:at] + len(text).to_bytes(8, "little") + text + data[at + 8 + size:])
  return header
