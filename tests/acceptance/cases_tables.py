"""Bad-input cases of the clinical tables and of PHI (see bad_inputs.py).

Every case writes the base cohort (`lib.cohort`: 10 patients with labels, labs,
vitals, 2 of them with a DICOM image), breaks one thing, and ingests it with
`launch.py --config=configs/quickstart.py:tiny --config.mode=ingest` (scan, tables, manifest,
placement and the decoded cache, so decode-stage problems show).
"""

from __future__ import annotations

import gzip
import os
import random
import zipfile

import numpy as np

from tests.acceptance import judge
from tests.acceptance import lib
from tests.acceptance.lib import (ACCEPTED, CLEAR, IDS, QUARANTINED, Quarantined, case,
                                        labels_rows, labs_rows, table, vitals_rows)

LH, LABS_H, VH = lib.LABELS_HEADER, lib.LABS_HEADER, lib.VITALS_HEADER


def _tables(ctx, *, labels=None, labs=None, vitals=None, extra=(), patients=10, quarantined=(),
            error=None, checks=(), ids=IDS, more_ids=(), images=2, config=None, note="",
            timeout=120.0, setup=None, patient_ids=None, no_override=False,
            after=None) -> lib.Plan:
  """The base cohort with the given tables replaced (str or bytes), ingested. Every id of `ids`
  and `more_ids` is a patient the run must account for, unless `patient_ids` says which are
  (`more_ids` may hold names that must not leak but name no patient)."""
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
                  checks=list(checks), note=note, timeout=timeout,
                  patient_ids=list(patient_ids if patient_ids is not None else [*ids, *more_ids]),
                  no_override=no_override, after=after)


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


@case("tables", "labels: a cohort's own columns (id, status), status mapped by data.rename",
      ACCEPTED)
def _(ctx):
  config = ("from configs import quickstart\n\ndef get_config(arg=None):\n"
            "  config = quickstart.get_config('tiny')\n"
            "  config.data.rename = {'status': 'diagnosis'}\n  return config\n")
  return _tables(ctx, labels=table("id,status", labels_rows()), config=config, checks=[
      ("class names read", lambda r: (sorted(lib.class_names(r)) == sorted(lib.CLASSES_2),
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
  return _tables(ctx, labels=table("patient_id,diagnosis,Diagnosis", rows),
                 error="have the same name")


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
                 quarantined=[Quarantined("labels.csv", "byte 0x00", line=4)])


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


@case("tables", "labs: absurd value, no range configured (built-in range)", QUARANTINED)
def _(ctx):
  # docs/data.md: 43 common labs have built-in ranges (Na 80-220), like the vitals channels.
  return _tables(ctx, labs=_labs_with(1, f"{IDS[1]},1e12,4.1,99"),
                 quarantined=[Quarantined("labs.csv", "outside the plausible range [80, 220]",
                                          line=3)])


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


@case("tables", "labs: values beyond an assay's limit ('<0.01', '>60')", ACCEPTED)
def _(ctx):
  rows = [f"{r},{'<0.01' if i % 2 else f'{0.02 * i:.2f}'},{'>60' if i % 3 else 45}"
          for i, r in enumerate(labs_rows())]
  return _tables(ctx, labs=table("patient_id,Na,K,Cl,troponin_i,egfr", rows),
                 checks=[lib.table_info("labs.csv", "values_at_limit", 5 + 6)])


@case("tables", "labs: MIMIC labevents, valuenum empty where value is a limit", ACCEPTED)
def _(ctx):
  rows = [f"{pid},{a},{v},{v},mmol/L" for pid in IDS for a, v in (("Na", 140), ("K", 4.1))]
  rows += [f"{pid},Troponin T,{'<0.01' if i % 2 else 'NEG'},,ng/mL" for i, pid in enumerate(IDS)]
  return _tables(ctx, labs=table("subject_id,label,value,valuenum,valueuom", rows),
                 checks=[lib.table_info("labs.csv", "values_from_text", 5)])


@case("tables", "labs: MIMIC-IV labevents as shipped (itemid codes, record ids)", ACCEPTED)
def _(ctx):
  rows = [f"{100 * i + k},{pid},,{2595786 + i},{item},,2180-03-23 11:51:00,{v},{v},{unit},,"
          for i, pid in enumerate(IDS)
          for k, (item, v, unit) in enumerate((("50983", 140 + i, "mEq/L"),
                                               ("50971", 4.1, "mEq/L")))]
  return _tables(ctx, labs=table("labevent_id,subject_id,hadm_id,specimen_id,itemid,"
                                 "order_provider_id,charttime,value,valuenum,valueuom,flag,"
                                 "comments", rows),
                 checks=[lib.table_info("labs.csv", "analyte_codes", "itemid"),
                         lib.table_info("labs.csv", "values_set_missing", {})])


@case("tables", "labs: long with a charttime, several draws per patient", ACCEPTED)
def _(ctx):
  rows = [f"{pid},2180-01-0{1 + d} 08:00,{a},{v + d}" for pid in IDS for d in range(3)
          for a, v in (("Na", 140), ("K", 4))]
  return _tables(ctx, labs=table("subject_id,charttime,label,valuenum", rows[::-1]),
                 checks=[lib.table_info("labs.csv", "later_draws", 40),
                         lib.table_info("labs.csv", "rows_quarantined", 0)])


@case("tables", "labs: categorical columns (sex, smoker yes/no)", ACCEPTED)
def _(ctx):
  rows = [f"{r},{'M' if i % 2 else 'F'},{'yes' if i % 3 else 'no'}"
          for i, r in enumerate(labs_rows())]
  return _tables(ctx, labs=table("patient_id,Na,K,Cl,sex,smoker", rows),
                 checks=[lib.table_info("labs.csv", "categorical_columns",
                                        {"sex": ["F", "M"], "smoker": ["no", "yes"]}),
                         lib.table_info("labs.csv", "values_set_missing", {})])


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


def _no_missing(modality: str):
  """A check: no patient lacks `modality` (summary.json's ingest.missing)."""
  def check(run):
    got = lib.ingest_summary(run).get("missing", {}).get(modality)
    return got == 0, f"missing[{modality!r}] = {got!r}"
  return (f"ingest summary: no patient without {modality}", check)


@case("tables", "vitals: long, as MIMIC-IV chartevents (itemids, other items)", ACCEPTED)
def _(ctx):
  items = (("220045", 80), ("220179", 120), ("220180", 80), ("220210", 16), ("220277", 98),
           ("223761", 98.6), ("226512", 70))   # Temperature Fahrenheit; weight, no channel
  rows = [f"{pid},{3000 + i},2180-01-01 {8 + h:02d}:00:00,{item},{v},{v}"
          for i, pid in enumerate(IDS) for h in range(3) for item, v in items]
  return _tables(ctx, vitals=table("subject_id,stay_id,charttime,itemid,value,valuenum", rows),
                 checks=[lib.table_info("vitals.csv", "rows_other_items", 30),
                         lib.table_info("vitals.csv", "fahrenheit_to_celsius", 30),
                         lib.table_info("vitals.csv", "values_set_missing", {}),
                         _no_missing("vitals")])


@case("tables", "vitals: a US export, columns as it names them, temperatures in Fahrenheit",
      ACCEPTED)
def _(ctx):
  rows = [f"{pid},{h},{70 + h},{110 + i},{70 + h},{14 + h},{97 + (i % 3)},{97.9 + 0.2 * h:.1f}"
          for i, pid in enumerate(IDS) for h in range(3)]
  return _tables(ctx, vitals=table("MRN,Hour,Heart Rate (bpm),Systolic BP,Diastolic BP,"
                                   "Resp Rate,SpO2 [%],Temp (°F)", rows),
                 checks=[lib.table_info("vitals.csv", "fahrenheit_to_celsius", 30),
                         lib.table_info("vitals.csv", "values_set_missing", {}),
                         _no_missing("vitals")])


@case("tables", "vitals: a flowsheet export, blood pressure charted as 120/80", ACCEPTED)
def _(ctx):
  rows = [f"{pid},{h},{70 + h},{110 + i}/{70 + h},{14 + h},{97 + (i % 3)},{36.8 + 0.1 * h:.1f}"
          for i, pid in enumerate(IDS) for h in range(3)]
  return _tables(ctx, vitals=table("patient_id,hour,Pulse,BP,Resp Rate,SpO2,Temp", rows),
                 checks=[lib.table_info("vitals.csv", "pressures_split", 30),
                         lib.table_info("vitals.csv", "values_set_missing", {}),
                         _no_missing("vitals")])


@case("tables", "vitals: a temp column all in Fahrenheit", ACCEPTED)
def _(ctx):
  rows = [r.rsplit(",", 1)[0] + f",{98.2 + 0.3 * (k % 3):.1f}"
          for k, r in enumerate(vitals_rows())]
  return _tables(ctx, vitals=table(VH, rows),
                 checks=[lib.table_info("vitals.csv", "fahrenheit_by_value", 30),
                         lib.table_info("vitals.csv", "values_set_missing", {}),
                         _no_missing("vitals")])


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


@case("tables", "vitals: values typed with their unit ('72 bpm', '99.1 °F')", ACCEPTED)
def _(ctx):
  # Every such value was 'not a number': the patients' vitals were all missing.
  rows = [f"{pid},{h},{70 + h} bpm,{110 + i} mmHg,{70 + h} mmHg,{14 + h}/min,{97 + i % 3} %,"
          f"{98.6 + 0.2 * h:.1f} °F" for i, pid in enumerate(IDS) for h in (0, 1, 2)]
  return _tables(ctx, vitals=table(VH, rows),
                 checks=[_no_missing("vitals"),
                         lib.table_info("vitals.csv", "units_in_cells", 180),
                         lib.table_info("vitals.csv", "fahrenheit_to_celsius", 30)])


@case("tables", "vitals: a channel column missing", CLEAR)
def _(ctx):
  rows = [r.rsplit(",", 1)[0] for r in vitals_rows()]
  return _tables(ctx, vitals=table(VH.rsplit(",", 1)[0], rows), error="temp")


@case("tables", "labels and labs: two exports joined end to end (the header repeated)",
      QUARANTINED)
def _(ctx):
  # `cat a.csv b.csv`: the second header was a row, a patient 'patient_id' whose class was
  # 'diagnosis' (a class of one, learnt by the model) and whose labs were all missing.
  labels = labels_rows()
  labs = labs_rows()
  classes = ("the classes are those of the rows", lambda run: (
      "diagnosis" not in lib.class_names(run), f"{lib.class_names(run)}"))
  return _tables(ctx, labels=table(LH, labels[:5] + [LH] + labels[5:]),
                 labs=table(LABS_H, labs[:3] + [LABS_H] + labs[3:]), checks=[classes],
                 quarantined=[Quarantined("labels.csv", "repeats the header line", line=7),
                              Quarantined("labs.csv", "repeats the header line", line=5)])


@case("tables", "labels and labs: saved from sqlcmd's text output (a rule, a row count)",
      QUARANTINED)
def _(ctx):
  # The rule of dashes was a patient '----------' of class '---------'; '(10 rows affected)'
  # a patient set aside.
  labels = table(LH, ["----------,---------", *labels_rows(), "", "(10 rows affected)"])
  labs = table(LABS_H, ["----------,---,---,---", *labs_rows(), "", "(10 rows affected)"])
  classes = ("no class of dashes", lambda run: (
      not any(c.startswith("---") for c in lib.class_names(run)), f"{lib.class_names(run)}"))
  return _tables(ctx, labels=labels, labs=labs, checks=[classes],
                 quarantined=[Quarantined("labels.csv", "SQL tool's text output", line=2),
                              Quarantined("labels.csv", "SQL tool's text output", line=14),
                              Quarantined("labs.csv", "SQL tool's text output", line=2)])


@case("tables", "labels: two exports of a 0/1 outcome, one written as floats (1.0)", ACCEPTED)
def _(ctx):
  # '1.0' and '1' were two classes of one outcome.
  rows = [f"{pid},{(i % 2) if i < 5 else f'{i % 2}.0'}" for i, pid in enumerate(IDS)]
  classes = ("the classes are '0' and '1'", lambda run: (
      lib.class_names(run) == ["0", "1"], f"{lib.class_names(run)}"))
  return _tables(ctx, labels=table("patient_id,outcome", rows), checks=[classes])


@case("tables", "labels: a note column whose quoted text has line breaks", QUARANTINED)
def _(ctx):
  # Each line of such a note was an 'unbalanced quote' row set aside: its patient's label and
  # images left out. Now the record is read whole, its later line an entry saying so.
  rows = [f'{pid},{r.split(",")[1]},"seen twice' + ('\nreviewed, stable"' if i < 2 else '"')
          for i, (pid, r) in enumerate(zip(IDS, labels_rows()))]
  return _tables(ctx, labels=table(LH + ",note", rows),
                 checks=[lib.table_info("labels.csv", "fields_across_lines", 2)],
                 quarantined=[Quarantined("labels.csv", "continues the quoted field of line 2",
                                          line=3)])


@case("tables", "labels: a spreadsheet's error value as a class ('#VALUE!')", QUARANTINED)
def _(ctx):
  # It was a class of its own, one patient's, learnt by the model.
  classes = ("no class '#VALUE!'", lambda run: (
      "#VALUE!" not in lib.class_names(run), f"{lib.class_names(run)}"))
  return _tables(ctx, labels=_labels_with(4, f"{IDS[4]},#VALUE!"), patients=9, checks=[classes],
                 quarantined=[Quarantined("labels.csv", "missing-value marker", line=6)])


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
  # 'ptx7001k' (DICOM) is another patient than 'PTX7001K' (tables): named only in DICOM.
  return _tables(ctx, setup=_lowercase_dicom, more_ids=[IDS[0].lower()], checks=[
      ("ingest summary: ids_case_only_mismatch >= 1",
       lambda r: (lib.ingest_summary(r).get("tables", {}).get("ids_case_only_mismatch", 0) >= 1,
                  str(lib.ingest_summary(r).get("tables", {}).get("ids_case_only_mismatch"))))],
      quarantined=[Quarantined("dicom/p0/img.dcm", "no row in labels.csv", stage="link"),
                   lib.left_out(IDS[0].lower(), "no row in labels.csv")])


@case("tables", "ids: case differs, ids_case_insensitive=True", ACCEPTED)
def _(ctx):
  return _tables(ctx, setup=_lowercase_dicom, extra=["--config.data.ids_case_insensitive=True"],
                 checks=[lib.referenced("dicom/p0/img.dcm")])


_DIGIT_IDS = [f"00{7001 + i}" for i in range(10)]


def _labs_ids_spelt(ctx, ids: list[str], spelt, key: str) -> lib.Plan:
  """labs.csv with each of `ids` written `spelt(id)`, labels.csv and vitals.csv as they are:
  the same patients, their labs kept, counted as tables['labs.csv'][key]."""
  labs = table(LABS_H, labs_rows([spelt(i) for i in ids]))
  return _tables(ctx, ids=ids, labels=table(LH, labels_rows(ids)), labs=labs,
                 vitals=table(VH, vitals_rows(ids)),
                 checks=[_lab(ids[i], "Na", True, others=2) for i in (0, 9)]
                 + [lib.table_info("labs.csv", key, 10)])


@case("tables", "ids: labs.csv written by pandas, its integer ids as floats (a .0 added)",
      ACCEPTED)
def _(ctx):
  # An integer id column with a gap is written '7001.0': another patient than labels.csv's
  # '7001', its labs lost to the patient and the row left out.
  return _labs_ids_spelt(ctx, [str(7001 + i) for i in range(10)], lambda i: f"{i}.0",
                         "ids_written_as_floats")


@case("tables", "ids: labs.csv made for Excel, its ids as text formulas (=\"...\")", ACCEPTED)
def _(ctx):
  # ="007001" keeps the zeros in a spreadsheet: the id was the formula itself, another patient
  # than DICOM's and labels.csv's 007001, the labs lost and the rows left out.
  return _labs_ids_spelt(ctx, _DIGIT_IDS, lambda i: f'="{i}"', "ids_as_text_formulas")


@case("tables", "ids: a spreadsheet dropped labs.csv's leading zeros", QUARANTINED)
def _(ctx):
  # DICOM and labels.csv keep '007001'; labs.csv, saved from a spreadsheet, says '7001': another
  # patient (it may be one), named only in labs.csv, and counted with a hint.
  key = "ids_leading_zeros_only_mismatch"
  labs = table(LABS_H, labs_rows(["7001"] + _DIGIT_IDS[1:]))
  return _tables(ctx, ids=_DIGIT_IDS, labels=table(LH, labels_rows(_DIGIT_IDS)), labs=labs,
                 vitals=table(VH, vitals_rows(_DIGIT_IDS)), more_ids=["7001"], checks=[
      (f"ingest summary: {key} == 1",
       lambda r: (lib.ingest_summary(r).get("tables", {}).get(key) == 1,
                  str(lib.ingest_summary(r).get("tables", {}).get(key))))],
      quarantined=[lib.left_out("7001", "no row in labels.csv")])


@case("tables", "headers spelt as exports spell them (Patient ID, Diagnosis, HR)", ACCEPTED)
def _(ctx):
  vitals = table("patient.id,Hour,HR,SBP,DBP,RR,SpO2,Temp", vitals_rows())
  return _tables(ctx, labels=table("Patient ID,Diagnosis", labels_rows()),
                 labs=table("PATIENT_ID,Na,K,Cl", labs_rows()), vitals=vitals,
                 checks=[lib.referenced("dicom/p0/img.dcm")])


@case("tables", "ids: only in labs (no label)", QUARANTINED)
def _(ctx):
  extra = ["PTX8001K", "PTX8002K"]
  labs = table(LABS_H, labs_rows() + [f"{p},140,4,100" for p in extra])
  return _tables(ctx, labs=labs, more_ids=extra,
                 quarantined=[lib.left_out(p, "no row in labels.csv") for p in extra])


@case("tables", "ids: labels without any data", QUARANTINED)
def _(ctx):
  extra = ["PTX8001K", "PTX8002K"]
  labels = table(LH, labels_rows() + [f"{p},flu" for p in extra])
  return _tables(ctx, labels=labels, more_ids=extra,
                 quarantined=[Quarantined("labels.csv", "no data", line=12),
                              Quarantined("labels.csv", "no data", line=13),
                              *(lib.left_out(p, "a label but no data") for p in extra)])


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
                  patient_ids=ids,
                  address_space_gb=None, checks=[("trained and evaluated", trained)])


@case("tables", "oracle.npz that is not an npz", CLEAR)
def _(ctx):
  return _tables(ctx, setup=lambda root: lib.write(os.path.join(root, "oracle.npz"),
                                                   b"not a zip archive\n"), error="oracle.npz")


# -- issue 32: the quiet bad inputs -------------------------------------------------------------
# Each case checks, besides its own entries, that every patient it wrote and every file under
# its cohort root is accounted for (judge.conservation) and that tables.npz is finite.

def _row_of(run, pid: str):
  """(tables.npz's arrays, the row of raw id `pid`, or None)."""
  pseudonym = judge.pseudonymiser(run.plan)
  with np.load(run.path("ingest", "tables.npz"), allow_pickle=False) as f:
    arrays = dict(f)
  ids = [str(x) for x in arrays["record_ids"]]
  key = pseudonym(pid) if pseudonym else None
  return arrays, (ids.index(key) if key in ids else None)


def _vitals_steps(pid: str, want: int):
  """A check: the patient's vitals cover `want` steps (its other rows were kept)."""
  def check(run):
    arrays, i = _row_of(run, pid)
    if i is None:
      return False, "the patient is not in tables.npz"
    n = int(arrays["vitals_mask"][i].any(axis=-1).sum())
    return n == want, f"the patient's vitals cover {n} steps"
  return (f"the patient's other vitals rows kept ({want} steps)", check)


def _lab(pid: str, analyte: str, present: bool, others: int | None = None):
  """A check: the patient's `analyte` is there (or missing), and `others` of its labs are."""
  def check(run):
    arrays, i = _row_of(run, pid)
    if i is None:
      return False, "the patient is not in tables.npz"
    names = [str(a) for a in arrays["analytes"]]
    folded = [a.casefold() for a in names]
    if analyte.casefold() not in folded:
      return False, f"no analyte {analyte!r} in tables.npz ({names})"
    j = folded.index(analyte.casefold())
    have, total = bool(arrays["labs_mask"][i, j]), int(arrays["labs_mask"][i].sum())
    ok = have == present and (others is None or total - have == others)
    return ok, (f"{names[j]} {'present' if have else 'missing'}, {total - have} other labs "
                "present")
  return (f"the patient's {analyte} {'kept' if present else 'set to missing'}"
          + (f", {others} other labs kept" if others is not None else ""), check)


def _analytes(want: list[str]):
  def check(run):
    with np.load(run.path("ingest", "tables.npz"), allow_pickle=False) as f:
      got = [str(a) for a in f["analytes"]]
    return got == want, f"analytes {got}"
  return (f"the analytes are {want}", check)


def _ranges_config(**ranges) -> str:
  body = "".join(f"  config.data.value_ranges.{k} = {v!r}\n" for k, v in ranges.items())
  return ("from configs import quickstart\n\ndef get_config(arg=None):\n"
          "  config = quickstart.get_config('tiny')\n" + body + "  return config\n")


def _quarantined_rows(source: str, n: int):
  def check(run):
    rows = [e for e in run.quarantine() if e.get("path") == source and e.get("line")]
    return len(rows) >= n, f"{len(rows)} rows of {source} in quarantine.jsonl"
  return (f"quarantine.jsonl written with the {n} rows of {source}", check)


# -- labels: a rejected row of a patient with images (the images follow with the chain) ---------

def _chain(ctx, index: int, row: str, reason: str, extra=()) -> lib.Plan:
  """Patient IDS[index] (index 0 or 1: they have an image) has its label row replaced by `row`,
  which must be set aside with `reason`; its image and its patient entry carry the chain."""
  line = index + 2
  chain = f"label row rejected: labels.csv line {line} ("
  return _tables(ctx, labels=_labels_with(index, row), patients=9, extra=extra, quarantined=[
      Quarantined("labels.csv", reason, line=line),
      Quarantined(f"dicom/p{index}/img.dcm", chain, stage="link"),
      lib.left_out(IDS[index], chain)])


@case("tables", "labels rejected, images follow: malformed quoting", QUARANTINED)
def _(ctx):
  return _chain(ctx, 0, f'{IDS[0]},"fl"u', "quot")


@case("tables", "labels rejected, images follow: unbalanced quote", QUARANTINED, quick=True)
def _(ctx):
  return _chain(ctx, 1, f'{IDS[1]},"copd', "unbalanced quote")


@case("tables", "labels rejected, images follow: class not in data.classes", QUARANTINED)
def _(ctx):
  return _chain(ctx, 0, f"{IDS[0]},gout", "not in config.data.classes",
                extra=["--config.data.classes=('flu','copd')"])


@case("tables", "labels rejected, images follow: stray control byte 0x01", QUARANTINED)
def _(ctx):
  return _chain(ctx, 1, f"{IDS[1]},co\x01pd", "control character (byte 0x01)")


@case("tables", "labels rejected, images follow: DEL byte after the class", QUARANTINED)
def _(ctx):
  return _chain(ctx, 0, f"{IDS[0]},flu\x7f", "control character (byte 0x7f)")


@case("tables", "labels rejected, images follow: empty class", QUARANTINED)
def _(ctx):
  return _chain(ctx, 1, f"{IDS[1]},", "empty")


@case("tables", "labels rejected, images follow: class of only spaces", QUARANTINED)
def _(ctx):
  return _chain(ctx, 0, f"{IDS[0]},   ", "empty")


@case("tables", "labels rejected, images follow: a field too many", QUARANTINED)
def _(ctx):
  return _chain(ctx, 1, f"{IDS[1]},copd,2024", "3 fields")


# -- labels.csv with a header and no usable row -------------------------------------------------

@case("tables", "labels: a header and no rows", CLEAR)
def _(ctx):
  return _tables(ctx, labels=LH + "\n", error="labels.csv has no usable row")


@case("tables", "labels: a header, then only blank lines", CLEAR)
def _(ctx):
  return _tables(ctx, labels=LH + "\n\n   \n\t\n\n", error="labels.csv has no usable row")


@case("tables", "labels: a header, then lines of delimiters and spaces", CLEAR)
def _(ctx):
  return _tables(ctx, labels=LH + "\r\n,\r\n , \r\n", error="labels.csv has no usable row")


@case("tables", "labels: every row set aside (empty classes)", CLEAR)
def _(ctx):
  return _tables(ctx, labels=table(LH, [f"{p}," for p in IDS]),
                 error="labels.csv has no usable row", checks=[_quarantined_rows("labels.csv", 10)])


@case("tables", "labels: every class outside data.classes", CLEAR)
def _(ctx):
  return _tables(ctx, labels=table(LH, labels_rows(classes=("gout", "asthma"))),
                 extra=["--config.data.classes=('flu','copd')"], error="ingest kept no patient",
                 checks=[_quarantined_rows("labels.csv", 10)])


# -- numbers beyond float32, checked as float64 -------------------------------------------------

@case("tables", "labs: just over float32 max (3.403e38)", QUARANTINED)
def _(ctx):
  return _tables(ctx, labs=_labs_with(1, f"{IDS[1]},3.403e38,4.1,99"),
                 quarantined=[Quarantined("labs.csv", "beyond what float32 holds", line=3)],
                 checks=[_lab(IDS[1], "Na", False, others=2)])


@case("tables", "labs: float32 max exactly (held, but out of range)", QUARANTINED)
def _(ctx):
  return _tables(ctx, labs=_labs_with(1, f"{IDS[1]},3.4028234663852886e38,4.1,99"),
                 quarantined=[Quarantined("labs.csv", "outside the plausible range", line=3)],
                 checks=[_lab(IDS[1], "Na", False, others=2)])


@case("tables", "labs: far beyond float32 (1e300)", QUARANTINED)
def _(ctx):
  return _tables(ctx, labs=_labs_with(2, f"{IDS[2]},140,1e300,99"),
                 quarantined=[Quarantined("labs.csv", "beyond what float32 holds", line=4)],
                 checks=[_lab(IDS[2], "K", False, others=2)])


@case("tables", "labs: negative beyond float32 (-1e39)", QUARANTINED)
def _(ctx):
  return _tables(ctx, labs=_labs_with(3, f"{IDS[3]},140,4.1,-1e39"),
                 quarantined=[Quarantined("labs.csv", "beyond what float32 holds", line=5)],
                 checks=[_lab(IDS[3], "Cl", False, others=2)])


@case("tables", "labs: beyond float32 in three columns of one row", QUARANTINED)
def _(ctx):
  return _tables(ctx, labs=_labs_with(4, f"{IDS[4]},4e38,-4e38,1e308"),
                 quarantined=[Quarantined("labs.csv", f"{a!r}: value", line=6)
                              for a in ("Na", "K", "Cl")], patients=10,
                 note="the row's patient keeps vitals, so stays in the manifest")


def _long_labs(change: dict[tuple[int, str], str] | None = None) -> str:
  rows = [f"{pid},{a},{change.get((i, a), v) if change else v}" for i, pid in enumerate(IDS)
          for a, v in (("Na", 140), ("K", 4.1), ("Cl", 100))]
  return table("patient_id,analyte,value", rows)


@case("tables", "labs long: just over float32 max", QUARANTINED)
def _(ctx):
  # Line 2 + 3 x 2 + 0 = 8: patient 2's Na.
  return _tables(ctx, labs=_long_labs({(2, "Na"): "3.5e38"}),
                 quarantined=[Quarantined("labs.csv", "beyond what float32 holds", line=8)],
                 checks=[_lab(IDS[2], "Na", False, others=2)])


@case("tables", "labs long: negative far beyond float32", QUARANTINED)
def _(ctx):
  return _tables(ctx, labs=_long_labs({(5, "K"): "-2.5e300"}),
                 quarantined=[Quarantined("labs.csv", "beyond what float32 holds", line=18)],
                 checks=[_lab(IDS[5], "K", False, others=2)])


def _vitals_times(times, change: dict[tuple[int, int], str] | None = None,
                  values: dict[tuple[int, int], str] | None = None) -> str:
  """Every patient with one row per time of `times`; `change` replaces row k of patient i's
  time, `values` its hr. Patient i's row k is on line 2 + i x len(times) + k."""
  rows = []
  for i, pid in enumerate(IDS):
    for k, t in enumerate(times):
      t = change.get((i, k), t) if change else t
      hr = values.get((i, k), 70 + i + k) if values else 70 + i + k
      rows.append(f"{pid},{t},{hr},{110 + i},{70 + k},{14 + k},{97 + i % 3},{36.6 + 0.1 * k:.1f}")
  return table(VH, rows)


HOURS = [str(h) for h in range(6)]
STAMPS = [f"2024-03-01T{h:02d}:30:00" for h in range(6)]


@case("tables", "vitals: a US export's timestamps (03/14/2024 11:30 PM, over midnight)",
      ACCEPTED)
def _(ctx):
  # Each was 'neither hours nor an ISO timestamp': every row set aside, the vitals lost.
  stamps = [f"03/14/2024 {h}:30 PM" for h in (9, 10, 11)] + [
      f"03/15/2024 {h}:30 AM" for h in (12, 1, 2)]
  return _tables(ctx, vitals=_vitals_times(stamps),
                 checks=[_vitals_steps(IDS[0], 6), _no_missing("vitals"),
                         lib.table_info("vitals.csv", "date_order", "month/day")])


@case("tables", "vitals: hours written with their unit ('2 h')", ACCEPTED)
def _(ctx):
  # Each was 'neither hours nor an ISO timestamp': every row set aside, the vitals lost.
  return _tables(ctx, vitals=_vitals_times([f"{h} h" for h in HOURS]),
                 checks=[_vitals_steps(IDS[0], 6), _no_missing("vitals")])


@case("tables", "vitals: hr beyond float32 (1e39)", QUARANTINED)
def _(ctx):
  return _tables(ctx, vitals=_vitals_times(HOURS, values={(0, 2): "1e39"}),
                 quarantined=[Quarantined("vitals.csv", "beyond what float32 holds", line=4)],
                 checks=[_vitals_steps(IDS[0], 6)])


@case("tables", "vitals: hr negative beyond float32 (-3.5e38)", QUARANTINED)
def _(ctx):
  return _tables(ctx, vitals=_vitals_times(HOURS, values={(3, 5): "-3.5e38"}),
                 quarantined=[Quarantined("vitals.csv", "beyond what float32 holds", line=25)],
                 checks=[_vitals_steps(IDS[3], 6)])


# -- lab values outside the built-in ranges (a unit slip), and a config that allows them --------

def _labs_plus(column: str, value_of) -> str:
  rows = [r + f",{value_of(i)}" for i, r in enumerate(labs_rows())]
  return table(f"{LABS_H},{column}", rows)


@case("tables", "labs: glucose in mmol/L x 1000 (5500)", QUARANTINED)
def _(ctx):
  labs = _labs_plus("Glucose", lambda i: 5500 if i == 2 else 90 + i)
  return _tables(ctx, labs=labs, checks=[_lab(IDS[2], "Glucose", False, others=3)],
                 quarantined=[Quarantined("labs.csv", "outside the plausible range [0, 3000]",
                                          line=4)])


@case("tables", "labs: GLUCOSE spelt in capitals, 5500 (range matched ignoring case)",
      QUARANTINED)
def _(ctx):
  labs = _labs_plus("GLUCOSE", lambda i: 5500 if i == 6 else 90 + i)
  return _tables(ctx, labs=labs, checks=[_lab(IDS[6], "GLUCOSE", False, others=3)],
                 quarantined=[Quarantined("labs.csv", "outside the plausible range [0, 3000]",
                                          line=8)])


@case("tables", "labs: negative creatinine", QUARANTINED)
def _(ctx):
  labs = _labs_plus("Creatinine", lambda i: -1.2 if i == 4 else f"{0.8 + 0.05 * i:.2f}")
  return _tables(ctx, labs=labs, checks=[_lab(IDS[4], "Creatinine", False, others=3)],
                 quarantined=[Quarantined("labs.csv", "outside the plausible range [0, 40]",
                                          line=6)])


@case("tables", "labs long: glucose 5500 among good values", QUARANTINED)
def _(ctx):
  rows = [f"{pid},{a},{v}" for i, pid in enumerate(IDS)
          for a, v in (("Na", 140), ("Glucose", 5500 if i == 1 else 95))]
  return _tables(ctx, labs=table("patient_id,analyte,value", rows),
                 checks=[_lab(IDS[1], "Glucose", False, others=1)],
                 quarantined=[Quarantined("labs.csv", "outside the plausible range [0, 3000]",
                                          line=5)])


@case("tables", "labs long: units in the analyte names, 'Creatinine (umol/L)'", ACCEPTED)
def _(ctx):
  # Each name with its unit was an analyte of that whole name: no plausible range, its µmol/L
  # kept beside another site's mg/dL.
  rows = [f"{pid},{a},{v}" for i, pid in enumerate(IDS)
          for a, v in (("Sodium (mmol/L)", 135 + i), ("Creatinine (umol/L)", 80 + i))]
  return _tables(ctx, labs=table("patient_id,analyte,value", rows),
                 checks=[_analytes(["Creatinine", "Sodium"]),
                         lib.table_info("labs.csv", "si_units_converted", 10)])


@case("tables", "labs long: a dipstick's result in words given twice at one time", QUARANTINED)
def _(ctx):
  # Its row was read as one row per category: one repeated row was three set aside, and each
  # later draw counted three times.
  rows = [f"{pid},2180-01-0{d} 08:00,Urine Blood,{['NEG', 'TR', 'POS'][(i + d) % 3]},"
          for i, pid in enumerate(IDS) for d in (1, 2)]
  rows.insert(4, f"{IDS[0]},2180-01-01 08:00,Urine Blood,POS,")
  exactly_one = ("one quarantine entry for labs.csv", lambda run: (
      len([e for e in run.quarantine() if e.get("path") == "labs.csv"]) == 1,
      f"{[e.get('reason') for e in run.quarantine() if e.get('path') == 'labs.csv']}"))
  return _tables(ctx, labs=table("subject_id,charttime,label,value,valuenum", rows),
                 checks=[exactly_one, lib.table_info("labs.csv", "rows_quarantined", 1),
                         lib.table_info("labs.csv", "later_draws", 10)],
                 quarantined=[Quarantined("labs.csv", "duplicate value for analyte 'Urine "
                                          "Blood'", line=6)])


@case("tables", "labs long: a dipstick's results as words (NEG, POS), valuenum empty", ACCEPTED)
def _(ctx):
  rows = [f"{pid},2180-01-01 08:00,{a},{v},{n}" for i, pid in enumerate(IDS)
          for a, v, n in (("Sodium", 140, 140), ("Urine Blood", "POS" if i % 2 else "NEG", ""))]
  return _tables(ctx, labs=table("subject_id,charttime,label,value,valuenum", rows),
                 checks=[lib.table_info("labs.csv", "categorical_analytes",
                                        {"Urine Blood": ["NEG", "POS"]}),
                         _lab_value(IDS[1], "Urine Blood=POS", 1.0),
                         _lab_value(IDS[2], "Urine Blood=POS", 0.0),
                         _lab_value(IDS[2], "Sodium", 140)])


@case("tables", "labs long: CRP in mg/dL among rows in mg/L", ACCEPTED)
def _(ctx):
  # Patient 3's CRP, the only one in mg/dL: 0.5 mg/dL is 5 mg/L.
  rows = [f"{pid},{a},{v},{u}" for i, pid in enumerate(IDS)
          for a, v, u in (("Na", 140, "mmol/L"),
                          ("CRP", 0.5 if i == 3 else 4 + i, "mg/dL" if i == 3 else "mg/L"))]
  return _tables(ctx, labs=table("patient_id,analyte,value,unit", rows),
                 checks=[lib.table_info("labs.csv", "units_rescaled", 1),
                         _lab_value(IDS[3], "CRP", 5.0)])


@case("tables", "labs long: haemoglobin 13.5 'mg/dL' among rows in g/dL (a wrong unit cell)",
      QUARANTINED)
def _(ctx):
  # Read in its unit, 13.5 mg/dL would be 0.0135 g/dL: the row is set aside, not converted.
  # Line 2 + 2 x 3 + 1 = 9.
  rows = [f"{pid},{a},{v},{u}" for i, pid in enumerate(IDS)
          for a, v, u in (("Na", 140, "mmol/L"),
                          ("Hemoglobin", 13.5, "mg/dL" if i == 3 else "g/dL"))]
  return _tables(ctx, labs=table("patient_id,analyte,value,unit", rows),
                 checks=[_lab(IDS[3], "Hemoglobin", False, others=1)],
                 quarantined=[Quarantined("labs.csv", "where most of its rows are in 'g/dL'",
                                          line=9)])


@case("tables", "labs long: a European export in SI units beside a site in US units", ACCEPTED)
def _(ctx):
  si = (("Creatinine", 88, "µmol/L"), ("Hemoglobin", 138, "g/L"), ("Glucose", 5.4, "mmol/L"))
  us = (("Creatinine", 1.0, "mg/dL"), ("Hemoglobin", 13.8, "g/dL"), ("Glucose", 97, "mg/dL"))
  rows = [f"{pid},{a},{v},{u}" for i, pid in enumerate(IDS) for a, v, u in (si if i % 3 else us)]
  return _tables(ctx, labs=table("patient_id,test,valuenum,valueuom", rows),
                 checks=[lib.table_info("labs.csv", "si_units_converted",
                                        3 * sum(1 for i in range(len(IDS)) if i % 3)),
                         lib.table_info("labs.csv", "values_set_missing", {}),
                         _lab(IDS[1], "Creatinine", True, others=2)])


@case("tables", "labs long: platelets in K/uL, 10^9/L and /uL (three lab systems)", ACCEPTED)
def _(ctx):
  # One scale in three spellings and one per µL: every row read, the last ones converted.
  spellings = ((250, "K/uL"), (250, "10^9/L"), (250, "x10E9/L"), (250000, "/uL"))
  rows = [f"{pid},{a},{v},{u}" for i, pid in enumerate(IDS)
          for a, v, u in (("Na", 140, "mmol/L"), ("Platelets", *spellings[i % 4]))]
  return _tables(ctx, labs=table("patient_id,test,valuenum,valueuom", rows),
                 checks=[lib.table_info("labs.csv", "values_set_missing", {}),
                         _lab(IDS[1], "Platelets", True, others=1),
                         _lab_value(IDS[3], "Platelets", 250.0)])


@case("tables", "labs long: two lab systems' names of one analyte ('PLT', 'Platelets'; 'Hb')",
      ACCEPTED)
def _(ctx):
  # Patients 0, 2, 4...: 'Platelets' and 'Hemoglobin'; 1, 3, 5...: 'PLT' and 'Hb'.
  names = (("Platelets", "Hemoglobin"), ("PLT", "Hb"))
  rows = [f"{pid},{a},{v}" for i, pid in enumerate(IDS)
          for a, v in zip(names[i % 2], (250 + i, 14))]
  return _tables(ctx, labs=table("patient_id,test,value", rows),
                 checks=[_analytes(["Hemoglobin", "Platelets"]),
                         _lab(IDS[1], "Platelets", True, others=1),
                         _lab_value(IDS[3], "Platelets", 253.0)])


@case("tables", "labs wide: counts per µL, 'Platelets (/uL)' and a unitless WBC of 7,500s",
      ACCEPTED)
def _(ctx):
  # 'Platelets (/uL)' by its header, 'WBC' (7,500: out of range in 10^9/L) by its values.
  rows = [f"{pid},{200000 + 10000 * i},{7500 + 100 * i},140" for i, pid in enumerate(IDS)]
  return _tables(ctx, labs=table("patient_id,Platelets (/uL),WBC,Na", rows),
                 checks=[lib.table_info("labs.csv", "values_set_missing", {}),
                         _lab_value(IDS[1], "Platelets", 210.0), _lab_value(IDS[1], "WBC", 7.6)])


@case("tables", "labs and labels gzipped as MIMIC ships them (labs.csv.gz)", ACCEPTED)
def _(ctx):
  # They were not part of the layout ('unpack it'), and every patient had no label.
  def pack(root):
    for name in ("labels.csv", "labs.csv"):
      with open(os.path.join(root, name), "rb") as f:
        lib.write(os.path.join(root, name + ".gz"), gzip.compress(f.read()))
      os.remove(os.path.join(root, name))
  return _tables(ctx, setup=pack, checks=[lib.table_info("labs.csv", "values_set_missing", {}),
                                          _lab(IDS[1], "Na", True)])


@case("tables", "labs and vitals zipped for mail (labs.csv.zip, a __MACOSX/ entry)", ACCEPTED)
def _(ctx):
  # They were not part of the layout ('unpack it to labs.csv'): every lab and vital lost.
  def pack(root):
    for name in ("labs.csv", "vitals.csv"):
      with zipfile.ZipFile(os.path.join(root, name + ".zip"), "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(f"__MACOSX/._{name}", b"\0\5\26\7")
        z.write(os.path.join(root, name), f"export/{name}")
      os.remove(os.path.join(root, name))
  return _tables(ctx, setup=pack, checks=[lib.table_info("labs.csv", "values_set_missing", {}),
                                          _lab(IDS[1], "Na", True),
                                          lib.table_info("vitals.csv", "rows", 30)])


@case("tables", "labs.csv.zip holding two tables", CLEAR)
def _(ctx):
  def pack(root):
    with zipfile.ZipFile(os.path.join(root, "labs.csv.zip"), "w") as z:
      z.write(os.path.join(root, "labs.csv"), "labs.csv")
      z.write(os.path.join(root, "vitals.csv"), "vitals.csv")
    os.remove(os.path.join(root, "labs.csv"))
  return _tables(ctx, setup=pack, error="labs.csv.zip: holds 2 files where a zipped table "
                 "holds one")


@case("tables", "labs.csv.gz cut short", CLEAR)
def _(ctx):
  def cut(root):
    with open(os.path.join(root, "labs.csv"), "rb") as f:
      packed = gzip.compress(f.read() * 20)
    lib.write(os.path.join(root, "labs.csv.gz"), packed[:len(packed) // 2])
    os.remove(os.path.join(root, "labs.csv"))
  return _tables(ctx, setup=cut, error="labs.csv.gz: is a gzip file cut short or damaged")


def _lab_value(pid: str, analyte: str, want: float):
  """A check: the patient's `analyte` in tables.npz is `want` (to 0.5%)."""
  def check(run):
    arrays, i = _row_of(run, pid)
    names = [str(a).casefold() for a in arrays["analytes"]]
    if i is None or analyte.casefold() not in names:
      return False, f"no {analyte!r} of the patient in tables.npz ({names})"
    j = names.index(analyte.casefold())
    got = float(arrays["labs"][i, j]) if arrays["labs_mask"][i, j] else None
    return got is not None and abs(got - want) <= 0.005 * abs(want), f"{analyte} {got}"
  return (f"the patient's {analyte} is {want}", check)


@case("tables", "labs wide: a column of bands ('<=20', '20-50', '>50')", ACCEPTED)
def _(ctx):
  # 15 patients: a categorical column has 5 rows per category on average.
  bands, ids = ("<=20", "20-50", ">50"), IDS + [f"PTX{8001 + i}K" for i in range(5)]
  rows = [f"{pid},140,{bands[i % 3]}" for i, pid in enumerate(ids)]
  return _tables(ctx, labs=table("patient_id,Na,size", rows), ids=ids, patients=len(ids),
                 checks=[lib.table_info("labs.csv", "values_set_missing", {}),
                         _lab_value(IDS[1], "size=20-50", 1.0),
                         _lab_value(IDS[1], "size=>50", 0.0)])


@case("tables", "labs and labels with Excel's 'sep=;' first line", ACCEPTED)
def _(ctx):
  # Refused as 'line 1 is not a header with a patient id column'.
  rows = [f"{pid};{135 + i};4,{i}" for i, pid in enumerate(IDS)]
  def sep_labels(root):
    with open(os.path.join(root, "labels.csv"), encoding="utf-8") as f:
      lib.write(os.path.join(root, "labels.csv"), "sep=,\r\n" + f.read())
  return _tables(ctx, labs="sep=;\n" + table("patient_id;Na;K", rows), setup=sep_labels,
                 checks=[lib.table_info("labs.csv", "sep_line", 1),
                         _lab_value(IDS[2], "K", 4.2)])


@case("tables", "labs wide: a SAS export, '.' for each missing value", ACCEPTED)
def _(ctx):
  rows = [f"{pid},{'.' if i % 3 == 0 else 140},{'.A' if i == 1 else 4.1},{90 + i}"
          for i, pid in enumerate(IDS)]
  return _tables(ctx, labs=table("patient_id,Na,K,Glucose", rows),
                 checks=[lib.table_info("labs.csv", "missing_dots", 5),
                         lib.table_info("labs.csv", "values_set_missing", {}),
                         _lab(IDS[3], "Na", False, others=2), _lab_value(IDS[1], "Na", 140)])


@case("tables", "labs wide: headers with units, creatinine in µmol/L and haemoglobin in g/L",
      ACCEPTED)
def _(ctx):
  rows = [f"{pid},{88.42 * (1 + i % 3)},{130 + i},{5.0 + i / 10:.1f}"
          for i, pid in enumerate(IDS)]
  return _tables(ctx, labs=table("patient_id,Creatinine (µmol/L),Hemoglobin [g/L],K (mmol/L)",
                                 rows),
                 checks=[lib.table_info("labs.csv", "si_units_converted", 2 * len(IDS)),
                         lib.table_info("labs.csv", "values_set_missing", {}),
                         _lab_value(IDS[1], "Creatinine", 2.0),
                         _lab_value(IDS[1], "Hemoglobin", 13.1), _lab_value(IDS[1], "K", 5.1)])


@case("tables", "labs wide: a European cohort without units, creatinine and haemoglobin in SI",
      ACCEPTED)
def _(ctx):
  # Creatinine 35.37 µmol/L would be a plausible 35 mg/dL on its own: the column decides.
  rows = [f"{pid},{35.37 if i == 2 else 88.42 * (1 + i % 3)},{130 + i},{40 - i % 4}"
          for i, pid in enumerate(IDS)]
  return _tables(ctx, labs=table("patient_id,Creatinine,hgb,Albumin", rows),
                 checks=[lib.table_info("labs.csv", "si_units_by_value", 3 * len(IDS)),
                         lib.table_info("labs.csv", "values_set_missing", {}),
                         _lab_value(IDS[1], "Creatinine", 2.0),
                         _lab_value(IDS[2], "Creatinine", 0.4),
                         _lab_value(IDS[1], "hgb", 13.1), _lab_value(IDS[1], "Albumin", 3.9)])


@case("tables", "labs wide: a sentinel 9999 in a column named as exports name sodium",
      QUARANTINED)
def _(ctx):
  rows = [f"{pid},{9999 if i == 4 else 140},{4.0}" for i, pid in enumerate(IDS)]
  return _tables(ctx, labs=table("patient_id,Serum Sodium,Potassium", rows),
                 checks=[_lab(IDS[4], "Serum Sodium", False, others=1),
                         _lab_value(IDS[3], "Serum Sodium", 140)],
                 quarantined=[Quarantined("labs.csv", "outside the plausible range [80, 220]",
                                          line=6)])


def _splits_are(want: dict[str, str]):
  """A check: each raw id's manifest split is `want`'s."""
  def check(run):
    pseudonym = judge.pseudonymiser(run.plan)
    got = {r["id"]: r["split"] for r in (run.manifest() or []) if "id" in r}
    have = {pid: got.get(pseudonym(pid)) if pseudonym else None for pid in want}
    return have == want, f"splits {list(have.values())}"
  return (f"the splits are labels.csv's ({list(want.values())})", check)


@case("tables", "labels: the cohort's own split column, one row naming no split", QUARANTINED)
def _(ctx):
  splits = ["train", "Training", "val", "test", "TEST", "train", "validation", "holdout",
            "train", "fold3"]
  rows = [f"{r},{s}" for r, s in zip(labels_rows(), splits)]
  want = {IDS[i]: s for i, s in enumerate(["train", "train", "val", "test", "test", "train",
                                            "val", "test", "train"])}
  return _tables(ctx, labels=table(LH + ",split", rows), patients=9, checks=[_splits_are(want)],
                 quarantined=[Quarantined("labels.csv", "'split' 'fold3' is not a split",
                                          line=11)])


@case("tables", "labels: a split column without 'train'", CLEAR)
def _(ctx):
  rows = [f"{r},{'test' if i % 2 else 'val'}" for i, r in enumerate(labels_rows())]
  return _tables(ctx, labels=table(LH + ",split", rows), error="'train'")


@case("tables", "labs wide: a row per draw, the second draw's Glucose", QUARANTINED)
def _(ctx):
  # The first draw measured Na, K, Cl; the second Glucose and Na again: the patient keeps all
  # four (each analyte's first value), the repeated Na is reported.
  rows = [f"{pid},{135 + i},3.5,98," for i, pid in enumerate(IDS)] + [f"{IDS[2]},150,,,90"]
  return _tables(ctx, labs=table(LABS_H + ",Glucose", rows),
                 checks=[_lab(IDS[2], "Glucose", True, others=3)],
                 quarantined=[Quarantined("labs.csv", "a later row of a patient gives it again",
                                          line=12)])


@case("tables", "labs: glucose 5500 allowed by data.value_ranges.Glucose", ACCEPTED)
def _(ctx):
  labs = _labs_plus("Glucose", lambda i: 5500 if i == 2 else 90 + i)
  return _tables(ctx, labs=labs, config=_ranges_config(Glucose=(0.0, 10000.0)),
                 checks=[_lab(IDS[2], "Glucose", True, others=3)])


@case("tables", "labs: value_ranges.glucose (lower case) covers column Glucose", ACCEPTED)
def _(ctx):
  labs = _labs_plus("Glucose", lambda i: 5500 if i == 2 else 90 + i)
  return _tables(ctx, labs=labs, config=_ranges_config(glucose=(0.0, 10000.0)),
                 checks=[_lab(IDS[2], "Glucose", True, others=3)])


@case("tables", "labs: negative creatinine kept with value_ranges.Creatinine=None", ACCEPTED)
def _(ctx):
  labs = _labs_plus("Creatinine", lambda i: -1.2 if i == 4 else f"{0.8 + 0.05 * i:.2f}")
  return _tables(ctx, labs=labs, config=_ranges_config(Creatinine=None),
                 checks=[_lab(IDS[4], "Creatinine", True, others=3)])


# -- one mistyped time among good rows: its own row only ----------------------------------------

@case("tables", "vitals: an hour typed too large mid-series (300 for 3)", QUARANTINED)
def _(ctx):
  return _tables(ctx, vitals=_vitals_times(HOURS, {(1, 3): "300"}),
                 quarantined=[Quarantined("vitals.csv", "out of time order", line=11)],
                 checks=[_vitals_steps(IDS[1], 5)])


@case("tables", "vitals: an hour typed too large first (10 for 0)", QUARANTINED)
def _(ctx):
  return _tables(ctx, vitals=_vitals_times(HOURS, {(2, 0): "10"}),
                 quarantined=[Quarantined("vitals.csv", "out of time order", line=14)],
                 checks=[_vitals_steps(IDS[2], 5)])


@case("tables", "vitals: a timestamp at the top of an hours file", QUARANTINED)
def _(ctx):
  return _tables(ctx, vitals=_vitals_times(HOURS, {(0, 0): "2024-03-01T00:30:00"}),
                 quarantined=[Quarantined("vitals.csv", "most of the file's times are hours",
                                          line=2)],
                 checks=[_vitals_steps(IDS[0], 5)])


@case("tables", "vitals: hours at the top of a timestamp file", QUARANTINED)
def _(ctx):
  return _tables(ctx, vitals=_vitals_times(STAMPS, {(0, 0): "0"}),
                 quarantined=[Quarantined("vitals.csv", "most of the file's times are "
                                          "timestamps", line=2)],
                 checks=[_vitals_steps(IDS[0], 5)])


@case("tables", "vitals: mistyped year in the first row (2014)", QUARANTINED)
def _(ctx):
  return _tables(ctx, vitals=_vitals_times(STAMPS, {(4, 0): "2014-03-01T00:30:00"}),
                 quarantined=[Quarantined("vitals.csv", "a mistyped date?", line=26)],
                 checks=[_vitals_steps(IDS[4], 5)])


@case("tables", "vitals: mistyped year in the middle (2014)", QUARANTINED)
def _(ctx):
  return _tables(ctx, vitals=_vitals_times(STAMPS, {(4, 2): "2014-03-01T02:30:00"}),
                 quarantined=[Quarantined("vitals.csv", "a mistyped date?", line=28)],
                 checks=[_vitals_steps(IDS[4], 5)])


@case("tables", "vitals: mistyped year in the last row (2014)", QUARANTINED)
def _(ctx):
  return _tables(ctx, vitals=_vitals_times(STAMPS, {(4, 5): "2014-03-01T05:30:00"}),
                 quarantined=[Quarantined("vitals.csv", "a mistyped date?", line=31)],
                 checks=[_vitals_steps(IDS[4], 5)])


@case("tables", "vitals: year typed too large in the first row (2042)", QUARANTINED)
def _(ctx):
  return _tables(ctx, vitals=_vitals_times(STAMPS, {(7, 0): "2042-03-01T00:30:00"}),
                 quarantined=[Quarantined("vitals.csv", "out of time order", line=44)],
                 checks=[_vitals_steps(IDS[7], 5)])


@case("tables", "vitals: year typed too large in the middle (2042)", QUARANTINED)
def _(ctx):
  return _tables(ctx, vitals=_vitals_times(STAMPS, {(7, 3): "2042-03-01T03:30:00"}),
                 quarantined=[Quarantined("vitals.csv", "out of time order", line=47)],
                 checks=[_vitals_steps(IDS[7], 5)])


@case("tables", "vitals: one row back in time at the end (hour 2.5 after 4)", QUARANTINED)
def _(ctx):
  return _tables(ctx, vitals=_vitals_times(HOURS, {(9, 5): "2.5"}),
                 quarantined=[Quarantined("vitals.csv", "out of time order", line=61)],
                 checks=[_vitals_steps(IDS[9], 5)])


@case("tables", "vitals: a day typed wrong mid-series (03-11 for 03-01)", QUARANTINED)
def _(ctx):
  return _tables(ctx, vitals=_vitals_times(STAMPS, {(8, 2): "2024-03-11T02:30:00"}),
                 quarantined=[Quarantined("vitals.csv", "out of time order", line=52)],
                 checks=[_vitals_steps(IDS[8], 5)])


@case("tables", "vitals: an hour typed too large in the last row (counted, past the series)",
      ACCEPTED)
def _(ctx):
  # In order, so no rule sets it aside: past the last of the 24 steps, it is counted
  # (tables.vitals.csv.rows_past_last_step), as docs/data.md says.
  return _tables(ctx, vitals=_vitals_times(HOURS, {(5, 5): "500"}),
                 checks=[lib.table_info("vitals.csv", "rows_past_last_step", 1),
                         _vitals_steps(IDS[5], 5)])


# -- files and folders the process may not read -------------------------------------------------

def _unreadable(*names: str):
  def setup(root):
    os.chmod(os.path.join(root, *names), 0)
  return setup


@case("tables", "labels.csv not readable by the process", CLEAR)
def _(ctx):
  return _tables(ctx, setup=_unreadable("labels.csv"), no_override=True,
                 error="labels.csv: cannot be read (Permission denied)")


@case("tables", "labs.csv not readable by the process", CLEAR)
def _(ctx):
  return _tables(ctx, setup=_unreadable("labs.csv"), no_override=True,
                 error="labs.csv: cannot be read (Permission denied)")


@case("tables", "vitals.csv not readable by the process", CLEAR)
def _(ctx):
  return _tables(ctx, setup=_unreadable("vitals.csv"), no_override=True,
                 error="vitals.csv: cannot be read (Permission denied)")


@case("tables", "cohort folder not readable by the process", CLEAR)
def _(ctx):
  root = ctx.path("cohort")
  return _tables(ctx, setup=lambda r: os.chmod(r, 0), no_override=True,
                 after=lambda: os.chmod(root, 0o755), error="cannot be read")


@case("tables", "cohort folder searchable but not listable (mode 0311)", CLEAR)
def _(ctx):
  # Its files open by name, but what else lies there cannot be told (nor accounted for).
  root = ctx.path("cohort")
  return _tables(ctx, setup=lambda r: os.chmod(r, 0o311), no_override=True,
                 after=lambda: os.chmod(root, 0o755), error="cannot be read")


# -- files at the cohort root outside its layout ------------------------------------------------

_FOREIGN = "not part of a cohort's layout"


@case("tables", "cohort root: a README and a spreadsheet beside the tables", QUARANTINED)
def _(ctx):
  def setup(root):
    lib.write(os.path.join(root, "README.txt"), "exported 2024-03-01 by the registry\n")
    lib.write(os.path.join(root, "notes", "cohort.xlsx"), b"PK\x03\x04" + bytes(200))
  return _tables(ctx, setup=setup, quarantined=[Quarantined("README.txt", _FOREIGN),
                                                Quarantined("notes/cohort.xlsx", _FOREIGN)])


@case("tables", "cohort root: a DICOM file outside dicom/", QUARANTINED)
def _(ctx):
  return _tables(ctx, setup=lambda root: lib.small_image(os.path.join(root, "scan.dcm"), IDS[3]),
                 quarantined=[Quarantined("scan.dcm", _FOREIGN)])


@case("tables", "cohort root: DICOM files in images/ instead of dicom/", QUARANTINED)
def _(ctx):
  def setup(root):
    for i in (2, 3):
      lib.small_image(os.path.join(root, "images", f"p{i}", "img.dcm"), IDS[i])
  return _tables(ctx, setup=setup, quarantined=[Quarantined(f"images/p{i}/img.dcm", _FOREIGN)
                                                for i in (2, 3)])


@case("tables", "cohort root: labs.csv.bak and Vitals.CSV beside the tables", QUARANTINED)
def _(ctx):
  def setup(root):
    lib.write(os.path.join(root, "labs.csv.bak"), table(LABS_H, labs_rows()))
    lib.write(os.path.join(root, "Vitals.CSV"), table(VH, vitals_rows()))
  return _tables(ctx, setup=setup, quarantined=[Quarantined("labs.csv.bak", _FOREIGN),
                                                Quarantined("Vitals.CSV", _FOREIGN)])


@case("tables", "cohort root: .DS_Store files at the root and in dicom/", QUARANTINED)
def _(ctx):
  def setup(root):
    lib.write(os.path.join(root, ".DS_Store"), b"\x00\x00\x00\x01Bud1" + bytes(100))
    lib.write(os.path.join(root, "dicom", ".DS_Store"), b"\x00\x00\x00\x01Bud1" + bytes(100))
  return _tables(ctx, setup=setup, quarantined=[Quarantined(".DS_Store", _FOREIGN),
                                                Quarantined("dicom/.DS_Store", "")])


@case("tables", "cohort root: a symlink to a folder", QUARANTINED)
def _(ctx):
  return _tables(ctx, setup=lambda root: os.symlink("dicom", os.path.join(root, "scans")),
                 quarantined=[Quarantined("scans", _FOREIGN)])


# -- patients named in one place only -----------------------------------------------------------

@case("tables", "ids: only in vitals (no label)", QUARANTINED)
def _(ctx):
  extra = ["PTX8003K"]
  return _tables(ctx, vitals=table(VH, vitals_rows() + vitals_rows(extra)), more_ids=extra,
                 quarantined=[lib.left_out(extra[0], "no row in labels.csv")])


@case("tables", "ids: only in DICOM (no label, no table row)", QUARANTINED)
def _(ctx):
  extra = ["PTX8004K"]
  return _tables(ctx, more_ids=extra,
                 setup=lambda root: lib.small_image(os.path.join(root, "dicom", "p9", "img.dcm"),
                                                    extra[0]),
                 quarantined=[Quarantined("dicom/p9/img.dcm", "no row in labels.csv",
                                          stage="link"),
                              lib.left_out(extra[0], "no row in labels.csv")])


@case("tables", "ids: only in a labs row that is set aside", QUARANTINED)
def _(ctx):
  extra = ["PTX8005K"]
  labs = table(LABS_H, labs_rows() + [f"{extra[0]},140,4.1,99,7"])
  return _tables(ctx, labs=labs, more_ids=extra,
                 quarantined=[Quarantined("labs.csv", "5 fields", line=12),
                              lib.left_out(extra[0], "no row in labels.csv")])


@case("tables", "ids: only in vitals, every row of it set aside", QUARANTINED)
def _(ctx):
  extra = ["PTX8006K"]
  rows = vitals_rows() + [f"{extra[0]},soon,80,120,80,16,98,37"]
  return _tables(ctx, vitals=table(VH, rows), more_ids=extra,
                 quarantined=[Quarantined("vitals.csv", "neither hours nor", line=32),
                              lib.left_out(extra[0], "")])


@case("tables", "ids: a labelled patient whose only data is a bad labs value", QUARANTINED)
def _(ctx):
  extra = ["PTX8007K"]
  labels = table(LH, labels_rows() + [f"{extra[0]},flu"])
  labs = table(LABS_H, labs_rows() + [f"{extra[0]},inf,,"])
  return _tables(ctx, labels=labels, labs=labs, more_ids=extra,
                 quarantined=[Quarantined("labs.csv", "finite", line=12),
                              # Why: its one labs row (line 12) gave no usable value; not "no
                              # lab row".
                              lib.left_out(extra[0], "labs.csv line 12")])


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
                  workdir=work, raw_ids=PHI_ALL, cohort=root, patients=8, patient_ids=PHI_ALL,
                  quarantined=[
                      Quarantined("labels.csv", "duplicate patient row", line=10),
                      Quarantined("labs.csv", "withheld", line=6),
                      Quarantined("dicom/c/1.dcm", "no row in labels.csv")])


@case("phi", "the same cohort with on_error=raise", CLEAR)
def _(ctx):
  root = _phi_cohort(ctx.path("cohort"))
  work = ctx.path("work")
  return lib.Plan(argv=lib.ingest_argv(root, work, "--config.data.on_error=raise",
                                       "--config.data.classes=('flu','copd')"),
                  workdir=work, raw_ids=PHI_ALL, cohort=root, patient_ids=PHI_ALL,
                  error="labels.csv:10:")


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
                 patient_ids=IDS, checks=[lib.referenced("dicom/p0/img.dcm")])


@case("phi", "a labs value equal to an id seen only later (DICOM)", QUARANTINED)
def _(ctx):
  def setup(root):
    lib.small_image(os.path.join(root, "dicom", "q", "1.dcm"), "KOALA^KATE")
  labs = _labs_with(2, f"{IDS[2]},KOALA^KATE,4.1,99")
  return _tables(ctx, labs=labs, setup=setup, more_ids=["KOALA^KATE"],
                 quarantined=[Quarantined("labs.csv", "not a number", line=4),
                              Quarantined("dicom/q/1.dcm", "no row in labels.csv")])


# -- PHI: header cells that may identify a patient are never echoed -----------------------------

@case("phi", "labs header: a column named like a patient id of the cohort", QUARANTINED)
def _(ctx):
  rows = [r + ",1" for r in labs_rows()]
  return _tables(ctx, labs=table(LABS_H + f",{IDS[5]}", rows), checks=[
      _analytes(["Na", "K", "Cl"])],
      quarantined=[Quarantined("labs.csv", "withheld", line=1)])


@case("phi", "labs header: an MRN-like column (MRN and 8 digits)", QUARANTINED)
def _(ctx):
  rows = [r + ",1" for r in labs_rows()]
  return _tables(ctx, labs=table(LABS_H + ",MRN00123456", rows), more_ids=["MRN00123456"],
                 patient_ids=IDS, checks=[_analytes(["Na", "K", "Cl"])],
                 quarantined=[Quarantined("labs.csv", "withheld", line=1)])


@case("phi", "labs header: a name and birth date as a column", QUARANTINED)
def _(ctx):
  rows = [r + ",1" for r in labs_rows()]
  return _tables(ctx, labs=table(LABS_H + ",DOE^JANE 1980-01-01", rows),
                 more_ids=["DOE^JANE", "1980-01-01"], patient_ids=IDS,
                 checks=[_analytes(["Na", "K", "Cl"])],
                 quarantined=[Quarantined("labs.csv", "withheld", line=1)])


@case("phi", "labs long: an analyte cell holding a patient id", QUARANTINED)
def _(ctx):
  # The long format's analyte cells are its column names: one equal to a patient id must not
  # become an analyte (whose name tables.npz and the summary carry).
  rows = [f"{pid},{a},{v}" for pid in IDS for a, v in (("Na", 140), ("K", 4.1))]
  rows.insert(3, f"{IDS[1]},{IDS[8]},7")
  return _tables(ctx, labs=table("patient_id,analyte,value", rows),
                 checks=[_analytes(["K", "Na"])],
                 quarantined=[Quarantined("labs.csv", "withheld", line=5)])


@case("phi", "vitals header: an extra column named like a patient id", ACCEPTED)
def _(ctx):
  rows = [r + ",5" for r in vitals_rows()]
  return _tables(ctx, vitals=table(VH + f",{IDS[2]}", rows))


@case("phi", "labels header: a third column named like a patient id", ACCEPTED)
def _(ctx):
  rows = [r + ",x" for r in labels_rows()]
  return _tables(ctx, labels=table(LH + f",{IDS[4]}", rows))


@case("phi", "labs header: a patient id where 'patient_id' should be", CLEAR)
def _(ctx):
  return _tables(ctx, labs=table(f"{IDS[0]},Na,K,Cl", labs_rows()[1:]), error="labs.csv")


@case("phi", "vitals header: a date of birth where the time column should be", CLEAR)
def _(ctx):
  rows = vitals_rows()
  return _tables(ctx, vitals=table(VH.replace("hour", "19700101"), rows),
                 more_ids=["19700101"], patient_ids=IDS, error="vitals.csv")


# -- what exports put in the tables (tests/test_tables_exports.py has the unit tests) ---------

def _identifier_columns(ctx, columns: str, cells, names=()) -> lib.Plan:
  """labs.csv with identifier `columns` (their `cells(i)` per patient) before Na, K, Cl: never
  analytes, each one quarantine entry for its column; `names` must not leak."""
  rows = [f"{pid},{cells(i)},{135 + i},4.{i},{98 + i}" for i, pid in enumerate(IDS)]
  return _tables(ctx, labs=table(f"patient_id,{columns},Na,K,Cl", rows), more_ids=list(names),
                 patient_ids=IDS,
                 quarantined=[Quarantined("labs.csv", "identifies patients", line=1)])


@case("tables", "labs: an MRN column beside the id column", QUARANTINED)
def _(ctx):
  return _identifier_columns(ctx, "MRN", lambda i: 55012345 + i)


@case("tables", "labs: a name and a birth date column", QUARANTINED)
def _(ctx):
  names = [f"Smith^Jo{chr(97 + i)}" for i in range(10)]
  return _identifier_columns(ctx, "patient_name,dob", lambda i: f"{names[i]},0{1 + i % 9}/10/67",
                             names)


@case("phi", "labs: a birth date column under its own name, written YYYYMMDD", QUARANTINED)
def _(ctx):
  # 'born' is no identifier's name, and 19670110 reads as a number: it became an analyte whose
  # values, birth dates, went into tables.npz.
  rows = [f"{pid},{19500101 + 10000 * i + i},{135 + i},4.{i},{98 + i}"
          for i, pid in enumerate(IDS)]
  return _tables(ctx, labs=table("patient_id,born,Na,K,Cl", rows),
                 checks=[_analytes(["Na", "K", "Cl"]),
                         lib.table_info("labs.csv", "date_columns", 1)],
                 quarantined=[Quarantined("labs.csv", "holds dates or times", line=1)])


@case("tables", "labs: an admission date and a free-text comment column", QUARANTINED)
def _(ctx):
  # Each became an analyte no patient has (every value 'not a number').
  rows = [f"{pid},{135 + i},2021-0{1 + i % 9}-1{i} 08:30,seen by the night team {i},4.{i}"
          for i, pid in enumerate(IDS)]
  return _tables(ctx, labs=table("patient_id,Na,admitted,comment,K", rows),
                 checks=[_analytes(["Na", "K"]), lib.table_info("labs.csv", "text_columns", 1)],
                 quarantined=[Quarantined("labs.csv", "holds dates or times", line=1),
                              Quarantined("labs.csv", "holds text and no number", line=1)])


@case("tables", "labs wide: creatinine in mmol/L by its header, a unit not converted",
      QUARANTINED)
def _(ctx):
  # 0.09 mmol/L was read as a plausible 0.09 mg/dL, eleven times too small.
  rows = [f"{pid},{135 + i},4.{i},0.{5 + i % 4:02d}" for i, pid in enumerate(IDS)]
  return _tables(ctx, labs=table("patient_id,Na,K,Creatinine (mmol/L)", rows),
                 checks=[_analytes(["Na", "K"]),
                         lib.table_info("labs.csv", "units_not_converted", 1)],
                 quarantined=[Quarantined("labs.csv", "converts only umol/l", line=1)])


def _labs_read(ctx, header: str, rows: list[str], analyte: str, patients, others: int,
               counts: dict[str, int]) -> lib.Plan:
  """labs.csv of `header` and `rows`, ingested: `analyte` kept for IDS[i] of `patients` beside
  `others` of their labs, and summary.json's tables['labs.csv'] holding `counts`."""
  return _tables(ctx, labs=table(header, rows),
                 checks=[_lab(IDS[i], analyte, True, others=others) for i in patients]
                 + [lib.table_info("labs.csv", key, n) for key, n in counts.items()])


@case("tables", 'labs: an ALP written "1,250" (a spreadsheet\'s number format)', ACCEPTED)
def _(ctx):
  # Every such value was 'not a number', set to missing.
  rows = [f'{pid},{135 + i},"1,{250 + 10 * i}"' for i, pid in enumerate(IDS)]
  return _labs_read(ctx, "patient_id,Na,ALP", rows, "ALP", (0, 9), 1,
                    {"thousands_separators": 10})


@case("tables", "labs: values typed with their unit ('140 mmol/L', '88 umol/L')", ACCEPTED)
def _(ctx):
  # Every such value was 'not a number', set to missing.
  rows = [f"{pid},{135 + i} mmol/L,{80 + i} umol/L,4.{i}" for i, pid in enumerate(IDS)]
  return _labs_read(ctx, "patient_id,Na,Creatinine,K", rows, "Creatinine", (0, 9), 2,
                    {"units_in_cells": 20, "si_units_converted": 10})


@case("tables", "labs: abnormal values with the lab's flag ('5.9 H', '2.8 (L)')", ACCEPTED)
def _(ctx):
  # Each flagged value was 'not a number', set to missing: the abnormal ones were lost.
  rows = [f"{pid},{135 + i},{'5.9 H' if i % 2 else '2.8 (L)'},{98 + i}"
          for i, pid in enumerate(IDS)]
  return _labs_read(ctx, LABS_H, rows, "K", (0, 1), 2, {"values_flagged": 10})


@case("tables", "labs: a base excess with a Unicode minus ('−2.5'), full-width digits",
      ACCEPTED)
def _(ctx):
  # Each such value was 'not a number', set to missing.
  rows = [f"{pid},{chr(0xFF11)}{chr(0xFF13)}{chr(0xFF10 + 5 + i % 5)},4.{i},\u2212{i}.5"
          for i, pid in enumerate(IDS)]
  return _labs_read(ctx, "patient_id,Na,K,BE", rows, "BE", (0, 9), 2, {"unicode_numbers": 20})


@case("tables", "labs: a second header line of units (',mmol/L,umol/L')", QUARANTINED)
def _(ctx):
  # The units line was a row with an empty id, set aside, its units unused: creatinine in
  # µmol/L read as mg/dL, every value out of range.
  rows = [",mmol/L,mmol/L,umol/L"] + [f"{pid},{135 + i},4.{i},{80 + i}"
                                      for i, pid in enumerate(IDS)]
  return _tables(ctx, labs=table("patient_id,Na,K,Creatinine", rows),
                 checks=[_lab(IDS[i], "Creatinine", True, others=2) for i in (0, 9)]
                 + [lib.table_info("labs.csv", "units_line", 2)],
                 quarantined=[Quarantined("labs.csv", "the columns' units", line=2)])


@case("tables", "labs: '1,050' in a tab file (a thousands separator?)", QUARANTINED)
def _(ctx):
  rows = [f"{pid}\t{135 + i}\t4.{i}\t{'1,050' if i == 3 else 98 + i}"
          for i, pid in enumerate(IDS)]
  return _tables(ctx, labs=table("patient_id\tNa\tK\tGlucose", rows),
                 quarantined=[Quarantined("labs.csv", "may hold a decimal comma", line=5)])


@case("tables", "vitals: a placeholder date (1600-01-01) mid-series", QUARANTINED)
def _(ctx):
  return _tables(ctx, vitals=_vitals_times(STAMPS, {(4, 2): "1600-01-01T00:00:00"}),
                 quarantined=[Quarantined("vitals.csv", "a mistyped date?", line=28)])


@case("tables", "vitals: written newest first", ACCEPTED)
def _(ctx):
  return _tables(ctx, vitals=table(VH, vitals_rows(hours=(2, 1, 0))))


@case("tables", "labs wide: a row per draw, newest first, by collection date", ACCEPTED)
def _(ctx):
  # The file's first row of a patient won: each patient's latest labs, and its earlier draws
  # quarantined as duplicate patient rows.
  rows = [f"{pid},2024-01-0{1 + d},{135 + i + d},4.{d},{98 + i}" for i, pid in enumerate(IDS)
          for d in (2, 1, 0)]
  return _tables(ctx, labs=table("patient_id,Collection Date,Na,K,Cl", rows),
                 checks=[_lab_value(IDS[0], "Na", 135), _lab_value(IDS[9], "K", 4.0),
                         lib.table_info("labs.csv", "later_draws", 20),
                         lib.table_info("labs.csv", "rows_quarantined", 0)])


@case("tables", "labs wide: two lab systems' sodium columns (Na, SODIUM)", QUARANTINED)
def _(ctx):
  # 'SODIUM' was an analyte of its own beside 'Na', each half empty; with config.data.analytes
  # naming only 'Na' its values were ignored. Patient 4's two values disagree.
  rows = [f"{pid},{135 + i if i < 5 else ''},{135 + i if i >= 4 else ''},4.{i},{98 + i}"
          for i, pid in enumerate(IDS)]
  rows[4] = f"{IDS[4]},139,140,4.4,102"
  return _tables(ctx, labs=table("patient_id,Na,SODIUM,K,Cl", rows),
                 checks=[_analytes(["Na", "K", "Cl"]), _lab_value(IDS[9], "Na", 144),
                         _lab_value(IDS[4], "Na", 139),
                         lib.table_info("labs.csv", "columns_merged", {"Na": 2})],
                 quarantined=[Quarantined("labs.csv", "columns 'Na' and 'SODIUM' both give "
                                          "analyte 'Na' and differ", line=6)])


@case("tables", "labels: a patient's id in the class column (a shifted row)", QUARANTINED)
def _(ctx):
  # The id became a class: on stdout, in log.txt, report.json and summary.json.
  rows = lib.labels_rows()
  rows[3] = f"{IDS[3]},{IDS[5]}"
  return _tables(ctx, labels=table(lib.LABELS_HEADER, rows), patients=9,
                 quarantined=[Quarantined("labels.csv", "is a patient's id", line=5)])


@case("tables", "vitals: date and time of day in two columns (a flowsheet export)", ACCEPTED)
def _(ctx):
  # Every row was set aside ("time '10:00 PM' is neither hours nor an ISO timestamp").
  rows = [f"{pid},{day},{clock},{70 + i + h},{110 + i},{70 + h},{14 + h},{97 + (i % 3)},36.{h}"
          for i, pid in enumerate(IDS)
          for h, (day, clock) in enumerate((("03/01/2024", "10:00 PM"), ("03/01/2024", "11:00 PM"),
                                            ("03/02/2024", "12:00 AM")))]
  return _tables(ctx, vitals=table("patient_id,Date,Time," + ",".join(lib.CHANNELS), rows),
                 checks=[lib.table_info("vitals.csv", "times_dated",
                                        {"date_column": "Date", "rows": 30}),
                         lib.table_info("vitals.csv", "rows_quarantined", 0)])


@case("tables", "vitals: HL7 compact timestamps (202403012200)", ACCEPTED)
def _(ctx):
  # Read as hours since admission: every row past the last step, the vitals lost.
  return _tables(ctx, vitals=_vitals_times(["202403012200", "20240301230000", "202403020000"]),
                 checks=[lib.table_info("vitals.csv", "rows_past_last_step", 0),
                         lib.table_info("vitals.csv", "rows_quarantined", 0)])


@case("tables", "vitals: a bedside monitor's column names (NIBP Systolic, Resp Rate)", ACCEPTED)
def _(ctx):
  # The file was refused: "channel columns ['sbp', 'dbp'] not found".
  return _tables(ctx, vitals=table("MRN,Time,Pulse,NIBP Systolic,NIBP Diastolic,Resp Rate,"
                                   "SpO2 (%),Temp (F)", [
                                       f"{pid},{h},{70 + i},{110 + i},{70 + h},{14 + h},98,"
                                       f"{98.2 + 0.2 * h:.1f}"
                                       for i, pid in enumerate(IDS) for h in range(3)]),
                 checks=[lib.table_info("vitals.csv", "fahrenheit_to_celsius", 30),
                         lib.table_info("vitals.csv", "rows_quarantined", 0)])


@case("tables", "labs long: an HL7 export's names (observation_identifier, _value)", ACCEPTED)
def _(ctx):
  # Read as wide: one analyte 'observation_value' mixing sodium and potassium.
  rows = [f"{pid},2024030{1 + k}0800,{a},{v},mmol/L" for i, pid in enumerate(IDS)
          for k, (a, v) in enumerate((("Sodium", 135 + i), ("Potassium", 4.0)))]
  return _tables(ctx, labs=table("patient_id,observation_datetime,observation_identifier,"
                                 "observation_value,units", rows),
                 checks=[_analytes(["Potassium", "Sodium"]), _lab_value(IDS[2], "Sodium", 137)])


@case("tables", "labs long under names of no long file (obx_3, obx_5)", CLEAR)
def _(ctx):
  rows = [f"{pid},{a},{v}" for i, pid in enumerate(IDS)
          for a, v in (("Sodium", 135 + i), ("Potassium", 4.0))]
  return _tables(ctx, labs=table("patient_id,obx_3,obx_5", rows),
                 error="labs.csv: column 2 ('obx_3') names analytes ('Sodium', 'Potassium', ...) "
                       "as a long file's analyte column does")


@case("tables", "labs: a French export's thousands grouped by spaces ('250 000')", ACCEPTED)
def _(ctx):
  # Every platelet count was 'not a number', set to missing.
  rows = [f"{pid};{135 + i};{250 + 10 * i}\u00a0000;5,{i}" for i, pid in enumerate(IDS)]
  return _tables(ctx, labs=table("patient_id;Na;Platelets;Glucose", rows),
                 checks=[_lab_value(IDS[3], "Platelets", 280.0),
                         lib.table_info("labs.csv", "values_set_missing", {}),
                         lib.table_info("labs.csv", "thousands_separators", 10)])
