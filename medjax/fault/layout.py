"""How many worker processes a host runs, and how many devices each: chosen per machine.

`config.fault.workers_per_host = 0` (the default) means "auto", resolved here from what the host
has, without importing jax (the launcher and the agents must stay light):

- accelerators (NVIDIA GPUs, TPU chips): one worker process per accelerator, one device each,
  the layout jax.distributed and the collectives are built for;
- CPU only: one worker process whose single JAX device runs XLA on all the cores, as an
  unsupervised run does. Two processes of one device each would exchange every gradient over
  gloo and split the cores between two XLA thread pools; measured on 2 cores, the quickstart
  trained 2.5x longer that way (issue 12). One process also lets a restart take a warm standby
  (`medjax.fault.agent`).

An explicit `workers_per_host` >= 1 is used as given (tests of the multi-process paths set 2).
The local launcher resolves the layout once and saves it in <workdir>/config.json, which the
coordinator, the agents and the workers read; a coordinator or agent started on its own with
--config resolves it on its machine (on a cluster of one kind of node, the same answer).
"""

from __future__ import annotations

import dataclasses
import glob
import os

from medjax.data import pools


@dataclasses.dataclass(frozen=True)
class Layout:
  workers_per_host: int
  devices_per_worker: int
  platform: str          # 'cpu', 'gpu' or 'tpu': what the workers compute on
  reason: str            # one line for the log: why this layout


def _visible(env_value: str | None, found: int) -> int:
  """Devices left visible by a CUDA_VISIBLE_DEVICES-style variable (None: all `found`)."""
  if env_value is None:
    return found
  names = [v for v in env_value.split(",") if v.strip() and v.strip() != "-1"]
  return min(len(names), found) if found else len(names)


def accelerators(environ=None) -> tuple[str, int]:
  """('gpu' | 'tpu' | 'cpu', count) on this machine, from the OS (no jax import).

  JAX_PLATFORMS=cpu (how tests and CPU runs pin the platform) means CPU whatever is present.
  """
  environ = os.environ if environ is None else environ
  platforms = environ.get("JAX_PLATFORMS", "").lower()
  if platforms and "cpu" in platforms.split(",")[0]:
    return "cpu", 0
  # The driver lists its GPUs under /proc; some containers show only the device nodes.
  gpus = (len(glob.glob("/proc/driver/nvidia/gpus/*"))
          or len(glob.glob("/dev/nvidia[0-9]*")))
  gpus = _visible(environ.get("CUDA_VISIBLE_DEVICES"), gpus) if gpus else 0
  if gpus and (not platforms or "cuda" in platforms or "gpu" in platforms):
    return "gpu", gpus
  tpus = len(glob.glob("/dev/accel*")) or len(glob.glob("/dev/vfio/[0-9]*"))
  if tpus and (not platforms or "tpu" in platforms):
    return "tpu", tpus
  return "cpu", 0


def resolve(fault_config, environ=None) -> Layout:
  """The layout `fault_config` asks for on this machine (see the module docstring)."""
  wph, dpw = int(fault_config.workers_per_host), int(fault_config.devices_per_worker)
  platform, count = accelerators(environ)
  if wph >= 1:
    return Layout(wph, dpw, platform, f"config.fault.workers_per_host={wph} (explicit)")
  if platform == "gpu":
    return Layout(count, 1, platform, f"auto: {count} GPUs, one worker process each")
  if platform == "tpu":
    # JAX drives a host's TPU chips from one process.
    return Layout(1, count, platform, f"auto: {count} TPU chips, one worker process")
  return Layout(1, dpw, platform, f"auto: CPU only, one worker process of {dpw} device(s) "
                                  f"using the {pools.cores()} cores")


# Platforms where a spare standby can build the next generation while the current one trains
# (`standbys.warm_key`): a CPU host, and a GPU shared with the running worker; a TPU chip opens in
# one process at a time.
PREPARE_AHEAD_ON = ("cpu", "gpu")


def local_device_ids(process_id: int, workers_per_host: int, devices_per_worker: int,
                     environ=None) -> list[int] | None:
  """The accelerators (indices among those visible) that worker `process_id` drives when a
  host runs several: on GPU, local worker i takes devices [i * d, (i + 1) * d), so that the
  workers of one host do not all claim every GPU (jax.distributed's default). None elsewhere:
  CPU workers have their own fake devices, and a TPU host runs one worker."""
  if accelerators(environ)[0] != "gpu" or workers_per_host <= 1:
    return None
  local = local_index(process_id, workers_per_host)
  return list(range(local * devices_per_worker, (local + 1) * devices_per_worker))


def local_index(process_id: int, workers_per_host: int) -> int:
  """Worker `process_id`'s place among its host's workers: the agents number a host's workers
  consecutively (host i runs processes i * workers_per_host ...)."""
  return process_id % workers_per_host


def resolve_config(config, environ=None) -> Layout:
  """Writes the resolved layout into `config.fault` (a no-op when it is explicit)."""
  layout = resolve(config.fault, environ)
  config.fault.workers_per_host = layout.workers_per_host
  config.fault.devices_per_worker = layout.devices_per_worker
  return layout


def resolve_replicas(config, layout: Layout) -> None:
  """'local' mode's replica count, 0 (one per data-parallel device), fixed in `config` for the
  run: a later generation on fewer devices (a lost host) keeps the replicas its checkpoints
  hold, each device then updating several."""
  optim = config.get("optim")
  if optim is None or optim.get("mode") != "local" or optim.get("replicas", 0) > 0:
    return
  hosts = config.fault.hosts or config.fault.local_hosts
  devices = hosts * layout.workers_per_host * layout.devices_per_worker
  data = config.mesh.data if config.mesh.data > 0 else devices // max(1, config.mesh.fsdp)
  optim.replicas = max(1, data)


def resolved(fault_config, environ=None):
  """(a copy of `fault_config` with the layout resolved, the Layout)."""
  fault = fault_config.copy_and_resolve_references()
  layout = resolve(fault, environ)
  fault.workers_per_host = layout.workers_per_host
  fault.devices_per_worker = layout.devices_per_worker
  return fault, layout
