"""Evaluation: predictions over a split, metrics (with the Bayes ceiling), plots, notebook loading.

What is reported depends on the cohort (conventions in medjax/train/metrics.py):
  every task    accuracy, macro F1, rare-class recall (classes under 5% of training records),
                ECE, per-class F1, confusion, by modality subset, Table IV rows, 95% intervals.
  2 classes     sensitivity and specificity of the positive class at the argmax decision
                (p(positive) > 0.5), AUROC and AUPRC (average precision). The positive class is
                the second class name: the second of config.data.classes when set, else of the
                sorted label names ('1' of 0/1, 'yes' of no/yes); set config.data.classes to
                choose it. No top-3 (1.0 by construction with 3 classes or fewer).
  more classes  top-3 accuracy (above 3 classes) and the one-vs-rest macro AUROC.
  synthetic     the same metrics of the Bayes-optimal posterior ('ceiling'); other cohorts have
                no oracle, so summary.json has "ceiling": null and the reason under
                "not_applicable".
A metric that does not apply is null in summary.json (strict JSON: no NaN), with its reason in
the enclosing "not_applicable" mapping; the terminal table shows "n/a (reason)" or leaves it out.

In a notebook:
  from medjax import evaluate
  result = evaluate.load("runs/quickstart-...", split="test")
  result.metrics["accuracy"], result.figures["confusion"]
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math

import jax
import ml_collections
import numpy as np

from medjax import paths
from medjax import plots
from medjax import summary_table
from medjax.data import ingested as ingested_lib
from medjax.data import loader
from medjax.data import manifest as manifest_lib
from medjax.data import partition
from medjax.train import metrics as metrics_lib
from medjax.train import writers

# The summary table lives in a module of its own (the launcher prints it without importing JAX
# or matplotlib); these names stay here for the callers that know them from here.
NO_ORACLE = summary_table.NO_ORACLE
metric_keys = summary_table.metric_keys
format_summary = summary_table.format_summary



def predict(predict_fn, state, reader: loader.BatchReader, placement, rows: np.ndarray, *,
            host_batch: int, sharding, global_batch: int, seed: int) -> np.ndarray:
  """Class probabilities (len(rows), K) in the order of `rows`, on every process.

  Rows are read by their owning hosts, exactly like training batches.
  """
  steps = partition.partition_steps(rows, placement, host_batch_size=host_batch, seed=seed)
  flat = steps.reshape(len(steps), -1)
  probs = {}
  for s, _, batch in loader.prefetched(reader, steps, sharding=sharding,
                                      global_batch=global_batch):
    out = np.asarray(jax.device_get(predict_fn(state, batch)))
    for r, p in zip(flat[s], out):
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
  results, probs_by_split = {}, {}
  for split in splits:
    rows = manifest.indices(split)
    probs = probs_by_split[split] = predict(
        predict_fn, state, reader, data.placement, rows, host_batch=data.host_batch,
        sharding=sharding, global_batch=global_batch, seed=seed)
    results[split] = split_metrics(manifest, rows, probs, bootstrap=bootstrap, seed=seed)
    if split == "test" and ceiling is not None:
      results["ceiling"] = ceiling_metrics(manifest, rows, ceiling, bootstrap=bootstrap,
                                           seed=seed)
    elif split == "test":
      results["ceiling"] = None
      results["not_applicable"] = {"ceiling": NO_ORACLE}
  return results, probs_by_split


def _subsets(manifest, rows) -> np.ndarray:
  return np.array([manifest_lib.group_name(m) for m in manifest.modality_mask[rows]])


def split_metrics(manifest, rows: np.ndarray, probs_NxK: np.ndarray, *, bootstrap: int = 1000,
                  seed: int = 0) -> dict:
  """All metrics for `rows`: overall, per class, per modality subset, Table IV rows, 95% CIs."""
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


def strict_json(value):
  """`value` with NaN and infinities as None and numpy scalars as Python ones (strict JSON)."""
  if isinstance(value, dict):
    return {k: strict_json(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [strict_json(v) for v in value]
  if isinstance(value, (float, np.floating)):
    return float(value) if math.isfinite(value) else None
  if isinstance(value, np.integer):
    return int(value)
  if isinstance(value, np.bool_):
    return bool(value)
  return value


def write_summary(workdir: str, summary: dict, class_names: list[str]) -> None:
  """summary.json (strict JSON), the plots, and the summary table in the log."""
  with open(paths.RunPaths(workdir).summary, "w") as f:
    json.dump(strict_json(summary), f, indent=2, allow_nan=False, default=float)
  write_plots(workdir, summary, class_names)
  logging.info("summary\n%s", format_summary(summary))


def write_plots(workdir: str, summary: dict, class_names: list[str], events=None) -> list[str]:
  """PNG files in the workdir: loss curve, per-class F1, confusion matrix, accuracy by subset."""
  figures = figures_for(summary, class_names, writers.read_metrics(workdir), events)
  written = []
  for name, fig in figures.items():
    path = paths.RunPaths(workdir).plot(name)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    written.append(path)
  plots.close(figures)
  return written


def figures_for(summary, class_names, metrics_rows, events=None) -> dict:
  figures = {}
  if metrics_rows:
    figures["loss_curve"] = plots.loss_curve(metrics_rows, events or [])
  if "test" in summary:
    ceiling = summary.get("ceiling")
    figures["per_class_f1"] = plots.per_class_f1(summary["test"], ceiling, class_names)
    figures["confusion"] = plots.confusion(summary["test"]["confusion"], class_names)
    figures["accuracy_by_subset"] = plots.by_subset(summary["test"], ceiling)
  return figures


@dataclasses.dataclass
class Evaluation:
  metrics: dict
  ceiling: dict | None
  figures: dict
  probs: np.ndarray
  record_ids: np.ndarray

  def table(self) -> str:
    return format_summary({"test": self.metrics, "ceiling": self.ceiling})


def load(workdir: str, *, split: str = "test", bootstrap: int = 200) -> Evaluation:
  """Loads a workdir's newest checkpoint onto this process's devices and evaluates `split`.

  Trains nothing and writes nothing (records missing from the cache are decoded, not cached).
  """
  # Imported lazily: a notebook that only reads summary.json needs none of this.
  from medjax import checkpoint as checkpoint_lib  # pylint: disable=import-outside-toplevel
  from medjax import lineage as lineage_lib  # pylint: disable=import-outside-toplevel
  from medjax.data import host  # pylint: disable=import-outside-toplevel
  from medjax.train import optim  # pylint: disable=import-outside-toplevel
  from medjax.train import state as state_lib  # pylint: disable=import-outside-toplevel
  from medjax.train import step as step_lib  # pylint: disable=import-outside-toplevel

  run = paths.RunPaths(workdir)
  with open(run.config_json) as f:
    config = ml_collections.ConfigDict(json.load(f))
  run = paths.RunPaths(workdir, config)
  config.mesh.data, config.mesh.fsdp = -1, 1
  mesh = state_lib.make_mesh(config.mesh)
  # Every record on this process: one host that reads host-0's cache without writing it.
  batch = max(mesh.size, 8 * mesh.size)
  config.data.batch_size = batch
  data = host.setup(config, workdir, read_only=True)
  manifest = data.manifest
  tx, _ = optim.make(config.optim, 1)
  built = state_lib.build_abstract(config.model, tx, mesh, num_classes=len(manifest.class_names),
                                  shapes=data.prepared.shapes, seed=config.seed)
  store = lineage_lib.LineageStore(run.lineage_store)
  restored = checkpoint_lib.restore_committed(run.checkpoints, store, built.abstract)
  if restored is None:
    raise FileNotFoundError(f"{run.checkpoints} holds no committed, readable checkpoint "
                            f"(committed steps: {store.committed_steps()}); train first")
  state = restored[0]
  reader = data.reader()
  results, probs = evaluate_splits([split], step_lib.make_predict_step(built.graphdef, built, mesh),
                            state, reader, data, sharding=state_lib.batch_sharding(mesh),
                            global_batch=batch, bootstrap=bootstrap, seed=config.seed)
  rows = manifest.indices(split)
  metrics, ceiling = results[split], results.get("ceiling")
  figures = figures_for({"test": metrics, "ceiling": ceiling}, manifest.class_names,
                        writers.read_metrics(workdir))
  return Evaluation(metrics, ceiling, figures, probs[split], manifest.record_ids[rows])
