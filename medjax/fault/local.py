"""Everything on this machine: the coordinator and fault.local_hosts agents as real processes.

This is what `python launch.py --config configs/quickstart.py` runs. The launcher prepares the
data once, starts the coordinator and the agents (which start the workers), restarts the
coordinator if it dies (same port, so agents and workers find it again), and returns when the
coordinator says the run is over.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time

from medjax import jsonl
from medjax import paths
from medjax.data import pipeline
from medjax.fault import agent as agent_lib
from medjax.fault import protocol


class RunFailed(RuntimeError):
  """The coordinator gave up; the message is its error."""


def _spawn(args: list[str], log_path: str) -> subprocess.Popen:
  with open(log_path, "a") as log:
    # The child has its own copy of the descriptor; ours closes here.
    return subprocess.Popen([sys.executable, agent_lib.LAUNCH, *args], stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)


def start_coordinator(run_paths: paths.RunPaths, port: int) -> subprocess.Popen:
  return _spawn(["--role=coordinator", f"--workdir={run_paths.workdir}", f"--port={port}"],
                run_paths.process_log("coordinator"))


def start_agent(run_paths: paths.RunPaths, port: int, host: str) -> subprocess.Popen:
  return _spawn(["--role=agent", f"--workdir={run_paths.workdir}",
                 f"--coordinator=127.0.0.1:{port}", f"--host_name={host}"],
                run_paths.process_log(f"agent-{host}"))


def run(config, workdir: str) -> dict:
  """Runs the whole job locally; returns summary.json's contents."""
  run_paths = paths.RunPaths(workdir, config)
  os.makedirs(run_paths.logs, exist_ok=True)
  root = pipeline.cohort_root(config, workdir)
  pipeline.ingested(config, workdir, root)
  protocol.create_token_file(run_paths.token)
  port = config.fault.port or protocol.free_port()
  coordinator = start_coordinator(run_paths, port)
  agents = {f"host-{i}": start_agent(run_paths, port, f"host-{i}")
            for i in range(config.fault.local_hosts)}
  logging.info("local: coordinator on 127.0.0.1:%d (pid %d), agents %s; logs in %s", port,
               coordinator.pid, {h: a.pid for h, a in agents.items()}, run_paths.logs)
  restarts = 0
  try:
    while True:
      code = coordinator.poll()
      if code == 0:
        break
      if code == 2:
        raise RunFailed(_error(run_paths))
      if code is not None:
        restarts += 1
        logging.warning("local: the coordinator exited with %s; restarting it (restart %d)", code,
                        restarts)
        coordinator = start_coordinator(run_paths, port)
      time.sleep(0.2)
    for a in agents.values():
      try:
        a.wait(timeout=30)
      except subprocess.TimeoutExpired:
        a.kill()
  finally:
    for p in [coordinator, *agents.values()]:
      if p.poll() is None:
        p.kill()
  with open(run_paths.summary) as f:
    return json.load(f)


def _error(run_paths: paths.RunPaths) -> str:
  for event in reversed(jsonl.read(run_paths.events)):
    if event["event"] == "gave_up":
      return event["error"]
  return f"the coordinator gave up; see {run_paths.events} and {run_paths.logs}"
