"""`medjax --config configs/sweep.py`: an Optuna study whose trials are medjax runs.

  run(config, workdir)
    -> check the sweep config and its base (spec.load)
    -> ingest once (shared.prepare)
    -> open the study (studies.open_study); fail and queue again the trials of dead sweep
       processes on this machine
    -> study.optimize(objective): each trial a `medjax` child in trials/trial-NNNN, with the
       sampled fields as --config.<field>=<value>; its summary.json decides the trial's state
    -> the report (trials.csv, trials.md, PNGs) after every trial and at the end

A sweep counts finished trials (complete or pruned) toward config.study.n_trials, so a sweep
that is killed and started again runs only what is missing. A trial whose process fails (bad
value, crash, out of memory, time limit) is recorded as failed with its reason and the sweep goes
on; `config.trials.max_failures_in_a_row` failures in a row stop it with the last reason. An
interrupted trial (the sweep process killed or stopped, its machine lost) is queued again and
resumes in its own run directory from its newest committed checkpoint.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import time
import warnings

import optuna

from medjax import config_check
from medjax import errors
from medjax import paths
from medjax.sweep import layout as layout_lib
from medjax.sweep import log
from medjax.sweep import process
from medjax.sweep import report
from medjax.sweep import shared
from medjax.sweep import spec
from medjax.sweep import studies

FINISHED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)


class TrialFailed(Exception):
  """A trial's run failed; its reason is the trial's `fail_reason` user attr."""


def run(config, workdir: str) -> dict:
  """Runs (or resumes) the sweep in `workdir`; returns the best trial's row of the report."""
  sweep = spec.load(config)
  where = layout_lib.SweepPaths(os.path.abspath(workdir))
  _check_identity(sweep, where)
  _quiet_optuna()
  wiring = shared.prepare(sweep, where)
  url = studies.storage_url(config.study.storage, where.default_storage)
  study = studies.open_study(sweep, url)
  studies.fail_dead_local_trials(study)
  if config.study.start_with_base and not study.trials:
    study.enqueue_trial(sweep.base_values(), skip_if_exists=True)
  runner = _Runner(sweep, where, wiring, url)
  done = len(study.get_trials(deepcopy=False, states=FINISHED))
  n = config.study.n_trials
  log.say(f"sweep: study {config.study.name!r} in {studies.shown_url(url)}: {done} of {n} trials "
          f"finished; maximising val {sweep.metric}; {len(sweep.params)} fields searched")
  if done < n:
    study.optimize(runner.objective, catch=(TrialFailed,), gc_after_trial=False,
                   callbacks=[optuna.study.MaxTrialsCallback(n, states=FINISHED),
                              runner.after_trial])
  best = report.write(study, where, sweep)
  if runner.stopped_for_failures:
    raise errors.InputError(
        f"sweep stopped: {runner.failures_in_a_row} trials in a row failed "
        f"(config.trials.max_failures_in_a_row={config.trials.max_failures_in_a_row}); the last, "
        f"{runner.last_failure}; the report is in {where.trials_md}")
  done = len(study.get_trials(deepcopy=False, states=FINISHED))
  log.say(f"sweep: {done} of {n} trials finished; report: {where.trials_md}")
  if best:
    log.say(f"sweep: best trial {best['number']}: val {sweep.metric} {best['value']:.4f} "
            f"({_params_text(best['params'])}) in {best['workdir']}")
  return best


class _Runner:
  """The objective and the after-trial callback, with what they share."""

  def __init__(self, sweep: spec.Sweep, where: layout_lib.SweepPaths, wiring: dict, url: str):
    self.sweep, self.where, self.wiring, self.url = sweep, where, wiring, url
    self.failures_in_a_row = 0
    self.stopped_for_failures = False
    self.last_failure = ""

  # -- one trial ---------------------------------------------------------------------------------

  def objective(self, trial: optuna.trial.Trial) -> float:
    sweep, where = self.sweep, self.where
    values = {p.field: p.suggest(trial) for p in sweep.params}
    studies.claim(trial)
    retried = studies.retried_number(studies.frozen(trial))
    trial_dir = self._trial_dir(trial, retried)
    trial.set_user_attr("workdir", where.relative(trial_dir))
    for stale in ("fail_reason", "pruned_at_epoch"):
      if stale in trial.user_attrs:
        trial.set_user_attr(stale, None)
    trial_wiring = {**self.wiring,
                    "evals.validation_metric": sweep.metric,
                    "evals.splits": spec.eval_splits(sweep.base),
                    "trial.storage": self.url, "trial.study": sweep.config.study.name,
                    "trial.number": trial.number}
    problems = config_check.problems(spec.trial_config(sweep, values, trial_wiring))
    if problems:
      self._fail(trial, "config: " + problems[0], 0.0)
    summary_path = paths.RunPaths(trial_dir).summary
    if retried is not None and os.path.exists(summary_path):
      # The interrupted run had finished: its summary is the result.
      log.detail(f"sweep: trial {trial.number}: {trial_dir} already has summary.json")
      wall = float(trial.user_attrs.get("wall_s") or 0.0)
    else:
      os.makedirs(trial_dir, exist_ok=True)
      shared.link_ingest(where, trial_dir)
      args = [f"--config={sweep.base_file}", f"--workdir={trial_dir}",
              *spec.trial_flags(sweep, values, trial_wiring)]
      log.detail(f"sweep: trial {trial.number}: medjax " + " ".join(
          a for a in args if not a.startswith("--config.trial.storage")))
      try:
        outcome = process.run(args, os.path.join(trial_dir, "launcher.log"),
                              timeout_s=sweep.config.trials.timeout_s,
                              on_start=lambda pid: trial.set_user_attr("pid", pid))
      except KeyboardInterrupt:
        _queue_again(trial)  # Ctrl-C: interrupted like a killed sweep, so resumed like one
        raise
      wall = outcome.wall_s  # this attempt's (a resumed run's time before it is not known)
      trial.set_user_attr("wall_s", round(wall, 2))
      if outcome.returncode != 0:
        self._fail(trial, outcome.reason, wall)
    return self._result(trial, summary_path, wall)

  def _trial_dir(self, trial, retried: int | None) -> str:
    """A retry resumes in its interrupted trial's directory; a new trial gets a fresh one."""
    inherited = trial.user_attrs.get("workdir")
    if retried is not None and inherited:
      return os.path.join(self.where.workdir, inherited)
    trial_dir = self.where.trial(trial.number)
    if os.path.lexists(trial_dir):
      # Left by an earlier study in this workdir (its study.db deleted): not this trial's run.
      aside = os.path.join(self.where.set_aside,
                           f"{os.path.basename(trial_dir)}-{time.strftime('%Y%m%d-%H%M%S')}")
      os.makedirs(self.where.set_aside, exist_ok=True)
      shutil.move(trial_dir, aside)
      log.say(f"sweep: {trial_dir} existed before trial {trial.number} started (an earlier "
              f"study's?); moved to {aside}")
    return trial_dir

  def _result(self, trial, summary_path: str, wall: float) -> float:
    metric = self.sweep.metric
    try:
      with open(summary_path) as f:
        summary = json.load(f)
    except (OSError, ValueError) as e:
      self._fail(trial, f"the run ended without a readable summary.json ({type(e).__name__})",
                 wall)
    record = read_summary(summary, metric, self.sweep.epochs)
    for key, value in record.items():
      if key != "value":
        trial.set_user_attr(key, value)
    if record["value"] is None:
      have = sorted((summary.get("val") or {}).keys())
      self._fail(trial, f"summary.json has no val {metric!r} (it has {have}); set "
                        "config.study.metric to one of them", wall)
    if record["stopped"] == "pruned":
      trial.set_user_attr("pruned_at_epoch", record["epochs_run"])
      raise optuna.TrialPruned(f"pruned after {record['epochs_run']} epochs")
    return record["value"]

  def _fail(self, trial, reason: str, wall: float):
    trial.set_user_attr("fail_reason", reason)
    trial.set_user_attr("wall_s", round(wall, 2))
    raise TrialFailed(reason)

  # -- after each trial --------------------------------------------------------------------------

  def after_trial(self, study: optuna.Study, frozen: optuna.trial.FrozenTrial) -> None:
    line = trial_line(frozen, self.sweep)
    log.say(line)
    if frozen.state == optuna.trial.TrialState.FAIL:
      self.failures_in_a_row += 1
      launcher_log = os.path.join(frozen.user_attrs.get("workdir") or "", "launcher.log")
      self.last_failure = f"trial {frozen.number}: {frozen.user_attrs.get('fail_reason')}" + (
          f" (see {launcher_log})" if os.path.exists(os.path.join(self.where.workdir,
                                                                  launcher_log)) else "")
      if self.failures_in_a_row >= self.sweep.config.trials.max_failures_in_a_row:
        self.stopped_for_failures = True
        study.stop()
    else:
      self.failures_in_a_row = 0
    try:
      report.write(study, self.where, self.sweep)
    except Exception:  # pylint: disable=broad-except  # a report must not end the sweep
      logging.exception("sweep: writing the report failed; the sweep goes on")


def _queue_again(trial: optuna.trial.Trial) -> None:
  """What Optuna does for a trial whose heartbeat stopped: a waiting copy (values, run
  directory, reported epochs) that the next sweep process runs first."""
  storage = trial.study._storage  # pylint: disable=protected-access  # its retry callback
  retry = storage.get_heartbeat_stale_trial_callback()
  if retry is not None:
    retry(trial.study, studies.frozen(trial))
    log.say(f"sweep: trial {trial.number} interrupted; queued again (resume with the same "
            "command)")


def read_summary(summary: dict, metric: str, epochs: int) -> dict:
  """What a trial records from its run's summary.json."""
  value = (summary.get("val") or {}).get(metric)
  stopping = summary.get("early_stopping") or {}
  train = summary.get("train") or {}
  monitor = summary.get("monitor") or {}
  energy = monitor.get("energy_j")
  if not isinstance(energy, (int, float)) or isinstance(energy, bool):
    energy = monitor.get("energy") if isinstance(monitor.get("energy"), str) else "not measured"
  return {
      "value": float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None,
      "stopped": stopping.get("reason"),
      "epochs": int(train.get("epochs", epochs)),
      "epochs_run": int(stopping.get("epochs_run", train.get("epochs", epochs))),
      "best_epoch": stopping.get("best_epoch"),
      "steps": train.get("global_step"),
      "parameters": train.get("parameters"),
      "train_s": train.get("seconds"),
      "energy_j": energy,
  }


def trial_line(frozen: optuna.trial.FrozenTrial, sweep: spec.Sweep) -> str:
  """One plain line: number, result, epochs, size, elapsed, params."""
  a = frozen.user_attrs
  state = frozen.state
  params = _params_text({k: _decoded(sweep, k, v) for k, v in frozen.params.items()})
  retry = studies.retried_number(frozen)
  head = f"trial {frozen.number}" + (f" (retry of {retry})" if retry is not None else "")
  wall = f"{float(a.get('wall_s') or 0.0):.1f} s"
  if state == optuna.trial.TrialState.FAIL:
    return f"{head}: failed: {a.get('fail_reason') or 'interrupted'}; {wall} ({params})"
  size = f"{a['parameters'] / 1e6:.2f}M parameters" if a.get("parameters") else "? parameters"
  value = f"{frozen.value:.4f}" if frozen.value is not None else "?"
  what = ("pruned" if state == optuna.trial.TrialState.PRUNED else "complete")
  return (f"{head}: {what}, val {sweep.metric} {value}, {a.get('epochs_run', '?')}/"
          f"{a.get('epochs', sweep.epochs)} epochs, {size}, {wall} ({params})")


def _decoded(sweep: spec.Sweep, field: str, raw):
  try:
    return sweep.param(field).decode(raw)
  except (StopIteration, ValueError):
    return raw


def _params_text(params: dict) -> str:
  def show(v):
    return f"{v:.4g}" if isinstance(v, float) else str(v)
  return ", ".join(f"{k}={show(v)}" for k, v in params.items())


def _check_identity(sweep: spec.Sweep, where: layout_lib.SweepPaths) -> None:
  """A resumed sweep must be the same sweep (base, overrides, space, metric, study)."""
  os.makedirs(where.workdir, exist_ok=True)
  wanted = json.loads(json.dumps(sweep.identity()))
  if os.path.exists(where.identity):
    with open(where.identity) as f:
      made = json.load(f)
    if made != wanted:
      key = next(k for k in wanted if made.get(k) != wanted.get(k))
      raise errors.InputError(
          f"{where.workdir} holds another sweep (its {key} differs: {made.get(key)!r} vs "
          f"{wanted.get(key)!r}); give a new --workdir, or the same sweep config to resume it")
    return
  with open(where.identity, "w") as f:
    json.dump(wanted, f, indent=2)


def _quiet_optuna() -> None:
  """Optuna's own messages go to the sweep's log file only; the terminal gets one line a trial."""
  warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
  warnings.filterwarnings("ignore", category=FutureWarning, module="optuna")
  optuna.logging.disable_default_handler()
  logger = logging.getLogger("optuna")
  logger.propagate = False
  for handler in logging.getLogger().handlers:
    if isinstance(handler, logging.FileHandler):
      logger.addHandler(handler)

