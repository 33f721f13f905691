"""Gradient modes side by side (issue 35): 'sync' against 'local' at several H, the same runs.

  python -m experiments.bench_modes [--config configs/quickstart.py] [--seeds 3]
      [--local-steps 1,4,16,64] [--workers 2] [--workdir /tmp/bench_modes]

Every run is `launch.py` as a user runs it (supervised), with `--workers` worker processes of
one CPU device each (so 'local' trains that many replicas, one per process, over gloo). Per seed
one synthetic cohort, salt (so one split), compilation cache and decoded cache serve every
mode; `--config.seed` is the seed. All modes see the same examples (the same epochs).

Reports per mode: test accuracy and macro F1 (mean over seeds, and the paired difference to
'sync' with its 95% t-interval), the wall time, and the bytes each worker sends per training
example (from the bytes the compiled step all-reduces, experiments/results/comm_bytes.json or a
fresh count, and the ring all-reduce's 2 (p-1)/p factor). Writes <out>/bench_modes.json and .md.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import time

import numpy as np
from scipy import stats

from experiments.failure_sim import comm
from experiments.report import measure
from experiments.report import scales as scales_lib

OUT = os.path.join(os.path.dirname(__file__), "results")


def _interval(diffs: list[float]) -> tuple[float, float, float]:
  d = np.asarray(diffs, float)
  if len(d) < 2:
    return float(d.mean()), float("nan"), float("nan")
  half = stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d))
  return float(d.mean()), float(d.mean() - half), float(d.mean() + half)


def run(config: str, seeds: int, local_steps: list[int], workers: int, workdir: str,
        plain: list[int] = ()) -> dict:
  """`plain`: H values also run with plain averaging (outer SGD at lr 1, no momentum)."""
  modes = ([("sync", 1, "")] + [("local", h, "") for h in local_steps]
           + [("local", h, " plain") for h in plain])
  per = {f"{m} H={h}{p}" if m == "local" else m: [] for m, h, p in modes}
  for seed in range(seeds):
    scale = scales_lib.Scale("modes", config, (f"--config.seed={seed}",
                                               f"--config.fault.workers_per_host={workers}"))
    runner = measure.Runner(os.path.join(workdir, f"seed-{seed}"), scale)
    for (mode, h, p), name in zip(modes, per):
      flags = [f"--config.optim.mode={mode}", f"--config.optim.local_steps={h}"]
      if p:
        flags += ["--config.optim.outer_lr=1.0", "--config.optim.outer_momentum=0.0"]
      s = runner.run(name.replace(" ", "_").replace("=", ""), flags)
      per[name].append({"seed": seed, "accuracy": s["test"]["accuracy"],
                        "macro_f1": s["test"]["macro_f1"], "wall_s": s["_wall_s"],
                        "steps": s["fault_tolerance"]["steps_committed"]})
  name = os.path.splitext(os.path.basename(config.split(":")[0]))[0]
  nbytes, source = comm.load_bytes(OUT, name)
  out = {"config": config, "seeds": seeds, "workers": workers, "bytes_per_exchange": nbytes,
         "bytes_source": source, "date": time.strftime("%Y-%m-%d"), "modes": {}}
  batch = importlib.import_module(f"configs.{name}").get_config().data.batch_size
  for name, rows in per.items():
    h = 1 if name == "sync" else int(name.split("H=")[1].split()[0])
    row = {"runs": rows}
    for k in ("accuracy", "macro_f1", "wall_s"):
      row[k] = float(np.mean([r[k] for r in rows]))
      row[f"{k}_minus_sync"] = _interval([r[k] - s[k] for r, s in zip(rows, per["sync"])])
    row["bytes_sent_per_example"] = 2 * (workers - 1) / workers * nbytes / h / batch
    out["modes"][name] = row
  return out


def markdown(result: dict) -> str:
  lines = [f"# Gradient modes side by side ({result['config']}, {result['workers']} worker "
           f"processes, {result['seeds']} seeds, {result['date']})", "",
           "Test accuracy and macro F1 after the same epochs; the difference to 'sync' is "
           "paired by seed (mean [95% t-interval]). Bytes: what each worker sends per training "
           f"example on a ring ({result['bytes_source']}).", "",
           "'local' averages through DiLoCo's outer optimiser (SGD, lr 0.7, Nesterov momentum "
           "0.9: the defaults); 'plain' through SGD at lr 1 without momentum, the replicas' "
           "mean.", "",
           "| mode | accuracy | - sync | macro F1 | - sync | wall s | bytes sent per example |",
           "|---|---:|---|---:|---|---:|---:|"]
  for name, r in result["modes"].items():
    acc, f1 = r["accuracy_minus_sync"], r["macro_f1_minus_sync"]
    lines.append(f"| {name} | {r['accuracy']:.4f} | {acc[0]:+.4f} [{acc[1]:+.4f}, {acc[2]:+.4f}]"
                 f" | {r['macro_f1']:.4f} | {f1[0]:+.4f} [{f1[1]:+.4f}, {f1[2]:+.4f}] | "
                 f"{r['wall_s']:.0f} | {r.get('bytes_sent_per_example', float('nan')):,.0f} |")
  return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--config", default="configs/quickstart.py")
  parser.add_argument("--seeds", type=int, default=3)
  parser.add_argument("--local-steps", default="1,4,16,64")
  parser.add_argument("--plain", default="1,4",
                      help="H values also run with plain averaging (outer lr 1, no momentum)")
  parser.add_argument("--workers", type=int, default=2)
  parser.add_argument("--workdir", default="/tmp/bench_modes")
  parser.add_argument("--out", default=OUT)
  args = parser.parse_args(argv)
  result = run(args.config, args.seeds, [int(h) for h in args.local_steps.split(",")],
               args.workers, args.workdir, [int(h) for h in args.plain.split(",") if h])
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "bench_modes.json"), "w") as f:
    json.dump(result, f, indent=1)
  with open(os.path.join(args.out, "bench_modes.md"), "w") as f:
    f.write(markdown(result))
  print(markdown(result))
  return result


if __name__ == "__main__":
  main()
