"""Validation against a measured run: replay its failures at their steps (`replay`) and
compare waste, steps and wall time (`validate`); read a measured run from bench_fault.json or a
workdir."""

from __future__ import annotations

import dataclasses
import math
import os
import re
from typing import Mapping, Sequence

import numpy as np

from experiments.failure_sim import inputs
from experiments.failure_sim import model
from medjax import jsonl

# --- Validation against a measured run ----------------------------------------------------

@dataclasses.dataclass(frozen=True)
class MeasuredFailure:
  """kind: in KINDS; step: the fault fired after this global step (before its save)."""
  kind: str
  step: int
  detected_s: float
  recovered_s: float


@dataclasses.dataclass(frozen=True)
class Measured:
  """A measured run with failures: what `validate` replays and compares with.

  Attributes:
    job: the run's plan and medjax checkpoint policy (every_k); step_s from a measurement.
    checkpoint_s: blocking time per save.
    write_s: an async save's mean write time, to finalized (0: committed when its blocking
      ends); write_samples: the run's measured write times, which `validate` draws from.
    failures: in the order they happened.
    steps_executed, waste_fraction: the run's summary.json fault_tolerance numbers.
    wall_s: the run's training wall time, as `sources['wall_s']` defines it.
    sources: how each number was obtained.
  """
  job: model.Job
  checkpoint_s: float
  failures: tuple[MeasuredFailure, ...]
  steps_executed: int
  waste_fraction: float
  wall_s: float
  sources: Mapping[str, str] = dataclasses.field(default_factory=dict)
  write_s: float = 0.0
  write_samples: tuple[float, ...] = ()


def _committed(tl: model.Timeline, s0: int, t: float, writes: np.ndarray) -> int:
  """The newest step committed by time `t` in a generation restored at step `s0`: its saves
  are written one after another on a saver thread (idle at the restart), save j's write taking
  `writes[j]` from when its blocking part ends or the previous write ends, whichever is later."""
  j0 = int(np.searchsorted(tl.S, s0, "right"))
  w = writes[j0:]
  done = np.cumsum(w)
  commit = done + np.maximum.accumulate(tl.end[j0:] - (done - w))
  k = int(np.searchsorted(commit, t, "right"))
  return int(tl.S[j0 + k - 1]) if k else s0


def replay(job: model.Job, strategy: model.Strategy, checkpoint_s: float,
           failures: Sequence[MeasuredFailure],
           write_s: float | Sequence[float] = 0.0) -> dict:
  """A deterministic run of `job` under `strategy` with `failures` at their steps, each
  costing its own detection and recovery time, saves blocking `checkpoint_s` and committed once
  written: `write_s` seconds each (or per save, in order), one write at a time (`_committed`).
  Returns steps executed and wasted, wall time (first step to the end), time in saves and the
  saves taken."""
  tl = model.Timeline(model.checkpoint_steps(strategy, job, checkpoint_s, 0.0), job.step_s,
                      checkpoint_s)
  writes = np.broadcast_to(np.asarray(write_s, float), tl.S.shape)
  s0, wall, saving, executed, wasted, saves, skipped = 0, 0.0, 0.0, 0, 0, 0, []
  for f in failures:
    if not s0 < f.step < tl.n:   # a fault fires once, the first time training passes its step
      skipped.append(f.step)
      continue
    t0, t = float(tl.tau(s0)), float(tl.step_end(f.step))
    executed += f.step - s0
    saving += float(tl.saving(t) - tl.saving(t0))
    saves += int(np.searchsorted(tl.S, f.step, "left") - np.searchsorted(tl.S, s0, "right"))
    wall += t - t0 + f.detected_s + f.recovered_s
    if f.kind == "preemption" and strategy.saves_on_preemption:
      s_new, wall, saving, saves = f.step, wall + tl.c, saving + tl.c, saves + 1
    else:
      s_new = _committed(tl, s0, t, writes)
      wasted += f.step - s_new
    s0 = s_new
  executed += tl.n - s0
  wall += float(tl.tau(tl.n) - tl.tau(s0))
  saving += float(tl.saving(tl.tau(tl.n)) - tl.saving(tl.tau(s0)))
  saves += int(len(tl.S) - np.searchsorted(tl.S, s0, "right"))
  return {"steps_executed": executed, "steps_wasted": wasted,
          "waste_fraction": wasted / executed, "wall_s": wall, "checkpoint_s": saving,
          "saves": saves, "skipped_failure_steps": skipped}


def validate(measured: Measured, *, costs: inputs.Costs | None = None,
             tolerance: float = 0.2, draws: int = 400, seed: int = 0) -> dict:
  """Simulates the measured run (same plan, checkpoint policy and failures at the same steps)
  and compares waste fraction, steps executed and wall time.

  Args:
    measured: the run (`measured_from_bench_fault`, `measured_from_workdir`, or by hand).
    costs: None: each failure costs its own measured detection and recovery time; given: the
      model's per-kind detection and the recovery path's time instead.
    tolerance: the relative error within which a number agrees (issue 14: 20%).
    draws, seed: with `measured.write_samples`, the replay runs `draws` times, each save's
      write time drawn from the samples: whether a save is committed before a failure is a race
      at small scale (a write can take most of a partition), and `simulated` is the mean over
      draws, `simulated_p10_p90` the spread. Without samples, one replay at `write_s`.

  Returns:
    {'measured', 'simulated', 'relative_error', 'within_tolerance', 'tolerance', 'inputs'}:
    relative_error is (simulated - measured) / measured per number.
  """
  failures = measured.failures
  if costs is not None:
    failures = tuple(dataclasses.replace(
        f, detected_s=costs.detect_s[f.kind], recovered_s=costs.recover_s[costs.recovery_path])
        for f in failures)
  strategy = model.Strategy("lineage", every_k=measured.job.every_k)
  spread = {}
  if measured.write_samples:
    rng = np.random.default_rng(seed)
    saves = len(model.checkpoint_steps(strategy, measured.job, measured.checkpoint_s, 0.0))
    runs = [replay(measured.job, strategy, measured.checkpoint_s, failures,
                   rng.choice(np.asarray(measured.write_samples, float), saves))
            for _ in range(draws)]
    sim = {k: float(np.mean([r[k] for r in runs])) for k in runs[0]
           if k != "skipped_failure_steps"}
    sim["skipped_failure_steps"] = runs[0]["skipped_failure_steps"]
    spread = {k: [float(np.percentile([r[k] for r in runs], q)) for q in (10, 90)]
              for k in ("steps_wasted", "waste_fraction", "wall_s")}
  else:
    sim = replay(measured.job, strategy, measured.checkpoint_s, failures, measured.write_s)
  meas = {"waste_fraction": measured.waste_fraction, "steps_executed": measured.steps_executed,
          "wall_s": measured.wall_s}
  err = {k: (sim[k] - v) / v if v else (0.0 if sim[k] == v else math.inf)
         for k, v in meas.items()}
  return {"measured": meas, "simulated": sim, "simulated_p10_p90": spread,
          "relative_error": err,
          "within_tolerance": {k: abs(e) <= tolerance for k, e in err.items()},
          "tolerance": tolerance,
          "notes": ["a run without a ledger counts executed steps from its progress reports, "
                    "so a worker that is SIGKILLed or SIGSTOPped may not report its last steps: "
                    "its measured waste can be below the steps the replay throws away "
                    "(summary.json fault_tolerance.executed_from says which)",
                    "a preemption saves at the fault's step here; medjax's processes agree on "
                    "a step a few steps later, which changes no count"],
          "inputs": {"job": dataclasses.asdict(measured.job),
                     "checkpoint_s": measured.checkpoint_s, "write_s": measured.write_s,
                     "write_samples": len(measured.write_samples),
                     "draws": draws if measured.write_samples else 1,
                     "failures": [dataclasses.asdict(f) for f in failures],
                     "costs": "per-failure measured times" if costs is None else costs.name,
                     "sources": dict(measured.sources)}}


_FAULT = re.compile(r"^\s*(?:\d+-)?(\w+)@(step|partition|epoch)=(\d+):process=\d+\s*$")


def fault_steps(inject: str, job: model.Job) -> list[tuple[str, int]]:
  """config.fault.inject ('kill@step=495:process=1; ...') -> [(kind, step)]: the step after
  which each fault fires (partition=N and epoch=N fire before partition N's or epoch N's first
  step, in the first epoch that reaches them)."""
  out = []
  for item in filter(str.strip, inject.split(";")):
    m = _FAULT.match(item)
    if not m or m.group(1) not in inputs.KIND_OF:
      raise ValueError(f"fault {item!r}: not KIND@step=N:process=P (config.fault.inject)")
    at = int(m.group(3))
    step = {"step": at, "partition": at * job.partition_steps,
            "epoch": at * job.steps_per_epoch}[m.group(2)]
    out.append((inputs.KIND_OF[m.group(1)], step))
  return out


def _match_failures(recorded: list[dict], faults: list[tuple[str, int]] | None,
                    where: str) -> tuple[tuple[MeasuredFailure, ...], str]:
  """The summary's failures (kind, detection, recovery) at the last step each failed generation
  executed (the ledger's `last_step`) when every failure has one, else at the injected faults'
  steps when they match one to one, else at their recorded steps (the last step the worker
  reported)."""
  out = []
  ledger = bool(recorded) and all(isinstance(f.get("last_step"), int) for f in recorded)
  use_faults = not ledger and faults is not None and len(faults) == len(recorded)
  for i, f in enumerate(recorded):
    kind = inputs.KIND_OF.get(f.get("kind"))
    if kind is None:
      raise ValueError(f"{where}: failure {i} has kind {f.get('kind')!r}, not one of "
                       f"{sorted(inputs.KIND_OF)}")
    if use_faults and faults[i][0] != kind:
      use_faults = False
    step = faults[i][1] if use_faults else f.get("step")
    recovered = f.get("recovered_s")
    if not isinstance(step, int) or not isinstance(f.get("detected_s"), (int, float)) or not \
        isinstance(recovered, (int, float)):
      raise ValueError(f"{where}: failure {i} lacks step, detected_s or recovered_s: {f}")
    out.append(MeasuredFailure(kind, step, float(f["detected_s"]), float(recovered)))
  if not use_faults:
    key = "last_step" if ledger else "step"
    out = [MeasuredFailure(f.kind, r[key], f.detected_s, f.recovered_s)
           for f, r in zip(out, recorded)]
  how = ("the ledger's last executed step of each failed generation" if ledger else
         "the injected faults' steps (config.fault.inject)" if use_faults else
         "the failures' recorded steps (the worker's last reported step: a lower bound)")
  return tuple(out), how


def measured_from_bench_fault(path: str = os.path.join(inputs.RESULTS, "bench_fault.json"), *,
                              every_k: int = 25, job: model.Job | None = None) -> Measured:
  """The faulty quickstart run of experiments/bench_fault.py (part B).

  Args:
    path: bench_fault.json.
    every_k: the run's ckpt.every_steps (bench_fault.py --every-k; the JSON does not record it).
    job: the run's plan; default configs/quickstart.py's (checked against the JSON's steps).

  The step time comes from the clean run of the same file (its training seconds, less the
  partition-save blocking fraction of part A when present, over its steps); the wall time to
  compare is the faulty run's launch time less the clean run's time outside training (start-up,
  data, evaluation), so both include one first compile.
  """
  d = inputs._read_json(path)
  fb = inputs._get(d, "failures", where=path)
  steps = inputs._get(fb, "steps", where=path)
  clean_s = inputs._get(fb, "clean_train_s", where=path)
  job = job or model.Job.quickstart(1.0, every_k)
  if job.steps != steps:
    raise ValueError(f"{path}: {steps} steps, but the job {job.name!r} has {job.steps}; pass "
                     "job=Job(...) with the run's plan")
  blocking = d.get("overhead", {}).get("partition", {}).get("checkpoint_blocking_fraction", 0.0)
  job = dataclasses.replace(job, step_s=clean_s * (1 - blocking) / steps, every_k=every_k)
  ckpt = inputs._per_save(d, path, job.partition_steps)[0] if "overhead" in d else 0.0
  faults = fault_steps(fb["faults"], job) if isinstance(fb.get("faults"), str) else None
  failures, how = _match_failures(inputs._get(fb, "failures", where=path), faults, path)
  wall = (inputs._get(fb, "faulty_launch_s", where=path)
          - (inputs._get(fb, "clean_launch_s", where=path) - clean_s))
  name = os.path.basename(path)
  return Measured(
      job, ckpt, failures, int(inputs._get(fb, "steps_executed", where=path)),
      float(inputs._get(fb, "waste_fraction", where=path)), wall,
      {"step_s": f"{name}: clean_train_s {clean_s} s x (1 - partition blocking fraction "
                 f"{blocking}) / {steps} steps",
       "checkpoint_s": f"{name}: overhead part, blocking per partition-boundary save",
       "failures": f"{name}: kinds, detected_s, recovered_s; steps: {how}",
       "every_k": f"{every_k} (bench_fault.py --every-k default; not recorded in the JSON)",
       "wall_s": f"{name}: faulty_launch_s - (clean_launch_s - clean_train_s): the faulty "
                 "run's time from its first step's compile to the end of training, taking the "
                 "time outside training from the clean run",
       "steps_executed": f"{name}: summary.json fault_tolerance.steps_executed",
       "waste_fraction": f"{name}: summary.json fault_tolerance.waste_fraction"})


def measured_from_workdir(workdir: str, *, step_s: float | None = None,
                          checkpoint_s: float | None = None) -> Measured:
  """A supervised run's workdir: summary.json (fault_tolerance, with its generations),
  config.json (ckpt, data.num_partitions, optim.epochs, fault.inject) and events.jsonl.

  Args:
    workdir: the run's workdir.
    step_s: seconds per step from a clean run of the same config; default: this run's own
      training seconds, less those blocked in saves, over the steps it executed (summary
      generations).
    checkpoint_s: blocking seconds per save; default: this run's blocked seconds over the saves
      a replay of its policy takes.

  Wall time: from the first generation's first step to the coordinator's 'done' event.
  """
  where = os.path.join(workdir, "summary.json")
  ft = inputs._get(inputs._read_json(where), "fault_tolerance", where=where)
  cfg_path = os.path.join(workdir, "config.json")
  cfg = inputs._read_json(cfg_path)
  epochs = inputs._get(cfg, "optim", "epochs", where=cfg_path)
  parts = inputs._get(cfg, "data", "num_partitions", where=cfg_path)
  every_k = int(inputs._get(cfg, "ckpt", "every_steps", where=cfg_path))
  if not inputs._get(cfg, "ckpt", "partition_boundaries", where=cfg_path):
    raise ValueError(f"{cfg_path}: ckpt.partition_boundaries is False; validate replays "
                     "medjax's partition-boundary policy only")
  steps = int(inputs._get(ft, "steps_committed", where=where))
  if steps % (epochs * parts):
    raise ValueError(f"{where}: {steps} steps do not split into {epochs} epochs x {parts} "
                     "equal partitions; build the Measured by hand with the run's plan")
  gens = inputs._get(ft, "generations", where=where).values()
  executed = sum(int(g.get("executed", 0)) for g in gens)
  if step_s is None:
    # The replay adds each save's blocking to the steps' time: leave it out of the step.
    step_s = sum(float(g.get("training_s", 0.0)) - float(g.get("blocked_s", 0.0))
                 for g in gens) / executed
  job = model.Job(step_s, steps // (epochs * parts), parts, epochs, every_k, "measured",
                  f"{cfg_path}: optim.epochs {epochs}, data.num_partitions {parts}")
  events = jsonl.read(os.path.join(workdir, "events.jsonl"))
  times = {e.get("event"): e.get("time") for e in reversed(events)}   # the first of each
  done = [e["time"] for e in events if e.get("event") == "done"]
  if "first_step" not in times or not done:
    raise ValueError(f"{workdir}/events.jsonl: no first_step or done event; did the run end?")
  faults = []
  for e in (e for e in events if e.get("event") == "failure"):
    faults.append(fault_steps(e["fault"], job)[0] if e.get("fault") else (
        inputs.KIND_OF.get(e.get("kind"), "crash"), e.get("step")))
  failures, how = _match_failures(inputs._get(ft, "failures", where=where), faults, where)
  if checkpoint_s is None:
    saves = replay(job, model.Strategy("lineage", every_k=every_k), 0.0, failures)["saves"]
    checkpoint_s = sum(float(g.get("blocked_s", 0.0)) for g in gens) / saves
  samples = tuple(float(e["write_s"]) for e in events
                  if e.get("event") == "commit" and isinstance(e.get("write_s"), (int, float)))
  write_s = float(np.mean(samples)) if samples else float(ft.get("checkpoint_write_s") or 0.0)
  return Measured(job, checkpoint_s, failures, int(inputs._get(ft, "steps_executed", where=where)),
                  float(inputs._get(ft, "waste_fraction", where=where)),
                  done[-1] - times["first_step"],
                  {"step_s": f"{step_s:.5f} s", "failures": f"{where}: steps: {how}",
                   "wall_s": f"{workdir}/events.jsonl: first first_step to done",
                   "checkpoint_s": f"{checkpoint_s:.5f} s per save",
                   "write_s": (f"{workdir}/events.jsonl: {len(samples)} commits' write_s"
                               if samples else f"{where}: fault_tolerance.checkpoint_write_s"
                               if write_s else "not recorded (an older run): saves commit "
                               "when their blocking ends"),
                   "steps_executed": f"{where}: fault_tolerance.steps_executed (from "
                                     f"{ft.get('executed_from', 'progress reports')})"},
                  write_s, samples)
