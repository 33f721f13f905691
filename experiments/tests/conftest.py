"""Test setup for the experiments' own tests, as tests/conftest.py sets it for the library's:
8 fake CPU devices and XLA's backend optimisation level 0, set before jax is imported anywhere."""

import os

# tests/conftest.py may have set them; why level 0: there.
for _flag in ("--xla_force_host_platform_device_count=8", "--xla_backend_optimization_level=0"):
  if _flag not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
