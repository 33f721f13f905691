"""Validation at each epoch end: early stopping, the best checkpoint, a sweep's pruner.

When any of config.optim.early_stopping_patience, config.ckpt.keep_best or a sweep trial
(config.trial.storage) asks for it, the trainer evaluates the validation split at each epoch end
and `Tracker.observe`s config.evals.validation_metric (higher is better). The history lives in
the lineage (`Lineage.validation`, `Lineage.stopped`), saved with each checkpoint: a run
restarted after a failure goes on with its best-so-far and its patience counter, and a run that
stopped early and failed afterwards does not train again.

Stops ('patience' or 'pruned') happen at an epoch end, after that epoch's checkpoint: training
never stops inside a partition. With ckpt.keep_best the test split is evaluated on the
checkpoint of the best epoch, which retention keeps (`best_step`).
"""

from __future__ import annotations

import dataclasses
import logging
import math

import jax
import numpy as np

from medjax import lineage as lineage_lib
from medjax.evals import metrics as metrics_lib
from medjax.evals import splits
from medjax.lineage import best
from medjax.train import step as step_lib

def wanted(config) -> bool:
  """Whether the run evaluates the validation split at each epoch end."""
  return bool(config.optim.early_stopping_patience or config.ckpt.keep_best
              or config.trial.storage)


@dataclasses.dataclass
class Tracker:
  """The validation history and the stopping rule.

  Attributes:
    patience: epochs without improvement before stopping (0: never).
    validation: ((epoch, value or None, global step after the epoch), ...), oldest first.
    stopped: '' while training goes on, else why it stopped ('patience', 'pruned').
  """
  patience: int
  validation: tuple = ()
  stopped: str = ""

  @property
  def epochs_without_improvement(self) -> int:
    top = best(self.validation)
    if top is None:
      return len(self.validation)
    return sum(1 for e in self.validation if e[0] > top[0])

  def observe(self, epoch: int, value: float | None, step: int, *, pruned: bool = False) -> str:
    """Adds `epoch`'s value; returns why training stops now ('' : it goes on)."""
    if value is not None and not math.isfinite(value):
      value = None
    self.validation = tuple(e for e in self.validation if e[0] < epoch) + (
        (int(epoch), None if value is None else float(value), int(step)),)
    if pruned:
      self.stopped = "pruned"
    elif self.patience and self.epochs_without_improvement >= self.patience:
      self.stopped = "patience"
    return self.stopped

  def summary(self, metric: str, *, epochs: int, evaluated_on: str) -> dict:
    top = best(self.validation)
    return {"metric": metric, "reason": self.stopped or None, "patience": self.patience,
            "epochs_run": len(self.validation), "epochs_configured": epochs,
            "best_epoch": None if top is None else top[0],
            "best_value": None if top is None else top[1],
            "best_step": None if top is None else top[2],
            "evaluated_on": evaluated_on,
            "history": [{"epoch": e, "value": v, "step": s} for e, v, s in self.validation]}


def validation_value(metrics: dict, metric: str) -> float | None:
  """`metric` from one split's metrics (None when it does not apply to these records)."""
  value = metrics.get(metric)
  return None if value is None or (isinstance(value, float) and np.isnan(value)) else float(value)


def log_epoch(tracker: Tracker, epoch: int, metric: str) -> None:
  value = tracker.validation[-1][1] if tracker.validation else None
  top = best(tracker.validation)
  logging.info("epoch %d: validation %s %s (best %s at epoch %s; %d epoch(s) without "
               "improvement)%s", epoch, metric, "n/a" if value is None else f"{value:.4f}",
               "n/a" if top is None else f"{top[1]:.4f}", "-" if top is None else top[0],
               tracker.epochs_without_improvement,
               f"; stopping: {tracker.stopped}" if tracker.stopped else "")


class Validator:
  """The trainer's epoch-end validation (`wanted(config)`): predicts the validation split with
  the current state, observes the metric, asks a sweep's pruner, and keeps the history in the
  cursor (so the epoch's checkpoint carries it).

  Args:
    prepared: the trainer's `loop.Prepared` (model, mesh, data, reader).
    ctx: the fault-tolerance context (the phase is 'validating' meanwhile: fixed timeouts).
    writer: the run's MetricWriter (rows of kind 'val' in metrics.jsonl and TensorBoard).
    is_chief: only process 0 reports to the sweep's study; the others follow its decision.
    make_trial: `make_trial(config)` gives the reporter of a run that is a sweep's trial
      (`report(epoch, value)` -> whether the pruner stops it; `medjax.sweep.trial.reporter`),
      or None; asked on process 0 when config.trial.storage is set. None: no sweep.
  """

  def __init__(self, prepared, ctx, writer, *, is_chief: bool, make_trial=None):
    self.p, self.ctx, self.writer, self.is_chief = prepared, ctx, writer, is_chief
    config = prepared.config
    self.metric = config.evals.validation_metric
    self.patience = int(config.optim.early_stopping_patience)
    self.keep_best = bool(config.ckpt.keep_best)
    manifest = prepared.data.manifest
    self.rows = manifest.indices("val")
    self.rare = metrics_lib.rare_classes(manifest.labels[manifest.indices("train")],
                                         len(manifest.class_names))
    self._predict = None
    self.trial = None
    if config.trial.storage and is_chief and make_trial is not None:
      self.trial = make_trial(config)
    self.evaluated_on = "final"

  def epoch_end(self, state, cursor: lineage_lib.Cursor) -> None:
    """Validates the epoch that just ended (`cursor` is at the next epoch's start)."""
    p, epoch = self.p, cursor.epoch - 1
    if any(e[0] == epoch for e in cursor.validation):
      return   # validated before a restart that resumed exactly here
    phase = self.ctx.phase
    self.ctx.set_phase("validating")
    if self._predict is None:
      self._predict = step_lib.make_predict_step(p.built.graphdef, p.built, p.mesh)
    probs = splits.predict(self._predict, state, p.reader, p.data.placement, self.rows,
                           host_batch=p.data.host_batch, sharding=p.batch_sharding,
                           global_batch=p.config.data.batch_size, seed=p.config.seed)
    manifest = p.data.manifest
    metrics = metrics_lib.classification(
        probs.reshape(len(self.rows), len(manifest.class_names)), manifest.labels[self.rows],
        self.rare)
    value = validation_value(metrics, self.metric)
    pruned = False
    if self.trial is not None:
      pruned = bool(self.trial.report(epoch, value))
    if jax.process_count() > 1:   # the chief asked the study; every process follows it
      from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
      pruned = bool(multihost_utils.broadcast_one_to_all(np.int32(pruned)))
    tracker = Tracker(self.patience, cursor.validation, cursor.stopped)
    tracker.observe(epoch, value, cursor.global_step, pruned=pruned)
    cursor.validation, cursor.stopped = tracker.validation, tracker.stopped
    if self.writer is not None:
      self.writer.write(cursor.global_step, {
          "epoch": epoch, self.metric: value, "accuracy": metrics["accuracy"],
          "macro_f1": metrics["macro_f1"]}, kind="val")
    if self.is_chief:
      log_epoch(tracker, epoch, self.metric)
    self.ctx.set_phase(phase)

  def state_to_test(self, state, cursor: lineage_lib.Cursor, ckpt):
    """The state the test split is evaluated on: with ckpt.keep_best, the best epoch's
    checkpoint (restored on every process); else the final one."""
    top = best(cursor.validation)
    if not self.keep_best or top is None:
      return state
    epoch, _, step = top
    if step == cursor.global_step:
      self.evaluated_on = f"best (epoch {epoch}, the last)"
      return state
    ckpt.reload()
    if step not in ckpt.steps():
      logging.warning("the best checkpoint (epoch %d, step %d) is not in %s; testing the final "
                      "state instead", epoch, step, ckpt.directory)
      self.evaluated_on = f"final (best checkpoint, step {step}, missing)"
      return state
    restored = ckpt.restore(step, self.p.built.abstract)
    logging.info("testing the best checkpoint: epoch %d, step %d", epoch, step)
    self.evaluated_on = f"best (epoch {epoch}, step {step})"
    return restored

  def summary(self, cursor: lineage_lib.Cursor) -> dict:
    tracker = Tracker(self.patience, cursor.validation, cursor.stopped)
    return tracker.summary(self.metric, epochs=self.p.config.optim.epochs,
                           evaluated_on=self.evaluated_on)
