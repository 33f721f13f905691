"""JAX's recoverability on GPU (issue 12): the survivors of a crashed process go on without a
relaunch (experiments/live_devices_probe.py). Runs only where two or more NVIDIA GPUs and JAX's
CUDA plugin are present; this CPU machine has neither. On CPU the same probe shows the
collective in flight blocking for gloo's 30 s timeout before the survivors can go on
(experiments/results/live_devices.json), so medjax relaunches from the newest committed
checkpoint there instead."""

import importlib.util

import pytest

from experiments import live_devices_probe
from medjax.fault import layout

# An empty environment: conftest pins JAX_PLATFORMS=cpu, and the question is the hardware.
_PLATFORM, _COUNT = layout.accelerators(environ={})
_CUDA = any(importlib.util.find_spec(name) is not None
            for name in ("jax_cuda12_plugin", "jax_cuda13_plugin"))

pytestmark = pytest.mark.skipif(
    _PLATFORM != "gpu" or _COUNT < 2 or not _CUDA,
    reason="needs 2+ NVIDIA GPUs and jax[cuda] (found: "
           f"{_PLATFORM} x {_COUNT}, CUDA plugin {'present' if _CUDA else 'absent'})")


def test_survivors_of_a_crash_go_on_without_a_relaunch_on_gpu():
  result = live_devices_probe.probe(processes=min(_COUNT, 4), platform="gpu")
  assert result["went_on"], result
  # NCCL's communicators are aborted when a peer fails: no 30 s transport timeout as on CPU.
  assert all(s["survived_s"] < 10.0 for s in result["survivors"]), result
