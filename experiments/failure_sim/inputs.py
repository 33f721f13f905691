"""The simulator's inputs, each labelled with its source: the failure kinds and the published
constants (papers, price), failure rates (`FailureRate`, `RATES`) and what failures and
checkpoints cost (`Costs`, `load_costs` from medjax's measured results)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Mapping

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
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
  saves vs only the final one), and the saves that compares: the saves the runs counted where
  the benchmark recorded them, else one per `partition_steps` steps."""
  over = _get(bench, "overhead", where=where)
  where = f"{where} overhead"
  none, part = _get(over, "none", where=where), _get(over, "partition", where=where)
  if "checkpoints" in part and "checkpoints" in none:
    saves = part["checkpoints"] - none["checkpoints"]
  else:
    saves = _get(part, "steps", where=where) / partition_steps - 1   # beyond the final save
  key = {"blocking": "checkpoint_blocked_s", "wall": "train_s"}.get(checkpoint)
  if key is None:
    raise ValueError(f"checkpoint={checkpoint!r}: use 'blocking' or 'wall'")
  # Saves that blocked less than the noise between two runs read as a small negative cost:
  # they cost nothing measurable.
  return max(0.0, (_get(part, key, where=where) - _get(none, key, where=where)) / saves), saves


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
                     " or recovery.json; run `python -m experiments.bench_recovery` or pass "
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
