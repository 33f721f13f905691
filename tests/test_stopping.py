"""Early stopping and the best checkpoint: the rule, its place in the lineage, real runs."""

import os

import pytest

from configs import quickstart
from medjax import lineage as lineage_lib
from medjax.checkpoint import retention
from medjax.train import loop
from medjax.train import stopping


def test_patience_counts_epochs_since_the_best_and_ties_do_not_improve():
  t = stopping.Tracker(patience=2)
  assert t.observe(0, 0.5, 10) == ""
  assert t.observe(1, 0.6, 20) == ""
  assert t.observe(2, 0.6, 30) == ""       # a tie is no improvement
  assert t.epochs_without_improvement == 1
  assert t.observe(3, 0.55, 40) == "patience"
  assert lineage_lib.best(t.validation) == (1, 0.6, 20)
  s = t.summary("macro_f1", epochs=10, evaluated_on="final")
  assert (s["reason"], s["best_epoch"], s["best_step"], s["epochs_run"]) == ("patience", 1, 20, 4)


def test_a_metric_that_does_not_apply_never_counts_as_best():
  t = stopping.Tracker(patience=0)
  t.observe(0, None, 10)
  t.observe(1, float("nan"), 20)
  assert lineage_lib.best(t.validation) is None and t.epochs_without_improvement == 2
  t.observe(2, 0.1, 30)
  assert lineage_lib.best_step(lineage_lib.Lineage.start(
      epoch=0, global_step=0, seed=0, placement="p", hosts=("h",), base_N=[False])) is None
  assert t.stopped == ""                    # patience 0: never stops


def test_a_re_observed_epoch_replaces_what_followed_it():
  # A restart resumed before epoch 1's checkpoint: epoch 1 is validated again.
  t = stopping.Tracker(patience=5, validation=((0, 0.4, 10), (1, 0.5, 20), (2, 0.3, 30)))
  t.observe(1, 0.45, 20)
  assert t.validation == ((0, 0.4, 10), (1, 0.45, 20))
  assert t.observe(2, 0.2, 30, pruned=True) == "pruned"


def test_the_history_travels_in_the_lineage_record():
  import numpy as np  # pylint: disable=import-outside-toplevel
  lin = lineage_lib.Lineage.start(epoch=0, global_step=0, seed=0, placement="p", hosts=("h",),
                                  base_N=np.zeros(4, bool))
  cursor = lineage_lib.Cursor(lin, 4)
  cursor.validation, cursor.stopped = ((0, 0.5, 3), (1, None, 6)), "patience"
  cursor.new_segment(epoch=2, placement="p", hosts=("h",), base_N=np.zeros(4, bool))
  record = cursor.lineage()
  again = lineage_lib.Lineage.from_dict(record.to_dict())
  assert again == record and again.validation == ((0, 0.5, 3), (1, None, 6))
  assert again.stopped == "patience" and lineage_lib.best_step(again) == 3
  # Records written before early stopping existed have no history.
  old = record.to_dict()
  del old["validation"], old["stopped"]
  assert lineage_lib.Lineage.from_dict(old).validation == ()
  with pytest.raises(lineage_lib.LineageError, match="validation"):
    lineage_lib.Lineage.from_dict({**record.to_dict(), "validation": [[0, "x", 3]]})


def test_retention_keeps_the_best_checkpoint(tmp_path):
  for step in (3, 6, 9, 12):
    os.makedirs(tmp_path / str(step))
  assert retention.prune(str(tmp_path), [3, 6, 9, 12], 1, also_keep=(3,)) == [6, 9]
  assert sorted(os.listdir(tmp_path)) == ["12", "3"]


@pytest.fixture(scope="module")
def cohort(tmp_path_factory):
  base = tmp_path_factory.mktemp("stopping")
  from medjax.data import synthetic  # pylint: disable=import-outside-toplevel
  synthetic.generate(quickstart.get_config("tiny").data.synthetic, str(base / "cohort"))
  return base


def _config(cohort, **overrides):
  config = quickstart.get_config("tiny")
  config.data.root = str(cohort / "cohort")
  config.data.salt_file = str(cohort / "id_salt")
  config.evals.bootstrap = 0
  # A learning rate this small changes no prediction: validation never improves after epoch 0.
  config.optim.lr = 1e-9
  config.optim.warmup_fraction = 0.0
  for key, value in overrides.items():
    section, field = key.split("__")
    config[section][field] = value
  return config


def test_a_run_stops_after_patience_tests_the_best_checkpoint_and_stays_stopped(cohort):
  workdir = str(cohort / "patience")
  config = _config(cohort, optim__epochs=6, optim__early_stopping_patience=2,
                   ckpt__keep_best=True, ckpt__max_to_keep=1)
  summary = loop.train_and_evaluate(config, workdir)
  early = summary["early_stopping"]
  assert (early["reason"], early["epochs_run"], early["best_epoch"]) == ("patience", 3, 0)
  steps_per_epoch = early["history"][0]["step"]
  assert summary["train"]["global_step"] == 3 * steps_per_epoch   # stopped at an epoch end
  assert early["evaluated_on"] == f"best (epoch 0, step {steps_per_epoch})"
  # Retention kept the best checkpoint beside the newest one.
  steps = retention.step_dirs(os.path.join(workdir, "checkpoints"))
  assert steps == [steps_per_epoch, 3 * steps_per_epoch]
  # Validation rows in metrics.jsonl, one per epoch run.
  from medjax.train import writers  # pylint: disable=import-outside-toplevel
  val = [r for r in writers.read_metrics(workdir) if r["kind"] == "val"]
  assert [r["epoch"] for r in val] == [0, 1, 2]
  # Started again (a restart after the stop): it does not train again.
  again = loop.train_and_evaluate(config, workdir)
  assert again["train"]["steps_executed_this_process"] == 0
  assert again["early_stopping"]["reason"] == "patience"
  assert again["test"]["accuracy"] == summary["test"]["accuracy"]


def test_a_resumed_run_keeps_its_best_so_far_and_patience(cohort):
  workdir = str(cohort / "resume")
  first = loop.train_and_evaluate(_config(cohort, optim__epochs=2,
                                          optim__early_stopping_patience=3), workdir)
  assert first["early_stopping"]["reason"] is None
  assert first["early_stopping"]["epochs_run"] == 2
  # Resumed for more epochs: the history goes on (one epoch without improvement so far), so
  # it stops after epoch 3, not after epoch 5 as a forgotten history would.
  resumed = loop.train_and_evaluate(_config(cohort, optim__epochs=8,
                                            optim__early_stopping_patience=3), workdir)
  early = resumed["early_stopping"]
  assert (early["reason"], early["epochs_run"], early["best_epoch"]) == ("patience", 4, 0)
  assert [h["epoch"] for h in early["history"]] == [0, 1, 2, 3]
  assert early["evaluated_on"] == "final"   # no keep_best
