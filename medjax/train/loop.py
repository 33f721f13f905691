"""The trainer, top to bottom: mesh -> data -> model and optimizer -> sharded state -> step
functions -> checkpoint restore -> loop over the partition plan -> evaluation and summary.

In two parts: `prepare` (everything before the restore, the compiled step included) and
`run_prepared` (restore, loop, evaluation); `train_and_evaluate` is both. A warm standby worker
prepares ahead of the generation it may replace (`medjax.fault.worker`).

Each per-step concern lives in a named helper: the plan position and its lineage
(`lineage.Cursor`), batches (`data.loader`), when to save and the commit path
(`train.checkpointing`), metrics and progress at the logging interval (`train.reporting`), the
ledger and fault injection (`fault.ledger`, `fault.inject`).
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import logging
import threading
import time
from typing import Any, Callable

import jax
import numpy as np
from flax import nnx

from medjax import checkpoint as checkpoint_lib
from medjax import evaluate as evaluate_lib
from medjax import lineage as lineage_lib
from medjax import monitor as monitor_lib
from medjax import monitor_plots
from medjax import programs
from medjax import paths
from medjax import snapshots as snapshots_lib
from medjax import progress
from medjax.data import host as host_lib
from medjax.data import loader
from medjax.fault import context
from medjax.fault import inject
from medjax.fault import ledger as ledger_lib
from medjax.fault import phases as phases_lib
from medjax.model import fusion
from medjax.train import checkpointing
from medjax.train import optim
from medjax.train import reporting
from medjax.train import state as state_lib
from medjax.train import step as step_lib
from medjax.train import stopping
from medjax.train import writers

# Cache counters in metrics.jsonl and summary.json (`cache.hosts.<host>.<counter>`, `cache.total`).
SUMMARY_COUNTERS = ("pfs_reads", "pfs_bytes", "hits", "misses", "records_moved_in", "recache_s",
                    "moved_reads", "pfs_files", "wait_s", "damaged")

Topology = host_lib.Topology
TrainingError = reporting.TrainingError
Preempted = checkpointing.Preempted


class Stopped(Exception):
  """The coordinator asked this generation to stop at a step boundary."""


@dataclasses.dataclass
class Prepared:
  """Everything the trainer builds before it restores a checkpoint (`prepare`).

  A warm standby worker builds it for the generation it expects, before that generation exists,
  then `run_prepared` only restores and trains (`medjax.fault.worker`).
  """
  config: Any
  workdir: str
  topology: Topology
  host_history: list[list[str]] | None
  barrier: checkpoint_lib.Barrier
  mesh: jax.sharding.Mesh
  batch_sharding: jax.sharding.NamedSharding
  data: host_lib.HostData
  reader: loader.BatchReader
  steps_per_epoch: int
  total_steps: int
  built: state_lib.Built   # the state's shape; `built.create()` makes a fresh one
  num_params: int
  train_step: Callable
  # The packing that checkpoints and snapshots dispatch, its layout worked out and its program
  # compiled for the state's shape: their first save only dispatches it.
  packer: checkpoint_lib.StatePacker
  ckpt: checkpoint_lib.Checkpointer | None   # opened ahead by a standby (else by the restore)

  def serves(self, topology: Topology, host_history: list[list[str]] | None) -> bool:
    """Whether this preparation is the one a generation of `topology` and history needs."""
    history = lambda h, t: [list(x) for x in (h or [t.hosts])]
    return (topology == self.topology
            and history(host_history, topology) == history(self.host_history, self.topology))

  def take_over(self, ctx) -> None:
    """A standby's preparation becomes its generation's: its cache becomes the host's writer."""
    self.data.take_over(alive=lambda n: ctx.alive())


class _Quiet:
  """The context of a standby preparing before it has a generation: nothing to report."""
  phase = "starting"

  def set_phase(self, phase: str) -> None:
    self.phase = phase

  def alive(self) -> None:
    pass


def train_and_evaluate(config, workdir: str, topology: Topology = Topology(), ctx=None,
                       host_history: list[list[str]] | None = None,
                       phases: phases_lib.Phases | None = None) -> dict:
  """Trains on the partition plan, checkpoints, evaluates; returns summary.json's contents.

  Args:
    config: the run config.
    workdir: the run directory (shared storage).
    topology: this process's host and place among the host's processes.
    ctx: the fault-tolerance context (`medjax.fault.context`); None: a single-process run that
      commits its own lineage records.
    host_history: host sets of the placement generations so far (default: just this one).
    phases: times the start-up phases (`medjax.fault.phases`), if given.
  """
  if ctx is None:
    run = paths.RunPaths(workdir, config)
    ctx = context.Local(lineage_lib.LineageStore(run.lineage_store), run.checkpoints,
                        config.ckpt.max_to_keep, keep_best=config.ckpt.keep_best)
    use_compilation_cache(run)
  prepared = prepare(config, workdir, topology, ctx, host_history, phases=phases)
  return run_prepared(prepared, ctx, phases=phases)


def prepare(config, workdir: str, topology: Topology = Topology(), ctx=None,
            host_history: list[list[str]] | None = None, *, standby: bool = False,
            phases: phases_lib.Phases | None = None) -> Prepared:
  """Mesh -> data -> model and optimizer (abstract: shapes and shardings) -> the compiled step.

  `standby`: a warm standby prepares while the generation it will replace still trains: it opens
  the host's cache without writing it (`host.setup`), and, as a single process, restores the
  newest committed checkpoint once (discarded) so that Orbax and the restore's programs are
  loaded too.
  """
  ctx = ctx or _Quiet()
  phases = phases or phases_lib.Phases()
  ctx.set_phase("preparing")
  barrier = checkpoint_lib.Barrier(config.fault.timeout_compile_s)

  # Mesh.
  mesh = state_lib.make_mesh(config.mesh)
  batch_sharding = state_lib.batch_sharding(mesh)

  # Data: cohort, ingest, this generation's placement, this host's cache and reader.
  with phases.phase("data_setup"):
    data = host_lib.setup(config, workdir, topology, host_history,
                          barrier=lambda name: barrier(name, config.fault.timeout_start_s),
                          alive=lambda n: ctx.alive(), standby=standby)
    check_shapes(config, data.prepared, mesh)
    manifest = data.manifest
    reader = data.reader(class_weight_K=class_weights(config, manifest),
                         complete_only=config.model.missing == "drop")

  # Model and optimizer, state created sharded, the jitted step.
  with phases.phase("model_build"):
    first_plan = data.plan(0)
    steps_per_epoch = first_plan.num_steps
    total_steps = config.optim.epochs * steps_per_epoch
    tx, lr_schedule = optim.make(config.optim, total_steps)
    # No state yet: a restart restores one, a fresh start creates it (`run_prepared`).
    built = state_lib.build_abstract(config.model, tx, mesh,
                                     num_classes=len(manifest.class_names),
                                     shapes=data.prepared.shapes, seed=config.seed)
    num_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(built.abstract["params"]))
  logging.info("model: %s parameters; %d steps per epoch, %d epochs, global batch %d on %d "
               "devices in %d processes", f"{num_params:,}", steps_per_epoch,
               config.optim.epochs, config.data.batch_size, mesh.size, jax.process_count())
  train_step = step_lib.make_train_step(built.graphdef, tx, built, mesh, seed=config.seed,
                                        lr_schedule=lr_schedule,
                                        grad_accum=config.optim.grad_accum)
  # Compiled now (from the persistent cache when it holds the program), on a batch of the real
  # shapes: the first training step then only runs.
  ctx.set_phase("compiling")
  with phases.phase("compile"):
    init = None if standby else _compile_init_beside(config, workdir, built)
    _, _, batch = next(iter(data_batches(config, reader, first_plan.steps[0], 0,
                                         batch_sharding)))
    programs.warm(train_step, built.abstract, batch)
    packer = checkpoint_lib.StatePacker()
    packer.warm(built.abstract)
    if init is not None:
      init.join()

  ckpt = None
  # Not in a group of several processes: each would list the checkpoints at its own moment while
  # the running generation commits, and Orbax's cross-process barriers would not meet.
  if standby and jax.process_count() == 1:
    with phases.phase("warm_restore"):
      run = paths.RunPaths(workdir, config)
      ckpt = _open_while_pruned(run, config, packer)
      _warm_restore(run, ckpt, built.abstract)
  return Prepared(config=config, workdir=workdir, topology=topology, host_history=host_history,
                  barrier=barrier, mesh=mesh, batch_sharding=batch_sharding, data=data,
                  reader=reader, steps_per_epoch=steps_per_epoch, total_steps=total_steps,
                  built=built, num_params=num_params, train_step=train_step,
                  packer=packer, ckpt=ckpt)


def _compile_init_beside(config, workdir: str, built: state_lib.Built):
  """A run with nothing committed yet starts fresh and will create its state: the state's init
  program then compiles on a thread beside the step's (XLA's compiler runs without the GIL), not
  after it (on the tiny config with an empty cache the two took ~6 s each, one after the
  other). Returns the thread, or None where a checkpoint will be restored."""
  store = lineage_lib.LineageStore(paths.RunPaths(workdir, config).lineage_store)
  if store.committed_steps():
    return None

  def compile_init() -> None:
    try:
      programs.warm(built.create)
    except Exception as e:  # pylint: disable=broad-except  (compiled again when it is called)
      logging.info("compiling the init program ahead failed (%s: %s); it compiles when the "
                   "state is created", type(e).__name__, e)

  thread = threading.Thread(target=compile_init, name="compile-init", daemon=True)
  thread.start()
  return thread


def use_compilation_cache(run: paths.RunPaths) -> None:
  """A single-process run reads and fills the persistent compilation cache
  (config.mesh.compilation_cache_dir) as workers do (`medjax.fault.worker`), unless this
  process has one already: a resumed or repeated run does not compile again."""
  if not jax.config.jax_compilation_cache_dir:
    jax.config.update("jax_compilation_cache_dir", run.compilation_cache)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


def _open_while_pruned(run: paths.RunPaths, config, packer: checkpoint_lib.StatePacker,
                       attempts: int = 10):
  """The standby's Checkpointer, opened while the running generation saves and its coordinator
  prunes: Orbax lists the steps and reads each one's metadata, and a step deleted in between
  raises FileNotFoundError. Listing again a moment later sees a consistent directory."""
  for attempt in range(attempts):
    try:
      return checkpoint_lib.Checkpointer(run.checkpoints, async_save=config.ckpt.async_save,
                                         packer=packer)
    except FileNotFoundError as e:
      if attempt == attempts - 1:
        raise
      logging.info("standby: a checkpoint was pruned while it was listed (%s); listing again", e)
      time.sleep(0.1)


def _warm_restore(run: paths.RunPaths, ckpt: checkpoint_lib.Checkpointer, abstract) -> None:
  """Restores the newest committed checkpoint and drops it: the first restore of a process
  loads Orbax and TensorStore's drivers; the one after a failure then takes ~0.1 s."""
  try:
    store = lineage_lib.LineageStore(run.lineage_store)
    restored = checkpoint_lib.restore_committed(run.checkpoints, store, abstract, ckpt)
    if restored is not None:
      jax.block_until_ready(restored[0])
  except Exception as e:  # pylint: disable=broad-except  (a warm-up; the real restore decides)
    logging.info("standby: warm-up restore skipped: %s", e)


def run_prepared(prepared: Prepared, ctx, *, phases: phases_lib.Phases | None = None) -> dict:
  """Checkpoint restore -> the loop over the partition plan -> evaluation; summary.json's dict."""
  p, config, workdir = prepared, prepared.config, prepared.workdir
  phases = phases or phases_lib.Phases()
  run = paths.RunPaths(workdir, config)
  store = lineage_lib.LineageStore(run.lineage_store)
  is_chief = jax.process_index() == 0
  barrier, data, reader, manifest = p.barrier, p.data, p.reader, p.data.manifest
  global_batch, train_step = config.data.batch_size, p.train_step

  # Restore the newest committed checkpoint; a fresh start sets the fill values from data.
  ctx.set_phase("restoring")
  with phases.phase("restore"):
    # Opening the checkpoint manager waits for every process (a barrier in Orbax).
    ckpt = p.ckpt or checkpoint_lib.Checkpointer(run.checkpoints,
                                                 async_save=config.ckpt.async_save,
                                                 packer=p.packer)
    # A host-local snapshot newer than the newest committed checkpoint, when this host has one
    # (a crash or hang of this generation's predecessor on the same hosts), else that checkpoint.
    snapshots = open_snapshots(config, workdir, p.topology, store, is_chief=is_chief,
                               barrier=barrier, packer=p.packer)
    from_snapshot = []

    def newer_snapshot(after_step: int):
      got = snapshots.restore(p.built.abstract, placement=data.placement_id,
                              after_step=after_step)
      from_snapshot.append(got is not None)
      return got

    restored, lineage, last_good = checkpointing.restore_or_start(
        ckpt, store, p.built.abstract, placement=data.placement_id, hosts=data.placement.hosts,
        seed=config.seed, num_records=len(manifest), is_chief=is_chief, barrier=barrier,
        if_all_damaged=config.ckpt.if_all_damaged, records=records_fingerprint(manifest),
        snapshot=newer_snapshot)
    source = ("snapshot" if any(from_snapshot) else "checkpoint" if restored is not None
              else "start")
    phases.restored = {"from": source, "step": lineage.global_step}
    if restored is not None:
      state = restored
    else:
      state = p.built.create()
      if config.model.missing != "learned":
        state = with_fill_values(state, p.built, reader, manifest.indices("train"), data.tables)
  p.packer.prime(state)
  cursor = lineage_lib.Cursor(lineage, len(manifest), generation=ctx.generation)
  validator = (stopping.Validator(p, ctx, writer=None, is_chief=is_chief)
               if stopping.wanted(config) else None)

  # The loop: epochs -> partitions -> steps, from where the lineage says.
  writer = writers.MetricWriter(workdir, enabled=is_chief)
  if validator is not None:
    validator.writer = writer
  # The monitor: every process's rows in metrics.jsonl (process 0's in TensorBoard too).
  monitor_writer = writer if is_chief else writers.MetricWriter(workdir, tensorboard=False)
  monitor = monitor_lib.Monitor(
      config.monitor, process_index=jax.process_index(),
      write=lambda row: monitor_writer.write(cursor.global_step, row, kind="monitor"))
  local_examples = global_batch // jax.process_count()
  bar = progress.Progress(p.total_steps, "training", unit="step")
  bar.update(cursor.global_step)

  def on_progress(*args) -> None:
    phases.first_step_done()   # before the context's report: its heartbeat carries the phases
    ctx.progress(*args)

  reporter = reporting.Reporter(
      writer, bar, every=config.log_every_steps, processes=jax.process_count(),
      record_ids=manifest.record_ids, generation=ctx.generation, on_progress=on_progress,
      resume_hint=lambda: f"last good checkpoint: {saver.last_saved} in {run.checkpoints}")
  saver = checkpointing.Saver(ckpt, ctx, is_chief=is_chief, last_saved=last_good,
                              before_save=reporter.check, after_save=reporter.write)
  agree = checkpointing.agree_with_chief if jax.process_count() > 1 else None
  policy = checkpointing.SavePolicy(config.ckpt, epochs=config.optim.epochs, agree=agree)
  preemption = checkpointing.Preemption()
  injector = inject.Injector(config.fault.inject, jax.process_index(), workdir,
                             host=p.topology.host)
  ledger = ledger_lib.Writer(workdir, ctx.generation, jax.process_index(),
                             enabled=config.fault.ledger)
  recacher = data.start_recache(data.plan(cursor.epoch, cursor.base_N), cursor.partition)
  # The steps dispatched and maybe not yet run (their metrics): at most config.max_steps_in_flight.
  in_flight: collections.deque = collections.deque()
  in_flight_limit = int(config.get("max_steps_in_flight", 0))
  t_start = time.perf_counter()
  trained = False
  ctx.set_phase("compiling")
  phases.start_first_step()
  monitor.start()
  try:
    while cursor.epoch < config.optim.epochs and not cursor.stopped:
      epoch_plan = data.plan(cursor.epoch, cursor.base_N)
      for part in range(cursor.partition, epoch_plan.num_partitions):
        injector.at_partition(part, cursor.global_step, cursor.epoch)
        steps = epoch_plan.steps[part]
        batches = data_batches(config, reader, steps, cursor.offset, p.batch_sharding)
        for s, local, batch in batches:
          if ctx.stop_requested():
            raise Stopped(f"stop requested at step {cursor.global_step}")
          state, metrics = train_step(state, batch)
          in_flight.append(metrics)
          if len(in_flight) > in_flight_limit > 0:
            jax.block_until_ready(in_flight.popleft())
          monitor.step_done(1, local_examples)
          batches.read_ahead()   # while the step runs
          cursor.step_done(steps[s])
          ctx.executed += 1
          ledger.write(cursor.global_step, cursor.epoch, local["row"])
          # Not a partition's last step: its position is the boundary's (checkpointed there).
          if snapshots.due(cursor.global_step) and cursor.offset < len(steps):
            snapshots.save(state, cursor.lineage())
          reporter.step(global_step=cursor.global_step, epoch=cursor.epoch, partition=part,
                        offset=cursor.offset, rows=local["row"], metrics=metrics)
          injector.after_step(cursor.global_step, ready=lambda: jax.block_until_ready(state))
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
          if validator is not None:
            # Before the epoch's checkpoint, which then carries the history (and the stop).
            reporter.flush()
            validator.epoch_end(state, cursor)
        if policy.at_boundary(cursor.epoch, epoch_done) or (epoch_done and validator is not None):
          saver.save(state, cursor.lineage())
          policy.saved()
        publish_cache_counters(data, reporter, barrier, config, ctx,
                               epoch_end=cursor.epoch - 1 if epoch_done else None,
                               step=cursor.global_step, log=is_chief)
        if cursor.stopped:
          break
    reporter.flush()
    trained = True
  finally:
    bar.close()
    ledger.close()
    if not trained:
      # A failed run's snapshots are what its replacement resumes from.
      snapshots.close(remove=False)
  train_seconds = time.perf_counter() - t_start

  def finish_saves() -> None:
    """Waits for the last saves and commits them; then the snapshots are no longer needed
    (they hold host memory). No training step: a learned hang timeout does not judge it."""
    ctx.set_phase("finishing")
    saver.finish()
    snapshots.close(remove=True)
    ckpt.close()

  if validator is not None:
    finish_saves()   # keep_best may restore the best checkpoint
    state = validator.state_to_test(state, cursor, ckpt)

  # Evaluation; without a validator, while the last checkpoint is written.
  ctx.set_phase("evaluating")
  predict = step_lib.make_predict_step(p.built.graphdef, p.built, p.mesh)
  results, _ = evaluate_lib.evaluate_splits(config.evals.splits, predict, state, reader, data,
                                            sharding=p.batch_sharding, global_batch=global_batch,
                                            bootstrap=config.evals.bootstrap, seed=config.seed)
  if validator is None:
    finish_saves()
  recacher.close()
  data.publish_counters()
  barrier("cache counters final", config.fault.timeout_start_s)
  summary = {**results,
             "train": {"steps_executed_this_process": ctx.executed,
                       "global_step": cursor.global_step, "epochs": config.optim.epochs,
                       "seconds": round(train_seconds, 2), "parameters": p.num_params,
                       "devices": p.mesh.size, "processes": jax.process_count(),
                       "checkpoint_blocked_s": round(ckpt.blocked_s, 3),
                       "snapshots": snapshots.counters()},
             "cache": cache_summary(config.data, data.gathered_counters())}
  if validator is not None:
    summary["early_stopping"] = validator.summary(cursor)
  summary["monitor"] = {**monitor.close(), "generation": ctx.generation}
  writer.close()
  if monitor_writer is not writer:
    monitor_writer.close()
  if is_chief:
    evaluate_lib.write_summary(workdir, summary, manifest.class_names)
    monitor_plots.plot_monitor(writers.read_metrics(workdir), [], run.plot("monitor"))
  ctx.set_phase("done")
  return summary


def open_snapshots(config, workdir: str, topology: Topology, store: lineage_lib.LineageStore, *,
                   is_chief: bool, barrier,
                   packer: checkpoint_lib.StatePacker) -> snapshots_lib.Snapshots:
  """This process's host-local snapshots (config.ckpt.snapshot_every_steps; 0: none)."""
  every = int(config.ckpt.get("snapshot_every_steps", 0))
  root = ""
  if every:
    run_id = snapshots_lib.run_id(store, is_chief=is_chief, barrier=barrier)
    root = snapshots_lib.run_root(config.ckpt.get("snapshot_dir", ""), workdir, run_id)
    snapshots_lib.drop_earlier_runs(root)
  return snapshots_lib.Snapshots(root, host=topology.host, process=jax.process_index(),
                                 every_steps=every, packer=packer)


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
                           config, ctx, *, epoch_end: int | None, step: int, log: bool) -> None:
  """Publishes this process's cache counters; at an epoch end the chief logs every host's.

  The epoch end waits for every process (a barrier): in its own phase, so that a hang timeout
  learned from training steps never applies to it.
  """
  data.publish_counters()
  if epoch_end is None:
    return
  phase = ctx.phase
  ctx.set_phase("epoch_end")
  barrier(f"cache counters {epoch_end}", config.fault.timeout_compile_s)
  if log:
    reporter.cache_counters(step, epoch_end, data.gathered_counters(), SUMMARY_COUNTERS)
  ctx.set_phase(phase)
