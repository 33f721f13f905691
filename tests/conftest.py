"""Test setup: 8 fake CPU devices and XLA's backend optimisation level 0, set before jax is
imported anywhere; one JAX compilation cache for the session's runs."""

import os
import shutil
import tempfile

from tests import xla_flags  # why level 0: there

xla_flags.set_in_environment()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Every run the suite starts (launch.py, workers, in-process runs) shares one compilation cache,
# fresh per session (`paths.compilation_cache_or`): a run compiles only programs no run compiled
# before (the tiny config's first run spent 14 s compiling; the suite in a fresh clone on 2 cores
# took 1,931 s against 2,002). A test that sets mesh.compilation_cache_dir keeps its own.
# Under pytest-xdist the workers inherit the controller's environment and share its cache; the
# process that made the cache removes it when the session ends.
_SHARED = "MEDJAX_TESTS_JAX_CACHE"
_MADE_HERE = _SHARED not in os.environ
if _MADE_HERE:
  os.environ[_SHARED] = tempfile.mkdtemp(prefix="medjax-tests-jax-cache-")
_COMPILATION_CACHE = os.environ[_SHARED]
os.environ["JAX_COMPILATION_CACHE_DIR"] = _COMPILATION_CACHE

import pytest  # pylint: disable=wrong-import-position


def pytest_xdist_auto_num_workers(config):  # pylint: disable=unused-argument
  """`-n auto`: one worker per core the process may use, at most 4 (past that the longest file,
  test_fault.py at ~500 s alone, sets the time). On the 2-core development machine 2 workers ran
  the suite in 22 min 15 s against 29 min 37 s in one process."""
  return max(1, min(4, len(os.sched_getaffinity(0))))


def pytest_unconfigure(config):  # pylint: disable=unused-argument
  if _MADE_HERE:
    shutil.rmtree(_COMPILATION_CACHE, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def _no_snapshots_left_in_host_memory(tmp_path_factory):
  """A run that is killed and never resumed leaves its host-local snapshots in
  /dev/shm/medjax-snapshots-<uid>/, as a user's would; many tests end runs that way. After the
  session, the snapshot folders of the suite's own workdirs (each folder's name starts with its
  workdir's tag, `snapshots.workdir_tag`) are removed, and nothing else: another run of the same
  user on this machine keeps its own."""
  yield
  from medjax.checkpoint import snapshots  # pylint: disable=import-outside-toplevel  (after XLA_FLAGS)
  base = str(tmp_path_factory.getbasetemp())
  parent = snapshots.user_root()
  if not os.path.isdir(parent):
    return
  ours = set()
  for directory, subdirectories, _ in os.walk(base):
    ours.add(snapshots.workdir_tag(directory))
    if directory.count(os.sep) - base.count(os.sep) >= 4:
      subdirectories.clear()   # workdirs sit a few levels under the base
  for name in os.listdir(parent):
    if name.split("-")[0] in ours:
      shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
