"""Fault tolerance with real processes: the coordinator, agents and workers, real signals."""

import collections
import glob
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys

import grpc
import numpy as np
import psutil
import pytest

from medjax import jsonl
from medjax import lineage
from medjax.checkpoint import checkpointer
from medjax.data import ingest
from medjax.data.cache import placement
from medjax.fault import protocol
from medjax.runtime import inject
from tests import runs

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
  """The runs' base folder and their salt (the compilation cache is the session's, conftest.py)."""
  return {"base": tmp_path_factory.mktemp("fault")}


def _common(shared):
  # One salt: the same pseudonymous ids, hence the same split and plans, in every run.
  return [f"--config.data.salt_file={shared['base'] / 'id_salt'}"]


def _ledger_counts(workdir, final_step):
  """Per (epoch, row) how often the LAST execution of each committed step trained on it."""
  by_step = collections.defaultdict(dict)
  for path in glob.glob(os.path.join(workdir, "ledger", "*.jsonl")):
    gen = int(os.path.basename(path).split("-")[1])
    for e in jsonl.read(path):
      by_step[e["step"]].setdefault(gen, []).append(e)
  counts = collections.Counter()
  for step in range(1, final_step + 1):
    assert step in by_step, f"committed step {step} has no ledger entry"
    for e in by_step[step][max(by_step[step])]:
      for r in e["rows"]:
        counts[(e["epoch"], r)] += 1
  return counts


def _assert_exactly_once(workdir, epochs):
  s = runs.summary(workdir)
  final = s["fault_tolerance"]["steps_committed"]
  counts = _ledger_counts(workdir, final)
  train = ingest.load(workdir).manifest.indices("train")
  for epoch in range(epochs):
    seen = [counts[(epoch, int(r))] for r in train]
    assert all(c == 1 for c in seen), (epoch, collections.Counter(seen))
  assert sum(counts.values()) == epochs * len(train)
  assert s["fault_tolerance"]["exactly_once"] is True


# The multi-process paths (jax.distributed, gloo, exactly once across processes, restore onto
# another process count) need 2 worker processes per host; the default on CPU is 1.
TWO_WORKERS = "--config.fault.workers_per_host=2"
# The clean and faulty runs' epochs: JAX notices a SIGTERM by polling once a second (TSL's
# SigtermNotifier) and then agrees on the preemption step, so a SIGTERM needs a few seconds of
# training after it; at ~18 steps/s, 4 epochs of 15 steps leave 43 steps (~2.4 s) after step 17.
EPOCHS = 4


@pytest.fixture(scope="module")
def clean_run(shared):
  """An uninterrupted supervised run: 1 host, 2 worker processes of 1 device each."""
  clean = str(shared["base"] / "clean")
  # Every boundary written (no rest between writes): the pruning test below needs commits.
  assert runs.run(clean, *_common(shared), TWO_WORKERS, f"--config.optim.epochs={EPOCHS}",
                  "--config.ckpt.writer_duty=1.0") == 0, runs.tail(clean)
  return clean


def test_signals_recovery_exactly_once_and_same_parameters(shared, clean_run):
  clean = clean_run
  faulty = str(shared["base"] / "faulty")
  # JAX agrees on the preemption step asynchronously (up to a second to notice the SIGTERM, then
  # a few steps, more on a loaded machine): EPOCHS leaves it seconds of training.
  faults = "kill@step=6:process=1; sigstop@step=13:process=0; sigterm@step=17:process=1"
  # 'always': spare standbys from the first generation on (by default a CPU host keeps them
  # only once the run has restarted), so every restart here takes one (prepared or not).
  code = runs.run(faulty, *_common(shared), TWO_WORKERS, f"--config.optim.epochs={EPOCHS}",
                  f"--config.fault.inject={faults}", "--config.fault.warm_standby=always",
                  # Snapshots every 2 steps, however little the writer rests between them.
                  "--config.ckpt.snapshot_every_steps=2", "--config.ckpt.writer_duty=1.0")
  assert code == 0, runs.tail(faulty)

  ft = runs.summary(faulty)["fault_tolerance"]
  kinds = [f["kind"] for f in ft["failures"]]
  assert kinds == ["crash", "hang", "preemption"], ft["failures"]
  assert ft["restarts"] == 3
  crash, hang, preempt = ft["failures"]
  assert crash["detected_s"] < 1.0
  assert hang["detected_s"] < 4.0 + 2.0  # timeout_training_s + 2 s
  assert all(f["recovered_s"] is not None for f in ft["failures"])
  assert ft["steps_committed"] == runs.summary(clean)["fault_tolerance"]["steps_committed"]
  assert ft["steps_executed"] > ft["steps_committed"]  # the crash and the hang cost work
  # The ledger's accounting: every executed step is committed or lost to one failure.
  assert ft["executed_from"] == "ledger"
  lost = sum(f["steps_lost"] for f in ft["failures"])
  assert ft["steps_executed"] - ft["steps_committed"] == lost, ft["failures"]
  assert crash["last_step"] == 6 and hang["last_step"] == 13, ft["failures"]
  # Each restart resumed where it says: a host-local snapshot (every 2 steps here) where one was
  # newer than the newest committed checkpoint, else that checkpoint (the preemption's, saved on
  # SIGTERM). Which one a crash finds depends on where the writer was; the parameters below are
  # the uninterrupted run's either way.
  restored = [f["recovery"]["restored_from"] for f in ft["failures"]]
  assert all(f["resumed_step"] == r["step"] for f, r in zip(ft["failures"], restored)), restored
  # (Whether a snapshot or the boundary checkpoint is the newer one at a crash depends on where
  # both writers were: on an idle machine both restarts found a committed checkpoint as new.)
  assert {r["from"] for r in restored} <= {"snapshot", "checkpoint"}, restored
  assert restored[2]["from"] == "checkpoint", restored
  assert preempt["resumed_step"] == preempt["last_step"], preempt
  _assert_exactly_once(faulty, epochs=EPOCHS)

  # The run that survived three failures ends where the uninterrupted one does.
  a, step_a = checkpointer.load_arrays(os.path.join(clean, "checkpoints"))
  b, step_b = checkpointer.load_arrays(os.path.join(faulty, "checkpoints"))
  assert step_a == step_b and sorted(a) == sorted(b)
  params = [k for k in a if k.startswith("['params']")]
  assert params
  for k in params:
    np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-6, err_msg=k)
  # Failures and recoveries are marked on the loss curve, and events say when.
  events = [e["event"] for e in runs.events(faulty)]
  assert events.count("failure") == 3 and events.count("recovered") == 3
  assert os.path.exists(os.path.join(faulty, "loss_curve.png"))
  # Restarts took standby workers that had imported everything already.
  agent_log = runs.tail(faulty, os.path.join("logs", "agent-host-0.txt"), n=1000)
  assert re.search(r"started generation [2-9] \(2 workers, 2 of them standbys;", agent_log), \
      agent_log
  # Two processes: a restart takes the group of standbys that joined jax.distributed and
  # prepared ahead where it was ready in time (the faults come seconds apart here), else
  # imported standbys that start jax.distributed then; the summary says which.
  for f in ft["failures"]:
    path = f["recovery"]["path"]
    assert path in ("warm_standby", "standby"), f["recovery"]
    assert ("distributed_init" in f["recovery"]["phases_s"]) == (path == "standby"), f["recovery"]


def test_only_the_coordinator_prunes_checkpoints(clean_run):
  # Every committed step missing from disk was pruned by the coordinator on a commit (a worker
  # that pruned too would delete some first, and the coordinator would not list them).
  committed = lineage.LineageStore(os.path.join(clean_run, "lineage")).committed_steps()
  on_disk = {int(d) for d in os.listdir(os.path.join(clean_run, "checkpoints")) if d.isdigit()}
  pruned = [s for e in runs.events(clean_run) if e["event"] == "commit" for s in e["pruned"]]
  assert pruned and len(pruned) == len(set(pruned))
  assert sorted(set(committed) - on_disk) == sorted(pruned)
  assert sorted(on_disk) == committed[-3:]   # config.ckpt.max_to_keep


def test_restore_onto_another_process_and_device_count(shared, clean_run, tmp_path):
  # The notebook path: this test process (1 process, 8 devices) evaluates the 2-process run.
  from medjax import evaluate  # pylint: disable=import-outside-toplevel
  result = evaluate.load(clean_run, bootstrap=10)
  assert result.metrics["accuracy"] == pytest.approx(
      runs.summary(clean_run)["test"]["accuracy"], abs=1e-6)
  # Training resumes on 1 worker process with 2 devices for one more epoch.
  cont = str(tmp_path / "cont")
  import shutil  # pylint: disable=import-outside-toplevel
  shutil.copytree(clean_run, cont, ignore=shutil.ignore_patterns("cache"))
  code = runs.run(cont, *_common(shared), f"--config.optim.epochs={EPOCHS + 1}",
                  "--config.fault.workers_per_host=1", "--config.fault.devices_per_worker=2")
  assert code == 0, runs.tail(cont)
  ft = runs.summary(cont)["fault_tolerance"]
  assert ft["steps_committed"] > runs.summary(clean_run)["fault_tolerance"]["steps_committed"]
  gens = [e for e in runs.events(cont) if e["event"] == "generation_start"]
  assert gens[-1]["num_processes"] == 1
  _assert_exactly_once(cont, epochs=EPOCHS + 1)
  # Its ingest was there to reuse: the launcher forked its agent before anything else.
  with open(os.path.join(cont, "log.txt")) as f:
    assert "local: agent host-0 forked from the launcher" in f.read()


def test_coordinator_crash_and_restart_mid_run(shared):
  workdir = str(shared["base"] / "coordinator_crash")
  proc = runs.start(workdir, *_common(shared))
  try:
    runs.wait_for(lambda: any(e["event"] == "commit" and e["step"] >= 4
                              for e in runs.events(workdir)), 300, "a commit at step 4")
    with open(os.path.join(workdir, "coordinator.json")) as f:
      pid = json.load(f)["pid"]
    inject.record_external(workdir, "kill", host="coordinator", pid=pid)
    os.kill(pid, signal.SIGKILL)
    assert proc.wait(timeout=400) == 0, runs.tail(workdir)
  finally:
    if proc.poll() is None:
      os.killpg(proc.pid, signal.SIGKILL)
  events = [e["event"] for e in runs.events(workdir)]
  assert "coordinator_restarted" in events
  assert "resumed_generation" in events  # the workers trained on; no new generation
  ft = runs.summary(workdir)["fault_tolerance"]
  assert ft["failures"] == [] and ft["restarts"] == 0
  _assert_exactly_once(workdir, epochs=2)


def test_crash_loop_guard_stops_with_error(shared):
  workdir = str(shared["base"] / "crash_loop")
  kills = "; ".join(["kill@step=2:process=0"] * 5)
  code = runs.run(workdir, *_common(shared), f"--config.fault.inject={kills}",
                  "--config.fault.max_failures_without_progress=2")
  assert code != 0
  log = runs.tail(workdir, n=80)
  assert "failures in a row without a new committed checkpoint" in log
  assert "crash of worker 0 at step" in log
  assert [e["event"] for e in runs.events(workdir)].count("failure") == 3


def test_workers_that_cannot_start_stop_the_run_with_their_fatal_line(shared):
  # XLA exits at its first use when XLA_FLAGS names a flag it does not know, before Python can
  # write an error file: the agent finds the FATAL line in the worker's log, and the user's
  # error line names it once, with how many times it happened.
  workdir = str(shared["base"] / "fatal")
  code = runs.run(workdir, *_common(shared), "--config.fault.max_failures_without_progress=1",
                  extra_env={"XLA_FLAGS": "--xla_medjax_no_such_flag=1"})
  log = runs.tail(workdir, n=80)
  assert code == 2, log
  (line,) = [l for l in log.splitlines() if l.startswith("error: ")]
  assert line.endswith("Last failures: error of worker 0 at step 0 (fatal: Unknown flag in "
                       "XLA_FLAGS: --xla_medjax_no_such_flag=1) (2 times)"), line
  failures = [e for e in runs.events(workdir) if e["event"] == "failure"]
  assert [f["reason"] for f in failures] == [
      "fatal: Unknown flag in XLA_FLAGS: --xla_medjax_no_such_flag=1"] * 2


def test_a_diverging_run_stops_at_once_with_one_line(shared):
  # A non-finite loss is the config's (or the records'): resumed from the last good checkpoint
  # it would diverge again. One line and exit 2, no restart, no "internal error".
  workdir = str(shared["base"] / "diverging")
  code = runs.run(workdir, *_common(shared), "--config.optim.lr=1e12")
  log = runs.tail(workdir, n=80)
  assert code == 2, log
  (line,) = [l for l in log.splitlines() if l.startswith("error: ")]
  assert "non-finite loss" in line and "Lower config.optim.lr" in line, line
  assert "internal error" not in log and "Traceback" not in log
  kinds = [e["event"] for e in runs.events(workdir)]
  assert kinds.count("failure") == 1 and kinds.count("generation_start") == 1, kinds


@pytest.mark.parametrize("mode", ["sync", "local"])
def test_elastic_shrink_from_two_hosts_to_one_keeps_exactly_once(shared, mode):
  """A host lost for good: the run goes on with the survivor. In 'local' mode the survivor's one
  device then trains both replicas (fixed at the run's start), late replicas cut as they come."""
  workdir = str(shared["base"] / f"elastic_{mode}")
  local = ["--config.optim.mode=local", "--config.optim.local_steps=4",
           "--config.optim.late_after_s=0.05"] if mode == "local" else []
  # Writers that never rest (ckpt.writer_duty=1): the cache accounting below counts on the
  # restart resuming from the boundary after the commit at step 6, as it did before the rest.
  proc = runs.start(workdir, *_common(shared), "--config.fault.local_hosts=2",
                    "--config.fault.workers_per_host=1", "--config.fault.elastic=True",
                    "--config.fault.host_timeout_s=3", "--config.ckpt.writer_duty=1.0", *local)
  try:
    runs.wait_for(lambda: any(e["event"] == "commit" and e["step"] >= 6
                              for e in runs.events(workdir)), 300, "a commit at step 6")
    # Lose host-1: its agent and every process under it, as when a machine goes away.
    agents = [p for p in psutil.Process(proc.pid).children()
              if _stdout(p) == os.path.join(workdir, "logs", "agent-host-1.log")]
    assert len(agents) == 1, f"expected host-1's agent, found {agents}"
    victims = [agents[0], *agents[0].children(recursive=True)]
    assert len(victims) >= 2, f"host-1's agent has no worker: {victims}"
    inject.record_external(workdir, "host_lost", host="host-1")
    for p in victims:
      p.kill()
    assert proc.wait(timeout=400) == 0, runs.tail(workdir)
  finally:
    if proc.poll() is None:
      os.killpg(proc.pid, signal.SIGKILL)
  ft = runs.summary(workdir)["fault_tolerance"]
  assert [f["kind"] for f in ft["failures"]][0] in ("host_lost", "crash")
  gens = [e for e in runs.events(workdir) if e["event"] == "generation_start"]
  assert gens[0]["hosts"] == ["host-0", "host-1"] and gens[-1]["hosts"] == ["host-0"]
  _assert_exactly_once(workdir, epochs=2)
  # The survivor kept its cache across its worker's restart and decoded each moved record once.
  manifest = ingest.load(workdir).manifest
  departed = placement.place(manifest, ["host-0", "host-1"], seed=0).rows_of("host-1")
  host0 = runs.summary(workdir)["cache"]["hosts"]["host-0"]
  assert host0["records_moved_in"] == len(departed)
  # Records without images are built from the tables: only the others are read again.
  assert host0["moved_reads"] == sum(1 for r in departed if manifest.image_files[r])
  # Its own records once, host-1's once, no more (those with images: the rest are tables).
  assert host0["pfs_reads"] == sum(1 for files in manifest.image_files if files)


def _stdout(p: psutil.Process) -> str:
  """Where a process writes its output: an agent, forked by the launcher or started by it, writes
  to its own log (a fork has the launcher's command line)."""
  try:
    return os.readlink(f"/proc/{p.pid}/fd/1")
  except OSError:
    return ""


def test_unauthenticated_call_is_rejected(shared, tmp_path):
  workdir = str(shared["base"] / "clean")  # reuse the finished run's workdir and config
  token = protocol.load_token(os.path.join(workdir, "secrets", "token"))
  port = protocol.free_port()
  log = open(tmp_path / "coordinator.log", "w")
  proc = subprocess.Popen([sys.executable, runs.LAUNCH, "--role=coordinator",
                           f"--workdir={tmp_path / 'w'}", f"--port={port}",
                           "--config=configs/quickstart.py:tiny",
                           f"--config.data.root={os.path.join(workdir, 'cohort')}",
                           f"--config.fault.token_file={os.path.join(workdir, 'secrets', 'token')}"],
                          cwd=runs.ROOT, env=runs.env(), stdout=log, stderr=subprocess.STDOUT)
  try:
    good = protocol.Client(f"127.0.0.1:{port}", token)
    runs.wait_for(lambda: _reachable(good), 120, "the coordinator to serve")
    bad = protocol.Client(f"127.0.0.1:{port}", "not-the-token")
    with pytest.raises(grpc.RpcError) as e:
      bad.call("Status")
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError):
      bad.call("Commit", {"record": {"global_step": 999}})
    assert good.call("Status")["status"] in ("waiting", "running")
  finally:
    proc.kill()
    proc.wait()
  assert "rejected unauthenticated call" in open(tmp_path / "coordinator.log").read() + open(
      tmp_path / "w" / "logs" / "coordinator.txt").read()


def test_coordinator_refuses_to_serve_without_token(tmp_path):
  env = runs.env()
  env.pop(protocol.TOKEN_ENV, None)
  out = subprocess.run([sys.executable, runs.LAUNCH, "--role=coordinator",
                        f"--workdir={tmp_path}", "--bind=0.0.0.0", "--config=configs/quickstart.py:tiny",
                        "--config.data.synthetic.num_patients=40"],
                       cwd=runs.ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert out.returncode != 0
  assert "without a token" in out.stderr + out.stdout


def _reachable(client) -> bool:
  try:
    client.call("Status")
    return True
  except grpc.RpcError:
    return False


def _listeners(port: int) -> list[str]:
  """The addresses listening on `port` (an IPv4-mapped IPv6 address as its IPv4 form)."""
  out = []
  for c in psutil.net_connections("inet"):
    if c.status == psutil.CONN_LISTEN and c.laddr.port == port:
      ip = ipaddress.ip_address(c.laddr.ip.split("%")[0])
      out.append(str(getattr(ip, "ipv4_mapped", None) or ip))
  return out


def _processes_of(workdir: str) -> list[psutil.Process]:
  alive = []
  for p in psutil.process_iter(["cmdline"]):
    try:
      if any(workdir in arg for arg in p.info["cmdline"] or []) and p.status() != "zombie":
        alive.append(p)
    except psutil.Error:
      pass
  return alive


def test_services_bind_loopback_and_stray_connections_cost_nothing(shared):
  workdir = str(shared["base"] / "stray")
  proc = runs.start(workdir, *_common(shared), TWO_WORKERS)   # jax.distributed's service
  try:
    spec_path = os.path.join(workdir, "generations", "gen-001.json")
    runs.wait_for(lambda: os.path.exists(spec_path), 300, "the first generation")
    with open(spec_path) as f:
      jax_port = int(json.load(f)["jax_address"].rsplit(":", 1)[1])
    with open(os.path.join(workdir, "coordinator.json")) as f:
      coordinator_port = int(json.load(f)["address"].rsplit(":", 1)[1])
    runs.wait_for(lambda: _listeners(jax_port), 120, "jax.distributed's service to listen")
    assert set(_listeners(jax_port)) == {"127.0.0.1"}
    assert set(_listeners(coordinator_port)) == {"127.0.0.1"}
    for port in (jax_port, coordinator_port):
      for payload in (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", os.urandom(4096), b""):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
          s.sendall(payload)
    assert proc.wait(timeout=400) == 0, runs.tail(workdir)
  finally:
    if proc.poll() is None:
      os.killpg(proc.pid, signal.SIGKILL)
  assert [e for e in runs.events(workdir) if e["event"] == "failure"] == []
  assert runs.summary(workdir)["fault_tolerance"]["restarts"] == 0


def test_a_worker_refusing_damaged_checkpoints_stops_the_run_with_its_line(shared, clean_run):
  workdir = str(shared["base"] / "all_damaged")
  shutil.copytree(clean_run, workdir, ignore=shutil.ignore_patterns("launcher.log"))
  for step_dir in glob.glob(os.path.join(workdir, "checkpoints", "*", "state")):
    for path in glob.glob(os.path.join(step_dir, "**", "d", "*"), recursive=True):
      with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 3)
  assert runs.run(workdir, *_common(shared), timeout=300) == 2, runs.tail(workdir)
  lines = [line for line in open(os.path.join(workdir, "launcher.log")).read().splitlines()
           if line.strip()]
  assert lines[-1].startswith("error: every committed checkpoint left in "), lines[-5:]
  assert "--config.ckpt.if_all_damaged=start_fresh" in lines[-1]
  assert not any("Traceback" in line for line in lines)
  failures = [e for e in runs.events(workdir) if e["event"] == "failure"]
  assert len(failures) >= 1 and failures[0]["kind"] == "input"
  assert not _processes_of(workdir)


def test_a_coordinator_that_cannot_listen_stops_the_run_with_one_line(shared):
  workdir = str(shared["base"] / "port_in_use")
  with socket.socket() as busy:
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    code = runs.run(workdir, *_common(shared), f"--config.fault.port={port}", timeout=300)
  assert code == 2, runs.tail(workdir)
  last = [line for line in open(os.path.join(workdir, "launcher.log")).read().splitlines()
          if line.strip()][-1]
  assert last == (f"error: coordinator: cannot listen on 127.0.0.1:{port} (in use by another "
                  "process, or not an address of this machine); choose another --port / "
                  "config.fault.port (0: a free one) or --bind")
  runs.wait_for(lambda: not _processes_of(workdir), 10, "the agents and workers to be gone")


def test_a_coordinator_crash_loop_stops_the_launcher_without_orphans(shared):
  workdir = str(shared["base"] / "coordinator_loop")
  # The coordinator writes its address to coordinator.json when it starts serving; a directory
  # in its place makes every start fail the same way.
  os.makedirs(os.path.join(workdir, "coordinator.json"))
  code = runs.run(workdir, *_common(shared), "--config.fault.max_coordinator_restarts=2",
                  timeout=300)
  assert code == 2, runs.tail(workdir)
  last = [line for line in open(os.path.join(workdir, "launcher.log")).read().splitlines()
          if line.strip()][-1]
  assert last.startswith("error: the coordinator exited 3 times in a row without the run "
                         "committing a step (config.fault.max_coordinator_restarts=2); its last "
                         "error: internal error: IsADirectoryError: "), last
  runs.wait_for(lambda: not _processes_of(workdir), 10, "the agents and workers to be gone")


def test_no_raw_patient_id_in_anything_a_run_writes(clean_run):
  with open(os.path.join(clean_run, "cohort", "labels.csv")) as f:
    ids = [line.split(",")[0].strip() for line in f.read().splitlines()[1:] if line.strip()]
  assert len(ids) > 100 and all(i.startswith("MRN") for i in ids)
  pattern = re.compile(rb"MRN\d{7}")
  checked = 0
  for dirpath, _, names in os.walk(clean_run):
    rel = os.path.relpath(dirpath, clean_run)
    if rel.split(os.sep)[0] in ("cohort", "secrets"):
      continue  # the input itself, and the salt
    for name in names:
      with open(os.path.join(dirpath, name), "rb") as f:
        found = pattern.findall(f.read())
      assert not found, f"{os.path.join(rel, name)} holds raw ids such as {found[:1]}"
      checked += 1
  assert checked > 50


def _worker_of(workdir: str, generation: int, process: int = 0) -> psutil.Process:
  """The worker process writing generation `generation`'s log (a standby handed it, or not)."""
  log = f"gen-{generation:03d}-proc-{process:03d}.log"
  for p in _processes_of(workdir):
    try:
      if ("--role=worker" in p.cmdline()
          and any(f.path.endswith(log) for f in p.open_files())):
        return p
    except psutil.Error:
      pass
  raise AssertionError(f"no worker writes {log}")


def _kill_once_prepared(proc, workdir: str, *, prepared: int, generation: int) -> None:
  """Once `prepared` standbys have prepared ahead, SIGKILLs worker 0 of `generation` (recorded
  as an external crash); returns when the run has finished (asserting it succeeded)."""
  standby_log = os.path.join(workdir, "logs", "standby-host-0.log")
  try:
    runs.wait_for(lambda: proc.poll() is not None or (
        os.path.exists(standby_log)
        and open(standby_log, errors="replace").read().count("standby: prepared") >= prepared),
        300, f"{prepared} prepared standby(s)")
    assert proc.poll() is None, "training ended before the standbys were ready: " + runs.tail(
        workdir, os.path.join("logs", "standby-host-0.log"), n=30)
    worker = _worker_of(workdir, generation=generation)
    inject.record_external(workdir, "kill", process=0, pid=worker.pid)
    worker.kill()
    assert proc.wait(timeout=300) == 0, runs.tail(workdir)
  finally:
    if proc.poll() is None:
      os.killpg(proc.pid, signal.SIGKILL)


def test_a_crash_recovers_through_a_warm_standby_with_its_phases(shared):
  """One worker process (the CPU default): its standby prepared data, model and compiled step
  ahead, so the restart only restores; events and summary name the path and the phases."""
  workdir = str(shared["base"] / "warm")
  # 'always': by default a CPU host keeps a spare standby, prepared, only once the run has
  # failed (a clean run does not pay for it); this run's first crash is to find one. The crash
  # must come while it still trains: at full speed 100 epochs ended on a loaded machine (or the
  # crash came after training, path 'unknown') before the standby was prepared. So the first
  # generation is slowed (a 'slow' fault, 0.1 s more a step: 600 steps take a minute or more);
  # its replacement is not, and trains what is left at full speed.
  proc = runs.start(workdir, *_common(shared), "--config.optim.epochs=40",
                    "--config.fault.warm_standby=always", "--config.fault.slow_step_s=0.1",
                    "--config.fault.inject=slow@step=1:process=0")
  _kill_once_prepared(proc, workdir, prepared=1, generation=1)
  ft = runs.summary(workdir)["fault_tolerance"]
  (crash,) = ft["failures"]
  assert crash["kind"] == "crash" and crash["detected_s"] < 1.0, crash
  recovery = crash["recovery"]
  assert recovery["path"] == "warm_standby", recovery
  phases = recovery["phases_s"]
  # Stopped, not backed off (the first failure since progress), handed over, restored, trained;
  # data, model and compilation were done ahead, before the crash.
  assert list(phases)[:4] == ["stop", "backoff", "agent", "handover"], phases
  assert {"data_takeover", "restore", "first_step"} <= set(phases), phases
  assert not {"data_setup", "model_build", "compile", "process_start"} & set(phases), phases
  assert phases["backoff"] < 0.5, phases
  ahead = recovery["prepared_ahead_s"]
  # The compilation ran beside the data's setup; what it took after the data was ready may be 0.
  assert ahead["compile_beside_data"] > 0 and ahead["prepared_before_s"] > 0, ahead
  assert recovery["compile_cache"] == "hit"
  assert sum(phases.values()) == pytest.approx(crash["recovered_s"], abs=0.01)
  assert crash["recovered_s"] < 10.0, recovery   # ~1 s on an idle machine (bench_recovery.py)
  # events.jsonl: each generation's phases once, the second generation by the warm standby.
  reports = [e for e in runs.events(workdir) if e["event"] == "generation_phases"]
  assert [(e["generation"], e["path"]) for e in reports] == [(1, "standby"),
                                                            (2, "warm_standby")], reports
  assert reports[0]["beside_data"]["compile"] > 0 and "compile" not in reports[1]["phases"]
  assert reports[0]["phases"]["compile"] >= 0 and not reports[1]["beside_data"]
  _assert_exactly_once(workdir, epochs=40)


def test_two_processes_recover_through_a_group_of_standbys_that_joined_ahead(shared):
  """Two worker processes: after the first restart the agent's two standbys join
  jax.distributed at a port it offers the coordinator and prepare together, so the next crash's
  generation only restores (no jax.distributed start, data, model or compilation)."""
  workdir = str(shared["base"] / "group")
  proc = runs.start(workdir, *_common(shared), TWO_WORKERS, "--config.optim.epochs=30",
                    "--config.fault.inject=kill@step=4:process=1")
  # The injected crash ends generation 1 (the default fault.warm_standby='after_failure': its
  # spares imported, unprepared); generation 2's standbys then join and prepare as a group.
  _kill_once_prepared(proc, workdir, prepared=2, generation=2)
  ft = runs.summary(workdir)["fault_tolerance"]
  first, second = ft["failures"]
  assert (first["kind"], second["kind"]) == ("crash", "crash"), ft["failures"]
  assert first["recovery"]["path"] == "standby", first["recovery"]
  # The first restart's standbys were the spares the first two forked once imported.
  agent_log = runs.tail(workdir, os.path.join("logs", "agent-host-0.txt"), n=1000)
  assert len(re.findall(r"spare standby \d+ forked from an imported standby", agent_log)) == 2, \
      agent_log
  assert "forked no spare" not in agent_log
  recovery = second["recovery"]
  assert recovery["path"] == "warm_standby", recovery
  assert recovery["paths_by_process"] == {"0": "warm_standby", "1": "warm_standby"}, recovery
  phases = recovery["phases_s"]
  assert {"data_takeover", "restore", "first_step"} <= set(phases), phases
  assert not {"distributed_init", "data_setup", "model_build", "compile"} & set(phases), phases
  assert recovery["prepared_ahead_s"]["distributed_init"] > 0, recovery
  assert second["recovered_s"] < 10.0, recovery   # ~0.5 s on an idle machine (bench_recovery.py)
  _assert_exactly_once(workdir, epochs=30)


# 'none' (a crash restarts from step 0) and a lost host replaced by a local spare are in
# tests/test_report.py's runs.
@pytest.mark.parametrize("strategy,commits", [
    ("epoch", [15, 30, 45]),   # from the last epoch end
])
def test_checkpoint_strategy_decides_where_a_crash_resumes(shared, strategy, commits):
  """The lineage paper's Table I strategies are trainer settings (config.ckpt.strategy): the
  same crash at step 25 of 45 loses what each strategy left uncommitted, and no more."""
  workdir = str(shared["base"] / f"strategy-{strategy}")
  code = runs.run(workdir, *_common(shared), "--config.optim.epochs=3",
                  f"--config.ckpt.strategy={strategy}", "--config.ckpt.every_steps=0",
                  "--config.ckpt.snapshot_every_steps=0",   # the checkpoints alone
                  # Each one the strategy asks for, committed before the run goes on: an
                  # asynchronous writer behind fast epochs coalesces some (and the crash can come
                  # before the first commit).
                  "--config.ckpt.async_save=False",
                  "--config.fault.inject=kill@step=25:process=0")
  assert code == 0, runs.tail(workdir)
  events = runs.events(workdir)
  assert [e["step"] for e in events if e["event"] == "commit"] == commits
  failed = next(i for i, e in enumerate(events) if e["event"] == "failure")
  newest = max([0] + [e["step"] for e in events[:failed] if e["event"] == "commit"])
  (recovered,) = [e for e in events if e["event"] == "recovered"]
  # The newest commit before the crash (epoch: step 15, unless its async save was still being
  # written when the crash came), and nothing older.
  assert recovered["step"] == newest + 1 and newest in (0, 15)
  ft = runs.summary(workdir)["fault_tolerance"]
  # The ledger has every step the crashed generation ran, its last report or not.
  assert ft["steps_executed"] == 45 + 25 - newest, ft
  (failure,) = ft["failures"]
  assert (failure["last_step"], failure["resumed_step"], failure["steps_lost"]) == (
      25, newest, 25 - newest), failure
  _assert_exactly_once(workdir, epochs=3)



def test_local_mode_recovers_each_replica_exactly_once(shared):
  """optim.mode='local' over 2 processes (2 replicas, one on each, averaging every 4 steps): the
  'sync' test's faults (a crash in the middle of a round, a hang, a SIGTERM) restore every
  replica's parameters and optimiser state, the ledger proves exactly-once, and the run ends
  where an uninterrupted one does."""
  local = [*_common(shared), TWO_WORKERS, f"--config.optim.epochs={EPOCHS}",
           "--config.optim.mode=local", "--config.optim.local_steps=4",
           "--config.ckpt.writer_duty=1.0"]
  clean = str(shared["base"] / "local_clean")
  assert runs.run(clean, *local) == 0, runs.tail(clean)
  faulty = str(shared["base"] / "local_faulty")
  code = runs.run(faulty, *local, "--config.fault.inject=kill@step=6:process=1; "
                  "sigstop@step=13:process=0; sigterm@step=17:process=1",
                  "--config.ckpt.snapshot_every_steps=2")
  assert code == 0, runs.tail(faulty)
  with open(os.path.join(faulty, "config.json")) as f:
    assert json.load(f)["optim"]["replicas"] == 2
  ft = runs.summary(faulty)["fault_tolerance"]
  assert [f["kind"] for f in ft["failures"]] == ["crash", "hang", "preemption"], ft["failures"]
  _assert_exactly_once(faulty, epochs=EPOCHS)
  a, step_a = checkpointer.load_arrays(os.path.join(clean, "checkpoints"))
  b, step_b = checkpointer.load_arrays(os.path.join(faulty, "checkpoints"))
  assert step_a == step_b and sorted(a) == sorted(b)
  replicas = [k for k in a if k.startswith("['local']['params']")]
  assert replicas and all(a[k].shape[0] == 2 for k in replicas)
  for k in [k for k in a if k.startswith(("['params']", "['local']"))]:
    np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_a_slowed_or_paused_replica_costs_throughput_and_its_records_train_exactly_once(shared):
  """optim.mode='local' with late_after_s: process 1 slowed (a 'slow' fault: 0.3 s more per
  step it trains) no longer holds process 0 at each round's end. It skips the rest of a round
  once process 0 has finished it, the records it skipped train in a catch-up at the epoch's end,
  and the ledger still proves every record trained exactly once per epoch, across a crash of
  process 0 in epoch 1 (its checkpoints lie at rounds' ends, their lineage knowing each skip)
  and a SIGTERM in epoch 2, whose save waits for the round's end and is where the run resumes.
  In epoch 3 process 1 is frozen for 1.5 s (a real SIGSTOP, then SIGCONT: a 'pause' fault, below
  hang detection): process 0 trains on past the round's end instead of waiting, and the run goes
  on without a failure."""
  workdir = str(shared["base"] / "local_late")
  code = runs.run(workdir, *_common(shared), TWO_WORKERS, f"--config.optim.epochs={EPOCHS}",
                  "--config.optim.mode=local", "--config.optim.local_steps=4",
                  "--config.optim.late_after_s=0.05", "--config.fault.slow_step_s=0.3",
                  "--config.fault.pause_s=1.5", "--config.fault.hang_floor_s=4",
                  # Boundary saves by process 0's clock: a collective, but not inside a round.
                  "--config.ckpt.min_interval_s=0.2",
                  "--config.ckpt.writer_duty=1.0", "--config.fault.inject=slow@step=1:process=1; "
                  "kill@epoch=1:process=0; sigterm@epoch=2:process=1; pause@epoch=3:process=1")
  assert code == 0, runs.tail(workdir)
  summary = runs.summary(workdir)
  failures = summary["fault_tolerance"]["failures"]
  assert [f["kind"] for f in failures] == ["crash", "preemption"], failures
  # The SIGTERM's save waits for the round's end, which can come after the last step the
  # coordinator heard of (a peer trains on while the round waits): nothing is lost either way.
  assert failures[1]["resumed_step"] >= failures[1]["last_step"], failures[1]
  _assert_exactly_once(workdir, epochs=EPOCHS)
  logs = {gen: "".join(open(p).read()
                      for p in glob.glob(os.path.join(workdir, "logs", f"gen-00{gen}-*.log")))
          for gen in (1, 2, 3)}
  assert "processes cut short" in logs[1] and "catching up" in logs[1]
  # The pause lands in a later generation (not slowed: a replacement is not slow), the second
  # or the third: the SIGTERM of epoch 2 takes effect at a round's end and a preemption sync
  # point, which may come after epoch 3 starts. There process 0 trained on past a round's end
  # and process 1 was cut short.
  past = [int(n) for gen in (2, 3) for n in re.findall(
      r"processes cut short, \d+ records deferred .* the others trained (\d+) steps past",
      logs[gen])]
  assert past and max(past) >= 1, (logs[2][-3000:], logs[3][-3000:])
  # In generation 1, slowed process 1 trained fewer steps than process 0: it skipped steps, it
  # did not hold the rounds.
  steps = [len(jsonl.read(os.path.join(workdir, "ledger", f"gen-001-proc-00{p}.jsonl")))
           for p in (0, 1)]
  assert steps[1] < steps[0], steps
