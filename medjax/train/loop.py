"""The trainer, top to bottom: mesh -> data -> model and optimizer -> sharded state -> step
functions -> checkpoint restore -> loop over the partition plan -> evaluation and summary.

Each per-step concern lives in a named helper: the plan position and its lineage
(`lineage.Cursor`), batches (`data.loader`), when to save and the commit path
(`train.checkpointing`), metrics and progress at the logging interval (`train.reporting`), the
ledger and fault injection (`fault.ledger`, `fault.inject`).
"""

from __future__ import annotations

import hashlib
import logging
import time

import jax
import numpy as np
from flax import nnx

from medjax import checkpoint as checkpoint_lib
from medjax import evaluate as evaluate_lib
from medjax import lineage as lineage_lib
from medjax import paths
from medjax import progress
from medjax.data import host as host_lib
from medjax.data import loader
from medjax.fault import context
from medjax.fault import inject
from medjax.fault import ledger as ledger_lib
from medjax.model import fusion
from medjax.train import checkpointing
from medjax.train import optim
from medjax.train import reporting
from medjax.train import state as state_lib
from medjax.train import step as step_lib
from medjax.train import writers

# Cache counters in metrics.jsonl and summary.json (`cache.hosts.<host>.<counter>`, `cache.total`).
SUMMARY_COUNTERS = ("pfs_reads", "pfs_bytes", "hits", "misses", "records_moved_in", "recache_s",
                    "moved_reads", "pfs_files", "wait_s", "damaged")

Topology = host_lib.Topology
TrainingError = reporting.TrainingError
Preempted = checkpointing.Preempted


class Stopped(Exception):
  """The coordinator asked this generation to stop at a step boundary."""


def train_and_evaluate(config, workdir: str, topology: Topology = Topology(), ctx=None,
                       host_history: list[list[str]] | None = None) -> dict:
  """Trains on the partition plan, checkpoints, evaluates; returns summary.json's contents.

  Args:
    config: the run config.
    workdir: the run directory (shared storage).
    topology: this process's host and place among the host's processes.
    ctx: the fault-tolerance context (`medjax.fault.context`); None: a single-process run that
      commits its own lineage records.
    host_history: host sets of the placement generations so far (default: just this one).
  """
  run = paths.RunPaths(workdir, config)
  store = lineage_lib.LineageStore(run.lineage_store)
  ctx = ctx or context.Local(store, run.checkpoints, config.ckpt.max_to_keep)
  is_chief = jax.process_index() == 0
  barrier = checkpoint_lib.Barrier(config.fault.timeout_compile_s)
  ctx.set_phase("preparing")

  # Mesh.
  mesh = state_lib.make_mesh(config.mesh)
  batch_sharding = state_lib.batch_sharding(mesh)
  global_batch = config.data.batch_size

  # Data: cohort, ingest, this generation's placement, this host's cache and reader.
  data = host_lib.setup(config, workdir, topology, host_history,
                        barrier=lambda name: barrier(name, config.fault.timeout_start_s),
                        alive=lambda n: ctx.alive())
  check_shapes(config, data.prepared, mesh)
  manifest = data.manifest
  reader = data.reader(class_weight_K=class_weights(config, manifest),
                       complete_only=config.model.missing == "drop")

  # Model and optimizer, state created sharded, the jitted step.
  steps_per_epoch = data.plan(0).num_steps
  total_steps = config.optim.epochs * steps_per_epoch
  tx, lr_schedule = optim.make(config.optim, total_steps)
  state, built = state_lib.build(config.model, tx, mesh, num_classes=len(manifest.class_names),
                                 shapes=data.prepared.shapes, seed=config.seed)
  num_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state["params"]))
  logging.info("model: %s parameters; %d steps per epoch, %d epochs, global batch %d on %d "
               "devices in %d processes", f"{num_params:,}", steps_per_epoch,
               config.optim.epochs, global_batch, mesh.size, jax.process_count())
  train_step = step_lib.make_train_step(built.graphdef, tx, built, mesh, seed=config.seed,
                                        lr_schedule=lr_schedule,
                                        grad_accum=config.optim.grad_accum)

  # Restore the newest committed checkpoint; a fresh start sets the fill values from data.
  ctx.set_phase("restoring")
  ckpt = checkpoint_lib.Checkpointer(run.checkpoints, async_save=config.ckpt.async_save)
  restored, lineage, last_good = checkpointing.restore_or_start(
      ckpt, store, built.abstract, placement=data.placement_id, hosts=data.placement.hosts,
      seed=config.seed, num_records=len(manifest), is_chief=is_chief, barrier=barrier,
      if_all_damaged=config.ckpt.if_all_damaged, records=records_fingerprint(manifest))
  if restored is not None:
    state = restored
  elif config.model.missing != "learned":
    state = with_fill_values(state, built, reader, manifest.indices("train"), data.tables)
  cursor = lineage_lib.Cursor(lineage, len(manifest), generation=ctx.generation)

  # The loop: epochs -> partitions -> steps, from where the lineage says.
  writer = writers.MetricWriter(workdir, enabled=is_chief)
  bar = progress.Progress(total_steps, "training", unit="step")
  bar.update(cursor.global_step)
  reporter = reporting.Reporter(
      writer, bar, every=config.log_every_steps, processes=jax.process_count(),
      record_ids=manifest.record_ids, generation=ctx.generation, on_progress=ctx.progress,
      resume_hint=lambda: f"last good checkpoint: {saver.last_saved} in {run.checkpoints}")
  saver = checkpointing.Saver(ckpt, ctx, is_chief=is_chief, last_saved=last_good,
                              before_save=reporter.flush)
  policy = checkpointing.SavePolicy(config.ckpt, epochs=config.optim.epochs)
  preemption = checkpointing.Preemption()
  injector = inject.Injector(config.fault.inject, jax.process_index(), workdir,
                             host=topology.host)
  ledger = ledger_lib.Writer(workdir, ctx.generation, jax.process_index(),
                             enabled=config.fault.ledger)
  recacher = data.start_recache(data.plan(cursor.epoch, cursor.base_N), cursor.partition)
  t_start = time.perf_counter()
  ctx.set_phase("compiling")
  try:
    while cursor.epoch < config.optim.epochs:
      epoch_plan = data.plan(cursor.epoch, cursor.base_N)
      for p in range(cursor.partition, epoch_plan.num_partitions):
        injector.at_partition(p, cursor.global_step, cursor.epoch)
        steps = epoch_plan.steps[p]
        batches = data_batches(config, reader, steps, cursor.offset, batch_sharding)
        for s, local, batch in batches:
          if ctx.stop_requested():
            raise Stopped(f"stop requested at step {cursor.global_step}")
          state, metrics = train_step(state, batch)
          batches.read_ahead()   # while the step runs
          cursor.step_done(steps[s])
          ctx.executed += 1
          ledger.write(cursor.global_step, cursor.epoch, local["row"])
          reporter.step(global_step=cursor.global_step, epoch=cursor.epoch, partition=p,
                        offset=cursor.offset, rows=local["row"], metrics=metrics)
          injector.after_step(cursor.global_step)
          if policy.after_step(cursor.global_step, cursor.offset, len(steps)):
            saver.save(state, cursor.lineage())
          if preemption.reached(cursor.global_step):
            saver.preempt(state, cursor.lineage())
          saver.commit_finalized()
        # Partition boundary: a checkpoint; after the last one, the next epoch's first segment.
        cursor.partition_done()
        epoch_done = cursor.partition == epoch_plan.num_partitions
        if epoch_done:
          cursor.new_segment(epoch=cursor.epoch + 1, placement=data.placement_id,
                             hosts=data.placement.hosts, base_N=np.zeros(len(manifest), bool))
        if policy.at_boundary(cursor.epoch):
          saver.save(state, cursor.lineage())
        publish_cache_counters(data, reporter, barrier, config,
                               epoch_end=cursor.epoch - 1 if epoch_done else None,
                               step=cursor.global_step, log=is_chief)
    reporter.flush()
    saver.finish()
  finally:
    bar.close()
    ledger.close()
  ckpt.close()
  train_seconds = time.perf_counter() - t_start

  # Evaluation.
  ctx.set_phase("evaluating")
  predict = step_lib.make_predict_step(built.graphdef, built, mesh)
  results, _ = evaluate_lib.evaluate_splits(config.evals.splits, predict, state, reader, data,
                                            sharding=batch_sharding, global_batch=global_batch,
                                            bootstrap=config.evals.bootstrap, seed=config.seed)
  recacher.close()
  data.publish_counters()
  barrier("cache counters final", config.fault.timeout_start_s)
  summary = {**results,
             "train": {"steps_executed_this_process": ctx.executed,
                       "global_step": cursor.global_step, "epochs": config.optim.epochs,
                       "seconds": round(train_seconds, 2), "parameters": num_params,
                       "devices": mesh.size, "processes": jax.process_count(),
                       "checkpoint_blocked_s": round(ckpt.blocked_s, 3)},
             "cache": cache_summary(config.data, data.gathered_counters())}
  writer.close()
  if is_chief:
    evaluate_lib.write_summary(workdir, summary, manifest.class_names)
  ctx.set_phase("done")
  return summary


def records_fingerprint(manifest) -> str:
  """The manifest's record ids in row order, hashed: what a lineage bitmap's rows mean."""
  return hashlib.sha256("\n".join(manifest.record_ids).encode()).hexdigest()[:16]


def cache_summary(data_config, counts: dict) -> dict:
  """summary.json's cache block: the policy and every host's counters (README, "The cache")."""
  pick = lambda c: {k: c[k] for k in SUMMARY_COUNTERS}
  return {"policy": data_config.cache_policy, "replicas": data_config.replicas,
          "placement": data_config.placement_method,
          "hosts": {h: pick(c) for h, c in counts["hosts"].items()},
          "total": pick(counts["total"])}


def check_shapes(config, prepared, mesh) -> None:
  """Fails before training when the config and the data disagree, naming both values."""
  if config.data.batch_size % mesh.size:
    raise TrainingError(f"config.data.batch_size={config.data.batch_size} does not split over "
                        f"{mesh.size} devices; make it a multiple")
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


def fill_values(reader, rows: np.ndarray, tables) -> tuple:
  """(mean training image, raw-zero in z-space for labs, for vitals) for 'mean'/'zero' fills."""
  size = reader.cache.shapes.image_size
  sample = reader.cache.read(rows[:256])
  images = sample["images"][sample["image_mask"]]
  image_mean = images.mean(0) if len(images) else np.zeros((size, size), np.float32)
  return (image_mean, -tables["labs_mean"] / tables["labs_std"],
          -tables["vitals_mean"] / tables["vitals_std"])


def with_fill_values(state: dict, built, reader, rows: np.ndarray, tables) -> dict:
  """`state` with the 'zero'/'mean' fill values of the missing-modality ablations set from data."""
  # Writable host copies: set_fill_values assigns into the fill variables.
  host = lambda tree: jax.tree.map(np.array, jax.device_get(tree))
  model = nnx.merge(built.graphdef, host(state["params"]), host(state["fill"]))
  model.set_fill_values(*fill_values(reader, rows, tables))
  return dict(state, fill=jax.device_put(nnx.to_pure_dict(nnx.state(model, fusion.FillValue)),
                                         built.shardings["fill"]))


def data_batches(config, reader, steps_SxWxb: np.ndarray, start: int, sharding):
  """One partition's batches from step `start`, read ahead as config.data.prefetch says."""
  return loader.batches(reader, steps_SxWxb, start=start, sharding=sharding,
                        global_batch=config.data.batch_size, how=config.data.prefetch)


def publish_cache_counters(data: host_lib.HostData, reporter: reporting.Reporter, barrier,
                           config, *, epoch_end: int | None, step: int, log: bool) -> None:
  """Publishes this process's cache counters; at an epoch end the chief logs every host's."""
  data.publish_counters()
  if epoch_end is None:
    return
  barrier(f"cache counters {epoch_end}", config.fault.timeout_compile_s)
  if log:
    reporter.cache_counters(step, epoch_end, data.gathered_counters(), SUMMARY_COUNTERS)
