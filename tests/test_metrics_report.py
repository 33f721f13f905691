"""Evaluation reports for cohorts unlike the synthetic one: 2 classes, no oracle, absent subsets.

Metric values are checked against hand-built probabilities and labels; the summary is checked to
be strict JSON and its table to read sensibly for 2, 3 and 37 classes.
"""

import csv
import json
import math
import os

from hypothesis import given, settings, strategies as st
import numpy as np
import pytest

from medjax.config_check import rules
from medjax.data import manifest as manifest_lib
from medjax.evals import metrics
from medjax.evals import splits
from medjax.evals import summary as summary_lib
from medjax.evals import table as table_lib

# p(class 0), p(class 1) for 6 records; labels below. Argmax: 0 1 0 1 0 0 (the 0.5 tie is class 0).
BINARY_P = np.array([[.9, .1], [.2, .8], [.6, .4], [.3, .7], [.5, .5], [.8, .2]])
BINARY_Y = np.array([0, 1, 1, 0, 1, 0])


def _manifest(labels_N, split_N, subsets_N, class_names):
  n = len(labels_N)
  mask = np.array([[m in s for m in manifest_lib.MODALITIES] for s in subsets_N], bool)
  return manifest_lib.Manifest(
      record_ids=np.array([f"r-{i}" for i in range(n)]), labels=np.asarray(labels_N, np.int32),
      modality_mask=mask, num_images=mask[:, 0].astype(np.int32), cost=np.zeros(n, np.float32),
      split=np.asarray(split_N), image_files=[[] for _ in range(n)], class_names=class_names)


def _binary_summary(bootstrap=100):
  """A table-only 2-class cohort: 40 train records (balanced), the 6 test records above."""
  labels = np.r_[np.arange(40) % 2, BINARY_Y]
  split = np.array(["train"] * 40 + ["test"] * 6)
  subsets = ["LV"] * 40 + ["LV", "LV", "LV", "L", "L", "V"]
  manifest = _manifest(labels, split, subsets, ["no", "yes"])
  test = splits.split_metrics(manifest, manifest.indices("test"), BINARY_P,
                                bootstrap=bootstrap)
  return {"test": test, "ceiling": None,
          "not_applicable": {"ceiling": table_lib.NO_ORACLE}}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([0.0, 0.1, 0.25, 0.5, 0.9, 1.0, float("inf"), -1e-9]),
                min_size=1, max_size=40))
def test_average_ranks_are_scipys_rankdata(values):
  # The evaluation ranks scores itself (scipy.stats costs ~1 s to import at a run's first
  # evaluation); ties share their mean rank, as rankdata's default.
  from scipy import stats  # pylint: disable=import-outside-toplevel
  x = np.array(values, np.float32)
  np.testing.assert_allclose(metrics.average_ranks(x), stats.rankdata(x))


def _bootstrap_one_resample_at_a_time(probs_NxK, labels_N, samples, seed):
  """The bootstrap as it was written before its resamples were counted at once."""
  rng = np.random.default_rng(seed)
  draws = {}
  for _ in range(samples):
    idx = rng.integers(0, len(labels_N), len(labels_N))
    out = metrics.core(probs_NxK[idx], labels_N[idx])
    if probs_NxK.shape[1] == 2:
      values, _ = metrics.binary(probs_NxK[idx], labels_N[idx])
      out.update({k: values[k] for k in ("sensitivity", "specificity", "auroc", "auprc")})
    for k, v in out.items():
      draws.setdefault(k, [])
      if v is not None:
        draws[k].append(v)
  return {k: [float(np.percentile(v, 2.5)), float(np.percentile(v, 97.5))]
          if len(v) * 2 >= samples and v else [None, None] for k, v in draws.items()}


@pytest.mark.parametrize("n,k,cells", [(1, 3, 2_000_000), (60, 37, 2_000_000), (60, 37, 5000),
                                       (40, 2, 2_000_000), (40, 2, 100), (300, 5, 1000)])
def test_bootstrap_counts_resamples_at_once_as_one_at_a_time(monkeypatch, n, k, cells):
  # Same draws, same intervals; `cells` forces chunks of resamples (one per chunk at 100).
  monkeypatch.setattr(metrics, "_BOOTSTRAP_CELLS", cells)
  rng = np.random.default_rng(n * k)
  probs = rng.dirichlet(np.ones(k), n)
  labels = rng.integers(0, k, n)
  got = metrics.bootstrap(probs, labels, samples=200, seed=7)
  want = _bootstrap_one_resample_at_a_time(probs, labels, 200, 7)
  assert got.keys() == want.keys()
  for key, interval in want.items():
    assert got[key] == pytest.approx(interval, rel=1e-12, abs=1e-15) if None not in interval \
        else got[key] == interval, key


def test_auroc_of_a_nan_score_is_nan():
  assert math.isnan(metrics.auroc(np.array([0.1, np.nan, 0.3]), np.array([True, False, False])))


def test_binary_metrics_by_hand():
  out = metrics.classification(BINARY_P, BINARY_Y, metrics.rare_classes(BINARY_Y, 2))
  # Positives (class 1) are records 1, 2, 4; predicted positive: 1 and 3 (4 is a tie at 0.5).
  assert out["sensitivity"] == pytest.approx(1 / 3)
  assert out["specificity"] == pytest.approx(2 / 3)
  assert (out["positives"], out["negatives"]) == (3, 3)
  # p(yes) ranks: positives .8 .4 .5 vs negatives .1 .7 .2: pairs won 3 + 2 + 2 of 9.
  assert out["auroc"] == pytest.approx(7 / 9)
  assert out["auroc_macro"] == pytest.approx(7 / 9)
  # Descending p(yes): .8+ .7- .5+ .4+ .2- .1-: AP = (1 + 2/3 + 3/4) / 3.
  assert out["auprc"] == pytest.approx((1 + 2 / 3 + 3 / 4) / 3)
  assert out["accuracy"] == pytest.approx(3 / 6)
  assert out["top3_accuracy"] is None and out["rare_recall"] is None
  assert out["not_applicable"] == {"top3_accuracy": "2 classes",
                                   "rare_recall": "no class under 5% of training records"}
  json.dumps(out, allow_nan=False)


def test_average_precision_ties_form_one_threshold():
  positive = np.array([1, 0, 1, 0], bool)
  assert metrics.average_precision(np.array([.8, .7, .6, .5]), positive) == pytest.approx(
      (1 + 2 / 3) / 2)
  # All tied: one operating point, precision 2/4 at recall 1.
  assert metrics.average_precision(np.full(4, .5), positive) == pytest.approx(0.5)
  assert metrics.average_precision(np.full(4, .5), np.zeros(4, bool)) is None


def test_binary_without_positives_says_why():
  probs, labels = BINARY_P[[0, 3, 5]], np.zeros(3, np.int64)
  out = metrics.classification(probs, labels, np.array([1]))
  assert out["sensitivity"] is None and out["auroc"] is None and out["auprc"] is None
  assert out["specificity"] == pytest.approx(2 / 3)
  assert out["not_applicable"]["sensitivity"] == "no positive records"
  assert out["not_applicable"]["rare_recall"] == "none of the 1 rare classes in these records"
  assert out["not_applicable"]["auroc_macro"] == "one class in the records"


def test_three_classes_have_no_top3_but_a_macro_auroc():
  probs = np.array([[.7, .2, .1], [.1, .6, .3], [.2, .3, .5], [.5, .1, .4]])
  labels = np.array([0, 1, 2, 1])
  out = metrics.classification(probs, labels, np.array([], np.int64))
  assert out["top3_accuracy"] is None and out["not_applicable"]["top3_accuracy"] == "3 classes"
  assert "sensitivity" not in out
  # Class 0: .7 vs .1 .2 .5 -> 1; class 1: .6 .1 vs .2 .3 -> 2/4; class 2: .5 vs .1 .3 .4 -> 1.
  assert out["auroc_macro"] == pytest.approx((1 + 0.5 + 1) / 3)
  assert out["accuracy"] == pytest.approx(3 / 4)
  assert metrics.top_k_accuracy(probs, labels, 2) == pytest.approx(3 / 4)  # record 3 misses
  assert "top3_accuracy" not in table_lib.metric_keys(out)


def test_37_classes_rare_recall_and_a_class_absent_from_test():
  k = 37
  rng = np.random.default_rng(0)
  # Training, 980 records: classes 0-9 90 each, 10-34 3 each, 35 4, 36 1. Rare (under 5%, 49
  # records): 10-36. With 37 classes at least 18 are rare whatever the cohort.
  train = np.r_[np.repeat(np.arange(10), 90), np.repeat(np.arange(10, 35), 3), [35] * 4, [36]]
  assert list(metrics.rare_classes(train, k)) == list(range(10, 37))
  # Test: every class but 20 (absent), class 36 twice (once right), class 35 once (wrong).
  labels = np.r_[[c for c in range(35) if c != 20], [36, 36, 35]]
  logits = rng.normal(size=(len(labels), k))
  logits[np.arange(len(labels)), labels] += 10.0  # all right ...
  logits[-2, 36] -= 20.0  # ... but one of the two class-36 records
  logits[-1, 35] -= 20.0  # ... and the class-35 record
  probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
  out = metrics.classification(probs, labels, metrics.rare_classes(train, k))
  # Rare classes with test records: 10-34 but 20 (24, all right), 36 (1 of 2), 35 (0 of 1).
  assert out["rare_recall"] == pytest.approx((24 + 1 / 2 + 0) / 26)
  assert out["per_class_f1"][20] is None or out["per_class_f1"][20] == 0.0
  assert len(out["per_class_f1"]) == k and out["count"] == len(labels)
  # Macro F1 averages the 36 classes present, not 37.
  cm = np.asarray(out["confusion"])
  present = cm.sum(1) > 0
  assert present.sum() == 36
  f1 = metrics.per_class_f1(cm)
  assert out["macro_f1"] == pytest.approx(np.mean(f1[present]))
  assert out["top3_accuracy"] is not None and out["top3_accuracy"] >= out["accuracy"]
  assert "sensitivity" not in out and "top3_accuracy" in table_lib.metric_keys(out)
  json.dumps(out, allow_nan=False)


def test_empty_records_give_none_never_nan():
  out = metrics.classification(np.zeros((0, 4)), np.zeros(0, np.int64), np.array([3]))
  assert all(out[k] is None for k in ("accuracy", "macro_f1", "top3_accuracy", "rare_recall",
                                      "auroc_macro", "ece"))
  assert out["not_applicable"]["accuracy"] == "no records"
  assert metrics.bootstrap(np.zeros((0, 2)), np.zeros(0, np.int64)) == {
      k: [None, None] for k in ("accuracy", "macro_f1", "sensitivity", "specificity", "auroc",
                                "auprc")}
  json.dumps(out, allow_nan=False)


def test_binary_summary_is_strict_json_with_reasons():
  summary = _binary_summary()
  text = json.dumps(summary_lib.strict_json(summary), allow_nan=False)
  test = json.loads(text)["test"]
  assert test["positive_class"] == "yes" and test["decision"] == "argmax, i.e. p(yes) > 0.5"
  assert test["rare_rule"] == "under 5% of training records" and test["rare_classes"] == []
  # Subsets without test records: count 0 and nulls (readers index every subset).
  assert test["by_subset"]["ILV"] == {"accuracy": None, "macro_f1": None, "count": 0}
  assert test["by_subset"]["L"]["count"] == 2
  assert test["table_iv"]["all3"] == {"count": 0, "accuracy": None, "macro_f1": None}
  assert test["table_iv"]["single"]["count"] == 3
  # Bootstrap intervals of the binary metrics bracket the point estimates.
  for key in ("accuracy", "sensitivity", "specificity", "auroc", "auprc"):
    lo, hi = test["ci95"][key]
    assert lo <= test[key] <= hi, key
  assert json.loads(text)["not_applicable"]["ceiling"].startswith("no oracle")


def test_strict_json_replaces_nan_left_anywhere():
  value = {"a": float("nan"), "b": [np.float32(1.5), np.float64(np.inf)], "c": np.int64(3)}
  assert summary_lib.strict_json(value) == {"a": None, "b": [1.5, None], "c": 3}
  json.dumps(summary_lib.strict_json(value), allow_nan=False)


def test_binary_table_reads_sensibly():
  table = table_lib.format_summary(_binary_summary())
  print(table)
  assert "nan" not in table.lower()
  assert "top-3" not in table and "top3" not in table
  for word in ("sensitivity", "specificity", "auroc", "auprc"):
    assert f"\n  {word} " in table
  assert "rare_recall      n/a (no class under 5% of training records)" in table
  assert "positive class 'yes'" in table and "3 of 6 records (50.0%)" in table
  assert "\ndecision: argmax, i.e. p(yes) > 0.5\n" in table
  assert f"Bayes ceiling n/a ({table_lib.NO_ORACLE})" in table
  assert "ceiling  " not in table.splitlines()[0]
  # Present subsets with their n; absent ones listed once, not as rows.
  rows = {line.split()[0]: line.split()[1:] for line in table.splitlines()
          if line.startswith("  ") and line.split()[0] in metrics.SUBSETS}
  assert {s: r[0] for s, r in rows.items()} == {"LV": "3", "L": "2", "V": "1"}
  assert "  no records: ILV, IL, IV, I" in table


def _table_before_issue_11(summary: dict) -> str:
  """format_summary as it was before this change, for a run where every value is defined."""
  test, ceil = summary.get("test", {}), summary.get("ceiling")
  lines = [f"{'test':<14}{'model':>8}{'ceiling':>9}{'ratio':>7}"]
  for key in ("accuracy", "macro_f1", "top3_accuracy", "rare_recall", "auroc_macro", "ece"):
    m = test.get(key)
    c = ceil.get(key) if ceil else None
    ratio = f"{m / c:7.3f}" if (m is not None and c) else ""
    lines.append(f"  {key:<12}{m:8.4f}" + (f"{c:9.4f}{ratio}" if c is not None else ""))
  lines.append(f"{'by subset':<14}{'n':>6}{'acc':>8}{'ceiling':>9}")
  for s, v in test.get("by_subset", {}).items():
    c = ceil["by_subset"][s]["accuracy"] if ceil else float("nan")
    lines.append(f"  {s:<12}{v['count']:6d}{v['accuracy']:8.4f}{c:9.4f}")
  return "\n".join(lines)


def _summary_37(subsets_pool, n_train=3000, n_test=700):
  """A 37-class report, 27 rare classes (0.7% each), model beside a better 'ceiling'."""
  k = 37
  rng = np.random.default_rng(1)
  prior = np.r_[np.full(10, 0.08), np.full(27, 0.2 / 27)]
  labels = rng.choice(k, n_train + n_test, p=prior)
  split = np.array(["train"] * n_train + ["test"] * n_test)
  subsets = rng.choice(subsets_pool, n_train + n_test)
  manifest = _manifest(labels, split, subsets, [f"class_{i:02d}" for i in range(k)])
  rows = manifest.indices("test")
  logits = rng.normal(size=(n_test, k))
  logits[np.arange(n_test), labels[rows]] += 2.0
  posterior = logits + 1.0 * np.eye(k)[labels[rows]]
  softmax = lambda x: np.exp(x) / np.exp(x).sum(1, keepdims=True)
  return {"test": splits.split_metrics(manifest, rows, softmax(logits), bootstrap=20),
          "ceiling": splits.split_metrics(manifest, rows, softmax(posterior), bootstrap=20)}


def test_37_class_table_matches_the_synthetic_report():
  summary = _summary_37(metrics.SUBSETS)
  assert len(summary["test"]["rare_classes"]) == 27
  assert summary["test"]["rare_recall"] is not None
  table = table_lib.format_summary(summary)
  assert table == _table_before_issue_11(summary)
  assert "nan" not in table and "top3_accuracy" in table and "sensitivity" not in table
  json.dumps(summary_lib.strict_json(summary), allow_nan=False)


def test_37_class_table_leaves_out_an_absent_subset():
  summary = _summary_37(["ILV", "IL", "LV", "L", "V"])
  table = table_lib.format_summary(summary)
  assert "nan" not in table and "top3_accuracy" in table
  lines = table.splitlines()
  assert lines[-1] == "  no records: IV, I"
  for s in ("IV", "I"):
    del summary["test"]["by_subset"][s]
  assert lines[:-1] == _table_before_issue_11(summary).splitlines()


def _write_table_cohort(root, n: int, seed: int = 0):
  """A 2-class, table-only cohort: labs.csv (wide), vitals.csv (yearly blood pressure),
  labels.csv; no dicom/ folder. About 15% positives, some patients without labs or vitals."""
  rng = np.random.default_rng(seed)
  os.makedirs(root)
  sick = rng.random(n) < 0.15
  with open(os.path.join(root, "labels.csv"), "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["patient_id", "diagnosis"])
    w.writerows([f"P{i:05d}", "yes" if s else "no"] for i, s in enumerate(sick))
  with open(os.path.join(root, "labs.csv"), "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["patient_id", "creatinine", "glucose", "hba1c", "ldl"])
    for i, s in enumerate(sick):
      if rng.random() < 0.2:
        continue  # no labs
      values = rng.normal([1.0, 100, 5.5, 120], [0.2, 15, 0.5, 25]) + s * np.array(
          [0.5, 30, 1.5, 20])
      w.writerow([f"P{i:05d}", *[f"{v:.2f}" if rng.random() > 0.1 else "" for v in values]])
  with open(os.path.join(root, "vitals.csv"), "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["patient_id", "hours", "sbp", "dbp"])
    for i, s in enumerate(sick):
      if rng.random() < 0.2:
        continue  # no blood pressure
      for year in range(int(rng.integers(1, 5))):
        sbp, dbp = rng.normal([125 + 15 * s, 80 + 8 * s], [12, 8])
        w.writerow([f"P{i:05d}", year * 8760, f"{sbp:.0f}", f"{dbp:.0f}"])


def test_two_class_table_only_cohort_end_to_end(tmp_path):
  """Ingest, train one epoch and evaluate a 2-class labs + blood pressure cohort (no images)."""
  from configs import quickstart  # pylint: disable=import-outside-toplevel
  from medjax.train import loop  # pylint: disable=import-outside-toplevel
  _write_table_cohort(str(tmp_path / "cohort"), 240)
  config = quickstart.get_config("tiny")
  config.data.root = str(tmp_path / "cohort")
  config.data.vitals_channels = ("sbp", "dbp")
  config.data.vitals_steps = 5
  config.data.vitals_hours_per_step = 8760.0  # one step a year
  config.optim.epochs = 1
  config.fault.ledger = False
  workdir = str(tmp_path / "run")
  loop.train_and_evaluate(config, workdir)

  with open(os.path.join(workdir, "summary.json")) as f:
    text = f.read()
  assert "NaN" not in text and "Infinity" not in text
  summary = json.loads(text)
  test = summary["test"]
  assert summary["ceiling"] is None and "no oracle" in summary["not_applicable"]["ceiling"]
  assert test["positive_class"] == "yes"
  assert test["positives"] + test["negatives"] == test["count"] > 0
  for key in ("accuracy", "sensitivity", "specificity", "auroc", "auprc"):
    assert math.isfinite(test[key]) and 0 <= test[key] <= 1, key
  assert test["top3_accuracy"] is None and test["not_applicable"]["top3_accuracy"] == "2 classes"
  assert all(test["by_subset"][s]["count"] == 0 for s in ("ILV", "IL", "IV", "I"))
  table = table_lib.format_summary(summary)
  print(table)
  assert "nan" not in table.lower() and "top3" not in table and "AUPRC".lower() in table
  assert os.path.exists(os.path.join(workdir, "confusion.png"))


def test_reliability_bins_and_ece_of_the_positive_probability():
  score = np.array([0.05, 0.05, 0.15, 0.95, 0.95, 0.95, 0.95, 1.0])
  positive = np.array([0, 0, 1, 1, 1, 1, 0, 1], bool)
  got = metrics.reliability(score, positive)
  filled = {round(b["lo"], 1): b for b in got["bins"] if b["count"]}
  assert sorted(filled) == [0.0, 0.1, 0.9] and filled[0.9]["count"] == 5   # p = 1 in the top bin
  assert filled[0.9]["observed"] == 0.8
  np.testing.assert_allclose(filled[0.9]["predicted"], 0.96)
  np.testing.assert_allclose(got["ece"], (2 * 0.05 + 1 * 0.85 + 5 * 0.16) / 8)
  assert metrics.reliability(np.zeros(0), np.zeros(0, bool)) is None


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0.0, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1.0]),
                          st.booleans()), min_size=2, max_size=30))
def test_youden_threshold_is_the_best_cut_by_brute_force(pairs):
  score = np.array([p for p, _ in pairs])
  positive = np.array([y for _, y in pairs])
  t = metrics.youden_threshold(score, positive)
  if positive.all() or not positive.any():
    assert t is None
    return
  j = lambda cut: (np.mean(score[positive] >= cut) - np.mean(score[~positive] >= cut))
  best = max(j(c) for c in np.r_[score, 2.0])
  assert j(t) == pytest.approx(best)
  at = metrics.at_threshold(score, positive.astype(int), t)
  assert at["sensitivity"] - (1 - at["specificity"]) == pytest.approx(best)


def _imbalanced_manifest(rng, n=600, positive_share=0.1):
  labels = (rng.random(n) < positive_share).astype(int)
  split = rng.choice(["train", "val", "test"], n, p=[0.6, 0.2, 0.2])
  return _manifest(labels, split, ["L"] * n, ["negative", "positive"])


def test_an_imbalanced_binary_task_is_also_decided_at_the_validation_threshold():
  rng = np.random.default_rng(0)
  manifest = _imbalanced_manifest(rng)
  # An informative but badly calibrated score: p(positive) never reaches 0.5.
  score = np.clip(0.05 + 0.2 * manifest.labels + rng.normal(0, 0.05, len(manifest)), 0, 0.45)
  probs = np.stack([1 - score, score], 1)
  val = manifest.indices("val")
  threshold = splits.validation_threshold(manifest, probs[val])
  assert 0.05 < threshold[0] < 0.3
  test_rows = manifest.indices("test")
  test = splits.split_metrics(manifest, test_rows, probs[test_rows], bootstrap=10,
                              threshold=threshold)
  assert test["sensitivity"] == 0.0   # argmax never says positive
  chosen = test["validation_threshold"]
  assert chosen["sensitivity"] > 0.75 and chosen["specificity"] > 0.75
  assert test["calibration"]["ece"] > 0.05
  text = table_lib.format_summary({"test": test, "ceiling": None})
  assert "at the validation threshold p >= " in text and "calibration: ECE of p(positive)" in text
  assert json.loads(json.dumps(summary_lib.strict_json(test)))["validation_threshold"]


def test_a_balanced_binary_task_keeps_the_argmax_and_says_why():
  rng = np.random.default_rng(1)
  manifest = _imbalanced_manifest(rng, positive_share=0.45)
  probs = np.full((len(manifest), 2), 0.5)
  threshold = splits.validation_threshold(manifest, probs[manifest.indices("val")])
  assert threshold[0] is None and "balanced classes" in threshold[1]
  rows = manifest.indices("test")
  test = splits.split_metrics(manifest, rows, probs[rows], bootstrap=10, threshold=threshold)
  assert "validation_threshold" not in test
  assert "balanced" in test["not_applicable"]["validation_threshold"]
  assert "validation threshold n/a (balanced" in table_lib.format_summary(
      {"test": test, "ceiling": None})


def test_binary_figures_include_the_reliability_diagram():
  figures = summary_lib.figures_for(_binary_summary(), ["no", "yes"], [])
  assert "reliability" in figures


def test_neg_log_loss_is_minus_the_mean_log_likelihood_and_a_validation_metric():
  probs = np.array([[0.8, 0.2], [0.4, 0.6], [0.0, 1.0]])
  labels = np.array([0, 0, 1])
  expected = np.mean(np.log([0.8, 0.4, 1.0]))
  assert metrics.neg_log_loss(probs, labels) == pytest.approx(expected)
  # A probability of 0 on the label costs log(1e-7), not infinity.
  assert metrics.neg_log_loss(np.array([[1.0, 0.0]]), np.array([1])) == pytest.approx(np.log(1e-7))
  out = metrics.classification(probs, labels, np.zeros(0, np.int64))
  assert out["neg_log_loss"] == pytest.approx(expected)
  assert metrics.classification(probs[:0], labels[:0], np.zeros(0, np.int64))["not_applicable"][
      "neg_log_loss"] == "no records"
  assert "neg_log_loss" in rules.VALIDATION_METRICS
