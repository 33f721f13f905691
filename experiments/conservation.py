"""Conservation at ingest: where every patient and file of a cohort went, on the quickstart's
synthetic cohort as it is and on a copy with random damage (issue 32).

  python -m experiments.conservation [--patients 6000] [--seed 0]

The damaged copy gets, at random: label rows with an unknown class, a stray control byte,
broken quoting or an extra field; lab rows with a control byte and values beyond float32 or
outside the plausible range; vitals rows with a mistyped time; DICOM files with a blank
PatientID, an instance shared with another patient, or garbage bytes; files outside the
cohort's layout. For each cohort it prints and writes the ingest's accounting (files: under the
root, in the manifest, quarantined, tables read; patients: named, in the manifest, left out)
and checks it against what was written: every damaged patient is accounted for with its reason.
Writes experiments/results/conservation.json and .md.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import shutil
import tempfile
import time

import pydicom

from configs import quickstart
from medjax.data import ingest
from medjax.data import synthetic

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def _damage(root: str, rng: random.Random, fraction: float) -> dict[str, int]:
  """Breaks a `fraction` of rows and files of each kind in place; returns what it broke."""
  broken = collections.Counter()

  def rewrite(name, breakers):
    path = os.path.join(root, name)
    with open(path, encoding="utf-8") as f:
      header, *rows = f.read().splitlines()
    for i, row in enumerate(rows):
      if rng.random() < fraction:
        kind, fix = rng.choice(breakers)
        rows[i] = fix(row)
        broken[f"{name}: {kind}"] += 1
    with open(path, "w", encoding="utf-8") as f:
      f.write("\n".join([header, *rows]) + "\n")

  def field(row, k, value):
    cells = row.split(",")
    cells[k] = value
    return ",".join(cells)

  rewrite("labels.csv", [
      ("unknown class", lambda r: field(r, 1, "Measles")),
      ("control byte", lambda r: r + "\x01"),
      ("broken quoting", lambda r: field(r, 1, '"' + r.split(",")[1])),
      ("extra field", lambda r: r + ",x")])
  rewrite("labs.csv", [
      ("control byte", lambda r: r.replace(",", ",\x02", 1)),
      ("beyond float32", lambda r: field(r, 1, "3.5e38")),
      ("far beyond float32", lambda r: field(r, 2, "-1e300")),
      ("implausible", lambda r: field(r, 1, "14000"))])
  rewrite("vitals.csv", [
      ("mistyped hour", lambda r: field(r, 1, str(float(r.split(",")[1]) + 1000))),
      ("unparseable time", lambda r: field(r, 1, "soon")),
      ("a timestamp among hours", lambda r: field(r, 1, "2024-01-01T00:00:00"))])
  files = sorted(os.path.join(d, f) for d, _, fs in os.walk(os.path.join(root, "dicom"))
                 for f in fs if f.endswith(".dcm"))
  uids = {}
  for path in files:
    if rng.random() >= fraction:
      continue
    kind = rng.choice(["blank PatientID", "shared instance", "garbage"])
    broken[f"dicom: {kind}"] += 1
    if kind == "garbage":
      with open(path, "wb") as f:
        f.write(os.urandom(512))
      continue
    ds = pydicom.dcmread(path)
    if kind == "blank PatientID":
      ds.PatientID = ""
    else:
      uid = uids.setdefault("uid", ds.SOPInstanceUID)
      ds.SOPInstanceUID = uid
      ds.file_meta.MediaStorageSOPInstanceUID = uid
    ds.save_as(path)
  for k in range(3):
    with open(os.path.join(root, f"export_notes_{k}.txt"), "w") as f:
      f.write("not a cohort file\n")
    broken["files outside the layout"] += 1
  return dict(broken)


def _ingest(root: str, workdir: str, classes: tuple[str, ...]) -> dict:
  config = quickstart.get_config()
  config.data.classes = classes   # declared, as a user who knows their classes does
  t0 = time.perf_counter()
  result = ingest.run(config, workdir, root)
  left = collections.Counter(q["reason"].split(":")[0].split(";")[0]
                             for q in result.quarantine if q.get("patient"))
  return {"accounting": result.summary["accounting"], "seconds": round(time.perf_counter() - t0, 1),
          "patients_left_out_by_reason": dict(left.most_common()),
          "quarantine_entries": len(result.quarantine)}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--patients", type=int, default=6000)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--fraction", type=float, default=0.03,
                      help="share of rows and files of each kind to break")
  parser.add_argument("--out", default=os.path.join(RESULTS, "conservation.json"))
  args = parser.parse_args()
  scratch = tempfile.mkdtemp(prefix="medjax-conservation-")
  try:
    cfg = quickstart.get_config().data.synthetic
    cfg.num_patients = args.patients
    clean = os.path.join(scratch, "clean")
    synthetic.generate(cfg, clean)
    damaged = os.path.join(scratch, "damaged")
    shutil.copytree(clean, damaged)
    broken = _damage(damaged, random.Random(args.seed), args.fraction)
    with open(os.path.join(clean, "labels.csv"), encoding="utf-8") as f:
      classes = tuple(sorted({line.rsplit(",", 1)[1] for line in f.read().splitlines()[1:]}))
    out = {"patients": args.patients, "seed": args.seed, "fraction": args.fraction,
           "quickstart": _ingest(clean, os.path.join(scratch, "w-clean"), classes),
           "damaged": {"broken": broken,
                       **_ingest(damaged, os.path.join(scratch, "w-damaged"), classes)}}
  finally:
    shutil.rmtree(scratch, ignore_errors=True)
  for name in ("quickstart", "damaged"):
    counts = out[name]["accounting"]
    f, p = counts["files"], counts["patients"]
    assert f["under_root"] == f["in_manifest"] + f["quarantined"] + f["tables_read"], f
    assert p["named"] == p["in_manifest"] + p["quarantined"], p
    print(f"{name}: {f['under_root']} files = {f['in_manifest']} in the manifest + "
          f"{f['quarantined']} quarantined + {f['tables_read']} tables; {p['named']} patients = "
          f"{p['in_manifest']} in the manifest + {p['quarantined']} left out")
  print("broken:", json.dumps(out["damaged"]["broken"]))
  print("left out by reason:", json.dumps(out["damaged"]["patients_left_out_by_reason"]))
  with open(args.out, "w") as f:
    json.dump(out, f, indent=1)
  with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
    f.write(_markdown(out))
  print(f"wrote {args.out}")


def _markdown(out: dict) -> str:
  lines = ["# Conservation at ingest", "",
           f"`python -m experiments.conservation` ({out['patients']} patients, seed "
           f"{out['seed']}, {out['fraction']:.0%} of each kind broken in the damaged copy). Every "
           "file and patient ends in exactly one place; ingest checks it and fails if not.", "",
           "| cohort | files under the root | in the manifest | quarantined | tables read | "
           "patients named | in the manifest | left out | ingest s |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
  for name in ("quickstart", "damaged"):
    f, p = out[name]["accounting"]["files"], out[name]["accounting"]["patients"]
    lines.append(f"| {name} | {f['under_root']} | {f['in_manifest']} | {f['quarantined']} | "
                 f"{f['tables_read']} | {p['named']} | {p['in_manifest']} | {p['quarantined']} | "
                 f"{out[name]['seconds']} |")
  lines += ["", "What the damaged copy broke:", ""]
  lines += [f"- {k}: {v}" for k, v in sorted(out["damaged"]["broken"].items())]
  lines += ["", "Patients left out of the damaged copy, by reason:", ""]
  lines += [f"- {k}: {v}" for k, v in out["damaged"]["patients_left_out_by_reason"].items()]
  return "\n".join(lines) + "\n"


if __name__ == "__main__":
  main()
