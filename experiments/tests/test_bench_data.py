"""bench_data runs where a GPU is lent, unattended (`experiments/gpu_checks.sh`'s startup stage):
its paper-config fill and its CPU probe must work before they get there."""

import json
import subprocess
import sys

from experiments import bench_data


def test_the_paper_config_fill_reports_both_rates_and_the_writing_processs_share(tmp_path):
  out = tmp_path / "bench_data.json"
  subprocess.run([sys.executable, "-m", "experiments.bench_data", "--config", "paper",
                  "--patients", "40", "--batches", "2", "--batch-size", "8",
                  "--one-process-records", "12", "--pool-rounds", "1", "--out", str(out)],
                 check=True, timeout=300)
  result = json.loads(out.read_text())
  cache = result["cache_vs_decode"]
  assert result["config"] == "paper"
  assert (cache["image_size"], cache["file_image_size"]) == (64, 128)
  fill = cache["fill"]
  assert fill["records"] == 40 and fill["one_process_records"] == 12
  assert fill["one_process_records_per_s"] > 0 and fill["all_cores_records_per_s"] > 0
  assert fill["main_cpu_ms_per_record"] > 0 and fill["main_bound_records_per_s"] > 0
  assert cache["cache_counters"]["records_written"] == 40   # the cache the reads came from
  start = result["pool_start"]
  assert start["processes"] >= 1 and start["rounds"] == 1
  for side in ("preloaded", "plain"):
    assert start[side]["wall_s"] > 0 and start[side]["cpu_s"] > 0


def test_the_cpu_probe_counts_the_cores_processes_get():
  cpus = bench_data.bench_cpus(seconds=0.2)
  assert cpus["cpu_count"] >= cpus["affinity"] >= 1
  # A ratio of rates: its size depends on what else the machine runs (CI ran other tests beside
  # it and measured 3.27 on 2 cores), so only that it was measured is checked here.
  assert cpus["cores_busy_at_once"] > 0
