"""Judging a finished run of a bad-input case, and the battery's report (see bad_inputs.py)."""

from __future__ import annotations

import os
import re
import unicodedata

import numpy as np

from tests.acceptance import lib
from tests.acceptance.lib import Run

CRASH_LOOP = 5                # more coordinator restarts (or generations) than this
RSS_LIMIT = 4 << 30           # the runner's watchdog kills a run whose process tree holds more


def raw_id_leaks(run: Run) -> list[str]:
  """Where any raw id of the case shows up: stdout, stderr, or a file the run wrote."""
  raw = list(run.plan.raw_ids)
  if run.plan.raw_ids_file and os.path.exists(run.plan.raw_ids_file):
    with open(run.plan.raw_ids_file, encoding="utf-8", errors="replace") as f:
      raw += [line.split(",")[0] for line in f.read().splitlines()[1:]]
  ids = sorted({i.strip().lower() for i in raw if i.strip()}, key=len, reverse=True)
  if not ids:
    return []
  # As UTF-8, and as the UTF-16 and UTF-32 that numpy's string arrays (an .npz) and some
  # writers store text in: an id in tables.npz is b"p\0\0\0t\0\0\0...".
  # (One pattern per encoding: the ids' common prefix keeps each search fast.)
  # As UTF-8 not inside a longer run of letters and digits: a hash's hex ('...c97001a4...') or
  # a file size does not hold the id '7001'; a cell, a JSON string or a file name does.
  patterns = [re.compile((b"(?<![0-9a-z])(?:%s)(?![0-9a-z])" if encoding == "utf-8" else b"%s")
                         % b"|".join(re.escape(i.encode(encoding)) for i in ids))
              for encoding in ("utf-8", "utf-16-le", "utf-32-le")]

  def search(data: bytes) -> str | None:
    data = data.lower()
    for pattern in patterns:
      m = pattern.search(data)
      if m:
        return repr(m.group().replace(b"\0", b"").decode(errors="replace"))
    return None
  found = []
  for name, data in (("stdout", run.stdout), ("stderr", run.stderr)):
    m = search(data)
    if m:
      found.append(f"{name}: {m}")
  workdir = run.plan.workdir
  skip = {os.path.join(workdir, "cohort"), os.path.join(workdir, "secrets")}
  for dirpath, dirnames, files in os.walk(workdir):
    dirnames[:] = [d for d in dirnames if os.path.join(dirpath, d) not in skip]
    for name in files:
      path = os.path.join(dirpath, name)
      if os.path.islink(path) or not os.path.isfile(path):
        continue
      try:
        with open(path, "rb") as f:
          data = f.read(512 << 20)
      except OSError:
        continue
      m = search(data)
      if m:
        found.append(f"{os.path.relpath(path, workdir)}: {m}")
  return found


def labels_data_lines(path: str) -> int:
  """Data lines of a labels.csv, counted independently of medjax: after the first non-blank
  line (the header; after Excel's 'sep=,' line where one comes first), every line holding more
  than spaces, tabs and delimiters."""
  with open(path, "rb") as f:
    raw = f.read()
  if raw[:2] in (b"\xff\xfe", b"\xfe\xff"):
    text = raw.decode("utf-16", "replace")
  else:
    text = raw.decode("utf-8", "replace").lstrip("\ufeff")
  lines = re.split(r"\r\n|\r|\n", text)
  if lines and lines[-1] == "":
    lines.pop()
  body = [l for l in lines if l.strip(" \t,;|")]
  if body and re.fullmatch(r'\s*"?sep=.\s*"?\s*', body[0], re.IGNORECASE):
    body = body[1:]
  return max(0, len(body) - 1)


def dicom_entries(root: str) -> set[str]:
  """Every entry under root/dicom a user would count as a file (see `cohort_files`)."""
  return {f for f in cohort_files(root) if f.split(os.sep)[0] == "dicom"}


def cohort_files(root: str) -> set[str]:
  """Every entry under the cohort root a user would count as a file: regular and special files
  and symlinks (to anything, directories included), relative to the root. Walked as the battery
  runs (root reads folders the run may not: `conservation` counts their files as accounted for
  by the folder's quarantine entry)."""
  out = set()
  if not os.path.isdir(root):
    return out
  for dirpath, dirnames, files in os.walk(root, followlinks=False):
    for name in files + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
      out.add(os.path.relpath(os.path.join(dirpath, name), root))
  return out


# The tables ingest reads at the cohort root (medjax/data/accounting.py says the same, but the
# judge counts on its own: the docs' layout).
TABLES = ("labels.csv", "labs.csv", "vitals.csv", "oracle.npz")


def normalised(raw: str, fold: bool) -> str:
  """A raw id as ingest joins it (docs/data.md, Ids): stripped, Unicode NFC, casefolded when
  data.ids_case_insensitive."""
  text = unicodedata.normalize("NFC", raw.strip())
  return text.casefold() if fold else text


def pseudonymiser(plan: lib.Plan):
  """raw id -> the record id ingest gives it (its salted hash), from the run's salt file; None
  without a readable salt."""
  try:
    with open(plan.salt_file, "rb") as f:
      salt = f.read()
  except OSError:
    return None
  from medjax.data import ingest  # pylint: disable=import-outside-toplevel  (pandas, no jax)
  fold = plan.ids_case_insensitive
  return lambda raw: ingest.pseudonym(normalised(raw, fold), salt)


def _matches(entry: dict, q: lib.Quarantined, pseudonym=None) -> bool:
  reason = str(entry.get("reason") or "")
  if q.patient is not None and (pseudonym is None
                                or entry.get("patient") != pseudonym(q.patient)):
    return False
  return (entry.get("path") == q.path and reason.strip() and q.reason in reason
          and (q.line is None or entry.get("line") == q.line)
          and (q.stage is None or entry.get("stage") == q.stage))


def conservation(run: Run, manifest: list[dict], pseudonym) -> tuple[list, bool]:
  """Nothing disappears (DESIGN.md, docs/data.md): every patient the case wrote is in the
  manifest (by pseudonym) or in a quarantine patient entry, and every file under the cohort
  root is in the manifest, the quarantine report (itself, or a folder above it) or the tables
  read. Returns (checks, silent loss)."""
  plan = run.plan
  checks, silent = [], False
  entries = run.quarantine()
  if plan.patient_ids is not None:
    if pseudonym is None:
      checks.append(("every patient in the manifest or quarantined", False,
                     f"no salt to compute pseudonyms from ({plan.salt_file})"))
      silent = True
    else:
      raw = sorted({r for r in plan.patient_ids if normalised(r, plan.ids_case_insensitive)})
      ids = {pseudonym(r): r for r in raw}
      in_manifest = {r.get("id") for r in manifest}
      quarantined = {e.get("patient") for e in entries if e.get("patient")}
      lost = sorted(p for p in ids if p not in in_manifest and p not in quarantined)
      twice = sorted(p for p in ids if p in in_manifest and p in quarantined)
      silent |= bool(lost)
      checks.append(("every patient in the manifest or quarantined", not lost,
                     f"{len(ids)} patients written, {len(set(ids) & in_manifest)} in the manifest,"
                     f" {len(set(ids) & quarantined)} in quarantine patient entries"
                     + (f"; unaccounted: {lost[:5]}" if lost else "")))
      checks.append(("no patient both in the manifest and quarantined", not twice,
                     f"both: {twice[:5]}" if twice else ""))
  disk = cohort_files(plan.cohort)
  referenced = {f for r in manifest for f in r.get("image_files", [])}
  named = {str(e["path"]).rstrip("/") for e in entries + run.decode_quarantine()
           if e.get("path") and "line" not in e}
  folders = tuple(n + os.sep for n in named)
  # A table's gzip (labs.csv.gz), else its zip, is read where the table itself is not there.
  tables = {next((n for n in (f, f + ".gz", f + ".zip") if n in disk), f) for f in TABLES} & disk
  lost = sorted(f for f in disk if f not in referenced and f not in named and f not in tables
                and not f.startswith(folders))
  silent |= bool(lost)
  checks.append(("every file under the cohort root in the manifest, quarantined or a table",
                 not lost, f"{len(disk)} files: {len(disk & referenced)} in the manifest, "
                 f"{len(disk & named) + sum(f.startswith(folders) for f in disk - named)} "
                 f"quarantined, {len(tables)} tables"
                 + (f"; unaccounted: {lost[:5]}" if lost else "")))
  return checks, silent


def tables_finite(run: Run) -> tuple[bool, str]:
  """tables.npz holds no infinity or NaN (a missing value is a mask's False over a 0)."""
  try:
    with np.load(run.path("ingest", "tables.npz"), allow_pickle=False) as f:
      bad = [k for k in f.files if f[k].dtype.kind == "f" and not np.isfinite(f[k]).all()]
  except (OSError, ValueError) as e:
    return False, f"tables.npz unreadable: {type(e).__name__}"
  return not bad, f"non-finite values in {bad}" if bad else "all finite"


def judge(case: lib.Case, run: Run) -> list[dict]:
  """The case's record(s): outcome, checks, failures (one record per subcase, if any)."""
  plan = run.plan
  checks: list[tuple[str, bool, str]] = []
  text = run.text
  traceback = "Traceback" in text
  events = run.events()
  restarts = sum(1 for e in events if e.get("event") == "coordinator_restarted")
  generations = sum(1 for e in events if e.get("event") == "generation_start")
  crash_loop = restarts > CRASH_LOOP or generations > CRASH_LOOP + 1
  found_q, missing_q = [], []
  entries = run.quarantine() + run.decode_quarantine()
  pseudonym = pseudonymiser(plan) if plan.cohort else None
  for q in plan.quarantined:
    hit = next((e for e in entries if _matches(e, q, pseudonym)), None)
    (found_q if hit else missing_q).append((q, hit))
  evidence = []
  for name, fn in plan.evidence:
    try:
      ok, detail = fn(run)
    except Exception as e:  # pylint: disable=broad-except
      ok, detail = False, f"{type(e).__name__}: {e}"
    evidence.append((name, bool(ok), detail))

  if run.timed_out:
    outcome = lib.HANG
  elif run.runaway:
    outcome = lib.RUNAWAY
  elif run.rc is not None and (run.rc < 0 or run.rc in (134, 137, 139)):
    outcome = lib.ABORT
  elif crash_loop:
    outcome = lib.CRASH_LOOP
  elif traceback:
    outcome = lib.DEBUG_TRACEBACK if plan.debug else lib.TRACEBACK
  elif run.rc == 2 and run.last_line.startswith("error: "):
    outcome = lib.CLEAR
  elif run.rc == 1 and run.last_line.startswith("error: internal error"):
    outcome = lib.INTERNAL
  elif run.rc == 0:
    if plan.quarantined and not missing_q:
      outcome = lib.QUARANTINED
    elif plan.evidence and all(ok for _, ok, _ in evidence):
      outcome = lib.RECOVERED
    else:
      outcome = lib.ACCEPTED
  else:
    outcome = lib.OTHER

  # What every run must satisfy.
  if not plan.debug:
    checks.append(("no traceback in stdout/stderr", not traceback,
                   "" if not traceback else _around(text, "Traceback")))
  checks.append(("no process outlives the run", not run.leftover, "; ".join(run.leftover)[:300]))
  leaks = raw_id_leaks(run)
  checks.append(("no raw id in outputs", not leaks, "; ".join(leaks)[:300]))
  checks.append(("no crash loop", not crash_loop,
                 f"{restarts} coordinator restarts, {generations} generations"))
  # What the expected outcome needs.
  if case.expect == lib.CLEAR and plan.error:
    checks.append((f"error line names {plan.error!r}", plan.error in run.last_line,
                   run.last_line[:300]))
  if plan.error_within_s is not None:
    t = run.error_after_s
    checks.append((f"error line within {plan.error_within_s:g} s of launch",
                   t is not None and t < plan.error_within_s,
                   "no error line" if t is None else f"{t:.2f} s"))
  if case.expect == lib.DEBUG_TRACEBACK and plan.error:
    checks.append((f"the traceback ends with {plan.error!r}", plan.error in run.last_line,
                   run.last_line[:300]))
  for q, hit in found_q + missing_q:
    where = "decode quarantine" if q.stage == "decode" else "quarantine"
    what = f"{q.path}" + (f":{q.line}" if q.line is not None else "")
    if q.patient is not None:   # named by its pseudonym: the report holds no raw id either
      what = "patient " + (pseudonym(q.patient) if pseudonym else "(no salt)")
    checks.append((f"{where} has {what} ({q.reason!r})", hit is not None,
                   hit["reason"] if hit else _near(entries, q.path)))
  checks += evidence
  manifest = run.manifest() if run.rc == 0 else None
  silent = False
  if manifest is not None and plan.cohort:
    if plan.patients is not None:
      checks.append((f"manifest has {plan.patients} patients", len(manifest) == plan.patients,
                     f"{len(manifest)} patients"))
    labels = os.path.join(plan.cohort, "labels.csv")
    if os.path.isfile(labels):
      lines = labels_data_lines(labels)
      set_aside = {e.get("line") for e in run.quarantine()
                   if e.get("path") == "labels.csv" and e.get("stage") == "tables"
                   and (e.get("line") or 0) > 0}
      ok = lines == len(manifest) + len(set_aside)
      silent |= not ok
      checks.append(("every labels.csv line in the manifest or quarantined", ok,
                     f"{lines} data lines, {len(manifest)} patients + {len(set_aside)} "
                     "quarantined lines"))
    kept, lost = conservation(run, manifest, pseudonym)
    checks += kept
    silent |= lost
    if os.path.exists(run.path("ingest", "tables.npz")):
      checks.append(("tables.npz holds no inf or NaN", *tables_finite(run)))
    if os.path.exists(run.path("ingest", "summary.json")):
      counts = lib.ingest_summary(run).get("accounting")
      ok = (isinstance(counts, dict) and isinstance(counts.get("files"), dict)
            and isinstance(counts.get("patients"), dict)
            and counts["patients"].get("in_manifest") == len(manifest))
      checks.append(("ingest summary's accounting block counts the manifest", ok,
                     str(counts)[:300]))
  for name, fn in plan.checks:
    try:
      ok, detail = fn(run)
    except Exception as e:  # pylint: disable=broad-except
      ok, detail = False, f"{type(e).__name__}: {e}"
    checks.append((name, bool(ok), detail))

  flags = []
  if outcome in (lib.TRACEBACK, lib.INTERNAL, lib.HANG, lib.ABORT, lib.CRASH_LOOP, lib.RUNAWAY):
    flags.append(outcome)
  if silent:
    flags.append("silent loss")
  if leaks:
    flags.append("raw id")
  if run.leftover:
    flags.append("leftover process")
  shown = _shown(outcome, run, found_q, evidence)
  if outcome == lib.ACCEPTED and not shown:
    own = [d for n, ok, d in checks[-len(plan.checks):] if ok and d] if plan.checks else []
    shown = "; ".join(own + ([plan.note] if plan.note else []))[:400]
  base = {
      "class": case.cls, "name": case.name, "expect": case.expect, "outcome": outcome,
      "command": plan.command, "exit_code": run.rc, "seconds": round(run.seconds, 2),
      "error_after_s": None if run.error_after_s is None else round(run.error_after_s, 2),
      "stderr_last_line": run.last_line[:1000], "shown": shown, "note": plan.note,
  }
  records = []
  for sub in plan.subcases or [None]:
    sub_checks = checks + list(run.sub.get(sub, [])) if sub else checks
    record = dict(base, name=f"{case.name}: {sub}" if sub else case.name)
    record["checks"] = [{"name": n, "ok": ok, "detail": d} for n, ok, d in sub_checks]
    record["flags"] = flags
    record["ok"] = outcome == case.expect and all(ok for _, ok, _ in sub_checks)
    if sub and run.sub.get(sub):
      record["shown"] = "; ".join(d for _, _, d in run.sub[sub] if d)[:300] or shown
    records.append(record)
  return records


def _around(text: str, word: str, width: int = 200) -> str:
  i = text.find(word)
  return text[max(0, i - 20):i + width].replace("\n", " | ")


def _near(entries: list[dict], path: str) -> str:
  near = [e for e in entries if e.get("path") == path]
  return ("entries for it: " + "; ".join(str(e.get("reason")) for e in near)[:300] if near
          else f"no entry for {path}")


def _shown(outcome: str, run: Run, found_q, evidence) -> str:
  """The one line a reader of the table wants: the error line, the quarantine reason, the
  recovery's evidence."""
  if outcome in (lib.CLEAR, lib.INTERNAL, lib.OTHER, lib.DEBUG_TRACEBACK, lib.TRACEBACK):
    return run.last_line[:400]
  if outcome == lib.QUARANTINED:
    return "; ".join(hit["reason"] for _, hit in found_q)[:400]
  if outcome == lib.RECOVERED:
    return "; ".join(d for _, ok, d in evidence if ok and d)[:400]
  if outcome == lib.HANG:
    return f"killed after {run.plan.timeout:g} s"
  if outcome == lib.RUNAWAY:
    return f"killed by the watchdog at {RSS_LIMIT >> 30} GiB RSS"
  if outcome == lib.ABORT:
    return f"exit {run.rc}; {run.last_line[:300]}"
  return ""



# -- reporting ----------------------------------------------------------------------------------

SUMMARY_COLUMNS = [("cases", None), ("clear error", lib.CLEAR), ("quarantined", lib.QUARANTINED),
                   ("recovered", lib.RECOVERED), ("accepted", lib.ACCEPTED),
                   ("tracebacks", lib.TRACEBACK), ("internal errors", lib.INTERNAL),
                   ("silent losses", "silent loss"), ("hangs", lib.HANG), ("aborts", lib.ABORT),
                   ("crash loops", lib.CRASH_LOOP), ("runaway memory", lib.RUNAWAY),
                   ("raw ids", "raw id"), ("other", lib.OTHER), ("not as expected", "failed")]


def summarise(records: list[dict]) -> list[dict]:
  rows = []
  for cls in [c for c in lib.CLASSES if any(r["class"] == c for r in records)] + ["all"]:
    rs = [r for r in records if cls in ("all", r["class"])]
    row = {"class": cls}
    for column, key in SUMMARY_COLUMNS:
      if key is None:
        row[column] = len(rs)
      elif key == "failed":
        row[column] = sum(not r["ok"] for r in rs)
      elif key in ("silent loss", "raw id"):
        row[column] = sum(key in r["flags"] for r in rs)
      else:
        row[column] = sum(r["outcome"] == key for r in rs)
    rows.append(row)
  return rows


def _cell(text: str) -> str:
  return str(text).replace("|", "\\|").replace("\n", " ")


def markdown(records: list[dict], summary: list[dict], meta: dict) -> str:
  out = ["# Bad inputs: every class, tried from the command line, with its outcome", "",
         f"`{meta['command']}` on {meta['date']} (medjax {meta.get('commit')}"
         + (f" + {len(meta['uncommitted'])} uncommitted files" if meta.get("uncommitted") else "")
         + f"): {len(records)} cases in {meta['seconds']:.0f} s on {meta['cpus']} CPU cores "
         f"({meta['failed']} not as expected). Each case runs `python launch.py ...` as a "
         "subprocess; rules in `tests/acceptance/bad_inputs.py`.", "",
         "## Summary", "",
         "| class | " + " | ".join(c for c, _ in SUMMARY_COLUMNS) + " |",
         "|---|" + "---:|" * len(SUMMARY_COLUMNS)]
  for row in summary:
    out.append(f"| {row['class']} | " + " | ".join(str(row[c]) for c, _ in SUMMARY_COLUMNS)
               + " |")
  for cls in lib.CLASSES:
    rs = [r for r in records if r["class"] == cls]
    if not rs:
      continue
    out += ["", f"## {cls}", "", "| case | outcome | s | the error line, quarantine reason or "
            "evidence |", "|---|---|---:|---|"]
    # s: seconds from launch to the 'error: ' line for errors, to the exit otherwise.
    for r in rs:
      outcome = r["outcome"] if r["ok"] else (
          f"**{r['outcome']}** (expected {r['expect']})" if r["outcome"] != r["expect"]
          else f"**{r['outcome']}, check failed**")
      shown = r["shown"]
      failed = [c for c in r["checks"] if not c["ok"]]
      if failed:
        shown += " — FAILED: " + "; ".join(f"{c['name']}: {c['detail']}" for c in failed)
      t = r["error_after_s"] if r["error_after_s"] is not None else r["seconds"]
      out.append(f"| {_cell(r['name'])} | {outcome} | {t:.1f} | "
                 f"{_cell(shown[:600])} |")
  failed = [r for r in records if not r["ok"]]
  if failed:
    out += ["", "## Not as expected", ""]
    for r in failed:
      out += [f"- **{r['class']}/{r['name']}**: {r['outcome']} (expected {r['expect']}), "
              f"exit {r['exit_code']}", f"  `{r['command']}`",
              f"  last stderr line: `{_cell(r['stderr_last_line'][:500])}`"]
  return "\n".join(out) + "\n"


