"""The data layer's process pools (the header scan, the cache fill, the synthetic writer) start
from one forkserver; `cores` is how many processes "one per core" means.

Not fork: the caller may have started JAX's threads, and a forked copy can deadlock on them. The
forkserver is a fresh interpreter, started once per process, and it imports the decoding code
(NumPy, pydicom, PIL, TensorStore) before it forks any pool process: each pool process then
starts with it imported instead of importing it again (about 0.6 CPU seconds a process, and
the pool's start on a host with many cores).

It also runs the caller's main module once, as a pool process would
(`medjax.data.pool_main`). Each pool process runs the parent's main module (a script, or a `-m`
module other than a package's `__main__`) before its first job, unless the forkserver ran it.
Preloading '__main__' was meant to do that, and on Python before 3.13 it does nothing
(CPython gh-126631): every process of a pool started from `python launch.py` or `python -m
experiments.bench_data` ran that module's imports again. `python -m medjax`, the workers'
command, runs a package's `__main__`, which pool processes skip in any case.
"""

from __future__ import annotations

import json
import multiprocessing
import os
from multiprocessing import spawn

# What the forkserver imports once, in this order; `pool_main` runs the caller's main module
# (named in MAIN_ENV) there.
PRELOAD = ("medjax.data.pool_main", "medjax.data.cache.fill", "medjax.data.dicom.scan")
MAIN_ENV = "MEDJAX_POOL_MAIN"


def cores() -> int:
  """The cores this process may run on: its CPU affinity (what a SLURM allocation, a cpuset or
  `taskset` gives it), not the machine's count, which a job given 4 cores of a 128-core node
  would otherwise fill with 128 processes."""
  try:
    return len(os.sched_getaffinity(0)) or 1
  except (AttributeError, OSError):   # no affinity API (macOS)
    return os.cpu_count() or 1


def context() -> multiprocessing.context.ForkServerContext:
  """The forkserver context of the data layer's pools (the preload applies from the
  forkserver's start, the first pool of the process)."""
  os.environ[MAIN_ENV] = main_entry()   # the forkserver inherits it when it starts
  ctx = multiprocessing.get_context("forkserver")
  ctx.set_forkserver_preload(list(PRELOAD))
  return ctx


def main_entry() -> str:
  """How a pool process would set up this process's main module, as JSON: {"name": module}
  (`python -m`) or {"path": script}, with "argv"; {} where there is nothing to run (an
  interactive session, `python -c`)."""
  data = spawn.get_preparation_data("pool")
  for key, kind in (("init_main_from_name", "name"), ("init_main_from_path", "path")):
    if key in data:
      return json.dumps({kind: data[key], "argv": data["sys_argv"]})
  return "{}"
