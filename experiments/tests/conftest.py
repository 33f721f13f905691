"""Test setup for the experiments' own tests, as tests/conftest.py sets it for the library's:
8 fake CPU devices, set before jax is imported anywhere."""

import os

_FAKE_DEVICES = "--xla_force_host_platform_device_count=8"
if _FAKE_DEVICES not in os.environ.get("XLA_FLAGS", ""):   # tests/conftest.py may have set it
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FAKE_DEVICES).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
