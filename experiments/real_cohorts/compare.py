"""medjax against the baselines (`baselines.py`) on the public cohorts, split for split.

For each cohort and seed k: a pseudonymisation salt derived from k (so that the split is
reproducible and shared by every method and by runs of different medjax configs); medjax trained
by `launch.py` with `--config.seed=k` in OUTDIR/runs/<label>/<cohort>/seed<k>; its manifest gives
every patient's split, and the baselines are fitted on the same training patients (settings
chosen on the same validation patients) and scored on the same test patients. A run whose
summary.json exists is read, not repeated (a long comparison can be resumed), and the label's
JSON gathers every cohort and seed its comparisons measured (`merged`).

Reported per cohort and method: test AUROC, accuracy, macro F1 and ECE, their means over seeds,
and the paired difference medjax - baseline per seed with its mean and 95% t-interval.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np

from experiments import ablation_missing
from experiments.real_cohorts import baselines, cohorts
from medjax.data import ingest
from medjax.data import manifest as manifest_lib

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def salt_file(outdir: str, seed: int) -> str:
  path = os.path.join(outdir, "salts", f"seed{seed}")
  if not os.path.exists(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
      f.write(hashlib.sha256(f"medjax real cohorts, seed {seed}".encode()).digest())
  return path


def run_medjax(cohort_dir: str, workdir: str, seed: int, salt: str, config: str,
               overrides: list[str]) -> dict:
  """Trains and evaluates medjax; a finished run (its wall time written last) is read back,
  an unfinished one started again."""
  summary_path = os.path.join(workdir, "summary.json")
  if not os.path.exists(os.path.join(workdir, "wall_s")):
    shutil.rmtree(workdir, ignore_errors=True)   # never finished (or its timing was lost)
  if not os.path.exists(summary_path):
    cmd = [sys.executable, os.path.join(REPO, "launch.py"), "--config", config,
           "--workdir", workdir, f"--config.data.root={cohort_dir}", f"--config.seed={seed}",
           f"--config.data.salt_file={salt}", *overrides]
    os.makedirs(workdir, exist_ok=True)
    start = time.monotonic()
    with open(os.path.join(workdir, "launch.log"), "w") as log:
      rc = subprocess.run(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT).returncode
    if rc != 0:
      raise RuntimeError(f"medjax run failed (exit {rc}): see {workdir}/launch.log")
    with open(os.path.join(workdir, "wall_s"), "w") as f:
      f.write(f"{time.monotonic() - start:.1f}\n")
  with open(summary_path) as f:
    test = json.load(f)["test"]
  with open(os.path.join(workdir, "wall_s")) as f:
    wall = float(f.read())
  return {"auroc": test["auroc"], "accuracy": test["accuracy"], "macro_f1": test["macro_f1"],
          "ece": test["ece"], "wall_s": wall, "count": test["count"]}


def split_of(workdir: str, ids: np.ndarray, salt_path: str) -> np.ndarray:
  """Each patient's split ('train', 'val', 'test') in the run's manifest."""
  with open(salt_path, "rb") as f:
    salt = f.read()
  manifest = manifest_lib.Manifest.load(os.path.join(workdir, "ingest", "manifest.jsonl"))
  by_record = dict(zip(manifest.record_ids, manifest.split))
  return np.array([by_record[ingest.pseudonym(p, salt)] for p in ids])


def one_seed(name: str, outdir: str, seed: int, label: str, config: str, overrides) -> dict:
  ids, labels, features, _ = cohorts.table(name)
  classes = sorted(set(labels))   # medjax's order: the positive class is the second name
  y = (labels == classes[1]).astype(int)
  salt = salt_file(outdir, seed)
  workdir = os.path.join(outdir, "runs", label, name, f"seed{seed}")
  result = {"medjax": run_medjax(os.path.join(outdir, "cohorts", name), workdir, seed, salt,
                                 config, overrides)}
  split = split_of(workdir, ids, salt)
  x = features.to_numpy(np.float64)
  parts = [(x[split == s], y[split == s]) for s in ("train", "val", "test")]
  (x_tr, y_tr), (x_va, y_va), (x_te, y_te) = parts
  if len(y_te) != result["medjax"]["count"]:
    raise AssertionError(f"{name} seed {seed}: {len(y_te)} test patients, medjax scored "
                         f"{result['medjax']['count']}")
  for method, fit in baselines.METHODS.items():
    start = time.monotonic()
    p, chosen = fit(x_tr, y_tr, x_va, y_va, x_te, seed)
    result[method] = {**baselines.scores(p, y_te), "chosen": chosen,
                      "wall_s": round(time.monotonic() - start, 2)}
  return result


def paired(a: list[float], b: list[float]) -> dict:
  """Mean of a - b over seeds and its 95% t-interval (NaN with one seed)."""
  d = ablation_missing.mean_std(np.subtract(a, b))
  lo, hi = d["ci95"] or (float("nan"), float("nan"))
  return {"mean": d["mean"], "lo": lo, "hi": hi}


def summarise(per_seed: dict) -> dict:
  """{cohort: {method: {metric: mean}, 'vs_<baseline>': {metric: paired}}}."""
  out = {}
  for name, seeds in per_seed.items():
    runs = list(seeds.values())
    methods = list(runs[0])
    entry = {m: {k: float(np.mean([r[m][k] for r in runs]))
                 for k in ("auroc", "accuracy", "macro_f1", "ece", "wall_s")} for m in methods}
    for base in ("trees", "logistic"):
      entry[f"medjax_vs_{base}"] = {
          k: paired([r["medjax"][k] for r in runs], [r[base][k] for r in runs])
          for k in ("auroc", "accuracy", "macro_f1")}
    entry["seeds"] = len(runs)
    out[name] = entry
  return out


def compare(outdir: str, seeds, label: str, config: str, overrides: list[str],
            names=None) -> dict:
  names = names or list(cohorts.COHORTS)
  path = os.path.join(outdir, f"real_cohorts_{label}.json")
  record(path, config, overrides)   # another config's record is refused before any run
  per_seed = {}
  for name in names:
    if not os.path.exists(os.path.join(outdir, "cohorts", name, "labels.csv")):
      cohorts.write(name, os.path.join(outdir, "cohorts", name))
    per_seed[name] = {}
    for seed in seeds:
      r = per_seed[name][seed] = one_seed(name, outdir, seed, label, config, overrides)
      print(f"{label} {name} seed {seed}: AUROC medjax {r['medjax']['auroc']:.4f} trees "
            f"{r['trees']['auroc']:.4f} logistic {r['logistic']['auroc']:.4f} "
            f"({r['medjax']['wall_s']:.0f} s)", flush=True)
  per_seed = merged(path, config, overrides, per_seed)
  result = {"label": label, "config": config, "overrides": overrides,
            "seeds": sorted({int(k) for runs in per_seed.values() for k in runs}),
            "per_seed": per_seed, "summary": summarise(per_seed)}
  with open(path, "w") as f:
    json.dump(result, f, indent=1)
  return result


def record(path: str, config: str, overrides: list[str]) -> dict:
  """The label's per-seed record so far ({} if none). A label's runs are cached under its name,
  so a record made with another config or other overrides is an error, not something to mix in."""
  if not os.path.exists(path):
    return {}
  with open(path) as f:
    old = json.load(f)
  if (old["config"], old["overrides"]) != (config, overrides):
    raise ValueError(f"{path} was measured with --config {old['config']} "
                     f"{' '.join(old['overrides'])}, not {config} {' '.join(overrides)}: "
                     f"give this comparison its own --label")
  return old["per_seed"]


def merged(path: str, config: str, overrides: list[str], per_seed: dict) -> dict:
  """`per_seed` over the label's `record`, read again now: a comparison of some cohorts or seeds
  (a resumed one, or several run side by side) adds to the label's record instead of replacing
  it."""
  out = {name: dict(seeds) for name, seeds in record(path, config, overrides).items()}
  for name, seeds in per_seed.items():
    out.setdefault(name, {}).update({str(k): r for k, r in seeds.items()})
  return {name: dict(sorted(seeds.items(), key=lambda kv: int(kv[0])))
          for name, seeds in out.items()}
