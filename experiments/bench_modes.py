"""Gradient modes side by side (issue 35): 'sync' against 'local' at several H, the same runs.

  python -m experiments.bench_modes [--config configs/quickstart.py] [--seeds 3]
      [--local-steps 1,4,16,64] [--plain 1,4] [--workers 2] [--workdir /tmp/bench_modes]
      [--slow-step-s 0.1] [--late-after-s 0.1]

Every run is `launch.py` as a user runs it (supervised), with `--workers` worker processes of
one CPU device each (so 'local' trains that many replicas, one per process, over gloo). Per seed
one synthetic cohort, salt (so one split), compilation cache and decoded cache serve every
mode; `--config.seed` is the seed. All modes see the same examples (the same epochs).

With --slow-step-s, 'sync' and 'local' (H=16) run again with worker 1 slowed (a 'slow' fault),
'local' once waiting for it at each round's end and cutting it short (optim.late_after_s) with
DiLoCo's outer optimiser and with plain averaging.

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


def _modes(local_steps: list[int], plain: list[int], slow_s: float, late_after_s: float,
           straggler_h: int) -> dict[str, list[str]]:
  """name -> the flags of its runs."""
  local = lambda h: ["--config.optim.mode=local", f"--config.optim.local_steps={h}"]
  modes = {"sync": ["--config.optim.mode=sync"]}
  modes.update({f"local H={h}": local(h) for h in local_steps})
  modes.update({f"local H={h} plain": [*local(h), "--config.optim.outer_lr=1.0",
                                       "--config.optim.outer_momentum=0.0"] for h in plain})
  if slow_s > 0:
    slowed = ["--config.fault.inject=slow@step=1:process=1", f"--config.fault.slow_step_s={slow_s}"]
    modes["sync, one worker slowed"] = [*modes["sync"], *slowed]
    modes[f"local H={straggler_h}, one worker slowed"] = [*local(straggler_h), *slowed]
    modes[f"local H={straggler_h}, one worker slowed, late cut"] = [
        *local(straggler_h), *slowed, f"--config.optim.late_after_s={late_after_s}"]
    modes[f"local H={straggler_h}, one worker slowed, late cut, plain"] = [
        *modes[f"local H={straggler_h}, one worker slowed, late cut"],
        "--config.optim.outer_lr=1.0", "--config.optim.outer_momentum=0.0"]
  return modes


def run(config: str, seeds: int, local_steps: list[int], workers: int, workdir: str,
        plain: list[int] = (), slow_s: float = 0.0, late_after_s: float = 0.1,
        straggler_h: int = 16) -> dict:
  """`plain`: H values also run with plain averaging (outer SGD at lr 1, no momentum);
  `slow_s` > 0: also sync and local (H=`straggler_h`) with worker 1 slowed by that much a step,
  local both waiting for it and cutting it short after `late_after_s`."""
  modes = _modes(local_steps, plain, slow_s, late_after_s, straggler_h)
  per = {name: [] for name in modes}
  for seed in range(seeds):
    scale = scales_lib.Scale("modes", config, (f"--config.seed={seed}",
                                               f"--config.fault.workers_per_host={workers}"))
    runner = measure.Runner(os.path.join(workdir, f"seed-{seed}"), scale)
    for name, flags in modes.items():
      label = name.replace(", ", "_").replace(" ", "_").replace("=", "")
      s = runner.run(label, flags)
      per[name].append({"seed": seed, "accuracy": s["test"]["accuracy"],
                        "macro_f1": s["test"]["macro_f1"], "wall_s": s["_wall_s"],
                        "steps": s["fault_tolerance"]["steps_committed"],
                        "rounds": s["train"].get("rounds"),
                        # A restarted run (a hang, a crash) measures its recovery, not its mode.
                        "failures": [f["kind"] for f in s["fault_tolerance"]["failures"]]})
  name = os.path.splitext(os.path.basename(config.split(":")[0]))[0]
  nbytes, source = comm.load_bytes(OUT, name)
  out = {"config": config, "seeds": seeds, "workers": workers, "bytes_per_exchange": nbytes,
         "bytes_source": source, "date": time.strftime("%Y-%m-%d"), "slow_step_s": slow_s,
         "late_after_s": late_after_s, "modes": {}}
  batch = importlib.import_module(f"configs.{name}").get_config().data.batch_size
  for name, rows in per.items():
    h = 1 if name.startswith("sync") else int(name.split("H=")[1].split()[0].rstrip(","))
    row = {"runs": rows}
    for k in ("accuracy", "macro_f1", "wall_s"):
      row[k] = float(np.mean([r[k] for r in rows]))
      row[f"{k}_minus_sync"] = _interval([r[k] - s[k] for r, s in zip(rows, per["sync"])])
    # Per example trained: catch-up steps (late cuts) train the records a cut replica skipped.
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
           *([f"'one worker slowed': worker 1 sleeps {result['slow_step_s']} s after every step "
              "it trains (a 'slow' fault: config.fault.inject). 'late cut': "
              f"optim.late_after_s={result['late_after_s']}, a round goes on without the rest "
              "of a late replica's steps, whose records train in the epoch's catch-up "
              "(exactly once), and the other process trains on past the round's end while "
              "it waits.", ""] if result.get("slow_step_s") else []),
           "| mode | accuracy | - sync | macro F1 | - sync | wall s | bytes sent per example |",
           "|---|---:|---|---:|---|---:|---:|"]
  for name, r in result["modes"].items():
    acc, f1 = r["accuracy_minus_sync"], r["macro_f1_minus_sync"]
    lines.append(f"| {name} | {r['accuracy']:.4f} | {acc[0]:+.4f} [{acc[1]:+.4f}, {acc[2]:+.4f}]"
                 f" | {r['macro_f1']:.4f} | {f1[0]:+.4f} [{f1[1]:+.4f}, {f1[2]:+.4f}] | "
                 f"{r['wall_s']:.0f} | {r.get('bytes_sent_per_example', float('nan')):,.0f} |")
  failed = [f"{name} (seed {r['seed']}: {', '.join(r['failures'])})"
            for name, m in result["modes"].items() for r in m["runs"] if r.get("failures")]
  lines += ["", "Runs that failed and restarted (their figures measure a recovery, not the "
            "mode): " + ("; ".join(failed) if failed else "none.")]
  return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--config", default="configs/quickstart.py")
  parser.add_argument("--seeds", type=int, default=3)
  parser.add_argument("--local-steps", default="1,4,16,64")
  parser.add_argument("--plain", default="1,4",
                      help="H values also run with plain averaging (outer lr 1, no momentum)")
  parser.add_argument("--workers", type=int, default=2)
  parser.add_argument("--slow-step-s", type=float, default=0.1,
                      help="also run with worker 1 slowed by this much a step (0: not)")
  parser.add_argument("--late-after-s", type=float, default=0.1)
  parser.add_argument("--workdir", default="/tmp/bench_modes")
  parser.add_argument("--out", default=OUT)
  args = parser.parse_args(argv)
  result = run(args.config, args.seeds, [int(h) for h in args.local_steps.split(",")],
               args.workers, args.workdir, [int(h) for h in args.plain.split(",") if h],
               slow_s=args.slow_step_s, late_after_s=args.late_after_s)
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "bench_modes.json"), "w") as f:
    json.dump(result, f, indent=1)
  with open(os.path.join(args.out, "bench_modes.md"), "w") as f:
    f.write(markdown(result))
  print(markdown(result))
  return result


if __name__ == "__main__":
  main()
