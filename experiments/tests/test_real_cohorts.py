"""experiments/real_cohorts: the four public cohorts convert and ingest with every patient kept."""

import os

import numpy as np
import pytest

from configs import default as default_config
from experiments.real_cohorts import cohorts
from medjax.data import ingest


@pytest.mark.parametrize("name", sorted(cohorts.COHORTS))
def test_a_public_cohort_converts_and_ingests_with_every_patient_kept(tmp_path, name):
  counts = cohorts.write(name, str(tmp_path / name))
  config = default_config.get_config()
  result = ingest.run(config, str(tmp_path / "work"), str(tmp_path / name))
  assert len(result.manifest) == counts["patients"] > 250
  assert sorted(result.manifest.class_names) == sorted(counts["labels"])
  assert result.tables["labs"].shape == (counts["patients"], counts["features"])
  assert np.isfinite(result.tables["labs"]).all() and result.quarantine == []
  with open(tmp_path / name / "labels.csv") as f:
    text = f.read()
  assert text.count("\n") == counts["patients"] + 1 and "fake" not in text


def test_labels_leave_out_patients_censored_before_five_years():
  ids, labels, features, counts = cohorts.table("rotterdam")
  assert set(labels) == {"recurrence_5y", "no_recurrence_5y"}
  assert counts["left_out_without_label"] > 0 and len(ids) == len(set(ids)) == len(features)
  for outcome in ("rtime", "recur", "dtime", "death"):
    assert outcome not in features.columns
