"""Issue 11's "Show" table: every class of bad input, tried as a new user would, with its outcome.

  python -m tests.acceptance.bad_inputs [--quick] [--only CLASS] [--results DIR] [--keep]

(from the repository root). Each case (cases_config.py, cases_tables.py (tables and PHI),
cases_dicom.py, cases_state.py (damaged run state and the network), beside this file) writes one
malformed, hostile or damaged input; this runner runs the real command line (`python launch.py
...`, a subprocess with a timeout, an RSS watchdog and, for ingest runs, an address-space limit)
and judge.py judges the outcome by these rules:

- clear error: exit 2, stderr's last non-empty line starts with `error: `, no `Traceback`
  anywhere in stdout/stderr (one case passes --debug on purpose and must get the traceback);
- quarantined: exit 0, the bad file or row in `<workdir>/ingest/quarantine.jsonl` (scan, link,
  tables) or `<workdir>/cache/*/decode_quarantine.jsonl` (decode) with its reason, and the rest
  of the cohort ingested (the manifest's patient count as expected);
- recovered: exit 0 with the damaged-state rule's event or warning;
- accepted: exit 0 with nothing to set aside (a valid input in an unusual form, or a stray
  connection that cost nothing);
- failures: a traceback, an internal error (exit 1), a hang (timeout), an abort (killed by a
  signal, 134, 139), a crash loop (> 5 coordinator restarts or generations), runaway memory
  (the watchdog killed the run), a silent loss, a raw id (any raw PatientID of the case's
  cohort in stdout, stderr or any file the run wrote outside cohort/ and secrets/, searched as
  bytes in UTF-8, UTF-16 and UTF-32 (numpy's strings), ignoring case), a process outliving its
  run.

A silent loss is an ingest (exit 0) that does not account for everything its cohort holds,
counted from the run's outputs, independently of medjax's own accounting: every patient id the
case wrote (Plan.patient_ids: a table row's id, set aside or not, or a DICOM PatientID) must be
in the manifest (as its pseudonym, computed from the run's salt file with
medjax.data.ingest.pseudonym after stripping, NFC and, with data.ids_case_insensitive,
casefolding) or in a quarantine patient entry ({"path": "", "patient": <pseudonym>, ...}); every
file under the cohort root (symlinks and special files included) must be in the manifest, in
the quarantine report (itself or a folder above it) or be a table ingest reads (labels.csv,
labs.csv, vitals.csv, oracle.npz); and labels.csv's data lines must equal the manifest's
patients plus its quarantined lines. Every ingest is also checked for a finite tables.npz and
summary.json's "accounting" block. Cases about files the process may not read run launch.py
through `setpriv` without root's override of permission bits when the battery runs as root.

A case passes when its outcome is the expected one and every check holds; the battery exits 1
if any case fails. Writes experiments/results/bad_inputs.json (every case: class, name, command,
exit code, seconds, stderr's last line, outcome, checks) and bad_inputs.md (a table per class and
a summary table). --quick runs a few cases of each class (the network class needs a supervised
training run, so it has no quick case); --quick and --only write bad_inputs_quick.* /
bad_inputs_<CLASS>.* instead.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import psutil

# The case modules register their cases on import.
from tests import runs
from tests.acceptance import cases_config  # pylint: disable=unused-import
from tests.acceptance import cases_dicom  # pylint: disable=unused-import
from tests.acceptance import cases_state  # pylint: disable=unused-import
from tests.acceptance import cases_tables  # pylint: disable=unused-import
from tests.acceptance import judge as judging
from tests.acceptance import lib
from tests.acceptance.lib import Run

RESULTS = os.path.join(lib.ROOT, "experiments", "results")
LEFTOVER_GRACE_S = 5.0        # a run's processes must be gone this soon after it exits


# -- running ------------------------------------------------------------------------------------

def _env(plan: lib.Plan) -> dict:
  env = runs.env()     # a test's fake devices are not the user's
  env.pop("MEDJAX_DEBUG", None)
  env["PYTHONUNBUFFERED"] = "1"
  env.update(plan.env)
  return env


def _tree(pid: int) -> list[psutil.Process]:
  try:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]
  except psutil.Error:
    return []


def _rss(procs: list[psutil.Process]) -> int:
  total = 0
  for p in procs:
    try:
      total += p.memory_info().rss
    except psutil.Error:
      pass
  return total


def _group(pgid: int) -> list[str]:
  """Live (non-zombie) processes of process group `pgid`, as 'pid cmdline'."""
  alive = []
  for p in psutil.process_iter(["pid", "cmdline", "status"]):
    try:
      if os.getpgid(p.info["pid"]) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
        alive.append(f"{p.info['pid']} {' '.join((p.info['cmdline'] or [])[:6])}")
    except (OSError, psutil.Error):
      pass
  return alive


def launch(plan: lib.Plan) -> Run:
  """Runs launch.py with the plan's arguments; a watchdog enforces the timeout and RSS limit."""
  def limits():
    if plan.address_space_gb:
      size = int(plan.address_space_gb * (1 << 30))
      resource.setrlimit(resource.RLIMIT_AS, (size, size))
  t0 = time.monotonic()
  proc = subprocess.Popen([*plan.prefix, sys.executable, "launch.py", *plan.argv], cwd=lib.ROOT,
                          env=_env(plan), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=limits)
  out: dict[str, list[bytes]] = {"stdout": [], "stderr": []}
  error_at: list[float] = []

  def pump(stream, name):
    for line in iter(stream.readline, b""):
      if name == "stderr" and line.startswith(b"error: ") and not error_at:
        error_at.append(time.monotonic() - t0)
      out[name].append(line)
  readers = [threading.Thread(target=pump, args=(proc.stdout, "stdout"), daemon=True),
             threading.Thread(target=pump, args=(proc.stderr, "stderr"), daemon=True)]
  for t in readers:
    t.start()
  run = Run(plan, None, 0.0, b"", b"")
  side = None
  if plan.during is not None:
    def beside():
      try:
        run.sub = plan.during(proc, run)
      except Exception as e:  # pylint: disable=broad-except  (a broken probe fails its subcases)
        run.sub = {s: [("probe ran", False, f"{type(e).__name__}: {e}")] for s in plan.subcases}
    side = threading.Thread(target=beside, daemon=True)
    side.start()
  procs, last_scan = _tree(proc.pid), 0.0
  while proc.poll() is None:
    now = time.monotonic()
    if now - t0 > plan.timeout:
      run.timed_out = True
      break
    if now - last_scan > 1.0:
      procs, last_scan = _tree(proc.pid), now
    if _rss(procs) > judging.RSS_LIMIT:
      run.runaway = True
      break
    time.sleep(0.1)
  if run.timed_out or run.runaway:
    _kill_group(proc.pid)
  rc = proc.wait()
  run.seconds = time.monotonic() - t0
  if plan.after is not None:
    plan.after()
  for t in readers:
    t.join(timeout=10)
  if side is not None:
    side.join(timeout=60)
  deadline = time.monotonic() + LEFTOVER_GRACE_S
  while True:
    run.leftover = _group(proc.pid)
    if not run.leftover or time.monotonic() > deadline:
      break
    time.sleep(0.2)
  _kill_group(proc.pid)
  run.rc = rc
  run.stdout, run.stderr = b"".join(out["stdout"]), b"".join(out["stderr"])
  run.error_after_s = error_at[0] if error_at else None
  return run


def _kill_group(pgid: int) -> None:
  try:
    os.killpg(pgid, signal.SIGKILL)
  except (ProcessLookupError, PermissionError):
    pass


# -- main ---------------------------------------------------------------------------------------

def _version() -> dict:
  """The medjax commit the battery ran against, and its files changed since (a tree in flux)."""
  def git(*args):
    done = subprocess.run(["git", *args], cwd=lib.ROOT, capture_output=True, text=True,
                          check=False)
    return done.stdout.strip() if done.returncode == 0 else None
  changed = git("status", "--porcelain", "--", "medjax", "launch.py", "configs")
  return {"commit": git("rev-parse", "--short", "HEAD"),
          "uncommitted": changed.splitlines() if changed else []}


def select(quick: bool, only: str | None) -> list[lib.Case]:
  order = {c: i for i, c in enumerate(("config", "tables", "dicom", "phi", "network", "state"))}
  cases = [c for c in lib.CASES if (not quick or c.quick) and (only is None or c.cls == only)]
  return sorted(cases, key=lambda c: order[c.cls])   # stable: registration order within a class


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--quick", action="store_true", help="a few cases of each class")
  parser.add_argument("--only", choices=lib.CLASSES, help="one class of cases")
  parser.add_argument("--name", help="only cases whose name contains this")
  parser.add_argument("--results", default=RESULTS, help="where to write the JSON and table")
  parser.add_argument("--scratch", default=None, help="work directory (default: a new temp dir)")
  parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
  parser.add_argument("--list", action="store_true", help="list the cases and exit")
  args = parser.parse_args(argv)
  cases = select(args.quick, args.only)
  if args.name:
    cases = [c for c in cases if args.name in c.name]
  if args.list:
    for c in cases:
      print(f"{c.cls:8s} {c.name:45s} expect {c.expect}{'  (quick)' if c.quick else ''}")
    return 0
  scratch = args.scratch or tempfile.mkdtemp(prefix="medjax-bad-inputs-")
  os.makedirs(scratch, exist_ok=True)
  shared = {"scratch": scratch}
  records = []
  t0 = time.monotonic()
  print(f"bad inputs: {len(cases)} cases, scratch {scratch}", flush=True)
  for i, c in enumerate(cases, 1):
    d = os.path.join(scratch, c.cls, re.sub(r"[^A-Za-z0-9_.-]+", "_", c.name))
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    t_case = time.monotonic()
    try:
      plan = c.build(lib.Ctx(d, shared))
    except Exception as e:  # pylint: disable=broad-except  (a case that cannot be built fails)
      import traceback as tb  # pylint: disable=import-outside-toplevel
      tb.print_exc()
      records.append({"class": c.cls, "name": c.name, "expect": c.expect, "outcome": "not built",
                      "ok": False, "command": "", "exit_code": None, "seconds": 0,
                      "error_after_s": None, "stderr_last_line": "", "note": "",
                      "shown": f"{type(e).__name__}: {e}", "flags": [], "checks": []})
      print(f"[{i:3d}/{len(cases)}] {c.cls}/{c.name}: NOT BUILT ({type(e).__name__}: {e})",
            flush=True)
      continue
    run = launch(plan)
    with open(os.path.join(d, "stdout.txt"), "wb") as f:
      f.write(run.stdout)
    with open(os.path.join(d, "stderr.txt"), "wb") as f:
      f.write(run.stderr)
    for record in judging.judge(c, run):
      records.append(record)
      status = "ok" if record["ok"] else "NOT AS EXPECTED"
      print(f"[{i:3d}/{len(cases)}] {c.cls}/{record['name']}: {record['outcome']} "
            f"(exit {record['exit_code']}, {time.monotonic() - t_case:.1f} s) {status}"
            + ("" if record["ok"] else f"\n      expected {c.expect}; "
               + "; ".join(f"{k['name']}: {k['detail']}" for k in record["checks"]
                           if not k["ok"])[:800]
               + f"\n      last line: {record['stderr_last_line'][:400]}"), flush=True)
  seconds = time.monotonic() - t0
  summary = judging.summarise(records)
  failed = sum(not r["ok"] for r in records)
  meta = {"command": "python -m tests.acceptance.bad_inputs" + (" --quick" if args.quick else "")
          + (f" --only {args.only}" if args.only else "")
          + (f" --name {args.name}" if args.name else ""),
          "date": time.strftime("%Y-%m-%d %H:%M"), "seconds": round(seconds, 1),
          "cases": len(records), "failed": failed, "cpus": os.cpu_count(),
          "rss_limit_gib": judging.RSS_LIMIT >> 30, **_version(),
          "load_average_at_end": [round(x, 2) for x in os.getloadavg()]}
  stem = "bad_inputs" + ("_quick" if args.quick else "") + (f"_{args.only}" if args.only else "")
  if args.name:
    stem += "_subset"
  os.makedirs(args.results, exist_ok=True)
  with open(os.path.join(args.results, stem + ".json"), "w") as f:
    json.dump({"meta": meta, "summary": summary, "cases": records}, f, indent=1)
  with open(os.path.join(args.results, stem + ".md"), "w") as f:
    f.write(judging.markdown(records, summary, meta))
  print()
  cols = [c for c, _ in judging.SUMMARY_COLUMNS]
  print(f"{'class':8s} " + " ".join(f"{c[:9]:>9s}" for c in cols))
  for row in summary:
    print(f"{row['class']:8s} " + " ".join(f"{row[c]:>9d}" for c in cols))
  print(f"\n{len(records)} cases in {seconds:.0f} s; {failed} not as expected; results in "
        f"{os.path.join(args.results, stem)}.{{json,md}}")
  if not args.keep and not args.scratch:
    shutil.rmtree(scratch, ignore_errors=True)
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())

