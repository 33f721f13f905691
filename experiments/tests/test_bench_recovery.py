"""experiments/bench_recovery.py's bookkeeping (no runs): carrying other parts' newest results
forward, and the overhead ratio's bootstrap interval and table."""

from experiments import bench_recovery


def test_a_benchmark_run_of_some_parts_keeps_the_newest_of_the_others_on_top():
  previous = {"started": "t1", "overhead": {"wall_ratio": 1.04},
              "overhead_whole": {"wall_ratio": 1.01},
              "failures": [{"layout": "auto", "n": 1}, {"layout": "2", "n": 1}],
              "carried": {"failures.2": "t0"}}
  result = {"started": "t2", "failures": [{"layout": "auto", "n": 2}]}
  bench_recovery.carry_forward(result, previous)
  assert result["overhead"] == {"wall_ratio": 1.04}
  assert result["overhead_whole"] == {"wall_ratio": 1.01}
  assert result["failures"] == [{"layout": "auto", "n": 2}, {"layout": "2", "n": 1}]
  assert result["carried"] == {"overhead": "t1", "overhead_whole": "t1", "failures.2": "t0"}


def test_the_overhead_ratio_comes_with_an_interval_that_widens_with_the_rounds_spread():
  same = {"train_s": 5.0, "accuracy": 0.8, "macro_f1": 0.7}
  runs = {"unsupervised": [{"wall_s": 10.0, **same}] * 4,
          "supervised": [{"wall_s": w, **same} for w in (10.2, 10.4, 10.3, 10.5)]}
  out = bench_recovery._compared(runs, "unsupervised", "supervised")  # pylint: disable=protected-access
  assert out["round_wall_ratios"] == [1.02, 1.04, 1.03, 1.05]
  low, high = out["median_round_wall_ratio_ci90"]
  assert low <= out["median_round_wall_ratio"] == 1.035 <= high
  assert 1.02 <= low and high <= 1.05
  assert out["median_round_train_ratio_ci90"] == [1.0, 1.0]   # no spread, no width
  spread = bench_recovery._median_ci([0.9, 1.0, 1.1, 1.2])  # pylint: disable=protected-access
  assert spread[1] - spread[0] > high - low
  out["same_accuracy"] = True
  text = bench_recovery.table({"overhead": out, "overhead_whole": out})
  assert text.count("(median 1.035, 90% interval") == 2 and "run (whole runs)" in text
