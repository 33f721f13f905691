"""Ingest of a table-only cohort at reader speed, measured side by side in one run; writes
experiments/results/ingest_tables.json and prints a table.

  python -m experiments.bench_ingest_tables [--patients 20000] [--repeats 2]

A table-only cohort (labs and vitals, no DICOM files) of `--patients` patients, synthesised once
(not timed). Then, alternating `--repeats` times:
  reader   pandas.read_csv of labels.csv, labs.csv and vitals.csv, nothing else: the floor;
  ingest   `python launch.py --config configs/quickstart.py:ingest` on that cohort in a fresh
           workdir, end to end (process start, imports, table parsing and checks, manifest,
           split, normalisers, placement, the host's decoded cache): what a user waits for
           before a run on such a cohort can train. Its phases come from its log.
Target (issue 12): ingest under 5 s end to end for 20,000 patients. The cohort's vitals are
hourly (24 rows per patient with vitals: about 400,000 rows), more than the issue's yearly ones.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from configs import quickstart
from medjax import paths
from medjax.data import synthetic

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULT = os.path.join(ROOT, "experiments", "results", "ingest_tables.json")


def make_cohort(root: str, patients: int) -> dict:
  cfg = quickstart.get_config().data.synthetic
  cfg.num_patients = patients
  cfg.frac_no_images = 1.0
  cfg.junk_files = 0
  t0 = time.perf_counter()
  synthetic.generate(cfg, root)
  sizes = {name: os.path.getsize(os.path.join(root, name))
           for name in ("labels.csv", "labs.csv", "vitals.csv")}
  dicom_files = sum(len(files) for _, _, files in os.walk(os.path.join(root, "dicom")))
  return {"patients": patients, "generate_s": round(time.perf_counter() - t0, 2),
          "bytes": sizes, "dicom_files": dicom_files}


def reader(root: str) -> dict:
  import pandas as pd  # pylint: disable=import-outside-toplevel
  t0 = time.perf_counter()
  rows = {name: len(pd.read_csv(os.path.join(root, name), dtype=str, keep_default_na=False))
          for name in ("labels.csv", "labs.csv", "vitals.csv")}
  return {"seconds": round(time.perf_counter() - t0, 3), "rows": rows}


def ingest(root: str, workdir: str) -> dict:
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  t0 = time.perf_counter()
  proc = subprocess.run([sys.executable, os.path.join(ROOT, "launch.py"),
                         "--config=configs/quickstart.py:ingest", f"--workdir={workdir}",
                         f"--config.data.root={root}"], cwd=ROOT, env=env,
                        capture_output=True, text=True, check=False)
  wall = time.perf_counter() - t0
  if proc.returncode != 0:
    raise SystemExit(f"ingest failed ({proc.returncode}):\n{proc.stdout[-2000:]}"
                     f"\n{proc.stderr[-2000:]}")
  with open(paths.RunPaths(workdir).ingest_report) as f:
    report = json.load(f)
  summary = report["ingest"]
  written = sum(c.get("records_written", 0) for c in report["cache"].values())
  return {"wall_s": round(wall, 2), "patients_in_manifest": summary.get("patients"),
          "quarantined": summary.get("quarantined"),
          "ingest_s": summary.get("seconds"),   # ingest.run: tables, manifest, split, normalisers
          "cache_records_written": written,
          "cache_pfs_reads": sum(c.get("pfs_reads", 0) for c in report["cache"].values())}


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--patients", type=int, default=20000)
  parser.add_argument("--repeats", type=int, default=2)
  parser.add_argument("--out", default=RESULT)
  args = parser.parse_args(argv)
  base = tempfile.mkdtemp(prefix="bench_ingest_tables_")
  root = os.path.join(base, "cohort")
  result = {"cpus": os.cpu_count(), "load_at_start": round(os.getloadavg()[0], 2),
            "cohort": make_cohort(root, args.patients), "reader": [], "ingest": []}
  print(f"cohort: {args.patients} patients, no images, written in "
        f"{result['cohort']['generate_s']} s", flush=True)
  for i in range(args.repeats):
    result["reader"].append(reader(root))
    workdir = os.path.join(base, f"work-{i}")
    result["ingest"].append(ingest(root, workdir))
    shutil.rmtree(workdir, ignore_errors=True)
    print(f"repeat {i}: reader {result['reader'][-1]['seconds']} s, ingest end to end "
          f"{result['ingest'][-1]['wall_s']} s", flush=True)
  reader_s = float(np.median([r["seconds"] for r in result["reader"]]))
  ingest_s = float(np.median([r["wall_s"] for r in result["ingest"]]))
  result.update(median_reader_s=round(reader_s, 3), median_ingest_s=round(ingest_s, 2),
                ingest_over_reader=round(ingest_s / reader_s, 1),
                patients_per_s=round(args.patients / ingest_s), target_s=5.0,
                met=bool(ingest_s < 5.0), load_at_end=round(os.getloadavg()[0], 2))
  print(f"\n{'':24}{'seconds':>10}\n{'pandas reader (floor)':24}{reader_s:>10.2f}\n"
        f"{'ingest end to end':24}{ingest_s:>10.2f}   ({result['patients_per_s']} patients/s, "
        f"x{result['ingest_over_reader']} the reader; target < 5 s: "
        f"{'met' if result['met'] else 'NOT met'})")
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(result, f, indent=2)
  shutil.rmtree(base, ignore_errors=True)
  return result


if __name__ == "__main__":
  main()
