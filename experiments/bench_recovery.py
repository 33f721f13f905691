"""Recovery and the cost of supervision, measured side by side in one run; writes
experiments/results/recovery.json and prints a table.

  python -m experiments.bench_recovery [--epochs 15] [--failure-epochs 30] [--repeats 2]
                                       [--parts A,B,C,W] [--layouts auto,auto-always,2]

A. Supervision cost: the default quickstart (supervised: coordinator, agent and worker processes
   in the auto layout, medjax/fault/layout.py) against an unsupervised run
   (--config.fault.supervised=False) of the same config, cohort, salt and ingest, each after a
   warm-up of the shared compilation cache: launch.py's wall time end to end (both reuse
   a copy of one ingest and its decoded cache, so the ratio is over start-up, training and
   evaluation), training time (summary.json train.seconds), test accuracy and macro F1. The
   variants alternate, `--repeats` times; each is represented by its median, and each round's
   pair by its ratio (the median of those, with a bootstrap 90% interval: on a shared machine
   the speed drifts between rounds by more than the effect measured).
   Target: supervised <= 1.05x the unsupervised wall time, with the same accuracy.
W. The same comparison over whole runs, as a new user runs the quickstart (--parts W): each run
   starts in an empty workdir and synthesizes, ingests (decoding every DICOM file) and caches its
   cohort, then trains and evaluates; only the compilation cache and the salt are shared.
B. Recovery per failure kind: a supervised run per layout ('auto': one worker process, the
   default fault.warm_standby='after_failure', so the first restart takes a spare standby that
   imported while the run started and later ones a spare prepared ahead; '2': two worker
   processes, the multi-process path, whose spares after the first restart join
   jax.distributed and prepare as a group; '-always' as in 'auto-always' or '2-always':
   fault.warm_standby='always', spares prepared from the start), with three faults sent from
   outside, each once the spare standbys are prepared (where there are any to prepare; otherwise
   --settle-s after the previous recovery): SIGKILL (crash), SIGSTOP (hang), SIGTERM
   (preemption). Per failure:
   detection, recovery (detection -> the next generation's first step; target < 3 s) and where
   it went, phase by phase (summary.json fault_tolerance.failures[].recovery), what it resumed
   from (a host-local snapshot or a checkpoint) and the steps it lost; per run, the waste
   (target < 0.5%). A layout suffixed '-nosnap' (e.g. 'auto-nosnap') runs without host-local
   snapshots (config.ckpt.snapshot_every_steps=0): the checkpoints alone, side by side.
C. What preparing ahead costs a run that never fails (--parts C): the quickstart in two worker
   processes, fault.warm_standby='always' (a standby group prepares from the start) against the
   default 'after_failure' (nothing prepared until a failure), alternating like A.
The machine's load average is recorded with every run: on a shared machine the ratios are what
compare, not the absolute times.
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import psutil

from medjax import jsonl
from medjax.fault import layout as layout_lib
from medjax.runtime import inject

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KINDS = (("crash", "kill", signal.SIGKILL), ("hang", "sigstop", signal.SIGSTOP),
         ("preemption", "sigterm", signal.SIGTERM))


def _env() -> dict:
  env = dict(os.environ)
  env.pop("XLA_FLAGS", None)
  env.setdefault("JAX_PLATFORMS", "cpu")
  return env


def start(workdir: str, overrides: list[str], config: str) -> subprocess.Popen:
  log = open(workdir.rstrip("/") + ".log", "w")
  return subprocess.Popen([sys.executable, os.path.join(ROOT, "launch.py"), f"--config={config}",
                           f"--workdir={workdir}", *overrides], cwd=ROOT, env=_env(),
                          stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def finish(proc: subprocess.Popen, workdir: str, t0: float, timeout: float = 3600) -> dict:
  try:
    code = proc.wait(timeout=timeout)
  except subprocess.TimeoutExpired:
    os.killpg(proc.pid, signal.SIGKILL)
    raise
  wall = time.perf_counter() - t0
  if code != 0:
    raise RuntimeError(f"run {workdir} failed ({code}); see {workdir}.log and {workdir}/logs")
  with open(os.path.join(workdir, "summary.json")) as f:
    summary = json.load(f)
  summary["_launch_s"] = round(wall, 2)
  return summary


def launch(workdir: str, overrides: list[str], config: str) -> dict:
  t0 = time.perf_counter()
  return finish(start(workdir, overrides, config), workdir, t0)


def warm_up(workdir: str, overrides: list[str], config: str, timeout: float = 900) -> None:
  """Runs until the first training step is logged (the step is compiled), then stops the run."""
  proc = start(workdir, overrides, config)
  metrics = os.path.join(workdir, "metrics.jsonl")
  deadline = time.time() + timeout
  try:
    while time.time() < deadline and proc.poll() is None:
      if os.path.exists(metrics) and os.path.getsize(metrics) > 0:
        break
      time.sleep(0.5)
  finally:
    if proc.poll() is None:
      os.killpg(proc.pid, signal.SIGKILL)
      proc.wait()


def prepared_base(config: str) -> tuple[str, list[str]]:
  """A temporary directory with the config's cohort, salt and one ingest (with its decoded
  cache); the overrides with which runs share cohort, salt and compilation cache."""
  base = tempfile.mkdtemp(prefix="bench_recovery_")
  common = [f"--config.mesh.compilation_cache_dir={base}/jax_cache",
            f"--config.data.salt_file={base}/id_salt"]
  subprocess.run([sys.executable, os.path.join(ROOT, "launch.py"), f"--config={config}",
                  f"--workdir={base}/synth", "--config.mode=synth", *common], cwd=ROOT,
                 check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env())
  os.rename(f"{base}/synth/cohort", f"{base}/cohort")
  common.append(f"--config.data.root={base}/cohort")
  subprocess.run([sys.executable, os.path.join(ROOT, "launch.py"), f"--config={config}",
                  f"--workdir={base}/ingested", "--config.mode=ingest", *common], cwd=ROOT,
                 check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env())
  return base, common


def workdir_from(base: str, name: str, *, empty: bool = False) -> str:
  """A run directory holding a copy of the shared ingest and decoded cache (`empty`: nothing,
  the run synthesizes and ingests its own cohort)."""
  workdir = os.path.join(base, name)
  os.makedirs(workdir)
  for part in () if empty else ("ingest", "cache"):
    shutil.copytree(os.path.join(base, "ingested", part), os.path.join(workdir, part))
  return workdir


def load() -> float:
  return round(os.getloadavg()[0], 2)


def stolen_s() -> float:
  """CPU seconds the hypervisor has taken from this machine's vCPUs since boot (/proc/stat's
  steal column; 0 where there is none): on a shared VM, a run's share of it says how much of its
  time was not the code's."""
  try:
    with open("/proc/stat") as f:
      fields = f.readline().split()
    return int(fields[8]) / os.sysconf("SC_CLK_TCK")
  except (OSError, IndexError, ValueError):
    return 0.0


def alternate(args, base: str, common: list[str], modes: dict[str, list[str]], *,
              whole: bool = False) -> dict:
  """Clean runs of each mode (its flags), alternating, `--repeats` times, after a warm-up of
  each mode's compiled programs: {mode: [run, ...]} with wall and training seconds, accuracy.
  Every other round runs the modes in reverse order (A B, B A, ...): on this shared machine the
  run after another ran measurably slower or faster by turns, and a fixed order put it on one
  mode (supervised / unsupervised training 1.07x in one order, 0.90x in the other, same code).
  `whole`: each run starts in an empty workdir (synthesizes and ingests its cohort)."""
  for mode, flags in modes.items():
    # The compilation cache for every mode, with the same programs (the learning-rate schedule,
    # so the epoch count, is part of the step): each runs to its first step, then is stopped.
    warm_up(workdir_from(base, f"warmup-{mode}"),
            common + flags + [f"--config.optim.epochs={args.epochs}"], args.config)
  runs = {mode: [] for mode in modes}
  for r in range(args.repeats):
    for mode, flags in list(modes.items())[::1 if r % 2 == 0 else -1]:
      before, stolen = load(), stolen_s()
      s = launch(workdir_from(base, f"{'whole-' if whole else ''}{mode}-{r}", empty=whole),
                 common + flags + [f"--config.optim.epochs={args.epochs}"], args.config)
      stolen = round(stolen_s() - stolen, 2)
      runs[mode].append({"wall_s": s["_launch_s"], "train_s": s["train"]["seconds"],
                         "accuracy": s["test"]["accuracy"], "macro_f1": s["test"]["macro_f1"],
                         "processes": s["train"]["processes"], "devices": s["train"]["devices"],
                         "load_before": before, "load_after": load(), "stolen_cpu_s": stolen})
      print(f"  {mode:<13} wall {s['_launch_s']:7.1f} s, training {s['train']['seconds']:7.1f} s, "
            f"accuracy {s['test']['accuracy']:.4f}, macro F1 {s['test']['macro_f1']:.4f} "
            f"(load {before} -> {load()}; {stolen} s of CPU stolen by the hypervisor)",
            flush=True)
  return runs


def _compared(runs: dict, baseline: str, variant: str) -> dict:
  """Each mode's median wall and training seconds (and its runs), and `variant` / `baseline`."""
  out = {mode: {"median_wall_s": float(np.median([r["wall_s"] for r in rs])),
                "median_train_s": float(np.median([r["train_s"] for r in rs])), "runs": rs}
         for mode, rs in runs.items()}
  for ratio, key in (("wall_ratio", "median_wall_s"), ("train_ratio", "median_train_s")):
    out[ratio] = round(out[variant][key] / out[baseline][key], 4)
  # Each round's two runs ran back to back: their ratio is taken on the same machine state,
  # where the medians above mix rounds (this shared machine's speed drifted by 30% within one
  # benchmark: an unsupervised run took 16.6 s in the first round and 12.5 s in the third).
  for ratio, key in (("round_wall_ratios", "wall_s"), ("round_train_ratios", "train_s")):
    out[ratio] = [round(v[key] / b[key], 4) for b, v in zip(runs[baseline], runs[variant])]
    out["median_" + ratio.removesuffix("s")] = round(float(np.median(out[ratio])), 4)
    out["median_" + ratio.removesuffix("s") + "_ci90"] = _median_ci(out[ratio])
  return out


def _median_ci(values: list[float], level: float = 0.90, resamples: int = 10_000) -> list[float]:
  """A bootstrap interval of the median of `values` (the rounds resampled with replacement):
  how far the machine's drift between rounds leaves the median round ratio uncertain."""
  draws = np.random.default_rng(0).choice(values, size=(resamples, len(values)))
  medians = np.median(draws, axis=1)
  return [round(float(q), 4) for q in np.quantile(medians, [(1 - level) / 2, (1 + level) / 2])]


# -- C. what preparing ahead costs a run that does not fail ------------------------------------

def bench_prepare_cost(args, base: str, common: list[str]) -> dict:
  """Two worker processes without a failure: spare standbys prepared from the start (a group,
  fault.warm_standby='always') against the default, which prepares only after a failure."""
  print("C. two processes, no failure: warm_standby 'always' vs 'after_failure'", flush=True)
  two = ["--config.fault.workers_per_host=2"]
  runs = alternate(args, base, common, {"after_failure": two,
                                        "always": two + ["--config.fault.warm_standby=always"]})
  return _compared(runs, "after_failure", "always")


# -- A. supervision cost -----------------------------------------------------------------------

def bench_overhead(args, base: str, common: list[str], *, whole: bool = False) -> dict:
  if whole:
    print("W. supervised vs unsupervised, each run from an empty workdir (synthesis and ingest "
          "included), same config and salt", flush=True)
    common = [c for c in common if not c.startswith("--config.data.root=")]
  else:
    print("A. supervised (default layout) vs unsupervised, same config, cohort, salt and "
          "ingest", flush=True)
  modes = {"unsupervised": ["--config.fault.supervised=False"], "supervised": []}
  runs = alternate(args, base, common, modes, whole=whole)
  out = _compared(runs, "unsupervised", "supervised")
  out["same_accuracy"] = all(
      a["accuracy"] == b["accuracy"] and a["macro_f1"] == b["macro_f1"]
      for a, b in zip(runs["supervised"], runs["unsupervised"]))
  out["target_wall_ratio"] = 1.05
  return out


# -- B. recovery per failure kind --------------------------------------------------------------

def _events(workdir: str) -> list[dict]:
  path = os.path.join(workdir, "events.jsonl")
  return jsonl.read(path) if os.path.exists(path) else []


def _training_generation(workdir: str) -> int | None:
  """The newest generation that has taken its first step, if it still runs."""
  events = _events(workdir)
  started = [e["generation"] for e in events if e["event"] == "generation_start"]
  stepped = {e["generation"] for e in events if e["event"] == "first_step"}
  if not started or started[-1] not in stepped or any(e["event"] == "done" for e in events):
    return None
  return started[-1]


def _worker(workdir: str, generation: int, process: int) -> psutil.Process | None:
  log = f"gen-{generation:03d}-proc-{process:03d}.log"
  for p in psutil.process_iter(["cmdline"]):
    try:
      cmd = p.info["cmdline"] or []
      if (f"--workdir={workdir}" in cmd and "--role=worker" in cmd
          and any(f.path.endswith(log) for f in p.open_files())):
        return p
    except psutil.Error:
      pass
  return None


def _standby_ready(workdir: str, needed: int) -> bool:
  path = os.path.join(workdir, "logs", "standby-host-0.log")
  if not os.path.exists(path):
    return False
  with open(path, errors="replace") as f:
    return f.read().count("standby: prepared") >= needed


def bench_failures(args, base: str, common: list[str], layout: str) -> dict:
  name = f"faults-{layout}"
  flags = [f"--config.optim.epochs={args.failure_epochs}"]
  # 'auto': the default (config.fault.warm_standby='after_failure': the first restart takes a
  # spare that imported at the start, later ones a spare prepared ahead); '-always' (e.g.
  # 'auto-always', '2-always'): spares prepared from the start, so the first restart takes them
  # too; '2': two worker processes.
  if layout.endswith("-nosnap"):   # the checkpoints alone (no host-local snapshots)
    flags.append("--config.ckpt.snapshot_every_steps=0")
  shape = layout.removesuffix("-nosnap")
  always = shape.endswith("-always")
  shape = shape.removesuffix("-always")
  # Spares are prepared ahead on a CPU or GPU host (agent.warm_key; several processes of one
  # host as a group, one "standby: prepared" line each): on a TPU the faults are sent
  # --settle-s after each recovery instead of waiting for spares that never get ready.
  warm = layout_lib.accelerators(_env())[0] in layout_lib.PREPARE_AHEAD_ON
  processes = 1 if shape == "auto" else int(shape)
  if always:
    flags.append("--config.fault.warm_standby=always")
  if shape != "auto":
    flags.append(f"--config.fault.workers_per_host={shape}")
  workdir = workdir_from(base, name)
  print(f"B. recovery, layout {layout}: {', '.join(k for k, _, _ in KINDS)} sent from outside",
        flush=True)
  t0 = time.perf_counter()
  proc = start(workdir, common + flags, args.config)
  sent, load_at = [], []
  try:
    for i, (kind, marker, sig) in enumerate(KINDS):
      deadline = time.time() + args.wait_s
      while time.time() < deadline and proc.poll() is None:
        gen = _training_generation(workdir)
        # With a spare to be prepared, once it is; otherwise after settle_s of training.
        prepared = (i + 1 if always else i) * processes
        ready = gen is not None and (
            _standby_ready(workdir, prepared) if warm and prepared else
            time.time() - _first_step_time(workdir, gen) > args.settle_s)
        if ready:
          break
        time.sleep(0.2)
      else:
        print(f"  {kind}: not sent (the run ended or no standby got ready)", flush=True)
        break
      process = 0 if (shape == "auto" or kind == "hang") else 1
      victim = _worker(workdir, gen, process)
      if victim is None:
        print(f"  {kind}: no worker {process} of generation {gen} found", flush=True)
        break
      load_at.append(load())
      inject.record_external(workdir, marker, process=process, pid=victim.pid)
      victim.send_signal(sig)
      sent.append({"kind": kind, "generation": gen, "process": process})
      # Wait for the next generation's first step before the next fault.
      recovered = lambda: any(e["event"] == "first_step" and e["generation"] > gen
                              for e in _events(workdir))
      deadline = time.time() + args.wait_s
      while not recovered() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    s = finish(proc, workdir, t0)
  finally:
    if proc.poll() is None:
      os.killpg(proc.pid, signal.SIGKILL)
  ft = s["fault_tolerance"]
  for f in ft["failures"]:
    r = f.get("recovery") or {}
    print(f"  {f['kind']:<11} detected {f['detected_s']:6.3f} s, recovered {f['recovered_s']} s "
          f"by {r.get('path')} from {(r.get('restored_from') or {}).get('from')}, "
          f"{f.get('steps_lost')} steps lost: " + ", ".join(
              f"{k} {v:.3f}" for k, v in (r.get("phases_s") or {}).items()), flush=True)
  print(f"  waste {ft['waste_fraction']:.2%} ({ft['steps_executed']} steps executed, "
        f"{ft['steps_committed']} kept)", flush=True)
  return {"layout": layout, "sent": sent, "load_at_faults": load_at,
          "failures": ft["failures"], "waste_fraction": ft["waste_fraction"],
          "exactly_once": ft["exactly_once"], "launch_s": s["_launch_s"],
          "accuracy": s["test"]["accuracy"], "target_recovered_s": 3.0}


def _first_step_time(workdir: str, generation: int) -> float:
  for e in _events(workdir):
    if e["event"] == "first_step" and e["generation"] == generation:
      return e["time"]
  return time.time()


def _overhead_lines(a: dict, what: str) -> list[str]:
  lines = [f"{'run (' + what + ')':<26}{'wall s':>9}{'train s':>9}{'accuracy':>10}"
           f"{'macro F1':>10}"]
  for mode in ("unsupervised", "supervised"):
    for r in a[mode]["runs"]:
      lines.append(f"{mode:<26}{r['wall_s']:>9.1f}{r['train_s']:>9.1f}{r['accuracy']:>10.4f}"
                   f"{r['macro_f1']:>10.4f}")
  lines.append(f"supervised / unsupervised: wall {a['wall_ratio']:.3f} (target <= 1.05), "
               f"training {a['train_ratio']:.3f}, same accuracy: {a['same_accuracy']}")
  if "round_wall_ratios" in a:
    ci = lambda key: "" if key not in a else f", 90% interval {a[key][0]:.3f}-{a[key][1]:.3f}"
    lines.append(f"  each round's pair: wall {a['round_wall_ratios']} (median "
                 f"{a['median_round_wall_ratio']:.3f}{ci('median_round_wall_ratio_ci90')}), "
                 f"training {a['round_train_ratios']} (median "
                 f"{a['median_round_train_ratio']:.3f}{ci('median_round_train_ratio_ci90')})")
  return lines


def table(result: dict) -> str:
  lines = []
  for part, what in (("overhead", "ingest reused"), ("overhead_whole", "whole runs")):
    if result.get(part):
      lines += _overhead_lines(result[part], what)
  c = result.get("prepare_cost")
  if c:
    lines.append(f"two processes, no failure, warm_standby always / after_failure: wall "
                 f"{c['wall_ratio']:.3f}, training {c['train_ratio']:.3f}")
  for b in result.get("failures", []):
    lines.append(f"layout {b['layout']}: waste {b['waste_fraction']:.2%}, exactly once "
                 f"{b['exactly_once']}")
    for f in b["failures"]:
      r = f.get("recovery") or {}
      lines.append(f"  {f['kind']:<11}{'detect':>7} {f['detected_s']:6.3f} s  recover "
                   f"{f['recovered_s']} s  {r.get('path')}, from "
                   f"{(r.get('restored_from') or {}).get('from')}, {f.get('steps_lost')} steps "
                   "lost")
      lines.append("    " + ", ".join(f"{k} {v:.3f}" for k, v in
                                      (r.get("phases_s") or {}).items()))
  return "\n".join(lines)


def carry_forward(result: dict, previous: dict) -> None:
  """Keeps the newest measurement of every part and layout at the top level, which the report
  and the failure simulation read (experiments/failure_sim/inputs.py): the parts this run did
  not measure and the layouts it did not run come from the previous top level, and `carried`
  says from which run ('started' time) each one is."""
  carried = {}
  source = lambda key: previous.get("carried", {}).get(key, previous.get("started"))
  for part in ("overhead", "overhead_whole", "prepare_cost"):
    if part not in result and part in previous:
      result[part], carried[part] = previous[part], source(part)
  ran = {b["layout"] for b in result.get("failures", [])}
  for b in previous.get("failures", []):
    if b["layout"] not in ran:
      result.setdefault("failures", []).append(b)
      carried[f"failures.{b['layout']}"] = source(f"failures.{b['layout']}")
  if carried:
    result["carried"] = carried


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--config", default="configs/quickstart.py")
  parser.add_argument("--epochs", type=int, default=15, help="part A (the quickstart's 15)")
  parser.add_argument("--failure-epochs", type=int, default=30,
                      help="part B: long enough for three faults with recoveries")
  parser.add_argument("--settle-s", type=float, default=4.0,
                      help="part B: training before a fault where no spare is prepared")
  parser.add_argument("--repeats", type=int, default=2)
  parser.add_argument("--parts", default="A,B")
  parser.add_argument("--layouts", default="auto,auto-always,2")
  parser.add_argument("--wait-s", type=float, default=180.0)
  parser.add_argument("--out", default=os.path.join(ROOT, "experiments", "results",
                                                    "recovery.json"))
  args = parser.parse_args()
  base, common = prepared_base(args.config)
  result = {"workdirs": base, "cpus": os.cpu_count(), "load_at_start": load(),
            "config": args.config, "started": time.strftime("%Y-%m-%d %H:%M:%S"),
            "args": vars(args)}
  if "A" in args.parts:
    result["overhead"] = bench_overhead(args, base, common)
  if "W" in args.parts:
    result["overhead_whole"] = bench_overhead(args, base, common, whole=True)
  if "B" in args.parts:
    result["failures"] = [bench_failures(args, base, common, layout)
                          for layout in args.layouts.split(",")]
  if "C" in args.parts:
    result["prepare_cost"] = bench_prepare_cost(args, base, common)
  result["load_at_end"] = load()
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  if os.path.exists(args.out):   # earlier runs stay, newest first
    with open(args.out) as f:
      previous = json.load(f)
    result["earlier_runs"] = ([{k: v for k, v in previous.items() if k != "earlier_runs"}]
                              + previous.get("earlier_runs", []))
    carry_forward(result, previous)
  with open(args.out, "w") as f:
    json.dump(result, f, indent=2)
  print(table(result))
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
