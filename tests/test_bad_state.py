"""Damaged run state left on disk: each kind has a rule (DESIGN.md, "Bad input and damaged
state"); the checkpoint rules are in test_train_parts.py, the real-process ones in test_fault.py."""

import json
import os
import subprocess
import sys

import pytest

from configs import quickstart
from medjax import jsonl
from medjax import lineage
from medjax import paths
from medjax.fault import coordinator
from medjax.fault import run_state

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("garbage", [b"\x00\x01 not json", b"[]", b'{"status": "exploded"}',
                                     b'{"failures": [{"kind": 1, "nonsense": true}]}'])
def test_a_garbled_coordinator_state_starts_fresh_after_the_newest_generation(tmp_path, garbage):
  config = quickstart.get_config("tiny")
  run = paths.RunPaths(str(tmp_path), config)
  os.makedirs(run.generations)
  for g in (1, 2, 3):
    with open(run.generation_spec(g), "w") as f:
      json.dump({"generation": g}, f)
  store = lineage.LineageStore(run.lineage_store)
  store.put_state("coordinator", {"status": "running"})
  with open(os.path.join(run.lineage_store, "state", "coordinator"), "wb") as f:
    f.write(garbage)
  c = coordinator.Coordinator(config, str(tmp_path), token="t")
  assert c.policy.state.status == run_state.Status.WAITING
  assert c.policy.state.generation == 3          # the next one started is 4: no spec reused
  events = jsonl.read(run.events)
  assert [e["event"] for e in events] == ["coordinator_state_damaged"]
  assert events[0]["generation"] == 3
  # The fresh state was saved: a second restart reads it without complaint.
  again = coordinator.Coordinator(config, str(tmp_path), token="t")
  assert again.policy.state.generation == 3 and again.policy.restored


def test_a_damaged_salt_file_stops_ingest_with_one_line(tmp_path):
  from medjax import errors  # pylint: disable=import-outside-toplevel
  from medjax.data import ingest  # pylint: disable=import-outside-toplevel
  path = str(tmp_path / "secrets" / "id_salt")
  salt = ingest.load_or_create_salt(path)
  assert len(salt) == 32 and ingest.load_or_create_salt(path) == salt
  with open(path, "wb") as f:
    f.write(salt[:5])              # a disk that filled up mid-write
  with pytest.raises(errors.InputError) as e:
    ingest.load_or_create_salt(path)
  assert str(e.value) == (
      f"{path}: the salt file is damaged (5 bytes, expected 32); restore it from a backup, or "
      "delete it and ingest again (record ids change: start a new --workdir, as this run's "
      "checkpoints and caches belong to the old ids)")


_UNRAISABLE = """
import sys
from medjax import runlog
runlog.setup(sys.argv[1], "log")

class Closing:
  def __del__(self):   # what an unfinished coroutine or a callback on a closed loop leaves
    raise RuntimeError("Event loop is closed")

Closing()
print("error: the run's one line", file=sys.stderr)
"""


@pytest.mark.parametrize("debug", [False, True])
def test_an_exception_python_can_only_report_goes_to_the_log_not_after_the_error_line(tmp_path,
                                                                                      debug):
  # After a damaged checkpoint was skipped, Orbax's and TensorStore's leftovers printed a
  # traceback after the one-line error (the bad-inputs battery's "every checkpoint damaged").
  env = {**os.environ, "MEDJAX_DEBUG": "1" if debug else "0"}
  done = subprocess.run([sys.executable, "-c", _UNRAISABLE, str(tmp_path)], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=60, check=True)
  log = (tmp_path / "log.txt").read_text()
  if debug:   # --debug keeps Python's own report
    assert "RuntimeError: Event loop is closed" in done.stderr
  else:
    assert done.stderr.strip() == "error: the run's one line"
    assert "exception ignored" in log and "RuntimeError: Event loop is closed" in log
