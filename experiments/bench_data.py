"""Data-layer benchmark, measured side by side in one run; writes experiments/results/bench_data.json.

  python -m experiments.bench_data [--config default|paper] [--patients 300] [--batches 20]
      [--one-process-records N] [--pool-processes N] [--pool-rounds 3]

1. Batch reads from the decoded cache vs decoding the same records from DICOM (target: >= 10x);
   the cache fill's records/s decoded in one process (the first N records, all by default) and
   on every core (`cache.fill`, all records into a second cache). Of the fill on every core, the
   writing process's CPU seconds per record (its threads included: TensorStore's writes, the
   pool's result handling) bound the fill at `main_bound_records_per_s` however many cores
   decode. `--config paper`: the paper's images (128 px in the files, 64 px cached; issue 33's
   target is 1,500 records/s on a 16-core host).
2. Header-scan throughput (files/s), serial and with one process per core.
3. Placing a paper-scale manifest (53,420 records, sampled without pixels) over 16 hosts
   (target: < 2 s), with its balance and the records moved when one host leaves.
4. The host's CPUs as processes see them: the cores, the affinity mask, the cgroup's quota, and
   how many cores a pure-Python loop in one process per core gets at once (a quota or a shared
   host shows here, and caps every "on every core" figure above).
5. A data pool's start (`--pool-processes`, one per core by default), each process importing
   the decoding code as a fill's first job does: forked from the forkserver that imported it
   once (`medjax.data.pools`) against a plain forkserver, alternated, each in a fresh
   interpreter: wall seconds until every process answered, and the pool's CPU seconds.
6. The fill on `--simulate-processes` decoding processes (16 by default, issue 33's GPU host)
   that use no CPU: each job sleeps the one-process fill's measured decode time a record, then
   returns a record decoded once beforehand. On a host with fewer cores, this shows whether the
   fill's pipeline, its pool's start and its writing process keep that many decoding processes
   busy: records/s against the ideal, that many processes decoding without a pause.
"""

import argparse
import concurrent.futures
import functools
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time

import numpy as np

from configs import default as default_config
from configs import paper as paper_config
from medjax.data import cache as cache_lib
from medjax.data import ingest
from medjax.data import pools
from medjax.data import records
from medjax.data import synthetic
from medjax.data.cache import fill as fill_lib
from medjax.data.cache import placement
from medjax.data.dicom import scan as dicom_scan


def bench_cache(tmp: str, config, patients: int, batches: int, batch_size: int,
                one_process_records: int | None = None) -> dict:
  config.data.synthetic.num_patients = patients
  config.data.synthetic.junk_files = 0
  root = os.path.join(tmp, "cohort")
  synthetic.generate(config.data.synthetic, root)
  result = ingest.run(config, os.path.join(tmp, "work"), root)
  shapes = records.shapes_for(config.data, result.tables)
  rows = np.arange(len(result.manifest))
  # The fill on every core (`medjax.data.cache.fill`) first, in a process that has decoded
  # nothing yet, as a worker's first fill is (a one-process fill before it raised the writing
  # process's CPU a record by half, on 2 cores).
  cores = pools.cores()
  pooled = cache_lib.Cache(os.path.join(tmp, "cache_pooled"), result.manifest, result.tables,
                           shapes, root, fill_processes=cores)
  t0, cpu0 = time.perf_counter(), time.process_time()
  pooled.ensure(rows)
  pooled_s, main_cpu_s = time.perf_counter() - t0, time.process_time() - cpu0
  # Then the first records in this process alone, into a second cache.
  first = rows[:one_process_records or len(rows)]
  alone = cache_lib.Cache(os.path.join(tmp, "cache_alone"), result.manifest, result.tables,
                          shapes, root)
  t0 = time.perf_counter()
  alone.ensure(first, processes=1)
  fill_s = time.perf_counter() - t0
  one_rate, all_rate = len(first) / fill_s, len(rows) / pooled_s
  fill = {"records": len(rows), "one_process_records": len(first),
          "one_process_s": round(fill_s, 3), "one_process_records_per_s": round(one_rate, 1),
          "processes": cores if len(rows) >= fill_lib.MIN_RECORDS else 1,
          "all_cores_s": round(pooled_s, 3), "all_cores_records_per_s": round(all_rate, 1),
          "speedup": round(all_rate / one_rate, 3),
          "one_process_decode_ms_per_record": round(
              1e3 * alone.counters["decode_s"] / max(alone.counters["pfs_reads"], 1), 3),
          "main_cpu_ms_per_record": round(1e3 * main_cpu_s / len(rows), 3),
          "main_bound_records_per_s": round(len(rows) / max(main_cpu_s, 1e-9), 1)}
  rng = np.random.default_rng(0)
  picks = [rng.choice(rows, batch_size, replace=False) for _ in range(batches)]
  pooled.read(picks[0])  # warm up TensorStore's thread pool
  t0 = time.perf_counter()
  for p in picks:
    pooled.read(p)
  cache_s = (time.perf_counter() - t0) / batches
  t0 = time.perf_counter()
  for p in picks:
    records.stack([records.decode(result.manifest, int(r), result.tables, root, shapes)[0]
                   for r in p])
  decode_s = (time.perf_counter() - t0) / batches
  images = int(sum(result.manifest.num_images[p].sum() for p in picks))
  return {"image_size": config.data.image_size,
          "file_image_size": config.data.synthetic.image_size,
          "patients": patients, "batch_size": batch_size, "batches": batches,
          "images_in_batches": images, "cache_fill_s": round(fill_s, 3),
          "cache_batch_ms": round(cache_s * 1e3, 3), "decode_batch_ms": round(decode_s * 1e3, 3),
          "cache_speedup": round(decode_s / cache_s, 2), "target_speedup": 10.0,
          "cache_counters": pooled.counters, "fill": fill}, (root, result, shapes)


_template = None   # a simulated decoding process's record (`_simulated_decode`)


def _simulated_decode(template: str, seconds: float, job: tuple) -> tuple:
  """A fill's job (`fill.decode_stored`'s result) that uses no CPU: `seconds` asleep, then the
  record decoded once beforehand (`template`, a pickle read once a process)."""
  global _template
  t0 = time.perf_counter()
  if _template is None:
    with open(template, "rb") as f:
      _template = pickle.load(f)
  time.sleep(max(0.0, seconds - (time.perf_counter() - t0)))
  images, rejected, nbytes, _ = _template
  return images, rejected, nbytes, time.perf_counter() - t0


def bench_fill_simulated(tmp: str, ingested: tuple, processes: int, seconds: float) -> dict:
  """The fill of every record on `processes` simulated decoding processes (`_simulated_decode`,
  `seconds` a record), into a fresh cache, against the ideal: that many processes decoding
  without a pause. What it costs beyond that is the fill's own: the pool's start, the chunks'
  hand-offs, the writing process."""
  root, result, shapes = ingested
  rows = np.arange(len(result.manifest))
  images = [r for r in rows if result.manifest.image_files[r]]
  cache = cache_lib.Cache(os.path.join(tmp, "cache_simulated"), result.manifest, result.tables,
                          shapes, root, fill_processes=processes)
  template = os.path.join(tmp, "simulated_record.pkl")
  with open(template, "wb") as f:
    pickle.dump(fill_lib.decode_stored((result.manifest.image_files[images[0]], root, shapes,
                                        cache.decoder)), f)
  real = fill_lib.decode_stored
  fill_lib.decode_stored = functools.partial(_simulated_decode, template, seconds)
  try:
    t0, cpu0 = time.perf_counter(), time.process_time()
    cache.ensure(rows)
    fill_s, main_cpu_s = time.perf_counter() - t0, time.process_time() - cpu0
  finally:
    fill_lib.decode_stored = real
  ideal_s = len(images) * seconds / processes
  return {"processes": processes, "decode_ms_per_record": round(seconds * 1e3, 3),
          "records": len(rows), "records_with_images": len(images), "fill_s": round(fill_s, 3),
          "records_per_s": round(len(rows) / fill_s, 1),
          "ideal_records_per_s": round(len(rows) / ideal_s, 1),
          "efficiency": round(ideal_s / fill_s, 3),
          "main_cpu_ms_per_record": round(1e3 * main_cpu_s / len(rows), 3)}


def bench_scan(root: str) -> dict:
  dicom_root = os.path.join(root, "dicom")
  out = {}
  for name, workers in (("serial", 1), ("parallel", pools.cores())):
    t0 = time.perf_counter()
    accepted, rejected = dicom_scan.scan_dicom(dicom_root, workers)
    dt = time.perf_counter() - t0
    n = len(accepted) + len(rejected)
    out[name] = {"workers": workers, "files": n, "seconds": round(dt, 3),
                 "files_per_s": round(n / dt, 1)}
  return out


def _spin(seconds: float) -> float:
  """Pure-Python loops per wall second, spinning for `seconds` of wall time."""
  n, t0 = 0, time.perf_counter()
  while time.perf_counter() - t0 < seconds:
    for _ in range(10_000):
      n += 1
  return n / (time.perf_counter() - t0)


def bench_cpus(seconds: float = 1.0) -> dict:
  """The cores processes get: one per core, each spinning for `seconds` of wall time, against
  one alone (cores_busy_at_once = their summed loops per second over one's). One alone is the
  faster of a spin before and one after, so that other work on the machine during one of them
  does not inflate the ratio."""
  cores = pools.cores()
  out = {"cpu_count": os.cpu_count(), "affinity": cores}
  for path in ("/sys/fs/cgroup/cpu.max", "/sys/fs/cgroup/cpu/cpu.cfs_quota_us"):
    if os.path.exists(path):
      with open(path) as f:
        out["cgroup_" + os.path.basename(path)] = f.read().strip()
  one = _spin(seconds)
  with concurrent.futures.ProcessPoolExecutor(cores, mp_context=pools.context()) as pool:
    list(pool.map(_spin, [0.01] * cores))   # every process started
    rates = list(pool.map(_spin, [seconds] * cores))
  one = max(one, _spin(seconds))
  out["cores_busy_at_once"] = round(sum(rates) / one, 2)
  return out


# One pool's start in a fresh interpreter (so a fresh forkserver): `processes` processes, each of
# which imports the fill's module as a fill's first job does; the wall time until every one has
# answered, and the CPU seconds of the forkserver and the pool's processes.
_POOL_START = """
import concurrent.futures, importlib, json, multiprocessing, sys, time
import psutil
from medjax.data import pools
processes, preload = int(sys.argv[1]), sys.argv[2] == "preloaded"
t0 = time.perf_counter()   # pools.context() starts the forkserver
context = pools.context() if preload else multiprocessing.get_context("forkserver")
with concurrent.futures.ProcessPoolExecutor(
    processes, mp_context=context, initializer=importlib.import_module,
    initargs=("medjax.data.cache.fill",)) as pool:
  list(pool.map(time.sleep, [0.3] * processes, chunksize=1))
  wall = time.perf_counter() - t0 - 0.3
  cpu = sum(sum(p.cpu_times()[:2]) for p in psutil.Process().children(recursive=True))
print(json.dumps({"wall_s": wall, "cpu_s": cpu}))
"""


def bench_pool_start(processes: int, rounds: int = 3) -> dict:
  """A data pool's start with the forkserver's preload (`medjax.data.pools`) against a plain
  forkserver whose processes each import the decoding code, alternated `rounds` times."""
  sides = {"preloaded": [], "plain": []}
  for _ in range(rounds):
    for side, runs in sides.items():
      out = subprocess.run([sys.executable, "-c", _POOL_START, str(processes), side], check=True,
                           capture_output=True, text=True, timeout=300).stdout
      runs.append(json.loads(out.splitlines()[-1]))
  median = lambda runs, key: round(float(np.median([r[key] for r in runs])), 3)
  result = {"processes": processes, "rounds": rounds}
  for side, runs in sides.items():
    result[side] = {"wall_s": median(runs, "wall_s"), "cpu_s": median(runs, "cpu_s"),
                    "runs": runs}
  result["cpu_ratio_plain_over_preloaded"] = round(
      result["plain"]["cpu_s"] / max(result["preloaded"]["cpu_s"], 1e-9), 2)
  return result


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
  parser.add_argument("--config", choices=("default", "paper"), default="default",
                      help="whose images: the default config's, or configs/paper.py's")
  parser.add_argument("--one-process-records", type=int, default=None,
                      help="records the one-process fill decodes (default: all)")
  parser.add_argument("--pool-processes", type=int, default=0,
                      help="processes of the pool-start comparison (default: one per core)")
  parser.add_argument("--pool-rounds", type=int, default=3,
                      help="alternations of the pool-start comparison")
  parser.add_argument("--simulate-processes", type=int, default=16,
                      help="simulated decoding processes of the fill's part 6 (0: skip it)")
  parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results",
                                                    "bench_data.json"))
  args = parser.parse_args()
  config = (paper_config if args.config == "paper" else default_config).get_config()
  with tempfile.TemporaryDirectory() as tmp:
    cache_result, ingested = bench_cache(tmp, config, args.patients, args.batches,
                                         args.batch_size, args.one_process_records)
    scan_result = bench_scan(ingested[0])
    simulated = None
    if args.simulate_processes > 0:
      simulated = bench_fill_simulated(
          tmp, ingested, args.simulate_processes,
          cache_result["fill"]["one_process_decode_ms_per_record"] / 1e3)
  result = {"config": args.config, "cache_vs_decode": cache_result, "header_scan": scan_result,
            "fill_simulated": simulated,
            "placement": bench_placement(53420, 16), "cpus": bench_cpus(),
            "pool_start": bench_pool_start(args.pool_processes or pools.cores(),
                                           args.pool_rounds)}
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(result, f, indent=2, default=float)
  c, p = result["cache_vs_decode"], result["placement"]
  print(f"cache batch {c['cache_batch_ms']} ms vs decode {c['decode_batch_ms']} ms: "
        f"{c['cache_speedup']}x (target >= 10x)")
  f = c["fill"]
  print(f"cache fill ({args.config}'s {c['image_size']}-px images) of {f['records']} records: "
        f"{f['one_process_records_per_s']} records/s in one process, "
        f"{f['all_cores_records_per_s']} with {f['processes']}: {f['speedup']}x; the writing "
        f"process {f['main_cpu_ms_per_record']} ms of CPU a record (bound: "
        f"{f['main_bound_records_per_s']} records/s)")
  for name, s in scan_result.items():
    print(f"header scan {name}: {s['files_per_s']} files/s ({s['files']} files)")
  print(f"placement of {p['records']} records over {p['hosts']} hosts: {p['place_s_median']} s "
        f"(target < 2 s); cost max/mean {p['cost_max_over_mean']:.4f}; one host leaving moves "
        f"{p['moved_fraction_one_host_left']:.4f} (ideal {p['ideal_fraction']:.4f})")
  cpus = result["cpus"]
  print(f"cpus: {cpus['cpu_count']} cores, affinity {cpus['affinity']}, one process per core "
        f"busies {cpus['cores_busy_at_once']} at once "
        f"{' '.join(f'{k}={v}' for k, v in cpus.items() if k.startswith('cgroup'))}")
  start = result["pool_start"]
  print(f"a pool of {start['processes']} processes starts in {start['preloaded']['wall_s']} s "
        f"and {start['preloaded']['cpu_s']} CPU s from the preloaded forkserver, "
        f"{start['plain']['wall_s']} s and {start['plain']['cpu_s']} CPU s from a plain one")
  if simulated:
    print(f"cache fill on {simulated['processes']} simulated decoding processes "
          f"({simulated['decode_ms_per_record']} ms a record asleep): "
          f"{simulated['records_per_s']} records/s of an ideal {simulated['ideal_records_per_s']}"
          f" ({simulated['efficiency']}); the writing process "
          f"{simulated['main_cpu_ms_per_record']} ms of CPU a record")
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
