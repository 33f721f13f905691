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
from medjax.data import pipeline
from medjax.fault import agent as agent_lib
from medjax.fault import protocol


class RunFailed(RuntimeError):
  """The coordinator gave up; the message is its error."""


def _spawn(args: list[str], log_path: str) -> subprocess.Popen:
  log = open(log_path, "a")
  return subprocess.Popen([sys.executable, agent_lib.LAUNCH, *args], stdout=log,
                          stderr=subprocess.STDOUT, start_new_session=True)


def start_coordinator(workdir: str, port: int) -> subprocess.Popen:
  return _spawn(["--role=coordinator", f"--workdir={workdir}", f"--port={port}"],
                os.path.join(workdir, "logs", "coordinator.log"))


def start_agent(workdir: str, port: int, host: str) -> subprocess.Popen:
  return _spawn(["--role=agent", f"--workdir={workdir}", f"--coordinator=127.0.0.1:{port}",
                 f"--host_name={host}"], os.path.join(workdir, "logs", f"agent-{host}.log"))


def run(config, workdir: str) -> dict:
  """Runs the whole job locally; returns summary.json's contents."""
  os.makedirs(os.path.join(workdir, "logs"), exist_ok=True)
  root = pipeline.cohort_root(config, workdir)
  pipeline.ingested(config, workdir, root)
  protocol.create_token_file(config.fault.token_file or os.path.join(workdir, "secrets", "token"))
  port = config.fault.port or protocol.free_port()
  coordinator = start_coordinator(workdir, port)
  agents = {f"host-{i}": start_agent(workdir, port, f"host-{i}")
            for i in range(config.fault.local_hosts)}
  logging.info("local: coordinator on 127.0.0.1:%d (pid %d), agents %s; logs in %s/logs", port,
               coordinator.pid, {h: a.pid for h, a in agents.items()}, workdir)
  restarts = 0
  try:
    while True:
      code = coordinator.poll()
      if code == 0:
        break
      if code == 2:
        raise RunFailed(_error(workdir))
      if code is not None:
        restarts += 1
        logging.warning("local: the coordinator exited with %s; restarting it (restart %d)", code,
                        restarts)
        coordinator = start_coordinator(workdir, port)
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
  with open(os.path.join(workdir, "summary.json")) as f:
    return json.load(f)


def _error(workdir: str) -> str:
  for event in reversed(jsonl.read(os.path.join(workdir, "events.jsonl"))):
    if event["event"] == "gave_up":
      return event["error"]
  return f"the coordinator gave up; see {workdir}/events.jsonl and {workdir}/logs"
