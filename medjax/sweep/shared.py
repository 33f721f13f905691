"""The sweep's one ingest, and what every trial shares: cohort, ingest, decoded cache, salt, JAX
compilation cache.

The base config is ingested once, as an ordinary `--config.mode=ingest` run in `<sweep>/data`
(synthesising the cohort first when the base has no data.root). Each trial then points at it:
config.data.root, data.salt_file, data.cache_dir and mesh.compilation_cache_dir name the shared
locations (unless the base config sets its own), and `<trial>/ingest` is a link to the shared
ingest, which a run reuses ("ingest: reusing ...") instead of ingesting again.

Several sweep processes may start at once on one workdir (a cluster): the first ingests, under a
file lock, and the others wait for it and reuse its ingest.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import json
import os

from medjax import errors
from medjax import paths
from medjax.sweep import layout as layout_lib
from medjax.sweep import log
from medjax.sweep import process
from medjax.sweep import spec


def prepare(sweep: spec.Sweep, where: layout_lib.SweepPaths) -> dict:
  """Ingests the base config once (or checks the existing ingest); returns the trials' wiring."""
  data_run = paths.RunPaths(where.data, sweep.base)
  os.makedirs(where.data, exist_ok=True)
  wanted = data_identity(sweep.base)
  with _locked(where.data_lock):
    if os.path.exists(data_run.ingest_report) and os.path.exists(where.data_config):
      with open(where.data_config) as f:
        made = json.load(f)
      if made != wanted:
        field = next((k for k in sorted(set(made) | set(wanted)) if made.get(k) != wanted.get(k)),
                     "?")
        raise errors.InputError(
            f"{where.data}: this sweep's shared ingest was made with another data config "
            f"({field}: {made.get(field)!r}, now {wanted.get(field)!r}); give a new --workdir "
            "for a sweep over other data")
      log.say(f"sweep: ingest: reusing {data_run.ingest} (shared by every trial)")
    else:
      log.say(f"sweep: ingesting the base config once into {where.data} (log: "
              f"{where.data_log})")
      args = [f"--config={sweep.base_file}", f"--workdir={where.data}", "--config.mode=ingest",
              *spec.trial_flags(sweep, {}, {})]
      outcome = process.run(args, where.data_log)
      if outcome.returncode != 0:
        raise errors.InputError(f"the sweep's shared ingest failed ({outcome.reason}); see "
                                f"{where.data_log}")
      with open(where.data_config, "w") as f:
        json.dump(wanted, f, indent=2, sort_keys=True)
      log.say(f"sweep: ingested in {outcome.wall_s:.1f} s")
  return wiring(sweep, where)


def wiring(sweep: spec.Sweep, where: layout_lib.SweepPaths) -> dict:
  """Dotted run config fields -> values that point a trial at the shared data."""
  base = sweep.base
  data_run = paths.RunPaths(where.data, base)
  out = {"data.root": base.data.root or data_run.cohort,
         "data.salt_file": data_run.salt,
         "data.cache_dir": data_run.cache_root,
         "mesh.compilation_cache_dir": (base.mesh.compilation_cache_dir
                                        or paths.compilation_cache_or(where.compilation_cache))}
  return out


def link_ingest(where: layout_lib.SweepPaths, trial_dir: str) -> None:
  """`<trial>/ingest` -> the shared ingest (relative, so the sweep directory can move)."""
  target = paths.RunPaths(where.data).ingest
  link = paths.RunPaths(trial_dir).ingest
  relative = os.path.relpath(target, trial_dir)
  if os.path.islink(link) and os.readlink(link) == relative:
    return
  if os.path.lexists(link):
    raise errors.InputError(f"{link}: expected a link to the sweep's shared ingest {target}; "
                            "move it away and resume the sweep")
  os.symlink(relative, link)


def data_identity(base) -> dict:
  """What the shared ingest and decoded cache depend on (runtime data fields left out)."""
  data = copy.deepcopy(base.data).to_dict()
  for field in spec.RUNTIME_DATA:
    data.pop(field.split(".", 1)[1], None)
  flat = {f"data.{k}": v for k, v in spec.flatten(data).items()}
  flat["seed"] = base.seed   # it draws the train/val/test split
  return json.loads(json.dumps(flat, default=list))


@contextlib.contextmanager
def _locked(path: str):
  with open(path, "a") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)
