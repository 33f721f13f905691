"""Any workdir's results in a notebook: its newest checkpoint loaded on this process's devices.

The evaluation itself (predictions, metrics beside the Bayes ceiling, figures) is `medjax.evals`,
below the trainer; this module is above it, since loading builds the model and its state as the
trainer does. What is reported for which cohort: `medjax.evals.splits`.

In a notebook:
  from medjax import evaluate
  result = evaluate.load("runs/quickstart-...", split="test")
  result.metrics["accuracy"], result.figures["confusion"]
"""

from __future__ import annotations

import dataclasses
import json

import ml_collections
import numpy as np

from medjax import paths
from medjax.evals import splits
from medjax.evals import summary as summary_lib
from medjax.evals import table
from medjax.train import writers

# The metrics a table shows, in its order (the notebook lists them).
metric_keys = table.metric_keys


@dataclasses.dataclass
class Evaluation:
  metrics: dict
  ceiling: dict | None
  figures: dict
  probs: np.ndarray
  record_ids: np.ndarray

  def table(self) -> str:
    return table.format_summary({"test": self.metrics, "ceiling": self.ceiling})


def load(workdir: str, *, split: str = "test", bootstrap: int = 200) -> Evaluation:
  """Loads a workdir's newest checkpoint onto this process's devices and evaluates `split`.

  Trains nothing and writes nothing (records missing from the cache are decoded, not cached).
  """
  # Imported lazily: a notebook that only reads summary.json needs none of this.
  from medjax import lineage as lineage_lib  # pylint: disable=import-outside-toplevel
  from medjax.checkpoint import restore
  from medjax.data import host  # pylint: disable=import-outside-toplevel
  from medjax.train import local_sgd  # pylint: disable=import-outside-toplevel
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
                                   shapes=data.prepared.shapes, seed=config.seed,
                                   local=local_sgd.from_config(config.optim, mesh))
  store = lineage_lib.LineageStore(run.lineage_store)
  restored = restore.restore_committed(run.checkpoints, store, built.abstract)
  if restored is None:
    raise FileNotFoundError(f"{run.checkpoints} holds no committed, readable checkpoint "
                            f"(committed steps: {store.committed_steps()}); train first")
  state = restored[0]
  reader = data.reader()
  predict = step_lib.make_predict_step(built.graphdef, built, mesh)
  results, probs = splits.evaluate_splits([split], predict, state, reader, data,
                                          sharding=state_lib.batch_sharding(mesh),
                                          global_batch=batch, bootstrap=bootstrap,
                                          seed=config.seed)
  rows = manifest.indices(split)
  metrics, ceiling = results[split], results.get("ceiling")
  figures = summary_lib.figures_for({"test": metrics, "ceiling": ceiling}, manifest.class_names,
                                    writers.read_metrics(workdir))
  return Evaluation(metrics, ceiling, figures, probs[split], manifest.record_ids[rows])
