"""The trainer, top to bottom: mesh -> data -> model and optimizer -> sharded state -> step
functions -> checkpoint restore -> loop over the partition plan -> evaluation and summary.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import time

import jax
import numpy as np
from flax import nnx

from medjax import checkpoint as checkpoint_lib
from medjax import evaluate as evaluate_lib
from medjax import progress
from medjax.data import ingest
from medjax.data import loader
from medjax.data import partition
from medjax.data import pipeline
from medjax.model import fusion
from medjax.train import optim
from medjax.train import state as state_lib
from medjax.train import step as step_lib
from medjax.train import writers


class TrainingError(RuntimeError):
  """Training cannot go on (e.g. a non-finite loss); the message says where and what to do."""


@dataclasses.dataclass(frozen=True)
class Topology:
  """Which host and process this is. Single-process runs use the defaults."""
  hosts: tuple[str, ...] = ("host-0",)
  host: str = "host-0"
  local_index: int = 0
  local_count: int = 1

  @property
  def host_index(self) -> int:
    return self.hosts.index(self.host)


def check_shapes(config, prepared) -> None:
  """Fails before training when the config and the data disagree, naming both values."""
  m = config.model
  data_classes = len(prepared.manifest.class_names)
  if data_classes < 2:
    raise TrainingError(f"the manifest has {data_classes} classes; training needs labels.csv with "
                        "at least two classes")
  for name, wanted, actual in (
      ("config.model.num_classes", m.num_classes, data_classes),
      ("config.model.num_analytes", m.num_analytes, prepared.shapes.num_analytes),
      ("config.model.vitals_channels", m.vitals_channels, prepared.shapes.vitals_channels)):
    if wanted and wanted != actual:
      raise TrainingError(f"{name}={wanted} but the ingested data has {actual}; set it to "
                          f"{actual} (or 0 to take it from the data)")


def class_weights(config, manifest) -> np.ndarray:
  """Inverse-frequency weights (normalised to mean 1 per record) when config.optim says so."""
  k = len(manifest.class_names)
  if not config.optim.class_weighted:
    return np.ones(k, np.float32)
  counts = np.bincount(manifest.labels[manifest.indices("train")], minlength=k).astype(np.float64)
  w = np.where(counts > 0, 1.0 / np.maximum(counts, 1), 0.0) ** config.optim.class_weight_power
  return (w / np.sum(w * counts) * counts.sum()).astype(np.float32)


def fill_values(reader: loader.BatchReader, rows: np.ndarray, tables) -> tuple:
  """(mean training image, raw-zero in z-space for labs, for vitals) for 'mean'/'zero' fills."""
  size = reader.cache.shapes.image_size
  sample = reader.cache.read(rows[:256])
  images = sample["images"][sample["image_mask"]]
  image_mean = images.mean(0) if len(images) else np.zeros((size, size), np.float32)
  return (image_mean, -tables["labs_mean"] / tables["labs_std"],
          -tables["vitals_mean"] / tables["vitals_std"])


def train_and_evaluate(config, workdir: str, topology: Topology = Topology()) -> dict:
  """Trains on the partition plan, checkpoints, evaluates; returns summary.json's contents."""
  is_chief = jax.process_index() == 0
  # Mesh.
  mesh = state_lib.make_mesh(config.mesh)
  batch_sharding = state_lib.batch_sharding(mesh)
  global_batch = config.data.batch_size
  if global_batch % mesh.size:
    raise TrainingError(f"config.data.batch_size={global_batch} does not split over "
                        f"{mesh.size} devices; make it a multiple")
  host_batch = global_batch // len(topology.hosts)

  # Data: cohort, ingest, placement, this host's cache.
  prepared = pipeline.prepare(config, workdir, list(topology.hosts))
  check_shapes(config, prepared)
  manifest, tables = prepared.manifest, prepared.ingested.tables
  cache = pipeline.open_cache(config, workdir, prepared, topology.host,
                              read_only=topology.local_index != 0)
  if topology.local_index == 0:
    pipeline.fill_cache(cache, prepared.placement.rows_of(topology.host),
                        f"decoding {topology.host}")
  reader = loader.BatchReader(
      cache, manifest, tables, host_index=topology.host_index,
      local_index=topology.local_index, local_count=topology.local_count,
      class_weight_K=class_weights(config, manifest),
      complete_only=config.model.missing == "drop")

  def plan(epoch: int) -> partition.EpochPlan:
    return partition.plan_epoch(manifest, prepared.placement, seed=config.seed, epoch=epoch,
                                num_partitions=config.data.num_partitions,
                                host_batch_size=host_batch)

  # Model and optimizer, state created sharded.
  steps_per_epoch = plan(0).num_steps
  total_steps = config.optim.epochs * steps_per_epoch
  tx, lr_schedule = optim.make(config.optim, total_steps)
  state, built = state_lib.build(config.model, tx, mesh, num_classes=len(manifest.class_names),
                                 shapes=prepared.shapes, seed=config.seed)
  num_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state["params"]))
  logging.info("model: %s parameters; %d steps per epoch, %d epochs, global batch %d on %d "
               "devices", f"{num_params:,}", steps_per_epoch, config.optim.epochs, global_batch,
               mesh.size)
  train_step = step_lib.make_train_step(built.graphdef, tx, built, mesh, seed=config.seed)

  # Restore the newest checkpoint, or set the fill values from training data on a fresh start.
  ckpt_dir = os.path.join(workdir, "checkpoints")
  restored = checkpoint_lib.restore_latest(ckpt_dir, built.abstract)
  if restored is not None:
    state, lineage, _ = restored
  else:
    lineage = {"epoch": 0, "partition": 0, "offset": 0, "global_step": 0, "seed": config.seed,
               "generation": prepared.placement.generation}
    if config.model.missing != "learned":
      image_mean, labs_zero, vitals_zero = fill_values(reader, manifest.indices("train"), tables)
      model = _model_view(built, state)
      model.set_fill_values(image_mean, labs_zero, vitals_zero)
      state = dict(state, fill=jax.device_put(_fill_state(model), built.shardings["fill"]))
  ckpt = checkpoint_lib.Checkpointer(ckpt_dir, max_to_keep=config.ckpt.max_to_keep,
                                     async_save=config.ckpt.async_save)
  writer = writers.MetricWriter(workdir, enabled=is_chief)

  # The loop: epochs -> partitions -> steps, resuming where the lineage says.
  t_start = time.perf_counter()
  executed = 0
  bar = progress.Progress(total_steps, "training", unit="step")
  bar.update(lineage["global_step"])
  last_good = restored[2] if restored is not None else None
  for epoch in range(lineage["epoch"], config.optim.epochs):
    epoch_plan = plan(epoch)
    first_partition = lineage["partition"] if epoch == lineage["epoch"] else 0
    for p in range(first_partition, epoch_plan.num_partitions):
      steps = epoch_plan.steps[p]
      offset = lineage["offset"] if (epoch, p) == (lineage["epoch"], lineage["partition"]) else 0
      for s, local in loader.prefetched(reader, steps, start=offset):
        t0 = time.perf_counter()
        batch = loader.to_global(local, batch_sharding, global_batch)
        state, step_metrics = train_step(state, batch)
        step_metrics = jax.device_get(step_metrics)
        executed += 1
        global_step = lineage["global_step"] + 1
        if not math.isfinite(float(step_metrics["loss"])):
          bad = [manifest.record_ids[r] for r in local["row"] if r >= 0]
          raise TrainingError(
              f"non-finite loss {float(step_metrics['loss'])} at step {global_step} (epoch "
              f"{epoch}, partition {p}, offset {s}); this process's records in the batch: "
              f"{bad[:8]}{'...' if len(bad) > 8 else ''}; last good checkpoint: "
              f"{last_good if last_good is not None else 'none'} in {ckpt_dir}. Lower "
              "config.optim.lr or check those records, then rerun to resume from it")
        lineage = dict(lineage, epoch=epoch, partition=p, offset=s + 1, global_step=global_step)
        dt = time.perf_counter() - t0
        writer.write(global_step, {
            "loss": step_metrics["loss"], "accuracy": step_metrics["accuracy"],
            "grad_norm": step_metrics["grad_norm"],
            "learning_rate": float(lr_schedule(global_step // config.optim.grad_accum)),
            "examples_per_s": float(step_metrics["weight"] > 0) * float(
                np.sum(local["row"] >= 0)) * jax.process_count() / max(dt, 1e-9),
            "epoch": epoch, "partition": p})
        bar.update(1, loss=f"{float(step_metrics['loss']):.3f}")
      # Partition boundary: the next partition starts at offset 0.
      lineage = dict(lineage, partition=p + 1, offset=0)
      if p + 1 == epoch_plan.num_partitions:
        lineage = dict(lineage, epoch=epoch + 1, partition=0)
      ckpt.save(lineage["global_step"], state, lineage)
      last_good = lineage["global_step"]
  bar.close()
  ckpt.close()
  train_seconds = time.perf_counter() - t_start

  # Evaluation.
  predict = step_lib.make_predict_step(built.graphdef, built, mesh)
  ceiling = ingest.load_ceiling(workdir)
  results = {}
  for split in config.evals.splits:
    rows = manifest.indices(split)
    probs = evaluate_lib.predict(predict, state, reader, prepared.placement, rows,
                                 host_batch=host_batch, sharding=batch_sharding,
                                 global_batch=global_batch, seed=config.seed)
    results[split] = evaluate_lib.split_metrics(manifest, rows, probs,
                                                bootstrap=config.evals.bootstrap,
                                                seed=config.seed)
    if split == "test" and ceiling is not None:
      results["ceiling"] = evaluate_lib.ceiling_metrics(manifest, rows, ceiling,
                                                        bootstrap=config.evals.bootstrap,
                                                        seed=config.seed)
  summary = {**results,
             "train": {"steps_executed": executed, "global_step": lineage["global_step"],
                       "epochs": config.optim.epochs, "seconds": round(train_seconds, 2),
                       "parameters": num_params, "devices": mesh.size,
                       "processes": jax.process_count()},
             "cache": {topology.host: cache.counters}}
  writer.close()
  if is_chief:
    with open(os.path.join(workdir, "summary.json"), "w") as f:
      json.dump(summary, f, indent=2, default=float)
    evaluate_lib.write_plots(workdir, summary, manifest.class_names)
    logging.info("summary\n%s", evaluate_lib.format_summary(summary))
  return summary


def _model_view(built: state_lib.Built, state: dict):
  return nnx.merge(built.graphdef, jax.device_get(state["params"]), jax.device_get(state["fill"]))


def _fill_state(model):
  return nnx.state(model, fusion.FillValue)
