"""The Optuna study of a sweep: storage, sampler, pruner, and trials left by dead processes.

The study lives in an RDB storage: `sqlite:///<sweep>/study.db` by default, or any SQLAlchemy
URL (`postgresql://user@host/db`) that several sweep processes on different machines share. The
sweep process records a heartbeat for the trial it runs; a trial whose heartbeat stops (its sweep
process was killed, its machine lost) is failed and retried once the grace period has passed
(Optuna's `RetryHeartbeatStaleTrialCallback`), by whichever sweep process next starts a trial. On
the same machine a dead sweep process is seen at once (`fail_dead_local_trials`).

The pruner is not stored by Optuna; the sweep writes its settings into the study's user attrs
(`PRUNER_ATTR`) so that each trial's own process (`medjax.sweep.trial`) builds the same one.
"""

from __future__ import annotations

import os
import socket
import warnings

import optuna
import psutil
from sqlalchemy import engine as sa_engine

from medjax import errors
from medjax.sweep import log

PRUNER_ATTR = "medjax.pruner"
METRIC_ATTR = "medjax.metric"
# The sweep process running a trial, so that a restarted sweep on the same machine sees at once
# that it is gone (the heartbeat takes the grace period to say so). It names the trial: a retry
# inherits its interrupted trial's user attrs, this one included, until it claims its own.
OWNER_ATTR = "sweep_process"
# SQLite: concurrent writers (the sweep's heartbeat thread, the trial's reporter) wait this long.
SQLITE_TIMEOUT_S = 60


def storage_url(configured: str, default: str) -> str:
  return configured or default


def shown_url(url: str) -> str:
  """The URL with any password replaced by ***, for logs and errors."""
  try:
    return sa_engine.make_url(url).render_as_string(hide_password=True)
  except Exception:  # pylint: disable=broad-except  # not a URL SQLAlchemy parses
    return url.split("@")[-1]


def open_storage(url: str, *, heartbeat_s: int | None = None, grace_s: int | None = None,
                 max_retry: int | None = None) -> optuna.storages.RDBStorage:
  """An RDBStorage; with `heartbeat_s`, stale trials are failed and retried up to `max_retry`."""
  kwargs = {}
  if url.startswith("sqlite"):
    kwargs["engine_kwargs"] = {"connect_args": {"timeout": SQLITE_TIMEOUT_S}}
  try:
    with warnings.catch_warnings():
      warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
      if heartbeat_s:
        kwargs.update(
            heartbeat_interval=heartbeat_s, grace_period=grace_s,
            heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(
                max_retry=max_retry, inherit_intermediate_values=True))
      return optuna.storages.RDBStorage(url, **kwargs)
  except Exception as e:  # pylint: disable=broad-except  # driver, network, permissions
    raise errors.InputError(
        f"Optuna storage {shown_url(url)}: cannot open it ({type(e).__name__}: "
        f"{' '.join(str(e).split())[:200]}); check the URL, that the database server is "
        "reachable and its driver installed (PostgreSQL: pip install psycopg2-binary)") from e


def pruner_spec(config, epochs: int | None) -> dict:
  """The pruner settings a trial rebuilds its pruner from (`epochs`: None when searched)."""
  p = config.pruner
  return {"kind": p.kind, "min_resource": p.min_resource,
          "reduction_factor": p.reduction_factor, "max_resource": epochs}


def make_pruner(spec: dict | None) -> optuna.pruners.BasePruner:
  """ASHA (`SuccessiveHalvingPruner`), Hyperband, or none; steps are epochs."""
  if not spec or spec.get("kind") == "none":
    return optuna.pruners.NopPruner()
  if spec["kind"] == "asha":
    return optuna.pruners.SuccessiveHalvingPruner(
        min_resource=spec["min_resource"], reduction_factor=spec["reduction_factor"])
  if spec["kind"] == "hyperband":
    return optuna.pruners.HyperbandPruner(
        min_resource=spec["min_resource"], max_resource=spec.get("max_resource") or "auto",
        reduction_factor=spec["reduction_factor"])
  raise ValueError(f"unknown pruner kind {spec['kind']!r}")


def make_sampler(kind: str, seed: int) -> optuna.samplers.BaseSampler:
  if kind == "random":
    return optuna.samplers.RandomSampler(seed=seed)
  return optuna.samplers.TPESampler(seed=seed)


def open_study(sweep, url: str) -> optuna.Study:
  """The sweep's study, created or loaded; its pruner settings written for the trials."""
  c = sweep.config
  storage = open_storage(url, heartbeat_s=c.trials.heartbeat_s, grace_s=c.trials.grace_s,
                         max_retry=c.trials.max_retry)
  pruner = pruner_spec(c, None if any(p.field == "optim.epochs" for p in sweep.params)
                       else sweep.epochs)
  existing = _trial_count(storage, c.study.name)
  # A resumed sweep draws new points, not the ones its first run drew from the same seed.
  sampler = make_sampler(c.study.sampler, c.study.seed + existing)
  study = optuna.create_study(storage=storage, study_name=c.study.name, direction="maximize",
                              sampler=sampler, pruner=make_pruner(pruner), load_if_exists=True)
  if study.direction != optuna.study.StudyDirection.MAXIMIZE:
    raise errors.InputError(f"study {c.study.name!r} in {shown_url(url)} minimises; medjax's "
                            "validation metrics are higher-is-better: give another "
                            "config.study.name")
  metric = study.user_attrs.get(METRIC_ATTR)
  if metric not in (None, c.study.metric):
    raise errors.InputError(f"study {c.study.name!r} in {shown_url(url)} maximises "
                            f"{metric!r}, not config.study.metric={c.study.metric!r}; give "
                            "another config.study.name")
  study.set_user_attr(METRIC_ATTR, c.study.metric)
  study.set_user_attr(PRUNER_ATTR, pruner)
  return study


def claim(trial) -> None:
  """Marks `trial` as run by this process on this machine."""
  trial.set_user_attr(OWNER_ATTR, {"host": socket.gethostname(), "pid": os.getpid(),
                                   "started": psutil.Process().create_time(),
                                   "trial": trial.number})


def fail_dead_local_trials(study: optuna.Study) -> list[int]:
  """Fails (and retries, as a stale heartbeat would) running trials of dead processes here."""
  storage = study._storage  # pylint: disable=protected-access  # as optuna.storages does
  host = socket.gethostname()
  failed = []
  for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
    owner = t.user_attrs.get(OWNER_ATTR) or {}
    if (owner.get("host") != host or owner.get("trial") != t.number
        or _alive(owner.get("pid"), owner.get("started"))):
      continue
    trial_id = t._trial_id  # pylint: disable=protected-access  # as fail_stale_trials uses it
    try:
      if storage.set_trial_state_values(trial_id, state=optuna.trial.TrialState.FAIL):
        failed.append(trial_id)
    except optuna.exceptions.UpdateFinishedTrialError:
      pass  # another sweep process got there first
  retry = storage.get_heartbeat_stale_trial_callback()
  numbers = []
  for trial_id in failed:
    frozen = storage.get_trial(trial_id)
    numbers.append(frozen.number)
    if retry is not None:
      with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        retry(study, frozen)
  if numbers:
    log.say(f"sweep: trials {numbers} were left running by a sweep process that is gone: "
            "failed, and queued again (up to config.trials.max_retry times)")
  return numbers


def retried_number(frozen: optuna.trial.FrozenTrial) -> int | None:
  """The number of the interrupted trial that `frozen` retries (None: not a retry)."""
  history = frozen.system_attrs.get("retry_history") or []
  return history[-1] if history else None


def frozen(trial: optuna.trial.Trial) -> optuna.trial.FrozenTrial:
  """The stored state of a running trial (a Trial shows its user attrs, not its system attrs)."""
  return next(t for t in trial.study.get_trials(deepcopy=False) if t.number == trial.number)


def _alive(pid, started) -> bool:
  if pid is None:
    return True  # not ours to judge: leave it to the heartbeat
  try:
    return abs(psutil.Process(int(pid)).create_time() - float(started or 0)) < 1e-3
  except (psutil.Error, ValueError, TypeError):
    return False


def _trial_count(storage, name: str) -> int:
  try:
    study_id = storage.get_study_id_from_name(name)
  except KeyError:
    return 0
  return len(storage.get_all_trials(study_id, deepcopy=False))
