"""One host's data for one generation, built once: placement, cache, reader, partition plans.

`setup` is what the trainer, the evaluator (`medjax.evaluate.load`) and the benchmarks call after
`pipeline.prepare`: it walks the host history once (`placement.walk_history`), works out what the
host caches (`recache.host_rows`), opens the host's node-local cache (the host's first process
fills it; the others open it read-only once the fill is done), and holds the records in memory
when they fit. The `HostData` it returns reads batches, plans epochs, decodes newly owned records
in the background and publishes the cache counters.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np
import psutil

from medjax import paths
from medjax.data import cache as cache_lib
from medjax.data import loader
from medjax.data import partition
from medjax.data import pipeline
from medjax.data.cache import placement as placement_lib
from medjax.data.cache import recache


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

  @property
  def cache_writer(self) -> bool:
    """The host's first process fills and writes its cache; the others only read it."""
    return self.local_index == 0


@dataclasses.dataclass
class HostData:
  """The data of one host in one generation (see the module docstring); built by `setup`."""
  run: paths.RunPaths
  topology: Topology
  prepared: pipeline.Prepared
  walk: placement_lib.Walk
  rows: recache.HostRows
  cache: cache_lib.Cache
  seed: int
  num_partitions: int
  host_batch: int

  @property
  def manifest(self):
    return self.prepared.manifest

  @property
  def tables(self) -> dict[str, np.ndarray]:
    return self.prepared.ingested.tables

  @property
  def shapes(self):
    return self.prepared.shapes

  @property
  def placement(self) -> placement_lib.Placement:
    return self.walk.current

  @property
  def placement_id(self) -> str:
    return placement_lib.fingerprint(self.walk.current)

  def reader(self, **kw) -> loader.BatchReader:
    """A reader of this process's share of plan steps (kw: `loader.BatchReader`'s options)."""
    t = self.topology
    return loader.BatchReader(self.cache, self.manifest, self.tables, host_index=t.host_index,
                              local_index=t.local_index, local_count=t.local_count, **kw)

  def plan(self, epoch: int, base_N: np.ndarray | None = None) -> partition.EpochPlan:
    """`epoch`'s plan under this generation's placement, less the records in `base_N`."""
    return epoch_plan(self.manifest, self.placement, seed=self.seed, epoch=epoch,
                      num_partitions=self.num_partitions, host_batch=self.host_batch,
                      base_N=base_N)

  def start_recache(self, plan: partition.EpochPlan, first_partition: int) -> recache.Recacher:
    """Decodes newly owned records in the background, those the plan reads next first."""
    upcoming = np.concatenate([np.zeros(0, np.int64)] + [
        steps[:, self.topology.host_index].ravel()
        for steps in plan.steps[first_partition:]])
    rows = (recache.plan_order(upcoming, self.rows.background) if self.topology.cache_writer
            else np.zeros(0, np.int64))
    return recache.Recacher(self.cache, rows).start()

  def publish_counters(self) -> None:
    """Copies this process's cache counters to shared storage (`gathered_counters` sums them)."""
    recache.publish(self.run.cache_stats, self.topology.host, self.topology.local_index,
                    self.cache.save_counters())

  def take_over(self, alive: Callable[[int], None] | None = None) -> None:
    """A warm standby's data (`setup(standby=True)`) becomes its generation's: on the host's
    first process the cache becomes the writer, picking up what the previous writer added since
    the standby opened it and decoding any record the writer should have but lacks."""
    if not (self.topology.cache_writer and self.cache.read_only):
      return
    self.cache.promote()
    self.cache.configure(no_cache=self.rows.no_cache, moved=self.rows.moved_in)
    self.cache.note_membership(self.rows.membership, len(self.rows.moved_in))
    pipeline.fill_cache(self.cache, self.rows.prefill, f"decoding {self.topology.host}",
                        on_progress=alive)

  def gathered_counters(self) -> dict:
    """Every host's published counters: {'hosts': {host: counters}, 'total': counters}."""
    return recache.gathered(self.run.cache_stats)


def epoch_plan(manifest, placement: placement_lib.Placement, *, seed: int, epoch: int,
               num_partitions: int, host_batch: int,
               base_N: np.ndarray | None = None) -> partition.EpochPlan:
  """`epoch`'s plan under `placement`, less the records in `base_N` (`HostData.plan`)."""
  train = manifest.indices("train")
  rows = train[~base_N[train]] if base_N is not None and base_N.any() else None
  # A segment of few records left (a late replica's catch-up) gets a partition per record.
  parts = num_partitions if rows is None else max(min(num_partitions, len(rows)), 1)
  return partition.plan_epoch(manifest, placement, seed=seed, epoch=epoch, num_partitions=parts,
                              host_batch_size=host_batch, rows=rows)


def memory_budget_mb(setting: float, processes: int) -> float:
  """config.data.cache_memory_mb: N MB as set (0: hold nothing), or for -1 a quarter of the
  memory available now, shared by the host's `processes`. A GPU host's paper-size cohort (53,420
  records, 1.8 GB) fits; reading it from disk instead took ~11x as long a batch."""
  if setting >= 0:
    return float(setting)
  return psutil.virtual_memory().available / 2**20 / 4 / max(processes, 1)


def setup(config, workdir: str, topology: Topology = Topology(),
          host_history: list[list[str]] | None = None, *,
          barrier: Callable[[str], None] = lambda name: None,
          alive: Callable[[int], None] | None = None, read_only: bool = False,
          standby: bool = False,
          placed: Callable[[pipeline.Prepared, partition.EpochPlan], None] | None = None
          ) -> HostData:
  """Builds `topology.host`'s data for the generation whose host sets so far are `host_history`.

  Args:
    config: the run config (its data section, seed and batch size).
    workdir: the run directory.
    topology: this process's host and place among the host's processes.
    host_history: host sets of the placement generations so far, ending with this one's
      (default: just this one).
    barrier: waits for every process of the generation (`checkpoint.Barrier`), so that the
      host's other processes open its cache after the first process filled it.
    alive: called with each count of records decoded (progress that is not a training step).
    read_only: open the cache without filling or writing it (evaluation of a finished run).
    standby: a warm standby prepares while the host's cache writer of the running generation
      still writes: it opens the cache read-only (and holds its records in memory) until
      `HostData.take_over` makes it the writer.
    placed: called with the ingest and the first epoch's plan once the placement is known,
      before the cache is filled or waited for: what a program's shapes need (the trainer
      compiles its step beside the fill, `medjax.train.prepare`).
  """
  prepared = pipeline.prepare(config, workdir)
  history = [list(h) for h in (host_history or [topology.hosts])]
  if sorted(history[-1]) != sorted(topology.hosts):
    raise ValueError(f"host history ends with {history[-1]}, not this generation's "
                     f"{list(topology.hosts)}")
  data = config.data
  walk = placement_lib.walk_history(prepared.manifest, history, seed=config.seed,
                                    vnodes=data.vnodes, method=data.placement_method)
  rows = recache.host_rows(data, prepared.manifest, walk, topology.host)
  host_batch = data.batch_size // len(topology.hosts)
  if placed is not None:
    placed(prepared, epoch_plan(prepared.manifest, walk.current, seed=config.seed, epoch=0,
                                num_partitions=data.num_partitions, host_batch=host_batch))
  run = paths.RunPaths(workdir, config)
  writer = topology.cache_writer and not read_only and not standby
  if writer:
    cache = pipeline.open_cache(run, prepared, topology.host)
    cache.configure(no_cache=rows.no_cache, moved=rows.moved_in)
    cache.note_membership(rows.membership, len(rows.moved_in))
    pipeline.fill_cache(cache, rows.prefill, f"decoding {topology.host}", on_progress=alive)
  if not standby:
    barrier("cache filled")
  if not writer:
    cache = pipeline.open_cache(run, prepared, topology.host, read_only=True,
                                process=topology.local_index)
    cache.configure(no_cache=rows.no_cache, moved=rows.moved_in,
                    expect=rows.background if not (read_only or standby) else ())
  if not read_only:
    cache.hold_in_memory(rows.wanted, memory_budget_mb(data.cache_memory_mb, topology.local_count))
  return HostData(run=run, topology=topology, prepared=prepared, walk=walk, rows=rows,
                  cache=cache, seed=config.seed, num_partitions=data.num_partitions,
                  host_batch=host_batch)


# Cache counters in metrics.jsonl and summary.json (`cache.hosts.<host>.<counter>`, `cache.total`).
SUMMARY_COUNTERS = ("pfs_reads", "pfs_bytes", "hits", "misses", "records_moved_in", "recache_s",
                    "moved_reads", "pfs_files", "wait_s", "damaged")


def cache_summary(data_config, counts: dict) -> dict:
  """summary.json's cache block: the policy and every host's counters (docs/cache.md)."""
  pick = lambda c: {k: c[k] for k in SUMMARY_COUNTERS}
  return {"policy": data_config.cache_policy, "replicas": data_config.replicas,
          "placement": data_config.placement_method,
          "hosts": {h: pick(c) for h, c in counts["hosts"].items()},
          "total": pick(counts["total"])}
