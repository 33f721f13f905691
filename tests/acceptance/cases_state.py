"""Bad-input cases of damaged run state and of the network (see bad_inputs.py).

Damaged-state cases copy a finished tiny run (trained once per battery, ~30 s unsupervised,
~60 s supervised), damage one thing and run it again with more epochs
(`--config.optim.epochs=3`), so that there is something to resume. The network case sends
garbage to both ports of a supervised tiny run while it trains; its workdir is then the base
of the supervised damaged-state cases.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import socket
import subprocess
import sys
import time

import psutil

from tests import runs
from tests.acceptance import lib
from tests.acceptance.lib import ACCEPTED, CLEAR, RECOVERED, case


# -- damaged run state --------------------------------------------------------------------------

def _base(ctx, kind: str) -> str:
  """A finished tiny run ('unsupervised' or 'supervised'), trained once per battery."""
  have = ctx.shared.get(kind)
  if have and os.path.exists(os.path.join(have, "summary.json")):
    return have
  workdir = os.path.join(ctx.shared["scratch"], "_bases", kind)
  shutil.rmtree(workdir, ignore_errors=True)
  args = [sys.executable, "launch.py", lib.TINY, f"--workdir={workdir}"]
  if kind == "unsupervised":
    args.append("--config.fault.supervised=False")
  print(f"      (training the {kind} tiny run the damaged-state cases start from)", flush=True)
  env = {k: v for k, v in runs.env().items() if k != "MEDJAX_DEBUG"}
  done = subprocess.run(args, cwd=lib.ROOT, env=env, capture_output=True, timeout=600,
                        check=False)
  if done.returncode != 0 or not os.path.exists(os.path.join(workdir, "summary.json")):
    raise RuntimeError(f"the {kind} base run failed (exit {done.returncode}): "
                       f"{done.stderr.decode(errors='replace')[-500:]}")
  ctx.shared[kind] = workdir
  return workdir


def _copy(ctx, kind: str) -> str:
  work = ctx.path("work")
  shutil.copytree(_base(ctx, kind), work, symlinks=True)
  for name in ("summary.json",):   # so that a rerun's summary is its own
    if os.path.exists(os.path.join(work, name)):
      os.remove(os.path.join(work, name))
  return work


def _synthetic_ids(work: str) -> list[str]:
  with open(os.path.join(work, "cohort", "labels.csv")) as f:
    return [line.split(",")[0] for line in f.read().splitlines()[1:] if line.strip()]


def _resume(ctx, work: str, *extra: str, supervised: bool = False, **kw) -> lib.Plan:
  argv = [lib.TINY, f"--workdir={work}", "--config.optim.epochs=3", *extra]
  if not supervised:
    argv.insert(2, "--config.fault.supervised=False")
  return lib.Plan(argv=argv, workdir=work, raw_ids=_synthetic_ids(work), timeout=400,
                  address_space_gb=None, **kw)


def _newest_step(work: str) -> int:
  return max(int(d) for d in os.listdir(os.path.join(work, "checkpoints")) if d.isdigit())


def _truncate_state(step_dir: str) -> None:
  for path in glob.glob(os.path.join(step_dir, "state", "**", "d", "*"), recursive=True):
    with open(path, "r+b") as f:
      f.truncate(os.path.getsize(path) // 3)


def _log_has(text: str):
  def check(run):
    log = run.log()
    line = next((l for l in log.splitlines() if text in l), None)
    return line is not None, (line or f"no log line with {text!r}")[-300:]
  return check


def _finished(run):
  s = run.summary()
  return bool(s.get("test")), "summary.json written with test metrics" if s else "no summary.json"


def _restored(step: int):
  return _log_has(f"restored committed step {step} ")


def _damaged_dir(run):
  d = run.path("checkpoints-damaged")
  names = sorted(os.listdir(d)) if os.path.isdir(d) else []
  return bool(names), f"checkpoints-damaged/: {names}"


@case("state", "newest checkpoint truncated", RECOVERED)
def _(ctx):
  work = _copy(ctx, "unsupervised")
  newest = _newest_step(work)
  _truncate_state(os.path.join(work, "checkpoints", str(newest)))
  return _resume(ctx, work, evidence=[
      ("warning: damaged checkpoint moved aside", _log_has("are damaged: moved to")),
      ("checkpoints-damaged/ holds it", _damaged_dir), ("training finished", _finished)])


@case("state", "newest checkpoint missing a file", RECOVERED)
def _(ctx):
  work = _copy(ctx, "unsupervised")
  newest = _newest_step(work)
  # The OCDBT manifest: without it the arrays cannot be found (state/_METADATA alone is
  # optional to Orbax, which restores without it).
  os.remove(os.path.join(work, "checkpoints", str(newest), "state", "manifest.ocdbt"))
  return _resume(ctx, work, evidence=[
      ("warning: damaged checkpoint moved aside", _log_has("are damaged: moved to")),
      ("checkpoints-damaged/ holds it", _damaged_dir), ("training finished", _finished)])


@case("state", "newest checkpoint's lineage copy disagrees", RECOVERED)
def _(ctx):
  work = _copy(ctx, "unsupervised")
  path = os.path.join(work, "checkpoints", str(_newest_step(work)), "_CHECKPOINT_METADATA")
  with open(path) as f:
    meta = json.load(f)
  meta["custom_metadata"]["seed"] = 12345
  with open(path, "w") as f:
    json.dump(meta, f)
  return _resume(ctx, work, evidence=[
      ("warning: damaged checkpoint moved aside", _log_has("are damaged: moved to")),
      ("checkpoints-damaged/ holds it", _damaged_dir), ("training finished", _finished)])


@case("state", "every checkpoint damaged", CLEAR)
def _(ctx):
  work = _copy(ctx, "unsupervised")
  for step_dir in glob.glob(os.path.join(work, "checkpoints", "*")):
    _truncate_state(step_dir)
  return _resume(ctx, work, error="--config.ckpt.if_all_damaged=start_fresh")


@case("state", "every checkpoint damaged, if_all_damaged=start_fresh", RECOVERED)
def _(ctx):
  work = _copy(ctx, "unsupervised")
  for step_dir in glob.glob(os.path.join(work, "checkpoints", "*")):
    _truncate_state(step_dir)
  return _resume(ctx, work, "--config.ckpt.if_all_damaged=start_fresh", evidence=[
      ("warning: damaged checkpoints moved aside", _log_has("are damaged: moved to")),
      ("checkpoints-damaged/ holds them", _damaged_dir), ("training finished", _finished)])


@case("state", "checkpoints deleted, lineage kept", CLEAR)
def _(ctx):
  work = _copy(ctx, "unsupervised")
  for step_dir in glob.glob(os.path.join(work, "checkpoints", "*")):
    shutil.rmtree(step_dir)
  return _resume(ctx, work, error="holds none of them")


@case("state", "lineage log record garbled (not JSON)", RECOVERED)
def _(ctx):
  work = _copy(ctx, "unsupervised")
  newest = _newest_step(work)
  lib.write(os.path.join(work, "lineage", "log", f"{newest:012d}"), b"\x00\x17{garbage")
  return _resume(ctx, work, evidence=[
      ("resumed from the previous committed step", _log_has("restored committed step")),
      ("not from the garbled one", lambda r: (f"restored committed step {newest} " not in r.log(),
                                              "")),
      ("training finished", _finished)])


@case("state", "lineage log record with wrong fields", RECOVERED)
def _(ctx):
  work = _copy(ctx, "unsupervised")
  newest = _newest_step(work)
  lib.write(os.path.join(work, "lineage", "log", f"{newest:012d}"),
            json.dumps({"global_step": "thirty", "epoch": -1}))
  return _resume(ctx, work, evidence=[
      ("resumed from the previous committed step", _log_has("restored committed step")),
      ("not from the damaged one", lambda r: (f"restored committed step {newest} " not in r.log(),
                                              "")),
      ("training finished", _finished)])


@case("state", "stray files in lineage/log", RECOVERED)
def _(ctx):
  work = _copy(ctx, "unsupervised")
  newest = _newest_step(work)
  lib.write(os.path.join(work, "lineage", "log", "README.txt"), "copied here by hand\n")
  lib.write(os.path.join(work, "lineage", "log", f"{newest + 1:012d}.tmp"), b"\x00" * 40)
  return _resume(ctx, work, evidence=[("resumed from the newest step", _restored(newest)),
                                      ("training finished", _finished)])


@case("state", "salt file truncated", CLEAR, quick=True)
def _(ctx):
  # A finished ingest is enough (quick); the ingest is run again, as a user fixing a table would.
  root = lib.cohort(ctx.path("cohort"))
  work = ctx.path("work")
  subprocess.run([sys.executable, "launch.py", *lib.ingest_argv(root, work)], cwd=lib.ROOT,
                 capture_output=True, check=True, timeout=120)
  salt = os.path.join(work, "secrets", "id_salt")
  with open(salt, "r+b") as f:
    f.truncate(5)
  return lib.Plan(argv=lib.ingest_argv(root, work), workdir=work, raw_ids=lib.IDS, cohort=root,
                  patient_ids=lib.IDS, error="the salt file is damaged")


@case("state", "salt file truncated (resuming a run)", ACCEPTED)
def _(ctx):
  # Resuming reuses the ingest, so the salt is not read: the run is unaffected, and the damage
  # is refused by the next ingest (the case above). Not reported here, but nothing depends on it.
  work = _copy(ctx, "unsupervised")
  with open(os.path.join(work, "secrets", "id_salt"), "r+b") as f:
    f.truncate(5)
  return _resume(ctx, work, checks=[("training finished", _finished)],
                 note="the salt is not read when resuming (the ingest is reused); the next "
                      "ingest refuses it")


@case("state", "cache chunk bytes corrupted", RECOVERED)
def _(ctx):
  work = _copy(ctx, "unsupervised")
  chunks = sorted(glob.glob(os.path.join(work, "cache", "host-0", "images", "*.0.0.0")))[:20]
  for path in chunks:
    with open(path, "r+b") as f:
      data = bytearray(f.read())
      for i in range(len(data) // 2, len(data)):
        data[i] ^= 0x5A
      f.seek(0)
      f.write(data)

  def damaged(run):
    n = run.summary().get("cache", {}).get("total", {}).get("damaged", 0)
    return n > 0, f"cache counters: damaged {n} (of {len(chunks)} chunks corrupted)"
  return _resume(ctx, work, evidence=[("counted as damaged and decoded again", damaged),
                                      ("training finished", _finished)])


@case("state", "cache index.json garbled", RECOVERED, quick=True)
def _(ctx):
  root = lib.cohort(ctx.path("cohort"))
  work = ctx.path("work")
  subprocess.run([sys.executable, "launch.py", *lib.ingest_argv(root, work)], cwd=lib.ROOT,
                 capture_output=True, check=True, timeout=120)
  lib.write(os.path.join(work, "cache", "host-0", "index.json"), b'{"r-0": [0, "x"')

  def rebuilt(run):   # (the case's own paths hold 'cache_index.json': match the warning itself)
    line = next((l for l in run.text.splitlines() + run.log().splitlines()
                 if "host-0/index.json is damaged" in l
                 and ("rebuilding" in l or "records are decoded again" in l)), None)
    return line is not None, (line or "no warning about the cache index")[-200:]

  def whole(run):
    try:
      with open(run.path("cache", "host-0", "index.json")) as f:
        n = len(json.load(f))
    except (OSError, ValueError) as e:
      return False, f"index.json still unreadable: {type(e).__name__}"
    return n == 10, f"index.json rebuilt with {n} records"
  return lib.Plan(argv=lib.ingest_argv(root, work), workdir=work, raw_ids=lib.IDS, cohort=root,
                  patients=10, patient_ids=lib.IDS,
                  evidence=[("a warning names the cache index", rebuilt),
                            ("the cache is whole again", whole)])


@case("state", "metrics.jsonl with a torn last line", RECOVERED)
def _(ctx):
  work = _copy(ctx, "unsupervised")
  with open(os.path.join(work, "metrics.jsonl"), "ab") as f:
    f.write(b'{"step": 31, "loss": 0.5')
  return _resume(ctx, work, evidence=[("training finished", _finished)])


@case("state", "ingest manifest truncated", CLEAR)
def _(ctx):
  work = _copy(ctx, "unsupervised")
  path = os.path.join(work, "ingest", "manifest.jsonl")
  with open(path, "r+b") as f:
    f.truncate(os.path.getsize(path) // 2)
  return _resume(ctx, work, error="manifest")


def _checkpoints_kept(steps: list[int]):
  """A check: the run's checkpoints still exist (in checkpoints/ or moved aside), not deleted."""
  def check(run):
    found = set()
    for d in glob.glob(run.path("checkpoints*")):
      found |= {int(n.split(".")[0]) for n in os.listdir(d) if n.split(".")[0].isdigit()}
    gone = sorted(set(steps) - found)
    return not gone, f"checkpoint steps {gone} deleted" if gone else f"kept {sorted(steps)}"
  return ("the trained checkpoints are kept", check)


def _steps(work: str) -> list[int]:
  return sorted(int(d) for d in os.listdir(os.path.join(work, "checkpoints")) if d.isdigit())


@case("state", "lineage store deleted, checkpoints kept", CLEAR)
def _(ctx):
  # Nothing is committed without the store, but three trained checkpoints are there: training
  # over them from step 0 (deleting them) on a lineage store that went missing is not a rule.
  work = _copy(ctx, "unsupervised")
  steps = _steps(work)
  shutil.rmtree(os.path.join(work, "lineage"))
  return _resume(ctx, work, error="lineage", checks=[_checkpoints_kept(steps)])


@case("state", "resume with ckpt.lineage_store mistyped", CLEAR)
def _(ctx):
  work = _copy(ctx, "unsupervised")
  steps = _steps(work)
  return _resume(ctx, work, f"--config.ckpt.lineage_store={os.path.join(work, 'lineage-typo')}",
                 error="lineage", checks=[_checkpoints_kept(steps)])


@case("state", "config.json garbled, then --role=agent", CLEAR, quick=True)
def _(ctx):
  work = ctx.path("work")
  lib.write(os.path.join(work, "config.json"), b'{"mode": "train", "data": {"batch_')
  return lib.Plan(argv=["--role=agent", f"--workdir={work}", "--coordinator=127.0.0.1:9"],
                  workdir=work, raw_ids=[], error="config.json", timeout=60)


@case("state", "supervised: coordinator state garbled", RECOVERED)
def _(ctx):
  work = _copy(ctx, "supervised")
  lib.write(os.path.join(work, "lineage", "state", "coordinator"), b"\x00\x01 not json")

  def event(run):
    e = next((e for e in run.events() if e.get("event") == "coordinator_state_damaged"), None)
    return e is not None, json.dumps(e)[:300] if e else "no coordinator_state_damaged event"
  return _resume(ctx, work, supervised=True, evidence=[
      ("event coordinator_state_damaged", event), ("training finished", _finished)])


@case("state", "supervised: events.jsonl with a torn last line", RECOVERED)
def _(ctx):
  work = _copy(ctx, "supervised")
  with open(os.path.join(work, "events.jsonl"), "ab") as f:
    f.write(b'{"time": 1795448251.99, "event": "comm')

  def summary(run):
    ft = run.summary().get("fault_tolerance")
    return ft is not None, f"fault_tolerance: {json.dumps(ft)[:200]}" if ft else "no summary"
  return _resume(ctx, work, supervised=True, evidence=[("summary with fault_tolerance", summary),
                                                       ("training finished", _finished)])


# -- network ------------------------------------------------------------------------------------

def _listeners(port: int) -> list[str]:
  return sorted({c.laddr.ip for c in psutil.net_connections("tcp")
                 if c.status == psutil.CONN_LISTEN and c.laddr.port == port})


def _wait(predicate, timeout: float):
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    value = predicate()
    if value:
      return value
    time.sleep(0.2)
  raise TimeoutError(f"timed out after {timeout:g} s")


def _garbage(port: int) -> list[str]:
  sent = []
  for name, payload in (("HTTP GET", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
                        ("4 KB of random bytes", os.urandom(4096)),
                        ("an HTTP/2 preface then junk", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
                         + os.urandom(512)), ("an empty connection", b"")):
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
      s.sendall(payload)
      time.sleep(0.05)
    sent.append(name)
  return sent


NETWORK_SUBCASES = ["garbage to the jax.distributed port", "garbage to the coordinator port",
                    "gRPC calls without the token", "authenticated calls with non-JSON bodies",
                    "both services listen on 127.0.0.1 only"]


def _probe(proc, run) -> dict:
  work = run.plan.workdir
  spec_path = os.path.join(work, "generations", "gen-001.json")
  _wait(lambda: os.path.exists(spec_path) and os.path.exists(
      os.path.join(work, "coordinator.json")), 240)
  time.sleep(0.5)
  with open(spec_path) as f:
    jax_port = int(json.load(f)["jax_address"].rsplit(":", 1)[1])
  with open(os.path.join(work, "coordinator.json")) as f:
    coordinator_port = int(json.load(f)["address"].rsplit(":", 1)[1])
  _wait(lambda: _listeners(jax_port), 240)
  out = {}
  binds = {"jax.distributed": _listeners(jax_port), "coordinator": _listeners(coordinator_port)}
  # gRPC listens on an IPv6 socket bound to the IPv4-mapped loopback (::ffff:127.0.0.1): still
  # 127.0.0.1 only. '::' or '0.0.0.0' would be every interface.
  loopback = {"127.0.0.1", "::ffff:127.0.0.1"}
  out[NETWORK_SUBCASES[4]] = [("listening addresses", all(v and set(v) <= loopback for v in
                                                          binds.values()), json.dumps(binds))]
  sent = _garbage(jax_port)
  out[NETWORK_SUBCASES[0]] = [("sent", True, f"port {jax_port}: " + ", ".join(sent))]
  sent = _garbage(coordinator_port)
  out[NETWORK_SUBCASES[1]] = [("sent", True, f"port {coordinator_port}: " + ", ".join(sent))]
  import grpc  # pylint: disable=import-outside-toplevel
  channel = grpc.insecure_channel(f"127.0.0.1:{coordinator_port}")
  codes = []
  for method, metadata in (("Status", None), ("Commit", (("authorization", "Bearer wrong"),))):
    call = channel.unary_unary(f"/medjax.Coordinator/{method}")
    try:
      call(b'{"generation": 1, "record": {}}', timeout=5, metadata=metadata)
      codes.append(f"{method}: accepted")
    except grpc.RpcError as e:
      codes.append(f"{method}: {e.code().name}")
  out[NETWORK_SUBCASES[2]] = [("rejected UNAUTHENTICATED",
                               all(c.endswith("UNAUTHENTICATED") for c in codes), "; ".join(codes))]
  with open(os.path.join(work, "secrets", "token")) as f:   # the run's own token, as a peer
    token = f.read().strip()
  codes = []
  for method in ("Status", "WorkerHeartbeat", "ReportExit"):
    call = channel.unary_unary(f"/medjax.Coordinator/{method}")
    try:
      call(b"\xff\x00 not json", timeout=5, metadata=(("authorization", f"Bearer {token}"),))
      codes.append(f"{method}: accepted")
    except grpc.RpcError as e:
      codes.append(f"{method}: {e.code().name}")
  channel.close()
  # (grpc's own deserialiser raises on them: INTERNAL, with a traceback in logs/coordinator.log.)
  out[NETWORK_SUBCASES[3]] = [("rejected, not crashed",
                               all(not c.endswith("accepted") and "UNAVAILABLE" not in c
                                   for c in codes), "; ".join(codes))]
  return out


@case("state", "a learning rate at which the loss diverges", CLEAR)
def _(ctx):
  # Found only once training runs: one line naming the step and what to change, and no restart
  # from the last good checkpoint, where the run would diverge again.
  work = ctx.path("work")

  def not_restarted(run):
    starts = [e for e in run.events() if e.get("event") == "generation_start"]
    return len(starts) == 1, f"{len(starts)} generation(s) started"
  return lib.Plan(argv=[lib.TINY, f"--workdir={work}", "--config.optim.lr=1e12"], workdir=work,
                  raw_ids=[], raw_ids_file=os.path.join(work, "cohort", "labels.csv"),
                  timeout=400, address_space_gb=None, error="non-finite loss",
                  checks=[("no restart after the divergence", not_restarted)])


@case("network", "stray connections to a supervised run", ACCEPTED)
def _(ctx):
  work = ctx.path("work")
  ctx.shared["supervised"] = work   # once finished, the base of the supervised state cases

  def no_failure(run):
    failures = [e for e in run.events() if e.get("event") == "failure"]
    ft = run.summary().get("fault_tolerance", {})
    return (not failures and ft.get("restarts") == 0,
            f"{len(failures)} failure events, restarts {ft.get('restarts')}")
  return lib.Plan(argv=[lib.TINY, f"--workdir={work}"], workdir=work, raw_ids=[],
                  raw_ids_file=os.path.join(work, "cohort", "labels.csv"), timeout=400,
                  address_space_gb=None, during=_probe, subcases=NETWORK_SUBCASES,
                  checks=[("the run finished with no failure event", no_failure),
                          ("training finished", _finished)])


# -- issue 32: state files of another shape (valid JSON, wrong field types) ---------------------

def _edit_json(path: str, change) -> None:
  """Rewrites the JSON file at `path` with `change(value)` applied (valid JSON, another shape)."""
  with open(path) as f:
    value = json.load(f)
  value = change(value) or value
  with open(path, "w") as f:
    json.dump(value, f)


def _set(**fields):
  return lambda d: d.update(fields)


def _coordinator_event(field: str):
  def check(run):
    e = next((e for e in run.events() if e.get("event") == "coordinator_state_damaged"), None)
    if e is None:
      return False, "no coordinator_state_damaged event"
    return field in str(e.get("error")), json.dumps(e)[:300]
  return check


@case("state", "supervised: coordinator state with generation as a string", RECOVERED)
def _(ctx):
  work = _copy(ctx, "supervised")
  path = os.path.join(work, "lineage", "state", "coordinator")
  _edit_json(path, lambda s: s.update(generation=str(s["generation"])))
  return _resume(ctx, work, supervised=True, evidence=[
      ("event coordinator_state_damaged naming 'generation'", _coordinator_event("generation")),
      ("training finished", _finished)])


@case("state", "supervised: coordinator state whose spec has num_processes '1'", RECOVERED)
def _(ctx):
  work = _copy(ctx, "supervised")
  path = os.path.join(work, "lineage", "state", "coordinator")

  def change(s):
    if isinstance(s.get("spec"), dict):
      s["spec"]["num_processes"] = str(s["spec"]["num_processes"])
    else:   # (a finished run may hold no spec: its failures list then)
      s["failures"] = [{"kind": "crash", "step": "5"}]
  _edit_json(path, change)
  return _resume(ctx, work, supervised=True, evidence=[
      ("event coordinator_state_damaged naming the field", _coordinator_event("field")),
      ("training finished", _finished)])


def _newest_record(work: str) -> str:
  return os.path.join(work, "lineage", "log", f"{_newest_step(work):012d}")


def _skips_newest(work: str, change, what: str):
  """A resumed copy whose newest lineage record got `change`: resumed from the previous
  committed step, not the damaged one."""
  newest = _newest_step(work)
  _edit_json(_newest_record(work), change)
  return [("resumed from the previous committed step", _log_has("restored committed step")),
          (f"not from the record with {what}",
           lambda r: (f"restored committed step {newest} " not in r.log(), "")),
          ("training finished", _finished)]


@case("state", "lineage record: global_step as a string", RECOVERED)
def _(ctx):
  work = _copy(ctx, "unsupervised")
  return _resume(ctx, work, evidence=_skips_newest(
      work, lambda d: d.update(global_step=str(d["global_step"])), "global_step '30'"))


@case("state", "lineage record: processed bitmap as a number", RECOVERED)
def _(ctx):
  work = _copy(ctx, "unsupervised")
  return _resume(ctx, work, evidence=_skips_newest(work, _set(processed=12345),
                                                   "processed 12345"))


@case("state", "lineage record: segment.hosts as a string", RECOVERED)
def _(ctx):
  work = _copy(ctx, "unsupervised")
  return _resume(ctx, work, evidence=_skips_newest(
      work, lambda d: d["segment"].update(hosts="host-0"), "hosts 'host-0'"))


@case("state", "lineage record: epoch 2.0 (a float)", RECOVERED)
def _(ctx):
  work = _copy(ctx, "unsupervised")
  return _resume(ctx, work, evidence=_skips_newest(
      work, lambda d: d.update(epoch=float(d["epoch"])), "epoch as a float"))


@case("state", "lineage state 'records' with count as a string", CLEAR)
def _(ctx):
  work = _copy(ctx, "unsupervised")
  _edit_json(os.path.join(work, "lineage", "state", "records"),
             lambda d: d.update(count=str(d["count"])))
  return _resume(ctx, work, error="count")


@case("state", "lineage state 'snapshots' with a number as the run id", CLEAR)
def _(ctx):
  work = _copy(ctx, "unsupervised")
  _edit_json(os.path.join(work, "lineage", "state", "snapshots"), _set(run=5))
  return _resume(ctx, work, error="snapshots")


@case("state", "ingest manifest row with label '3' (a string)", CLEAR)
def _(ctx):
  work = _copy(ctx, "unsupervised")
  path = os.path.join(work, "ingest", "manifest.jsonl")
  with open(path) as f:
    lines = f.read().splitlines()
  row = json.loads(lines[3])
  row["label"] = str(row["label"])
  lines[3] = json.dumps(row)
  lib.write(path, "\n".join(lines) + "\n")
  return _resume(ctx, work, error="manifest.jsonl is damaged")


@case("state", "ingest manifest row with image_files as a string", CLEAR)
def _(ctx):
  work = _copy(ctx, "unsupervised")
  path = os.path.join(work, "ingest", "manifest.jsonl")
  with open(path) as f:
    lines = f.read().splitlines()
  i = next(i for i, l in enumerate(lines[1:], 1) if json.loads(l).get("image_files"))
  row = json.loads(lines[i])
  row["image_files"] = row["image_files"][0]
  lines[i] = json.dumps(row)
  lib.write(path, "\n".join(lines) + "\n")
  return _resume(ctx, work, error="manifest.jsonl is damaged")


@case("state", "ingest summary.json with patients as a string", CLEAR)
def _(ctx):
  work = _copy(ctx, "unsupervised")
  _edit_json(os.path.join(work, "ingest", "summary.json"),
             lambda d: d.update(patients=str(d["patients"])))
  return _resume(ctx, work, error="summary.json is damaged")


def _ingested_twice(ctx, damage) -> tuple[str, str]:
  """The base cohort ingested once, then `damage(work)`: the plan ingests it again."""
  root = lib.cohort(ctx.path("cohort"))
  work = ctx.path("work")
  subprocess.run([sys.executable, "launch.py", *lib.ingest_argv(root, work)], cwd=lib.ROOT,
                 capture_output=True, check=True, timeout=120)
  damage(work)
  return root, work


def _warned(*words: str):
  """Evidence: a warning (stdout, stderr or the log) holding every one of `words`."""
  def check(run):
    line = next((l for l in run.text.splitlines() + run.log().splitlines()
                 if all(w in l for w in words)), None)
    return line is not None, (line or f"no warning with {words}")[-250:]
  return check


def _counters(work: str) -> str:
  return os.path.join(work, "cache", "host-0", "counters.0.json")


@case("state", "cache counters with hits as a string", RECOVERED)
def _(ctx):
  root, work = _ingested_twice(ctx, lambda w: _edit_json(
      _counters(w), lambda d: d.update(hits=str(d.get("hits", 0)))))
  return lib.Plan(argv=lib.ingest_argv(root, work), workdir=work, raw_ids=lib.IDS, cohort=root,
                  patients=10, patient_ids=lib.IDS, evidence=[
                      ("a warning names the counters and the field",
                       _warned("counters.0.json is damaged", "hits"))])


@case("state", "cache counters with a negative count and a numeric run", RECOVERED)
def _(ctx):
  root, work = _ingested_twice(ctx, lambda w: _edit_json(_counters(w), _set(misses=-5, run=7)))
  return lib.Plan(argv=lib.ingest_argv(root, work), workdir=work, raw_ids=lib.IDS, cohort=root,
                  patients=10, patient_ids=lib.IDS, evidence=[
                      ("a warning names the counters", _warned("counters.0.json is damaged"))])


def _index_whole(run):
  try:
    with open(run.path("cache", "host-0", "index.json")) as f:
      n = len(json.load(f))
  except (OSError, ValueError) as e:
    return False, f"index.json unreadable: {type(e).__name__}"
  return n == 10, f"index.json rebuilt with {n} records"


@case("state", "cache index.json entry with a number as the fingerprint", RECOVERED)
def _(ctx):
  def damage(work):
    _edit_json(os.path.join(work, "cache", "host-0", "index.json"),
               lambda d: {k: [v[0], 5, v[2]] for k, v in d.items()})
  root, work = _ingested_twice(ctx, damage)
  return lib.Plan(argv=lib.ingest_argv(root, work), workdir=work, raw_ids=lib.IDS, cohort=root,
                  patients=10, patient_ids=lib.IDS, evidence=[
                      ("a warning names the cache index", _warned("index.json is damaged")),
                      ("the cache is whole again", _index_whole)])


@case("state", "cache index.json entry with the slot as a string", RECOVERED)
def _(ctx):
  def damage(work):
    _edit_json(os.path.join(work, "cache", "host-0", "index.json"),
               lambda d: {k: [str(v[0]), v[1], v[2]] for k, v in d.items()})
  root, work = _ingested_twice(ctx, damage)
  return lib.Plan(argv=lib.ingest_argv(root, work), workdir=work, raw_ids=lib.IDS, cohort=root,
                  patients=10, patient_ids=lib.IDS, evidence=[
                      ("a warning names the cache index", _warned("index.json is damaged")),
                      ("the cache is whole again", _index_whole)])


# -- the salt file must be exactly 32 bytes -----------------------------------------------------

def _salted(ctx, data: bytes, *, configured: bool = False) -> lib.Plan:
  """An ingest of the base cohort into a workdir whose salt file (or config.data.salt_file)
  holds `data`."""
  root = lib.cohort(ctx.path("cohort"))
  work = ctx.path("work")
  salt = ctx.path("my_salt") if configured else os.path.join(work, "secrets", "id_salt")
  lib.write(salt, data)
  os.chmod(salt, 0o600)
  extra = [f"--config.data.salt_file={salt}"] if configured else []
  return lib.Plan(argv=lib.ingest_argv(root, work, *extra), workdir=work, raw_ids=lib.IDS,
                  cohort=root, patient_ids=lib.IDS,
                  error=f"{salt}: the salt file is damaged ({len(data)} bytes, expected 32)")


_SALT = bytes(range(7, 7 + 32))


@case("state", "salt file of 0 bytes (a disk that filled up)", CLEAR)
def _(ctx):
  return _salted(ctx, b"")


@case("state", "salt file of 16 bytes (another tool's salt)", CLEAR)
def _(ctx):
  return _salted(ctx, _SALT[:16])


@case("state", "salt file of 31 bytes (one short)", CLEAR)
def _(ctx):
  return _salted(ctx, _SALT[:31])


@case("state", "salt file of 33 bytes (a trailing newline)", CLEAR, quick=True)
def _(ctx):
  return _salted(ctx, _SALT + b"\n")


@case("state", "salt file of 64 bytes (the salt written as hex text)", CLEAR)
def _(ctx):
  return _salted(ctx, _SALT.hex().encode())


@case("state", "data.salt_file of 33 bytes (32 hex characters and a newline)", CLEAR)
def _(ctx):
  return _salted(ctx, _SALT[:16].hex().encode() + b"\n", configured=True)
