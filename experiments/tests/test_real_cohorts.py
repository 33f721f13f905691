"""experiments/real_cohorts: the four public cohorts convert and ingest with every patient kept; the
comparison's plumbing; configs/tables.py end to end on one of them."""

import json
import os

import numpy as np
import pytest

from configs import default as default_config
from experiments.real_cohorts import baselines, cohorts, compare, reference
from medjax.data import ingest
from tests import runs


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


def test_baselines_fit_on_the_split_medjax_ingested(tmp_path):
  # The comparison's plumbing without training medjax: the seed's salt, medjax's ingest of the
  # cohort, every patient's split read back through its pseudonym, the baselines on that split.
  cohorts.write("pbc", str(tmp_path / "pbc"))
  salt = compare.salt_file(str(tmp_path), seed=3)
  config = default_config.get_config()
  config.data.salt_file, config.seed = salt, 3
  result = ingest.run(config, str(tmp_path / "work"), str(tmp_path / "pbc"))
  ids, labels, features, _ = cohorts.table("pbc")
  split = compare.split_of(str(tmp_path / "work"), ids, salt)
  for name in ("train", "val", "test"):
    assert (split == name).sum() == len(result.manifest.indices(name))
  y = (labels == "died_5y").astype(int)
  x = features.to_numpy(np.float64)
  parts = [x[split == "train"], y[split == "train"], x[split == "val"], y[split == "val"],
           x[split == "test"]]
  for method, least in (("majority", 0.5), ("logistic", 0.75), ("trees", 0.75)):
    p, _ = baselines.METHODS[method](*parts, seed=0)
    score = baselines.scores(p, y[split == "test"])
    assert score["auroc"] >= least and 0 <= score["ece"] <= 1, (method, score)


def test_paired_interval_is_students_t_over_seeds():
  got = compare.paired([0.80, 0.82, 0.81, 0.79, 0.83], [0.79, 0.80, 0.80, 0.80, 0.80])
  d = np.array([0.01, 0.02, 0.01, -0.01, 0.03])
  half = 2.7764451 * d.std(ddof=1) / np.sqrt(5)
  np.testing.assert_allclose([got["mean"], got["lo"], got["hi"]],
                             [d.mean(), d.mean() - half, d.mean() + half], rtol=1e-6)


def test_a_labels_record_gathers_the_cohorts_and_seeds_of_its_comparisons(tmp_path):
  # Two comparisons of one label run side by side (pbc's extra seeds; covid's seeds in two
  # halves) and one made earlier: the label's JSON holds all of them, seeds in order.
  path, cfg, over = str(tmp_path / "real_cohorts_x.json"), "configs/tables.py", ["--config.a=1"]
  run = lambda auroc: {"medjax": {"auroc": auroc}}
  first = compare.merged(path, cfg, over, {"pbc": {k: run(0.8) for k in range(10)},
                                           "nwtco": {0: run(0.7)}})
  with open(path, "w") as f:
    json.dump({"config": cfg, "overrides": over, "per_seed": first}, f)
  got = compare.merged(path, cfg, over, {"pbc": {10: run(0.9), 2: run(0.5)},
                                         "covid_testing": {5: run(0.6)}})
  assert list(got["pbc"]) == [str(k) for k in range(11)]
  assert got["pbc"]["2"] == run(0.5) and got["pbc"]["3"] == run(0.8)
  assert list(got["nwtco"]) == ["0"] and list(got["covid_testing"]) == ["5"]
  with pytest.raises(ValueError, match="its own --label"):
    compare.merged(path, cfg, ["--config.a=2"], {"pbc": {0: run(0.8)}})


def test_the_tables_config_trains_on_a_public_cohort_and_reports_calibration(tmp_path):
  # End to end, as a user runs it (shortened): the labs' bin edges from the training data, the
  # best checkpoint by validation log-loss, 4 members, and for nwtco (14% relapses) the
  # validation threshold.
  cohorts.write("nwtco", str(tmp_path / "nwtco"))
  work = str(tmp_path / "work")
  rc = runs.run(work, f"--config.data.root={tmp_path / 'nwtco'}", "--config.optim.epochs=3",
                "--config.fault.supervised=False", "--config.evals.bootstrap=20",
                config="configs/tables.py")
  assert rc == 0, runs.tail(work)
  with open(os.path.join(work, "summary.json")) as f:
    test = json.load(f)["test"]
  assert test["auroc"] > 0.65
  assert 0 <= test["calibration"]["ece"] <= 1 and len(test["calibration"]["bins"]) == 10
  assert 0 < test["validation_threshold"]["threshold"] < 1
  assert test["validation_threshold"]["sensitivity"] > test["sensitivity"]
  assert os.path.exists(os.path.join(work, "reliability.png"))


def test_the_nwtco_reference_model_codes_histology_stage_and_their_interaction():
  """experiments/real_cohorts/reference.py: the clinical design (unfavourable histology, stages
  2-4, their products, local histology, study 4, an age spline) with the spline fitted on the
  rows it is given and reused on others."""
  _, _, features, _ = cohorts.table("nwtco")
  x, spline = reference.design(features.iloc[:1000])
  assert x.shape[0] == 1000 and np.isfinite(x).all()
  unfavourable, stages, products = x[:, 0], x[:, 1:4], x[:, 4:7]
  np.testing.assert_array_equal(products, unfavourable[:, None] * stages)
  np.testing.assert_array_equal(stages.sum(1), (features["stage"].iloc[:1000] > 1).to_numpy())
  y, _ = reference.design(features, spline)
  np.testing.assert_allclose(y[:1000], x)
