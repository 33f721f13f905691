"""medjax's command line: flags and roles, each handed to the library with a config.

  medjax --config configs/quickstart.py [--workdir DIR] [--config.a.b=value]
  medjax --config configs/quickstart.py --config.mode=ingest --workdir DIR
  medjax --config configs/sweep.py --workdir DIR    (an Optuna sweep; rerun to resume)

`medjax`, `python -m medjax` and `python launch.py` (from a checkout) are the same command.

Roles (--role):
  local        (default) everything on this machine: data, coordinator, agents, workers
  coordinator  the coordinator of a multi-host run (--config, --workdir on shared storage,
               --bind, --port); it ingests the cohort first if that is not done
  agent        one per host (--coordinator=HOST:PORT, --workdir, --host_name)
  worker       started by an agent, never by hand
"""

import logging
import os
import re
import socket
import sys
import time

from medjax import lifeline  # first: a child of an agent or sweep dies with it (lifeline.py)

lifeline.settle()

# pylint: disable=wrong-import-position
from absl import app
from absl import flags
from ml_collections import config_flags

from medjax import errors  # these two import no jax: --help and bad flags are answered fast
from medjax import paths
from medjax import runlog

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file (configs/NAME.py[:variant]); override fields with "
    "--config.a.b=value. Agents and workers read <workdir>/config.json instead.",
    lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (default: runs/<config>-<time>).")
_ROLE = flags.DEFINE_enum("role", "local", ["local", "coordinator", "agent", "worker"],
                          "What this process is (see the module docstring).")
_COORDINATOR = flags.DEFINE_string("coordinator", None, "HOST:PORT of the coordinator.")
_BIND = flags.DEFINE_string("bind", "127.0.0.1", "Coordinator: address to serve on.")
_PORT = flags.DEFINE_integer("port", 0, "Coordinator: port (0: config.fault.port or a free one).")
_HOST_NAME = flags.DEFINE_string("host_name", None, "Agent: this host's name (default hostname).")
_ADVERTISE = flags.DEFINE_string("advertise", "127.0.0.1", "Agent: this host's address as the "
                                 "other hosts reach it (for jax.distributed).")
_GENERATION = flags.DEFINE_integer("generation", 0, "Worker: generation.")
_PROCESS_ID = flags.DEFINE_integer("process_id", 0, "Worker: jax process id.")
_DEBUG = flags.DEFINE_bool("debug", False, "Show tracebacks (also MEDJAX_DEBUG=1); errors are "
                           "otherwise one line on stderr, exit code 2 for bad input or config.")
_INGESTED = flags.DEFINE_bool("ingested", False, "Coordinator: the local launcher has ingested "
                              "the data already; do not load it again.")
_STANDBY = flags.DEFINE_bool("standby", False, "Worker: import everything, then wait for the "
                             "generation, process id, host and coordinator on stdin (JSON).")


def _workdir() -> str:
  if _WORKDIR.value:
    return _WORKDIR.value
  if _CONFIG.value is None:
    raise app.UsageError("--workdir is required for this role")
  name = os.path.splitext(os.path.basename(flags.FLAGS["config"].config_filename))[0]
  return os.path.join("runs", f"{name}-{time.strftime('%Y%m%d-%H%M%S')}")


def _config(workdir: str):
  """The flag's config (saved to the workdir), or the workdir's saved config."""
  path = paths.RunPaths(workdir).config_json
  if _CONFIG.value is not None:
    config = _CONFIG.value
    with open(path, "w") as f:
      f.write(config.to_json_best_effort(indent=2, sort_keys=True))
    return config
  if not os.path.exists(path):
    raise app.UsageError(f"no --config and no {path}; give --config")
  return paths.load_config(workdir)


def _sweep(role: str) -> int:
  """A sweep config (mode 'sweep'): an Optuna study whose trials are medjax runs."""
  if role != "local":
    raise app.UsageError(f"--role={role}: a sweep runs in the local role; on a cluster, start it "
                         "on each machine with one --workdir and --config.study.storage")
  from medjax.sweep import spec  # pylint: disable=import-outside-toplevel
  spec.load(_CONFIG.value)  # the sweep and its base config checked before anything is written
  from medjax.sweep import runner  # pylint: disable=import-outside-toplevel  (imports optuna)
  workdir = _workdir()
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise errors.InputError(f"--workdir={workdir} is a file, not a directory; give a new or "
                            "existing sweep directory")
  os.makedirs(workdir, exist_ok=True)
  _config(workdir)
  runlog.setup(workdir, "log")
  runner.run(_CONFIG.value, workdir)
  print(f"workdir: {workdir}")
  return 0


def main(argv):
  del argv
  role = _ROLE.value
  if _CONFIG.value is not None and _CONFIG.value.get("mode") == "sweep":
    return _sweep(role)
  if _CONFIG.value is not None and role != "worker":
    # Every field checked before anything starts or is written (no jax imported yet: a bad
    # config is answered in well under 2 s).
    from medjax import config_check  # pylint: disable=import-outside-toplevel
    config_check.validate(_CONFIG.value, role=role)
  workdir = _workdir()
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise errors.InputError(f"--workdir={workdir} is a file, not a directory; give a new or "
                            "existing run directory")
  os.makedirs(workdir, exist_ok=True)
  if role == "worker":
    return _worker(workdir)
  config = _config(workdir)
  if role == "agent":
    _agent(config, workdir)
  if role == "coordinator":
    _coordinator(config, workdir)
  return _local(config, workdir)


def _worker(workdir: str) -> int:
  """A worker of a generation: its assignment from the flags, or on stdin for a standby."""
  from medjax.fault import worker  # pylint: disable=import-outside-toplevel
  from medjax.sweep import trial  # pylint: disable=import-outside-toplevel  (no optuna yet)
  if _STANDBY.value:
    job = worker.wait_for_assignment(workdir)
    if job is None:
      return 0  # the agent went away before assigning this standby
  else:
    job = {"generation": _GENERATION.value, "process_id": _PROCESS_ID.value,
           "host_name": _HOST_NAME.value, "coordinator": _COORDINATOR.value}
  runlog.setup(workdir, f"worker-{job['generation']:03d}-{job['process_id']:03d}")
  return worker.run(workdir, job["generation"], job["process_id"], job["host_name"],
                    job["coordinator"], make_trial=trial.reporter)


def _agent(config, workdir: str) -> None:
  """This host's agent, until the run is over; leaves the process with its exit code."""
  host = _HOST_NAME.value or socket.gethostname()
  runlog.setup(workdir, f"agent-{host}")
  from medjax.fault import agent  # pylint: disable=import-outside-toplevel
  if not _COORDINATOR.value:
    raise app.UsageError("--role=agent needs --coordinator=HOST:PORT")
  # Its gRPC channel, standbys and logs are closed: no teardown to wait for (as its forks).
  lifeline.leave(agent.main(config, workdir, host=host, coordinator=_COORDINATOR.value,
                            advertise=_ADVERTISE.value))


def _coordinator(config, workdir: str) -> None:
  """The coordinator, until the run is over; leaves the process with its exit code."""
  runlog.setup(workdir, "coordinator")
  from medjax.fault import coordinator  # pylint: disable=import-outside-toplevel
  from medjax.fault import protocol  # pylint: disable=import-outside-toplevel
  if not _INGESTED.value:
    # A multi-host run's coordinator makes sure the data is ingested before agents start.
    from medjax.data import pipeline  # pylint: disable=import-outside-toplevel
    pipeline.ingested(config, workdir, pipeline.cohort_root(config, workdir))
  token = protocol.load_token(paths.RunPaths(workdir, config).token)
  # Everything is written (events, lineage, summary) and the server stopped: the local
  # launcher waits for this exit, not for gRPC's teardown (~50 ms on 2 cores).
  lifeline.leave(coordinator.Coordinator(config, workdir, token=token, host=_BIND.value,
                                         port=_PORT.value or config.fault.port).serve())


def _local(config, workdir: str) -> int:
  """The local role: synthesise, ingest, or train (supervised or in this process)."""
  runlog.setup(workdir, "log")
  logging.info("workdir %s, mode %s", workdir, config.mode)
  # Imported where needed so that `--help` and flag errors stay fast, and a supervised run's
  # launcher starts its agents before it imports the data pipeline (medjax.fault.local).
  if config.mode in ("synth", "ingest"):
    from medjax.data import pipeline  # pylint: disable=import-outside-toplevel
    if config.mode == "synth":
      print(pipeline.cohort_root(config, workdir))
    else:
      pipeline.run_ingest(config, workdir)
  elif config.mode == "train":
    summary = _train(config, workdir)
    if summary is None:
      return errors.EXIT_INPUT
  else:
    raise app.UsageError(f"config.mode={config.mode!r}: use 'synth', 'ingest' or 'train'")
  print(f"workdir: {workdir}")
  if config.mode == "train":
    lifeline.leave(0)  # JAX ran in this process, or gRPC's and the launched processes' handles
  return 0


def _train(config, workdir: str) -> dict | None:
  """Trains supervised (coordinator, agents, workers) or in this process; the summary, or None
  when a supervised run failed (its one line printed)."""
  if config.fault.supervised:
    from medjax.fault import local  # pylint: disable=import-outside-toplevel
    try:
      summary = local.run(config, workdir)
    except local.RunFailed as e:
      print(f"error: {e}", file=sys.stderr)
      return None
    # The summary table only: no JAX or matplotlib in this process, whose imports would take
    # the CPU from the worker starting beside it; imported after the run, since its numpy
    # starts a thread that would keep the launcher from forking its agents.
    from medjax.evals import table  # pylint: disable=import-outside-toplevel
    print(table.format_summary(summary))
  else:
    from medjax.sweep import trial  # pylint: disable=import-outside-toplevel
    from medjax.train import loop  # pylint: disable=import-outside-toplevel
    # Logs the summary table itself.
    summary = loop.train_and_evaluate(config, workdir, make_trial=trial.reporter)
  if "fault_tolerance" in summary:
    ft = summary["fault_tolerance"]
    print(f"fault tolerance: {len(ft['failures'])} failures, {ft['restarts']} restarts, "
          f"waste {ft['waste_fraction']:.2%}, exactly once: {ft['exactly_once']}")
  return summary


def _parse_flags(argv: list[str]) -> list[str]:
  """absl's parse, with a bad flag or config override answered in one line (exit 2)."""
  if "--debug" in argv:
    os.environ["MEDJAX_DEBUG"] = "1"
  try:
    rest = flags.FLAGS(argv)
    if _CONFIG.value is not None:
      _CONFIG.value.keys()  # config_flags loads the file lazily: its errors surface here
    return rest
  except Exception as e:  # pylint: disable=broad-except  # flags.Error, or the config file's own
    if errors.debug():
      raise
    errors.print_error(_unknown_override(e, argv) or _flag_error(e, _config_arg(argv)))
    sys.exit(errors.EXIT_INPUT)


def _config_arg(argv: list[str]) -> str:
  for i, arg in enumerate(argv):
    if arg.startswith("--config="):
      return arg.split("=", 1)[1]
    if arg == "--config" and i + 1 < len(argv):
      return argv[i + 1]
  return "?"


def _unknown_override(e: Exception, argv: list[str]) -> str | None:
  """One line for an override of a field the config does not have (config_flags raises the
  missing key as a KeyError or AttributeError, with a suggestion only for a close name)."""
  cause = e.__cause__ or e
  key = re.search(r"'([^' ]+)'", str(cause))
  if not isinstance(cause, (KeyError, AttributeError)) or not key:
    return None
  for arg in argv:
    name = arg[len("--config."):].split("=", 1)[0] if arg.startswith("--config.") else ""
    if name and key.group(1) in name.split("."):
      from medjax import config_check  # pylint: disable=import-outside-toplevel  (no jax)
      hint = config_check.suggest(name, config_check.field_names())
      return (f"--config.{name}: no such config field; "
              f"{hint or 'configs/default.py lists every field'}")
  return None


def _flag_error(e: Exception, config_file: str) -> str:
  """One line for a flag error; config_flags reports an unknown field as a raw KeyError text."""
  text = " ".join(str(e).replace("\\n", " ").replace("\\", "").split())
  unknown = re.search(r"'([^' ]+)'.*Did you mean \"([^\"]+)\" instead", text)
  if unknown:
    return (f"--config.*: no config field {unknown.group(1)!r}; did you mean "
            f"{unknown.group(2)!r}? (configs/default.py lists every field)")
  if "Error whilst parsing config file" in text:
    # config_flags folds the config file's own exception into the message, traceback and all.
    lines = [l.strip() for l in str(e).splitlines() if l.strip()]
    cause = next((l for l in reversed(lines) if re.match(r"^[\w.]+(Error|Exception)\b", l)),
                 lines[-1] if lines else text)
    return f"--config={config_file}: the config file raised {cause}"
  if isinstance(e, flags.Error):
    return text
  if isinstance(e, OSError) and "Failed loading config file" in text:
    return (f"--config={config_file}: cannot load it: "
            f"{str(e.__cause__ or e).splitlines()[-1].strip()}; give a file such as "
            "configs/quickstart.py")
  cause = e.__cause__ or e
  return (f"--config={config_file}: the config file raised "
          f"{type(cause).__name__}: {cause}")


def _log_to_file(message: str) -> None:
  """The error and its traceback into the run's log file only (the terminal gets one line)."""
  record = logging.getLogger().makeRecord("medjax", logging.ERROR, __file__, 0, message, (),
                                          sys.exc_info())
  for handler in logging.getLogger().handlers:
    if isinstance(handler, logging.FileHandler):
      handler.handle(record)


def _main(argv) -> int:
  """main, with every error one line on stderr unless --debug (the traceback goes to the log)."""
  if _DEBUG.value:
    os.environ["MEDJAX_DEBUG"] = "1"
  try:
    return main(argv)
  except (errors.InputError, app.UsageError) as e:
    _log_to_file(str(e))
    if errors.debug():
      raise
    errors.print_error(str(e))
    return errors.EXIT_INPUT
  except KeyboardInterrupt:
    errors.print_error("interrupted")
    return 130
  except Exception as e:  # pylint: disable=broad-except
    _log_to_file("failed")
    if errors.debug():
      raise
    errors.print_error(f"internal error: {type(e).__name__}: {e} (a bug in medjax, not in your "
                       "input: rerun with --debug for the traceback, and please report it)")
    return 1


def run() -> None:
  """The `medjax` command (also `python -m medjax` and `python launch.py`)."""
  # absl's --help shows the main module's docstring: this module's usage, however it started.
  sys.modules["__main__"].__doc__ = __doc__
  app.run(_main, flags_parser=_parse_flags)
