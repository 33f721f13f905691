"""ASHA against running every trial to the full budget: two real sweeps (configs/sweep.py) on
the quickstart cohort, with the same sampler, seed and number of trials; writes
experiments/results/sweep_asha.json and sweep_asha.png.

  python -m experiments.bench_asha [--trials 16] [--variant ''] [--workdir /tmp/bench_asha]
                                   [--reuse-full]

Neither sweep starts from the base config's values (`study.start_with_base=False`): the
quickstart's values are a sweep's winner, and a sweep seeded with them measures nothing.

Both sweeps share one ingest (the full-budget sweep's data/ is copied into the ASHA sweep's
workdir before it starts), so their trials see the same train/validation/test split. Reported
per sweep: the best validation metric, the training steps all its trials spent, its wall time,
and the best trial's test accuracy over the Bayes ceiling (the quickstart config's own is in
experiments/results/ and the note). Target (issue 13): ASHA within 0.01 of the full-budget best
at no more than a third of its steps.

Also reported, and labelled as such: a replay of the full-budget sweep's learning curves (each
trial's validation metric at every epoch) under several pruner settings, with Optuna's own
pruners deciding in trial order. It shows which trials each setting would have stopped and what
it would have spent; it leaves out that a real pruned sweep's sampler sees different results
after its random start-up trials (so later trials differ).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import optuna
import pandas as pd
from matplotlib import figure

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sweep(workdir: str, pruner: str, args, *, reuse: bool = False) -> dict:
  config = "configs/sweep.py" + (f":{args.variant}" if args.variant else "")
  flags = [f"--config={config}", f"--workdir={workdir}", f"--config.pruner.kind={pruner}",
           f"--config.study.n_trials={args.trials}", "--config.study.sampler=tpe",
           f"--config.study.seed={args.seed}", f"--config.study.name=bench-{pruner}",
           "--config.study.start_with_base=False", *args.pruner_flags * (pruner != "none")]
  t0 = time.perf_counter()
  if reuse:
    print(f"[bench_asha] {pruner}: reusing the finished sweep in {workdir}", flush=True)
    wall = None
  else:
    print(f"[bench_asha] {pruner}: launch.py {' '.join(flags)}", flush=True)
    with open(workdir + ".log", "w") as out:
      code = subprocess.run([sys.executable, os.path.join(ROOT, "launch.py"), *flags], cwd=ROOT,
                            stdout=out, stderr=subprocess.STDOUT).returncode
    wall = round(time.perf_counter() - t0, 1)
    if code != 0:
      raise RuntimeError(f"the {pruner} sweep exited {code}; see {workdir}.log")
  study = optuna.load_study(study_name=f"bench-{pruner}",
                            storage=f"sqlite:///{os.path.join(workdir, 'study.db')}")
  curves = {t.number: dict(sorted(t.intermediate_values.items())) for t in study.trials}
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
          "steps": int(done["steps"].fillna(0).sum()), "wall_s": wall,
          "trial_wall_s": float(done["wall_s"].fillna(0).sum()),
          "best_test_accuracy": test["accuracy"], "best_ceiling_accuracy": ceiling.get("accuracy"),
          "best_test_over_ceiling": (test["accuracy"] / ceiling["accuracy"]
                                     if ceiling.get("accuracy") else None),
          "best_params": {k: (v.item() if hasattr(v, "item") else v) for k, v in best.items()
                          if "." in str(k)},
          "per_trial": [dict(r, curve=curves.get(r["number"], {})) for r in
                        done[["number", "state", "value", "epochs_run", "steps"]].to_dict("records")]}


def replay(full: dict, settings: dict) -> dict:
  """The full-budget sweep's trials, in order, under each pruner setting (Optuna's pruners on
  an in-memory study): the best value reached and the steps it would have spent."""
  optuna.logging.set_verbosity(optuna.logging.WARNING)
  trials = sorted(full["per_trial"], key=lambda t: t["number"])
  out = {}
  for name, make in settings.items():
    study = optuna.create_study(direction="maximize", pruner=make())
    steps, best, kept = 0, float("-inf"), []
    for t in trials:
      curve = {int(k): v for k, v in t["curve"].items()}
      per_epoch = t["steps"] / max(t["epochs_run"], 1)
      trial = study.ask()
      stopped = None
      for epoch in sorted(curve):
        trial.report(curve[epoch], epoch)
        if trial.should_prune():
          stopped = epoch
          break
      if stopped is None:
        study.tell(trial, t["value"])
        steps += t["steps"]
        best = max(best, t["value"])
        kept.append(t["number"])
      else:
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        steps += round(per_epoch * stopped)
        best = max(best, curve[stopped])
    out[name] = {"best_value": round(best, 4), "gap": round(full["best_value"] - best, 4),
                 "steps_ratio": round(steps / max(full["steps"], 1), 3), "completed": kept}
  return out


def replay_settings(epochs: int) -> dict:
  sh, hb = optuna.pruners.SuccessiveHalvingPruner, optuna.pruners.HyperbandPruner
  settings = {}
  for r in (1, 2, 3):
    for eta in (2, 3, 4):
      settings[f"asha r={r} eta={eta}"] = (lambda r=r, eta=eta: sh(min_resource=r,
                                                                   reduction_factor=eta))
  for r in (1, 2):
    settings[f"hyperband r={r} eta=3"] = (lambda r=r: hb(min_resource=r, max_resource=epochs,
                                                         reduction_factor=3))
  for warm in (2, 4):
    settings[f"median warmup={warm} startup=3"] = (
        lambda warm=warm: optuna.pruners.MedianPruner(n_startup_trials=3, n_warmup_steps=warm))
  return settings


def plot(result: dict) -> figure.Figure:
  fig = figure.Figure(figsize=(10, 4), layout="constrained")
  left, right = fig.subplots(1, 2)
  for key, colour in (("none", "tab:blue"), ("asha", "tab:orange")):
    r = result[key]
    trials = sorted(r["per_trial"], key=lambda t: t["number"])
    steps, best, xs, ys = 0, float("-inf"), [], []
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
  parser.add_argument("--trials", type=int, default=16)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--variant", default="", help="configs/sweep.py variant ('tiny': a test)")
  parser.add_argument("--workdir", default="/tmp/bench_asha")
  parser.add_argument("--out", default=os.path.join(ROOT, "experiments", "results", "sweep_asha"))
  parser.add_argument("--reuse-full", action="store_true",
                      help="reuse a finished full-budget sweep in <workdir>/full (its wall time "
                           "is then not measured)")
  parser.add_argument("--pruner-flag", action="append", default=[], dest="pruner_flags",
                      help="extra --config.pruner.* flags for the ASHA sweep (repeatable)")
  args = parser.parse_args(argv)
  full_dir, asha_dir = (os.path.join(args.workdir, n) for n in ("full", "asha"))
  if args.reuse_full:
    shutil.rmtree(asha_dir, ignore_errors=True)
  else:
    shutil.rmtree(args.workdir, ignore_errors=True)
    os.makedirs(args.workdir)
  full = sweep(full_dir, "none", args, reuse=args.reuse_full)
  os.makedirs(asha_dir)
  shutil.copytree(os.path.join(full_dir, "data"), os.path.join(asha_dir, "data"), symlinks=True)
  asha = sweep(asha_dir, "asha", args)
  result = {"trials": args.trials, "seed": args.seed, "sampler": "tpe",
            "config": "configs/sweep.py" + (f":{args.variant}" if args.variant else ""),
            "asha_flags": args.pruner_flags, "none": full, "asha": asha,
            "replay_of_full_curves": replay(full, replay_settings(
                max(t["epochs_run"] for t in full["per_trial"]))),
            "gap": round(full["best_value"] - asha["best_value"], 4),
            "steps_ratio": round(asha["steps"] / max(full["steps"], 1), 4),
            "targets": {"gap": 0.01, "steps_ratio": 1 / 3}}
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out + ".json", "w") as f:
    json.dump(result, f, indent=2, default=str)
  plot(result).savefig(args.out + ".png", dpi=110)
  print(f"full budget: best val {full['best_value']:.4f} in {full['steps']} steps "
        f"({full['wall_s']} s); ASHA: best {asha['best_value']:.4f} in {asha['steps']} "
        f"steps ({asha['wall_s']:.0f} s); gap {result['gap']:+.4f} (target <= 0.01), steps "
        f"ratio {result['steps_ratio']:.2f} (target <= 0.33); best trials' test accuracy / "
        f"ceiling: {full['best_test_over_ceiling']} (full), {asha['best_test_over_ceiling']} "
        "(ASHA)")
  print(f"wrote {args.out}.json and .png")
  return result


if __name__ == "__main__":
  main()
