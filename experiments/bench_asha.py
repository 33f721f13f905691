"""ASHA against running every trial to the full budget: two real sweeps (configs/sweep.py) on
the quickstart cohort, with the same sampler, seed and number of trials; writes
experiments/results/sweep_asha.json and sweep_asha.png.

  python -m experiments.bench_asha [--trials 10] [--variant ''] [--workdir /tmp/bench_asha]

Both sweeps share one ingest (the full-budget sweep's data/ is copied into the ASHA sweep's
workdir before it starts), so their trials see the same train/validation/test split. Reported
per sweep: the best validation metric, the training steps all its trials spent, its wall time,
and the best trial's test accuracy over the Bayes ceiling (the quickstart config's own is in
experiments/results/ and the note). Target (issue 13): ASHA within 0.01 of the full-budget best
at no more than a third of its steps.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import pandas as pd
from matplotlib import figure

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sweep(workdir: str, pruner: str, args) -> dict:
  config = "configs/sweep.py" + (f":{args.variant}" if args.variant else "")
  flags = [f"--config={config}", f"--workdir={workdir}", f"--config.pruner.kind={pruner}",
           f"--config.study.n_trials={args.trials}", "--config.study.sampler=tpe",
           f"--config.study.seed={args.seed}", f"--config.study.name=bench-{pruner}"]
  t0 = time.perf_counter()
  print(f"[bench_asha] {pruner}: launch.py {' '.join(flags)}", flush=True)
  with open(workdir + ".log", "w") as out:
    code = subprocess.run([sys.executable, os.path.join(ROOT, "launch.py"), *flags], cwd=ROOT,
                          stdout=out, stderr=subprocess.STDOUT).returncode
  wall = time.perf_counter() - t0
  if code != 0:
    raise RuntimeError(f"the {pruner} sweep exited {code}; see {workdir}.log")
  rows = pd.read_csv(os.path.join(workdir, "trials.csv"))
  done = rows[rows["state"].isin(["complete", "pruned"])]
  best = done.loc[done["value"].idxmax()]
  with open(os.path.join(workdir, best["workdir"], "summary.json")) as f:
    summary = json.load(f)
  test, ceiling = summary["test"], summary.get("ceiling") or {}
  return {"pruner": pruner, "trials": int(len(done)),
          "complete": int((done["state"] == "complete").sum()),
          "pruned": int((done["state"] == "pruned").sum()),
          "best_value": float(best["value"]), "best_trial": int(best["number"]),
          "steps": int(done["steps"].fillna(0).sum()), "wall_s": round(wall, 1),
          "trial_wall_s": float(done["wall_s"].fillna(0).sum()),
          "best_test_accuracy": test["accuracy"], "best_ceiling_accuracy": ceiling.get("accuracy"),
          "best_test_over_ceiling": (test["accuracy"] / ceiling["accuracy"]
                                     if ceiling.get("accuracy") else None),
          "best_params": {k: (v.item() if hasattr(v, "item") else v) for k, v in best.items()
                          if "." in str(k)},
          "per_trial": done[["number", "state", "value", "epochs_run", "steps"]].to_dict("records")}


def plot(result: dict) -> figure.Figure:
  fig = figure.Figure(figsize=(10, 4), layout="constrained")
  left, right = fig.subplots(1, 2)
  for key, colour in (("none", "tab:blue"), ("asha", "tab:orange")):
    r = result[key]
    trials = sorted(r["per_trial"], key=lambda t: t["number"])
    steps, best, spent, xs, ys = 0, float("-inf"), [], [], []
    for t in trials:
      steps += t["steps"] or 0
      best = max(best, t["value"])
      xs.append(steps)
      ys.append(best)
    left.step(xs, ys, where="post", color=colour, label=f"{key}: best {r['best_value']:.3f}")
    right.bar(key, r["steps"], color=colour)
  left.set_xlabel("training steps spent (all trials)")
  left.set_ylabel("best validation macro F1 so far")
  left.legend()
  left.set_title("Best validation metric against steps spent", fontsize=10)
  right.set_ylabel("training steps, all trials")
  right.set_title(f"Steps: ASHA / full budget = {result['steps_ratio']:.2f}", fontsize=10)
  return fig


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--trials", type=int, default=10)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--variant", default="", help="configs/sweep.py variant ('tiny': a test)")
  parser.add_argument("--workdir", default="/tmp/bench_asha")
  parser.add_argument("--out", default=os.path.join(ROOT, "experiments", "results", "sweep_asha"))
  args = parser.parse_args(argv)
  if os.path.exists(args.workdir):
    shutil.rmtree(args.workdir)
  os.makedirs(args.workdir)
  full = sweep(os.path.join(args.workdir, "full"), "none", args)
  asha_dir = os.path.join(args.workdir, "asha")
  os.makedirs(asha_dir)
  shutil.copytree(os.path.join(args.workdir, "full", "data"), os.path.join(asha_dir, "data"),
                  symlinks=True)
  asha = sweep(asha_dir, "asha", args)
  result = {"trials": args.trials, "seed": args.seed, "sampler": "tpe",
            "config": "configs/sweep.py" + (f":{args.variant}" if args.variant else ""),
            "none": full, "asha": asha,
            "gap": round(full["best_value"] - asha["best_value"], 4),
            "steps_ratio": round(asha["steps"] / max(full["steps"], 1), 4),
            "targets": {"gap": 0.01, "steps_ratio": 1 / 3}}
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out + ".json", "w") as f:
    json.dump(result, f, indent=2, default=str)
  plot(result).savefig(args.out + ".png", dpi=110)
  print(f"full budget: best val {full['best_value']:.4f} in {full['steps']} steps "
        f"({full['wall_s']:.0f} s); ASHA: best {asha['best_value']:.4f} in {asha['steps']} "
        f"steps ({asha['wall_s']:.0f} s); gap {result['gap']:+.4f} (target <= 0.01), steps "
        f"ratio {result['steps_ratio']:.2f} (target <= 0.33); best trials' test accuracy / "
        f"ceiling: {full['best_test_over_ceiling']} (full), {asha['best_test_over_ceiling']} "
        "(ASHA)")
  print(f"wrote {args.out}.json and .png")
  return result


if __name__ == "__main__":
  main()
