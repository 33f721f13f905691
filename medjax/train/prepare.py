"""Everything the trainer builds before it restores: mesh -> data -> model and optimizer
(abstract: shapes and shardings) -> the compiled step (`prepare`).

A warm standby worker prepares ahead of the generation it may replace (`medjax.fault.worker`),
then `loop.run_prepared` only restores and trains.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Any, Callable

import jax
import numpy as np

from medjax import lineage as lineage_lib
from medjax import paths
from medjax import programs
from medjax.checkpoint import barrier as barrier_lib
from medjax.checkpoint import checkpointer
from medjax.checkpoint import packing
from medjax.checkpoint import restore
from medjax.data import host as host_lib
from medjax.data import loader
from medjax.runtime import phases as phases_lib
from medjax.train import local_sgd
from medjax.train import optim
from medjax.train import reporting
from medjax.train import state as state_lib
from medjax.train import step as step_lib

Topology = host_lib.Topology


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
  barrier: barrier_lib.Barrier
  mesh: jax.sharding.Mesh
  batch_sharding: jax.sharding.NamedSharding
  data: host_lib.HostData
  reader: loader.BatchReader
  steps_per_epoch: int
  total_steps: int
  built: state_lib.Built   # the state's shape; `built.create()` makes a fresh one
  num_params: int
  train_step: Callable
  # 'local' mode (`medjax.train.local_sgd`): its settings and the rounds' averaging program.
  local: local_sgd.Local | None
  average: Callable | None
  # The packing that checkpoints and snapshots dispatch, its layout worked out and its program
  # compiled for the state's shape: their first save only dispatches it.
  packer: packing.StatePacker
  ckpt: checkpointer.Checkpointer | None   # opened ahead by a standby (else by the restore)

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


def prepare(config, workdir: str, topology: Topology = Topology(), ctx=None,
            host_history: list[list[str]] | None = None, *, standby: bool = False,
            phases: phases_lib.Phases | None = None) -> Prepared:
  """Mesh -> data -> model and optimizer (abstract: shapes and shardings) -> the compiled step.

  The model, optimizer and step are built and compiled on a thread beside the data's setup
  (`_Program`), from the ingest's shapes and classes and the first epoch's plan: on a host's
  first start, the cache fill and the compilation overlap instead of adding up.

  `standby`: a warm standby prepares while the generation it will replace still trains: it opens
  the host's cache without writing it (`host.setup`), and, as a single process, restores the
  newest committed checkpoint once (discarded) so that Orbax and the restore's programs are
  loaded too.
  """
  ctx = ctx or _Quiet()
  phases = phases or phases_lib.Phases()
  ctx.set_phase("preparing")
  barrier = barrier_lib.Barrier(config.fault.timeout_compile_s)

  # Mesh.
  mesh = state_lib.make_mesh(config.mesh)
  batch_sharding = state_lib.batch_sharding(mesh)

  # Data: cohort, ingest, this generation's placement, this host's cache and reader; the
  # program starts building and compiling once the placement is known.
  program = _Program(config, workdir, mesh, batch_sharding, phases, standby=standby)
  with phases.phase("data_setup"):
    data = host_lib.setup(config, workdir, topology, host_history,
                          barrier=lambda name: barrier(name, config.fault.timeout_start_s),
                          alive=lambda n: ctx.alive(), standby=standby, placed=program.start)
    manifest = data.manifest
    reader = data.reader(class_weight_K=class_weights(config, manifest),
                         complete_only=config.model.missing == "drop")

  # What the compilation still takes after the data is ready.
  ctx.set_phase("compiling")
  with phases.phase("compile"):
    built = program.join()

  ckpt = None
  # Not in a group of several processes: each would list the checkpoints at its own moment while
  # the running generation commits, and Orbax's cross-process barriers would not meet.
  if standby and jax.process_count() == 1:
    with phases.phase("warm_restore"):
      run = paths.RunPaths(workdir, config)
      ckpt = _open_while_pruned(run, config, program.packer)
      _warm_restore(run, ckpt, built.abstract)
  return Prepared(config=config, workdir=workdir, topology=topology, host_history=host_history,
                  barrier=barrier, mesh=mesh, batch_sharding=batch_sharding, data=data,
                  reader=reader, steps_per_epoch=program.steps_per_epoch,
                  total_steps=program.total_steps, built=built, num_params=program.num_params,
                  train_step=program.train_step, local=program.local, average=program.average,
                  packer=program.packer, ckpt=ckpt)


class _Program:
  """The model and optimizer (abstract: shapes and shardings), the jitted step and its
  compilation, built on a thread of their own (`start`, called by `host.setup` with the ingest
  and the first epoch's plan) while the data's setup goes on: XLA compiles without the GIL, and
  the step's program needs the data's shapes, classes and step count, not its records. Its
  seconds are the phases' `beside_data` (model_build, compile); `join` waits for it."""

  def __init__(self, config, workdir: str, mesh, batch_sharding, phases: phases_lib.Phases, *,
               standby: bool):
    self.config, self.workdir, self.mesh = config, workdir, mesh
    self.batch_sharding = batch_sharding
    self.phases, self.standby = phases, standby
    self._thread: threading.Thread | None = None
    self._error: BaseException | None = None
    self.built: state_lib.Built | None = None

  def start(self, prepared, first_plan) -> None:
    check_shapes(self.config, prepared, self.mesh)   # a mismatch fails the setup, here
    self._thread = threading.Thread(target=self._run, args=(prepared, first_plan),
                                    name="build-and-compile", daemon=True)
    self._thread.start()

  def join(self) -> state_lib.Built:
    """The built state's shape, once the step is compiled (the thread's error, if it failed)."""
    if self._thread is None:
      raise RuntimeError("the data setup ended without a placement")
    self._thread.join()
    if self._error is not None:
      raise self._error
    return self.built

  def _run(self, prepared, first_plan) -> None:
    try:
      self._build(prepared, first_plan)
    except BaseException as e:  # pylint: disable=broad-except  (raised again by `join`)
      self._error = e

  def _build(self, prepared, first_plan) -> None:
    config, mesh = self.config, self.mesh
    with self.phases.beside("model_build"):
      self.steps_per_epoch = first_plan.num_steps
      self.total_steps = config.optim.epochs * self.steps_per_epoch
      tx, lr_schedule = optim.make(config.optim, self.total_steps)
      self.local = local = local_sgd.from_config(config.optim, mesh)
      # No state yet: a restart restores one, a fresh start creates it (`run_prepared`).
      built = state_lib.build_abstract(config.model, tx, mesh,
                                       num_classes=len(prepared.manifest.class_names),
                                       shapes=prepared.shapes, seed=config.seed, local=local)
      self.num_params = sum(int(np.prod(x.shape))
                            for x in jax.tree.leaves(built.abstract["params"]))
    logging.info("model: %s parameters; %d steps per epoch, %d epochs, global batch %d on %d "
                 "devices in %d processes", f"{self.num_params:,}", self.steps_per_epoch,
                 config.optim.epochs, config.data.batch_size, mesh.size, jax.process_count())
    self.train_step = step_lib.make_train_step(built.graphdef, tx, built, mesh, seed=config.seed,
                                               lr_schedule=lr_schedule,
                                               grad_accum=config.optim.grad_accum, local=local)
    self.average = None if local is None else step_lib.make_average(built, mesh, local)
    # Compiled now (from the persistent cache when it holds the program) for the real batch's
    # shapes: the first training step then only runs.
    with self.phases.beside("compile"):
      init = None if self.standby else _compile_init_beside(config, self.workdir, built)
      batch = loader.padding_batch(prepared.shapes, prepared.ingested.tables,
                                   self.batch_sharding, config.data.batch_size)
      programs.warm(self.train_step, built.abstract, batch)
      if self.average is not None:
        trained = jax.ShapeDtypeStruct((local.replicas,), np.float32,
                                       sharding=local_sgd.replica_sharding(local, mesh))
        programs.warm(self.average, built.abstract, trained, np.int32(0), np.int32(0))
      self.packer = packing.StatePacker()
      self.packer.warm(built.abstract)
      if init is not None:
        init.join()
    self.built = built


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


def _open_while_pruned(run: paths.RunPaths, config, packer: packing.StatePacker,
                       attempts: int = 10):
  """The standby's Checkpointer, opened while the running generation saves and its coordinator
  prunes: Orbax lists the steps and reads each one's metadata, and a step deleted in between
  raises FileNotFoundError. Listing again a moment later sees a consistent directory."""
  for attempt in range(attempts):
    try:
      return checkpointer.Checkpointer(run.checkpoints, async_save=config.ckpt.async_save,
                                       packer=packer, duty=config.ckpt.get("writer_duty", 1.0))
    except FileNotFoundError as e:
      if attempt == attempts - 1:
        raise
      logging.info("standby: a checkpoint was pruned while it was listed (%s); listing again", e)
      time.sleep(0.1)


def _warm_restore(run: paths.RunPaths, ckpt: checkpointer.Checkpointer, abstract) -> None:
  """Restores the newest committed checkpoint and drops it: the first restore of a process
  loads Orbax and TensorStore's drivers; the one after a failure then takes ~0.1 s."""
  try:
    store = lineage_lib.LineageStore(run.lineage_store)
    restored = restore.restore_committed(run.checkpoints, store, abstract, ckpt)
    if restored is not None:
      jax.block_until_ready(restored[0])
  except Exception as e:  # pylint: disable=broad-except  (a warm-up; the real restore decides)
    logging.info("standby: warm-up restore skipped: %s", e)


def check_shapes(config, prepared, mesh) -> None:
  """Fails before training when the config and the data disagree, naming both values."""
  if config.data.batch_size % mesh.size:
    raise reporting.TrainingError(f"config.data.batch_size={config.data.batch_size} does not "
                                  f"split over {mesh.size} devices; make it a multiple")
  m = config.model
  data_classes = len(prepared.manifest.class_names)
  if data_classes < 2:
    raise reporting.TrainingError(f"the manifest has {data_classes} classes; training needs "
                                  "labels.csv with at least two classes")
  for name, wanted, actual in (
      ("config.model.num_classes", m.num_classes, data_classes),
      ("config.model.num_analytes", m.num_analytes, prepared.shapes.num_analytes),
      ("config.model.vitals_channels", m.vitals_channels, prepared.shapes.vitals_channels)):
    if wanted and wanted != actual:
      raise reporting.TrainingError(f"{name}={wanted} but the ingested data has {actual}; set it "
                                    f"to {actual} (or 0 to take it from the data)")


def class_weights(config, manifest) -> np.ndarray:
  """Inverse-frequency weights (normalised to mean 1 per record) when config.optim says so."""
  k = len(manifest.class_names)
  if not config.optim.class_weighted:
    return np.ones(k, np.float32)
  counts = np.bincount(manifest.labels[manifest.indices("train")], minlength=k).astype(np.float64)
  w = np.where(counts > 0, 1.0 / np.maximum(counts, 1), 0.0) ** config.optim.class_weight_power
  return (w / np.sum(w * counts) * counts.sum()).astype(np.float32)


def data_batches(config, reader, steps_SxWxb: np.ndarray, start: int, sharding):
  """One partition's batches from step `start`, read ahead as config.data.prefetch says."""
  return loader.batches(reader, steps_SxWxb, start=start, sharding=sharding,
                        global_batch=config.data.batch_size, how=config.data.prefetch)
