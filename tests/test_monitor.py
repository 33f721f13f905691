"""The monitor: samples, throughput accounting, the thread, energy readers (fake RAPL sysfs and a
fake pynvml), the summary's energy line, and the plot."""

import logging
import os
import threading
import time
import types

import ml_collections
import pytest

from medjax import monitor
from medjax import monitor_plots

HOST_FIELDS = ("time", "process", "interval_s", "examples_per_s", "steps_per_s", "step_time_s",
               "process_cpu_pct", "rss_mb", "host_cpu_pct", "host_mem_used_mb",
               "host_mem_available_mb")


def _config(interval_s=5.0, nominal_power_w=0.0):
  return ml_collections.ConfigDict({"interval_s": interval_s, "nominal_power_w": nominal_power_w})


class FakeClock:

  def __init__(self, t=1000.0):
    self.t = t

  def __call__(self):
    return self.t


class NVMLError(Exception):

  def __init__(self, value):
    super().__init__(f"fake NVML error {value}")
    self.value = value


def fake_nvml(*, init_error=None, energy=True, gpus=1):
  """A pynvml stand-in: `state['energy_mj']` is each GPU's counter, moved by the test."""
  state = {"energy_mj": [5_000] * gpus, "shutdown": False}

  def init():
    if init_error is not None:
      raise NVMLError(init_error)

  def get_energy(h):
    if not energy:
      raise NVMLError(3)  # NVML_ERROR_NOT_SUPPORTED
    return state["energy_mj"][h]

  def shutdown():
    state["shutdown"] = True

  module = types.SimpleNamespace(
      NVMLError=NVMLError, NVML_ERROR_LIBRARY_NOT_FOUND=12, NVML_ERROR_DRIVER_NOT_LOADED=9,
      nvmlInit=init, nvmlShutdown=shutdown,
      nvmlDeviceGetCount=lambda: gpus,
      nvmlDeviceGetHandleByIndex=lambda i: i,
      nvmlDeviceGetName=lambda h: b"Fake GPU",
      nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=87, memory=40),
      nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=2 << 30, total=16 << 30),
      nvmlDeviceGetPowerUsage=lambda h: 250_000,  # mW
      nvmlDeviceGetTotalEnergyConsumption=get_energy)
  return module, state


NO_NVML = fake_nvml(init_error=12)[0]  # the library is missing, as on this CPU machine


def fake_rapl(root, zones):
  """zones: {dir name: (name, energy_uj, max_energy_range_uj)}."""
  os.makedirs(root, exist_ok=True)
  for d, (name, energy, wrap) in zones.items():
    os.makedirs(os.path.join(root, d), exist_ok=True)
    for f, v in (("name", name), ("energy_uj", energy), ("max_energy_range_uj", wrap)):
      with open(os.path.join(root, d, f), "w") as fh:
        fh.write(f"{v}\n")


def set_energy(root, zone, energy_uj):
  with open(os.path.join(root, zone, "energy_uj"), "w") as fh:
    fh.write(f"{energy_uj}\n")


def test_sample_has_the_host_fields_and_no_accelerator_fields_without_nvml(tmp_path):
  rows = []
  mon = monitor.Monitor(_config(), process_index=3, write=rows.append,
                        rapl_root=str(tmp_path / "none"), nvml=NO_NVML)
  row = mon.sample()
  for k in HOST_FIELDS:
    assert k in row, k
  assert row["process"] == 3.0
  assert row["rss_mb"] > 1 and row["host_mem_available_mb"] > 1
  assert not any(k.startswith("gpu") or "energy" in k or "power" in k for k in row)
  assert all(v is None or isinstance(v, float) for v in row.values())
  assert rows == []  # sample() returns; only the thread and close() write


def test_step_done_gives_examples_per_s_over_each_interval(tmp_path):
  clock = FakeClock()
  mon = monitor.Monitor(_config(), process_index=0, write=lambda r: None, clock=clock,
                        rapl_root=str(tmp_path), nvml=NO_NVML)
  for _ in range(10):
    mon.step_done(1, 32)
  clock.t += 2.0
  row = mon.sample()
  assert row["interval_s"] == pytest.approx(2.0)
  assert row["examples_per_s"] == pytest.approx(160.0)
  assert row["steps_per_s"] == pytest.approx(5.0)
  assert row["step_time_s"] == pytest.approx(0.2)
  clock.t += 4.0  # no steps: zero throughput, no step time
  row = mon.sample()
  assert row["examples_per_s"] == 0.0 and row["step_time_s"] is None
  mon.step_done(2, 64)
  clock.t += 1.0
  assert mon.sample()["examples_per_s"] == pytest.approx(64.0)
  totals = mon.close()
  assert totals["samples"] == 4 and totals["examples"] == 384 and totals["steps"] == 12
  assert totals["examples_per_s_mean"] == pytest.approx(384 / 7.0)


def test_interval_zero_starts_no_thread_and_says_off(tmp_path):
  rows = []
  before = threading.active_count()
  mon = monitor.Monitor(_config(interval_s=0), process_index=0, write=rows.append,
                        rapl_root=str(tmp_path), nvml=NO_NVML)
  mon.start()
  mon.step_done(1, 8)
  assert threading.active_count() == before
  totals = mon.close()
  assert rows == [] and totals["samples"] == 0
  assert totals["energy"] == "not measured: monitor off (monitor.interval_s = 0)"


def test_thread_writes_rows_and_close_joins_it(tmp_path):
  rows = []
  mon = monitor.Monitor(_config(interval_s=0.02), process_index=0, write=rows.append,
                        rapl_root=str(tmp_path), nvml=NO_NVML)
  mon.start()
  thread = next(t for t in threading.enumerate() if t.name == "monitor-0")
  assert thread.daemon
  deadline = time.monotonic() + 20
  while len(rows) < 2 and time.monotonic() < deadline:
    mon.step_done(1, 4)
    time.sleep(0.01)
  totals = mon.close()
  assert not thread.is_alive()
  assert len(rows) >= 3  # two from the thread, the last from close()
  assert totals["samples"] == len(rows)
  assert mon.close() is totals  # closing twice changes nothing
  assert len(rows) == totals["samples"]


def test_a_failing_writer_is_logged_once_and_does_not_stop_sampling(tmp_path, caplog):
  calls = []

  def write(row):
    calls.append(row)
    raise OSError("disk full")

  mon = monitor.Monitor(_config(interval_s=0.01), process_index=0, write=write,
                        rapl_root=str(tmp_path), nvml=NO_NVML)
  with caplog.at_level(logging.WARNING):
    mon.start()
    deadline = time.monotonic() + 20
    while len(calls) < 3 and time.monotonic() < deadline:
      time.sleep(0.01)
    mon.close()
  assert len(calls) >= 3
  warnings = [r for r in caplog.records if "monitor" in r.getMessage()]
  assert len(warnings) == 1 and warnings[0].exc_info is None


def test_rapl_sums_packages_and_dram_across_a_wraparound(tmp_path):
  root = str(tmp_path / "powercap")
  fake_rapl(root, {"intel-rapl:0": ("package-0", 1_000_000, 10_000_000),
                   "intel-rapl:0:0": ("core", 500, 10_000_000),       # inside the package
                   "intel-rapl:0:2": ("dram", 9_000_000, 10_000_000),
                   "intel-rapl:1": ("psys", 7, 10_000_000)})         # overlaps everything
  clock = FakeClock()
  mon = monitor.Monitor(_config(), process_index=0, write=lambda r: None, clock=clock,
                        rapl_root=root, nvml=NO_NVML)
  mon.start()
  first = mon.sample()
  assert first["energy_j"] == 0.0
  set_energy(root, "intel-rapl:0", 3_000_000)    # +2 J
  set_energy(root, "intel-rapl:0:2", 1_000_000)  # wrapped: +2 J
  set_energy(root, "intel-rapl:0:0", 9_999_999)  # not counted
  set_energy(root, "intel-rapl:1", 9_999_999)    # not counted
  mon.step_done(4, 100)
  clock.t += 2.0
  row = mon.sample()
  assert row["rapl_energy_j"] == pytest.approx(4.0)
  assert row["energy_j"] == pytest.approx(4.0)
  assert row["power_w"] == pytest.approx(2.0)
  set_energy(root, "intel-rapl:0", 4_000_000)    # +1 J more, read by close()'s last sample
  totals = mon.close()
  assert totals["energy_source"] == "rapl"
  assert totals["energy_j"] == pytest.approx(5.0)
  assert totals["energy_per_example_j"] == pytest.approx(0.05)
  assert totals["energy"].startswith("measured (RAPL): 5.0 J")
  assert "package-0, dram" in totals["energy_detail"]["rapl"]


def test_rapl_without_permission_says_so_and_falls_back(tmp_path, monkeypatch):
  root = str(tmp_path / "powercap")
  fake_rapl(root, {"intel-rapl:0": ("package-0", 1, 100)})
  read = monitor._read_int

  def denied(path):
    if path.endswith("energy_uj"):
      raise PermissionError(13, "Permission denied", path)
    return read(path)

  monkeypatch.setattr(monitor, "_read_int", denied)
  clock = FakeClock()
  mon = monitor.Monitor(_config(nominal_power_w=100.0), process_index=0, write=lambda r: None,
                        clock=clock, rapl_root=root, nvml=NO_NVML)
  mon.start()
  mon.step_done(1, 10)
  clock.t += 10.0
  row = mon.sample()
  assert "energy_j" not in row and row["energy_estimate_j"] == pytest.approx(1000.0)
  totals = mon.close()
  assert totals["energy_source"] == "estimate: nominal 100 W"
  assert totals["energy_j"] == pytest.approx(1000.0)
  assert totals["energy_per_example_j"] == pytest.approx(100.0)
  assert totals["energy"].startswith("estimate: nominal 100 W x 10.0 s = 1000.0 J (not measured: ")
  assert "permission denied" in totals["energy"]
  assert "intel-rapl:0/energy_uj" in totals["energy"]
  assert "no NVML on this machine" in totals["energy"]


def test_nvml_gives_gpu_fields_and_energy(tmp_path, monkeypatch):
  monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
  nvml, state = fake_nvml(gpus=2)
  clock = FakeClock()
  mon = monitor.Monitor(_config(), process_index=0, write=lambda r: None, clock=clock,
                        rapl_root=str(tmp_path / "none"), nvml=nvml)
  mon.start()
  state["energy_mj"] = [15_000, 10_000]  # +10 J and +5 J
  mon.step_done(3, 30)
  clock.t += 5.0
  row = mon.sample()
  assert row["gpu0_util_pct"] == 87.0 and row["gpu1_power_w"] == 250.0
  assert row["gpu0_mem_used_mb"] == 2048.0 and row["gpu0_mem_total_mb"] == 16384.0
  assert row["gpu0_energy_j"] == pytest.approx(10.0) and row["energy_j"] == pytest.approx(15.0)
  assert "rapl_energy_j" not in row
  totals = mon.close()
  assert totals["energy_source"] == "nvml" and totals["energy_j"] == pytest.approx(15.0)
  assert totals["energy_per_example_j"] == pytest.approx(0.5)
  assert totals["accelerators"] == ["Fake GPU", "Fake GPU"]
  assert state["shutdown"]


def test_nvml_follows_cuda_visible_devices(tmp_path, monkeypatch):
  monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
  nvml, state = fake_nvml(gpus=2)
  mon = monitor.Monitor(_config(), process_index=0, write=lambda r: None,
                        rapl_root=str(tmp_path), nvml=nvml)
  mon.sample()
  state["energy_mj"] = [99_000, 7_000]  # GPU 0 belongs to another process
  row = mon.sample()
  assert "gpu1_util_pct" not in row and row["energy_j"] == pytest.approx(2.0)


def test_rapl_and_nvml_add_up(tmp_path, monkeypatch):
  monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
  root = str(tmp_path / "powercap")
  fake_rapl(root, {"intel-rapl:0": ("package-0", 0, 10**9)})
  nvml, state = fake_nvml()
  mon = monitor.Monitor(_config(), process_index=0, write=lambda r: None,
                        rapl_root=root, nvml=nvml)
  mon.start()
  set_energy(root, "intel-rapl:0", 3_000_000)
  state["energy_mj"] = [6_000]
  totals = mon.close()
  assert totals["energy_source"] == "rapl+nvml" and totals["energy_j"] == pytest.approx(4.0)


def test_gpu_without_energy_counter_is_named(tmp_path, monkeypatch):
  monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
  nvml, _ = fake_nvml(energy=False)
  mon = monitor.Monitor(_config(), process_index=0, write=lambda r: None,
                        rapl_root=str(tmp_path / "none"), nvml=nvml)
  mon.start()
  row = mon.sample()
  assert row["gpu0_power_w"] == 250.0 and "energy_j" not in row
  totals = mon.close()
  assert totals["energy_j"] is None and totals["energy_source"] is None
  assert totals["energy"].startswith("not measured: no RAPL on this machine; NVML: no energy "
                                     "counter on Fake GPU")


def test_nothing_measures_energy_here_says_exactly_that(tmp_path, caplog):
  with caplog.at_level(logging.DEBUG):
    mon = monitor.Monitor(_config(), process_index=0, write=lambda r: None,
                          rapl_root=str(tmp_path / "powercap"), nvml=NO_NVML)
    mon.start()
    mon.step_done(1, 8)
    totals = mon.close()
  assert totals["energy"] == "not measured: no RAPL or NVML on this machine"
  assert totals["energy_j"] is None and totals["energy_per_example_j"] is None
  assert totals["energy_source"] is None and totals["accelerators"] == []
  assert totals["energy_detail"]["rapl"].startswith("no ")
  assert totals["energy_detail"]["nvml"] == "no NVML library (no NVIDIA driver installed)"
  assert not [r for r in caplog.records if r.exc_info]


def test_this_machine_never_raises(tmp_path):
  """The real readers (real sysfs, real pynvml): whatever is here, sampling and closing work."""
  rows = []
  mon = monitor.Monitor(_config(interval_s=3600), process_index=0, write=rows.append)
  mon.start()
  mon.step_done(1, 8)
  totals = mon.close()
  assert len(rows) == 1 and totals["samples"] == 1
  assert totals["energy"].startswith(("measured", "not measured"))


def _monitor_rows():
  rows, t = [], 1000.0
  # generation 1 reaches step 48 and dies at 50; generation 2 restores step 40 and goes on.
  for i, step in enumerate([8, 16, 24, 32, 40, 48]):
    rows.append({"kind": "monitor", "step": step, "time": t, "steps": 8.0 * (i + 1),
                 "interval_s": 5.0, "process": 0.0, "examples_per_s": 100.0 + i,
                 "rss_mb": 900.0 + i, "host_mem_used_mb": 4000.0})
    t += 5.0
  t += 20.0
  for i, step in enumerate([44, 52, 60]):
    rows.append({"kind": "monitor", "step": step, "time": t, "steps": 4.0 + 8 * i,
                 "interval_s": 5.0, "process": 0.0, "examples_per_s": 90.0 + i, "rss_mb": 950.0,
                 "host_mem_used_mb": 4100.0, "gpu0_mem_used_mb": 2048.0, "power_w": 120.0})
    t += 5.0
  rows.append({"kind": "train", "step": 60, "loss": 1.0})  # not a monitor row
  return rows


def test_step_marks_are_placed_at_the_restart():
  rows = _monitor_rows()
  marks = [{"kind": "failure", "step": 50}, {"kind": "recovered", "step": 41},
           {"kind": "failure", "step": 55, "time": 1234.0}, {"kind": "failure", "step": 70}]
  assert monitor_plots.mark_times(rows, marks) == [1025.0, 1050.0, 1234.0, None]


def test_a_restart_that_keeps_the_step_is_found_from_the_time_gap():
  """A worker that died right after a checkpoint resumes at its own step: only the new monitor's
  first row, further from the last one than its interval, shows the restart."""
  rows = [{"kind": "monitor", "time": 100.0 + 5 * i, "interval_s": 5.0, "step": 10 * i,
           "process": 0.0} for i in range(4)]
  rows.append({"kind": "monitor", "time": 160.0, "interval_s": 5.0, "step": 40, "process": 0.0})
  marks = [{"kind": "failure", "step": 30}, {"kind": "recovered", "step": 31}]
  assert monitor_plots.mark_times(rows, marks) == [115.0, 160.0]


@pytest.mark.parametrize("with_marks", [False, True])
def test_plot_writes_a_png(tmp_path, with_marks):
  marks = [{"kind": "failure", "step": 50}, {"kind": "recovered", "step": 41}] if with_marks else []
  path = str(tmp_path / "monitor.png")
  monitor_plots.plot_monitor(_monitor_rows(), marks, path)
  with open(path, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_plot_without_rows_still_writes_a_png(tmp_path):
  path = str(tmp_path / "empty.png")
  monitor_plots.plot_monitor([], [{"kind": "failure", "step": 3}], path)
  assert os.path.getsize(path) > 0
