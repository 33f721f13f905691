"""Classification metrics over predicted class probabilities (numpy, host side).

Conventions (stated because papers differ):
  macro F1      mean F1 over the classes that occur in the evaluated labels.
  rare recall   mean recall over the rare classes (under 5% of training records, RARE_FRACTION)
                that occur in the evaluated labels.
  top-3         true class among the three most probable; reported only with more than 3 classes
                (with 3 or fewer it is 1.0 by construction).
  AUROC         one-vs-rest, averaged over classes with both positives and negatives.
  ECE           15 equal-width confidence bins on the top-class probability.
Binary tasks (2 classes) also get, for the positive class (class index 1, the second class name):
  sensitivity   recall of the positive class at the argmax decision, i.e. p(positive) > 0.5.
  specificity   recall of the negative class at the same decision.
  AUROC         of p(positive); equal to the one-vs-rest macro AUROC with two classes.
  AUPRC         average precision of p(positive): sum over thresholds of precision x recall step.

A metric that is undefined or does not apply is None, never NaN (summary.json is strict JSON), and
its reason is in the result's `not_applicable` mapping (metric -> short reason).
"""

from __future__ import annotations

import numpy as np

SUBSETS = ("ILV", "IL", "IV", "LV", "I", "L", "V")
RARE_FRACTION = 0.05  # a class is rare under this fraction of the training records
POSITIVE = 1  # binary tasks: the positive class is the second class name
TOP_K = 3


def confusion_matrix(labels_N: np.ndarray, preds_N: np.ndarray, num_classes: int) -> np.ndarray:
  cm = np.zeros((num_classes, num_classes), np.int64)
  np.add.at(cm, (labels_N, preds_N), 1)
  return cm


def per_class_f1(cm_KxK: np.ndarray) -> np.ndarray:
  """F1 per class; NaN for classes absent from both labels and predictions. A stack of
  confusion matrices (..., K, K) gives F1 per matrix and class (..., K)."""
  tp = np.diagonal(cm_KxK, axis1=-2, axis2=-1).astype(np.float64)
  support, predicted = cm_KxK.sum(-1), cm_KxK.sum(-2)
  denom = support + predicted
  with np.errstate(invalid="ignore", divide="ignore"):
    return np.where(denom > 0, 2 * tp / denom, np.nan)


def macro_f1(labels_N, preds_N, num_classes) -> float | None:
  cm = confusion_matrix(labels_N, preds_N, num_classes)
  present = cm.sum(1) > 0
  return float(np.mean(per_class_f1(cm)[present])) if present.any() else None


def average_ranks(x_N: np.ndarray) -> np.ndarray:
  """1-based ranks of `x_N`, tied values sharing their mean rank (scipy.stats.rankdata's
  default, without the ~1 s import of scipy.stats at a run's first evaluation)."""
  order = np.argsort(x_N, kind="stable")
  sorted_N = x_N[order]
  starts = np.flatnonzero(np.r_[True, sorted_N[1:] != sorted_N[:-1]])
  ends = np.r_[starts[1:], len(x_N)]
  group_N = np.repeat(np.arange(len(starts)), ends - starts)
  ranks = np.empty(len(x_N))
  ranks[order] = ((starts + 1 + ends) / 2)[group_N]
  return ranks


def auroc(scores_N: np.ndarray, positive_N: np.ndarray) -> float | None:
  """AUROC of `scores_N` for the boolean `positive_N` (Mann-Whitney U, tied ranks averaged);
  NaN where a score is NaN."""
  n_pos, n_neg = int(positive_N.sum()), int((~positive_N).sum())
  if n_pos == 0 or n_neg == 0:
    return None
  if np.isnan(scores_N).any():
    return float("nan")
  ranks = average_ranks(scores_N)
  return float((ranks[positive_N].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def auroc_macro(probs_NxK: np.ndarray, labels_N: np.ndarray) -> float | None:
  """Mean one-vs-rest AUROC over the classes with both positives and negatives."""
  values = [auroc(probs_NxK[:, k], labels_N == k) for k in range(probs_NxK.shape[1])]
  values = [v for v in values if v is not None]
  return float(np.mean(values)) if values else None


def average_precision(scores_N: np.ndarray, positive_N: np.ndarray) -> float | None:
  """AUPRC as average precision: sum_t (recall_t - recall_{t-1}) * precision_t over the distinct
  score thresholds t, highest first (no interpolation; tied scores form one threshold)."""
  n_pos = int(positive_N.sum())
  if n_pos == 0:
    return None
  order = np.argsort(-scores_N, kind="stable")
  scores, hits = scores_N[order], positive_N[order].astype(np.float64)
  # The last index of each run of equal scores: one operating point per distinct threshold.
  last = np.r_[np.flatnonzero(np.diff(scores) != 0), len(scores) - 1]
  tp = np.cumsum(hits)[last]
  precision = tp / (last + 1)
  recall_step = np.diff(np.r_[0.0, tp]) / n_pos
  return float(np.sum(recall_step * precision))


def binary(probs_Nx2: np.ndarray, labels_N: np.ndarray) -> tuple[dict, dict]:
  """Sensitivity, specificity (argmax, i.e. p(positive) > 0.5), AUROC and AUPRC of class 1.

  Returns:
    (metrics, not_applicable): values (None where undefined) and the reasons for the Nones.
  """
  positive = labels_N == POSITIVE
  predicted = probs_Nx2.argmax(1) == POSITIVE
  n_pos, n_neg = int(positive.sum()), int((~positive).sum())
  score = probs_Nx2[:, POSITIVE]
  out = {
      "sensitivity": float(np.mean(predicted[positive])) if n_pos else None,
      "specificity": float(np.mean(~predicted[~positive])) if n_neg else None,
      "auroc": auroc(score, positive),
      "auprc": average_precision(score, positive),
      "positives": n_pos,
      "negatives": n_neg,
  }
  why = {"sensitivity": "no positive records", "specificity": "no negative records",
         "auroc": "needs positive and negative records", "auprc": "no positive records"}
  return out, {k: r for k, r in why.items() if out[k] is None}


def _calibration_bins(confidence_N: np.ndarray, outcome_N: np.ndarray, bins: int,
                      side: str) -> tuple[list[dict], float]:
  """Per equal-width bin of `confidence_N` in [0, 1]: its records, their mean confidence and
  mean outcome; and the ECE, the count-weighted mean |outcome - confidence| over the bins. `side`:
  which bin a confidence on an edge goes to ('left': the lower, 'right': the upper)."""
  edges = np.linspace(0.0, 1.0, bins + 1)
  which = np.clip(np.searchsorted(edges, confidence_N, side=side) - 1, 0, bins - 1)
  rows, ece = [], 0.0
  for b in range(bins):
    inside = which == b
    n = int(inside.sum())
    predicted = float(confidence_N[inside].mean()) if n else None
    observed = float(outcome_N[inside].mean()) if n else None
    if n:
      ece += inside.mean() * abs(observed - predicted)
    rows.append({"lo": float(edges[b]), "hi": float(edges[b + 1]), "count": n,
                 "predicted": predicted, "observed": observed})
  return rows, float(ece)


def expected_calibration_error(probs_NxK: np.ndarray, labels_N: np.ndarray,
                               bins: int = 15) -> float | None:
  if len(labels_N) == 0:
    return None
  return _calibration_bins(probs_NxK.max(1), probs_NxK.argmax(1) == labels_N, bins, "left")[1]


IMBALANCED_BELOW = 1 / 3   # binary: a class under this share of training records is the minority
RELIABILITY_BINS = 10


def reliability(score_N: np.ndarray, positive_N: np.ndarray,
                bins: int = RELIABILITY_BINS) -> dict | None:
  """Calibration of p(positive): per equal-width bin of it, the records, their mean predicted
  probability and the observed share of positives; ECE over those bins (the count-weighted mean
  |observed - predicted|). None without records."""
  if len(score_N) == 0:
    return None
  rows, ece = _calibration_bins(score_N, positive_N, bins, "right")
  return {"ece": ece, "bins": rows}


def youden_threshold(score_N: np.ndarray, positive_N: np.ndarray) -> float | None:
  """The threshold t (positive when p >= t) with the highest sensitivity + specificity - 1 on
  these records, the midpoint between two neighbouring scores (the lower one on ties); None
  without both classes."""
  if positive_N.all() or not positive_N.any():
    return None
  order = np.argsort(-score_N, kind="stable")
  s, pos = score_N[order], positive_N[order]
  # Cut after each distinct score: positives and negatives at or above it.
  last = np.flatnonzero(np.r_[s[1:] != s[:-1], True])
  tp, fp = np.cumsum(pos)[last], np.cumsum(~pos)[last]
  j = tp / pos.sum() - fp / (~pos).sum()
  k = int(np.argmax(j))
  below = s[last[k] + 1] if last[k] + 1 < len(s) else 0.0
  return float((s[last[k]] + below) / 2)


def at_threshold(score_N: np.ndarray, labels_N: np.ndarray, threshold: float) -> dict:
  """Binary metrics of the decision p(positive) >= threshold."""
  positive = labels_N == POSITIVE
  predicted = score_N >= threshold
  preds = predicted.astype(np.int64)
  return {"threshold": float(threshold),
          "sensitivity": float(np.mean(predicted[positive])) if positive.any() else None,
          "specificity": float(np.mean(~predicted[~positive])) if (~positive).any() else None,
          "accuracy": float(np.mean(preds == labels_N)) if len(labels_N) else None,
          "macro_f1": macro_f1(labels_N, preds, 2)}


def top_k_accuracy(probs_NxK: np.ndarray, labels_N: np.ndarray, k: int) -> float | None:
  """True class among the k most probable; None when k >= K (1.0 by construction) or no rows."""
  if k >= probs_NxK.shape[1] or len(labels_N) == 0:
    return None
  top = np.argsort(-probs_NxK, axis=1)[:, :k]
  return float(np.mean(np.any(top == labels_N[:, None], axis=1)))


def rare_classes(train_labels_N: np.ndarray, num_classes: int,
                 threshold: float = RARE_FRACTION) -> np.ndarray:
  """Classes under `threshold` of the training records."""
  counts = np.bincount(train_labels_N, minlength=num_classes)
  return np.flatnonzero(counts < threshold * max(len(train_labels_N), 1))


def core(probs_NxK: np.ndarray, labels_N: np.ndarray) -> dict[str, float | None]:
  """accuracy and macro F1: the metrics reported per subset and bootstrapped (None if no rows)."""
  preds = probs_NxK.argmax(1) if len(labels_N) else np.zeros(0, np.int64)
  return {"accuracy": float(np.mean(preds == labels_N)) if len(labels_N) else None,
          "macro_f1": macro_f1(labels_N, preds, probs_NxK.shape[1])}


def neg_log_loss(probs_NxK: np.ndarray, labels_N: np.ndarray) -> float | None:
  """Minus the mean negative log-likelihood of the labels (higher is better, as every validation
  metric is; probabilities floored at 1e-7). A proper scoring rule: as a validation metric it
  sees every record's probability, where AUROC on a few dozen positives is noisy."""
  if not len(labels_N):
    return None
  p = probs_NxK[np.arange(len(labels_N)), labels_N]
  return float(np.mean(np.log(np.clip(p, 1e-7, 1.0))))


def classification(probs_NxK: np.ndarray, labels_N: np.ndarray, rare_K: np.ndarray) -> dict:
  """The full set of metrics for one set of predictions.

  Every key is always present (readers index it); a None value has its reason in
  out['not_applicable']. Binary tasks add 'sensitivity', 'specificity', 'auroc', 'auprc',
  'positives' and 'negatives'.
  """
  num_classes = probs_NxK.shape[1]
  preds = probs_NxK.argmax(1)
  cm = confusion_matrix(labels_N, preds, num_classes)
  recall = np.diag(cm) / np.maximum(cm.sum(1), 1)
  rare_present = [k for k in rare_K if cm[k].sum() > 0]
  out = {
      **core(probs_NxK, labels_N),
      "top3_accuracy": top_k_accuracy(probs_NxK, labels_N, TOP_K),
      "rare_recall": float(np.mean(recall[rare_present])) if rare_present else None,
      "auroc_macro": auroc_macro(probs_NxK, labels_N),
      "ece": expected_calibration_error(probs_NxK, labels_N),
      "neg_log_loss": neg_log_loss(probs_NxK, labels_N),
      "count": int(len(labels_N)),
      "per_class_f1": [None if np.isnan(f) else float(f) for f in per_class_f1(cm)],
      "confusion": cm.tolist(),
  }
  reasons = {}
  if num_classes == 2:
    values, reasons = binary(probs_NxK, labels_N)
    out.update(values)
  if out["top3_accuracy"] is None:
    reasons["top3_accuracy"] = (f"{num_classes} classes" if num_classes <= TOP_K
                                else "no records")
  if out["rare_recall"] is None:
    reasons["rare_recall"] = (
        f"no class under {RARE_FRACTION:.0%} of training records" if len(rare_K) == 0
        else f"none of the {len(rare_K)} rare classes in these records")
  for key in ("accuracy", "macro_f1", "auroc_macro", "ece", "neg_log_loss"):
    if out[key] is None:
      reasons[key] = "no records" if not len(labels_N) else "one class in the records"
  out["not_applicable"] = reasons
  return out


def by_subset(probs_NxK, labels_N, subsets_N: np.ndarray) -> dict[str, dict]:
  """accuracy, macro F1 and count for each available-modality subset (ILV, IL, ..., V).

  Every subset is present; one without records has count 0 and None metrics.
  """
  out = {}
  for s in SUBSETS:
    rows = subsets_N == s
    out[s] = {**core(probs_NxK[rows], labels_N[rows]), "count": int(rows.sum())}
  return out


def table_iv(subset_metrics: dict[str, dict]) -> dict[str, dict]:
  """The lineage paper's Table IV rows (All 3 / Any 2 / Single), count-weighted over subsets."""
  rows = {"all3": ("ILV",), "any2": ("IL", "IV", "LV"), "single": ("I", "L", "V")}
  out = {}
  for name, members in rows.items():
    counts = np.array([subset_metrics[s]["count"] for s in members], np.float64)
    entry = {"count": int(counts.sum())}
    for metric in ("accuracy", "macro_f1"):
      # None (no records) becomes NaN here and is left out of the weighted mean.
      values = np.array([subset_metrics[s][metric] for s in members], np.float64)
      ok = (counts > 0) & ~np.isnan(values)
      entry[metric] = float(np.sum(values[ok] * counts[ok]) / counts[ok].sum()) if ok.any() \
          else None
    out[name] = entry
  return out


_BINARY_BOOTSTRAPPED = ("sensitivity", "specificity", "auroc", "auprc")


def bootstrap(probs_NxK, labels_N, *, samples: int = 1000, seed: int = 0) -> dict[str, list]:
  """95% percentile intervals over resampled records: accuracy and macro F1, and for binary
  tasks sensitivity, specificity, AUROC and AUPRC.

  A resample where a metric is undefined (no positives drawn, say) is left out of that metric's
  interval; [None, None] when more than half of them are, or there are no records.
  """
  rng = np.random.default_rng(seed)
  n, num_classes = len(labels_N), probs_NxK.shape[1]
  keys = ["accuracy", "macro_f1"] + (list(_BINARY_BOOTSTRAPPED) if num_classes == 2 else [])
  if n == 0:
    return {k: [None, None] for k in keys}
  draws = {k: [] for k in keys}
  preds_N = probs_NxK.argmax(1)
  # Resamples in chunks, each one's confusion matrix counted at once (a Python loop over 1000
  # resamples took ~0.3 s of every run's evaluation); the draws are the loop's, in its order.
  chunk = max(1, min(samples, _BOOTSTRAP_CELLS // max(n, num_classes * num_classes)))
  for start in range(0, samples, chunk):
    idx_CxN = rng.integers(0, n, (min(chunk, samples - start), n))
    accuracy_C, macro_f1_C = _core_of_resamples(labels_N[idx_CxN], preds_N[idx_CxN], num_classes)
    draws["accuracy"] += accuracy_C.tolist()
    draws["macro_f1"] += macro_f1_C.tolist()
    if num_classes == 2:
      for idx in idx_CxN:
        values, _ = binary(probs_NxK[idx], labels_N[idx])
        for k in _BINARY_BOOTSTRAPPED:
          if values[k] is not None:
            draws[k].append(values[k])
  return {k: [float(np.percentile(v, 2.5)), float(np.percentile(v, 97.5))]
          if len(v) * 2 >= samples and v else [None, None] for k, v in draws.items()}


# Confusion-matrix cells (or drawn records) counted per chunk of bootstrap resamples.
_BOOTSTRAP_CELLS = 2_000_000


def _core_of_resamples(labels_CxN: np.ndarray, preds_CxN: np.ndarray,
                       num_classes: int) -> tuple[np.ndarray, np.ndarray]:
  """`core`'s accuracy and macro F1 of each row's records (every row has records)."""
  c, n = labels_CxN.shape
  cells = (np.arange(c)[:, None] * num_classes + labels_CxN) * num_classes + preds_CxN
  cm_CxKxK = np.bincount(cells.ravel(), minlength=c * num_classes * num_classes).reshape(
      c, num_classes, num_classes)
  # As `macro_f1`: the mean F1 of the classes present among the records.
  present_CxK = cm_CxKxK.sum(2) > 0
  macro_f1_C = np.where(present_CxK, per_class_f1(cm_CxKxK), 0.0).sum(1) / present_CxK.sum(1)
  return np.trace(cm_CxKxK, axis1=1, axis2=2) / n, macro_f1_C
