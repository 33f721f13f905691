"""The trainer, top to bottom: mesh -> data -> model and optimizer -> sharded state -> step
functions -> checkpoint restore -> loop over the partition plan -> evaluation and summary.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import signal
import threading
import time

import jax
import numpy as np
from flax import nnx

from medjax import checkpoint as checkpoint_lib
from medjax import evaluate as evaluate_lib
from medjax import lineage as lineage_lib
from medjax import progress
from medjax.data import ingest
from medjax.data import loader
from medjax.data import partition
from medjax.data import pipeline
from medjax.data import recache
from medjax.fault import context
from medjax.fault import inject
from medjax.fault import ledger as ledger_lib
from medjax.model import fusion
from medjax.train import optim
from medjax.train import state as state_lib
from medjax.train import step as step_lib
from medjax.train import writers


# Cache counters in metrics.jsonl and summary.json (`cache.hosts.<host>.<counter>`, `cache.total`).
SUMMARY_COUNTERS = ("pfs_reads", "pfs_bytes", "hits", "misses", "records_moved_in", "recache_s",
                    "moved_reads", "pfs_files", "wait_s", "damaged")


def _pick(counters: dict) -> dict:
  return {k: counters[k] for k in SUMMARY_COUNTERS}


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


def placement_fingerprint(placement) -> str:
  h = hashlib.sha256(np.ascontiguousarray(placement.owner_N).tobytes())
  h.update(json.dumps(list(placement.hosts)).encode())
  return h.hexdigest()[:16]


def _segment(epoch: int, global_step: int, seed: int, placement, base_N: np.ndarray) -> dict:
  """A fresh plan segment: the rest of `epoch` (records not in base) under `placement`."""
  return {"global_step": global_step, "epoch": epoch, "seed": seed, "partition": 0, "offset": 0,
          "segment": {"placement": placement_fingerprint(placement),
                      "hosts": list(placement.hosts), "base": lineage_lib.pack_bitmap(base_N)},
          "processed": lineage_lib.pack_bitmap(base_N)}


class Stopped(Exception):
  """The coordinator asked this generation to stop at a step boundary."""


class Preempted(Exception):
  """SIGTERM: a checkpoint was saved and committed; the process should exit."""


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
  is_chief = jax.process_index() == 0
  store = lineage_lib.LineageStore(config.ckpt.lineage_store
                                   or os.path.join(workdir, "lineage"))
  ctx = ctx or context.Local(store)
  injector = inject.Injector(config.fault.inject, jax.process_index(), workdir,
                             host=topology.host)
  sigterm = _sigterm_flag()
  ctx.set_phase("preparing")

  # Mesh.
  mesh = state_lib.make_mesh(config.mesh)
  batch_sharding = state_lib.batch_sharding(mesh)
  global_batch = config.data.batch_size
  if global_batch % mesh.size:
    raise TrainingError(f"config.data.batch_size={global_batch} does not split over "
                        f"{mesh.size} devices; make it a multiple")
  host_batch = global_batch // len(topology.hosts)

  # Data: cohort, ingest, placement for this generation's hosts, this host's cache.
  history = host_history or [list(topology.hosts)]
  prepared = pipeline.prepare(config, workdir, list(topology.hosts), host_history=history)
  check_shapes(config, prepared)
  manifest, tables = prepared.manifest, prepared.ingested.tables
  host_rows = recache.host_rows(config.data, manifest, history, topology.host, seed=config.seed)
  # The host's first process fills its cache (what is new since the last membership change
  # follows in the background); the others open it read-only once the fill is done.
  writer_process = topology.local_index == 0
  if writer_process:
    cache = pipeline.open_cache(config, workdir, prepared, topology.host)
    cache.configure(no_cache=host_rows.no_cache, moved=host_rows.moved_in)
    cache.note_membership(host_rows.membership, len(host_rows.moved_in))
    pipeline.fill_cache(cache, host_rows.prefill, f"decoding {topology.host}",
                        on_progress=lambda n: ctx.alive())
  context.barrier("cache filled", config.fault.timeout_start_s)
  if not writer_process:
    cache = pipeline.open_cache(config, workdir, prepared, topology.host, read_only=True,
                                process=topology.local_index)
    cache.configure(no_cache=host_rows.no_cache, moved=host_rows.moved_in,
                    expect=host_rows.background)
  cache.hold_in_memory(host_rows.wanted, config.data.cache_memory_mb)

  def cache_counters(epoch_end: int | None = None, step: int = 0) -> None:
    """Publishes this process's counters; at an epoch end the chief logs every host's."""
    recache.publish(workdir, topology.host, topology.local_index, cache.save_counters())
    if epoch_end is None:
      return
    context.barrier(f"cache counters {epoch_end}", config.fault.timeout_compile_s)
    if is_chief:
      counts = recache.gathered(workdir)
      per_host = [("total", counts["total"]), *counts["hosts"].items()]
      writer.write(step, {"epoch": epoch_end, "time": time.time(), "generation": ctx.generation,
                          **{f"{host}/{k}": c[k] for host, c in per_host
                             for k in SUMMARY_COUNTERS}}, kind="cache")
  reader = loader.BatchReader(
      cache, manifest, tables, host_index=topology.host_index,
      local_index=topology.local_index, local_count=topology.local_count,
      class_weight_K=class_weights(config, manifest),
      complete_only=config.model.missing == "drop")
  train_rows = manifest.indices("train")

  def plan(epoch: int, base_N: np.ndarray) -> partition.EpochPlan:
    rows = train_rows[~base_N[train_rows]] if base_N.any() else None
    return partition.plan_epoch(manifest, prepared.placement, seed=config.seed, epoch=epoch,
                                num_partitions=config.data.num_partitions,
                                host_batch_size=host_batch, rows=rows)

  # Model and optimizer, state created sharded.
  no_records = np.zeros(len(manifest), bool)
  steps_per_epoch = plan(0, no_records).num_steps
  total_steps = config.optim.epochs * steps_per_epoch
  tx, lr_schedule = optim.make(config.optim, total_steps)
  state, built = state_lib.build(config.model, tx, mesh, num_classes=len(manifest.class_names),
                                 shapes=prepared.shapes, seed=config.seed)
  num_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state["params"]))
  logging.info("model: %s parameters; %d steps per epoch, %d epochs, global batch %d on %d "
               "devices in %d processes", f"{num_params:,}", steps_per_epoch,
               config.optim.epochs, global_batch, mesh.size, jax.process_count())
  train_step = step_lib.make_train_step(built.graphdef, tx, built, mesh, seed=config.seed)

  # Restore the newest committed checkpoint; a fresh start sets the fill values from data.
  ctx.set_phase("restoring")
  ckpt_dir = os.path.join(workdir, "checkpoints")
  if is_chief:
    dropped = checkpoint_lib.discard_uncommitted(ckpt_dir, store.committed_steps())
    if dropped:
      logging.info("checkpoints %s were never committed; deleted", dropped)
  context.barrier("uncommitted checkpoints discarded", config.fault.timeout_compile_s)
  ckpt = checkpoint_lib.Checkpointer(ckpt_dir, async_save=config.ckpt.async_save)
  restored = checkpoint_lib.restore_committed(ckpt_dir, store, built.abstract, ckpt)
  if restored is not None:
    state, lineage, last_good = restored
    if lineage["segment"]["placement"] != placement_fingerprint(prepared.placement):
      # The host set changed: plan the epoch's remaining records under the new placement.
      processed = lineage_lib.unpack_bitmap(lineage["processed"], len(manifest))
      lineage = _segment(lineage["epoch"], lineage["global_step"], config.seed,
                         prepared.placement, processed)
      logging.info("resume: hosts changed; re-planning the %d records left in epoch %d",
                   int(np.sum(~processed[train_rows])), lineage["epoch"])
  else:
    last_good = None
    lineage = _segment(0, 0, config.seed, prepared.placement, no_records)
    if config.model.missing != "learned":
      image_mean, labs_zero, vitals_zero = fill_values(reader, train_rows, tables)
      # Writable host copies: set_fill_values assigns into the fill variables.
      host = lambda tree: jax.tree.map(np.array, jax.device_get(tree))
      model = nnx.merge(built.graphdef, host(state["params"]), host(state["fill"]))
      model.set_fill_values(image_mean, labs_zero, vitals_zero)
      state = dict(state, fill=jax.device_put(
          nnx.to_pure_dict(nnx.state(model, fusion.FillValue)), built.shardings["fill"]))
  writer = writers.MetricWriter(workdir, enabled=is_chief)
  ledger = ledger_lib.Writer(workdir, ctx.generation, jax.process_index(),
                             enabled=config.fault.ledger)
  # Newly owned records are decoded in the background, those the plan reads first first.
  next_plan = plan(lineage["epoch"],
                   lineage_lib.unpack_bitmap(lineage["segment"]["base"], len(manifest)))
  upcoming = np.concatenate([np.zeros(0, int)] + [
      steps[:, topology.host_index].ravel() for steps in next_plan.steps[lineage["partition"]:]])
  recacher = recache.Recacher(cache, recache.plan_order(upcoming, host_rows.background)
                              if writer_process else np.zeros(0, int)).start()

  def commit_finalized():
    for step, saved in ckpt.finalized():
      if is_chief:
        ctx.commit(dict(saved, committed_at=time.time()))
        if isinstance(ctx, context.Local):
          checkpoint_lib.prune(ckpt_dir, store.committed_steps(), config.ckpt.max_to_keep)
      del step

  saved_step = [last_good]

  def save(lineage_now: dict) -> None:
    if lineage_now["global_step"] == saved_step[0]:
      return  # e.g. a partition boundary reached right after restoring there
    saved_step[0] = lineage_now["global_step"]
    ctx.set_phase("checkpointing")
    ckpt.save(lineage_now["global_step"], state, lineage_now)
    ctx.blocked_s = ckpt.blocked_s
    ctx.set_phase("training")

  # The loop: epochs -> partitions -> steps, from where the lineage says.
  t_start = time.perf_counter()
  executed = 0
  bar = progress.Progress(total_steps, "training", unit="step")
  bar.update(lineage["global_step"])
  ctx.set_phase("compiling")
  try:
    while lineage["epoch"] < config.optim.epochs:
      epoch = lineage["epoch"]
      base = lineage_lib.unpack_bitmap(lineage["segment"]["base"], len(manifest))
      processed = lineage_lib.unpack_bitmap(lineage["processed"], len(manifest))
      epoch_plan = plan(epoch, base)
      for p in range(lineage["partition"], epoch_plan.num_partitions):
        injector.at_partition(p, lineage["global_step"], epoch)
        steps = epoch_plan.steps[p]
        step_batches = loader.batches(reader, steps, start=lineage["offset"],
                                      sharding=batch_sharding, global_batch=global_batch,
                                      how=config.data.prefetch)
        for s, local, batch in step_batches:
          if ctx.stop_requested():
            raise Stopped(f"stop requested at step {lineage['global_step']}")
          t0 = time.perf_counter()
          state, step_metrics = train_step(state, batch)
          step_batches.read_ahead()   # while the step runs
          step_metrics = jax.device_get(step_metrics)
          executed += 1
          global_step = lineage["global_step"] + 1
          step_rows = steps[s].ravel()
          processed[step_rows[step_rows >= 0]] = True
          lineage = dict(lineage, global_step=global_step, partition=p, offset=s + 1)
          ledger.write(global_step, epoch, local["row"])
          if ctx.phase != "training":
            ctx.set_phase("training")
          ctx.progress(global_step, epoch, p)
          if not math.isfinite(float(step_metrics["loss"])):
            bad = [manifest.record_ids[r] for r in local["row"] if r >= 0]
            raise TrainingError(
                f"non-finite loss {float(step_metrics['loss'])} at step {global_step} (epoch "
                f"{epoch}, partition {p}, offset {s}); this process's records in the batch: "
                f"{bad[:8]}{'...' if len(bad) > 8 else ''}; last good checkpoint: "
                f"{last_good if last_good is not None else 'none'} in {ckpt_dir}. Lower "
                "config.optim.lr or check those records, then rerun to resume from it")
          dt = time.perf_counter() - t0
          writer.write(global_step, {
              "loss": step_metrics["loss"], "accuracy": step_metrics["accuracy"],
              "grad_norm": step_metrics["grad_norm"],
              "learning_rate": float(lr_schedule(global_step // config.optim.grad_accum)),
              "examples_per_s": float(np.sum(local["row"] >= 0)) * jax.process_count() / dt,
              "epoch": epoch, "partition": p, "generation": ctx.generation})
          bar.update(1, loss=f"{float(step_metrics['loss']):.3f}")
          injector.after_step(global_step)
          lineage = dict(lineage, processed=lineage_lib.pack_bitmap(processed))
          k = config.ckpt.every_steps
          if k and global_step % k == 0 and s + 1 < len(steps):
            save(lineage)
          preempted = (ckpt.reached_preemption(global_step) if jax.distributed.is_initialized()
                       else sigterm.is_set())
          if preempted:
            save(lineage)
            ckpt.wait()
            commit_finalized()
            ctx.flush()
            raise Preempted(f"SIGTERM: checkpoint {global_step} saved and committed")
          commit_finalized()
        # Partition boundary: a checkpoint; after the last one, the next epoch's first segment.
        lineage = dict(lineage, partition=p + 1, offset=0)
        if p + 1 == epoch_plan.num_partitions:
          lineage = _segment(epoch + 1, lineage["global_step"], config.seed, prepared.placement,
                             no_records)
        if config.ckpt.partition_boundaries or lineage["epoch"] == config.optim.epochs:
          save(lineage)
        last_good = saved_step[0]
        cache_counters(epoch if p + 1 == epoch_plan.num_partitions else None,
                       lineage["global_step"])
    ckpt.wait()
    commit_finalized()
    ctx.flush()
  finally:
    bar.close()
    ledger.close()
  ckpt.close()
  train_seconds = time.perf_counter() - t_start

  # Evaluation.
  ctx.set_phase("evaluating")
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
  recacher.close()
  cache_counters()
  context.barrier("cache counters final", config.fault.timeout_start_s)
  counts = recache.gathered(workdir)
  summary = {**results,
             "train": {"steps_executed_this_process": executed,
                       "global_step": lineage["global_step"], "epochs": config.optim.epochs,
                       "seconds": round(train_seconds, 2), "parameters": num_params,
                       "devices": mesh.size, "processes": jax.process_count(),
                       "checkpoint_blocked_s": round(ckpt.blocked_s, 3)},
             "cache": {"policy": config.data.cache_policy, "replicas": config.data.replicas,
                       "placement": config.data.placement_method,
                       "hosts": {h: _pick(c) for h, c in counts["hosts"].items()},
                       "total": _pick(counts["total"])}}
  writer.close()
  if is_chief:
    with open(os.path.join(workdir, "summary.json"), "w") as f:
      json.dump(summary, f, indent=2, default=float)
    evaluate_lib.write_plots(workdir, summary, manifest.class_names)
    logging.info("summary\n%s", evaluate_lib.format_summary(summary))
  ctx.set_phase("done")
  return summary


def _sigterm_flag():
  """Single-process runs: SIGTERM sets a flag the loop checks at step boundaries."""
  flag = threading.Event()
  if threading.current_thread() is threading.main_thread() and not jax.distributed.is_initialized():
    signal.signal(signal.SIGTERM, lambda *_: flag.set())
  return flag
