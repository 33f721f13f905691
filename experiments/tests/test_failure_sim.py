"""experiments/failure_sim: the failure-and-checkpoint simulator's behaviour (not timings)."""

import dataclasses
import json
import math
import os

import numpy as np
import pytest

from experiments import failure_sim as fs

COSTS = fs.Costs(checkpoint_s=1.0, detect_s={k: 10.0 for k in fs.KINDS}, recover_s={"x": 20.0},
                 recovery_path="x", name="test")
# 5 epochs x 4 partitions x 10 steps of 10 s: 200 steps, 2,000 s failure-free.
JOB = fs.Job(step_s=10.0, partition_steps=10, partitions_per_epoch=4, epochs=5, name="test")
CRASHES = fs.FailureRate("crashes", accelerator_mtbf_h=1.0, mix={"crash": 1.0}, source="test",
                         mix_source="test")


def crash(step, kind="crash", down=(10.0, 20.0)):
  return fs.MeasuredFailure(kind, step, *down)


def test_young_daly_interval():
  assert fs.young_daly_interval(2.0, 100.0) == pytest.approx(20.0)          # sqrt(2 C M)
  # Daly: sqrt(2CM) (1 + sqrt(C/2M)/3 + (C/2M)/9) - C, here C/2M = 0.01.
  assert fs.young_daly_interval(2.0, 100.0, order=2) == pytest.approx(
      20 * (1 + 0.1 / 3 + 0.01 / 9) - 2)
  assert fs.young_daly_interval(300.0, 100.0, order=2) == 100.0               # C >= 2M: M
  assert fs.young_daly_interval(0.0, 100.0) == 0.0
  assert fs.young_daly_interval(2.0, math.inf) == math.inf
  # The young_daly schedule saves every round(tau / step_s) steps: tau = sqrt(2 x 1 x 5000) = 100.
  steps = fs.checkpoint_steps(fs.Strategy("young_daly"), JOB, 1.0, 1 / 5000)
  assert steps[:3].tolist() == [10, 20, 30] and steps[-1] == 200


def test_schedules():
  lineage_k = fs.checkpoint_steps(fs.Strategy("lineage", every_k=4), JOB, 1.0, 0.0)
  assert lineage_k[:6].tolist() == [4, 8, 10, 12, 16, 20]
  assert fs.checkpoint_steps(fs.Strategy("epoch"), JOB, 1.0, 0.0).tolist() == [40, 80, 120,
                                                                                160, 200]
  assert fs.checkpoint_steps(fs.Strategy("none"), JOB, 1.0, 0.0).tolist() == [200]
  # Every 25 s of 10 s steps: the first step boundary at or after 25 s, i.e. every 3 steps.
  time_ = fs.checkpoint_steps(fs.Strategy("time", interval_s=25), JOB, 1.0, 0.0)
  assert time_[:2].tolist() == [3, 6] and time_[-1] == 200
  with pytest.raises(ValueError, match="interval_s"):
    fs.Strategy("time")
  with pytest.raises(ValueError, match="one of"):
    fs.Strategy("sometimes")


def test_timeline():
  tl = fs.Timeline(np.array([10, 20]), 10.0, 1.0)
  s = np.arange(21)
  assert (tl.steps_done(tl.step_end(s)) == s).all()
  assert tl.tau(10) == 101 and tl.step_end(11) == 111 and tl.tau(20) == 202
  assert tl.committed(np.array([100.5, 101.0, 201.9])).tolist() == [0, 10, 10]
  assert tl.steps_done(100.5) == 10          # inside the save after step 10
  assert tl.saving(np.array([100.5, 150.0, 202.0])).tolist() == [0.5, 1.0, 2.0]


def test_replay_async_writes_commit_one_after_another():
  # Saves after steps 10, 20 and 30 (10 s steps, 1 s blocking) of a 40-step job, a crash after
  # step 25 (t = 252 s). With 25 s writes the save after step 20 (written 202-227) is committed:
  # 5 steps lost. With 150 s writes on one saver thread the first is written 101-251 and the
  # second waits for it (251-401): 15 lost. Per-save times: 10 s then 100 s: the second is
  # written 202-302, 15 lost; 100 s then 10 s: 101-201 and 202-212, 5 lost.
  job = fs.Job(10.0, 10, 4, 1)
  lost = lambda w: fs.replay(job, fs.Strategy("lineage"), 1.0, [crash(25)], w)["steps_wasted"]
  assert [lost(0.0), lost(25.0), lost(150.0)] == [5, 5, 15]
  assert lost([10.0, 100.0, 1.0, 1.0]) == 15 and lost([100.0, 10.0, 1.0, 1.0]) == 5
  # A restart empties the saver's queue: restored at step 10, the next generation writes its
  # save after step 20 from 202 to 352 (not after the lost generation's write, to 401), so a
  # crash after step 35 (t = 353) finds it committed: 15 + 15 lost.
  r = fs.replay(job, fs.Strategy("lineage"), 1.0, [crash(25), crash(35)], 150.0)
  assert r["steps_wasted"] == 15 + 15
def test_replay_waste_is_the_steps_since_the_last_save():
  # Partition boundaries every 10 steps: a crash after step 15 loses 5 steps, a hang after
  # step 47 loses 7, and a preemption after step 120 saves there and loses none.
  failures = [crash(15), crash(47, "hang"), crash(120, "preemption")]
  r = fs.replay(JOB, fs.Strategy("lineage"), 1.0, failures)
  assert r["steps_wasted"] == 12 and r["steps_executed"] == 212
  # Saves taken: 10 | 20, 30, 40 | 50 ... 110 and the preemption's at 120 | 130 ... 200.
  assert r["saves"] == 1 + 3 + 8 + 8
  assert r["wall_s"] == pytest.approx(212 * 10 + 20 * 1 + 3 * 30)
  assert r["waste_fraction"] == pytest.approx(12 / 212)
  # The same failures under epoch checkpoints (every 40 steps; no save on preemption).
  r = fs.replay(JOB, fs.Strategy("epoch"), 1.0, failures)
  # A fault fires after its step and before that step's save (as medjax's injector does), so
  # the preemption after step 120, an epoch end, loses the epoch back to step 80.
  assert r["steps_wasted"] == 15 + 7 + 40
  r = fs.replay(JOB, fs.Strategy("epoch"), 1.0, [crash(15), crash(47), crash(121, "preemption")])
  assert r["steps_wasted"] == 15 + 7 + 1
  r = fs.replay(JOB, fs.Strategy("none"), 1.0, [crash(15), crash(47)])
  assert r["steps_wasted"] == 15 + 47 and r["steps_executed"] == 262


def hand_measured(waste_scale=1.0, wall_scale=1.0) -> fs.Measured:
  job = dataclasses.replace(JOB, every_k=4)
  failures = (crash(15), crash(47, "hang", (5.0, 1.0)), crash(120, "preemption", (0.5, 2.0)))
  # Every 4 steps and at partition ends: 15 -> 12 (3 lost), 47 -> 44 (3 lost): 6 of 206. No
  # save is taken twice, and the preemption's save after step 120 is the scheduled one.
  saves = len(fs.checkpoint_steps(fs.Strategy("lineage", every_k=4), job, 1.0, 0.0))
  wall = 206 * 10 + saves * 1.0 + 30 + 6 + 2.5
  return fs.Measured(job, 1.0, failures, 206, 6 / 206 * waste_scale, wall * wall_scale)


def test_validate_on_a_hand_built_run():
  v = fs.validate(hand_measured())
  assert v["simulated"]["steps_wasted"] == 6 and v["simulated"]["steps_executed"] == 206
  assert v["relative_error"]["waste_fraction"] == pytest.approx(0.0)
  assert v["relative_error"]["wall_s"] == pytest.approx(0.0)
  assert all(v["within_tolerance"].values())
  v = fs.validate(hand_measured(waste_scale=1.1, wall_scale=0.7))
  assert v["within_tolerance"]["waste_fraction"] and not v["within_tolerance"]["wall_s"]
  assert v["relative_error"]["wall_s"] == pytest.approx(1 / 0.7 - 1)
  # With the model's costs instead of each failure's own: every failure costs 10 + 20 s.
  v = fs.validate(hand_measured(), costs=COSTS)
  assert v["simulated"]["wall_s"] == pytest.approx(hand_measured().wall_s - 38.5 + 90)
  # With measured write times the replay draws each save's from them: instant ones give the
  # same numbers; writes longer than a save's interval half the time lose more on average.
  v = fs.validate(dataclasses.replace(hand_measured(), write_samples=(0.0,)), draws=5)
  assert v["simulated"]["steps_wasted"] == 6 and v["simulated_p10_p90"]["steps_wasted"] == [6, 6]
  v = fs.validate(dataclasses.replace(hand_measured(), write_samples=(0.0, 45.0)), draws=200)
  low, high = v["simulated_p10_p90"]["steps_wasted"]
  assert 6 == low < v["simulated"]["steps_wasted"] < high


def test_simulate_is_deterministic_for_a_seed():
  kw = dict(workers=4, trials=50)
  a = fs.simulate(JOB, COSTS, CRASHES, fs.Strategy("lineage"), seed=3, **kw).as_dict()
  assert a == fs.simulate(JOB, COSTS, CRASHES, fs.Strategy("lineage"), seed=3, **kw).as_dict()
  b = fs.simulate(JOB, COSTS, CRASHES, fs.Strategy("lineage"), seed=4, **kw).as_dict()
  assert a["time_h"] != b["time_h"] and a["method"] == "monte_carlo" and a["failures"] > 1


def test_monte_carlo_agrees_with_the_closed_form():
  # About 2 failures per run; without preemption saves the closed form is exact.
  for strategy in (fs.Strategy("lineage"), fs.Strategy("epoch"), fs.Strategy("none")):
    r = fs.simulate(JOB, COSTS, CRASHES, strategy, workers=1, trials=2000, seed=0)
    assert r.method == "monte_carlo"
    assert r.time_h == pytest.approx(r.analytic_time_h, rel=0.05), strategy


@pytest.fixture(scope="module")
def at_scale():
  job = fs.Job.paper_scale()
  return {r.strategy + f"@{r.workers}": r for r in fs.sweep(
      job, COSTS, fs.RATES["llama3"], fs.default_strategies(job), (4, 256, 16384), trials=100)}


def test_restarting_from_zero_wastes_more_with_workers_and_most_at_scale(at_scale):
  waste = [at_scale[f"none@{w}"].waste_fraction for w in (4, 256, 16384)]
  assert waste[0] < waste[1] < waste[2]
  failures = [at_scale[f"none@{w}"].failures for w in (4, 256)]
  assert failures[0] < failures[1]
  for name in ("epoch", "time 30m", "lineage", "young_daly"):
    assert at_scale["none@16384"].waste_fraction > at_scale[f"{name}@16384"].waste_fraction
    assert at_scale["none@16384"].goodput < at_scale[f"{name}@16384"].goodput


def test_lineage_and_young_daly_beat_epoch_checkpoints_at_scale(at_scale):
  epoch = at_scale["epoch@16384"]
  for name in ("lineage", "young_daly"):
    assert at_scale[f"{name}@16384"].goodput > epoch.goodput
    assert at_scale[f"{name}@16384"].time_h < epoch.time_h
  # With the job's MTBF far above its length nothing matters much.
  assert abs(at_scale["lineage@4"].goodput - at_scale["epoch@4"].goodput) < 0.01


def test_cost_scales_with_accelerator_hours():
  never = dataclasses.replace(CRASHES, accelerator_mtbf_h=1e15)
  one = fs.simulate(JOB, COSTS, never, fs.Strategy("lineage"), 16, trials=5, price=2.0)
  assert one.accelerator_hours == pytest.approx(16 * one.time_h)
  assert one.cost_usd == pytest.approx(2.0 * one.accelerator_hours)
  eight = fs.simulate(JOB, COSTS, never, fs.Strategy("lineage"), 16, trials=5, price=2.0,
                      accelerators_per_worker=8)
  assert eight.accelerators == 128 and eight.cost_usd == pytest.approx(8 * one.cost_usd)
  pricier = fs.simulate(JOB, COSTS, never, fs.Strategy("lineage"), 16, trials=5, price=6.0)
  assert pricier.cost_usd == pytest.approx(3 * one.cost_usd)
  # Failure-free: the time is the steps plus the saves.
  assert one.time_h * 3600 == pytest.approx(JOB.clean_s + 20 * 1.0)


def test_unfinishable_runs_fall_back_to_the_closed_form():
  r = fs.simulate(fs.Job.paper_scale(), COSTS, fs.RATES["lineage_paper"], fs.Strategy("none"),
                  16384, trials=10)
  assert r.method == "analytic" and not r.finishes and r.goodput < 1e-6
  assert json.dumps(r.as_dict())   # no NaN or Infinity in the JSON


def write_results(d) -> None:
  """bench_fault.json and recovery.json in the shapes the benchmarks write (trimmed)."""
  bench = {"overhead": {"none": {"train_s": 58.0, "checkpoint_blocked_s": 0.2, "steps": 660},
                        "partition": {"train_s": 60.0, "checkpoint_blocked_s": 0.58,
                                      "steps": 660, "checkpoint_blocking_fraction": 0.01}},
           "failures": {"faults": "kill@step=495:process=1; sigstop@step=990:process=0; "
                                  "sigterm@partition=2:process=1",
                        "steps": 1980, "steps_executed": 2010, "waste_fraction": 0.015,
                        "clean_train_s": 160.0, "clean_launch_s": 200.0,
                        "faulty_launch_s": 260.0,
                        "failures": [{"kind": "crash", "step": 485, "detected_s": 0.1,
                                      "recovered_s": 14.0},
                                     {"kind": "hang", "step": 975, "detected_s": 9.0,
                                      "recovered_s": 18.0},
                                     {"kind": "preemption", "step": 70, "detected_s": 0.2,
                                      "recovered_s": 15.0}]}}
  recovery = {"cpus": 2, "failures": [{"layout": "auto", "failures": [
      {"kind": "crash", "detected_s": 0.3, "recovered_s": 0.7,
       "recovery": {"path": "warm_standby"}},
      {"kind": "hang", "detected_s": 5.0, "recovered_s": 0.9,
       "recovery": {"path": "warm_standby"}},
      {"kind": "sigterm", "detected_s": 0.4, "recovered_s": None,
       "recovery": {"path": "unknown"}}]}]}
  for name, obj in (("bench_fault.json", bench), ("recovery.json", recovery)):
    with open(os.path.join(d, name), "w") as f:
      json.dump(obj, f)


def test_loaders(tmp_path):
  write_results(tmp_path)
  costs = fs.load_costs(str(tmp_path), recovery_path="warm_standby")
  assert costs.checkpoint_s == pytest.approx((0.58 - 0.2) / 19)    # 20 partition saves vs 1
  assert costs.detect_s["crash"] == pytest.approx(0.2) and costs.detect_s["hang"] == 7.0
  assert costs.recover_s == {"warm_standby": pytest.approx(0.8)}
  assert costs.sources["detect_s.crash"].startswith("measured on a 2-core CPU machine")
  assert costs.sources["detect_s.host_lost"].startswith("assumption")
  with pytest.raises(ValueError, match="'standby' was never measured"):
    fs.load_costs(str(tmp_path), recovery_path="standby")
  # Where the benchmark counted the saves (bench_fault.py since it records them), those count,
  # not one per configured partition length (the quickstart's partitions changed size).
  bench = json.load(open(tmp_path / "bench_fault.json"))
  bench["overhead"]["none"]["checkpoints"], bench["overhead"]["partition"]["checkpoints"] = 1, 39
  json.dump(bench, open(tmp_path / "bench_fault.json", "w"))
  costs = fs.load_costs(str(tmp_path), recovery_path="warm_standby")
  assert costs.checkpoint_s == pytest.approx((0.58 - 0.2) / 38)
  # Saves that blocked less than the noise between the two runs cost nothing, and Young's
  # interval for free saves is 0: no partition is "longer" than it.
  bench["overhead"]["partition"]["checkpoint_blocked_s"] = 0.1
  json.dump(bench, open(tmp_path / "bench_fault.json", "w"))
  free = fs.load_costs(str(tmp_path), recovery_path="warm_standby")
  assert free.checkpoint_s == 0.0
  (row,) = fs.intervals(free, CRASHES, [JOB], workers=[4])
  assert row["young_s"] == 0.0 and row["test"]["partition_over_young"] is None
  bench["overhead"]["partition"]["checkpoint_blocked_s"] = 0.58
  json.dump(bench, open(tmp_path / "bench_fault.json", "w"))
  m = fs.measured_from_bench_fault(str(tmp_path / "bench_fault.json"))
  # Steps from the injected faults (partition=2 fires before partition 2: after step 66).
  assert [(f.kind, f.step) for f in m.failures] == [("crash", 495), ("hang", 990),
                                                    ("preemption", 66)]
  assert m.wall_s == pytest.approx(260 - (200 - 160))
  assert m.job.step_s == pytest.approx(160 * 0.99 / 1980) and m.job.every_k == 25
  broken = json.load(open(tmp_path / "bench_fault.json"))
  del broken["failures"]["clean_train_s"]
  json.dump(broken, open(tmp_path / "bench_fault.json", "w"))
  with pytest.raises(ValueError, match="no clean_train_s"):
    fs.measured_from_bench_fault(str(tmp_path / "bench_fault.json"))


def test_measured_from_workdir(tmp_path):
  """A workdir as a supervised run leaves it: the replay matches its numbers."""
  job = fs.Job(0.1, 10, 2, 3, every_k=4)   # 60 steps
  failures = [crash(15, down=(0.5, 2.0)), crash(33, "preemption", (0.2, 1.5))]
  sim = fs.replay(job, fs.Strategy("lineage", every_k=4), 0.01, failures)
  summary = {"fault_tolerance": {
      "failures": [{"kind": "crash", "step": 14, "detected_s": 0.5, "recovered_s": 2.0},
                   {"kind": "preemption", "step": 33, "detected_s": 0.2, "recovered_s": 1.5}],
      "steps_executed": sim["steps_executed"], "steps_committed": 60,
      "waste_fraction": sim["waste_fraction"],
      "generations": {"1": {"executed": 15, "training_s": 1.5, "blocked_s": 0.04},
                      "2": {"executed": 48, "training_s": 4.8, "blocked_s": 0.14}}}}
  config = {"optim": {"epochs": 3}, "data": {"num_partitions": 2},
            "ckpt": {"every_steps": 4, "partition_boundaries": True},
            "fault": {"inject": "kill@step=15:process=0"}}
  events = [{"time": 100.0, "event": "first_step"},
            {"time": 101.6, "event": "failure", "kind": "crash", "step": 14,
             "fault": "0-kill@step=15:process=0"},
            {"time": 104.0, "event": "first_step"},
            {"time": 106.0, "event": "failure", "kind": "preemption", "step": 33, "fault": None},
            {"time": 100.0 + sim["wall_s"], "event": "done"}]
  for name, obj in (("summary.json", summary), ("config.json", config)):
    with open(tmp_path / name, "w") as f:
      json.dump(obj, f)
  with open(tmp_path / "events.jsonl", "w") as f:
    f.write("\n".join(map(json.dumps, events)) + "\n")
  m = fs.measured_from_workdir(str(tmp_path), step_s=0.1, checkpoint_s=0.01)
  assert [(f.kind, f.step) for f in m.failures] == [("crash", 15), ("preemption", 33)]
  assert m.write_s == 0.0
  v = fs.validate(m)
  assert v["relative_error"]["wall_s"] == pytest.approx(0.0, abs=1e-9)
  assert v["relative_error"]["waste_fraction"] == pytest.approx(0.0)
  # A summary with the ledger's steps replays at those (not the faults' nor the reported), with
  # the run's async write time.
  summary["fault_tolerance"]["failures"][0]["last_step"] = 17
  summary["fault_tolerance"]["failures"][1]["last_step"] = 34
  summary["fault_tolerance"]["checkpoint_write_s"] = 0.5
  with open(tmp_path / "summary.json", "w") as f:
    json.dump(summary, f)
  m = fs.measured_from_workdir(str(tmp_path), step_s=0.1, checkpoint_s=0.01)
  assert [(f.kind, f.step) for f in m.failures] == [("crash", 17), ("preemption", 34)]
  assert m.write_s == 0.5 and "ledger" in m.sources["failures"]
  # Saves (after steps 4, 8, 10, 12, 16) come every 0.2-0.4 s and each write takes 0.5 s on
  # one thread: they fall behind, and at step 17's end (1.75 s) only those after steps 4 and 8
  # (committed at 0.91 s and 1.41 s) are: 9 steps lost, where instant commits lose 1.
  assert fs.validate(m)["simulated"]["steps_wasted"] == 17 - 8
  m0 = dataclasses.replace(m, write_s=0.0)
  assert fs.validate(m0)["simulated"]["steps_wasted"] == 17 - 16


def test_main_writes_labelled_results(tmp_path):
  results, out = tmp_path / "results", tmp_path / "out"
  results.mkdir()
  write_results(results)
  recovery = json.load(open(results / "recovery.json"))
  recovery["failures"][0]["failures"][0]["recovery"]["path"] = "standby"
  json.dump(recovery, open(results / "recovery.json", "w"))
  result = fs.main(["--trials", "5", "--workers", "4,16384", "--results", str(results),
                    "--out", str(out)])
  names = sorted(os.listdir(out))
  assert names == ["failure_sim.json", "failure_sim.md", "failure_sim_goodput.png",
                   "failure_sim_waste.png"]
  saved = json.load(open(out / "failure_sim.json"))
  assert saved["sweep"]["medjax"]["llama3"][0]["strategy"] == "none"
  assert {r["workers"] for r in saved["sweep"]["paper"]["lineage_paper"]} == {4, 16384}
  assert all(s.startswith(("measured on", "published:", "assumption"))
             for c in saved["inputs"]["costs"].values() for s in c["sources"].values())
  assert all(r["source"].startswith("published:") for r in saved["inputs"]["rates"].values())
  assert saved["validation"]["within_tolerance"]["steps_executed"] is True
  md = open(out / "failure_sim.md").read()
  assert "simulated" in md and "Llama 3" in md and "Table VI" in md and "leaves out" in md
  assert result["config"]["price"] == pytest.approx(3.06, abs=0.005)


def test_a_failure_throws_away_the_step_in_flight():
  # A save after every 10 s step, 1 s each: a failure lands in a step 10 times in 11 and then
  # throws that one step away (medjax counts a dispatched step as executed).
  r = fs.simulate(JOB, COSTS, CRASHES, fs.Strategy("time", interval_s=10), 4, trials=2000)
  assert r.strategy == "time 10s"
  wasted = r.failures * 10 / 11
  assert r.failures > 1
  assert r.waste_fraction == pytest.approx(wasted / (JOB.steps + wasted), rel=0.1)
