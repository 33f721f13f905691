"""A worker process: joins its generation's jax.distributed job and trains.

Started by its host's agent with the generation number and its process id; the generation's spec
(hosts, host history, process count, the jax.distributed address) is in
<workdir>/generations/gen-<G>.json, the run's config in <workdir>/config.json.
"""

from __future__ import annotations

import json
import logging
import os
import sys

import jax
import ml_collections

from medjax import errors
from medjax import paths
from medjax.fault import context
from medjax.fault import inject
from medjax.fault import policy
from medjax.fault import protocol


def load_config(workdir: str) -> ml_collections.ConfigDict:
  """The run's config.json (written by the launcher or coordinator)."""
  path = paths.RunPaths(workdir).config_json
  try:
    with open(path) as f:
      return ml_collections.ConfigDict(json.load(f))
  except (OSError, ValueError, TypeError) as e:
    raise errors.InputError(f"{path} is damaged or unreadable ({type(e).__name__}); start the "
                            "coordinator or launcher again with --config to write it") from e


def wait_for_assignment(workdir: str) -> dict | None:
  """A standby worker: imports the trainer, then reads its assignment from stdin.

  Returns {generation, process_id, host_name, coordinator}, or None when stdin closes first. From
  then on stdout and stderr go to the generation's log, like a worker started for it.
  """
  from medjax.train import loop  # pylint: disable=import-outside-toplevel,unused-import
  line = sys.stdin.readline()
  if not line.strip():
    return None
  job = json.loads(line)
  sys.stdout.flush()
  sys.stderr.flush()
  path = paths.RunPaths(workdir).worker_output(job["generation"], job["process_id"])
  with open(path, "a") as log:
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
  return job


def _leave_error(run_paths: paths.RunPaths, generation: int, process_id: int,
                 message: str) -> None:
  """The one line the agent reports with this worker's exit (and the user reads)."""
  try:
    with open(run_paths.worker_error(generation, process_id), "w") as f:
      f.write(errors.one_line(message) + "\n")
  except OSError:
    logging.exception("worker %d: could not write the error file", process_id)


def run(workdir: str, generation: int, process_id: int, host: str, coordinator: str) -> int:
  """Trains as process `process_id` of `generation`; returns the process exit code."""
  from medjax.train import loop  # pylint: disable=import-outside-toplevel
  config = load_config(workdir)
  run_paths = paths.RunPaths(workdir, config)
  with open(run_paths.generation_spec(generation)) as f:
    spec = json.load(f)
  token = protocol.load_token(run_paths.token)
  client = protocol.Client(coordinator, token, tls_ca=config.fault.tls_ca)
  ctx = context.Remote(client, generation=generation, process_id=process_id)
  # Restarts reuse compiled programs instead of compiling from scratch.
  jax.config.update("jax_compilation_cache_dir", run_paths.compilation_cache)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  # jax.distributed's own failure detection waits longer than the coordinator's, so ours acts.
  # Its service (in process 0) listens only on the address the first host advertises (loopback
  # for local runs), never on every interface.
  jax.distributed.initialize(spec["jax_address"], spec["num_processes"], process_id,
                             heartbeat_timeout_seconds=config.fault.jax_heartbeat_timeout_s,
                             initialization_timeout=int(config.fault.timeout_start_s),
                             coordinator_bind_address=spec["jax_address"])
  wph = spec["workers_per_host"]
  topology = loop.Topology(hosts=tuple(spec["hosts"]), host=host, local_index=process_id % wph,
                           local_count=wph)
  try:
    loop.train_and_evaluate(config, workdir, topology, ctx, host_history=spec["host_history"])
  except loop.Stopped as e:
    logging.info("worker %d: %s", process_id, e)
    code = policy.EXIT_STOPPED
  except loop.Preempted as e:
    logging.info("worker %d: %s", process_id, e)
    code = policy.EXIT_PREEMPTED
  except (inject.InjectedOutOfMemory, MemoryError) as e:
    logging.error("worker %d: out of memory: %s", process_id, e)
    code = policy.EXIT_OOM
    _leave_error(run_paths, generation, process_id, f"out of memory: {e}")
  except errors.InputError as e:
    logging.exception("worker %d: %s", process_id, e)
    code = policy.EXIT_INPUT
    _leave_error(run_paths, generation, process_id, str(e))
  except Exception as e:  # pylint: disable=broad-except
    logging.exception("worker %d: training failed", process_id)
    code = policy.EXIT_ERROR
    _leave_error(run_paths, generation, process_id, f"{type(e).__name__}: {e}")
  else:
    ctx.close()
    jax.distributed.shutdown()
    return 0
  ctx.close()
  # Peers may be dead or stuck in a collective: leave without the distributed shutdown barrier.
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(code)  # pylint: disable=protected-access
