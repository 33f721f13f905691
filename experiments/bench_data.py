"""Data-layer benchmark, measured side by side in one run; writes experiments/results/bench_data.json.

  python -m experiments.bench_data [--patients 300] [--batches 20]

1. Batch reads from the decoded cache vs decoding the same records from DICOM (target: >= 10x);
   the cache fill's records/s decoded in one process and on every core (`cache.fill`).
2. Header-scan throughput (files/s), serial and with one process per core.
3. Placing a paper-scale manifest (53,420 records, sampled without pixels) over 16 hosts
   (target: < 2 s), with its balance and the records moved when one host leaves.
"""

import argparse
import json
import os
import tempfile
import time

import numpy as np

from configs import default as default_config
from medjax.data import cache as cache_lib
from medjax.data import ingest
from medjax.data import records
from medjax.data import synthetic
from medjax.data.cache import fill as fill_lib
from medjax.data.cache import placement
from medjax.data.dicom import scan as dicom_scan


def bench_cache(tmp: str, patients: int, batches: int, batch_size: int) -> dict:
  config = default_config.get_config()
  config.data.synthetic.num_patients = patients
  config.data.synthetic.junk_files = 0
  root = os.path.join(tmp, "cohort")
  synthetic.generate(config.data.synthetic, root)
  result = ingest.run(config, os.path.join(tmp, "work"), root)
  shapes = records.shapes_for(config.data, result.tables)
  cache = cache_lib.Cache(os.path.join(tmp, "cache"), result.manifest, result.tables, shapes,
                          root)
  rows = np.arange(len(result.manifest))
  t0 = time.perf_counter()
  cache.ensure(rows, processes=1)
  fill_s = time.perf_counter() - t0
  # The same fill on every core (`medjax.data.cache.fill`), into a second cache.
  cores = os.cpu_count() or 1
  pooled = cache_lib.Cache(os.path.join(tmp, "cache_pooled"), result.manifest, result.tables,
                           shapes, root, fill_processes=cores)
  t0 = time.perf_counter()
  pooled.ensure(rows)
  pooled_s = time.perf_counter() - t0
  fill = {"records": len(rows), "one_process_s": round(fill_s, 3),
          "one_process_records_per_s": round(len(rows) / fill_s, 1),
          "processes": cores if len(rows) >= fill_lib.MIN_RECORDS else 1,
          "all_cores_s": round(pooled_s, 3),
          "all_cores_records_per_s": round(len(rows) / pooled_s, 1),
          "speedup": round(fill_s / pooled_s, 3)}
  rng = np.random.default_rng(0)
  picks = [rng.choice(rows, batch_size, replace=False) for _ in range(batches)]
  cache.read(picks[0])  # warm up TensorStore's thread pool
  t0 = time.perf_counter()
  for p in picks:
    cache.read(p)
  cache_s = (time.perf_counter() - t0) / batches
  t0 = time.perf_counter()
  for p in picks:
    records.stack([records.decode(result.manifest, int(r), result.tables, root, shapes)[0]
                   for r in p])
  decode_s = (time.perf_counter() - t0) / batches
  images = int(sum(result.manifest.num_images[p].sum() for p in picks))
  return {"patients": patients, "batch_size": batch_size, "batches": batches,
          "images_in_batches": images, "cache_fill_s": round(fill_s, 3),
          "cache_batch_ms": round(cache_s * 1e3, 3), "decode_batch_ms": round(decode_s * 1e3, 3),
          "cache_speedup": round(decode_s / cache_s, 2), "target_speedup": 10.0,
          "cache_counters": cache.counters, "fill": fill}, root


def bench_scan(root: str) -> dict:
  dicom_root = os.path.join(root, "dicom")
  out = {}
  for name, workers in (("serial", 1), ("parallel", os.cpu_count() or 1)):
    t0 = time.perf_counter()
    accepted, rejected = dicom_scan.scan_dicom(dicom_root, workers)
    dt = time.perf_counter() - t0
    n = len(accepted) + len(rejected)
    out[name] = {"workers": workers, "files": n, "seconds": round(dt, 3),
                 "files_per_s": round(n / dt, 1)}
  return out


def bench_placement(num_patients: int, num_hosts: int) -> dict:
  t0 = time.perf_counter()
  manifest = synthetic.manifest_without_pixels(num_patients)
  sample_s = time.perf_counter() - t0
  hosts = [f"host-{i}" for i in range(num_hosts)]
  times = []
  for _ in range(3):
    t0 = time.perf_counter()
    full = placement.place(manifest, hosts, seed=0)
    times.append(time.perf_counter() - t0)
  stats = placement.load_stats(full, manifest)
  t0 = time.perf_counter()
  shrunk = placement.replace_hosts(full, manifest, hosts[:5] + hosts[6:], seed=0)
  replace_s = time.perf_counter() - t0
  moved = placement.moved(full, shrunk)
  return {"records": len(manifest), "hosts": num_hosts, "sample_cohort_s": round(sample_s, 3),
          "place_s_median": round(float(np.median(times)), 4), "target_place_s": 2.0,
          "replace_hosts_s": round(replace_s, 4),
          "cost_max_over_mean": stats["cost_max_over_mean"],
          "count_max_over_mean": stats["count_max_over_mean"],
          "moved_fraction_one_host_left": round(float(moved.mean()), 5),
          "ideal_fraction": round(1 / num_hosts, 5),
          "only_departed_host_moved": bool(np.all(full.owner_N[moved] == 5))}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--patients", type=int, default=300)
  parser.add_argument("--batches", type=int, default=20)
  parser.add_argument("--batch-size", type=int, default=32)
  parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results",
                                                    "bench_data.json"))
  args = parser.parse_args()
  with tempfile.TemporaryDirectory() as tmp:
    cache_result, root = bench_cache(tmp, args.patients, args.batches, args.batch_size)
    scan_result = bench_scan(root)
  result = {"cache_vs_decode": cache_result, "header_scan": scan_result,
            "placement": bench_placement(53420, 16)}
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(result, f, indent=2, default=float)
  c, p = result["cache_vs_decode"], result["placement"]
  print(f"cache batch {c['cache_batch_ms']} ms vs decode {c['decode_batch_ms']} ms: "
        f"{c['cache_speedup']}x (target >= 10x)")
  f = c["fill"]
  print(f"cache fill of {f['records']} records: {f['one_process_records_per_s']} records/s in "
        f"one process, {f['all_cores_records_per_s']} with {f['processes']}: {f['speedup']}x")
  for name, s in scan_result.items():
    print(f"header scan {name}: {s['files_per_s']} files/s ({s['files']} files)")
  print(f"placement of {p['records']} records over {p['hosts']} hosts: {p['place_s_median']} s "
        f"(target < 2 s); cost max/mean {p['cost_max_over_mean']:.4f}; one host leaving moves "
        f"{p['moved_fraction_one_host_left']:.4f} (ideal {p['ideal_fraction']:.4f})")
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
