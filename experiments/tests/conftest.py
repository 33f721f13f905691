"""Test setup for the experiments' own tests, as tests/conftest.py sets it for the library's:
8 fake CPU devices and XLA's backend optimisation level 0, set before jax is imported anywhere."""

import os

from tests import xla_flags  # why level 0: there

xla_flags.set_in_environment()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
