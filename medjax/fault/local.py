"""Everything on this machine: the coordinator and fault.local_hosts agents as real processes.

This is what `python launch.py --config configs/quickstart.py` runs. The launcher prepares the
data once, starts the coordinator and the agents (which start the workers), restarts the
coordinator if it dies (same port, so agents and workers find it again), and returns when the
coordinator says the run is over. A coordinator that keeps dying without the run committing a
step in between (a crash loop) is restarted fault.max_coordinator_restarts times, then the
launcher stops everything with the coordinator's last error. Every child dies with its parent
(`spawn.popen`), so a launcher that stops, however it stops, leaves no process behind.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import time

from medjax import errors
from medjax import jsonl
from medjax import lifeline
from medjax import paths
from medjax import runlog
from medjax.fault import agent as agent_lib
from medjax.fault import forking
from medjax.fault import layout as layout_lib
from medjax.fault import protocol
from medjax.fault import spawn


class RunFailed(RuntimeError):
  """The coordinator gave up; the message is its error."""


def start_coordinator(run_paths: paths.RunPaths, port: int) -> subprocess.Popen:
  # The launcher has ingested the data: the coordinator does not load it again (on 2 cores its
  # start shares the CPU with the spare standby's import, which the first step waits for).
  return spawn.popen(["--role=coordinator", f"--workdir={run_paths.workdir}",
                      f"--port={port}", "--ingested"],
                     log=run_paths.process_log("coordinator"))


def start_agent(run_paths: paths.RunPaths, port: int, host: str, *, fork: bool = False):
  """`host`'s agent: a new `medjax --role=agent` process, or with `fork`, where this process
  is still single-threaded, a fork of it (`fork_agent`)."""
  if fork and forking.single_threaded():
    agent = fork_agent(run_paths, port, host)
    logging.info("local: agent %s forked from the launcher (pid %d)", host, agent.pid)
    return agent
  return spawn.popen(["--role=agent", f"--workdir={run_paths.workdir}",
                      f"--coordinator=127.0.0.1:{port}", f"--host_name={host}"],
                     log=run_paths.process_log(f"agent-{host}"))


def fork_agent(run_paths: paths.RunPaths, port: int, host: str) -> forking.Forked:
  """`host`'s agent as a fork of this (single-threaded) launcher: it starts its standby workers
  ~0.4 s sooner than a new process that has to start Python and import the flags, the config
  and the agent first (on 2 cores, where the standby's import is the longest part of a run's
  start). It is the agent `medjax --role=agent` runs, in its own session, logging to its
  own file, and it dies with the launcher; `ps -o comm` names it medjax-agent."""
  log = run_paths.process_log(f"agent-{host}")
  parent = os.getpid()
  for handler in logging.getLogger().handlers:
    handler.flush()
  sys.stdout.flush()
  sys.stderr.flush()
  pid = os.fork()
  if pid:
    return forking.Forked(pid)
  code = 1
  try:
    os.setsid()
    lifeline.die_with(parent)
    lifeline.name_process("medjax-agent")
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    runlog.setup(run_paths.workdir, f"agent-{host}")
    code = agent_lib.main(paths.load_config(run_paths.workdir), run_paths.workdir, host=host,
                          coordinator=f"127.0.0.1:{port}")
  except errors.InputError as e:
    logging.error("%s", e)
    errors.print_error(str(e))
    code = errors.EXIT_INPUT
  except BaseException:  # pylint: disable=broad-except  # the fork must not return to the launcher
    logging.exception("agent %s failed", host)
  finally:
    lifeline.leave(code)


def run(config, workdir: str) -> dict:
  """Runs the whole job locally; returns summary.json's contents."""
  run_paths = paths.RunPaths(workdir, config)
  os.makedirs(run_paths.logs, exist_ok=True)
  # The process layout for this machine ("auto" by default), saved where the coordinator, the
  # agents and the workers read the config.
  chosen = layout_lib.resolve_config(config)
  layout_lib.resolve_replicas(config, chosen)
  with open(run_paths.config_json, "w") as f:
    f.write(config.to_json_best_effort(indent=2, sort_keys=True))
  logging.info("local: %d worker process(es) per host x %d device(s) (%s)",
               chosen.workers_per_host, chosen.devices_per_worker, chosen.reason)
  protocol.create_token_file(run_paths.token)
  port = config.fault.port or protocol.free_port()
  agents, coordinator = {}, None
  # The agents start their standby workers at once, and a standby's import of JAX and the
  # trainer is the longest part of a start: where the ingest is there to reuse (a second run,
  # a restarted one), they start first and import while this process loads the ingest and the
  # coordinator starts. A new ingest (minutes, and it may stop at bad input) comes first.
  reuse = os.path.exists(run_paths.ingest_summary) and not config.data.reingest
  try:
    if reuse:
      agents = _start_agents(config, run_paths, port, fork=True)
    from medjax.data import pipeline  # pylint: disable=import-outside-toplevel  (0.4 s)
    pipeline.ingested(config, workdir, pipeline.cohort_root(config, workdir))
    coordinator = start_coordinator(run_paths, port)
    agents = agents or _start_agents(config, run_paths, port)
    logging.info("local: coordinator on 127.0.0.1:%d (pid %d), agents %s; logs in %s", port,
                 coordinator.pid, {h: a.pid for h, a in agents.items()}, run_paths.logs)
    restarts, commits = 0, _commits(run_paths)
    spares = config.fault.local_spares
    while True:
      code = coordinator.poll()
      if code == 0:
        break
      if spares:
        spares -= _replace_lost_agents(agents, run_paths, port, spares)
      if code == 2:
        raise RunFailed(_error(run_paths))
      if code is not None:
        now = _commits(run_paths)
        restarts = 1 if now > commits else restarts + 1
        commits = now
        limit = config.fault.max_coordinator_restarts
        if restarts > limit:
          raise RunFailed(
              f"the coordinator exited {restarts} times in a row without the run committing a "
              f"step (config.fault.max_coordinator_restarts={limit}); its last error: "
              f"{_last_error(run_paths.process_log('coordinator'))} (log: "
              f"{run_paths.process_log('coordinator')})")
        logging.warning("local: the coordinator exited with %s; restarting it (restart %d of at "
                        "most %d without progress)", code, restarts, limit)
        coordinator = start_coordinator(run_paths, port)
        continue
      lifeline.wait_any([coordinator.pid], 0.2)   # returns as soon as the coordinator exits
    for a in agents.values():
      try:
        a.wait(timeout=30)
      except subprocess.TimeoutExpired:
        a.kill()
  finally:
    _stop([p for p in (coordinator, *agents.values()) if p is not None])
  with open(run_paths.summary) as f:
    return json.load(f)


def _start_agents(config, run_paths: paths.RunPaths, port: int, *, fork: bool = False) -> dict:
  return {f"host-{i}": start_agent(run_paths, port, f"host-{i}", fork=fork)
          for i in range(config.fault.local_hosts)}


def _stop(procs: list[subprocess.Popen], grace_s: float = 5.0) -> None:
  """SIGTERM (agents stop their workers), then SIGKILL; their children die with them."""
  for p in procs:
    if p.poll() is None:
      p.terminate()
  deadline = time.monotonic() + grace_s
  for p in procs:
    try:
      p.wait(timeout=max(deadline - time.monotonic(), 0.01))
    except subprocess.TimeoutExpired:
      p.kill()
      p.wait()


def _replace_lost_agents(agents: dict, run_paths: paths.RunPaths, port: int, spares: int) -> int:
  """Starts a spare agent under the name of each dead agent whose host the coordinator declared
  lost (as a cluster's spare machine takes a lost one's place); returns how many it started."""
  lost = [e.get("host") for e in jsonl.read(run_paths.events)
          if (e.get("event") == "failure" and e.get("kind") == "host_lost")
          or (e.get("event") == "failure_reclassified" and e.get("kind") == "host_lost")]
  started = 0
  for host, proc in agents.items():
    if started < spares and proc.poll() is not None and host in lost:
      logging.warning("local: host %s was lost; a spare agent takes its place (%d spare(s) "
                      "left)", host, spares - started - 1)
      agents[host] = start_agent(run_paths, port, host)
      started += 1
  return started


def _commits(run_paths: paths.RunPaths) -> int:
  """Commits the coordinators of this run have written so far (its progress)."""
  return sum(1 for e in jsonl.read(run_paths.events) if e.get("event") == "commit")


def _last_error(log_path: str) -> str:
  """The last exception line (`SomeError: ...`) in a process log, else its last line."""
  try:
    with open(log_path, errors="replace") as f:
      lines = [line.strip() for line in f.readlines()[-400:] if line.strip()]
  except OSError:
    return "no log"
  for line in reversed(lines):
    if line.startswith("error: "):   # the command's own one-line error
      return line[len("error: "):][:300]
    if re.match(r"^[\w.]+(Error|Exception|Interrupt|Exit)\b", line):
      return line[:300]
  return lines[-1][:300] if lines else "no output"


def _error(run_paths: paths.RunPaths) -> str:
  for event in reversed(jsonl.read(run_paths.events)):
    if event["event"] == "gave_up":
      return event["error"]
  # It stopped before serving (bad input it found itself): its own error line.
  return _last_error(run_paths.process_log("coordinator"))
