"""What host-local snapshots cost training, measured side by side in one run; writes
experiments/results/snapshots.json and prints a table.

  python -m experiments.bench_snapshots [--every 0,1,2,4,8] [--repeats 3] [--epochs 15]

The quickstart, unsupervised (one process: nothing else competes for the cores), with
config.ckpt.snapshot_every_steps at each value of --every (0: no snapshots, the baseline), the
variants alternating --repeats times over one cohort, salt, ingest and warm compilation cache.
Per variant: the median training time (summary.json train.seconds) and its ratio to the
baseline's, snapshots written and skipped (the writer was still busy), the writer's seconds,
and test accuracy (the same in every variant: snapshots do not touch training).
Target (issue 12, item 5): at the default interval, training within 2% of the baseline.

The waste snapshots save is measured by experiments/bench_recovery.py (part B, layouts with and
without snapshots).
"""

import argparse
import json
import os
import time

import numpy as np

from experiments import bench_recovery

ROOT = bench_recovery.ROOT


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--config", default="configs/quickstart.py")
  parser.add_argument("--every", default="0,1,2,4,8")
  parser.add_argument("--epochs", type=int, default=15)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--out", default=os.path.join(ROOT, "experiments", "results",
                                                    "snapshots.json"))
  args = parser.parse_args()
  intervals = [int(k) for k in args.every.split(",")]
  base, common = bench_recovery.prepared_base(args.config)
  common = common + ["--config.fault.supervised=False", f"--config.optim.epochs={args.epochs}"]
  flag = lambda k: [f"--config.ckpt.snapshot_every_steps={k}"]
  # The packing program and the step in the compilation cache for every variant.
  bench_recovery.warm_up(bench_recovery.workdir_from(base, "warmup"),
                         common + flag(max(intervals)), args.config)
  runs = {k: [] for k in intervals}
  started = time.strftime("%Y-%m-%d %H:%M:%S")
  for r in range(args.repeats):
    for k in intervals:
      s = bench_recovery.launch(bench_recovery.workdir_from(base, f"every-{k}-{r}"),
                                common + flag(k), args.config)
      snap = s["train"].get("snapshots", {})
      runs[k].append({"train_s": s["train"]["seconds"], "wall_s": s["_launch_s"],
                      "steps": s["train"]["global_step"], "accuracy": s["test"]["accuracy"],
                      "written": snap.get("written", 0), "skipped": snap.get("skipped", 0),
                      "write_s": snap.get("write_s", 0.0), "load": bench_recovery.load()})
      print(f"  every {k}: training {s['train']['seconds']:.2f} s, wall {s['_launch_s']:.1f} s, "
            f"snapshots {snap.get('written', 0)} written, {snap.get('skipped', 0)} skipped, "
            f"accuracy {s['test']['accuracy']:.4f}", flush=True)
  baseline = float(np.median([x["train_s"] for x in runs[intervals[0]]]))
  result = {"config": args.config, "started": started, "cpus": os.cpu_count(),
            "baseline_every": intervals[0], "variants": {}}
  print(f"{'every':>6}{'train s':>9}{'ratio':>8}{'written':>9}{'skipped':>9}{'write ms':>10}"
        f"{'accuracy':>10}")
  for k in intervals:
    rs = runs[k]
    train = float(np.median([x["train_s"] for x in rs]))
    written = float(np.median([x["written"] for x in rs]))
    write_ms = 1000 * float(np.median([x["write_s"] / max(x["written"], 1) for x in rs]))
    result["variants"][str(k)] = {"median_train_s": train, "ratio": round(train / baseline, 4),
                                  "median_written": written, "write_ms_each": round(write_ms, 3),
                                  "same_accuracy": len({x["accuracy"] for x in rs}) == 1,
                                  "runs": rs}
    print(f"{k:>6}{train:>9.2f}{train / baseline:>8.3f}{written:>9.0f}"
          f"{float(np.median([x['skipped'] for x in rs])):>9.0f}{write_ms:>10.2f}"
          f"{rs[0]['accuracy']:>10.4f}")
  accuracies = {x["accuracy"] for rs in runs.values() for x in rs}
  result["same_accuracy_everywhere"] = len(accuracies) == 1
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(result, f, indent=2)
  print(f"same accuracy in every run: {result['same_accuracy_everywhere']}; wrote {args.out}")


if __name__ == "__main__":
  main()
