"""What the bad-input battery's cases are made of: the case registry, plans, cohort writers.

A case is a function `fn(ctx) -> Plan` registered with `@case(cls, name, expect)`: it writes
its malformed input under `ctx.dir`, and says how to run launch.py and what the run must show.
`tests/acceptance/bad_inputs.py` runs the plans, `judge.py` judges the runs (`Run`, here because
the cases' own checks read it too); the case modules (`cases_config.py`, `cases_tables.py`,
`cases_dicom.py`, `cases_state.py`) only build inputs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
from typing import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = "--config=configs/quickstart.py:tiny"

# Outcomes. The first five are what a case may expect; the rest are failures of medjax.
CLEAR = "clear error"            # exit 2, last stderr line 'error: ...', no traceback
QUARANTINED = "quarantined"      # exit 0, the bad file/row in a quarantine report, rest ingested
RECOVERED = "recovered"          # exit 0 with the damaged-state rule's event/warning
ACCEPTED = "accepted"            # exit 0, nothing to set aside (valid, or harmless: run unaffected)
DEBUG_TRACEBACK = "debug traceback"   # --debug asked for the traceback and got it
TRACEBACK = "traceback"
INTERNAL = "internal error"      # exit 1, 'error: internal error: ...' (medjax calls it a bug)
HANG = "hang"
ABORT = "abort"
CRASH_LOOP = "crash loop"
RUNAWAY = "runaway memory"
OTHER = "other"
EXPECTABLE = (CLEAR, QUARANTINED, RECOVERED, ACCEPTED, DEBUG_TRACEBACK)

# Root reads any file; without these capabilities it obeys the permission bits like any user
# (a case about a file the process may not read runs its launch.py through this when root).
NO_OVERRIDE = ["setpriv", "--inh-caps=-dac_override,-dac_read_search",
               "--bounding-set=-dac_override,-dac_read_search"]


@dataclasses.dataclass
class Quarantined:
  """A quarantine entry the run must write: `path` (relative to the cohort root), the physical
  `line` for table rows (None: any), a substring of its reason, and its stage ('decode' entries
  are in <workdir>/cache/*/decode_quarantine.jsonl, the others in ingest/quarantine.jsonl).
  With `patient` (a raw id the case wrote), a patient entry: path "", and the patient's
  pseudonym (computed by the judge from the run's salt) in its "patient" field."""
  path: str
  reason: str
  line: int | None = None
  stage: str | None = None
  patient: str | None = None


def left_out(patient: str, reason: str) -> Quarantined:
  """The patient entry ingest writes for a named patient the manifest does not hold."""
  return Quarantined("", reason, stage="link", patient=patient)


# A check gets the finished run (lib.Run) and returns (ok, detail).
Check = Callable[["object"], "tuple[bool, str]"]


@dataclasses.dataclass
class Plan:
  """How to run one case and what it must show."""
  argv: list[str]                           # launch.py's arguments
  workdir: str
  raw_ids: list[str]                        # raw PatientIDs (and names) that must not leak
  raw_ids_file: str | None = None           # a labels.csv the run writes (synthetic): its ids too
  cohort: str | None = None                 # cohort root, for the accounting checks
  # Every patient id the case wrote (a table row's id, set aside or not, or a DICOM PatientID):
  # each must end in the manifest or in a quarantine patient entry (None: not checked).
  patient_ids: list[str] | None = None
  patients: int | None = None               # manifest patients when ingested
  quarantined: list[Quarantined] = dataclasses.field(default_factory=list)
  error: str | None = None                  # substring of the error line (clear error)
  evidence: list[tuple[str, Check]] = dataclasses.field(default_factory=list)   # recovered
  checks: list[tuple[str, Check]] = dataclasses.field(default_factory=list)
  timeout: float = 120.0
  env: dict[str, str] = dataclasses.field(default_factory=dict)
  debug: bool = False                       # --debug given on purpose: a traceback is wanted
  address_space_gb: float | None = 8.0      # RLIMIT_AS for the launcher (None: none; training)
  error_within_s: float | None = None       # the error line must come this soon after launch
  # Runs beside the process (network cases): fn(proc, run) -> {subcase: [(name, ok, detail)]}.
  during: Callable | None = None
  subcases: list[str] = dataclasses.field(default_factory=list)
  note: str = ""                            # what the case is about, for the report
  # Run as a user without root's override of permission bits (setpriv, when the battery runs
  # as root), for cases about files the process may not read.
  no_override: bool = False
  after: Callable | None = None             # fn(): run once the process exited, before judging

  @property
  def prefix(self) -> list[str]:
    """What launch.py's command line starts with besides python (setpriv, for no_override)."""
    drop = self.no_override and os.geteuid() == 0 and shutil.which("setpriv") is not None
    return list(NO_OVERRIDE) if drop else []

  @property
  def command(self) -> str:
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
    words = [*self.prefix, "python", "launch.py", *(shlex.quote(a) for a in self.argv)]
    return ((env + " ") if env else "") + " ".join(words)

  @property
  def ids_case_insensitive(self) -> bool:
    return any(a.split("=", 1)[0] == "--config.data.ids_case_insensitive"
               and a.split("=", 1)[1].strip().lower() in ("true", "1") for a in self.argv
               if "=" in a)

  @property
  def salt_file(self) -> str:
    """The salt the run pseudonymises with: config.data.salt_file, or <workdir>/secrets/id_salt."""
    for a in self.argv:
      if a.startswith("--config.data.salt_file=") and a.split("=", 1)[1]:
        return a.split("=", 1)[1]
    return os.path.join(self.workdir, "secrets", "id_salt")


@dataclasses.dataclass
class Case:
  cls: str
  name: str
  expect: str
  build: Callable[["Ctx"], Plan]
  quick: bool = False


CASES: list[Case] = []
CLASSES = ("config", "tables", "dicom", "state", "network", "phi")


def case(cls: str, name: str, expect: str, quick: bool = False):
  """Registers `fn(ctx) -> Plan` as the case `name` of class `cls` expecting `expect`."""
  assert cls in CLASSES and expect in EXPECTABLE, (cls, expect)

  def register(fn):
    assert all((c.cls, c.name) != (cls, name) for c in CASES), name
    CASES.append(Case(cls, name, expect, fn, quick))
    return fn
  return register


@dataclasses.dataclass
class Ctx:
  """Where a case writes (`dir`, fresh and empty) and the battery's shared state."""
  dir: str
  shared: dict

  def path(self, *names: str) -> str:
    return os.path.join(self.dir, *names)


@dataclasses.dataclass
class Run:
  """One finished launch.py process."""
  plan: Plan
  rc: int | None
  seconds: float
  stdout: bytes
  stderr: bytes
  timed_out: bool = False
  runaway: bool = False
  error_after_s: float | None = None      # when the 'error: ' line reached stderr
  leftover: list[str] = dataclasses.field(default_factory=list)
  sub: dict = dataclasses.field(default_factory=dict)   # subcase -> [(name, ok, detail)]

  @property
  def text(self) -> str:
    return (self.stdout + b"\n" + self.stderr).decode("utf-8", "replace")

  @property
  def last_line(self) -> str:
    lines = [l for l in self.stderr.decode("utf-8", "replace").splitlines() if l.strip()]
    return lines[-1].strip() if lines else ""

  def path(self, *names: str) -> str:
    return os.path.join(self.plan.workdir, *names)

  def read_jsonl(self, *names: str) -> list[dict]:
    try:
      with open(self.path(*names), "rb") as f:
        out = []
        for line in f.read().decode("utf-8", "replace").splitlines():
          try:
            out.append(json.loads(line))
          except ValueError:
            pass   # a torn line is the case's business, not the judge's
        return out
    except OSError:
      return []

  def events(self) -> list[dict]:
    return self.read_jsonl("events.jsonl")

  def log(self) -> str:
    try:
      with open(self.path("log.txt"), "rb") as f:
        return f.read().decode("utf-8", "replace")
    except OSError:
      return ""

  def manifest(self) -> list[dict] | None:
    if not os.path.exists(self.path("ingest", "manifest.jsonl")):
      return None
    return [r for r in self.read_jsonl("ingest", "manifest.jsonl") if "id" in r]

  def quarantine(self) -> list[dict]:
    return self.read_jsonl("ingest", "quarantine.jsonl")

  def decode_quarantine(self) -> list[dict]:
    cache = self.path("cache")
    out = []
    if os.path.isdir(cache):
      for host in sorted(os.listdir(cache)):
        out += self.read_jsonl("cache", host, "decode_quarantine.jsonl")
    return out

  def summary(self) -> dict:
    try:
      with open(self.path("summary.json")) as f:
        return json.load(f)
    except (OSError, ValueError):
      return {}


# -- cohorts ------------------------------------------------------------------------------------

# Distinctive raw ids (8 bytes that occur nowhere by chance), so a byte search finds any leak.
IDS = [f"PTX{7001 + i}K" for i in range(10)]
CLASSES_2 = ("flu", "copd")
CHANNELS = ("hr", "sbp", "dbp", "rr", "spo2", "temp")


def table(header: str, rows: list[str], eol: str = "\n") -> str:
  return eol.join([header, *rows]) + eol


def labels_rows(ids=IDS, classes=CLASSES_2, delim=",") -> list[str]:
  return [f"{pid}{delim}{classes[i % len(classes)]}" for i, pid in enumerate(ids)]


def labs_rows(ids=IDS) -> list[str]:
  return [f"{pid},{135 + i},{3.5 + 0.1 * i:.1f},{98 + i}" for i, pid in enumerate(ids)]


def vitals_rows(ids=IDS, hours=(0, 1, 2)) -> list[str]:
  return [f"{pid},{h},{70 + i + h},{110 + i},{70 + h},{14 + h},{97 + (i % 3)},{36.6 + 0.1 * h:.1f}"
          for i, pid in enumerate(ids) for h in hours]


LABELS_HEADER = "patient_id,diagnosis"
LABS_HEADER = "patient_id,Na,K,Cl"
VITALS_HEADER = "patient_id,hour," + ",".join(CHANNELS)


def write(path: str, data: str | bytes) -> str:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "wb") as f:
    f.write(data if isinstance(data, bytes) else data.encode())
  return path


def small_image(path: str, patient_id: str, size: int = 16, **attrs) -> str:
  """A native 16-bit CT image of `patient_id` (pydicom, via tests/hostile.py)."""
  from tests import hostile  # pylint: disable=import-outside-toplevel
  ds = hostile.image_dataset(hostile.ramp(size), patient_id)
  for k, v in attrs.items():
    setattr(ds, k, v)
  return hostile.save(ds, path)


def cohort(root: str, ids=IDS, *, labels: bool = True, labs: bool = True, vitals: bool = True,
           images: int = 2) -> str:
  """The base cohort: `ids` with labels (2 classes), labs (Na, K, Cl), vitals (3 hours) and one
  small DICOM image each for the first `images` of them. Every case breaks one thing of it."""
  os.makedirs(root, exist_ok=True)
  if labels:
    write(os.path.join(root, "labels.csv"), table(LABELS_HEADER, labels_rows(ids)))
  if labs:
    write(os.path.join(root, "labs.csv"), table(LABS_HEADER, labs_rows(ids)))
  if vitals:
    write(os.path.join(root, "vitals.csv"), table(VITALS_HEADER, vitals_rows(ids)))
  for i, pid in enumerate(ids[:images]):
    small_image(os.path.join(root, "dicom", f"p{i}", "img.dcm"), pid)
  return root


def ingest_argv(root: str, workdir: str, *extra: str) -> list[str]:
  """A user ingesting their own cohort: decoding into the cache included."""
  return [TINY, "--config.mode=ingest", f"--config.data.root={root}", f"--workdir={workdir}",
          *extra]


# -- checks shared by the data cases ----------------------------------------------------------

def ingest_summary(run) -> dict:
  try:
    with open(run.path("ingest", "summary.json")) as f:
      return json.load(f)
  except (OSError, ValueError):
    return {}


def class_names(run) -> list[str]:
  try:
    with open(run.path("ingest", "manifest.jsonl")) as f:
      return json.loads(f.readline()).get("class_names", [])
  except (OSError, ValueError):
    return []


def table_info(file: str, key: str, want):
  """A check: summary.json's tables.<file>.<key> equals `want` (or satisfies it, if callable)."""
  def check(run):
    got = ingest_summary(run).get("tables", {}).get(file, {}).get(key)
    ok = want(got) if callable(want) else got == want
    return ok, f"tables[{file!r}][{key!r}] = {got!r}"
  return (f"ingest summary: {file} {key}", check)


def referenced(path: str):
  def check(run):
    files = {f for r in (run.manifest() or []) for f in r.get("image_files", [])}
    return path in files, f"{path} {'is' if path in files else 'is not'} in the manifest"
  return (f"{path} ingested", check)


def decoded(n: int):
  def check(run):
    line = next((l for l in run.stdout.decode(errors="replace").splitlines()
                 if l.startswith("cache host-0")), "no cache line on stdout")
    return line.startswith(f"cache host-0: {n} records decoded"), line
  return (f"{n} records decoded into the cache", check)
