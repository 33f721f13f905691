"""Damaged run state left on disk: each kind has a rule (DESIGN.md, "Bad input and damaged
state"); the checkpoint rules are in test_train_parts.py, the real-process ones in test_fault.py.

A file of the right syntax and the wrong shape (valid JSON with a field of another type, out of
its range, or missing) falls under its file's rule as a garbled one does (medjax/schema.py)."""

import dataclasses
import glob
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest

from configs import quickstart
from medjax import errors
from medjax import jsonl
from medjax import lineage
from medjax import paths
from medjax.checkpoint import restore
from medjax.checkpoint import snapshots
from medjax.data import ingested
from medjax.fault import coordinator
from medjax.fault import run_state
from tests import runs

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


# -- files of the right syntax and the wrong shape, in real runs' workdirs ----------------------
#
# Each damaged file is written into a copy of a real finished run's workdir and read as a rerun
# reads it: in-process for the many variants of a class (a wrong field, a wrong type, a value
# out of range), then through real processes (launch.py, its coordinator, agents and workers)
# for the rule itself: its exit code, the one line on stderr, the events and the recovery.

@pytest.fixture(scope="module")
def base(tmp_path_factory):
  """The folder of the module's finished runs (the compilation cache is the session's)."""
  return tmp_path_factory.mktemp("bad_state")


def _finished_run(base, name: str, *overrides: str) -> str:
  workdir = str(base / name)
  assert runs.run(workdir, *overrides, timeout=300) == 0, runs.tail(workdir)
  return workdir


@pytest.fixture(scope="module")
def supervised(base):
  """A finished tiny run: launcher, coordinator, one agent, one worker."""
  return _finished_run(base, "supervised")


@pytest.fixture(scope="module")
def unsupervised(base):
  """A finished tiny run in one process."""
  return _finished_run(base, "unsupervised", "--config.fault.supervised=False")


def _copy(run: str, to) -> str:
  """A copy of a finished run to resume (its summary left out, so that one is the rerun's)."""
  to = str(to)
  shutil.copytree(run, to, symlinks=True)
  for name in ("summary.json", "launcher.log"):   # (ingest/summary.json stays: it is reused)
    os.remove(os.path.join(to, name))
  return to


def _resume(work: str, *overrides: str, supervised_run: bool = False) -> int:
  """The run again, one more epoch, as a user reruns it."""
  more = ["--config.optim.epochs=3"] + ([] if supervised_run else
                                        ["--config.fault.supervised=False"])
  return runs.run(work, *more, *overrides, timeout=300)


def _lines(work: str, name: str = "launcher.log") -> list[str]:
  with open(os.path.join(work, name)) as f:
    return [line for line in f.read().splitlines() if line.strip()]


def _stops_with_one_line(work: str, code: int, start: str, end: str = "") -> str:
  """The run stopped with exit 2 and `error: <start>...<end>` as stderr's last line, no trace."""
  assert code == errors.EXIT_INPUT, (code, runs.tail(work))
  lines = _lines(work)
  assert lines[-1].startswith("error: " + start) and lines[-1].endswith(end), lines[-3:]
  assert not any("Traceback" in line or "internal error" in line for line in lines), lines
  return lines[-1]


def _finished(work: str) -> dict:
  summary = runs.summary(work)
  assert summary.get("test"), sorted(summary)
  return summary


def _log(work: str) -> str:
  with open(os.path.join(work, "log.txt")) as f:
    return f.read()


def _write_json(path: str, value) -> None:
  with open(path, "w") as f:
    f.write(value if isinstance(value, str) else json.dumps(value))


def _read_json(path: str):
  with open(path) as f:
    return json.load(f)


# -- 1. the coordinator's saved state -----------------------------------------------------------

def _a_failure(**change) -> dict:
  return {**dataclasses.asdict(run_state.Failure(
      kind="crash", worker=0, host="host-0", generation=1, step=7, committed_step=4,
      detected_s=0.02, t_detect=1795763097.5, recovered_s=1.3)), **change}


COORDINATOR_DAMAGE = [   # (what is changed in the saved state, the field the event names)
    ({"generation": "3"}, "generation"),
    ({"generation": 1.0}, "generation"),
    ({"generation": -4}, "generation"),
    ({"status": 7}, "status"),
    ({"status": "paused"}, "status"),
    ({"history": [["host-0", None]]}, "history[0][1]"),
    ({"failures": [1, 2]}, "failures[0]"),
    ({"failures": [_a_failure(step="7")]}, "failures[0].step"),
    ({"failures": [_a_failure(worker=None)]}, "failures[0].worker"),
    ({"failures": [_a_failure(t_detect=None)]}, "failures[0].t_detect"),
    ({"gen_stats": {"1": []}}, "gen_stats.1"),
    ({"gen_stats": {"1": {"executed": "30"}}}, "gen_stats.1.executed"),
    ({"strikes": "0"}, "strikes"),
    ({"commits_at_failure": 3.5}, "commits_at_failure"),
    ({"spec": []}, "spec"),
    ({"spec": {"generation": 1}}, "spec.hosts"),
    ({"spec": {"generation": 1, "hosts": "host-0", "host_history": [["host-0"]],
               "workers_per_host": 1, "num_processes": 1, "devices_per_worker": 1,
               "jax_address": "127.0.0.1:9"}}, "spec.hosts"),
]


@pytest.mark.slow
@pytest.mark.parametrize("change, field", COORDINATOR_DAMAGE)
def test_a_coordinator_state_of_another_shape_starts_fresh_naming_the_field(
    supervised, tmp_path, caplog, change, field):
  work = str(tmp_path / "work")
  for name in ("lineage", "generations", "config.json"):
    (shutil.copytree if os.path.isdir(os.path.join(supervised, name)) else shutil.copy)(
        os.path.join(supervised, name), os.path.join(work, name))
  config = paths.load_config(work)
  state_file = os.path.join(work, "lineage", "state", "coordinator")
  saved = _read_json(state_file)
  assert run_state.State.from_json(saved).generation == 1   # the real state reads back
  _write_json(state_file, {**saved, **change})
  with caplog.at_level(logging.INFO):
    c = coordinator.Coordinator(config, work, token="t")
  assert not c.policy.restored and c.policy.state.status == run_state.Status.WAITING
  assert c.policy.state.generation == 1 and c.policy.state.failures == []
  (event,) = jsonl.read(os.path.join(work, "events.jsonl"))
  assert event["event"] == "coordinator_state_damaged" and event["generation"] == 1
  assert event["error"].startswith(f"{work}/lineage/state/coordinator: field {field!r} "), event
  errors_logged = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
  assert len(errors_logged) == 1 and f"field {field!r}" in errors_logged[0], errors_logged
  # The fresh state was saved: the next start reads it without complaint (no loop).
  again = coordinator.Coordinator(config, work, token="t")
  assert again.policy.restored and again.policy.state.generation == 1
  assert len(jsonl.read(os.path.join(work, "events.jsonl"))) == 2   # + coordinator_restarted


@pytest.mark.slow
@pytest.mark.parametrize("change, field", [
    ({"generation": "3"}, "generation"), ({"failures": [1, 2]}, "failures[0]"),
    ({"spec": []}, "spec"), ({"status": 7}, "status")])
def test_a_run_resumes_past_a_coordinator_state_of_another_shape(supervised, tmp_path, change,
                                                                  field):
  work = _copy(supervised, tmp_path / "work")
  before = len(runs.events(work))
  state_file = os.path.join(work, "lineage", "state", "coordinator")
  _write_json(state_file, {**_read_json(state_file), **change})
  assert _resume(work, supervised_run=True) == 0, runs.tail(work)
  events = runs.events(work)[before:]
  names = [e["event"] for e in events]
  # One coordinator, started once: the state is refused where it is read, not in a crash later
  # that the launcher would restart into the same state.
  assert names[0] == "coordinator_state_damaged" and names.count("coordinator_started") == 1
  assert names.count("coordinator_state_damaged") == 1
  assert f"field {field!r}" in events[0]["error"]
  starts = [e["generation"] for e in events if e["event"] == "generation_start"]
  assert starts == [2]            # after the newest spec written, none reused
  assert not any(e["event"] == "failure" for e in events)
  summary = _finished(work)
  assert summary["fault_tolerance"]["exactly_once"] is True
  logged = [l for l in _lines(work, os.path.join("logs", "coordinator.txt")) if " ERROR " in l]
  assert len(logged) == 1 and "its saved state is damaged" in logged[0], logged


# -- 2. lineage records and the lineage store's other state -------------------------------------

def _newest(work: str) -> int:
  return lineage.LineageStore(os.path.join(work, "lineage")).committed_steps()[-1]


@pytest.mark.slow
@pytest.mark.parametrize("change, field", [
    (lambda d: d.update(generation="0"), "generation"),          # no str -> int coercion
    (lambda d: d["segment"].update(hosts=[7]), "segment.hosts[0]"),
    (lambda d: d.update(stopped=0), "stopped"),
    (lambda d: d.update(validation=[[0, True, 15]]), "validation[0][1]"),
])
def test_a_lineage_record_of_another_shape_is_skipped_for_the_previous_checkpoint(
    unsupervised, tmp_path, change, field):
  work = _copy(unsupervised, tmp_path / "work")
  newest = _newest(work)
  path = os.path.join(work, "lineage", "log", f"{newest:012d}")
  record = _read_json(path)
  change(record)
  _write_json(path, record)
  with pytest.raises(lineage.LineageError, match=f"lineage field {re.escape(repr(field))} "):
    lineage.LineageStore(os.path.join(work, "lineage")).record(newest)
  assert _resume(work) == 0, runs.tail(work)
  log = _log(work)
  assert (f"checkpoint {newest} has an unreadable lineage record (lineage field {field!r} "
          in log), runs.tail(work, "log.txt")
  restored = int(re.search(r"restored committed step (\d+) ", log).group(1))
  assert restored < newest
  assert glob.glob(os.path.join(work, "checkpoints-damaged", f"{newest}.*"))   # kept, aside
  assert os.path.exists(os.path.join(work, "lineage", "damaged", f"{newest:012d}"))
  _finished(work)


RECORDS_DAMAGE = [({"fingerprint": 5, "count": 300}, "field 'fingerprint' is 5"),
                  ({"fingerprint": "", "count": 300}, "field 'fingerprint' is ''"),
                  ({"fingerprint": "3fa1c0ab", "count": "300"}, "field 'count' is '300'"),
                  ({"fingerprint": "3fa1c0ab"}, "field 'count' is missing"),
                  (["3fa1c0ab", 300], "holds list, not a record")]


@pytest.mark.slow
@pytest.mark.parametrize("saved, problem", RECORDS_DAMAGE)
def test_a_records_state_of_another_shape_stops_with_what_to_do(unsupervised, tmp_path, saved,
                                                                problem):
  work = str(tmp_path / "work")
  shutil.copytree(os.path.join(unsupervised, "lineage"), os.path.join(work, "lineage"))
  store = lineage.LineageStore(os.path.join(work, "lineage"))
  assert restore.RECORDS.check(store.get_state("records"), "") is None   # the real one is fine
  _write_json(os.path.join(work, "lineage", "state", "records"), saved)
  with pytest.raises(lineage.LineageError) as e:
    # pylint: disable-next=protected-access
    restore._check_the_records(store, "3fa1c0ab", 300, is_chief=True)
  assert str(e.value).startswith(f"{work}/lineage/state/records: {problem}"), str(e.value)
  assert str(e.value).endswith("the next start stores that ingest's fingerprint again)")


@pytest.mark.slow
@pytest.mark.parametrize("supervised_run", [False, True])
def test_a_run_with_a_records_state_of_another_shape_stops_with_one_line(
    supervised, unsupervised, tmp_path, supervised_run):
  work = _copy(supervised if supervised_run else unsupervised, tmp_path / "work")
  _write_json(os.path.join(work, "lineage", "state", "records"),
              {"fingerprint": 5, "count": 300})
  before = len(runs.events(work))
  code = _resume(work, supervised_run=supervised_run)
  _stops_with_one_line(
      work, code, f"{work}/lineage/state/records: field 'fingerprint' is 5, not a non-empty "
      "string; the file is damaged; restore it from a backup, or delete it",
      "(the next start stores that ingest's fingerprint again)")
  if supervised_run:   # the worker's line, reported by its agent; no restart into it
    failures = [e for e in runs.events(work)[before:] if e["event"] == "failure"]
    assert [f["kind"] for f in failures] == ["input"]
    assert failures[0]["reason"].startswith(f"{work}/lineage/state/records: ")


@pytest.mark.slow
def test_a_run_with_a_snapshot_run_id_of_another_shape_stops_with_one_line(unsupervised,
                                                                           tmp_path):
  work = _copy(unsupervised, tmp_path / "work")
  _write_json(os.path.join(work, "lineage", "state", "snapshots"), {"run": ["../other"]})
  _stops_with_one_line(
      work, _resume(work),
      f"{work}/lineage/state/snapshots: field 'run' is ['../other'], not a string; the file is "
      "damaged; delete it", "training goes on from the newest committed checkpoint)")


# -- 3. the decoded cache's own files -----------------------------------------------------------

@pytest.mark.slow
def test_a_run_rebuilds_what_its_cache_files_of_another_shape_held(unsupervised, tmp_path):
  work = _copy(unsupervised, tmp_path / "work")
  cache = os.path.join(work, "cache", "host-0")
  _write_json(os.path.join(cache, "counters.0.json"), [1, 2])   # Cache() raised AttributeError
  index = _read_json(os.path.join(cache, "index.json"))
  index[sorted(index)[3]][2] = "crc"
  _write_json(os.path.join(cache, "index.json"), index)
  assert _resume(work) == 0, runs.tail(work)
  log = _log(work)
  assert (f"cache: {cache}/counters.0.json is damaged (the file is [1, 2], not an object); its "
          "counters start again from zero") in log
  assert (f"cache: {cache}/index.json is damaged (field '{sorted(index)[3]}[2]' is 'crc', not an "
          "int >= 0 and <= 4294967295); starting an empty index") in log
  _finished(work)
  counters = _read_json(os.path.join(cache, "counters.0.json"))
  assert counters["records_written"] == len(index)   # counted again from zero: every record
  assert len(_read_json(os.path.join(cache, "index.json"))) == len(index)


# -- 4. generation specs and host-local snapshots -----------------------------------------------

SPEC_DAMAGE = [   # (gen-002.json's content, or a change to a good one; what the line says)
    ("{\"generation\": 2, \"hos", "Unterminated string"),
    ([2], "the file is [2], not an object"),
    ({"hosts": "host-0"}, "field 'hosts' is 'host-0', not a list"),
    ({"hosts": []}, "field 'hosts' is [], not a list of at least 1"),
    ({"num_processes": "1"}, "field 'num_processes' is '1', not an int >= 1"),
    ({"num_processes": 2}, "not a spec whose num_processes is len(hosts) * workers_per_host"),
    ({"workers_per_host": True}, "field 'workers_per_host' is True"),
    ({"host_history": [["host-0"], 7]}, "field 'host_history[1]' is 7"),
    ({"jax_address": None}, "field 'jax_address' is None, not a non-empty string"),
    ({"generation": 5}, "field 'generation' is 5, not 2"),
]


def _damaged_spec(work: str, damage) -> str:
  good = _read_json(os.path.join(work, "generations", "gen-001.json"))
  path = os.path.join(work, "generations", "gen-002.json")
  if isinstance(damage, dict):
    damage = {**good, "generation": 2, **damage}
  _write_json(path, damage)
  return path


@pytest.mark.slow
@pytest.mark.parametrize("damage, problem", SPEC_DAMAGE)
def test_a_worker_with_a_spec_of_another_shape_leaves_one_line(supervised, tmp_path, caplog,
                                                               monkeypatch, damage, problem):
  from medjax.fault import worker  # pylint: disable=import-outside-toplevel
  work = str(tmp_path / "work")
  for name in ("generations", "config.json"):
    (shutil.copytree if name == "generations" else shutil.copy)(
        os.path.join(supervised, name), os.path.join(work, name))
  os.makedirs(os.path.join(work, "logs"))
  path = _damaged_spec(work, damage)
  run_paths = paths.RunPaths(work)

  def leave(code):
    raise SystemExit(code)
  monkeypatch.setattr(worker.lifeline, "leave", leave)
  assert worker._read_spec(run_paths, 1, 0)["generation"] == 1   # pylint: disable=protected-access
  with pytest.raises(SystemExit) as e, caplog.at_level(logging.ERROR):
    worker._read_spec(run_paths, 2, 0)   # pylint: disable=protected-access
  assert e.value.code == run_state.EXIT_ERROR
  with open(run_paths.worker_error(2, 0)) as f:   # what its agent reports with the exit
    line = f.read()
  assert line.startswith(f"{path}: the generation spec is damaged (") and problem in line
  assert line.endswith("); the coordinator writes the next generation's anew\n")
  assert len(line.splitlines()) == 1
  assert [r.getMessage() for r in caplog.records] == [f"worker 0: {line.strip()}"]


@pytest.mark.slow
def test_a_worker_process_with_a_damaged_spec_exits_with_its_line(supervised, tmp_path):
  work = _copy(supervised, tmp_path / "work")
  path = _damaged_spec(work, {"hosts": "host-0"})
  done = subprocess.run(
      [sys.executable, runs.LAUNCH, "--role=worker", f"--workdir={work}", "--generation=2",
       "--process_id=0", "--host_name=host-0", "--coordinator=127.0.0.1:9"],
      cwd=ROOT, env=runs.env(), capture_output=True, text=True, timeout=120, check=False)
  assert done.returncode == run_state.EXIT_ERROR, done.stderr[-2000:]
  line = (f"{path}: the generation spec is damaged (field 'hosts' is 'host-0', not a list of at "
          "least 1 (each a non-empty string)); the coordinator writes the next generation's anew")
  with open(paths.RunPaths(work).worker_error(2, 0)) as f:   # what its agent reports
    assert f.read() == line + "\n"
  # Its output (the generation's log, when its agent starts it): the logged line, no traceback.
  assert done.stderr.strip().endswith(f"worker 0: {line}"), done.stderr[-2000:]
  assert "Traceback" not in done.stderr and "internal error" not in done.stderr


@pytest.mark.slow
def test_a_spec_damaged_before_its_worker_reads_it_costs_one_restart(tmp_path):
  """gen-001.json rewritten the moment the coordinator writes it (its fresh worker, no standby,
  still imports JAX for a second or more): the worker leaves its line, its agent reports it,
  and the coordinator starts generation 2 with a spec of its own."""
  work = str(tmp_path / "work")
  spec_path = os.path.join(work, "generations", "gen-001.json")
  proc = runs.start(work, "--config.fault.standby_workers=False")
  try:
    good = runs.wait_for(lambda: os.path.exists(spec_path) and _spec_or_none(spec_path), 240,
                         "the first generation's spec", poll=0.002)
    _write_json(spec_path, {**good, "host_history": "host-0"})
    code = proc.wait(timeout=300)
  finally:
    if proc.poll() is None:
      os.killpg(proc.pid, signal.SIGKILL)
  assert code == 0, runs.tail(work)
  events = runs.events(work)
  (failure,) = [e for e in events if e["event"] == "failure"]
  assert failure["kind"] == "error" and failure["generation"] == 1
  assert failure["reason"] == (
      f"{spec_path}: the generation spec is damaged (field 'host_history' is 'host-0', not a "
      "list (each a list of at least 1 (each a non-empty string))); the coordinator writes the "
      "next generation's anew")
  (exit_,) = [e for e in events if e["event"] == "worker_exit" and e["exit_code"]]
  assert exit_["exit_code"] == run_state.EXIT_ERROR and exit_["reason"] == failure["reason"]
  assert [e["generation"] for e in events if e["event"] == "generation_start"] == [1, 2]
  summary = _finished(work)
  assert [f["kind"] for f in summary["fault_tolerance"]["failures"]] == ["error"]
  assert summary["fault_tolerance"]["exactly_once"] is True


def _spec_or_none(path: str):
  try:
    spec = _read_json(path)
  except ValueError:
    return None   # the coordinator is writing it
  return spec if isinstance(spec, dict) and "jax_address" in spec else None


@pytest.mark.slow
def test_snapshot_headers_of_another_shape_are_skipped_for_the_checkpoint(tmp_path):
  """A run killed mid-epoch; the host-local snapshots it left (one or two: the kill may land
  while the oldest is being written over) get headers of another shape: the rerun skips them,
  each with a warning naming the field, and resumes from the newest committed checkpoint (from
  the start if none was committed yet)."""
  work = str(tmp_path / "work")
  # One partition per epoch (14-15 steps): a checkpoint at each epoch's end only (as
  # test_snapshots.py's run killed in its third epoch).
  common = ["--config.fault.supervised=False", "--config.optim.epochs=4",
            "--config.data.num_partitions=1", "--config.ckpt.every_steps=0",
            "--config.ckpt.snapshot_every_steps=1", "--config.ckpt.writer_duty=1.0"]
  code = runs.run(work, *common, "--config.fault.inject=kill@step=37:process=0", timeout=300)
  assert code == -signal.SIGKILL, (code, runs.tail(work))
  store = lineage.LineageStore(os.path.join(work, "lineage"))
  # An epoch's end; none when the first checkpoint was still being written at the kill (a
  # loaded machine: a save never stalls training), and training then starts over.
  committed = (store.committed_steps() or [0])[-1]
  run_id = snapshots.run_id(store, is_chief=False, barrier=lambda name: None)
  directory = os.path.join(snapshots.run_root("", work, run_id), "host-0", "proc-0")
  held = snapshots.step_files(directory)
  assert held and all(committed < step <= 37 for step in held), (committed, held)
  damages = [(lambda h: h["groups"][0].update(size=str(h["groups"][0]["size"])),
              "field 'groups[0].size' is '"),
             (lambda h: h["lineage"].update(generation="0"),
              "lineage field 'generation' is '0', not an int >= 0")]
  for step, (damage, _) in zip(reversed(held), damages):
    runs.rewrite_snapshot_header(os.path.join(directory, f"step-{step}{snapshots.SUFFIX}"), damage)
  assert runs.run(work, *common, timeout=300) == 0, runs.tail(work)
  log = _log(work)
  for step, (_, problem) in zip(reversed(held), damages):
    assert f"snapshot {step} in {directory} is damaged ({problem}" in log, step
  assert "snapshot: restored step" not in log
  assert (f"checkpoint: restored committed step {committed} " in log) == (committed > 0)
  _finished(work)


# -- 5. what ingest wrote -----------------------------------------------------------------------

def _rewrite_manifest(work: str, line: int, change) -> str:
  path = paths.RunPaths(work).manifest
  with open(path) as f:
    lines = f.read().splitlines()
  value = json.loads(lines[line - 1])
  value = change(value) or value   # (a change returns a new value, or None: changed in place)
  lines[line - 1] = json.dumps(value)
  with open(path, "w") as f:
    f.write("\n".join(lines) + "\n")
  return path


def _rewrite_tables(work: str, change) -> str:
  path = paths.RunPaths(work).tables
  with np.load(path) as f:
    tables = dict(f)
  change(tables)
  np.savez(path, **tables)
  return path


def _rewrite_summary(work: str, change) -> str:
  path = paths.RunPaths(work).ingest_summary
  summary = _read_json(path)
  _write_json(path, change(summary) or summary)
  return path


INGEST_DAMAGE = [   # (which file, how, what the line says is wrong)
    ("manifest", lambda w: _rewrite_manifest(w, 5, lambda r: r.update(label="3")),
     "field 'line 5.label' is '3', not an int >= -1"),
    ("manifest", lambda w: _rewrite_manifest(w, 9, lambda r: r.update(label=99)),
     "field 'line 9.label' is 99, past the "),
    ("manifest", lambda w: _rewrite_manifest(w, 2, lambda r: r.update(image_files="a.dcm")),
     "field 'line 2.image_files' is 'a.dcm', not a list"),
    ("manifest", lambda w: _rewrite_manifest(w, 3, lambda r: r.update(split="dev")),
     "field 'line 3.split' is 'dev', not one of 'train', 'val', 'test'"),
    ("manifest", lambda w: _rewrite_manifest(w, 4, lambda r: r.update(modalities="LI")),
     "field 'line 4.modalities' is 'LI', not a modality group"),
    ("manifest", lambda w: _rewrite_manifest(w, 6, lambda r: r.update(num_images=1.0)),
     "field 'line 6.num_images' is 1.0, not an int >= 0"),
    ("manifest", lambda w: _rewrite_manifest(w, 7, lambda r: r.update(cost_ms=-2)),
     "field 'line 7.cost_ms' is -2, not a finite number >= 0"),
    ("manifest", lambda w: _rewrite_manifest(w, 8, lambda r: r.pop("id") and None),
     "field 'line 8.id' is missing"),
    ("manifest", lambda w: _rewrite_manifest(w, 10, lambda r: ["r-1", 0]),
     "field 'line 10' is ['r-1', 0], not an object"),
    ("manifest", lambda w: _rewrite_manifest(w, 1, lambda h: {"class_names": "ABC"}),
     "field 'line 1.class_names' is 'ABC', not a list"),
    ("manifest", lambda w: _rewrite_manifest(
        w, 3, lambda r: r.update(id=json.loads(open(paths.RunPaths(w).manifest).readlines()[1])[
            "id"])), "field 'line 3.id' repeats the record id of line 2"),
    ("tables", lambda w: _rewrite_tables(w, lambda t: t.pop("labs_mask")),
     "no 'labs_mask' array"),
    ("tables", lambda w: _rewrite_tables(w, lambda t: t.update(labs=t["labs"].astype(float))),
     "'labs' is float64, not float32"),
    ("tables", lambda w: _rewrite_tables(w, lambda t: t.update(vitals=t["vitals"][:, :, :2])),
     "'vitals' has shape [{n}, 24, 2], not [{n}, steps, 6]"),
    ("tables", lambda w: _rewrite_tables(w, lambda t: t.update(labs_std=t["labs_std"][:3])),
     "'labs_std' has shape [3], not [{a}]"),
    ("tables", lambda w: _rewrite_tables(w, lambda t: t.update(record_ids=t["record_ids"][::-1])),
     "its record ids are not the manifest's, in its order"),
    ("tables", lambda w: _rewrite_tables(w, lambda t: t["vitals"].__setitem__((0, 0, 0),
                                                                              np.nan)),
     "'vitals' holds non-finite values"),
    ("tables", lambda w: _rewrite_tables(w, lambda t: t.update(analytes=np.arange(43))),
     "'analytes' is int64[{a}], not a list of strings"),
    ("summary", lambda w: _rewrite_summary(w, lambda s: [s]), "the file is [{{"),
    ("summary", lambda w: _rewrite_summary(w, lambda s: s.update(patients=str(s["patients"]))),
     "field 'patients' is '{n}', not an int >= 0"),
    ("summary", lambda w: _rewrite_summary(w, lambda s: s["splits"].pop("val") and None),
     "field 'splits.val' is missing"),
    ("summary", lambda w: _rewrite_summary(w, lambda s: s.update(patients=s["patients"] - 1)),
     "{n_1} patients, the manifest {n}"),
    ("quarantine", lambda w: _write_json(paths.RunPaths(w).quarantine, "[1, 2]\n"),
     "field '[0]' is [1, 2], not an object"),
]


@pytest.mark.slow
@pytest.mark.parametrize("which, damage, problem", INGEST_DAMAGE)
def test_an_ingest_file_of_another_shape_is_one_line_saying_to_ingest_again(
    unsupervised, tmp_path, which, damage, problem):
  work = str(tmp_path / "work")
  shutil.copytree(os.path.join(unsupervised, "ingest"), os.path.join(work, "ingest"))
  good = ingested.load(work)
  n, a = len(good.manifest), len(good.tables["analytes"])
  problem = problem.format(n=n, n_1=n - 1, a=a)
  damage(work)
  with pytest.raises(errors.InputError) as e:
    ingested.load(work)
  path = getattr(paths.RunPaths(work), {"summary": "ingest_summary"}.get(which, which))
  message = str(e.value)
  assert message.startswith(f"{path} is damaged") and problem in message, message
  assert message.endswith(f"); {ingested.REDO}")


@pytest.mark.slow
@pytest.mark.parametrize("which, supervised_run", [(0, False), (11, False), (18, True)])
def test_a_run_over_an_ingest_of_another_shape_stops_with_one_line(
    supervised, unsupervised, tmp_path, which, supervised_run):
  kind, damage, problem = INGEST_DAMAGE[which]
  work = _copy(supervised if supervised_run else unsupervised, tmp_path / "work")
  problem = problem.format()   # (these three name no count)
  path = damage(work)
  line = _stops_with_one_line(work, _resume(work, supervised_run=supervised_run),
                              f"{path} is damaged", f"; {ingested.REDO}")
  assert problem in line, (kind, line)
  if which == 0:   # what the line says to do works
    assert _resume(work, "--config.data.reingest=True") == 0, runs.tail(work)
    _finished(work)
