"""The baselines medjax is held against on a table: gradient boosting, logistic regression and
the majority class, fitted on a split's training patients with hyperparameters chosen on its
validation patients (AUROC, as medjax's tables config chooses its checkpoint), scored on its
test patients.

  trees     scikit-learn's HistGradientBoostingClassifier (missing values handled natively):
            learning rate x leaves x minimum leaf size, 12 settings, and the number of boosting
            iterations (up to 500), all chosen on validation.
  logistic  median imputation with missing-value indicators, standardisation, L2-penalised
            logistic regression; C from 1e-3 to 1e2 chosen on validation.
  majority  the training split's most common class with its training frequency.
"""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import threadpoolctl
from sklearn import ensemble, impute, linear_model, metrics, pipeline, preprocessing

from medjax.evals import metrics as medjax_metrics

TREE_GRID = list(itertools.product((0.03, 0.1), (7, 15, 31), (10, 40)))
MAX_ITER, EVERY = 500, 10
LOGISTIC_C = np.logspace(-3, 2, 6)


def _score(y, p):
  """Validation AUROC; a split whose validation set has one class falls back to log loss."""
  if len(np.unique(y)) < 2:
    return -metrics.log_loss(y, p, labels=[0, 1])
  return metrics.roc_auc_score(y, p)


def trees(x_tr, y_tr, x_va, y_va, x_te, seed: int):
  """p(positive) on the test rows of the best (settings, iterations) on validation."""
  # One OpenMP thread: beside another process (medjax training, a second comparison) the
  # default one per core spun for minutes (165 s against 7 s for the 12 settings on pbc).
  with threadpoolctl.threadpool_limits(1):
    return _trees(x_tr, y_tr, x_va, y_va, x_te, seed)


def _trees(x_tr, y_tr, x_va, y_va, x_te, seed: int):
  best = (-np.inf, None, 0)
  for lr, leaves, min_leaf in TREE_GRID:
    model = ensemble.HistGradientBoostingClassifier(
        learning_rate=lr, max_leaf_nodes=leaves, min_samples_leaf=min_leaf, max_iter=MAX_ITER,
        early_stopping=False, random_state=seed).fit(x_tr, y_tr)
    for i, p in enumerate(model.staged_predict_proba(x_va)):
      if (i + 1) % EVERY == 0:
        s = _score(y_va, p[:, 1])
        if s > best[0]:
          best = (s, model, i + 1)
  _, model, iters = best
  for i, p in enumerate(model.staged_predict_proba(x_te)):
    if i + 1 == iters:
      return p[:, 1], {"learning_rate": model.learning_rate,
                       "max_leaf_nodes": model.max_leaf_nodes,
                       "min_samples_leaf": model.min_samples_leaf, "iterations": iters}
  raise AssertionError("unreachable")


def logistic(x_tr, y_tr, x_va, y_va, x_te, seed: int):
  best = (-np.inf, None)
  for c in LOGISTIC_C:
    model = pipeline.make_pipeline(
        impute.SimpleImputer(strategy="median", add_indicator=True, keep_empty_features=True),
        preprocessing.StandardScaler(),
        linear_model.LogisticRegression(C=c, max_iter=2000, random_state=seed))
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")   # constant columns after imputation on tiny splits
      model.fit(x_tr, y_tr)
    s = _score(y_va, model.predict_proba(x_va)[:, 1])
    if s > best[0]:
      best = (s, model)
  return best[1].predict_proba(x_te)[:, 1], {"C": float(best[1][-1].C)}


def majority(x_tr, y_tr, x_va, y_va, x_te, seed: int):
  return np.full(len(x_te), y_tr.mean()), {}


METHODS = {"majority": majority, "logistic": logistic, "trees": trees}


def scores(p_positive: np.ndarray, y: np.ndarray) -> dict:
  """Test AUROC, accuracy, macro F1 (at p > 0.5, medjax's argmax) and ECE (medjax's bins)."""
  probs = np.stack([1 - p_positive, p_positive], axis=1)
  pred = (p_positive > 0.5).astype(int)
  return {"auroc": float(metrics.roc_auc_score(y, p_positive)),
          "accuracy": float(np.mean(pred == y)),
          "macro_f1": float(metrics.f1_score(y, pred, average="macro")),
          "ece": medjax_metrics.expected_calibration_error(probs, y)}
