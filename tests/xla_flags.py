"""The XLA flags every test process sets before jax is imported (tests/conftest.py and
experiments/tests/conftest.py): 8 fake CPU devices, and XLA's backend (LLVM) optimisation level 0.

The suite compiles a few hundred small programs whose running time is next to nothing; at level 0
they compile in about half the time (the tiny config's first 2-process run: 58 s of CPU against
89; test_model.py with test_tabular.py: 129 s against 183) and run about as fast (the same run
from a warm cache: 30.5 s of CPU against 30.3). The runs the suite starts inherit it
(`runs.env`); users' runs keep XLA's default. Under pytest-xdist the workers inherit the
controller's flags. Imports nothing of medjax or jax."""

import os

FLAGS = ("--xla_force_host_platform_device_count=8", "--xla_backend_optimization_level=0")


def set_in_environment() -> None:
  """Adds each of FLAGS that XLA_FLAGS lacks (another conftest may have set them)."""
  for flag in FLAGS:
    if flag not in os.environ.get("XLA_FLAGS", ""):
      os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()
