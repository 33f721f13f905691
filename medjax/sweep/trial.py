"""A run that is one trial of a sweep: report the validation metric each epoch, ask to prune.

The trainer's chief process, when `config.trial.storage` is set:

  reporter = trial.reporter(config)          # None when the run is not a trial
  ...at each epoch end:
  if reporter is not None and reporter.report(epoch, value):
    ...stop training early (pruned), then evaluate and write summary.json as usual

The pruner is the sweep's (ASHA, Hyperband or none), rebuilt from the study's user attrs
(`studies.PRUNER_ATTR`), so the decision is the one the sweep process would make.
"""

from __future__ import annotations

import logging
import math
import warnings

from medjax import errors


def reporter(config) -> "Reporter | None":
  """The run's Reporter, or None when config.trial.storage is '' (not a trial)."""
  if not config.trial.storage:
    return None
  return Reporter(config.trial.storage, config.trial.study, config.trial.number)


class Reporter:
  """Reports one trial's intermediate values and relays the pruner's verdict.

  A value's step is the number of epochs trained (1 after the first epoch), so the pruner's
  resources are epochs: `pruner.min_resource=2` judges a trial after its second epoch.
  """

  def __init__(self, storage: str, study: str, number: int):
    import optuna  # pylint: disable=import-outside-toplevel  # only trials pay for the import
    from medjax.sweep import studies  # pylint: disable=import-outside-toplevel

    self._optuna = optuna
    self.number = number
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    shown = studies.shown_url(storage)
    rdb = studies.open_storage(storage)
    try:
      loaded = optuna.load_study(study_name=study, storage=rdb,
                                 sampler=optuna.samplers.RandomSampler())
    except KeyError as e:
      raise errors.InputError(f"config.trial.study={study!r}: no such study in {shown}; a trial's "
                              "config.trial.* fields are set by the sweep (configs/sweep.py), "
                              "not by hand") from e
    loaded.pruner = studies.make_pruner(loaded.user_attrs.get(studies.PRUNER_ATTR))
    self.study = loaded
    try:
      self._trial_id = rdb.get_trial_id_from_study_id_trial_number(
          rdb.get_study_id_from_name(study), number)
    except KeyError as e:
      raise errors.InputError(f"config.trial.number={number}: study {study!r} in {shown} has no "
                              "such trial; a trial's config.trial.* fields are set by the sweep, "
                              "not by hand") from e

  def report(self, epoch: int, value: float) -> bool:
    """Records `value`, the validation metric after epoch `epoch` (0-based), at step `epoch + 1`;
    True when the pruner says stop.

    True also when the study no longer waits for this trial (it was finished elsewhere: its sweep
    process was lost and the trial failed and queued again). A storage that cannot be reached
    costs this epoch's report (logged), never the run.
    """
    optuna = self._optuna
    try:
      trial = optuna.trial.Trial(self.study, self._trial_id)
      with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a step already reported (a resumed run) is kept as is
        trial.report(float(value) if math.isfinite(value) else float("nan"), int(epoch) + 1)
      return bool(trial.should_prune())
    except optuna.exceptions.UpdateFinishedTrialError:
      logging.warning("trial %d is already finished in the study (its sweep process was lost?); "
                      "stopping this run", self.number)
      return True
    except Exception as e:  # pylint: disable=broad-except  # database down, locked, network
      logging.warning("trial %d: could not report epoch %d to the study (%s: %s); training goes "
                      "on", self.number, epoch, type(e).__name__, " ".join(str(e).split())[:200])
      return False
