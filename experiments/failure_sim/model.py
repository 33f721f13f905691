"""The simulation: a job (`Job`) under a checkpoint strategy (`Strategy`), its failure-free
timeline, and its goodput, waste and cost under Poisson failures, in closed form and by Monte
Carlo (`simulate`, `sweep`), with Tables V-VI and the Young/Daly intervals."""

from __future__ import annotations

import dataclasses
import math
import zlib
from typing import Mapping, Sequence

import numpy as np

from experiments.failure_sim import inputs

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
    if self.name not in inputs.STRATEGIES:
      raise ValueError(f"Strategy {self.name!r}: use one of {inputs.STRATEGIES}")
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
  fails_TxK = np.zeros((trials, len(inputs.KINDS)), np.int64)
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
    kind = rng.choice(len(inputs.KINDS), size=a.size, p=mix_K)
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


def simulate(job: Job, costs: inputs.Costs, rate: inputs.FailureRate, strategy: Strategy,
             workers: int, *,
             accelerators_per_worker: int = 1, trials: int = 500, seed: int = 0,
             price: float = inputs.PRICE, max_events: int = 3000, horizon: float = 100.0) -> Result:
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
  pre = inputs.KINDS.index("preemption") if strategy.saves_on_preemption else -1
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
                  failures_by_kind={k: exact["failures"] * p for k, p in zip(inputs.KINDS, mix_K)},
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
                failures_by_kind={k: float(v)
                                  for k, v in zip(inputs.KINDS, mc["fails_TxK"].mean(0))},
                accelerator_hours=accelerators * time_h, cost_usd=accelerators * time_h * price,
                method="monte_carlo", finishes=finishes)


def sweep(job: Job, costs: inputs.Costs, rate: inputs.FailureRate, strategies: Sequence[Strategy],
          workers: Sequence[int] = inputs.WORKERS, *, scaling: str = "weak", ref_workers: int = 16,
          **kwargs) -> list[Result]:
  """Every (strategy, worker count). scaling 'weak': the same job (and time) at every worker
  count (the global batch grows with the workers); 'strong': the same work, a step taking
  step_s x ref_workers / workers. kwargs go to `simulate`."""
  if scaling not in ("weak", "strong"):
    raise ValueError(f"sweep: scaling={scaling!r}; use 'weak' or 'strong'")
  return [simulate(job.strong(w, ref_workers) if scaling == "strong" else job, costs, rate, s,
                   w, **kwargs) for s in strategies for w in workers]


def table_v(costs: inputs.Costs, rate: inputs.FailureRate, *, job: Job | None = None,
            workers: Sequence[int] = (4, 8, 16, 32), ref_workers: int = 16,
            accelerators_per_worker: int = 8, strategy: Strategy = Strategy("lineage"),
            exchange=None, **kwargs) -> list[dict]:
  """The paper's Table V (strong scaling of its job, 8 GPUs per worker) simulated, its values
  beside. Speedup and efficiency are against the smallest worker count.

  exchange: a `comm.Exchange` (the gradient mode's all-reduce between workers), added to every
  step at each worker count; None: no communication (efficiency then counts only failures and
  checkpoints). Reduction inside a worker's 8 GPUs (NVLink) is taken as free."""
  job = job or Job.paper_scale()
  jobs = [job.strong(w, ref_workers) for w in workers]
  comm_s = [exchange.per_step_s(w) if exchange is not None else 0.0 for w in workers]
  rows = [simulate(dataclasses.replace(j, step_s=j.step_s + c), costs, rate, strategy, w,
                   accelerators_per_worker=accelerators_per_worker, **kwargs)
          for j, c, w in zip(jobs, comm_s, workers)]
  base = rows[0]
  label = f"published: {inputs.PAPER}, Table V"
  return [{"workers": r.workers, "time_h": r.time_h, "speedup": base.time_h / r.time_h,
           "efficiency": base.time_h / r.time_h * base.workers / r.workers,
           "overhead": r.checkpoint_overhead, "goodput": r.goodput, "failures": r.failures,
           "comm_share": c / (j.step_s + c), "label": "simulated",
           "paper": {**inputs.PAPER_TABLE_V[r.workers], "label": label}
                    if r.workers in inputs.PAPER_TABLE_V else None}
          for r, j, c in zip(rows, jobs, comm_s)]


def table_vi(costs: inputs.Costs, rate: inputs.FailureRate, *, job: Job | None = None,
             workers: int = 16,
             accelerators_per_worker: int = 8, strategies: Sequence[Strategy] | None = None,
             price: float = inputs.PRICE, **kwargs) -> list[dict]:
  """The paper's Table VI (its 16 workers x 8 GPUs) simulated: accelerator-hours and cost per
  strategy at `price` per accelerator-hour, its values beside."""
  job = job or Job.paper_scale()
  strategies = strategies or default_strategies(job)
  rows = [simulate(job, costs, rate, s, workers, accelerators_per_worker=accelerators_per_worker,
                   price=price, **kwargs) for s in strategies]
  label = f"published: {inputs.PAPER}, Table VI"
  return [{"strategy": r.strategy, "accelerator_hours": r.accelerator_hours,
           "cost_usd": r.cost_usd, "time_h": r.time_h, "finishes": r.finishes,
           "label": "simulated",
           "paper": {**inputs.PAPER_TABLE_VI[r.strategy], "label": label}
                    if r.strategy in inputs.PAPER_TABLE_VI else None} for r in rows]


def intervals(costs: inputs.Costs, rate: inputs.FailureRate, jobs: Sequence[Job],
              workers: Sequence[int] = inputs.WORKERS,
              accelerators_per_worker: int = 1) -> list[dict]:
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
                       # None where saves cost nothing measurable: Young then says save
                       # at every step, and no partition is too long for it
                       "partition_over_young": job.partition_steps * job.step_s / row["young_s"]
                                               if row["young_s"] > 0 else None}
    rows.append(row)
  return rows
