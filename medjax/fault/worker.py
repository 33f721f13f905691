"""A worker process: joins its generation's jax.distributed job (if it has several processes)
and trains.

Started by its host's agent with the generation number and its process id, or a standby handed
them on stdin; the generation's spec (hosts, host history, process count, the jax.distributed
address) is in <workdir>/generations/gen-<G>.json, the run's config in <workdir>/config.json.
A generation of one process needs no jax.distributed, so a standby can initialise JAX and build
everything before its generation exists (a warm standby): the restart then restores and goes on.
Each worker times its start-up phases and reports them once (`medjax.runtime.phases`).
"""

from __future__ import annotations

import gc
import json
import logging
import os
import queue
import sys
import threading
import time
from typing import NoReturn

import jax

from medjax import errors
from medjax import lifeline
from medjax import paths
from medjax import schema
from medjax.fault import forking
from medjax.fault import layout as layout_lib
from medjax.fault import protocol
from medjax.fault import run_state
from medjax.runtime import context
from medjax.runtime import inject
from medjax.runtime import phases as phases_lib


# What a standby brought to its assignment (`wait_for_assignment` -> `run`): the command line
# passes only the generation, process id, host and coordinator on.
_handover: dict = {}


def wait_for_assignment(workdir: str) -> dict | None:
  """A standby worker: imports the trainer, then waits for lines from its agent on stdin.

  A line {"prepare": {...}} (the agent sends it once its generation trains, when the next
  generation can be prepared for: `standbys.warm_key`) makes it a warm standby: it builds the data,
  model, state and compiled step of that generation now (`loop.prepare(standby=True)`), so that
  a restart only restores and trains. With "distributed": {address, num_processes, process_id}
  it first joins jax.distributed there, as one of a group that will be the generation's
  processes (`standbys.Standbys`). The assignment line {generation, process_id, host_name,
  coordinator, assigned_at, path} ends the wait and is returned; None when stdin closes first.
  From then on stdout and stderr go to the generation's log, like a worker started for it.

  Lines are read on a thread of their own: an assignment that arrives while the standby is
  still importing or preparing (at low priority) gives its priority back at once.
  """
  lines = _lines_from_stdin()
  from medjax.train import loop  # pylint: disable=import-outside-toplevel,unused-import
  spare = os.environ.pop(forking.SPARE_FD_ENV, None)
  if spare is not None and _fork_spare(int(spare)):
    lines = _lines_from_stdin()   # the spare's own: its agent's end of the socket
  while True:
    job = lines.get()
    if job is None:
      return None
    if "prepare" not in job:
      break
    _prepare(workdir, job["prepare"], job.get("distributed"))
  sys.stdout.flush()
  sys.stderr.flush()
  path = paths.RunPaths(workdir).worker_output(job["generation"], job["process_id"])
  with open(path, "a") as log:
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
  _handover.update(path=job.get("path", "standby"), assigned_at=job.get("assigned_at"))
  return job


def _lines_from_stdin() -> queue.Queue:
  """The agent's lines on stdin, read on a thread of their own (`_read_lines`)."""
  lines: queue.Queue = queue.Queue()
  threading.Thread(target=_read_lines, args=(lines, sys.stdin), name="standby-stdin",
                   daemon=True).start()
  return lines


def _fork_spare(fd: int) -> bool:
  """Forks this standby, imported and not yet handed anything, into a spare standby for its
  agent: the spare starts with everything imported where a new process would spend ~2 s of a
  core importing beside the run's start (on 2 cores, slowing the worker's own import by a
  quarter). Forked twice, so that the spare's parent is the agent (a subreaper, which adopts
  it when the middle process exits) and not this process, which may crash; the spare then
  dies with the agent, reads its lines from `fd` (its end of a socket pair whose other end the
  agent kept) and writes its pid there for the agent to adopt it. Returns True in the spare.

  At this point the standby has its main thread, the thread reading stdin (blocked in a read:
  the spare reads `fd` through new file objects) and numpy's OpenBLAS pool (which OpenBLAS
  shuts down around a fork): nothing the spare uses is left locked.
  """
  others = [t.name for t in threading.enumerate()
            if t is not threading.main_thread() and t.name != "standby-stdin"]
  if others:
    logging.warning("standby: threads %s are running; no spare forked (the agent starts one)",
                    others)
    os.close(fd)
    return False
  agent = os.getppid()
  sys.stdout.flush()
  sys.stderr.flush()
  # What the imports made is kept out of every later garbage collection, in this process and the
  # spare: a full collection writes to each object it visits, which copies every page the two
  # share (Python's gc.freeze advice for fork without exec; ~10k of the worker's ~20k extra
  # page faults after the fork).
  gc.freeze()
  middle = os.fork()
  if middle:
    os.close(fd)
    os.waitpid(middle, 0)
    return False
  try:
    if os.fork():
      os._exit(0)  # pylint: disable=protected-access
    os.setsid()
    deadline = time.monotonic() + 5.0
    while os.getppid() != agent:   # until the middle process's exit reparents us
      if os.getppid() == 1 or time.monotonic() > deadline:
        os._exit(0)  # pylint: disable=protected-access  # no subreaper: no one would adopt us
      time.sleep(0.001)
    lifeline.die_with(agent)
    os.dup2(fd, 0)
    os.close(fd)
    sys.stdin = open(0, closefd=False)  # pylint: disable=consider-using-with
    os.write(0, f"{os.getpid()}\n".encode())
    return True
  except BaseException:  # pylint: disable=broad-except  # never return into the standby's stack
    os._exit(1)  # pylint: disable=protected-access


def _read_lines(lines: queue.Queue, stream) -> None:
  """The agent's lines (then None, at the assignment or when stdin closes)."""
  while True:
    line = stream.readline()
    job = json.loads(line) if line.strip() else None
    if job is not None and "prepare" not in job and "nice" in job:
      _restore_priority(job["nice"])   # at once, even mid-preparation
    lines.put(job)
    if job is None or "prepare" not in job:
      return


def _restore_priority(nice: int) -> None:
  """A standby started at low priority (`spawn.popen`) trains at its agent's: every thread's
  scheduling policy and nice value are set back (threads inherit their creator's, and XLA's
  were created at low priority)."""
  try:
    tids = [int(t) for t in os.listdir("/proc/self/task")]
  except OSError:
    tids = [0]
  for tid in tids:
    try:
      if os.sched_getscheduler(tid) != os.SCHED_OTHER:
        os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
      if os.getpriority(os.PRIO_PROCESS, tid) != nice:
        os.setpriority(os.PRIO_PROCESS, tid, nice)
    except OSError as e:
      logging.warning("standby: could not restore the priority of thread %d: %s", tid, e)


def _prepare(workdir: str, expected: dict, distributed: dict | None = None) -> None:
  """Builds what a generation of `expected` (hosts, host history, this host) needs, ahead; as
  process `distributed["process_id"]` of a group that joined jax.distributed first, if given."""
  from medjax.train import loop  # pylint: disable=import-outside-toplevel
  if _handover.get("prepared") is not None:
    return
  try:
    config = paths.load_config(workdir)
    _configure_jax(paths.RunPaths(workdir, config))
    # A group is one host's processes 0..n-1.
    pid, count = ((0, 1) if distributed is None
                  else (distributed["process_id"], distributed["num_processes"]))
    topology = loop.Topology(hosts=tuple(expected["hosts"]), host=expected["host"],
                             local_index=layout_lib.local_index(pid, count), local_count=count)
    phases = phases_lib.Phases("warm_standby")
    t0 = time.perf_counter()
    if distributed is not None:
      with phases.phase("distributed_init"):
        _join(distributed, config)
    prepared = loop.prepare(config, workdir, topology, None, expected["host_history"],
                            standby=True, phases=phases)
  except Exception:  # pylint: disable=broad-except  (the generation will prepare itself)
    if distributed is not None:
      # Its group's barriers would no longer meet: the agent replaces the whole group.
      logging.exception("standby: joining or preparing as process %d of a group failed; "
                        "leaving", distributed["process_id"])
      sys.stdout.flush()
      sys.stderr.flush()
      os._exit(run_state.EXIT_ERROR)  # pylint: disable=protected-access
    logging.exception("standby: preparing ahead failed; the assigned generation prepares itself")
    return
  _handover.update(prepared=prepared, prepared_phases=phases, prepared_at=time.time())
  logging.info("standby: prepared %s for hosts %s in %.1f s (%s)", expected["host"],
               expected["hosts"], time.perf_counter() - t0, phases.seconds)


def _join(distributed: dict, config) -> None:
  """jax.distributed.initialize at `distributed`'s address as its process: the others wait until
  process 0's service listens (connecting earlier costs gRPC's reconnect back-off). That service
  listens only on the address the first host advertises (loopback for local runs), never on
  every interface; jax.distributed's own failure detection waits longer than the coordinator's
  (config.fault.jax_heartbeat_timeout_s), so ours acts."""
  address, pid = distributed["address"], distributed["process_id"]
  deadline = time.monotonic() + config.fault.timeout_start_s
  if pid != 0:
    protocol.wait_for_listener(address, config.fault.timeout_start_s)
  jax.distributed.initialize(address, distributed["num_processes"], pid,
                             local_device_ids=layout_lib.local_device_ids(
                                 pid, config.fault.workers_per_host,
                                 config.fault.devices_per_worker),
                             heartbeat_timeout_seconds=config.fault.jax_heartbeat_timeout_s,
                             initialization_timeout=max(int(deadline - time.monotonic()), 1),
                             coordinator_bind_address=address)
  _handover["distributed"] = dict(distributed)


def _configure_jax(run_paths: paths.RunPaths) -> None:
  if _handover.get("jax_configured"):
    return
  _handover["jax_configured"] = True
  # Restarts reuse compiled programs instead of compiling from scratch.
  jax.config.update("jax_compilation_cache_dir", run_paths.compilation_cache)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_cpu_collectives_implementation", "gloo")


def _leave_error(run_paths: paths.RunPaths, generation: int, process_id: int,
                 message: str) -> None:
  """The one line the agent reports with this worker's exit (and the user reads)."""
  try:
    with open(run_paths.worker_error(generation, process_id), "w") as f:
      f.write(errors.one_line(message) + "\n")
  except OSError:
    logging.exception("worker %d: could not write the error file", process_id)


def _leave_when_stuck(process_id: int, asked_to_stop: threading.Event,
                      finished: threading.Event, grace_s: float) -> None:
  """Exits the process when the coordinator asked it to stop and the training thread has not
  stopped at a step boundary within `grace_s`: it is stuck (a hang, a collective whose peer is
  gone), and waiting for the agent's SIGTERM and SIGKILL would only delay the next generation.
  Nothing is lost: the next generation restores the newest committed checkpoint. (It sleeps
  until then: no periodic wake-up competes with training.)"""
  asked_to_stop.wait()
  if finished.wait(grace_s):
    return
  logging.warning("worker %d: asked to stop %.1f s ago and still not at a step boundary; "
                  "leaving", process_id, grace_s)
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(run_state.EXIT_STOPPED)  # pylint: disable=protected-access


def run(workdir: str, generation: int, process_id: int, host: str, coordinator: str, *,
        make_trial=None) -> NoReturn:
  """Trains as process `process_id` of `generation`, then ends the process with its exit code
  (run_state.EXIT_*; 0 when training finished). `make_trial`: see `loop.train_and_evaluate`."""
  from medjax.train import loop  # pylint: disable=import-outside-toplevel
  handover = dict(_handover)
  phases = _phases(handover)
  config = paths.load_config(workdir)
  run_paths = paths.RunPaths(workdir, config)
  spec = _read_spec(run_paths, generation, process_id)
  client = protocol.Client(coordinator, protocol.load_token(run_paths.token),
                           tls_ca=config.fault.tls_ca)
  asked_to_stop, finished = threading.Event(), threading.Event()
  ctx = context.Remote(phases_lib.Reporting(client, phases, on_stop=asked_to_stop.set),
                       generation=generation, process_id=process_id)
  threading.Thread(target=_leave_when_stuck,
                   args=(process_id, asked_to_stop, finished, config.fault.stop_grace_s / 4),
                   name="stop-watchdog", daemon=True).start()
  wph = spec["workers_per_host"]
  topology = loop.Topology(hosts=tuple(spec["hosts"]), host=host,
                           local_index=layout_lib.local_index(process_id, wph), local_count=wph)
  # The jax.distributed job this process is to join (None: one process needs none).
  wanted = ({"address": spec["jax_address"], "num_processes": spec["num_processes"],
             "process_id": process_id} if spec["num_processes"] > 1 else None)
  prepared = _usable_preparation(handover, wanted, topology, spec, generation, process_id)
  if prepared is None:
    if phases.path == "warm_standby":
      phases.path = "standby"
    _configure_jax(run_paths)
  logging.info("worker %d: generation %d by %s", process_id, generation, phases.path)

  def train() -> None:
    nonlocal prepared
    joined = handover.get("distributed")
    if joined is not None and joined != wanted:
      # The agent hands a group over only to the generation it joined for (`agent._group_for`).
      raise RuntimeError(f"this standby joined jax.distributed as {joined}; generation "
                         f"{generation} needs {wanted}, and a process joins once")
    if wanted is not None and joined is None:
      with phases.phase("distributed_init"):
        _join(wanted, config)
    if prepared is None:
      prepared = loop.prepare(config, workdir, topology, ctx, spec["host_history"],
                              phases=phases)
    else:
      phases.adopt_prepared(handover["prepared_phases"], handover["prepared_at"])
      with phases.phase("data_takeover"):
        prepared.take_over(ctx)
    loop.run_prepared(prepared, ctx, phases=phases, make_trial=make_trial)

  code = _exit_code(train, run_paths, generation, process_id)
  finished.set()
  asked_to_stop.set()
  ctx.close()
  if code == 0 and spec["num_processes"] > 1:
    # After a failure peers may be dead or stuck in a collective: no shutdown barrier then.
    jax.distributed.shutdown()
  # Everything is written and closed: the end of the run (the agent's report, the coordinator's
  # summary) does not wait for Python's teardown.
  lifeline.leave(code)


def _read_spec(run_paths: paths.RunPaths, generation: int, process_id: int) -> dict:
  """The generation's spec (`run_state.SPEC`, for this generation). One that cannot be read or
  has another shape ends the process with one line, which its agent reports with the exit: the
  coordinator then starts the next generation, whose spec it writes anew."""
  path = run_paths.generation_spec(generation)
  try:
    with open(path) as f:
      spec = schema.check(json.load(f), run_state.SPEC)
    if spec["generation"] != generation:
      raise schema.SchemaError("generation", f"is {spec['generation']}, not {generation}")
  except (OSError, ValueError) as e:   # (not JSON, or schema.SchemaError)
    message = (f"{path}: the generation spec is damaged ({e}); the coordinator writes the next "
               "generation's anew")
    logging.error("worker %d: %s", process_id, message)
    _leave_error(run_paths, generation, process_id, message)
    lifeline.leave(run_state.EXIT_ERROR)
  return spec


def _phases(handover: dict) -> phases_lib.Phases:
  """This worker's start-up phases, timed from when its agent assigned the generation."""
  assigned_at = handover.get("assigned_at")
  if assigned_at is None and os.environ.get(phases_lib.ASSIGNED_AT_ENV):
    assigned_at = float(os.environ[phases_lib.ASSIGNED_AT_ENV])
  phases = phases_lib.Phases(handover.get("path", "relaunch"), assigned_at)
  phases.since_assigned("handover" if "path" in handover else "process_start")
  return phases


def _usable_preparation(handover: dict, wanted, topology, spec: dict, generation: int,
                        process_id: int):
  """What a standby prepared ahead, if it is what this generation needs (the same
  jax.distributed job, hosts and history); else None (closed), and it prepares again."""
  prepared = handover.get("prepared")
  if prepared is None or (handover.get("distributed") == wanted
                          and prepared.serves(topology, spec["host_history"])):
    return prepared
  logging.warning("worker %d: the standby was prepared for hosts %s, history %s; generation %d "
                  "has %s, %s: preparing again", process_id, list(prepared.topology.hosts),
                  prepared.host_history, generation, spec["hosts"], spec["host_history"])
  if prepared.ckpt is not None:
    prepared.ckpt.close()
  return None


def _exit_code(train, run_paths: paths.RunPaths, generation: int, process_id: int) -> int:
  """Runs `train()`; the worker's exit code for how it ended (run_state.EXIT_*), with the one line
  the agent reports left in the worker's error file."""
  from medjax.train import loop  # pylint: disable=import-outside-toplevel
  try:
    train()
  except loop.Stopped as e:
    logging.info("worker %d: %s", process_id, e)
    return run_state.EXIT_STOPPED
  except loop.Preempted as e:
    logging.info("worker %d: %s", process_id, e)
    return run_state.EXIT_PREEMPTED
  except (inject.InjectedOutOfMemory, MemoryError) as e:
    logging.error("worker %d: out of memory: %s", process_id, e)
    _leave_error(run_paths, generation, process_id, f"out of memory: {e}")
    return run_state.EXIT_OOM
  except errors.InputError as e:
    logging.exception("worker %d: %s", process_id, e)
    _leave_error(run_paths, generation, process_id, str(e))
    return run_state.EXIT_INPUT
  except Exception as e:  # pylint: disable=broad-except
    logging.exception("worker %d: training failed", process_id)
    _leave_error(run_paths, generation, process_id, f"{type(e).__name__}: {e}")
    return run_state.EXIT_ERROR
  return 0
