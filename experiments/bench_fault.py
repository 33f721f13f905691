"""Fault-tolerance benchmark, measured side by side in one run; writes
experiments/results/bench_fault.json.

  python -m experiments.bench_fault [--epochs 5] [--repeats 2] [--failure-epochs 15] [--parts A,B]

A. Checkpoint overhead: the same supervised training (coordinator, agent, worker processes) with
   no checkpoints but the last, with checkpoints at every partition boundary (the lineage
   paper's policy), with the config's own policy (the quickstart's: partition boundaries at
   most one a second, config.ckpt.min_interval_s), and with checkpoints every k steps too (at
   every boundary and k-step point). Per variant: the training loop's time inside checkpoint
   calls over its wall time (summary.json fault_tolerance.checkpoint_blocking_fraction; issue
   12's targets: under 0.5% at partition boundaries, under 2% every k steps), the training wall
   time against no checkpoints (`extra_vs_none`, what the saves cost in all, the saver thread's
   share of the cores included; the lineage paper: 1.1%) and launch.py's wall time end to end.
B. Failures: a quickstart-length run with 3 injected failures (SIGKILL, SIGSTOP past the hang
   timeout, SIGTERM): waste fraction (target <= 2%; the paper: under 5%), crash detection
   (target < 1 s), hang detection (target < timeout + 2 s), recovery (target < 20 s on CPU;
   the paper: 43-47 s). experiments/bench_recovery.py breaks each recovery down by phase and
   compares the supervised run with an unsupervised one.
Training wall time is the chief worker's loop time (summary.json train.seconds): it excludes
process start-up and data preparation, which do not depend on checkpointing. A warm-up run fills
the shared compilation and decoded-record caches first, so no variant pays for compiling or
decoding. The variants run in turn,
`--repeats` times, and each is represented by its median.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from medjax import jsonl
from medjax.fault import agent

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def launch(workdir: str, overrides: list[str], config: str) -> dict:
  env = dict(os.environ, XLA_FLAGS=agent.without_device_count(os.environ.get("XLA_FLAGS", "")))
  t0 = time.perf_counter()
  with open(os.path.join(os.path.dirname(workdir), os.path.basename(workdir) + ".log"), "w") as log:
    code = subprocess.run([sys.executable, os.path.join(ROOT, "launch.py"), f"--config={config}",
                           f"--workdir={workdir}", *overrides], cwd=ROOT, env=env, stdout=log,
                          stderr=subprocess.STDOUT).returncode
  if code != 0:
    raise RuntimeError(f"run {workdir} failed ({code}); see {workdir}.log and {workdir}/logs")
  with open(os.path.join(workdir, "summary.json")) as f:
    summary = json.load(f)
  summary["_launch_s"] = time.perf_counter() - t0
  return summary


def synthesized(prefix: str, config: str, overrides=()) -> tuple[str, list[str]]:
  """A new temporary directory holding the config's synthetic cohort (written once), and the
  overrides with which runs share it, one salt (so one split) and one compilation cache."""
  base = tempfile.mkdtemp(prefix=prefix)
  subprocess.run([sys.executable, os.path.join(ROOT, "launch.py"), f"--config={config}",
                  f"--workdir={base}/synth", "--config.mode=synth", *overrides], cwd=ROOT,
                 check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  os.rename(f"{base}/synth/cohort", f"{base}/cohort")
  return base, [f"--config.mesh.compilation_cache_dir={base}/jax_cache",
                f"--config.data.salt_file={base}/id_salt", f"--config.data.root={base}/cohort"]


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--config", default="configs/quickstart.py")
  parser.add_argument("--epochs", type=int, default=5, help="epochs for the overhead runs")
  parser.add_argument("--every-k", type=int, default=25)
  parser.add_argument("--repeats", type=int, default=2, help="runs per overhead variant")
  parser.add_argument("--failure-epochs", type=int, default=15, help="quickstart's 15")
  parser.add_argument("--parts", default="A,B")
  parser.add_argument("--out", default=os.path.join(ROOT, "experiments", "results",
                                                    "bench_fault.json"))
  args = parser.parse_args()
  base, common = synthesized("bench_fault_", args.config)
  common.append(f"--config.data.cache_dir={base}/cache")

  result = {"workdirs": base}
  if "A" in args.parts:
    result["overhead"] = bench_overhead(args, base, common)
  if "B" in args.parts:
    result["failures"] = bench_failures(args, base, common)
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  if os.path.exists(args.out):   # keep the other part's last numbers
    with open(args.out) as f:
      result = {**json.load(f), **result}
  with open(args.out, "w") as f:
    json.dump(result, f, indent=2)
  print(f"wrote {args.out}")


def bench_overhead(args, base: str, common: list[str]) -> dict:
  print("A. checkpoint overhead", flush=True)
  launch(f"{base}/warmup", common + ["--config.optim.epochs=1"], args.config)
  variants = {
      "none": ["--config.ckpt.partition_boundaries=False", "--config.ckpt.every_steps=0"],
      "partition": ["--config.ckpt.partition_boundaries=True", "--config.ckpt.every_steps=0",
                    "--config.ckpt.min_interval_s=0"],
      "config": ["--config.ckpt.partition_boundaries=True", "--config.ckpt.every_steps=0"],
      "every_k": ["--config.ckpt.partition_boundaries=True",
                  f"--config.ckpt.every_steps={args.every_k}", "--config.ckpt.min_interval_s=0"],
  }
  # Checkpoints alone: host-local snapshots (bench_snapshots.py measures them) are off.
  variants = {name: flags + ["--config.ckpt.snapshot_every_steps=0"]
              for name, flags in variants.items()}
  runs = {name: [] for name in variants}
  for r in range(args.repeats):
    for name, flags in variants.items():
      s = launch(f"{base}/{name}-{r}", common + flags + [f"--config.optim.epochs={args.epochs}"],
                 args.config)
      runs[name].append({"train_s": s["train"]["seconds"],
                         "launch_s": round(s["_launch_s"], 2),
                         "test_accuracy": s["test"]["accuracy"],
                         "checkpoint_blocked_s": s["train"]["checkpoint_blocked_s"],
                         "steps": s["fault_tolerance"]["steps_committed"],
                         "checkpoints": sum(g.get("writes", 0) for g in
                                            s["fault_tolerance"]["generations"].values()),
                         "checkpoint_blocking_fraction":
                             s["fault_tolerance"]["checkpoint_blocking_fraction"]})
      r = runs[name][-1]
      print(f"  {name:<10} {r['train_s']:8.2f} s training, {r['launch_s']:7.2f} s end to end, "
            f"{r['checkpoints']} checkpoints, "
            f"{r['checkpoint_blocked_s']:.3f} s in checkpoint calls (blocking fraction "
            f"{r['checkpoint_blocking_fraction']:.3%})", flush=True)
  overhead = {}
  for name, rs in runs.items():
    overhead[name] = {k: float(np.median([r[k] for r in rs])) for k in rs[0]
                      if rs[0][k] is not None}
    overhead[name]["runs"] = rs
  none = overhead["none"]["train_s"]
  for name in ("partition", "config", "every_k"):
    overhead[name]["extra_vs_none"] = round(overhead[name]["train_s"] / none - 1, 4)
  overhead["targets"] = {"checkpoint_blocking_fraction": {"partition": 0.005, "config": 0.005,
                                                          "every_k": 0.02}}
  labels = {"partition": "every partition boundary",
            "config": f"partition boundaries, {args.config}'s floor",
            "every_k": f"every {args.every_k} steps"}
  for name, target in overhead["targets"]["checkpoint_blocking_fraction"].items():
    label = labels[name]
    print(f"checkpoints at {label}: blocking "
          f"{overhead[name]['checkpoint_blocking_fraction']:.3%} of training (target < "
          f"{target:.1%}); training wall time {overhead[name]['extra_vs_none']:+.2%} against none")
  return overhead


def bench_failures(args, base: str, common: list[str]) -> dict:
  print("B. a quickstart-length run with 3 failures", flush=True)
  clean = launch(f"{base}/clean", common + [f"--config.optim.epochs={args.failure_epochs}"],
                 args.config)
  total = clean["fault_tolerance"]["steps_committed"]
  # Process 0: the default layout on a CPU host is one worker process (medjax/fault/layout.py).
  faults = (f"kill@step={total // 4}:process=0; sigstop@step={total // 2}:process=0; "
            f"sigterm@step={3 * total // 4}:process=0")
  s = launch(f"{base}/faulty", common + [f"--config.optim.epochs={args.failure_epochs}",
                                         f"--config.fault.inject={faults}",
                                         f"--config.ckpt.every_steps={args.every_k}"],
             args.config)
  ft = s["fault_tolerance"]
  failures = {"faults": faults, "steps": total,
              "recovery_breakdown": recovery_breakdown(f"{base}/faulty"), **{k: ft[k] for k in (
      "failures", "restarts", "steps_executed", "steps_committed", "waste_fraction",
      "checkpoint_blocking_fraction", "exactly_once")},
              "clean_train_s": clean["train"]["seconds"],
              "clean_launch_s": round(clean["_launch_s"], 2),
              "faulty_launch_s": round(s["_launch_s"], 2),
              "test_accuracy_clean": clean["test"]["accuracy"],
              "test_accuracy_faulty": s["test"]["accuracy"],
              "targets": {"waste_fraction": 0.02, "crash_detected_s": 1.0,
                          "hang_detected_s": "timeout_training_s + 2", "recovered_s": 20.0}}
  print(f"3 failures: waste {ft['waste_fraction']:.2%} (target <= 2%), exactly once "
        f"{ft['exactly_once']}")
  for f, parts in zip(ft["failures"], failures["recovery_breakdown"]):
    print(f"  {f['kind']:<11} worker {f['worker']}: detected {f['detected_s']:.2f} s, recovered "
          f"{f['recovered_s']} s ({', '.join(f'{k} {v} s' for k, v in parts.items())})")
  return failures


def recovery_breakdown(workdir: str) -> list[dict]:
  """Per failure, from events.jsonl: detection -> generation stopped -> next generation started
  -> its first training step."""
  out, pending = [], None
  for e in jsonl.read(os.path.join(workdir, "events.jsonl")):
    if e["event"] == "failure":
      pending = {"failure": e["time"]}
    elif pending is not None and e["event"] in ("generation_stopped", "generation_start",
                                                "first_step"):
      pending.setdefault(e["event"], e["time"])
      if e["event"] == "first_step":
        out.append({"stop_s": round(pending["generation_stopped"] - pending["failure"], 2),
                    "restart_wait_s": round(pending["generation_start"]
                                            - pending["generation_stopped"], 2),
                    "start_to_first_step_s": round(e["time"] - pending["generation_start"], 2)})
        pending = None
  return out


if __name__ == "__main__":
  main()
