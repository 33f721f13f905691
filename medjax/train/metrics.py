"""Classification metrics over predicted class probabilities (numpy, host side).

Conventions (stated because papers differ):
  macro F1      mean F1 over the classes that occur in the evaluated labels.
  rare recall   mean recall over the rare classes (under 5% of training records) that occur.
  top-3         true class among the three most probable.
  AUROC         one-vs-rest, averaged over classes with both positives and negatives.
  ECE           15 equal-width confidence bins on the top-class probability.
"""

from __future__ import annotations

import numpy as np
from scipy import stats

SUBSETS = ("ILV", "IL", "IV", "LV", "I", "L", "V")


def confusion_matrix(labels_N: np.ndarray, preds_N: np.ndarray, num_classes: int) -> np.ndarray:
  cm = np.zeros((num_classes, num_classes), np.int64)
  np.add.at(cm, (labels_N, preds_N), 1)
  return cm


def per_class_f1(cm_KxK: np.ndarray) -> np.ndarray:
  """F1 per class; NaN for classes absent from both labels and predictions."""
  tp = np.diag(cm_KxK).astype(np.float64)
  support, predicted = cm_KxK.sum(1), cm_KxK.sum(0)
  denom = support + predicted
  with np.errstate(invalid="ignore", divide="ignore"):
    return np.where(denom > 0, 2 * tp / denom, np.nan)


def macro_f1(labels_N, preds_N, num_classes) -> float:
  cm = confusion_matrix(labels_N, preds_N, num_classes)
  present = cm.sum(1) > 0
  return float(np.mean(per_class_f1(cm)[present])) if present.any() else float("nan")


def auroc_macro(probs_NxK: np.ndarray, labels_N: np.ndarray) -> float:
  """Mean one-vs-rest AUROC (Mann-Whitney U with tied ranks averaged)."""
  values = []
  for k in range(probs_NxK.shape[1]):
    positive = labels_N == k
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if n_pos == 0 or n_neg == 0:
      continue
    ranks = stats.rankdata(probs_NxK[:, k])
    values.append((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))
  return float(np.mean(values)) if values else float("nan")


def expected_calibration_error(probs_NxK: np.ndarray, labels_N: np.ndarray,
                               bins: int = 15) -> float:
  confidence = probs_NxK.max(1)
  correct = probs_NxK.argmax(1) == labels_N
  edges = np.linspace(0.0, 1.0, bins + 1)
  which = np.clip(np.searchsorted(edges, confidence, side="left") - 1, 0, bins - 1)
  ece = 0.0
  for b in range(bins):
    in_bin = which == b
    if in_bin.any():
      ece += in_bin.mean() * abs(correct[in_bin].mean() - confidence[in_bin].mean())
  return float(ece)


def rare_classes(train_labels_N: np.ndarray, num_classes: int, threshold: float = 0.05):
  """Classes under `threshold` of the training records."""
  counts = np.bincount(train_labels_N, minlength=num_classes)
  return np.flatnonzero(counts < threshold * max(len(train_labels_N), 1))


def core(probs_NxK: np.ndarray, labels_N: np.ndarray) -> dict[str, float]:
  """accuracy and macro F1: the metrics reported per subset and bootstrapped."""
  preds = probs_NxK.argmax(1)
  return {"accuracy": float(np.mean(preds == labels_N)) if len(labels_N) else float("nan"),
          "macro_f1": macro_f1(labels_N, preds, probs_NxK.shape[1])}


def classification(probs_NxK: np.ndarray, labels_N: np.ndarray, rare_K: np.ndarray) -> dict:
  """The full set of metrics for one set of predictions."""
  num_classes = probs_NxK.shape[1]
  preds = probs_NxK.argmax(1)
  cm = confusion_matrix(labels_N, preds, num_classes)
  top3 = np.argsort(-probs_NxK, axis=1)[:, :3]
  recall = np.diag(cm) / np.maximum(cm.sum(1), 1)
  rare_present = [k for k in rare_K if cm[k].sum() > 0]
  return {
      **core(probs_NxK, labels_N),
      "top3_accuracy": float(np.mean(np.any(top3 == labels_N[:, None], axis=1))),
      "rare_recall": float(np.mean(recall[rare_present])) if rare_present else float("nan"),
      "auroc_macro": auroc_macro(probs_NxK, labels_N),
      "ece": expected_calibration_error(probs_NxK, labels_N),
      "count": int(len(labels_N)),
      "per_class_f1": [None if np.isnan(f) else float(f) for f in per_class_f1(cm)],
      "confusion": cm.tolist(),
  }


def by_subset(probs_NxK, labels_N, subsets_N: np.ndarray) -> dict[str, dict]:
  """accuracy, macro F1 and count for each available-modality subset (ILV, IL, ..., V)."""
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
      values = np.array([subset_metrics[s][metric] for s in members], np.float64)
      ok = (counts > 0) & ~np.isnan(values)
      entry[metric] = float(np.sum(values[ok] * counts[ok]) / counts[ok].sum()) if ok.any() \
          else float("nan")
    out[name] = entry
  return out


def bootstrap(probs_NxK, labels_N, *, samples: int = 1000, seed: int = 0) -> dict[str, list]:
  """95% percentile intervals of accuracy and macro F1 over resampled records."""
  rng = np.random.default_rng(seed)
  n = len(labels_N)
  draws = {"accuracy": [], "macro_f1": []}
  if n == 0:
    return {k: [float("nan")] * 2 for k in draws}
  for _ in range(samples):
    idx = rng.integers(0, n, n)
    for k, v in core(probs_NxK[idx], labels_N[idx]).items():
      draws[k].append(v)
  return {k: [float(np.percentile(v, 2.5)), float(np.percentile(v, 97.5))]
          for k, v in draws.items()}
