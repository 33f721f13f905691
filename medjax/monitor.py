"""The monitor: throughput, host CPU and memory, accelerators and energy, sampled on a thread.

One `Monitor` per process. The training loop calls `step_done` after each step (two integer adds);
a daemon thread samples every `config.monitor.interval_s` and hands each sample, a flat row, to
`write` (the run's MetricWriter: metrics.jsonl kind 'monitor' and TensorBoard). `close` returns
the run's totals for summary.json.

  mon = monitor.Monitor(config.monitor, process_index=jax.process_index(), write=write_row)
  mon.start()
  for ...: train_step(...); mon.step_done(1, batch_size)
  summary["monitor"] = mon.close()

Energy is measured, never invented: RAPL (`/sys/class/powercap/intel-rapl:*`, the CPU packages and
DRAM of the whole host) and NVML's energy counter (each monitored NVIDIA GPU) add up where both are
readable. Where neither is, the summary says why ("not measured: no RAPL or NVML on this machine");
`monitor.nominal_power_w > 0` then gives an estimate, labelled as one everywhere it appears.
"""

from __future__ import annotations

import glob
import logging
import os
import threading
import time
from typing import Any, Callable

import psutil

RAPL_ROOT = "/sys/class/powercap"
_MB = 1024 * 1024
NOT_MEASURED_ANYWHERE = "no RAPL or NVML on this machine"


def _read_int(path: str) -> int:
  with open(path) as f:
    return int(f.read().strip())


class Rapl:
  """The host's RAPL energy counters: every CPU package and DRAM zone, summed.

  Core, uncore and psys zones are left out: the first two are inside their package, psys (laptops)
  overlaps them all. Counters wrap at max_energy_range_uj; reading every few seconds sees each
  wrap (the range is hundreds of kJ, minutes at full power).

  Attributes:
    zones: names of the zones read ([] when none could be).
    reason: why RAPL is not available (None when it is).
    absent: True when the machine has no RAPL at all (as opposed to one this process can't read).
  """

  def __init__(self, root: str = RAPL_ROOT):
    self.zones: list[str] = []
    self.reason: str | None = None
    self.absent = False
    self._paths: list[tuple[str, int]] = []
    self._last: list[int] = []
    self.energy_uj = 0
    dirs = sorted(glob.glob(os.path.join(root, "intel-rapl:*")))
    if not dirs:
      self.absent = True
      self.reason = (f"no {root}" if not os.path.isdir(root) else f"no intel-rapl zones in {root}")
      return
    named = []
    for d in dirs:
      try:
        with open(os.path.join(d, "name")) as f:
          named.append((d, f.read().strip()))
      except OSError:
        named.append((d, ""))
    chosen = [(d, n) for d, n in named if n.startswith("package") or n == "dram"]
    if not chosen:  # no names: the top-level zones are the packages
      chosen = [(d, n or os.path.basename(d)) for d, n in named
                if os.path.basename(d).count(":") == 1]
    try:
      for d, name in chosen:
        energy = os.path.join(d, "energy_uj")
        self._last.append(_read_int(energy))
        self._paths.append((energy, _read_int(os.path.join(d, "max_energy_range_uj"))))
        self.zones.append(name)
    except PermissionError as e:
      self._fail(f"RAPL unreadable: permission denied on {e.filename} (needs root, or a "
                 "readable energy_uj)")
    except (OSError, ValueError) as e:
      self._fail(f"RAPL unreadable: {e}")
    if not self._paths and self.reason is None:
      self._fail(f"no package or dram zone in {root}")

  def _fail(self, reason: str) -> None:
    self.reason = reason
    self.zones, self._paths, self._last = [], [], []

  def read(self) -> float | None:
    """Joules since this reader was made (None once a read fails)."""
    if not self._paths:
      return None
    try:
      now = [_read_int(p) for p, _ in self._paths]
    except (OSError, ValueError) as e:
      self._fail(f"RAPL read failed: {e}")
      return None
    for cur, prev, (_, wrap) in zip(now, self._last, self._paths):
      self.energy_uj += cur - prev if cur >= prev else cur + wrap - prev
    self._last = now
    return self.energy_uj / 1e6


def _visible_gpus(nvml) -> list:
  """Handles of the GPUs this process uses: CUDA_VISIBLE_DEVICES's (indices or UUIDs), else all."""
  visible = os.environ.get("CUDA_VISIBLE_DEVICES")
  if visible is None:
    return [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
  handles = []
  for item in (v.strip() for v in visible.split(",")):
    if item.isdigit():
      handles.append(nvml.nvmlDeviceGetHandleByIndex(int(item)))
    elif item.startswith(("GPU-", "MIG-")):
      handles.append(nvml.nvmlDeviceGetHandleByUUID(item))
    else:  # CUDA ignores the list from its first invalid entry on
      break
  return handles


class Nvml:
  """NVIDIA GPUs through NVML (nvidia-ml-py): utilisation, memory, power and the energy counter.

  Attributes:
    names: the monitored GPUs' names ([] without NVML).
    reason: why NVML energy is not available (None when it is).
    absent: True when the machine has no NVML (no library, no driver, no GPU).
  """

  def __init__(self, module: Any = None):
    self.names: list[str] = []
    self.reason: str | None = None
    self.absent = False
    self._nvml = None
    self._handles: list = []
    self._energy0: list[int] | None = None
    if module is None:
      try:
        import pynvml as module  # pylint: disable=import-outside-toplevel
      except ImportError:
        self.absent, self.reason = True, "nvidia-ml-py not installed"
        return
    try:
      module.nvmlInit()
    except module.NVMLError as e:
      code = getattr(e, "value", None)
      self.absent = code in (module.NVML_ERROR_LIBRARY_NOT_FOUND,
                             module.NVML_ERROR_DRIVER_NOT_LOADED)
      self.reason = ("no NVML library (no NVIDIA driver installed)"
                     if code == module.NVML_ERROR_LIBRARY_NOT_FOUND else
                     "NVIDIA driver not loaded" if code == module.NVML_ERROR_DRIVER_NOT_LOADED
                     else f"NVML: {e}")
      return
    self._nvml = module
    try:
      self._handles = _visible_gpus(module)
      self.names = [_text(module.nvmlDeviceGetName(h)) for h in self._handles]
    except module.NVMLError as e:
      self.reason = f"NVML: {e}"
      self.close()
      return
    if not self._handles:
      self.absent, self.reason = True, "NVML: no GPU"
      self.close()
      return
    try:
      self._energy0 = [module.nvmlDeviceGetTotalEnergyConsumption(h) for h in self._handles]
    except module.NVMLError as e:
      self.reason = f"NVML: no energy counter on {', '.join(sorted(set(self.names)))} ({e})"

  def sample(self) -> tuple[dict[str, float], float | None]:
    """Per-GPU fields (absent where NVML has none) and the GPUs' joules since this reader was made
    (None when a counter could not be read this time)."""
    nvml, row = self._nvml, {}
    if nvml is None:
      return row, None
    total = 0.0 if self._energy0 is not None else None
    for i, h in enumerate(self._handles):
      reads = (("util_pct", nvml.nvmlDeviceGetUtilizationRates, lambda v: v.gpu),
               ("mem", nvml.nvmlDeviceGetMemoryInfo, lambda v: v),
               ("power_w", nvml.nvmlDeviceGetPowerUsage, lambda v: v / 1e3))  # mW
      for name, read, value in reads:
        try:
          v = value(read(h))
        except nvml.NVMLError:
          continue
        if name == "mem":
          row[f"gpu{i}_mem_used_mb"] = v.used / _MB
          row[f"gpu{i}_mem_total_mb"] = v.total / _MB
        else:
          row[f"gpu{i}_{name}"] = float(v)
      if total is not None:
        try:
          joules = (nvml.nvmlDeviceGetTotalEnergyConsumption(h) - self._energy0[i]) / 1e3  # mJ
        except nvml.NVMLError:
          total = None  # a partial sum would be wrong: this sample has no GPU energy
          continue
        row[f"gpu{i}_energy_j"] = joules
        total += joules
    return row, total

  def close(self) -> None:
    if self._nvml is not None:
      try:
        self._nvml.nvmlShutdown()
      except self._nvml.NVMLError:
        pass
      self._nvml = None


def _text(name) -> str:
  return name.decode() if isinstance(name, bytes) else str(name)


class Monitor:
  """Samples one process's throughput and its host's resources every `interval_s` on a thread.

  Args:
    config_monitor: `config.monitor` (interval_s: seconds between samples, 0 = off;
      nominal_power_w: > 0 gives an energy estimate where nothing measures it).
    process_index: this process's index, written in each row as 'process'.
    write: called with each row (from the monitor's thread, and once from `close`).
    clock: seconds; injected by tests.
    rapl_root: where RAPL's sysfs lives (a fake directory in tests).
    nvml: the pynvml module (a fake in tests); None imports pynvml.
  """

  def __init__(self, config_monitor, *, process_index: int, write: Callable[[dict], None],
               clock: Callable[[], float] = time.time, rapl_root: str = RAPL_ROOT,
               nvml: Any = None):
    self.interval_s = float(config_monitor.interval_s)
    self.nominal_power_w = float(getattr(config_monitor, "nominal_power_w", 0.0) or 0.0)
    self.process_index = int(process_index)
    self._write = write
    self._clock = clock
    self._rapl_root, self._nvml_module = rapl_root, nvml
    # Written by the training thread only; the sampler reads them (a torn pair is one step off).
    self._steps = 0
    self._examples = 0
    self._t0 = clock()
    self._last = (self._t0, 0, 0)
    self._rapl: Rapl | None = None
    self._gpus: Nvml | None = None
    self._process = psutil.Process()
    self._lock = threading.Lock()
    self._stop = threading.Event()
    self._thread: threading.Thread | None = None
    self._write_failed = False
    self._totals: dict | None = None
    self._n = 0
    self._peak_rss = self._peak_host_used = 0.0
    self._cpu_sum = 0.0
    self._energy_j: float | None = None
    self._joules: dict[str, float] = {}
    self._t_last = self._t0

  def _open(self) -> None:
    if self._rapl is not None:
      return
    self._rapl = Rapl(self._rapl_root)
    self._gpus = Nvml(self._nvml_module)
    # psutil's CPU percentages are since the previous call: this one sets the baseline.
    self._process.cpu_percent(None)
    psutil.cpu_percent(None)

  def start(self) -> None:
    """Opens the readers and starts the sampling thread (nothing when interval_s == 0)."""
    if self.interval_s <= 0 or self._thread is not None:
      return
    self._open()
    self._t0 = self._t_last = self._clock()
    self._last = (self._t0, self._steps, self._examples)
    self._thread = threading.Thread(target=self._run, name=f"monitor-{self.process_index}",
                                    daemon=True)
    self._thread.start()

  def step_done(self, steps: int, examples: int) -> None:
    """Counts finished training steps and their examples (the training loop's only cost)."""
    self._steps += steps
    self._examples += examples

  def _run(self) -> None:
    deadline = time.monotonic()
    while True:
      deadline += self.interval_s
      if self._stop.wait(max(deadline - time.monotonic(), 0.0)):
        return
      self._emit()

  def _emit(self) -> None:
    try:
      self._write(self.sample())
    except Exception as e:  # pylint: disable=broad-except
      if not self._write_failed:  # once: a broken writer must not stop training or flood the log
        self._write_failed = True
        logging.warning("monitor: sampling or writing failed (%s: %s); later failures not logged",
                        type(e).__name__, e)

  def sample(self) -> dict:
    """One sample now: a flat {name: float | None} row with 'time' and 'process'."""
    with self._lock:
      self._open()
      now, steps, examples = self._clock(), self._steps, self._examples
      t_prev, steps_prev, examples_prev = self._last
      self._last = (now, steps, examples)
      dt, d_steps = now - t_prev, steps - steps_prev
      mem, host = self._process.memory_info(), psutil.virtual_memory()
      row = {
          "time": now, "process": float(self.process_index),
          "interval_s": dt, "steps": float(steps), "examples": float(examples),
          "examples_per_s": (examples - examples_prev) / dt if dt > 0 else None,
          "steps_per_s": d_steps / dt if dt > 0 else None,
          "step_time_s": dt / d_steps if d_steps > 0 else None,  # wall time per step
          "process_cpu_pct": self._process.cpu_percent(None),  # 100 = one core
          "rss_mb": mem.rss / _MB,
          "host_cpu_pct": psutil.cpu_percent(None),  # 100 = every core
          "host_mem_used_mb": host.used / _MB,
          "host_mem_available_mb": host.available / _MB,
      }
      gpu_row, gpu_j = self._gpus.sample()
      row.update(gpu_row)
      rapl_j = self._rapl.read()
      if rapl_j is not None:
        row["rapl_energy_j"] = rapl_j
      # Each source's last reading: a source that misses one read keeps its joules in the sum.
      self._joules.update({k: j for k, j in (("rapl", rapl_j), ("nvml", gpu_j)) if j is not None})
      if self._joules:
        energy = sum(self._joules.values())
        if self._energy_j is not None and dt > 0:
          row["power_w"] = (energy - self._energy_j) / dt
        row["energy_j"] = self._energy_j = energy
      elif self.nominal_power_w > 0:
        row["energy_estimate_j"] = self.nominal_power_w * (now - self._t0)
      self._n += 1
      self._t_last = now
      self._peak_rss = max(self._peak_rss, row["rss_mb"])
      self._peak_host_used = max(self._peak_host_used, row["host_mem_used_mb"])
      self._cpu_sum += row["process_cpu_pct"]
      return row

  def close(self) -> dict:
    """Stops the thread, takes and writes a last sample, and returns the run's totals."""
    if self._totals is not None:
      return self._totals
    stuck = False
    if self._thread is not None:
      self._stop.set()
      self._thread.join(timeout=60.0)
      stuck = self._thread.is_alive()
      if stuck:  # inside write(): a last row now would race it
        logging.warning("monitor: the sampling thread is still in write() after 60 s; "
                        "no last sample")
    if self.interval_s > 0 and not stuck:
      self._emit()
    self._totals = self._summary()
    if self._gpus is not None:
      self._gpus.close()
    return self._totals

  def _summary(self) -> dict:
    wall = self._t_last - self._t0
    examples = self._examples
    out = {
        "process": self.process_index, "samples": self._n, "interval_s": self.interval_s,
        "wall_s": wall, "steps": self._steps, "examples": examples,
        "examples_per_s_mean": examples / wall if wall > 0 else None,
        "step_time_s_mean": wall / self._steps if self._steps else None,
        "process_cpu_pct_mean": self._cpu_sum / self._n if self._n else None,
        "peak_rss_mb": self._peak_rss if self._n else None,
        "peak_host_memory_used_mb": self._peak_host_used if self._n else None,
        "accelerators": list(self._gpus.names) if self._gpus else [],
    }
    return {**out, **self._energy(wall, examples)}

  def _energy(self, wall: float, examples: int) -> dict:
    """summary.json's energy keys: energy measured, or an estimate labelled as one, or why not."""
    if self._rapl is None:  # never sampled: the monitor was off
      return {"energy_j": None, "energy_per_example_j": None, "energy_source": None,
              "energy": "not measured: monitor off (monitor.interval_s = 0)",
              "energy_detail": {}}
    rapl, gpus = self._rapl, self._gpus
    detail = {"rapl": rapl.reason or f"measured ({', '.join(rapl.zones)}; the whole host)",
              "nvml": gpus.reason or f"measured ({', '.join(gpus.names)})"}
    sources = [s for s in ("rapl", "nvml") if s in self._joules]
    per_example = lambda j: j / examples if examples and j is not None else None
    if sources and self._energy_j is not None:
      line = (f"measured ({' + '.join(s.upper() for s in sources)}): {self._energy_j:.1f} J over "
              f"{wall:.1f} s")
      if examples:
        line += f", {self._energy_j / examples:.4g} J per example"
      if "rapl" in sources and rapl.reason:  # it stopped reading part way: the joules are short
        line += f" (until {rapl.reason})"
      return {"energy_j": self._energy_j, "energy_per_example_j": per_example(self._energy_j),
              "energy_source": "+".join(sources), "energy": line, "energy_detail": detail}
    if rapl.absent and gpus.absent:
      why = NOT_MEASURED_ANYWHERE
    else:
      why = "; ".join([rapl.reason if not rapl.absent else "no RAPL on this machine",
                       gpus.reason if not gpus.absent else "no NVML on this machine"])
    if self.nominal_power_w > 0:
      joules = self.nominal_power_w * wall
      label = f"estimate: nominal {self.nominal_power_w:g} W"
      return {"energy_j": joules, "energy_per_example_j": per_example(joules),
              "energy_source": label,
              "energy": f"{label} x {wall:.1f} s = {joules:.1f} J (not measured: {why})",
              "energy_detail": detail}
    return {"energy_j": None, "energy_per_example_j": None, "energy_source": None,
            "energy": f"not measured: {why}", "energy_detail": detail}
