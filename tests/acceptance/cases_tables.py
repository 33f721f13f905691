"""Bad-input cases of the clinical tables and of PHI (see bad_inputs.py).

Every case writes the base cohort (`lib.cohort`: 10 patients with labels, labs,
vitals, 2 of them with a DICOM image), breaks one thing, and ingests it with
`launch.py --config=configs/quickstart.py:tiny --config.mode=ingest` (scan, tables, manifest,
placement and the decoded cache, so decode-stage problems show).
"""

from __future__ import annotations

import os
import random

from tests.acceptance import lib
from tests.acceptance.lib import (ACCEPTED, CLEAR, IDS, QUARANTINED, Quarantined, case,
                                        labels_rows, labs_rows, table, vitals_rows)

LH, LABS_H, VH = lib.LABELS_HEADER, lib.LABS_HEADER, lib.VITALS_HEADER


def _tables(ctx, *, labels=None, labs=None, vitals=None, extra=(), patients=10, quarantined=(),
            error=None, checks=(), ids=IDS, more_ids=(), images=2, config=None, note="",
            timeout=120.0, setup=None) -> lib.Plan:
  """The base cohort with the given tables replaced (str or bytes), ingested."""
  root = lib.cohort(ctx.path("cohort"), ids, images=images)
  for name, data in (("labels.csv", labels), ("labs.csv", labs), ("vitals.csv", vitals)):
    if data is not None:
      lib.write(os.path.join(root, name), data)
  if setup is not None:
    setup(root)
  work = ctx.path("work")
  argv = lib.ingest_argv(root, work, *extra)
  if config is not None:
    argv[0] = f"--config={lib.write(ctx.path('my_config.py'), config)}"
  return lib.Plan(argv=argv, workdir=work, raw_ids=[*ids, *more_ids], cohort=root,
                  patients=patients, quarantined=list(quarantined), error=error,
                  checks=list(checks), note=note, timeout=timeout)


def _labels_with(index: int, row: str, ids=IDS) -> str:
  rows = labels_rows(ids)
  rows[index] = row
  return table(LH, rows)


# -- tables: labels.csv -------------------------------------------------------------------------

@case("tables", "labels: unbalanced quote on line 5", QUARANTINED, quick=True)
def _(ctx):
  return _tables(ctx, labels=_labels_with(3, f'"{IDS[3]},copd'), patients=9,
                 quarantined=[Quarantined("labels.csv", "unbalanced quote", line=5)])


@case("tables", "labels: UTF-8 with BOM", ACCEPTED)
def _(ctx):
  return _tables(ctx, labels="\ufeff" + table(LH, labels_rows()),
                 checks=[lib.table_info("labels.csv", "bom", True)])


@case("tables", "labels: cp1252 class names", ACCEPTED)
def _(ctx):
  data = table(LH, labels_rows(classes=("grippe sévère", "bronchite aiguë"))).encode("cp1252")
  return _tables(ctx, labels=data, checks=[
      lib.table_info("labels.csv", "encoding", "cp1252"),
      ("class names decoded", lambda r: (set(lib.class_names(r)) == {"grippe sévère",
                                                                  "bronchite aiguë"},
                                         str(lib.class_names(r))))])


@case("tables", "labels: UTF-16 with BOM", ACCEPTED)
def _(ctx):
  return _tables(ctx, labels=table(LH, labels_rows()).encode("utf-16"),
                 checks=[lib.table_info("labels.csv", "encoding", "utf-16")])


@case("tables", "labels: UTF-16 without BOM", CLEAR)
def _(ctx):
  return _tables(ctx, labels=table(LH, labels_rows()).encode("utf-16-le"), error="labels.csv")


@case("tables", "labels: semicolon delimiter", ACCEPTED)
def _(ctx):
  return _tables(ctx, labels=table("patient_id;diagnosis", labels_rows(delim=";")),
                 checks=[lib.table_info("labels.csv", "delimiter", ";")])


@case("tables", "labels: tab delimiter", ACCEPTED)
def _(ctx):
  return _tables(ctx, labels=table("patient_id\tdiagnosis", labels_rows(delim="\t")),
                 checks=[lib.table_info("labels.csv", "delimiter", "\t")])


@case("tables", "labels: pipe delimiter", ACCEPTED)
def _(ctx):
  return _tables(ctx, labels=table("patient_id|diagnosis", labels_rows(delim="|")),
                 checks=[lib.table_info("labels.csv", "delimiter", "|")])


@case("tables", "labels: CRLF line endings", ACCEPTED)
def _(ctx):
  return _tables(ctx, labels=table(LH, labels_rows(), eol="\r\n"),
                 checks=[lib.table_info("labels.csv", "line_endings", "CRLF")])


@case("tables", "labels: CR line endings", ACCEPTED)
def _(ctx):
  return _tables(ctx, labels=table(LH, labels_rows(), eol="\r"),
                 checks=[lib.table_info("labels.csv", "line_endings", "CR")])


@case("tables", "labels: duplicate column", CLEAR)
def _(ctx):
  rows = [r + ",x" for r in labels_rows()]
  return _tables(ctx, labels=table("patient_id,diagnosis,Diagnosis", rows), error="twice")


@case("tables", "labels: duplicate patient", QUARANTINED)
def _(ctx):
  return _tables(ctx, labels=table(LH, labels_rows() + [f"{IDS[0]},copd"]),
                 quarantined=[Quarantined("labels.csv", "duplicate patient row", line=12)])


@case("tables", "labels: class not in data.classes", QUARANTINED)
def _(ctx):
  return _tables(ctx, labels=_labels_with(2, f"{IDS[2]},gout"), patients=9,
                 extra=["--config.data.classes=('flu','copd')"],
                 quarantined=[Quarantined("labels.csv", "not in config.data.classes", line=4)])


@case("tables", "labels: empty class", QUARANTINED)
def _(ctx):
  return _tables(ctx, labels=_labels_with(2, f"{IDS[2]},"), patients=9,
                 quarantined=[Quarantined("labels.csv", "empty", line=4)])


@case("tables", "labels: empty file", CLEAR)
def _(ctx):
  return _tables(ctx, labels=b"", error="empty")


@case("tables", "labels: only blank lines", CLEAR)
def _(ctx):
  return _tables(ctx, labels="\n  \n,\n\n", error="labels.csv")


@case("tables", "labels: binary garbage", CLEAR)
def _(ctx):
  return _tables(ctx, labels=random.Random(1).randbytes(4096), error="labels.csv")


@case("tables", "labels: spreadsheet (xlsx bytes) named .csv", CLEAR)
def _(ctx):
  data = b"PK\x03\x04\x14\x00\x06\x00" + random.Random(2).randbytes(2000)
  return _tables(ctx, labels=data, error="labels.csv")


@case("tables", "labels: NUL byte in a row", QUARANTINED)
def _(ctx):
  return _tables(ctx, labels=_labels_with(2, f"{IDS[2]}\x00,copd"), patients=9,
                 quarantined=[Quarantined("labels.csv", "NUL", line=4)])


@case("tables", "labels: a field too many", QUARANTINED)
def _(ctx):
  return _tables(ctx, labels=_labels_with(2, f"{IDS[2]},flu,extra"), patients=9,
                 quarantined=[Quarantined("labels.csv", "3 fields", line=4)])


@case("tables", "labels: a field missing", QUARANTINED)
def _(ctx):
  return _tables(ctx, labels=_labels_with(2, IDS[2]), patients=9,
                 quarantined=[Quarantined("labels.csv", "1 fields", line=4)])


@case("tables", "labels: malformed quoting in a row", QUARANTINED)
def _(ctx):
  return _tables(ctx, labels=_labels_with(2, f'{IDS[2]},"co"pd'), patients=9,
                 quarantined=[Quarantined("labels.csv", "quot", line=4)])


@case("tables", "labels: malformed quoting in the header", CLEAR)
def _(ctx):
  return _tables(ctx, labels=table('"patient_id",di"agnosis', labels_rows()), error="labels.csv")


@case("tables", "labels: no header (first row is data)", CLEAR)
def _(ctx):
  return _tables(ctx, labels="\n".join(labels_rows()) + "\n", error="labels.csv")


@case("tables", "labels: one line not UTF-8 in a UTF-8 file", QUARANTINED)
def _(ctx):
  text = table(LH, labels_rows(classes=("grippe sévère", "bronchite aiguë"))).encode()
  lines = text.split(b"\n")
  lines[4] = f"{IDS[3]},".encode() + "fièvre".encode("cp1252")
  return _tables(ctx, labels=b"\n".join(lines), patients=9,
                 quarantined=[Quarantined("labels.csv", "not valid UTF-8", line=5)])


@case("tables", "labels: on_error=raise stops at the first bad line", CLEAR)
def _(ctx):
  return _tables(ctx, labels=_labels_with(2, f'"{IDS[2]},copd'),
                 extra=["--config.data.on_error=raise"], error="labels.csv:4:")


@case("tables", "labels.csv is a directory", CLEAR)
def _(ctx):
  return _tables(ctx, setup=lambda root: (os.remove(os.path.join(root, "labels.csv")),
                                          os.makedirs(os.path.join(root, "labels.csv"))),
                 error="labels.csv")


@case("tables", "labels.csv is a FIFO", CLEAR)
def _(ctx):
  return _tables(ctx, setup=lambda root: (os.remove(os.path.join(root, "labels.csv")),
                                          os.mkfifo(os.path.join(root, "labels.csv"))),
                 error="labels.csv", timeout=45)


@case("tables", "labels.csv is a symlink to /dev/zero", CLEAR)
def _(ctx):
  return _tables(ctx, setup=lambda root: (os.remove(os.path.join(root, "labels.csv")),
                                          os.symlink("/dev/zero", os.path.join(root,
                                                                               "labels.csv"))),
                 error="labels.csv", timeout=60)


# -- tables: labs.csv ---------------------------------------------------------------------------

def _labs_with(index: int, row: str) -> str:
  rows = labs_rows()
  rows[index] = row
  return table(LABS_H, rows)


@case("tables", "labs: non-numeric value", QUARANTINED, quick=True)
def _(ctx):
  return _tables(ctx, labs=_labs_with(1, f"{IDS[1]},13O,4.1,99"),
                 quarantined=[Quarantined("labs.csv", "not a number", line=3)])


@case("tables", "labs: inf", QUARANTINED)
def _(ctx):
  return _tables(ctx, labs=_labs_with(1, f"{IDS[1]},inf,4.1,99"),
                 quarantined=[Quarantined("labs.csv", "finite", line=3)])


@case("tables", "labs: NaN and NA markers", QUARANTINED)
def _(ctx):
  rows = labs_rows()
  rows[1], rows[2] = f"{IDS[1]},NaN,4.1,99", f"{IDS[2]},N/A,4.2,100"
  return _tables(ctx, labs=table(LABS_H, rows),
                 quarantined=[Quarantined("labs.csv", "finite", line=3)])


@case("tables", "labs: 1e400 (overflows to inf)", QUARANTINED)
def _(ctx):
  return _tables(ctx, labs=_labs_with(1, f"{IDS[1]},1e400,4.1,99"),
                 quarantined=[Quarantined("labs.csv", "finite", line=3)])


@case("tables", "labs: absurd value, data.value_ranges set", QUARANTINED)
def _(ctx):
  config = ("from configs import quickstart\n\ndef get_config(arg=None):\n"
            "  config = quickstart.get_config('tiny')\n"
            "  config.data.value_ranges.Na = (100.0, 200.0)\n  return config\n")
  return _tables(ctx, labs=_labs_with(1, f"{IDS[1]},14000,4.1,99"), config=config,
                 quarantined=[Quarantined("labs.csv", "range", line=3)])


@case("tables", "labs: absurd value, no range configured", ACCEPTED)
def _(ctx):
  # README: labs have no built-in range; 1e12 mmol/L is kept unless data.value_ranges says.
  return _tables(ctx, labs=_labs_with(1, f"{IDS[1]},1e12,4.1,99"),
                 note="documented: labs have no built-in range")


@case("tables", "labs: a 1 MB cell", QUARANTINED)
def _(ctx):
  return _tables(ctx, labs=_labs_with(1, f"{IDS[1]},{'x' * 1_000_000},4.1,99"),
                 quarantined=[Quarantined("labs.csv", "not a number", line=3)])


@case("tables", "labs: duplicate column (Na, ' na')", CLEAR)
def _(ctx):
  rows = [r + ",1" for r in labs_rows()]
  return _tables(ctx, labs=table("patient_id,Na,K,Cl, na", rows), error="labs.csv")


@case("tables", "labs: column not in data.analytes", QUARANTINED)
def _(ctx):
  rows = [r + ",0.01" for r in labs_rows()]
  return _tables(ctx, labs=table("patient_id,Na,K,Cl,Troponin", rows),
                 extra=["--config.data.analytes=('Na','K','Cl')"],
                 quarantined=[Quarantined("labs.csv", "Troponin", line=1)])


@case("tables", "labs: long format with an unknown analyte", QUARANTINED)
def _(ctx):
  rows = [f"{pid},{a},{v}" for pid in IDS for a, v in (("Na", 140), ("K", 4.1), ("Cl", 100))]
  rows.insert(4, f"{IDS[1]},Troponin,0.3")
  return _tables(ctx, labs=table("patient_id,analyte,value", rows),
                 extra=["--config.data.analytes=('Na','K','Cl')"],
                 quarantined=[Quarantined("labs.csv", "Troponin")])


@case("tables", "labs: decimal commas in a ';' file", ACCEPTED)
def _(ctx):
  rows = [f"{pid};{135 + i},5;4,{i};{98 + i}" for i, pid in enumerate(IDS)]
  return _tables(ctx, labs=table("patient_id;Na;K;Cl", rows),
                 checks=[lib.table_info("labs.csv", "decimal_commas", lambda n: (n or 0) >= 20)])


@case("tables", "labs: header only", ACCEPTED)
def _(ctx):
  return _tables(ctx, labs=LABS_H + "\n")


# -- tables: vitals.csv -------------------------------------------------------------------------

def _vitals_with(index: int, row: str) -> str:
  rows = vitals_rows()
  rows[index] = row
  return table(VH, rows)


def _vrow(pid, hour, hr=80, temp=37.0):
  return f"{pid},{hour},{hr},120,80,16,98,{temp}"


@case("tables", "vitals: negative time", QUARANTINED)
def _(ctx):
  return _tables(ctx, vitals=_vitals_with(1, _vrow(IDS[0], -2)),
                 quarantined=[Quarantined("vitals.csv", "negative time", line=3)])


@case("tables", "vitals: unparseable time", QUARANTINED, quick=True)
def _(ctx):
  return _tables(ctx, vitals=_vitals_with(1, _vrow(IDS[0], "soon")),
                 quarantined=[Quarantined("vitals.csv", "neither hours nor", line=3)])


@case("tables", "vitals: rows out of time order", QUARANTINED)
def _(ctx):
  rows = vitals_rows()
  rows[1], rows[2] = rows[2], rows[1]
  return _tables(ctx, vitals=table(VH, rows),
                 quarantined=[Quarantined("vitals.csv", "out of time order", line=4)])


@case("tables", "vitals: duplicate time", QUARANTINED)
def _(ctx):
  return _tables(ctx, vitals=_vitals_with(1, _vrow(IDS[0], 0)),
                 quarantined=[Quarantined("vitals.csv", "duplicate", line=3)])


@case("tables", "vitals: absurd heart rate", QUARANTINED)
def _(ctx):
  return _tables(ctx, vitals=_vitals_with(1, _vrow(IDS[0], 1, hr=900)),
                 quarantined=[Quarantined("vitals.csv", "'hr'", line=3)])


@case("tables", "vitals: Fahrenheit temperature", QUARANTINED)
def _(ctx):
  return _tables(ctx, vitals=_vitals_with(1, _vrow(IDS[0], 1, temp=98.6)),
                 quarantined=[Quarantined("vitals.csv", "'temp'", line=3)])


@case("tables", "vitals: ISO timestamp in an hours file", QUARANTINED)
def _(ctx):
  return _tables(ctx, vitals=_vitals_with(1, _vrow(IDS[0], "2024-01-01T10:00:00")),
                 quarantined=[Quarantined("vitals.csv", "timestamp", line=3)])


@case("tables", "vitals: ISO timestamps throughout", ACCEPTED)
def _(ctx):
  rows = [r.split(",", 2) for r in vitals_rows()]
  rows = [f"{p},2024-03-01T0{h}:30:00,{rest}" for p, h, rest in rows]
  return _tables(ctx, vitals=table(VH, rows))


@case("tables", "vitals: a channel column missing", CLEAR)
def _(ctx):
  rows = [r.rsplit(",", 1)[0] for r in vitals_rows()]
  return _tables(ctx, vitals=table(VH.rsplit(",", 1)[0], rows), error="temp")


# -- tables: ids --------------------------------------------------------------------------------

@case("tables", "ids: surrounding whitespace", ACCEPTED)
def _(ctx):
  labels = _labels_with(0, f"  {IDS[0]} ,flu")
  labs = _labs_with(0, f"\t{IDS[0]} ,135,3.5,98")
  return _tables(ctx, labels=labels, labs=labs, checks=[lib.referenced("dicom/p0/img.dcm")])


def _lowercase_dicom(root):
  lib.small_image(os.path.join(root, "dicom", "p0", "img.dcm"), IDS[0].lower())


@case("tables", "ids: case differs between tables and DICOM", QUARANTINED)
def _(ctx):
  return _tables(ctx, setup=_lowercase_dicom, checks=[
      ("ingest summary: ids_case_only_mismatch >= 1",
       lambda r: (lib.ingest_summary(r).get("tables", {}).get("ids_case_only_mismatch", 0) >= 1,
                  str(lib.ingest_summary(r).get("tables", {}).get("ids_case_only_mismatch"))))],
      quarantined=[Quarantined("dicom/p0/img.dcm", "no row in labels.csv", stage="link")])


@case("tables", "ids: case differs, ids_case_insensitive=True", ACCEPTED)
def _(ctx):
  return _tables(ctx, setup=_lowercase_dicom, extra=["--config.data.ids_case_insensitive=True"],
                 checks=[lib.referenced("dicom/p0/img.dcm")])


@case("tables", "ids: only in labs (no label)", QUARANTINED)
def _(ctx):
  extra = ["PTX8001K", "PTX8002K"]
  labs = table(LABS_H, labs_rows() + [f"{p},140,4,100" for p in extra])
  return _tables(ctx, labs=labs, more_ids=extra,
                 quarantined=[Quarantined("labels.csv", "have no label", stage="link")])


@case("tables", "ids: labels without any data", QUARANTINED)
def _(ctx):
  extra = ["PTX8001K", "PTX8002K"]
  labels = table(LH, labels_rows() + [f"{p},flu" for p in extra])
  return _tables(ctx, labels=labels, more_ids=extra,
                 quarantined=[Quarantined("labels.csv", "no data", line=12),
                              Quarantined("labels.csv", "no data", line=13)])


@case("tables", "table-only 2-class cohort (no dicom/), trained", ACCEPTED)
def _(ctx):
  ids = [f"PTX{9001 + i}K" for i in range(40)]
  root = lib.cohort(ctx.path("cohort"), ids, images=0)
  work = ctx.path("work")

  def trained(run):
    test = run.summary().get("test", {})
    return "accuracy" in str(test), f"test metrics: {sorted(test)[:6]}"
  return lib.Plan(argv=[lib.TINY, f"--config.data.root={root}", f"--workdir={work}",
                        "--config.fault.supervised=False", "--config.optim.epochs=1"],
                  workdir=work, raw_ids=ids, cohort=root, patients=40, timeout=300,
                  address_space_gb=None, checks=[("trained and evaluated", trained)])


@case("tables", "oracle.npz that is not an npz", CLEAR)
def _(ctx):
  return _tables(ctx, setup=lambda root: lib.write(os.path.join(root, "oracle.npz"),
                                                   b"not a zip archive\n"), error="oracle.npz")


# -- PHI ----------------------------------------------------------------------------------------

PHI_IDS = ["DOE^JOHN", "19700101", "SMITH^JANE^M", "ROE^RICHARD"]
PHI_OTHER = ["PTX7101K", "PTX7102K", "PTX7103K", "PTX7104K"]


def _phi_cohort(root: str) -> str:
  """Ids that look like names and birth dates; malformed rows that quote them in every way a
  careless reason could (a value equal to an id, a class equal to an id, a time equal to an id,
  a duplicate row), and DICOM headers carrying them."""
  ids = PHI_IDS + PHI_OTHER
  lib.cohort(root, ids, images=0)
  lib.small_image(os.path.join(root, "dicom", "a", "1.dcm"), "DOE^JOHN",
                  PatientName="DOE^JOHN", PatientBirthDate="19700101")
  lib.small_image(os.path.join(root, "dicom", "b", "1.dcm"), "ROE^RICHARD",
                  PatientName="ROE^RICHARD")
  lib.small_image(os.path.join(root, "dicom", "c", "1.dcm"), "GREEN^NO^LABEL",
                  PatientName="GREEN^NO^LABEL")
  labels = labels_rows(ids) + ["SMITH^JANE^M,copd", "PTX7105K,ROE^RICHARD", "DOE^JOHN"]
  lib.write(os.path.join(root, "labels.csv"), table(LH, labels))
  labs = labs_rows(ids)
  labs[4] = "PTX7101K,ROE^RICHARD,19700101,SMITH^JANE^M"
  lib.write(os.path.join(root, "labs.csv"), table(LABS_H, labs))
  vitals = vitals_rows(ids)
  vitals[1] = "DOE^JOHN,ROE^RICHARD,80,120,80,16,98,37"
  vitals[4] = "19700101,19700101,80,120,80,16,98,37"
  lib.write(os.path.join(root, "vitals.csv"), table(VH, vitals))
  return root


PHI_ALL = PHI_IDS + PHI_OTHER + ["GREEN^NO^LABEL", "PTX7105K"]


@case("phi", "name- and date-like ids in every table and DICOM header", QUARANTINED, quick=True)
def _(ctx):
  root = _phi_cohort(ctx.path("cohort"))
  work = ctx.path("work")
  return lib.Plan(argv=lib.ingest_argv(root, work, "--config.data.classes=('flu','copd')"),
                  workdir=work, raw_ids=PHI_ALL, cohort=root, patients=8, quarantined=[
                      Quarantined("labels.csv", "duplicate patient row", line=10),
                      Quarantined("labs.csv", "withheld", line=6),
                      Quarantined("dicom/c/1.dcm", "no row in labels.csv")])


@case("phi", "the same cohort with on_error=raise", CLEAR)
def _(ctx):
  root = _phi_cohort(ctx.path("cohort"))
  work = ctx.path("work")
  return lib.Plan(argv=lib.ingest_argv(root, work, "--config.data.on_error=raise",
                                       "--config.data.classes=('flu','copd')"),
                  workdir=work, raw_ids=PHI_ALL, cohort=root, error="labels.csv:10:")


@case("phi", "header-less labels.csv starting with a name", CLEAR)
def _(ctx):
  return _tables(ctx, labels="DOE^JOHN,flu\n19700101,copd\n" + "\n".join(labels_rows()) + "\n",
                 more_ids=["DOE^JOHN", "19700101"], error="labels.csv")


@case("phi", "names and birth dates in DICOM headers only", ACCEPTED)
def _(ctx):
  def setup(root):
    lib.small_image(os.path.join(root, "dicom", "p0", "img.dcm"), IDS[0],
                    PatientName="WOMBAT^WALTER", PatientBirthDate="19411207",
                    OtherPatientIDs="OTHER-ID-777", InstitutionName="St Quokka Hospital")
  return _tables(ctx, setup=setup, more_ids=["WOMBAT^WALTER", "19411207", "OTHER-ID-777"],
                 checks=[lib.referenced("dicom/p0/img.dcm")])


@case("phi", "a labs value equal to an id seen only later (DICOM)", QUARANTINED)
def _(ctx):
  def setup(root):
    lib.small_image(os.path.join(root, "dicom", "q", "1.dcm"), "KOALA^KATE")
  labs = _labs_with(2, f"{IDS[2]},KOALA^KATE,4.1,99")
  return _tables(ctx, labs=labs, setup=setup, more_ids=["KOALA^KATE"],
                 quarantined=[Quarantined("labs.csv", "not a number", line=4),
                              Quarantined("dicom/q/1.dcm", "no row in labels.csv")])
