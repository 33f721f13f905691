"""Tables V-VI by simulation: a data-parallel job under failures and checkpoints, 4 to 16,384
workers, driven by the costs medjax measures and by failure rates published for large runs.

  nice -n 10 python -m experiments.failure_sim [--trials 500] [--seed 0] [--price 3.06]
      [--workers 4,8,...,16384] [--results experiments/results] [--out experiments/results]

Writes <out>/failure_sim.json (every input with its label, every simulated number),
failure_sim.md (the tables), failure_sim_goodput.png and failure_sim_waste.png, and prints a
compact table. experiments/report.py imports it: `load_costs`, `Costs`, `Job`, `Strategy`,
`RATES`, `simulate`, `sweep`, `table_v`, `table_vi`, `intervals`, `validate`,
`measured_from_bench_fault`, `measured_from_workdir`, `run`, `markdown`.

The model
- A job is `Job.steps` global steps of `Job.step_s` seconds, in epochs of `partitions_per_epoch`
  partitions of `partition_steps` steps (medjax's plan).
- A strategy is the set of steps after which a checkpoint is saved (the last step always is).
  A save blocks training for `Costs.checkpoint_s` and is committed when that ends.
  none: only the end (a failure restarts from step 0); epoch: every epoch end; time: every
  `interval_s` s of training, rounded up to a step; lineage: every partition boundary and, with
  `every_k`, every global step divisible by k (medjax's `SavePolicy`); young_daly: every
  sqrt(2 C M) s (Young 1974; `order=2`: Daly 2006's higher-order form), rounded to a step, with C
  the save cost and M the job's mean time between failures at that worker count.
- Failures are a Poisson process in the time the job trains or saves (none while it is down),
  of rate workers x accelerators per worker / per-accelerator MTBF, with kinds crash, hang,
  host_lost and preemption in a source's stated mix. A failure costs its kind's detection time
  plus the recovery time (one recovery path, `Costs.recovery_path`, the same for a restart from
  step 0) and throws away the steps since the last committed save, the step in flight included
  (medjax counts a step as executed when it is dispatched). A preemption under a strategy that
  saves on SIGTERM (`lineage`, as medjax does) finishes its step, saves and loses no step.
- Monte Carlo over trials (vectorised over trials, one loop turn per failure), with the
  closed-form expectation beside it: the sum over checkpoint segments of d_i of
  (e^(lam d_i) - 1)(1/lam + mean downtime), exact without preemption saves. Where a trial would
  need more than `max_events` restarts the row is the closed form alone (usually: it does not
  finish).
- Per (strategy, workers): goodput (failure-free training time / wall time), time to train,
  waste fraction (steps thrown away / steps executed: the summary's `waste_fraction`),
  checkpoint overhead (time in saves / wall time), downtime fraction, failures by kind,
  accelerator-hours and cost.
- `validate` replays a measured run (its failures at their steps, its per-failure detection and
  recovery times, its checkpoint policy; deterministic) and compares waste and wall time.

What it leaves out (each can move the numbers at scale):
- stragglers and step-time variance: every step takes step_s, while a synchronous step waits
  for the slowest worker;
- correlated failures (a switch or power domain taking many hosts at once, a bad node failing
  again soon after it rejoins) and failures while the job is down or restoring;
- communication and parallel efficiency: under strong scaling a step takes step_s x W_ref / W
  (perfect scaling); the efficiency column of Table V shows only failure and checkpoint losses;
- checkpoint and recovery costs that grow with scale: network contention of many hosts writing
  at once, storage bandwidth limits, restore and jax.distributed start-up growing with model and
  cluster size; the costs are the measured (or published) ones at every worker count;
- the async commit latency of a save (it counts as committed when its blocking part ends), and
  the CPU that Orbax's background write takes from training (on 2 CPU cores the extra wall time
  per save is larger than its blocking time: `load_costs(checkpoint='wall')` uses it);
- data-loader warm-up and cache refill after a restart or a host change, and the first compile;
- elastic shrinking, waiting for a replacement machine (a lost host is replaced at once by a
  spare) and back-off after repeated failures;
- silent data corruption and loss spikes that force a rollback past the last checkpoint;
- evaluation passes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import time
import zlib
from typing import Mapping, Sequence

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "experiments", "results")
KINDS = ("crash", "hang", "host_lost", "preemption")
STRATEGIES = ("none", "epoch", "time", "lineage", "young_daly")
WORKERS = tuple(2 ** i for i in range(2, 15))   # 4 ... 16,384
# A summary's or the injector's failure kind -> the simulator's.
KIND_OF = {"crash": "crash", "kill": "crash", "oom": "crash", "error": "crash", "hang": "hang",
           "sigstop": "hang", "host_lost": "host_lost", "host": "host_lost",
           "preemption": "preemption", "sigterm": "preemption"}

PAPER = ("lineage paper: Shihora and Bandi, 'Fault-Tolerant Distributed Training System for "
         "Multi-Modal Medical Disease Prediction', IRJET 12(11), Nov 2025")
LLAMA3 = ("Llama Team, AI @ Meta, 'The Llama 3 Herd of Models', arXiv:2407.21783, 2024, "
          "Sec. 3.3.4")
YOUNG = ("J. W. Young, 'A first order approximation to the optimum checkpoint interval', "
         "Commun. ACM 17(9):530-531, 1974")
DALY = ("J. T. Daly, 'A higher order estimate of the optimum checkpoint interval for restart "
        "dumps', Future Generation Computer Systems 22(3):303-312, 2006")
PRICE = 28201 / 9216   # $3.06 per accelerator-hour
PRICE_SOURCE = (f"published: {PAPER}, Table VI: $28,201 for 9,216 GPU-hours = $3.06 per "
                "GPU-hour (the same price gives its $7,601 for 2,484)")
# The paper's Tables V and VI, to print beside the simulated ones.
PAPER_TABLE_V = {4: {"time_h": 68.2, "speedup": 1.0, "efficiency": 1.0, "overhead": 0.003},
                 8: {"time_h": 35.1, "speedup": 1.94, "efficiency": 0.97, "overhead": 0.005},
                 16: {"time_h": 18.2, "speedup": 3.75, "efficiency": 0.94, "overhead": 0.011},
                 32: {"time_h": 10.3, "speedup": 6.62, "efficiency": 0.83, "overhead": 0.024}}
PAPER_TABLE_VI = {"none": {"approach": "No fault tolerance", "gpu_hours": 9216, "cost": 28201},
                  "epoch": {"approach": "Epoch-level", "gpu_hours": 9677, "cost": 29612},
                  "lineage": {"approach": "Ours", "gpu_hours": 2484, "cost": 7601}}


# --- Failure rates -------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class FailureRate:
  """How often one accelerator's share of a job fails, and how.

  Attributes:
    name: a short key ('llama3').
    accelerator_mtbf_h: mean hours between job interruptions per accelerator (a job on A
      accelerators is interrupted every accelerator_mtbf_h / A hours on average).
    mix: fraction of failures of each kind in KINDS (sums to 1).
    source: the published figure the MTBF comes from.
    mix_source: where the mix comes from (published, or an assumption).
  """
  name: str
  accelerator_mtbf_h: float
  mix: Mapping[str, float]
  source: str
  mix_source: str

  def __post_init__(self):
    unknown = set(self.mix) - set(KINDS)
    if unknown or abs(sum(self.mix.values()) - 1) > 1e-9 or min(self.mix.values()) < 0:
      raise ValueError(f"FailureRate {self.name!r}: mix {dict(self.mix)} must give fractions "
                       f"of {KINDS} that sum to 1")
    if not self.accelerator_mtbf_h > 0:
      raise ValueError(f"FailureRate {self.name!r}: accelerator_mtbf_h must be > 0")

  def per_s(self, accelerators: float) -> float:
    """Failures per second of a job on `accelerators` accelerators."""
    return accelerators / (self.accelerator_mtbf_h * 3600.0)

  def mix_K(self) -> np.ndarray:
    return np.array([self.mix.get(k, 0.0) for k in KINDS])


_UNEXPECTED_SPLIT = {"crash": 0.6, "hang": 0.25, "host_lost": 0.15}
RATES = {
    "llama3": FailureRate(
        "llama3", 16384 * 54 * 24 / 466,
        {"preemption": 47 / 466, **{k: v * 419 / 466 for k, v in _UNEXPECTED_SPLIT.items()}},
        source=(f"published: {LLAMA3}: 466 job interruptions in a 54-day snapshot of "
                "pre-training on 16,384 H100 GPUs (47 planned, 419 unexpected) = one per "
                "45,566 GPU-hours"),
        mix_source=("preemption 47/466: the planned interruptions (published, same source; "
                    "modelled as preemptions, which give notice); the 419 unexpected split "
                    "crash 60% / hang 25% / host lost 15%: assumption (the source gives causes, "
                    "not how each showed itself)")),
    "lineage_paper": FailureRate(
        "lineage_paper", 16 * 8 * 18.2 / 3,
        {"crash": 2 / 3, "hang": 1 / 3},
        source=(f"published: {PAPER}, Table II and Sec. IV.A: 3 failures in its 18.2 h run on "
                "16 nodes x 8 A100 GPUs = one per 777 GPU-hours (3 events: a rough rate)"),
        mix_source=("its Table II (OOM, network, GPU failure): OOM and GPU as crashes, the "
                    "network failure as a hang (the mapping is an assumption)")),
}


# --- Costs --------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Costs:
  """What failures and checkpoints cost, in seconds; the same at every worker count.

  Attributes:
    checkpoint_s: time one save blocks training.
    detect_s: per kind in KINDS, from the fault to its detection.
    recover_s: per recovery path ('warm_standby', 'standby', 'relaunch', ...), from detection
      to the first step of the next generation (restore and compile included).
    recovery_path: the path every recovery takes in the simulation.
    sources: per input ('checkpoint_s', 'detect_s.hang', 'recover_s.standby', ...), where it
      comes from: 'measured on ...', 'published: ...' or 'assumption: ...'.
    name: a short key ('medjax', 'paper').
  """
  checkpoint_s: float
  detect_s: Mapping[str, float]
  recover_s: Mapping[str, float]
  recovery_path: str
  sources: Mapping[str, str] = dataclasses.field(default_factory=dict)
  name: str = ""

  def __post_init__(self):
    missing = [k for k in KINDS if k not in self.detect_s]
    if missing:
      raise ValueError(f"Costs {self.name!r}: detect_s has no {missing}; give one per kind "
                       f"in {KINDS}")
    if self.recovery_path not in self.recover_s:
      raise ValueError(f"Costs {self.name!r}: recovery_path {self.recovery_path!r} not in "
                       f"recover_s {sorted(self.recover_s)}")
    values = [self.checkpoint_s, *self.detect_s.values(), *self.recover_s.values()]
    if min(values) < 0 or not all(map(math.isfinite, values)):
      raise ValueError(f"Costs {self.name!r}: every cost must be a finite number >= 0")

  def downtime_K(self) -> np.ndarray:
    """Per kind in KINDS: detection + recovery seconds."""
    return np.array([self.detect_s[k] + self.recover_s[self.recovery_path] for k in KINDS])

  def with_path(self, path: str) -> "Costs":
    return dataclasses.replace(self, recovery_path=path)

  @classmethod
  def paper(cls) -> "Costs":
    """The lineage paper's own costs (published, its Sec. III.D and Table II)."""
    t2 = f"published: {PAPER}, Table II"
    return cls(
        checkpoint_s=45.0,
        detect_s={"crash": 28.5, "hang": 32.0, "host_lost": 30.0, "preemption": 30.0},
        recover_s={"paper": 45.3}, recovery_path="paper", name="paper",
        sources={"checkpoint_s": f"published: {PAPER}, Sec. III.D: checkpoint I/O 45 s",
                 "detect_s.crash": f"{t2}: OOM 28 s, GPU 29 s (mean)",
                 "detect_s.hang": f"{t2}: network 32 s",
                 "detect_s.host_lost": f"published: {PAPER}, recovery protocol: 30 s heartbeat "
                                       "timeout",
                 "detect_s.preemption": "assumption: the paper's 30 s heartbeat timeout (it "
                                        "reports no preemption)",
                 "recover_s.paper": f"{t2}: 47, 43, 46 s (mean)"})


def _read_json(path: str) -> dict:
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError) as e:
    raise ValueError(f"{path}: cannot read it as JSON ({e}); rerun the benchmark that writes "
                     "it or pass failure_sim.Costs(...) directly") from e


def _get(d, *keys, where: str):
  """d[k0][k1]...; a missing key is one line naming the file and the key."""
  for k in keys:
    if not isinstance(d, (dict, list)) or (isinstance(d, dict) and k not in d):
      raise ValueError(f"{where}: no {'.'.join(map(str, keys))} (the file changed shape?); "
                       "rerun its benchmark or pass failure_sim.Costs(...) directly")
    d = d[k]
  return d


def _measured_failures(results_dir: str) -> list[dict]:
  """Every failure record (kind, detected_s, recovered_s, path) in the results files present."""
  out = []
  path = os.path.join(results_dir, "bench_fault.json")
  if os.path.exists(path):
    for f in _read_json(path).get("failures", {}).get("failures", []):
      out.append({**f, "path": None, "file": "bench_fault.json"})
  path = os.path.join(results_dir, "recovery.json")
  if os.path.exists(path):
    for layout in _read_json(path).get("failures", []):
      for f in layout.get("failures", []):
        out.append({**f, "path": (f.get("recovery") or {}).get("path"),
                    "file": f"recovery.json (layout {layout.get('layout')})"})
  return out


def _per_save(bench: dict, where: str, partition_steps: int,
              checkpoint: str = "blocking") -> tuple[float, float]:
  """bench_fault.json's part A: seconds per partition-boundary save (partition-boundary
  saves vs only the final one), and the saves that compares."""
  over = _get(bench, "overhead", where=where)
  where = f"{where} overhead"
  none, part = _get(over, "none", where=where), _get(over, "partition", where=where)
  saves = _get(part, "steps", where=where) / partition_steps - 1   # beyond the final save
  key = {"blocking": "checkpoint_blocked_s", "wall": "train_s"}.get(checkpoint)
  if key is None:
    raise ValueError(f"checkpoint={checkpoint!r}: use 'blocking' or 'wall'")
  return (_get(part, key, where=where) - _get(none, key, where=where)) / saves, saves


def _host_timeout_s() -> tuple[float, str]:
  """configs/default.py's fault.host_timeout_s (a lost host is detected after it), labelled."""
  try:
    from configs import default  # pylint: disable=import-outside-toplevel
    value = float(default.get_config().fault.host_timeout_s)
    return value, ("assumption: not measured; the configured fault.host_timeout_s "
                   f"({value:g} s, configs/default.py)")
  except Exception as e:  # pylint: disable=broad-except
    return 5.0, f"assumption: not measured; 5 s (configs/default.py unreadable here: {e})"


def load_costs(results_dir: str = RESULTS, *, recovery_path: str = "standby",
               checkpoint: str = "blocking", partition_steps: int = 33) -> Costs:
  """medjax's measured costs, from experiments/results/{bench_fault,recovery}.json.

  Args:
    results_dir: where the benchmark JSON files are.
    recovery_path: the recovery path the simulation uses: 'standby' (a generation of several
      processes, as at scale), or 'warm_standby' (one process per generation: the CPU layout).
    checkpoint: 'blocking' (time in checkpoint calls per save, as the summary counts it) or
      'wall' (extra training wall time per save vs no checkpoints: includes the background
      write's use of the CPU; noisier).
    partition_steps: steps per partition of the overhead runs (configs/quickstart.py: 33).

  Returns:
    Costs with a label per input. Kinds never measured (a lost host) take the configured
    timeout, labelled as such.
  """
  bench = os.path.join(results_dir, "bench_fault.json")
  per_save, saves = _per_save(_read_json(bench), bench, partition_steps, checkpoint)
  recovery = os.path.join(results_dir, "recovery.json")
  cpus = _read_json(recovery).get("cpus", "?") if os.path.exists(recovery) else "?"
  machine = f"measured on a {cpus}-core CPU machine (configs/quickstart.py)"
  sources = {"checkpoint_s": f"{machine}: bench_fault.json overhead, {checkpoint} time per "
                             f"partition-boundary save ((partition - none) / {saves:g} saves)"}
  detect, by_kind, by_path = {}, {}, {}
  for f in _measured_failures(results_dir):
    kind = KIND_OF.get(f.get("kind"))
    if kind and isinstance(f.get("detected_s"), (int, float)):
      by_kind.setdefault(kind, []).append((f["detected_s"], f["file"]))
    if f.get("path") and isinstance(f.get("recovered_s"), (int, float)):
      by_path.setdefault(f["path"], []).append((f["recovered_s"], f["file"]))
  for kind in KINDS:
    if kind in by_kind:
      values = [v for v, _ in by_kind[kind]]
      detect[kind] = float(np.median(values))
      sources[f"detect_s.{kind}"] = (
          f"{machine}: median of {len(values)} ({', '.join(f'{v:g}' for v in values)} s) in "
          f"{', '.join(sorted({w for _, w in by_kind[kind]}))}")
  if "host_lost" not in detect:
    detect["host_lost"], sources["detect_s.host_lost"] = _host_timeout_s()
  missing = [k for k in KINDS if k not in detect]
  if missing or not by_path:
    raise ValueError(f"{results_dir}: no measured {missing or 'recovery path'} in bench_fault.json"
                     " or recovery.json; run experiments/bench_recovery.py or pass "
                     "failure_sim.Costs(...) directly")
  recover = {}
  for path, values in by_path.items():
    recover[path] = float(np.median([v for v, _ in values]))
    sources[f"recover_s.{path}"] = (f"{machine}: median of {len(values)} recoveries by that path "
                                    f"({', '.join(f'{v:g}' for v, _ in values)} s) in "
                                    f"{', '.join(sorted({w for _, w in values}))}")
  if recovery_path not in recover:
    raise ValueError(f"load_costs: recovery_path {recovery_path!r} was never measured; the "
                     f"results have {sorted(recover)}")
  return Costs(per_save, detect, recover, recovery_path, sources, name="medjax")


# --- Jobs and strategies ------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Job:
  """What is trained: `epochs` x `partitions_per_epoch` x `partition_steps` steps of `step_s`.

  `every_k` is medjax's ckpt.every_steps for this job (the `lineage` strategy's default).
  """
  step_s: float
  partition_steps: int
  partitions_per_epoch: int
  epochs: int
  every_k: int = 0
  name: str = ""
  source: str = ""

  def __post_init__(self):
    if not (self.step_s > 0 and min(self.partition_steps, self.partitions_per_epoch,
                                    self.epochs) >= 1 and self.every_k >= 0):
      raise ValueError(f"Job {self.name!r}: step_s > 0, partition_steps, partitions_per_epoch "
                       f"and epochs >= 1, every_k >= 0; got {self}")

  @property
  def steps_per_epoch(self) -> int:
    return self.partition_steps * self.partitions_per_epoch

  @property
  def steps(self) -> int:
    return self.steps_per_epoch * self.epochs

  @property
  def clean_s(self) -> float:
    """Failure-free, checkpoint-free training time."""
    return self.steps * self.step_s

  def strong(self, workers: int, ref_workers: int) -> "Job":
    """The same work on `workers` instead of `ref_workers` (perfect scaling)."""
    return dataclasses.replace(self, step_s=self.step_s * ref_workers / workers)

  @classmethod
  def quickstart(cls, step_s: float, every_k: int = 0) -> "Job":
    return cls(step_s, 33, 4, 15, every_k, "quickstart",
               "configs/quickstart.py: 6,000 patients, split 0.7, 4 partitions of 33 steps "
               "(batch 32), 15 epochs = 1,980 steps")

  @classmethod
  def paper_scale(cls, clean_hours: float = 18.2) -> "Job":
    return cls(clean_hours * 3600 / 800, 5, 16, 10, 0, "paper_scale",
               f"configs/paper.py: 53,420 patients, split 0.7, 16 partitions of 5 steps (batch "
               f"512), 10 epochs = 800 steps; {clean_hours:g} h failure-free (assumption: the "
               f"lineage paper's 18.2 h at 16 workers, its Tables I and V, taken as "
               f"failure-free)")


@dataclasses.dataclass(frozen=True)
class Strategy:
  """A checkpoint strategy (issue 14's Table I names).

  Attributes:
    name: one of STRATEGIES.
    interval_s: 'time': seconds of training between saves.
    every_k: 'lineage': also save at every global step divisible by k (0: partition boundaries
      only).
    preemption_save: whether a preemption saves before it stops (medjax does, on SIGTERM);
      None: True for 'lineage' only (the baselines save on their schedule alone).
    order: 'young_daly': 1 for Young's sqrt(2 C M), 2 for Daly's higher-order estimate.
  """
  name: str
  interval_s: float = 0.0
  every_k: int = 0
  preemption_save: bool | None = None
  order: int = 1

  def __post_init__(self):
    if self.name not in STRATEGIES:
      raise ValueError(f"Strategy {self.name!r}: use one of {STRATEGIES}")
    if self.name == "time" and not self.interval_s > 0:
      raise ValueError("Strategy 'time' needs interval_s > 0 (seconds between saves)")
    if self.order not in (1, 2):
      raise ValueError(f"Strategy order={self.order}: 1 (Young) or 2 (Daly)")

  @property
  def label(self) -> str:
    if self.name == "time":
      return (f"time {self.interval_s / 60:g}m" if self.interval_s % 60 == 0 else
              f"time {self.interval_s:g}s")
    if self.name == "lineage" and self.every_k:
      return f"lineage+k{self.every_k}"
    if self.name == "young_daly" and self.order == 2:
      return "young_daly (Daly)"
    return self.name

  @property
  def saves_on_preemption(self) -> bool:
    return self.name == "lineage" if self.preemption_save is None else self.preemption_save


def default_strategies(job: Job, time_interval_s: float = 1800.0) -> list[Strategy]:
  """none, epoch, time (30 min: an assumption; the paper gives no T), lineage (and
  lineage+k when the job checkpoints every k steps), young_daly."""
  out = [Strategy("none"), Strategy("epoch"), Strategy("time", interval_s=time_interval_s),
         Strategy("lineage")]
  if job.every_k:
    out.append(Strategy("lineage", every_k=job.every_k))
  return out + [Strategy("young_daly")]


def young_daly_interval(checkpoint_s: float, mtbf_s: float, order: int = 1) -> float:
  """The optimal compute time between checkpoints.

  order 1: Young (1974), sqrt(2 C M). order 2: Daly (2006), sqrt(2 C M) (1 + sqrt(C / 2M) / 3
  + (C / 2M) / 9) - C for C < 2M, else M.
  """
  if checkpoint_s <= 0:
    return 0.0
  if not math.isfinite(mtbf_s):
    return math.inf
  first = math.sqrt(2 * checkpoint_s * mtbf_s)
  if order == 1:
    return first
  if checkpoint_s >= 2 * mtbf_s:
    return mtbf_s
  x = checkpoint_s / (2 * mtbf_s)
  return first * (1 + math.sqrt(x) / 3 + x / 9) - checkpoint_s


def checkpoint_steps(strategy: Strategy, job: Job, checkpoint_s: float,
                     rate_per_s: float) -> np.ndarray:
  """The steps after which `strategy` saves, sorted, ending with job.steps (young_daly's
  interval uses the save cost `checkpoint_s` and the failure rate)."""
  n = job.steps
  if strategy.name == "none":
    every = n
  elif strategy.name == "epoch":
    every = job.steps_per_epoch
  elif strategy.name == "time":
    every = max(1, math.ceil(strategy.interval_s / job.step_s - 1e-9))
  elif strategy.name == "young_daly":
    mtbf = 1 / rate_per_s if rate_per_s > 0 else math.inf
    tau = young_daly_interval(checkpoint_s, mtbf, strategy.order)
    every = n if not math.isfinite(tau) else min(n, max(1, round(tau / job.step_s)))
  else:  # lineage
    every = job.partition_steps
  steps = np.arange(every, n + 1, every, dtype=np.int64)
  if strategy.name == "lineage" and strategy.every_k:
    steps = np.union1d(steps, np.arange(strategy.every_k, n + 1, strategy.every_k))
  return np.union1d(steps, [n]).astype(np.int64)


# --- The failure-free timeline of one schedule --------------------------------------------

class Timeline:
  """The clock of a failure-free run with saves after steps S_j: step s ends at
  s*step_s + c*(saves before it); save j starts when step S_j ends and commits c later. A run
  restored at committed step s replays this clock from `tau(s)`. All methods take arrays."""

  def __init__(self, S: np.ndarray, step_s: float, c: float):
    self.S, self.step_s, self.c, self.n = S, step_s, c, int(S[-1])
    self.start = S * step_s + np.arange(len(S)) * c
    self.end = self.start + c
    self.S_after = np.append(S, self.n)       # the next save's step, per saves completed
    self.S_before = np.insert(S, 0, 0)        # the last committed step, per saves completed

  def tau(self, s):
    """Just after step s (and its save, if one follows it)."""
    return s * self.step_s + self.c * np.searchsorted(self.S, s, "right")

  def step_end(self, s):
    return s * self.step_s + self.c * np.searchsorted(self.S, s, "left")

  def steps_done(self, t):
    m = np.searchsorted(self.end, t, "right")
    s = np.floor((t - m * self.c) / self.step_s + 1e-9).astype(np.int64)
    return np.minimum(s, self.S_after[m])

  def committed(self, t):
    return self.S_before[np.searchsorted(self.end, t, "right")]

  def in_save(self, t):
    m = np.searchsorted(self.end, t, "right")
    return np.append(self.start, np.inf)[m] <= t

  def saving(self, t):
    """Seconds spent in saves from 0 to t."""
    m = np.searchsorted(self.end, t, "right")
    partial = np.clip(t - np.append(self.start, np.inf)[m], 0, self.c)
    return m * self.c + partial

  def segments(self) -> np.ndarray:
    """Each save's segment: from the previous commit to its own (steps and the save)."""
    return np.diff(self.end, prepend=0.0)


# --- Simulation ---------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Result:
  """One simulated (strategy, worker count). Times in hours; fractions in [0, 1].

  job_mtbf_h: mean time between failures of the whole job. checkpoints: saves on the schedule;
  interval_s: their mean spacing in seconds (steps and the save). goodput: failure-free
  training time / mean wall time. time_h: mean wall time (p10, p90 over trials).
  waste_fraction: steps thrown away / steps executed (mean over trials).
  checkpoint_overhead: time in saves / wall time. downtime_fraction: detection and recovery
  time / wall time. failures: mean per run, and by kind. accelerator_hours and cost_usd: of
  the mean wall time. method: 'monte_carlo' or 'analytic' (closed form only: failures too
  frequent to simulate). finishes: False when the expected time is above `simulate`'s
  horizon (100) x the failure-free time: the run does not finish in any useful sense.
  analytic_time_h: the closed-form expectation (exact without preemption saves).
  """
  strategy: str
  workers: int
  accelerators: int
  job_mtbf_h: float
  checkpoints: int
  interval_s: float
  clean_h: float
  time_h: float
  time_h_p10: float
  time_h_p90: float
  goodput: float
  waste_fraction: float
  checkpoint_overhead: float
  downtime_fraction: float
  failures: float
  failures_by_kind: Mapping[str, float]
  accelerator_hours: float
  cost_usd: float
  method: str
  finishes: bool
  analytic_time_h: float
  trials: int

  def as_dict(self) -> dict:
    def clean(v):
      if isinstance(v, float):
        return round(v, 6) if math.isfinite(v) else None
      if isinstance(v, Mapping):
        return {k: clean(x) for k, x in v.items()}
      return v
    return {**{k: clean(v) for k, v in dataclasses.asdict(self).items()}, "label": "simulated"}


def _analytic(tl: Timeline, lam: float, mix_K: np.ndarray, down_K: np.ndarray,
              pre: int) -> dict:
  """Closed-form expectations. Failures of rate lam*(1 - f_pre) restart their segment (the
  expected time of a segment of length d is (e^(lam d) - 1)(1/lam + D)); preemptions that save
  add their downtime and a save, and lose nothing."""
  d = tl.segments()
  f_pre = mix_K[pre] if pre >= 0 else 0.0
  lam_u, lam_p = lam * (1 - f_pre), lam * f_pre
  with np.errstate(over="ignore", invalid="ignore"):
    g = np.expm1(lam_u * d) if lam_u > 0 else np.zeros_like(d)
    exposure = float((g / lam_u).sum()) if lam_u > 0 else float(d.sum())
    rest = mix_K.copy()
    if pre >= 0:
      rest[pre] = 0
    mean_down = float(rest @ down_K / rest.sum()) if rest.sum() > 0 else 0.0
    failures_u = float(g.sum())
    failures_p = lam_p * exposure
    down = failures_u * mean_down + (failures_p * (down_K[pre] + tl.c + tl.step_s / 2)
                                     if pre >= 0 else 0.0)
    total = exposure + down
    saves = tl.c * len(d) * exposure / d.sum() + failures_p * tl.c
  finite = math.isfinite(total)
  return {"time_s": total, "failures": failures_u + failures_p,
          "waste_fraction": (exposure - d.sum()) / exposure if finite else 1.0,
          "checkpoint_overhead": saves / total if finite else 0.0,
          "downtime_fraction": down / total if finite else 1.0, "finishes": finite}


def _monte_carlo(tl: Timeline, lam: float, mix_K: np.ndarray, down_K: np.ndarray, pre: int,
                 trials: int, rng: np.random.Generator, max_events: int) -> dict | None:
  """Trials in parallel, one loop turn per failure; None if some trial needs > max_events."""
  n, c = tl.n, tl.c
  s0_T = np.zeros(trials, np.int64)
  wall_T, saving_T, down_T = np.zeros(trials), np.zeros(trials), np.zeros(trials)
  executed_T, wasted_T = np.zeros(trials, np.int64), np.zeros(trials, np.int64)
  fails_TxK = np.zeros((trials, len(KINDS)), np.int64)
  t_end = float(tl.tau(n))
  active = np.arange(trials)
  for _ in range(max_events + 1):
    if not active.size:
      break
    s = s0_T[active]
    t0 = tl.tau(s)
    t = t0 + (rng.exponential(1 / lam, active.size) if lam > 0 else np.inf)
    done = t >= t_end
    a = active[done]
    wall_T[a] += t_end - t0[done]
    saving_T[a] += tl.saving(t_end) - tl.saving(t0[done])
    executed_T[a] += n - s[done]
    a, s, t0, t = active[~done], s[~done], t0[~done], t[~done]
    kind = rng.choice(len(KINDS), size=a.size, p=mix_K)
    np.add.at(fails_TxK, (a, kind), 1)
    s_fail = np.maximum(tl.steps_done(t), s)
    # The step in flight (none while saving) counts as executed, as medjax counts dispatched
    # steps: a failure throws it away, a preemption finishes it.
    flying = np.where(tl.in_save(t) | (s_fail >= n), 0, 1)
    committed = np.maximum(tl.committed(t), s)
    is_pre = kind == pre
    s_new = np.where(is_pre, s_fail + flying, committed)
    t_stop = np.where(is_pre, tl.step_end(s_new), t)   # a preemption finishes its step, saves
    wall_T[a] += t_stop - t0 + np.where(is_pre, c, 0.0) + down_K[kind]
    saving_T[a] += tl.saving(t_stop) - tl.saving(t0) + np.where(is_pre, c, 0.0)
    down_T[a] += down_K[kind]
    executed_T[a] += s_fail + flying - s
    wasted_T[a] += np.where(is_pre, 0, s_fail + flying - committed)
    s0_T[a] = s_new
    active = a
  if active.size:
    return None
  return {"wall_T": wall_T, "saving_T": saving_T, "down_T": down_T, "executed_T": executed_T,
          "wasted_T": wasted_T, "fails_TxK": fails_TxK}


def simulate(job: Job, costs: Costs, rate: FailureRate, strategy: Strategy, workers: int, *,
             accelerators_per_worker: int = 1, trials: int = 500, seed: int = 0,
             price: float = PRICE, max_events: int = 3000, horizon: float = 100.0) -> Result:
  """One (strategy, worker count): Monte Carlo over `trials` runs and the closed form.

  Args:
    job, costs, rate, strategy: what runs, what failures and saves cost, how often it fails,
      when it saves.
    workers: data-parallel workers; accelerators_per_worker: accelerators each (the failure
      rate and the accelerator-hours count accelerators).
    trials, seed: Monte Carlo runs and seed; each (seed, workers, strategy) has its own random
      stream, so a result is the same for a seed whatever else is simulated.
    price: dollars per accelerator-hour.
    max_events: failures a trial may take; where the expectation is above a quarter of it the
      result is the closed form alone.
    horizon: `finishes` is False when the expected time is above horizon x the failure-free
      time (the run does not finish in any useful sense).
  """
  accelerators = workers * accelerators_per_worker
  lam = rate.per_s(accelerators)
  S = checkpoint_steps(strategy, job, costs.checkpoint_s, lam)
  tl = Timeline(S, job.step_s, costs.checkpoint_s)
  pre = KINDS.index("preemption") if strategy.saves_on_preemption else -1
  mix_K, down_K = rate.mix_K(), costs.downtime_K()
  exact = _analytic(tl, lam, mix_K, down_K, pre)
  mc = None
  if exact["finishes"] and exact["failures"] <= max_events / 4:
    rng = np.random.default_rng([seed, workers, zlib.crc32(strategy.label.encode())])
    mc = _monte_carlo(tl, lam, mix_K, down_K, pre, trials, rng, max_events)
  finishes = exact["finishes"] and exact["time_s"] <= horizon * job.clean_s
  common = dict(strategy=strategy.label, workers=workers, accelerators=accelerators,
                job_mtbf_h=(1 / lam / 3600 if lam > 0 else math.inf), checkpoints=len(S),
                interval_s=float(tl.segments().mean()), clean_h=job.clean_s / 3600,
                analytic_time_h=exact["time_s"] / 3600, trials=trials if mc else 0)
  if mc is None:
    time_h = exact["time_s"] / 3600
    return Result(**common, time_h=time_h, time_h_p10=math.nan, time_h_p90=math.nan,
                  goodput=job.clean_s / exact["time_s"],
                  waste_fraction=exact["waste_fraction"],
                  checkpoint_overhead=exact["checkpoint_overhead"],
                  downtime_fraction=exact["downtime_fraction"], failures=exact["failures"],
                  failures_by_kind={k: exact["failures"] * p for k, p in zip(KINDS, mix_K)},
                  accelerator_hours=accelerators * time_h,
                  cost_usd=accelerators * time_h * price, method="analytic",
                  finishes=finishes)
  wall_T = mc["wall_T"]
  time_h = float(wall_T.mean()) / 3600
  return Result(**common, time_h=time_h,
                time_h_p10=float(np.percentile(wall_T, 10)) / 3600,
                time_h_p90=float(np.percentile(wall_T, 90)) / 3600,
                goodput=job.clean_s / float(wall_T.mean()),
                waste_fraction=float((mc["wasted_T"] / mc["executed_T"]).mean()),
                checkpoint_overhead=float((mc["saving_T"] / wall_T).mean()),
                downtime_fraction=float((mc["down_T"] / wall_T).mean()),
                failures=float(mc["fails_TxK"].sum(1).mean()),
                failures_by_kind={k: float(v) for k, v in zip(KINDS, mc["fails_TxK"].mean(0))},
                accelerator_hours=accelerators * time_h, cost_usd=accelerators * time_h * price,
                method="monte_carlo", finishes=finishes)


def sweep(job: Job, costs: Costs, rate: FailureRate, strategies: Sequence[Strategy],
          workers: Sequence[int] = WORKERS, *, scaling: str = "weak", ref_workers: int = 16,
          **kwargs) -> list[Result]:
  """Every (strategy, worker count). scaling 'weak': the same job (and time) at every worker
  count (the global batch grows with the workers); 'strong': the same work, a step taking
  step_s x ref_workers / workers. kwargs go to `simulate`."""
  if scaling not in ("weak", "strong"):
    raise ValueError(f"sweep: scaling={scaling!r}; use 'weak' or 'strong'")
  return [simulate(job.strong(w, ref_workers) if scaling == "strong" else job, costs, rate, s,
                   w, **kwargs) for s in strategies for w in workers]


def table_v(costs: Costs, rate: FailureRate, *, job: Job | None = None,
            workers: Sequence[int] = (4, 8, 16, 32), ref_workers: int = 16,
            accelerators_per_worker: int = 8, strategy: Strategy = Strategy("lineage"),
            **kwargs) -> list[dict]:
  """The paper's Table V (strong scaling of its job, 8 GPUs per worker) simulated, its values
  beside. Speedup and efficiency are against the smallest worker count."""
  job = job or Job.paper_scale()
  rows = sweep(job, costs, rate, [strategy], workers, scaling="strong", ref_workers=ref_workers,
               accelerators_per_worker=accelerators_per_worker, **kwargs)
  base = rows[0]
  label = f"published: {PAPER}, Table V"
  return [{"workers": r.workers, "time_h": r.time_h, "speedup": base.time_h / r.time_h,
           "efficiency": base.time_h / r.time_h * base.workers / r.workers,
           "overhead": r.checkpoint_overhead, "goodput": r.goodput, "failures": r.failures,
           "label": "simulated",
           "paper": {**PAPER_TABLE_V[r.workers], "label": label}
                    if r.workers in PAPER_TABLE_V else None} for r in rows]


def table_vi(costs: Costs, rate: FailureRate, *, job: Job | None = None, workers: int = 16,
             accelerators_per_worker: int = 8, strategies: Sequence[Strategy] | None = None,
             price: float = PRICE, **kwargs) -> list[dict]:
  """The paper's Table VI (its 16 workers x 8 GPUs) simulated: accelerator-hours and cost per
  strategy at `price` per accelerator-hour, its values beside."""
  job = job or Job.paper_scale()
  strategies = strategies or default_strategies(job)
  rows = [simulate(job, costs, rate, s, workers, accelerators_per_worker=accelerators_per_worker,
                   price=price, **kwargs) for s in strategies]
  label = f"published: {PAPER}, Table VI"
  return [{"strategy": r.strategy, "accelerator_hours": r.accelerator_hours,
           "cost_usd": r.cost_usd, "time_h": r.time_h, "finishes": r.finishes,
           "label": "simulated",
           "paper": {**PAPER_TABLE_VI[r.strategy], "label": label}
                    if r.strategy in PAPER_TABLE_VI else None} for r in rows]


def intervals(costs: Costs, rate: FailureRate, jobs: Sequence[Job],
              workers: Sequence[int] = WORKERS, accelerators_per_worker: int = 1) -> list[dict]:
  """Per worker count: the job MTBF, Young's and Daly's optimal intervals, and medjax's
  choices per job (seconds between saves at partition boundaries, every k steps, epochs)."""
  rows = []
  for w in workers:
    mtbf = 1 / rate.per_s(w * accelerators_per_worker)
    row = {"workers": w, "job_mtbf_h": mtbf / 3600,
           "young_s": young_daly_interval(costs.checkpoint_s, mtbf, 1),
           "daly_s": young_daly_interval(costs.checkpoint_s, mtbf, 2)}
    for job in jobs:
      row[job.name] = {"partition_s": job.partition_steps * job.step_s,
                       "every_k_s": job.every_k * job.step_s if job.every_k else None,
                       "epoch_s": job.steps_per_epoch * job.step_s,
                       "partition_over_young": job.partition_steps * job.step_s / row["young_s"]}
    rows.append(row)
  return rows


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
    failures: in the order they happened.
    steps_executed, waste_fraction: the run's summary.json fault_tolerance numbers.
    wall_s: the run's training wall time, as `sources['wall_s']` defines it.
    sources: how each number was obtained.
  """
  job: Job
  checkpoint_s: float
  failures: tuple[MeasuredFailure, ...]
  steps_executed: int
  waste_fraction: float
  wall_s: float
  sources: Mapping[str, str] = dataclasses.field(default_factory=dict)


def replay(job: Job, strategy: Strategy, checkpoint_s: float,
           failures: Sequence[MeasuredFailure]) -> dict:
  """A deterministic run of `job` under `strategy` with `failures` at their steps, each
  costing its own detection and recovery time. Returns steps executed and wasted, wall time
  (first step to the end), time in saves and the saves taken."""
  tl = Timeline(checkpoint_steps(strategy, job, checkpoint_s, 0.0), job.step_s, checkpoint_s)
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
      s_new = max(s0, int(tl.committed(t)))
      wasted += f.step - s_new
    s0 = s_new
  executed += tl.n - s0
  wall += float(tl.tau(tl.n) - tl.tau(s0))
  saving += float(tl.saving(tl.tau(tl.n)) - tl.saving(tl.tau(s0)))
  saves += int(len(tl.S) - np.searchsorted(tl.S, s0, "right"))
  return {"steps_executed": executed, "steps_wasted": wasted,
          "waste_fraction": wasted / executed, "wall_s": wall, "checkpoint_s": saving,
          "saves": saves, "skipped_failure_steps": skipped}


def validate(measured: Measured, *, costs: Costs | None = None, tolerance: float = 0.2) -> dict:
  """Simulates the measured run (same plan, checkpoint policy and failures at the same steps)
  and compares waste fraction, steps executed and wall time.

  Args:
    measured: the run (`measured_from_bench_fault`, `measured_from_workdir`, or by hand).
    costs: None: each failure costs its own measured detection and recovery time; given: the
      model's per-kind detection and the recovery path's time instead.
    tolerance: the relative error within which a number agrees (issue 14: 20%).

  Returns:
    {'measured', 'simulated', 'relative_error', 'within_tolerance', 'tolerance', 'inputs'}:
    relative_error is (simulated - measured) / measured per number.
  """
  failures = measured.failures
  if costs is not None:
    failures = tuple(dataclasses.replace(
        f, detected_s=costs.detect_s[f.kind], recovered_s=costs.recover_s[costs.recovery_path])
        for f in failures)
  sim = replay(measured.job, Strategy("lineage", every_k=measured.job.every_k),
               measured.checkpoint_s, failures)
  meas = {"waste_fraction": measured.waste_fraction, "steps_executed": measured.steps_executed,
          "wall_s": measured.wall_s}
  err = {k: (sim[k] - v) / v if v else (0.0 if sim[k] == v else math.inf)
         for k, v in meas.items()}
  return {"measured": meas, "simulated": sim, "relative_error": err,
          "within_tolerance": {k: abs(e) <= tolerance for k, e in err.items()},
          "tolerance": tolerance,
          "notes": ["medjax counts executed steps from each generation's progress reports, so "
                    "a worker that is SIGKILLed or SIGSTOPped may not report its last steps: "
                    "the measured waste can be below the steps the replay throws away",
                    "a preemption saves at the fault's step here; medjax's processes agree on "
                    "a step a few steps later, which changes no count"],
          "inputs": {"job": dataclasses.asdict(measured.job),
                     "checkpoint_s": measured.checkpoint_s,
                     "failures": [dataclasses.asdict(f) for f in failures],
                     "costs": "per-failure measured times" if costs is None else costs.name,
                     "sources": dict(measured.sources)}}


_FAULT = re.compile(r"^\s*(?:\d+-)?(\w+)@(step|partition|epoch)=(\d+):process=\d+\s*$")


def fault_steps(inject: str, job: Job) -> list[tuple[str, int]]:
  """config.fault.inject ('kill@step=495:process=1; ...') -> [(kind, step)]: the step after
  which each fault fires (partition=N and epoch=N fire before partition N's or epoch N's first
  step, in the first epoch that reaches them)."""
  out = []
  for item in filter(str.strip, inject.split(";")):
    m = _FAULT.match(item)
    if not m or m.group(1) not in KIND_OF:
      raise ValueError(f"fault {item!r}: not KIND@step=N:process=P (config.fault.inject)")
    at = int(m.group(3))
    step = {"step": at, "partition": at * job.partition_steps,
            "epoch": at * job.steps_per_epoch}[m.group(2)]
    out.append((KIND_OF[m.group(1)], step))
  return out


def _match_failures(recorded: list[dict], faults: list[tuple[str, int]] | None,
                    where: str) -> tuple[tuple[MeasuredFailure, ...], str]:
  """The summary's failures (kind, detection, recovery) at the injected faults' steps when they
  match one to one, else at their recorded steps (the last step the worker reported)."""
  out = []
  use_faults = faults is not None and len(faults) == len(recorded)
  for i, f in enumerate(recorded):
    kind = KIND_OF.get(f.get("kind"))
    if kind is None:
      raise ValueError(f"{where}: failure {i} has kind {f.get('kind')!r}, not one of "
                       f"{sorted(KIND_OF)}")
    if use_faults and faults[i][0] != kind:
      use_faults = False
    step = faults[i][1] if use_faults else f.get("step")
    recovered = f.get("recovered_s")
    if not isinstance(step, int) or not isinstance(f.get("detected_s"), (int, float)) or not \
        isinstance(recovered, (int, float)):
      raise ValueError(f"{where}: failure {i} lacks step, detected_s or recovered_s: {f}")
    out.append(MeasuredFailure(kind, step, float(f["detected_s"]), float(recovered)))
  if not use_faults:
    out = [MeasuredFailure(f.kind, r["step"], f.detected_s, f.recovered_s)
           for f, r in zip(out, recorded)]
  how = ("the injected faults' steps (config.fault.inject)" if use_faults else
         "the failures' recorded steps (the worker's last reported step: a lower bound)")
  return tuple(out), how


def measured_from_bench_fault(path: str = os.path.join(RESULTS, "bench_fault.json"), *,
                              every_k: int = 25, job: Job | None = None) -> Measured:
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
  d = _read_json(path)
  fb = _get(d, "failures", where=path)
  steps, clean_s = _get(fb, "steps", where=path), _get(fb, "clean_train_s", where=path)
  job = job or Job.quickstart(1.0, every_k)
  if job.steps != steps:
    raise ValueError(f"{path}: {steps} steps, but the job {job.name!r} has {job.steps}; pass "
                     "job=Job(...) with the run's plan")
  blocking = d.get("overhead", {}).get("partition", {}).get("checkpoint_blocking_fraction", 0.0)
  job = dataclasses.replace(job, step_s=clean_s * (1 - blocking) / steps, every_k=every_k)
  ckpt = _per_save(d, path, job.partition_steps)[0] if "overhead" in d else 0.0
  faults = fault_steps(fb["faults"], job) if isinstance(fb.get("faults"), str) else None
  failures, how = _match_failures(_get(fb, "failures", where=path), faults, path)
  wall = (_get(fb, "faulty_launch_s", where=path)
          - (_get(fb, "clean_launch_s", where=path) - clean_s))
  name = os.path.basename(path)
  return Measured(
      job, ckpt, failures, int(_get(fb, "steps_executed", where=path)),
      float(_get(fb, "waste_fraction", where=path)), wall,
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
      training seconds over the steps it executed (summary generations).
    checkpoint_s: blocking seconds per save; default: this run's blocked seconds over the saves
      a replay of its policy takes.

  Wall time: from the first generation's first step to the coordinator's 'done' event.
  """
  where = os.path.join(workdir, "summary.json")
  ft = _get(_read_json(where), "fault_tolerance", where=where)
  cfg_path = os.path.join(workdir, "config.json")
  cfg = _read_json(cfg_path)
  epochs = _get(cfg, "optim", "epochs", where=cfg_path)
  parts = _get(cfg, "data", "num_partitions", where=cfg_path)
  every_k = int(_get(cfg, "ckpt", "every_steps", where=cfg_path))
  if not _get(cfg, "ckpt", "partition_boundaries", where=cfg_path):
    raise ValueError(f"{cfg_path}: ckpt.partition_boundaries is False; validate replays "
                     "medjax's partition-boundary policy only")
  steps = int(_get(ft, "steps_committed", where=where))
  if steps % (epochs * parts):
    raise ValueError(f"{where}: {steps} steps do not split into {epochs} epochs x {parts} "
                     "equal partitions; build the Measured by hand with the run's plan")
  gens = _get(ft, "generations", where=where).values()
  executed = sum(int(g.get("executed", 0)) for g in gens)
  if step_s is None:
    step_s = sum(float(g.get("training_s", 0.0)) for g in gens) / executed
  job = Job(step_s, steps // (epochs * parts), parts, epochs, every_k, "measured",
            f"{cfg_path}: optim.epochs {epochs}, data.num_partitions {parts}")
  events = []
  with open(os.path.join(workdir, "events.jsonl")) as f:
    for line in f:
      try:
        events.append(json.loads(line))
      except ValueError:
        continue
  times = {e.get("event"): e.get("time") for e in reversed(events)}   # the first of each
  done = [e["time"] for e in events if e.get("event") == "done"]
  if "first_step" not in times or not done:
    raise ValueError(f"{workdir}/events.jsonl: no first_step or done event; did the run end?")
  faults = []
  for e in (e for e in events if e.get("event") == "failure"):
    faults.append(fault_steps(e["fault"], job)[0] if e.get("fault") else (
        KIND_OF.get(e.get("kind"), "crash"), e.get("step")))
  failures, how = _match_failures(_get(ft, "failures", where=where), faults, where)
  if checkpoint_s is None:
    saves = replay(job, Strategy("lineage", every_k=every_k), 0.0, failures)["saves"]
    checkpoint_s = sum(float(g.get("blocked_s", 0.0)) for g in gens) / saves
  return Measured(job, checkpoint_s, failures, int(_get(ft, "steps_executed", where=where)),
                  float(_get(ft, "waste_fraction", where=where)), done[-1] - times["first_step"],
                  {"step_s": f"{step_s:.5f} s", "failures": f"{where}: steps: {how}",
                   "wall_s": f"{workdir}/events.jsonl: first first_step to done",
                   "checkpoint_s": f"{checkpoint_s:.5f} s per save"})


# --- The tables, figures and files --------------------------------------------------------

LEFT_OUT = (
    "stragglers and step-time variance (a synchronous step waits for the slowest worker)",
    "correlated failures (a switch or power domain taking many hosts at once, a bad node "
    "failing again after it rejoins) and failures while the job is down or restoring",
    "communication and parallel efficiency (strong scaling is perfect here)",
    "checkpoint and recovery costs growing with scale: write contention, storage bandwidth, "
    "restore and jax.distributed start-up time on many hosts",
    "async commit latency of a save, and the CPU its background write takes from training",
    "data-loader warm-up and cache refill after a restart or a host change; the first compile",
    "elastic shrinking, waiting for a replacement machine, back-off after repeated failures",
    "silent data corruption and loss spikes that force a rollback past the last checkpoint",
    "evaluation passes")


def run(results_dir: str = RESULTS, *, trials: int = 500, seed: int = 0,
        workers: Sequence[int] = WORKERS, price: float = PRICE, job: Job | None = None,
        costs: Mapping[str, Costs] | None = None,
        rates: Mapping[str, FailureRate] | None = None,
        time_interval_s: float = 1800.0) -> dict:
  """Everything the entry point writes, as one JSON-ready dict (see `markdown`).

  Defaults: the paper-scale job (`Job.paper_scale`), medjax's measured costs
  (`load_costs(results_dir)`) and the lineage paper's (`Costs.paper`), both failure rates
  (`RATES`), one accelerator per worker in the sweep, and the validation against
  <results_dir>/bench_fault.json.
  """
  t0 = time.perf_counter()
  job = job or Job.paper_scale()
  costs = dict(costs) if costs else {"medjax": load_costs(results_dir), "paper": Costs.paper()}
  rates = dict(rates) if rates else dict(RATES)
  strategies = default_strategies(job, time_interval_s)
  kw = {"trials": trials, "seed": seed, "price": price}
  out = {"what": "failure-and-checkpoint simulator (experiments/failure_sim.py): every number "
                 "under sweep, table_v, table_vi, intervals and validation.simulated is "
                 "simulated; inputs are labelled measured, published or assumption",
         "config": {"trials": trials, "seed": seed, "workers": list(workers), "price": price,
                    "price_source": PRICE_SOURCE, "time_interval_s": time_interval_s,
                    "time_interval_source": "assumption: the lineage paper gives no interval "
                                            "for its time-based strategy",
                    "sweep_scaling": "weak: the same job and failure-free time at every "
                                     "worker count; one accelerator per worker",
                    "young_daly": [YOUNG, DALY]},
         "inputs": {"job": dataclasses.asdict(job),
                    "costs": {k: dataclasses.asdict(c) for k, c in costs.items()},
                    "rates": {k: {**dataclasses.asdict(r), "mix": dict(r.mix)}
                              for k, r in rates.items()}},
         "sweep": {}, "table_v": {}, "table_vi": {}, "intervals": {}}
  for cn, c in costs.items():
    out["sweep"][cn], out["table_v"][cn], out["table_vi"][cn] = {}, {}, {}
    for rn, r in rates.items():
      out["sweep"][cn][rn] = [x.as_dict() for x in sweep(job, c, r, strategies, workers, **kw)]
      out["table_v"][cn][rn] = table_v(c, r, job=job, trials=trials, seed=seed)
      out["table_vi"][cn][rn] = table_vi(c, r, job=job, strategies=strategies, **kw)
  try:
    measured = measured_from_bench_fault(os.path.join(results_dir, "bench_fault.json"))
    out["validation"] = validate(measured)
    jobs = [job, measured.job]
  except (ValueError, OSError) as e:
    out["validation"] = {"error": str(e)}
    jobs = [job]
  for cn, c in costs.items():
    out["intervals"][cn] = {rn: intervals(c, r, jobs, workers) for rn, r in rates.items()}
  out["left_out"] = list(LEFT_OUT)
  out["wall_s"] = round(time.perf_counter() - t0, 1)
  return _finite(out)


def _finite(obj):
  """JSON without NaN or Infinity (None instead), floats rounded."""
  if isinstance(obj, dict):
    return {k: _finite(v) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return [_finite(v) for v in obj]
  if isinstance(obj, (float, np.floating)):
    return round(float(obj), 6) if math.isfinite(obj) else None
  if isinstance(obj, np.integer):
    return int(obj)
  if isinstance(obj, np.bool_):
    return bool(obj)
  return obj


def _hours(h) -> str:
  if h is None:
    return "never"
  return f"{h:,.1f} h" if h < 1e6 else f"{h:.0e} h (never)"


def _goodput(r: dict) -> str:
  return f"{r['goodput']:.3f}" if r["goodput"] >= 0.001 else "<0.001"


def _pct(x) -> str:
  return "-" if x is None else f"{100 * x:.2f}%"


def goodput_table(rows: list[dict]) -> str:
  """Workers down, strategies across: simulated goodput."""
  names = list(dict.fromkeys(r["strategy"] for r in rows))
  by = {(r["strategy"], r["workers"]): r for r in rows}
  lines = ["| workers | job MTBF | " + " | ".join(names) + " |",
           "|---:|---:|" + "---:|" * len(names)]
  for w in sorted({r["workers"] for r in rows}):
    cells = [_goodput(by[n, w]) for n in names]
    lines.append(f"| {w:,} | {by[names[0], w]['job_mtbf_h']:,.2f} h | " + " | ".join(cells)
                 + " |")
  return "\n".join(lines)


def detail_table(rows: list[dict]) -> str:
  lines = ["| strategy | workers | time to train | goodput | waste | checkpoint overhead | "
           "downtime | failures | accelerator-hours | cost | method |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
  for r in rows:
    ok = r["time_h"] is not None and r["time_h"] < 1e6
    lines.append(
        f"| {r['strategy']} | {r['workers']:,} | {_hours(r['time_h'])} | {_goodput(r)} | "
        f"{_pct(r['waste_fraction'])} | {_pct(r['checkpoint_overhead'])} | "
        f"{_pct(r['downtime_fraction'])} | "
        + (f"{r['failures']:,.1f} | {r['accelerator_hours']:,.0f} | ${r['cost_usd']:,.0f}"
           if ok else "- | - | -") + f" | {r['method']} |")
  return "\n".join(lines)


def _inputs_md(result: dict) -> list[str]:
  lines = ["| input | value | label |", "|---|---|---|"]
  for cn, c in result["inputs"]["costs"].items():
    values = {"checkpoint_s": c["checkpoint_s"],
              **{f"detect_s.{k}": v for k, v in c["detect_s"].items()},
              **{f"recover_s.{k}": v for k, v in c["recover_s"].items()}}
    for k, v in values.items():
      used = " (used)" if k == f"recover_s.{c['recovery_path']}" else ""
      lines.append(f"| costs {cn}: {k}{used} | {v:.4g} s | {c['sources'].get(k, '-')} |")
  for rn, r in result["inputs"]["rates"].items():
    mix = ", ".join(f"{k} {v:.3f}" for k, v in r["mix"].items())
    lines.append(f"| rate {rn}: MTBF per accelerator | {r['accelerator_mtbf_h']:,.0f} h | "
                 f"{r['source']} |")
    lines.append(f"| rate {rn}: mix | {mix} | {r['mix_source']} |")
  j = result["inputs"]["job"]
  lines.append(f"| job {j['name']} | {j['epochs']} epochs x {j['partitions_per_epoch']} "
               f"partitions x {j['partition_steps']} steps of {j['step_s']:.1f} s | "
               f"{j['source']} |")
  cfg = result["config"]
  lines.append(f"| price | ${cfg['price']:.2f} per accelerator-hour | {cfg['price_source']} |")
  lines.append(f"| time strategy interval | {cfg['time_interval_s'] / 60:g} min | "
               f"{cfg['time_interval_source']} |")
  return lines


def markdown(result: dict) -> str:
  """failure_sim.md: the inputs with their labels, then every table (all simulated)."""
  cfg = result["config"]
  out = ["# Failures and checkpoints at scale (simulated; Tables V-VI of the lineage paper)", "",
         f"`python -m experiments.failure_sim` ({cfg['trials']} Monte Carlo trials per row, "
         f"seed {cfg['seed']}, {result['wall_s']} s). Every number in the tables below is "
         "**simulated**; every input is labelled *measured on this machine*, *published: "
         "source* or *assumption*. Sweep: " + cfg["sweep_scaling"] + ".", "",
         "## Inputs", "", *_inputs_md(result), ""]
  for cn, by_rate in result["sweep"].items():
    for rn, rows in by_rate.items():
      out += [f"## Goodput (simulated): costs {cn}, failure rate {rn}", "",
              goodput_table(rows), ""]
  first_c, first_r = next(iter(result["sweep"])), next(iter(result["sweep"][next(iter(
      result["sweep"]))]))
  rows = result["sweep"][first_c][first_r]
  out += [f"## Per strategy and worker count (simulated): costs {first_c}, rate {first_r}", "",
          detail_table(rows), ""]
  top = max(cfg["workers"])
  out += [f"## At {top:,} workers (simulated goodput)", "",
          "| costs | rate | " + " | ".join(dict.fromkeys(r["strategy"] for r in rows)) + " |",
          "|---|---|" + "---:|" * len(dict.fromkeys(r["strategy"] for r in rows))]
  for cn, by_rate in result["sweep"].items():
    for rn, rs in by_rate.items():
      cells = [_goodput(r) for r in rs if r["workers"] == top]
      out.append(f"| {cn} | {rn} | " + " | ".join(cells) + " |")
  out += ["", "## Table V beside the paper (simulated: lineage strategy, strong scaling of the "
          "paper-scale job from 16 workers, 8 GPUs per worker)", "",
          "| workers | paper time | sim. time | paper speedup | sim. speedup | paper eff. | "
          "sim. eff. | paper O/H | sim. O/H | costs | rate |",
          "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
  for cn, by_rate in result["table_v"].items():
    for rn, rs in by_rate.items():
      for r in rs:
        p = r["paper"] or {}
        out.append(f"| {r['workers']} | {p.get('time_h', '-')} h | {r['time_h']:.1f} h | "
                   f"{p.get('speedup', '-')} | {r['speedup']:.2f} | {_pct(p.get('efficiency'))} | "
                   f"{_pct(r['efficiency'])} | {_pct(p.get('overhead'))} | {_pct(r['overhead'])} "
                   f"| {cn} | {rn} |")
  out += ["", "Simulated efficiency counts failure and checkpoint losses only (no "
          "communication model); the paper's includes communication and stragglers.", "",
          "## Table VI beside the paper (simulated: 16 workers x 8 GPUs, the paper-scale job, "
          f"${cfg['price']:.2f} per GPU-hour)", "",
          "| strategy | paper approach | paper GPU-h | paper cost | sim. GPU-h | sim. cost | "
          "costs | rate |", "|---|---|---:|---:|---:|---:|---|---|"]
  for cn, by_rate in result["table_vi"].items():
    for rn, rs in by_rate.items():
      for r in rs:
        p = r["paper"] or {}
        sim = (f"{r['accelerator_hours']:,.0f} | ${r['cost_usd']:,.0f}"
               if r["time_h"] is not None and r["time_h"] < 1e6 else "never | -")
        paper = (f"{p['approach']} | {p['gpu_hours']:,} | ${p['cost']:,}" if p else "- | - | -")
        out.append(f"| {r['strategy']} | {paper} | {sim} | {cn} | {rn} |")
  out += ["", "## Young/Daly interval vs medjax's choices (seconds of training between saves)",
          "", f"Young: sqrt(2 C M) ({YOUNG}); Daly: {DALY}. C = the costs' checkpoint time; M = "
          "the job's MTBF at that worker count (one accelerator per worker).", ""]
  for cn, by_rate in result["intervals"].items():
    for rn, rs in by_rate.items():
      jobs = [k for k in rs[0] if isinstance(rs[0][k], dict)]
      head = " | ".join(f"{j} partition | {j} every-k" for j in jobs)
      out += [f"costs {cn}, rate {rn}:", "", f"| workers | MTBF | Young | Daly | {head} |",
              "|---:|---:|---:|---:|" + "---:|---:|" * len(jobs)]
      for r in rs:
        cells = " | ".join(f"{r[j]['partition_s']:,.1f} | " + (
            f"{r[j]['every_k_s']:,.1f}" if r[j]["every_k_s"] else "-") for j in jobs)
        out.append(f"| {r['workers']:,} | {r['job_mtbf_h']:,.2f} h | {r['young_s']:,.1f} | "
                   f"{r['daly_s']:,.1f} | {cells} |")
      out.append("")
  v = result["validation"]
  out += ["## Validation against a measured run (quickstart, 3 injected failures)", ""]
  if "error" in v:
    out += [f"Not run: {v['error']}", ""]
  else:
    out += ["| number | measured | simulated | relative error | within "
            f"{100 * v['tolerance']:g}% |", "|---|---:|---:|---:|---|"]
    for k, m in v["measured"].items():
      out.append(f"| {k} | {m:.5g} | {v['simulated'][k]:.5g} | "
                 f"{100 * v['relative_error'][k]:+.1f}% | {v['within_tolerance'][k]} |")
    out += [""] + [f"- {k}: {s}" for k, s in v["inputs"]["sources"].items()]
    out += [f"- note: {n}" for n in v.get("notes", [])] + [""]
  out += ["## What the simulator leaves out", ""] + [f"- {x}" for x in result["left_out"]]
  return "\n".join(out) + "\n"


def figures(result: dict) -> dict:
  """'goodput' and 'waste' vs workers, one panel per (costs, rate), a line per strategy."""
  from matplotlib import figure  # pylint: disable=import-outside-toplevel
  panels = [(cn, rn, rows) for cn, by in result["sweep"].items() for rn, rows in by.items()]
  figs = {}
  for key, label in (("goodput", "goodput (simulated)"),
                     ("waste_fraction", "waste fraction (simulated)")):
    cols = min(2, len(panels))
    rows_ = math.ceil(len(panels) / cols)
    fig = figure.Figure(figsize=(5.5 * cols, 3.8 * rows_), layout="constrained")
    axes = fig.subplots(rows_, cols, squeeze=False).ravel()
    for ax, (cn, rn, rows) in zip(axes, panels):
      for name in dict.fromkeys(r["strategy"] for r in rows):
        rs = [r for r in rows if r["strategy"] == name]
        ax.plot([r["workers"] for r in rs], [r[key] for r in rs], marker="o", ms=3, label=name)
      ax.set_xscale("log", base=2)
      ax.set_ylim(0, 1.02)
      ax.set_xlabel("workers (1 accelerator each)")
      ax.set_ylabel(label)
      ax.set_title(f"costs: {cn}; failure rate: {rn}", fontsize=9)
      ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{label} vs workers, job {result['inputs']['job']['name']} at every worker "
                 "count; inputs: measured (medjax costs) or published (paper costs, rates)",
                 fontsize=10)
    figs["goodput" if key == "goodput" else "waste"] = fig
  return figs


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--trials", type=int, default=500,
                      help="Monte Carlo runs per row (the rare failures of small worker "
                           "counts make 'none' noisy below a few hundred)")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--price", type=float, default=PRICE, help="$ per accelerator-hour")
  parser.add_argument("--workers", default=",".join(map(str, WORKERS)))
  parser.add_argument("--results", default=RESULTS, help="where the measured JSON files are")
  parser.add_argument("--out", default=RESULTS)
  args = parser.parse_args(argv)
  try:
    workers = [int(w) for w in args.workers.split(",") if w]
  except ValueError:
    parser.error(f"--workers {args.workers!r}: write comma-separated integers, e.g. 4,8,16")
  if not workers or min(workers) < 1 or args.trials < 1:
    parser.error("--workers needs counts >= 1 and --trials >= 1")
  result = run(args.results, trials=args.trials, seed=args.seed, workers=workers,
               price=args.price)
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "failure_sim.json"), "w") as f:
    json.dump(result, f, indent=1)
  with open(os.path.join(args.out, "failure_sim.md"), "w") as f:
    f.write(markdown(result))
  for name, fig in figures(result).items():
    fig.savefig(os.path.join(args.out, f"failure_sim_{name}.png"), dpi=110)
  first = next(iter(result["sweep"]))
  for rn, rows in result["sweep"][first].items():
    print(f"goodput (simulated), costs {first}, failure rate {rn}:")
    print(goodput_table(rows))
  v = result["validation"]
  if "error" not in v:
    print("validation vs bench_fault.json: " + ", ".join(
        f"{k} {v['simulated'][k]:.4g} simulated vs {m:.4g} measured "
        f"({100 * v['relative_error'][k]:+.1f}%)" for k, m in v["measured"].items()))
  print(f"wrote failure_sim.json, .md, _goodput.png, _waste.png in {args.out} "
        f"({result['wall_s']} s)")
  return result


if __name__ == "__main__":
  main()
