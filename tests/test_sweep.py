"""Sweeps: the sweep config and its search space, the trial's Reporter against a real SQLite
study, stale and dead trials queued again, and one real sweep (launch.py processes) that ingests
once, prunes, survives a trial killed with SIGKILL, and resumes after the sweep itself is killed.
"""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time

import ml_collections
import optuna
import psutil
import pytest

from configs import sweep as sweep_config
from medjax import errors
from medjax import paths
from medjax.sweep import layout
from medjax.sweep import runner
from medjax.sweep import spec
from medjax.sweep import studies
from medjax.sweep import trial as trial_lib
from tests import runs

TINY = "configs/sweep.py:tiny"


def _tiny(**study):
  config = sweep_config.get_config("tiny")
  config.study.update(study)
  return config


def _refused(config) -> str:
  with pytest.raises(errors.InputError) as e:
    spec.load(config)
  return str(e.value)


# -- the sweep config --------------------------------------------------------------------------

def test_sweep_configs_load_with_their_base(tmp_path):
  full = spec.load(sweep_config.get_config())
  assert full.base.data.synthetic.num_patients == 6000 and full.base.ckpt.keep_best
  assert {p.field for p in full.params} >= {"optim.lr", "model.d_model", "model.image_channels",
                                            "model.fusion", "model.fusion_layers",
                                            "model.missing", "model.modality_dropout",
                                            "data.batch_size", "optim.grad_accum"}
  tiny = spec.load(_tiny())
  assert tiny.epochs == 3 and tiny.base.data.synthetic.num_patients == 300
  assert tiny.base_file.endswith("configs/quickstart.py:tiny") and os.path.isabs(tiny.base_file)
  assert spec.eval_splits(tiny.base) == ("val", "test")   # the tiny base evaluates test only
  tables = sweep_config.get_config("tables")
  (tmp_path / "labels.csv").write_text("patient_id,diagnosis\n")
  tables.overrides.data.root = str(tmp_path)
  tables = spec.load(tables)
  assert tables.base.data.root == str(tmp_path) and tables.metric == "auroc_macro"
  assert {p.field for p in tables.params} >= {"model.labs_bins", "model.labs_embed_width",
                                              "optim.ema_epochs"}


def test_fields_that_shape_the_shared_ingest_cannot_be_searched():
  config = _tiny()
  config.space.data = ml_collections.ConfigDict({"image_size": ("categorical", 16, 32)})
  text = _refused(config)
  assert "config.space.data.image_size" in text and "every trial shares" in text
  assert "config.overrides" in text    # where such a field belongs instead
  config = _tiny()
  config.space.data = ml_collections.ConfigDict({"batch_size": ("categorical", 8, 16)})
  assert spec.load(config).param("data.batch_size").choices == (8, 16)   # runtime: fine


@pytest.mark.parametrize("field,entry,expected", [
    ("model", {"d_modle": ("categorical", 32, 64)}, "did you mean model.d_model"),
    ("optim", {"lr": ("loguniform", 0.0, 1e-2)}, "log-uniform range needs low > 0"),
    ("optim", {"lr": ("uniform", 1e-2, 1e-3)}, "must be below high"),
    ("optim", {"lr": ("normal", 1e-3, 1e-2)}, "unknown kind 'normal'"),
    ("model", {"d_model": ("uniform", 32.0, 64.0)}, "needs a float field"),
    ("model", {"fusion": ("categorical", "attention", 3)}, "not a value of the field's type"),
    ("model", {"d_model": ("categorical", 30, 64)}, "the value 30 is refused"),  # heads=4
    ("trial", {"number": ("int", 0, 3)}, "the sweep sets it"),
])
def test_bad_search_space_entries_are_one_line_errors(field, entry, expected):
  config = _tiny()
  config.space[field] = ml_collections.ConfigDict(entry)
  text = _refused(config)
  assert expected in text and "\n" not in text


def test_sweep_config_fields_are_checked():
  config = _tiny()
  config.pruner.kind = "median"
  assert "config.pruner.kind='median'" in _refused(config)
  config = _tiny()
  config.trials.grace_s = 1
  assert "must exceed heartbeat_s" in _refused(config)
  config = _tiny()
  config.base = "configs/nope.py"
  assert "no such file" in _refused(config)
  config = _tiny()
  config.overrides.data = ml_collections.ConfigDict({"split": (0.8, 0.0, 0.2)})
  assert "validation fraction is 0" in _refused(config)
  config = _tiny()
  config.space = ml_collections.ConfigDict({"optim": {"lr": ()}})   # () drops a field
  assert "no field is searched" in _refused(config)


def test_trial_flags_build_the_config_the_trial_checks():
  sweep = spec.load(sweep_config.get_config())
  values = {"optim.lr": 1.5e-3, "model.image_channels": (16, 32), "model.fusion": "gated",
            "data.batch_size": 64, "model.modality_dropout": 0.25}
  wiring = {"data.root": "/sweep/data/cohort", "trial.storage": "sqlite:////sweep/study.db",
            "trial.study": "sweep", "trial.number": 7, "evals.splits": ("val", "test")}
  expected = spec.trial_config(sweep, values, wiring)
  # launch.py's own flag parsing (ml_collections config_flags), in a process of its own.
  code = ("import sys; from absl import flags; from ml_collections import config_flags; "
          "c = config_flags.DEFINE_config_file('config', lock_config=True); "
          "flags.FLAGS(sys.argv); print(c.value.to_json(sort_keys=True))")
  argv = [sys.executable, "-c", code, f"--config={sweep.base_file}",
          *spec.trial_flags(sweep, values, wiring)]
  out = subprocess.run(argv, cwd=runs.ROOT, capture_output=True, text=True, check=True).stdout
  assert json.loads(out) == json.loads(expected.to_json(sort_keys=True))
  assert expected.model.image_channels == (16, 32) and expected.trial.number == 7


# -- the trial's side: Reporter against a real SQLite study -------------------------------------

def _study(tmp_path, pruner: dict, **storage):
  url = f"sqlite:///{tmp_path}/study.db"
  study = optuna.create_study(storage=studies.open_storage(url, **storage), study_name="s",
                              direction="maximize")
  study.set_user_attr(studies.PRUNER_ATTR, pruner)
  return url, study


def _trial_config(url: str, number: int):
  config = ml_collections.ConfigDict()
  config.trial = ml_collections.ConfigDict({"storage": url, "study": "s", "number": number})
  return config


def test_reporter_reports_each_epoch_and_relays_asha(tmp_path):
  # Steps are epochs trained: with min_resource 2 the first rung is after the second epoch.
  asha = {"kind": "asha", "min_resource": 2, "reduction_factor": 2, "max_resource": 3}
  url, study = _study(tmp_path, asha)
  assert trial_lib.reporter(_trial_config("", 0)) is None        # not a trial
  first, second = study.ask(), study.ask()
  good = trial_lib.reporter(_trial_config(url, first.number))
  assert [good.report(e, v) for e, v in enumerate([0.3, 0.6, 0.7])] == [False] * 3
  study.tell(first, 0.7)
  bad = trial_lib.reporter(_trial_config(url, second.number))
  assert bad.report(0, 0.1) is False          # one epoch trained: before the first rung
  assert bad.report(1, 0.2) is True           # two: at the rung, below the only other trial
  stored = study.trials
  assert stored[0].intermediate_values == {1: 0.3, 2: 0.6, 3: 0.7}
  assert stored[1].intermediate_values == {1: 0.1, 2: 0.2}
  # The same epoch reported again (a resumed run) keeps the first value.
  bad.report(1, 0.9)
  assert study.trials[1].intermediate_values[2] == 0.2
  # A trial the study no longer waits for (failed elsewhere) is told to stop.
  study.tell(second, state=optuna.trial.TrialState.FAIL)
  assert bad.report(2, 0.3) is True


def test_pruners_a_trial_rebuilds_from_the_study():
  spec_of = lambda kind: studies.pruner_spec(_tiny(), 3) | {"kind": kind}
  assert isinstance(studies.make_pruner(spec_of("asha")), optuna.pruners.SuccessiveHalvingPruner)
  hyperband = studies.make_pruner(spec_of("hyperband"))
  assert isinstance(hyperband, optuna.pruners.HyperbandPruner)
  assert hyperband._max_resource == 3   # pylint: disable=protected-access  # the base's epochs
  assert isinstance(studies.make_pruner(spec_of("none")), optuna.pruners.NopPruner)
  assert isinstance(studies.make_pruner(None), optuna.pruners.NopPruner)  # a study not ours


def test_reporter_without_a_pruner_never_prunes_and_refuses_unknown_trials(tmp_path):
  url, study = _study(tmp_path, {"kind": "none"})
  t = study.ask()
  r = trial_lib.reporter(_trial_config(url, t.number))
  assert not any(r.report(e, 0.0) for e in range(4))
  with pytest.raises(errors.InputError, match="has no such trial"):
    trial_lib.reporter(_trial_config(url, 99))
  bad = _trial_config(url, 0)
  bad.trial.study = "nope"
  with pytest.raises(errors.InputError, match="no such study"):
    trial_lib.reporter(bad)


# Outside Study.optimize on purpose (the sweep's optimize loop is the slow test's).
@pytest.mark.filterwarnings("ignore:Heartbeat of storage",
                            "ignore::optuna.exceptions.ExperimentalWarning")
def test_a_stale_trial_is_failed_and_queued_again_with_its_values(tmp_path):
  url, study = _study(tmp_path, {"kind": "none"}, heartbeat_s=1, grace_s=2, max_retry=1)
  t = study.ask({"optim.lr": optuna.distributions.FloatDistribution(1e-4, 1e-2, log=True)})
  t.report(0.25, 0)
  study._storage.record_heartbeat(t._trial_id)  # pylint: disable=protected-access
  time.sleep(3.2)
  optuna.storages.fail_stale_trials(study)
  old, retry = study.trials
  assert old.state == optuna.trial.TrialState.FAIL
  assert retry.state == optuna.trial.TrialState.WAITING and retry.params == old.params
  assert studies.retried_number(retry) == old.number and retry.intermediate_values == {0: 0.25}


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")
def test_a_trial_of_a_dead_sweep_process_here_is_queued_again_at_once(tmp_path):
  url, study = _study(tmp_path, {"kind": "none"}, heartbeat_s=30, grace_s=60, max_retry=1)
  gone = subprocess.Popen([sys.executable, "-c", "pass"])
  gone.wait()
  alive, dead = study.ask(), study.ask()
  studies.claim(alive)   # this process: alive
  dead.set_user_attr(studies.OWNER_ATTR, {"host": socket.gethostname(), "pid": gone.pid,
                                          "started": 0.0, "trial": dead.number})
  assert studies.fail_dead_local_trials(study) == [dead.number]
  states = [t.state for t in study.trials]
  assert states == [optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.FAIL,
                    optuna.trial.TrialState.WAITING]


def test_a_combination_the_checker_refuses_fails_its_trial_without_a_run(tmp_path):
  config = _tiny()
  # Each value alone is fine on the base (36 % 4 heads, 64 % 8); together 36 % 8 is not.
  config.space = ml_collections.ConfigDict({"model": {"d_model": ("categorical", 36),
                                                      "heads": ("categorical", 8)}})
  sweep = spec.load(config)
  where = layout.SweepPaths(str(tmp_path))
  url, study = _study(tmp_path, {"kind": "none"})
  run = runner._Runner(sweep, where, {}, url)  # pylint: disable=protected-access
  study.optimize(run.objective, n_trials=1, catch=(runner.TrialFailed,))
  (failed,) = study.trials
  assert failed.state == optuna.trial.TrialState.FAIL
  assert failed.user_attrs["fail_reason"].startswith("config: config.model.heads=8: does not "
                                                     "divide config.model.d_model=36")
  assert not os.path.exists(where.trial(0))          # nothing was started


def test_summary_fields_a_trial_records():
  summary = {"val": {"macro_f1": 0.4}, "train": {"parameters": 1234, "global_step": 30,
                                                 "epochs": 3},
             "early_stopping": {"reason": "pruned", "epochs_run": 2, "best_epoch": 1},
             "monitor": {"energy_j": None, "energy": "not measured: no RAPL or NVML"}}
  got = runner.read_summary(summary, "macro_f1", 3)
  assert (got["value"], got["stopped"], got["epochs_run"], got["parameters"], got["steps"]) == (
      0.4, "pruned", 2, 1234, 30)
  assert got["energy_j"] == "not measured: no RAPL or NVML"
  assert runner.read_summary({"val": {}, "monitor": {"energy_j": 12.5}}, "macro_f1",
                             3)["energy_j"] == 12.5


# -- one real sweep ------------------------------------------------------------------------------

def _launch(workdir, *flags, log="sweep.log"):
  os.makedirs(workdir, exist_ok=True)
  out = open(os.path.join(workdir, log), "w")
  return subprocess.Popen([sys.executable, runs.LAUNCH, f"--config={TINY}", f"--workdir={workdir}",
                           "--config.space.model.d_model=()", "--config.space.model.fusion=()",
                           "--config.space.optim.lr=('loguniform', 1e-6, 1e-2)", *flags],
                          cwd=runs.ROOT, env=runs.env(), stdout=out, stderr=subprocess.STDOUT,
                          start_new_session=True)


def _trials(url):
  try:
    return optuna.load_study(study_name="sweep", storage=url).trials
  except Exception:  # pylint: disable=broad-except  # not created yet, or locked for a moment
    return []


def _running(url, number):
  trials = _trials(url)
  t = trials[number] if len(trials) > number else None
  return t if t is not None and t.state == optuna.trial.TrialState.RUNNING else None


def _processes_in(path: str) -> list[int]:
  found = []
  for p in psutil.process_iter(["pid", "cmdline"]):
    if any(path in part for part in (p.info["cmdline"] or [])):
      found.append(p.info["pid"])
  return found


@pytest.mark.slow
def test_sweep_ingests_once_prunes_survives_a_killed_trial_and_resumes(tmp_path):
  workdir = str(tmp_path / "sweep")
  os.makedirs(workdir)
  url = f"sqlite:///{workdir}/study.db"
  # The first points, fixed so the run is the same every time: a good rate, one whose trial is
  # killed (out of memory, as the kernel would), one interrupted by killing the sweep, and a rate
  # too small to learn anything, which ASHA prunes.
  study = optuna.create_study(storage=url, study_name="sweep", direction="maximize")
  for lr in (3e-3, 2e-3, 1e-3, 1e-6):
    study.enqueue_trial({"optim.lr": lr})
  # Thirty epochs, judged from the third on: trial 2's run must still be going when the sweep is
  # killed after its first epoch, or nothing is left to resume (a tiny epoch takes ~0.2 s).
  judge_late = ("--config.pruner.min_resource=3", "--config.overrides.optim.epochs=30")
  sweep = _launch(workdir, *judge_late)
  try:
    # Trial 1: its launch.py SIGKILLed; the sweep records it failed and goes on.
    t1 = runs.wait_for(lambda: (t := _running(url, 1)) and t.user_attrs.get("pid") and t, 240,
                       "trial 1 to start")
    time.sleep(3)
    os.kill(t1.user_attrs["pid"], signal.SIGKILL)
    # Trial 2: the sweep itself SIGKILLed once the trial has reported an epoch. Its processes
    # are frozen (SIGSTOP) the moment its metrics file shows the first validation (written
    # just after the report reached the study): the study's database, polled, answered up to
    # ten epochs late, and ASHA can stop trial 2 at its first rung before the kill.
    runs.wait_for(lambda: (t := _running(url, 2)) and t.user_attrs.get("pid"), 240,
                  "trial 2 to start")
    trial_dir = os.path.join(workdir, "trials", "trial-0002")
    metrics = paths.RunPaths(trial_dir).metrics
    runs.wait_for(lambda: os.path.exists(metrics) and os.path.getsize(metrics), 240,
                  "trial 2 to train")
    pids = _processes_in(trial_dir)   # its workers are up once it trains
    runs.wait_for(lambda: '"kind": "val"' in open(metrics).read(), 240,
                  "trial 2 to report an epoch", poll=0.01)
    for pid in pids + _processes_in(trial_dir):   # frozen where it is
      with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGSTOP)
    assert _running(url, 2).intermediate_values
    os.kill(sweep.pid, signal.SIGKILL)
    sweep.wait()
    assert not os.path.exists(os.path.join(trial_dir, "summary.json")), (
        "trial 2's run finished before the sweep was killed: nothing to resume")
    runs.wait_for(lambda: not _processes_in(trial_dir), 20,
                  "trial 2's processes to die with the sweep")
    assert _running(url, 2)   # as a killed process leaves it
    resumed = _launch(workdir, *judge_late, log="resumed.log")
    assert resumed.wait(timeout=400) == 0, runs.tail(workdir, "resumed.log")
  finally:
    for proc in (sweep, locals().get("resumed")):
      if proc is not None and proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)

  trials = _trials(url)
  by_lr = {}
  for t in trials:
    by_lr.setdefault(t.params["optim.lr"], []).append(t)
  states = {t.number: t.state.name for t in trials}
  S = optuna.trial.TrialState
  finished = [t for t in trials if t.state in (S.COMPLETE, S.PRUNED)]
  assert len(finished) == 3, states                        # n_trials, over both sweep processes
  # Trial 0 finished in the first sweep process and was kept, not run again.
  assert trials[0].state == S.COMPLETE and trials[0].params["optim.lr"] == 3e-3
  log0 = open(os.path.join(workdir, "trials", "trial-0000", "log.txt")).read()
  assert log0.count("mode train") == 1
  # Trial 1: failed with its reason; never retried (a crash is not an interruption).
  assert trials[1].state == S.FAIL and len(by_lr[2e-3]) == 1
  assert "killed by SIGKILL" in trials[1].user_attrs["fail_reason"]
  # Trial 2: interrupted, queued again, and resumed in its own directory to the end.
  assert trials[2].state == S.FAIL and "fail_reason" not in trials[2].user_attrs
  retry = next(t for t in by_lr[1e-3] if t.number != 2)
  assert studies.retried_number(retry) == 2 and retry.state in (S.COMPLETE, S.PRUNED)
  assert retry.user_attrs["workdir"] == "trials/trial-0002"
  assert 1 in retry.intermediate_values                    # the epoch reported before the kill
  log2 = open(os.path.join(workdir, "trials", "trial-0002", "log.txt")).read()
  assert log2.count("mode train") == 2
  # The rate that learns nothing: pruned by ASHA at its first rung, its run stopped early.
  (dud,) = by_lr[1e-6]
  assert dud.state == S.PRUNED, states
  dud_summary = runs.summary(os.path.join(workdir, dud.user_attrs["workdir"]))
  assert dud_summary["early_stopping"]["reason"] == "pruned"
  assert dud.user_attrs["epochs_run"] == dud_summary["early_stopping"]["epochs_run"] < 10
  for t in finished:
    assert t.user_attrs["parameters"] > 0 and t.user_attrs["wall_s"] > 0
    assert t.user_attrs["energy_j"]                        # joules, or why not measured

  # One ingest, in the sweep's data/, reused by every trial (none has a cohort or ingest of its
  # own); the second sweep process reused it too.
  first, second = (open(os.path.join(workdir, n)).read() for n in ("sweep.log", "resumed.log"))
  assert "ingesting the base config once" in first and "ingest: reusing" in second
  assert "ingesting" not in second
  for t in trials:
    if t.user_attrs.get("workdir"):
      d = os.path.join(workdir, t.user_attrs["workdir"])
      assert os.path.islink(os.path.join(d, "ingest")) and not os.path.exists(
          os.path.join(d, "cohort"))
      assert "ingest: reusing" in open(os.path.join(d, "log.txt")).read()
  # One plain line per trial, and the report.
  assert "trial 1: failed: killed by SIGKILL" in first and "trial 1:" not in second
  assert "(retry of 2)" in second
  rows = open(os.path.join(workdir, "trials.csv")).read().splitlines()
  assert len(rows) == 1 + len(trials) and rows[0].startswith("number,state,value,epochs_run")
  md = open(os.path.join(workdir, "trials.md")).read()
  assert "| 1 | failed |" in md and "killed by SIGKILL" in md and "retried as trial" in md
  assert "pruned" in md and "optuna-dashboard sqlite:///" in md
  for name in ("optimization_history", "metric_vs_size", "intermediate_values"):
    assert os.path.getsize(os.path.join(workdir, f"{name}.png")) > 1000, name
  assert ("param_importances.png`: Optuna's" in md) == os.path.exists(
      os.path.join(workdir, "param_importances.png"))
