"""The trainer, top to bottom: prepare (mesh -> data -> model and optimizer -> the compiled step:
`medjax.train.prepare`) -> restore and open the loop's services -> one loop over the planned
steps -> the last saves -> evaluation -> summary.json.

`train_and_evaluate` is all of it; a warm standby worker runs `prepare` ahead of the generation it
may replace and then only `run_prepared` (`medjax.fault.worker`).

The loop's services live in one `_Loop` (built by `_restore_and_open`): the plan position and its
lineage (`lineage.Cursor`), batches read ahead (`PlannedSteps`, `data.loader`), when to save and
the commit path (`medjax.checkpoint`), metrics and progress at the logging interval
(`train.reporting`), the ledger and fault injection (`medjax.runtime`). The order of the work
after a step matters for speed: the next batch is read right after the step is dispatched, and
metrics are written after a checkpoint's save is handed to the saver thread.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import time
from typing import Any, Callable

import jax
import numpy as np

from medjax import lineage as lineage_lib
from medjax import model as model_lib
from medjax import monitor as monitor_lib
from medjax import monitor_plots
from medjax import paths
from medjax import progress
from medjax.checkpoint import checkpointer
from medjax.checkpoint import policy as policy_lib
from medjax.checkpoint import restore
from medjax.checkpoint import saver as saver_lib
from medjax.checkpoint import snapshots as snapshots_lib
from medjax.data import host as host_lib
from medjax.evals import splits
from medjax.evals import summary as summary_lib
from medjax.runtime import context
from medjax.runtime import inject
from medjax.runtime import ledger as ledger_lib
from medjax.runtime import phases as phases_lib
from medjax.train import local_sgd
from medjax.train import planned
from medjax.train import prepare as prepare_lib
from medjax.train import reporting
from medjax.train import state as state_lib
from medjax.train import step as step_lib
from medjax.train import stopping
from medjax.train import writers

# How often a partition's boundary publishes this process's cache counters (an epoch's end and the
# run's end always do): two small files a boundary took ~4 ms of the training thread on 2 cores
# (its file calls wait for the GIL behind the reader threads), ~1 ms a step where partitions are
# a few steps long, as the paper's are on a GPU. A crash loses at most this long of counts.
COUNTERS_EVERY_S = 1.0

# config.max_steps_in_flight=-1: where XLA computes on the CPU the host's own work competes with
# the step for the cores, and 2 keep it busy; an accelerator's ~9 ms steps (configs/paper.py on an
# H100) leave 2 queued steps idle behind any host pause longer than one step (on 2026-11-27's
# H100, 4 in flight took the loop from 36.5 to 31.3 ms a step, the writers busy).
STEPS_IN_FLIGHT = {"cpu": 2, "accelerator": 4}

# The trainer's names for its callers (the worker, the tests), wherever they are defined.
Topology = host_lib.Topology
Step = planned.Step
PlannedSteps = planned.PlannedSteps
Prepared = prepare_lib.Prepared
prepare = prepare_lib.prepare
TrainingError = reporting.TrainingError
Preempted = saver_lib.Preempted


class Stopped(Exception):
  """The coordinator asked this generation to stop at a step boundary."""


def train_and_evaluate(config, workdir: str, topology: Topology = Topology(), ctx=None,
                       host_history: list[list[str]] | None = None,
                       phases: phases_lib.Phases | None = None,
                       make_trial: Callable | None = None) -> dict:
  """Trains on the partition plan, checkpoints, evaluates; returns summary.json's contents.

  Args:
    config: the run config.
    workdir: the run directory (shared storage).
    topology: this process's host and place among the host's processes.
    ctx: the fault-tolerance context (`medjax.runtime.context`); None: a single-process run that
      commits its own lineage records.
    host_history: host sets of the placement generations so far (default: just this one).
    phases: times the start-up phases (`medjax.runtime.phases`), if given.
    make_trial: for a sweep's trial, `make_trial(config)` gives its reporter
      (`medjax.sweep.trial.reporter`; see `stopping.Validator`).
  """
  if ctx is None:
    run = paths.RunPaths(workdir, config)
    ctx = context.Local(lineage_lib.LineageStore(run.lineage_store), run.checkpoints,
                        config.ckpt.max_to_keep, keep_best=config.ckpt.keep_best)
    prepare_lib.use_compilation_cache(run)
  prepared = prepare(config, workdir, topology, ctx, host_history, phases=phases)
  return run_prepared(prepared, ctx, phases=phases, make_trial=make_trial)


def run_prepared(prepared: Prepared, ctx, *, phases: phases_lib.Phases | None = None,
                 make_trial: Callable | None = None) -> dict:
  """Checkpoint restore -> the loop over the partition plan -> evaluation; summary.json's dict."""
  phases = phases or phases_lib.Phases()
  state, loop = _restore_and_open(prepared, ctx, phases, make_trial)
  trained = False
  try:
    for step in loop.plan:
      if ctx.stop_requested():
        raise Stopped(f"stop requested at step {loop.cursor.global_step}")
      if step.batch is not None:
        metrics = None
        if loop.rounds is None or loop.rounds.take(loop.cursor.global_step):
          state, metrics = prepared.train_step(state, step.batch)
        loop.dispatched(metrics)           # the next batch is read while this step runs
        # Position, ledger, a round's averaging ('local' mode), snapshot, metrics queued.
        state = loop.record(state, step, metrics)
        loop.injector.after_step(loop.cursor.global_step, trained=metrics is not None,
                                 ready=lambda: jax.block_until_ready(state))
        loop.save_if_due(state, step)      # a checkpoint inside the partition, preemption
      if step.ends_partition:
        state = loop.partition_end(state, step)   # the boundary's checkpoint, the epoch's end
    loop.reporter.flush()
    trained = True
  finally:
    loop.stop_training(failed=not trained)
  if loop.validator is not None:
    loop.finish_saves()   # keep_best may restore the best checkpoint
    state = loop.validator.state_to_test(state, loop.cursor, loop.ckpt)
  # Evaluation; without a validator, while the last checkpoint is written.
  results = _evaluate(loop, state)
  loop.finish_saves()
  return _summarize(loop, results)


@dataclasses.dataclass
class _Loop:
  """The loop's services and their per-step and per-boundary work (`_restore_and_open`)."""
  p: Prepared
  ctx: Any
  run: paths.RunPaths
  is_chief: bool
  cursor: lineage_lib.Cursor
  plan: PlannedSteps
  ckpt: checkpointer.Checkpointer
  snapshots: snapshots_lib.Snapshots
  saver: saver_lib.Saver
  policy: policy_lib.SavePolicy
  preemption: saver_lib.Preemption
  writer: writers.MetricWriter
  monitor_writer: writers.MetricWriter     # process 0's: `writer`; the others' own
  monitor: monitor_lib.Monitor
  reporter: reporting.Reporter
  validator: stopping.Validator | None
  injector: inject.Injector
  ledger: ledger_lib.Writer
  rounds: local_sgd.Rounds | None          # 'local' mode's rounds (None: 'sync')
  recacher: Any
  in_flight_limit: int                     # `steps_in_flight` (0: no limit)
  local_examples: int                      # batch slots of this process per step
  in_flight: collections.deque = dataclasses.field(default_factory=collections.deque)
  t_start: float = dataclasses.field(default_factory=time.perf_counter)
  train_seconds: float = 0.0
  saves_finished: bool = False
  counters_published_at: float = float("-inf")

  @functools.cached_property
  def train_rows(self) -> np.ndarray:
    """The manifest's training rows (fixed for the run): each round's end reads them."""
    return self.p.data.manifest.indices("train")

  @property
  def inside_round(self) -> bool:
    """Inside a 'local' round that late replicas may cut (`local_sgd.Rounds.inside`): processes
    may be at different steps, so no snapshot, checkpoint or collective here."""
    return self.rounds is not None and self.rounds.inside

  def dispatched(self, metrics: dict | None) -> None:
    """A step was dispatched (None: this process skipped it, a late replica): at most
    `steps_in_flight` stay unfinished; the monitor counts it; the next batch is read
    while it runs."""
    if metrics is not None:
      self.in_flight.append(metrics)
      if len(self.in_flight) > self.in_flight_limit > 0:
        jax.block_until_ready(self.in_flight.popleft())
      self.monitor.step_done(1, self.local_examples)
    self.plan.read_ahead()

  def record(self, state, step: Step, metrics: dict | None):
    """The step's position, its ledger line, a round's end, a snapshot when due, its metrics
    queued; the state (averaged where a round ended)."""
    cursor, rows = self.cursor, step.local["row"]
    cursor.step_done(step.rows)
    if metrics is not None:
      self.ctx.executed += 1
      self.ledger.write(cursor.global_step, cursor.epoch, rows)
      self.reporter.step(global_step=cursor.global_step, epoch=cursor.epoch,
                         partition=step.partition, offset=cursor.offset, rows=rows,
                         metrics=metrics)
    if self.rounds is not None:
      self.rounds.stepped(metrics is not None, rows)
      if self.rounds.ends(cursor.global_step):
        # At a partition's last step, a process whose round ends at the segment's end does so in
        # `partition_end`: every process saves there, after the boundary's save question.
        state = self.end_round(state, saves=not step.ends_partition)
    # Not a partition's last step: its position is the boundary's (checkpointed there).
    if (self.snapshots.due(cursor.global_step) and not step.ends_partition
        and not self.inside_round):
      self.snapshots.save(state, cursor.lineage())
    return state

  def end_round(self, state, *, saves: bool = True):
    """'local' mode's averaging; the records late replicas skipped go back to the epoch; a save
    that waited for the round's end (`saves`; a segment's end makes it once the cursor is past
    the segment, `_round_saves`)."""
    p, cursor = self.p, self.cursor
    position = local_sgd.schedule_position(cursor, self.train_rows, p.steps_per_epoch,
                                           p.config.optim.grad_accum)
    state, deferred = self.rounds.end(state, cursor.global_step, position)
    cursor.processed_N[deferred] = False
    if saves:
      self._round_saves(state)
    return state

  def _round_saves(self, state) -> None:
    if self.rounds.save_wanted:
      self.saver.save(state, self.cursor.lineage(), optional=True)
    if self.rounds.preempt_wanted:
      self.saver.preempt(state, self.cursor.lineage())
    self.rounds.save_wanted = self.rounds.preempt_wanted = False

  def save_if_due(self, state, step: Step) -> None:
    """A checkpoint inside the partition when the policy says; SIGTERM's save; commits. Inside
    a round that late replicas may cut, both wait for the round's end."""
    cursor, inside = self.cursor, self.inside_round
    if self.policy.after_step(cursor.global_step, cursor.offset, step.partition_steps,
                              agree=not inside):
      if inside:
        self.rounds.save_wanted = True
      else:
        self.saver.save(state, cursor.lineage(), optional=True)
    if self.preemption.reached(cursor.global_step):
      if inside:
        self.rounds.preempt_wanted = True
      else:
        self.saver.preempt(state, cursor.lineage())
    self.saver.commit_finalized()

  def partition_end(self, state, step: Step):
    """The partition's boundary: its checkpoint; after a segment's last, a round's end ('local'
    mode) and the epoch's catch-up of records late replicas skipped, else validation and the
    next epoch's first segment; this host's cache counters. Returns the state."""
    cursor, data = self.cursor, self.p.data
    cursor.partition_done()
    epoch_done = cursor.partition == step.num_partitions
    if epoch_done and self.rounds is not None:
      # Saves that waited for the round come below, once the cursor is past the segment: a
      # lineage at a finished segment's end would restore to nothing left to plan.
      if self.rounds.ends(cursor.global_step, segment_end=True):   # no round waits past here
        state = self.end_round(state, saves=False)
      cursor.processed_N[self.rounds.settle()] = False
      epoch_done = not local_sgd.catch_up(cursor, data)
      if epoch_done and self.rounds.steps:
        state = self.end_round(state, saves=False)
    if epoch_done:
      cursor.new_segment(epoch=cursor.epoch + 1, placement=data.placement_id,
                         hosts=data.placement.hosts, base_N=np.zeros(len(data.manifest), bool))
      if self.validator is not None:
        # Before the epoch's checkpoint, which then carries the history (and the stop).
        self.reporter.flush()
        self.validator.epoch_end(state, cursor)
    validated = epoch_done and self.validator is not None
    # Inside a round late replicas may cut, processes can be at different steps: no collective
    # (the round's end unites their saves).
    inside = self.inside_round
    if self.policy.at_boundary(cursor.epoch, epoch_done, agree=not inside) or validated:
      # The end of training and an epoch's validation are always saved; other boundaries
      # when the writer wants them (config.ckpt.writer_duty).
      last = cursor.epoch >= self.policy.epochs or cursor.stopped
      if inside:
        self.rounds.save_wanted = True
      elif self.saver.save(state, cursor.lineage(), optional=not (last or validated)):
        self.policy.saved()
    if self.rounds is not None and not inside:
      self._round_saves(state)
    self._publish_cache_counters(epoch_end=cursor.epoch - 1 if epoch_done else None)
    return state

  def _publish_cache_counters(self, *, epoch_end: int | None) -> None:
    """Publishes this process's cache counters (inside an epoch at most every
    `COUNTERS_EVERY_S`); at an epoch end the chief logs every host's.

    The epoch end waits for every process (a barrier): in its own phase, so that a hang timeout
    learned from training steps never applies to it.
    """
    data, now = self.p.data, time.monotonic()
    if epoch_end is None and now - self.counters_published_at < COUNTERS_EVERY_S:
      return
    self.counters_published_at = now
    data.publish_counters()
    if epoch_end is None:
      return
    phase = self.ctx.phase
    self.ctx.set_phase("epoch_end")
    self.p.barrier(f"cache counters {epoch_end}", self.p.config.fault.timeout_compile_s)
    if self.is_chief:
      self.reporter.cache_counters(self.cursor.global_step, epoch_end, data.gathered_counters(),
                                   host_lib.SUMMARY_COUNTERS)
    self.ctx.set_phase(phase)

  def stop_training(self, *, failed: bool) -> None:
    self.train_seconds = time.perf_counter() - self.t_start
    self.reporter.bar.close()
    self.ledger.close()
    if failed:
      # A failed run's snapshots are what its replacement resumes from.
      self.snapshots.close(remove=False)

  def finish_saves(self) -> None:
    """Waits for the last saves and commits them; then the snapshots are no longer needed
    (they hold host memory). No training step: a learned hang timeout does not judge it."""
    if self.saves_finished:
      return
    self.ctx.set_phase("finishing")
    self.saver.finish()
    self.snapshots.close(remove=True)
    self.ckpt.close()
    self.saves_finished = True


def _restore_and_open(p: Prepared, ctx, phases: phases_lib.Phases,
                      make_trial: Callable | None) -> tuple[Any, _Loop]:
  """The state to train from (a newer host-local snapshot, the newest committed checkpoint, or a
  fresh one) and the loop's services, positioned where its lineage says."""
  config, data, manifest = p.config, p.data, p.data.manifest
  run = paths.RunPaths(p.workdir, config)
  store = lineage_lib.LineageStore(run.lineage_store)
  is_chief = jax.process_index() == 0
  ctx.set_phase("restoring")
  with phases.phase("restore"):
    # Opening the checkpoint manager waits for every process (a barrier in Orbax).
    ckpt = p.ckpt or checkpointer.Checkpointer(run.checkpoints,
                                               async_save=config.ckpt.async_save,
                                               packer=p.packer,
                                               duty=config.ckpt.get("writer_duty", 1.0))
    # A host-local snapshot newer than the newest committed checkpoint, when this host has one
    # (a crash or hang of this generation's predecessor on the same hosts), else that checkpoint.
    snapshots = snapshots_lib.open_for_run(config.ckpt, p.workdir, p.topology.host, store,
                                           is_chief=is_chief, barrier=p.barrier,
                                           packer=p.packer)
    from_snapshot = []

    def newer_snapshot(after_step: int):
      got = snapshots.restore(p.built.abstract, placement=data.placement_id,
                              after_step=after_step)
      from_snapshot.append(got is not None)
      return got

    state, lineage, last_good = restore.restore_or_start(
        ckpt, store, p.built.abstract, placement=data.placement_id, hosts=data.placement.hosts,
        seed=config.seed, num_records=len(manifest), is_chief=is_chief, barrier=p.barrier,
        if_all_damaged=config.ckpt.if_all_damaged,
        records=restore.records_fingerprint(manifest.record_ids), snapshot=newer_snapshot)
    phases.restored = {"from": ("snapshot" if any(from_snapshot) else "checkpoint"
                                if state is not None else "start"),
                       "step": lineage.global_step}
    if state is None:
      # A fresh start; the missing-modality ablations' fill values and the labs' bin edges
      # come from the training data.
      state = p.built.create()
      if model_lib.needs_statistics(config.model):
        state = state_lib.with_statistics(state, p.built, p.reader, manifest.indices("train"),
                                          data.tables)
  p.packer.prime(state)
  cursor = lineage_lib.Cursor(lineage, len(manifest), generation=ctx.generation)
  return state, _open(p, ctx, run, cursor, ckpt, snapshots, last_good, phases, make_trial)


def _open(p: Prepared, ctx, run: paths.RunPaths, cursor: lineage_lib.Cursor,
          ckpt: checkpointer.Checkpointer, snapshots: snapshots_lib.Snapshots,
          last_good: int | None, phases: phases_lib.Phases, make_trial) -> _Loop:
  """The loop's services, from where `cursor` is; the monitor started."""
  config, data, manifest = p.config, p.data, p.data.manifest
  is_chief = jax.process_index() == 0
  writer = writers.MetricWriter(p.workdir, enabled=is_chief)
  # The monitor: every process's rows in metrics.jsonl (process 0's in TensorBoard too).
  monitor_writer = writer if is_chief else writers.MetricWriter(p.workdir, tensorboard=False)
  monitor = monitor_lib.Monitor(
      config.monitor, process_index=jax.process_index(),
      write=lambda row: monitor_writer.write(cursor.global_step, row, kind="monitor"))
  bar = progress.Progress(p.total_steps, "training", unit="step")
  bar.update(cursor.global_step)

  def on_progress(*args) -> None:
    phases.first_step_done()   # before the context's report: its heartbeat carries the phases
    ctx.progress(*args)

  saver = None
  reporter = reporting.Reporter(
      writer, bar, every=config.log_every_steps, processes=jax.process_count(),
      record_ids=manifest.record_ids, generation=ctx.generation, on_progress=on_progress,
      resume_hint=lambda: f"last good checkpoint: {saver.last_saved} in {run.checkpoints}",
      lag=steps_in_flight(config) or 2,
      fetch=p.local and local_sgd.fetch_rows)
  saver = saver_lib.Saver(ckpt, ctx, is_chief=is_chief, last_saved=last_good,
                          before_save=reporter.check, after_save=reporter.write,
                          guard=reporter.finite_guard)
  validator = None
  if stopping.wanted(config):
    validator = stopping.Validator(p, ctx, writer, is_chief=is_chief, make_trial=make_trial)
  injector = inject.Injector(config.fault.inject, jax.process_index(), p.workdir,
                             host=p.topology.host, slow_step_s=config.fault.get("slow_step_s", 0),
                             pause_s=config.fault.get("pause_s", 0))
  loop = _Loop(
      p=p, ctx=ctx, run=run, is_chief=is_chief, cursor=cursor,
      plan=PlannedSteps(p, cursor, config.optim.epochs, on_partition=injector.at_partition),
      ckpt=ckpt, snapshots=snapshots, saver=saver,
      policy=policy_lib.SavePolicy(config.ckpt, epochs=config.optim.epochs, agree=(
          policy_lib.agree_with_chief if jax.process_count() > 1 else None)),
      preemption=saver_lib.Preemption(), writer=writer, monitor_writer=monitor_writer,
      monitor=monitor, reporter=reporter, validator=validator, injector=injector,
      ledger=ledger_lib.Writer(p.workdir, ctx.generation, jax.process_index(),
                               enabled=config.fault.ledger),
      rounds=p.local and local_sgd.Rounds(
          p.local, p.average, local_sgd.replica_sharding(p.local, p.mesh),
          exchange=local_sgd.exchange_for_run(p.local, p.mesh, generation=ctx.generation,
                                              timeout_s=config.fault.timeout_start_s)),
      recacher=data.start_recache(data.plan(cursor.epoch, cursor.base_N), cursor.partition),
      in_flight_limit=steps_in_flight(config),
      local_examples=config.data.batch_size // jax.process_count())
  ctx.set_phase("compiling")
  phases.start_first_step()
  monitor.start()
  return loop


def steps_in_flight(config) -> int:
  """config.max_steps_in_flight, -1 resolved for this backend (`STEPS_IN_FLIGHT`); 0: no limit."""
  value = int(config.get("max_steps_in_flight", 0))
  if value >= 0:
    return value
  return STEPS_IN_FLIGHT["cpu" if jax.default_backend() == "cpu" else "accelerator"]


def _evaluate(loop: _Loop, state) -> dict:
  """Every split in config.evals.splits, and the Bayes ceiling where there is one."""
  p = loop.p
  loop.ctx.set_phase("evaluating")
  predict = step_lib.make_predict_step(p.built.graphdef, p.built, p.mesh)
  results, _ = splits.evaluate_splits(p.config.evals.splits, predict, state, p.reader, p.data,
                                      sharding=p.batch_sharding,
                                      global_batch=p.config.data.batch_size,
                                      bootstrap=p.config.evals.bootstrap, seed=p.config.seed)
  return results


def _summarize(loop: _Loop, results: dict) -> dict:
  """summary.json's contents (written, with the plots, by process 0); the services closed."""
  p, ctx, data = loop.p, loop.ctx, loop.p.data
  loop.recacher.close()
  data.publish_counters()
  p.barrier("cache counters final", p.config.fault.timeout_start_s)
  summary = {**results,
             "train": {"steps_executed_this_process": ctx.executed,
                       "global_step": loop.cursor.global_step, "epochs": p.config.optim.epochs,
                       "seconds": round(loop.train_seconds, 2), "parameters": p.num_params,
                       "devices": p.mesh.size, "processes": jax.process_count(),
                       "checkpoint_blocked_s": round(loop.ckpt.blocked_s, 3),
                       "checkpoints": loop.saver.summary(),
                       "snapshots": loop.snapshots.counters(),
                       **({"rounds": loop.rounds.counts} if loop.rounds else {})},
             "cache": host_lib.cache_summary(p.config.data, data.gathered_counters())}
  if loop.validator is not None:
    summary["early_stopping"] = loop.validator.summary(loop.cursor)
  summary["monitor"] = {**loop.monitor.close(), "generation": ctx.generation}
  loop.writer.close()
  if loop.monitor_writer is not loop.writer:
    loop.monitor_writer.close()
  if loop.is_chief:
    metrics_rows = writers.read_metrics(p.workdir)
    summary_lib.write_summary(p.workdir, summary, data.manifest.class_names, metrics_rows)
    monitor_plots.plot_monitor(metrics_rows, [], loop.run.plot("monitor"))
  ctx.set_phase("done")
  return summary
