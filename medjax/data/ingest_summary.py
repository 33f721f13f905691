"""The ingest's summary (summary.json under ingest/) and the table a user reads after an ingest."""

from __future__ import annotations

import collections
import re

import numpy as np

from medjax.data import manifest as manifest_lib


# The kinds of values set to missing (`tables.values`), as the summary words them.
_VALUE_KINDS = (("out_of_range", "out of range"), ("not_a_number", "not a number"),
                ("non_finite", "not finite"), ("beyond_float32", "beyond float32"),
               ("ambiguous_comma", "decimal comma or thousands separator"))


def summarize(manifest, quarantine, files_seen: int, scan_s: float, vitals_late: int) -> dict:
  """Counts for the ingest report: patients, modality groups, missingness, classes, quarantine."""
  mask = manifest.modality_mask
  groups = collections.Counter(manifest_lib.group_name(m) for m in mask)
  n = max(len(manifest), 1)
  reasons = collections.Counter(_reason_key(q) for q in quarantine)
  return {
      "patients": len(manifest),
      "splits": {s: int(np.sum(manifest.split == s)) for s in manifest_lib.SPLITS},
      "groups": {g: groups.get(g, 0) for g in manifest_lib.group_names()},
      "missing": {"images": round(float(np.mean(~mask[:, 0])) if len(manifest) else 0, 4),
                  "labs": round(float(np.mean(~mask[:, 1])) if len(manifest) else 0, 4),
                  "vitals": round(float(np.mean(~mask[:, 2])) if len(manifest) else 0, 4)},
      "images": int(manifest.num_images.sum()),
      "images_per_patient_with_images": round(
          float(manifest.num_images[mask[:, 0]].mean()) if mask[:, 0].any() else 0.0, 3),
      "classes": {c: int(np.sum(manifest.labels == i))
                  for i, c in enumerate(manifest.class_names)},
      "dicom_files": files_seen,
      "scan_files_per_s": round(files_seen / scan_s, 1) if scan_s > 0 else None,
      "quarantined": len(quarantine),
      "quarantine_reasons": dict(reasons.most_common()),
      "vitals_rows_past_last_step": vitals_late,
      "records_per_group_fraction": {g: round(c / n, 4) for g, c in groups.items()},
  }


def format_summary(summary: dict) -> str:
  """The ingest summary as a plain-text table for the terminal and logs."""
  lines = [f"patients {summary['patients']}  (train {summary['splits']['train']}, "
           f"val {summary['splits']['val']}, test {summary['splits']['test']})",
           f"DICOM files {summary['dicom_files']}, images {summary['images']}, "
           f"quarantined {summary['quarantined']}",
           "modality group   patients",
           *[f"  {g:<14} {c:>8}" for g, c in summary["groups"].items()],
           "missing          fraction",
           *[f"  {m:<14} {v:>8.3f}" for m, v in summary["missing"].items()]]
  if summary["classes"]:
    lines.append(_class_line(summary["classes"]))
  if "accounting" in summary:
    lines.append(_accounting_line(summary["accounting"]))
  lines += _table_lines(summary.get("tables", {}))
  if summary["quarantine_reasons"]:
    lines.append("quarantine reasons")
    lines += [f"  {k:>5}  {r}" for r, k in summary["quarantine_reasons"].items()]
  return "\n".join(lines)


def _accounting_line(counts: dict) -> str:
  """Where every file and patient went (`medjax.data.accounting`)."""
  f, p = counts["files"], counts["patients"]
  return (f"accounted for: {f['under_root']} files ({f['in_manifest']} in the manifest, "
          f"{f['quarantined']} quarantined, {f['tables_read']} tables read), {p['named']} "
          f"patients ({p['in_manifest']} in the manifest, {p['quarantined']} left out)")


def _reason_key(entry: dict) -> str:
  """A quarantine reason without its particulars (line numbers, values), to count by kind."""
  if entry.get("set_aside") == "values":
    return "values set to missing"
  head = re.sub(r"\([^)]*\)", "", entry["reason"].split(":")[0].split(";")[0])
  head = re.sub(r"\d+", "N", re.sub(r"'[^']*'", "'...'", head))
  return " ".join(head.split())[:60]


def _class_line(classes: dict[str, int], spelled_out: int = 8) -> str:
  """All classes with counts and shares when few; else the three largest and three smallest."""
  ranked = sorted(classes.items(), key=lambda kv: (-kv[1], kv[0]))
  total = max(sum(classes.values()), 1)

  def show(items):
    return ", ".join(f"{c} {k} ({100 * k / total:.1f}%)" for c, k in items)

  if len(ranked) <= spelled_out:
    return f"classes {len(ranked)}: {show(ranked)}"
  return (f"classes {len(ranked)}: largest {show(ranked[:3])}; smallest "
          f"{show(ranked[-3:][::-1])}")


def tables_summary(problems, quarantine, id_counts: dict, spellings: dict[str, int],
                   fold: bool) -> dict:
  """summary['tables']: per file its format and row counts, values set aside, id linkage."""
  out: dict = {}
  set_aside = collections.Counter(q["path"] for q in quarantine
                                  if q.get("stage") == "tables" and q.get("set_aside") == "row")
  values: dict[str, dict[str, int]] = {k: {} for k, _ in _VALUE_KINDS}
  for name, info in problems.files.items():
    entry = {k: v for k, v in info.items() if k != "values"}
    entry["rows_quarantined"] = set_aside.get(name, 0)
    entry["values_set_missing"] = {kind: dict(cols) for kind, cols in
                                   info.get("values", {}).items()}
    for kind, cols in info.get("values", {}).items():
      for col, k in cols.items():
        values[kind][col] = values[kind].get(col, 0) + k
    out[name] = entry
  for kind, cols in values.items():
    out[f"values_{kind}"] = cols
  out.update(spellings)   # ids_case_only_mismatch, ids_leading_zeros_only_mismatch, ...
  out["ids_case_insensitive"] = fold
  out["ids"] = id_counts
  return out


# A table's counts of what it read besides plain values, as the ingest table names them.
_READ_COUNTS = (
    ("ids_written_as_floats", "ids written as floats ('123.0', as pandas writes an integer "
     "column with a gap) read as their digits"),
    ("ids_as_text_formulas", "ids written as a spreadsheet's text formula ('=\"00123\"') read "
     "as their text"),
    ("unicode_numbers", "numbers in full-width digits or with a Unicode minus ('−2.5') read"),
    ("fields_across_lines", "records whose quoted field spans lines (a comment's line breaks) "
     "read whole"),
    ("repeated_headers", "lines repeating the header (files joined end to end) set aside"),
    ("sql_tool_lines", "lines of a SQL tool's text output (a rule of dashes, '(42 rows "
     "affected)') set aside"),
    ("decimal_commas", "decimal commas read"),
    ("values_flagged", "values with the lab's abnormal flag ('5.6 H', '140 (L)', '7.8*') read "
     "as their numbers"),
    ("units_in_cells", "values written with their unit ('140 mmol/L') read as numbers in "
     "it"),
    ("thousands_separators", "numbers with thousands separators read ('250,000', '250 000')"),
    ("missing_dots", "cells of '.' (SAS's and Stata's missing value) read as missing"),
    ("values_at_limit", "values beyond an assay's limit ('<0.01', '>60') read at the limit"),
    ("later_draws", "later draws not used (each patient's earliest value of an analyte is)"),
    ("values_from_text", "values read from its text value column where the numeric one was "
     "empty"),
    ("rows_other_items", "rows of other measurements than the channels not read"),
    ("si_units_converted", "values in SI units or counts per µL (creatinine µmol/L, haemoglobin "
     "g/L, platelets /µL) converted to the conventional units the plausible ranges use"),
    ("units_rescaled", "values in a multiple of their analyte's unit (CRP mg/dL among rows in "
     "mg/L) converted to it"),
    ("si_units_by_value", "values read as SI units or counts per µL by their values (most of the "
     "column's lay in the plausible range only so: haemoglobin 140 g/L, platelets 250,000/µL) and "
     "converted to the conventional units"),
    ("pressures_split", "blood pressures written as systolic/diastolic ('120/80') split into "
     "sbp and dbp"),
    ("units_not_converted", "columns in a unit medjax does not convert to the analyte's "
     "(set aside)"),
    ("date_columns", "columns of dates or times not read as analytes"),
    ("text_columns", "columns of text and no number (nor categories) not read as analytes"),
    ("fahrenheit_to_celsius", "temperatures in Fahrenheit converted to Celsius"),
    ("fahrenheit_by_value", "temperatures read as Fahrenheit by their values (most of the "
     "column's lay in the plausible range only so) and converted to Celsius"))


def _table_lines(tables_summary: dict) -> list[str]:
  """format_summary's lines about the tables: only what is not the default or not zero."""
  lines = []
  for name, info in tables_summary.items():
    if not name.endswith(".csv"):
      continue
    notes = []
    if info.get("encoding") not in ("utf-8", None):
      notes.append(f"read as {info['encoding']} (not UTF-8)")
    if info.get("delimiter", ",") != ",":
      notes.append(f"delimiter {info['delimiter']!r}")
    if info.get("channel_columns"):
      notes.append("channels from columns " + ", ".join(
          f"{c} {name!r}" for c, name in info["channel_columns"].items()))
    notes += [f"{info[key]} {text}" for key, text in _READ_COUNTS if info.get(key)]
    if info.get("analyte_codes"):
      notes.append(f"analytes named by their {info['analyte_codes']!r} codes (join the code "
                   "table's names, e.g. MIMIC's d_labitems label, or map them with "
                   "config.data.rename, for the built-in plausible ranges)")
    for key, what in (("categorical_columns", "column"), ("categorical_analytes", "analyte")):
      cats = info.get(key) or {}
      if cats:
        notes.append(f"{len(cats)} categorical {what}{'s' if len(cats) > 1 else ''} as 0/1 "
                     "indicators (" + ", ".join(f"{c} {len(k)}"
                                                for c, k in list(cats.items())[:5])
                     + (", ..." if len(cats) > 5 else "") + ")")
    if info.get("date_order"):
      notes.append(f"dates read {info['date_order']}" + (
          " (set config.data.date_order if not)" if "assumed" in info["date_order"] else ""))
    if info.get("units_line"):
      notes.append(f"line {info['units_line']} read as the columns' units")
    if info.get("rows_quarantined"):
      notes.append(f"{info['rows_quarantined']} of {info.get('rows', 0)} rows set aside")
    if info.get("columns_not_read"):
      n = len(info["columns_not_read"])
      notes.append(f"{n} column{'s' if n > 1 else ''} not read "
                   f"({', '.join(info['columns_not_read'][:5])}: it gives each patient's class "
                   "and split; measurements go in labs.csv)")
    if info.get("split_column"):
      notes.append(f"the split from its {info['split_column']!r} column")
    if info.get("rows_past_last_step"):
      notes.append(f"{info['rows_past_last_step']} rows past the last step")
    if notes:
      lines.append(f"{name}: " + ", ".join(notes))
  parts = [f"{text} " + ", ".join(f"{c} {k}" for c, k in tables_summary[f"values_{kind}"].items())
           for kind, text in _VALUE_KINDS if tables_summary.get(f"values_{kind}")]
  if parts:
    lines.append("values set to missing: " + "; ".join(parts))
  if tables_summary.get("ids_case_only_mismatch"):
    lines.append(f"ids differing only by letter case: {tables_summary['ids_case_only_mismatch']} "
                 "(kept apart; set config.data.ids_case_insensitive=True if they are the same "
                 "patients)")
  if tables_summary.get("ids_leading_zeros_only_mismatch"):
    lines.append("ids differing only by leading zeros: "
                 f"{tables_summary['ids_leading_zeros_only_mismatch']} (kept apart; a spreadsheet "
                 "drops them: export the ids as text if they are the same patients)")
  if tables_summary.get("ids_in_scientific_notation"):
    lines.append(f"ids in scientific notation: {tables_summary['ids_in_scientific_notation']} "
                 "(a spreadsheet's 1.23E+11, digits lost: export the ids as text)")
  ids = tables_summary.get("ids", {})
  if ids.get("labels_without_data") or ids.get("data_without_label"):
    lines.append(f"labels without data {ids.get('labels_without_data', 0)}, patients with data "
                 f"but no label {ids.get('data_without_label', 0)}")
  return lines
