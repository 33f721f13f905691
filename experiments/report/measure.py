"""The report's measured runs: the same training and the same injected failures under each
checkpoint strategy (Table I), through launch.py as a user runs it, and the missing-modality
ablation. A run whose workdir holds a summary.json and the fingerprint of the current code and
run flags is reused instead of run again."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time

from experiments.report import scales as scales_lib
from medjax import jsonl
from medjax.fault import agent

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Table I's rows: (name, label, the paper's row or None, --config.ckpt.* flags given the scale and
# the time-based interval).
STRATEGIES = (
    ("none", "No checkpoint", "No checkpoint"),
    ("epoch", "Epoch-level", "Epoch-level"),
    ("time", "Time-based", "Time-based"),
    ("lineage", "Lineage (partition boundaries)", "Ours"),
    ("lineage_k", "Lineage + every k steps", None),
)


def log(msg: str) -> None:
  print(f"[report {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def code_fingerprint() -> str:
  """The code a run would execute: the git tree of medjax/, configs/ and launch.py, plus any
  uncommitted change to them."""
  def git(*args):
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout
  tree = git("rev-parse", "HEAD:medjax", "HEAD:configs", "HEAD:launch.py")
  dirty = git("diff", "HEAD", "--", "medjax", "configs", "launch.py")
  return hashlib.sha256((tree + dirty).encode()).hexdigest()[:16]


def ckpt_flags(strategy: str, scale: scales_lib.Scale, interval_s: float) -> list[str]:
  flags = {"none": ["--config.ckpt.strategy=none"],
           "epoch": ["--config.ckpt.strategy=epoch"],
           "time": ["--config.ckpt.strategy=time", f"--config.ckpt.every_seconds={interval_s:.3f}"],
           "lineage": ["--config.ckpt.strategy=lineage", "--config.ckpt.partition_boundaries=True"],
           "lineage_k": ["--config.ckpt.strategy=lineage",
                         "--config.ckpt.partition_boundaries=True",
                         f"--config.ckpt.every_steps={scale.every_k}"]}[strategy]
  # The paper's strategies have no host-local tier: snapshots off, so that a row measures its
  # checkpoints alone (bench_recovery.py measures them with and without snapshots); and its
  # lineage rows save at every boundary, without the quickstart's floor between saves.
  return (flags + ([] if strategy == "lineage_k" else ["--config.ckpt.every_steps=0"])
          + ["--config.ckpt.snapshot_every_steps=0", "--config.ckpt.min_interval_s=0"])


class Runner:
  """Runs launch.py into <workdir>/<name>, or reuses what a run with the same flags and code
  left there."""

  def __init__(self, workdir: str, scale: scales_lib.Scale, *, reuse: bool = True):
    self.workdir, self.scale, self.reuse = workdir, scale, reuse
    self.fingerprint = code_fingerprint()
    self.reused: list[str] = []
    os.makedirs(workdir, exist_ok=True)
    self.shared = self._shared()

  def _shared(self) -> list[str]:
    """One synthetic cohort, salt (so one split), compilation cache and decoded-record cache for
    every run, written once. The compilation cache is JAX_COMPILATION_CACHE_DIR where the
    environment sets it (the runs' workers use it then, as every medjax run does)."""
    base = self.workdir
    if not os.path.isdir(f"{base}/cohort"):
      log(f"synthesising the {self.scale.config} cohort into {base}/cohort")
      subprocess.run([sys.executable, os.path.join(ROOT, "launch.py"),
                      f"--config={self.scale.config}", f"--workdir={base}/synth",
                      "--config.mode=synth", *self.scale.overrides], cwd=ROOT, check=True,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
      os.rename(f"{base}/synth/cohort", f"{base}/cohort")
    own_cache = ([] if os.environ.get("JAX_COMPILATION_CACHE_DIR") else
                 [f"--config.mesh.compilation_cache_dir={base}/jax_cache"])
    return [*own_cache, f"--config.data.salt_file={base}/id_salt",
            f"--config.data.root={base}/cohort", f"--config.data.cache_dir={base}/cache"]

  def run(self, name: str, flags: list[str]) -> dict:
    """summary.json of launch.py run with the scale's config and `flags`, plus '_wall_s' (the
    launch's wall time) and '_workdir'."""
    workdir = os.path.join(self.workdir, name)
    argv = [f"--config={self.scale.config}", *self.scale.overrides, *self.shared, *flags]
    key = {"argv": argv, "code": self.fingerprint}
    stamp = os.path.join(workdir, "report_run.json")
    if self.reuse and os.path.exists(stamp) and os.path.exists(f"{workdir}/summary.json"):
      with open(stamp) as f:
        saved = json.load(f)
      if saved.get("key") == key:
        self.reused.append(name)
        log(f"{name}: reused ({workdir})")
        return self._summary(workdir, saved["wall_s"])
    if os.path.exists(workdir):
      subprocess.run(["rm", "-rf", workdir], check=True)
    log(f"{name}: launch.py " + " ".join(flags))
    env = dict(os.environ, XLA_FLAGS=agent.without_device_count(os.environ.get("XLA_FLAGS", "")))
    t0 = time.perf_counter()
    os.makedirs(os.path.dirname(workdir), exist_ok=True)
    with open(workdir + ".log", "w") as out:
      code = subprocess.run([sys.executable, os.path.join(ROOT, "launch.py"), *argv,
                             f"--workdir={workdir}"], cwd=ROOT, env=env, stdout=out,
                            stderr=subprocess.STDOUT).returncode
    wall = round(time.perf_counter() - t0, 2)
    if code != 0:
      raise RuntimeError(f"run {name} exited {code}; see {workdir}.log and {workdir}/logs")
    with open(stamp, "w") as f:
      json.dump({"key": key, "wall_s": wall}, f)
    summary = self._summary(workdir, wall)
    log(f"{name}: {wall:.0f} s, test accuracy {summary['test']['accuracy']:.3f}")
    return summary

  @staticmethod
  def _summary(workdir: str, wall: float) -> dict:
    with open(os.path.join(workdir, "summary.json")) as f:
      summary = json.load(f)
    return {**summary, "_wall_s": wall, "_workdir": workdir}


def events(workdir: str) -> list[dict]:
  return jsonl.read(os.path.join(workdir, "events.jsonl"))


def training_span_s(workdir: str) -> float:
  """From the first generation's first step to the coordinator's 'done': the training wall time
  with every failure and recovery in it (start-up and evaluation, which no strategy changes, are
  left out)."""
  evs = events(workdir)
  first = next(e["time"] for e in evs if e["event"] == "first_step")
  done = [e["time"] for e in evs if e["event"] == "done"]
  return done[-1] - first


def fault_spec(scale: scales_lib.Scale, total_steps: int) -> str:
  """The four failures of Table I at the scale's fractions of training: a worker crash
  (SIGKILL), a hang (SIGSTOP), an out-of-memory error, a lost host (its agent and workers
  SIGKILLed; a local spare takes its place)."""
  at = [max(1, int(f * total_steps)) for f in scale.fault_fractions]
  kinds = ("kill", "sigstop", "oom", "host")
  return "; ".join(f"{k}@step={s}:process=0" for k, s in zip(kinds, at))


def table_one(runner: Runner, strategies: tuple[str, ...] = tuple(s for s, _, _ in STRATEGIES)
              ) -> dict:
  """Table I's runs: a clean run (no failure, no checkpoint but the end) for the baseline, then
  each of `strategies` (names in STRATEGIES) with the same four failures."""
  clean = runner.run("clean", ckpt_flags("none", runner.scale, 0))
  total = clean["fault_tolerance"]["steps_committed"]
  clean_span = training_span_s(clean["_workdir"])
  interval = round(max(runner.scale.time_fraction * clean["train"]["seconds"], 0.05), 3)
  faults = fault_spec(runner.scale, total)
  rows = {}
  for name in strategies:
    s = runner.run(f"faulty-{name}", ckpt_flags(name, runner.scale, interval) + [
        f"--config.fault.inject={faults}", "--config.fault.local_spares=1",
        # The crash-loop guard counts failures without a new commit: 'none' never commits.
        "--config.fault.max_failures_without_progress=10"])
    rows[name] = s
  return {"clean": clean, "clean_span_s": clean_span, "total_steps": total,
          "time_interval_s": interval, "faults": faults, "runs": rows}


def ablation(runner: Runner, out_prefix: str) -> dict | None:
  """The missing-modality ablation at this scale (experiments/ablation_missing.py), or None
  when the scale reuses the committed one."""
  if runner.scale.ablation is None:
    return None
  policies, seeds = runner.scale.ablation
  path, _, variant = runner.scale.config.partition(":")
  name = os.path.splitext(os.path.basename(path))[0]
  cmd = [sys.executable, "-m", "experiments.ablation_missing", f"--config={name}",
         f"--policies={policies}", f"--seeds={','.join(map(str, seeds))}",
         # ablation_missing.py reuses any run it finds: a directory per code version.
         f"--workdir={runner.workdir}/ablation-{runner.fingerprint}", f"--out={out_prefix}",
         "--poll-s=120"]
  if variant:
    cmd.append(f"--variant={variant}")
  log("missing-modality ablation: " + " ".join(cmd[3:]))
  subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
  with open(out_prefix + ".json") as f:
    return json.load(f)
