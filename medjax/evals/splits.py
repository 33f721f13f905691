"""Predictions over a split, and its metrics beside the Bayes ceiling's.

What is reported depends on the cohort (conventions in `medjax.evals.metrics`):
  every task    accuracy, macro F1, rare-class recall (classes under 5% of training records),
                ECE, per-class F1, confusion, by modality subset, Table IV rows, 95% intervals.
  2 classes     sensitivity and specificity of the positive class at the argmax decision
                (p(positive) > 0.5), AUROC and AUPRC (average precision). The positive class is
                the second class name: the second of config.data.classes when set, else of the
                sorted label names ('1' of 0/1, 'yes' of no/yes); set config.data.classes to
                choose it. No top-3 (1.0 by construction with 3 classes or fewer).
                The calibration of p(positive) (`calibration`: 10 equal-width bins, ECE over
                them; reliability.png), and when the minority class is under a third of the
                training records, the decision at the validation split's threshold with the
                highest sensitivity + specificity - 1 (`validation_threshold`).
  more classes  top-3 accuracy (above 3 classes) and the one-vs-rest macro AUROC.
  synthetic     the same metrics of the Bayes-optimal posterior ('ceiling'); other cohorts have
                no oracle, so summary.json has "ceiling": null and the reason under
                "not_applicable".
A metric that does not apply is null in summary.json (strict JSON: no NaN), with its reason in
the enclosing "not_applicable" mapping; the terminal table shows "n/a (reason)" or leaves it out.
"""

from __future__ import annotations

import jax
import numpy as np

from medjax.data import ingested as ingested_lib
from medjax.data import loader
from medjax.data import manifest as manifest_lib
from medjax.data import partition
from medjax.evals import metrics as metrics_lib
from medjax.evals import table


def predict(predict_fn, state, reader: loader.BatchReader, placement, rows: np.ndarray, *,
            host_batch: int, sharding, global_batch: int, seed: int) -> np.ndarray:
  """Class probabilities (len(rows), K) in the order of `rows`, on every process.

  Rows are read by their owning hosts, exactly like training batches.
  """
  steps = partition.partition_steps(rows, placement, host_batch_size=host_batch, seed=seed)
  flat = steps.reshape(len(steps), -1)
  # Every batch is dispatched before any result is fetched (one transfer at the end), so the
  # device runs them back to back while the next ones are read.
  dispatched = [(s, predict_fn(state, batch)) for s, _, batch in loader.prefetched(
      reader, steps, sharding=sharding, global_batch=global_batch)]
  probs = {}
  for (s, _), out in zip(dispatched, jax.device_get([out for _, out in dispatched])):
    for r, p in zip(flat[s], np.asarray(out)):
      if r >= 0:
        probs[int(r)] = p
  return np.stack([probs[int(r)] for r in rows]) if len(rows) else np.zeros((0, 0))


def evaluate_splits(splits, predict_fn, state, reader: loader.BatchReader, data, *, sharding,
                    global_batch: int, bootstrap: int, seed: int) -> tuple[dict, dict]:
  """Metrics of every split in `splits`, and of the Bayes ceiling on 'test' (synthetic cohorts).

  Returns:
    ({split: metrics, 'ceiling': metrics}, {split: class probabilities in manifest-index order}).

  Args:
    splits: split names (config.evals.splits).
    predict_fn: the jitted prediction step (`train.step.make_predict_step`).
    state: the training state.
    reader: this process's batch reader.
    data: this host's `data.host.HostData` (manifest, placement, host batch, run paths).
    sharding: the batch sharding.
    global_batch: the global batch size.
    bootstrap: resamples for the 95% intervals.
    seed: bootstrap and step-cutting seed.
  """
  manifest = data.manifest
  ceiling = ingested_lib.load_ceiling(data.run.workdir)
  probs_by_split = {split: predict(predict_fn, state, reader, data.placement,
                                   manifest.indices(split), host_batch=data.host_batch,
                                   sharding=sharding, global_batch=global_batch, seed=seed)
                    for split in splits}
  threshold = validation_threshold(manifest, probs_by_split.get("val"))
  results = {}
  for split in splits:
    rows = manifest.indices(split)
    results[split] = split_metrics(manifest, rows, probs_by_split[split], bootstrap=bootstrap,
                                   seed=seed, threshold=threshold)
    if split == "test" and ceiling is not None:
      results["ceiling"] = ceiling_metrics(manifest, rows, ceiling, bootstrap=bootstrap,
                                           seed=seed)
    elif split == "test":
      results["ceiling"] = None
      results["not_applicable"] = {"ceiling": table.NO_ORACLE}
  return results, probs_by_split


def validation_threshold(manifest, val_probs_NxK: np.ndarray | None) -> tuple[float | None, str]:
  """(threshold, reason): a binary task whose minority class is under a third of the training
  records decides p(positive) >= the threshold chosen on the validation split (highest
  sensitivity + specificity - 1); otherwise (None, why not)."""
  if len(manifest.class_names) != 2:
    return None, "not a binary task"
  share = float(np.mean(manifest.labels[manifest.indices("train")] == metrics_lib.POSITIVE))
  if min(share, 1 - share) >= metrics_lib.IMBALANCED_BELOW:
    return None, (f"balanced classes ({share:.0%} of training records positive): the argmax "
                  "decision stands")
  if val_probs_NxK is None:
    return None, "no validation split evaluated (config.evals.splits)"
  rows = manifest.indices("val")
  score = val_probs_NxK.reshape(len(rows), 2)[:, metrics_lib.POSITIVE] if len(rows) else []
  t = metrics_lib.youden_threshold(np.asarray(score),
                                   manifest.labels[rows] == metrics_lib.POSITIVE)
  return (t, "") if t is not None else (None, "the validation split holds one class only")


def _subsets(manifest, rows) -> np.ndarray:
  return np.array([manifest_lib.group_name(m) for m in manifest.modality_mask[rows]])


def split_metrics(manifest, rows: np.ndarray, probs_NxK: np.ndarray, *, bootstrap: int = 1000,
                  seed: int = 0, threshold: tuple[float | None, str] = (None, "")) -> dict:
  """All metrics for `rows`: overall, per class, per modality subset, Table IV rows, 95% CIs;
  binary tasks add the calibration of p(positive) and, with `threshold` from
  `validation_threshold`, the decision at it."""
  labels = manifest.labels[rows]
  probs_NxK = probs_NxK.reshape(len(rows), len(manifest.class_names))  # (0, 0) when no rows
  rare = metrics_lib.rare_classes(manifest.labels[manifest.indices("train")],
                                  len(manifest.class_names))
  out = metrics_lib.classification(probs_NxK, labels, rare)
  out["by_subset"] = metrics_lib.by_subset(probs_NxK, labels, _subsets(manifest, rows))
  out["table_iv"] = metrics_lib.table_iv(out["by_subset"])
  out["ci95"] = metrics_lib.bootstrap(probs_NxK, labels, samples=bootstrap, seed=seed)
  out["rare_classes"] = [manifest.class_names[k] for k in rare]
  out["rare_rule"] = f"under {metrics_lib.RARE_FRACTION:.0%} of training records"
  if len(manifest.class_names) == 2:
    positive = manifest.class_names[metrics_lib.POSITIVE]
    out["positive_class"] = positive
    out["decision"] = f"argmax, i.e. p({positive}) > 0.5"
    score, is_positive = probs_NxK[:, metrics_lib.POSITIVE], labels == metrics_lib.POSITIVE
    out["calibration"] = metrics_lib.reliability(score, is_positive)
    t, why = threshold
    if t is not None and len(rows):
      out["validation_threshold"] = {
          **metrics_lib.at_threshold(score, labels, t),
          "rule": "highest sensitivity + specificity - 1 on the validation split"}
    else:
      out["not_applicable"]["validation_threshold"] = why or "no records"
  return out


def ceiling_metrics(manifest, rows: np.ndarray, ceiling: dict[str, np.ndarray], **kw) -> dict:
  """The same metrics for the Bayes-optimal posterior on the same records."""
  where = {rid: i for i, rid in enumerate(ceiling["record_ids"])}
  keep = np.array([manifest.record_ids[r] in where for r in rows], bool)
  if not keep.all():
    raise ValueError(f"ceiling.npz lacks {int((~keep).sum())} of the {len(rows)} test records; "
                     "ingest the cohort again")
  probs = ceiling["posterior"][[where[manifest.record_ids[r]] for r in rows]]
  return split_metrics(manifest, rows, probs, **kw)
