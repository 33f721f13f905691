"""From config to ready data: cohort -> ingest (-> per host: `medjax.data.host`).

`prepare` is what `--config.mode=ingest`, training and evaluation call first. Each stage reuses
what an earlier run left in the workdir when it still matches, and says so. `run_ingest` also
places the records, plans epoch 0 and fills every local host's cache, and reports on all of it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os

import numpy as np

from medjax import errors
from medjax import paths
from medjax import progress
from medjax.data import cache as cache_lib
from medjax.data import ingest_summary
from medjax.data import ingested as ingested_lib
from medjax.data import manifest as manifest_lib
from medjax.data import partition
from medjax.data import records
from medjax.data.cache import fill as fill_lib
from medjax.data.cache import placement as placement_lib
from medjax.data.cache import recache
from medjax.data.dicom import decoder as decoder_lib


@dataclasses.dataclass
class Prepared:
  """The ingested cohort: where it is, what ingest made of it, the shapes of its records."""
  root: str
  ingested: ingested_lib.Ingested
  shapes: records.Shapes

  @property
  def manifest(self) -> manifest_lib.Manifest:
    return self.ingested.manifest


def host_names(n: int) -> list[str]:
  return [f"host-{i}" for i in range(n)]


def cohort_root(config, workdir: str) -> str:
  """The cohort directory: config.data.root, or a synthetic cohort written into the workdir."""
  if config.data.root:
    if not os.path.isdir(config.data.root):
      raise FileNotFoundError(f"config.data.root={config.data.root!r} is not a directory; point it "
                              "at a folder with dicom/, labs.csv, vitals.csv, labels.csv")
    return config.data.root
  run = paths.RunPaths(workdir, config)
  root, marker = run.cohort, run.cohort_marker
  wanted = config.data.synthetic.to_json(sort_keys=True)
  if os.path.exists(marker):
    with open(marker) as f:
      if f.read() == wanted:
        logging.info("cohort: reusing the synthetic cohort in %s", root)
        return root
    logging.info("cohort: %s was generated with another config; generating it again", root)
  if config.data.synthetic.vitals_steps != config.data.vitals_steps:
    raise ValueError(f"config.data.synthetic.vitals_steps={config.data.synthetic.vitals_steps} "
                     f"but config.data.vitals_steps={config.data.vitals_steps}; make them equal")
  # The generator writes DICOM files with pydicom: imported only when a cohort is generated.
  from medjax.data import synthetic  # pylint: disable=import-outside-toplevel
  synthetic.generate(config.data.synthetic, root)
  logging.info("cohort: wrote %d synthetic patients to %s", config.data.synthetic.num_patients,
               root)
  with open(marker, "w") as f:
    f.write(wanted)
  return root


def ingested(config, workdir: str, root: str) -> ingested_lib.Ingested:
  """Runs the ingest, or loads the one in the workdir when it exists and reingest is off."""
  run = paths.RunPaths(workdir, config)
  if os.path.exists(run.ingest_summary) and not config.data.reingest and config.mode != "ingest":
    logging.info("ingest: reusing %s (set --config.data.reingest=True to redo it)", run.ingest)
    result = ingested_lib.load(workdir)
    _check_splits(config, result.manifest)
    return result
  # Imported where an ingest runs: pandas and the readers (medjax/data/ingested.py).
  from medjax.data import ingest  # pylint: disable=import-outside-toplevel
  result = ingest.run(config, workdir, root)
  logging.info("ingest summary\n%s", ingest_summary.format_summary(result.summary))
  _check_splits(config, result.manifest)
  return result


def _check_splits(config, manifest: manifest_lib.Manifest) -> None:
  """What training needs of the splits that config.data.split alone cannot say (labels.csv's
  split column, or the quarantine, may leave 'val' empty): refused before any process starts,
  rather than a worker failing at its first epoch's end in a crash loop."""
  if config.mode == "ingest" or len(manifest.indices("val")):
    return
  wants = [f for f, on in (("optim.early_stopping_patience", config.optim.early_stopping_patience),
                           ("ckpt.keep_best", config.ckpt.keep_best),
                           ("trial.storage", config.trial.storage)) if on]
  if wants:
    raise errors.InputError(
        f"config.{wants[0]} needs a validation split, and the ingested cohort has no 'val' "
        "patient (labels.csv's split column gives none, or none of them was kept); give some "
        f"patients 'val', or turn config.{wants[0]} off")


def prepare(config, workdir: str) -> Prepared:
  """The cohort (synthesised if need be) and its ingest, reused from the workdir when done."""
  root = cohort_root(config, workdir)
  result = ingested(config, workdir, root)
  return Prepared(root=root, ingested=result, shapes=records.shapes_for(config.data,
                                                                        result.tables))


def open_cache(run: paths.RunPaths, prepared: Prepared, host: str, *,
               read_only: bool = False, process: int = 0) -> cache_lib.Cache:
  """`host`'s node-local cache; its counters belong to this run directory.

  Its decoder (budgets, isolation of compressed decoding) comes from `run.config.data`.
  """
  run_id = hashlib.blake2b(os.path.abspath(run.workdir).encode(), digest_size=8).hexdigest()
  decoder = (decoder_lib.Decoder.from_config(run.config.data) if run.config is not None
             else None)
  processes = fill_lib.processes_for(run.config.data.get("decode_processes", 0)
                                     if run.config is not None else 0)
  return cache_lib.Cache(run.cache(host), prepared.manifest, prepared.ingested.tables,
                         prepared.shapes, prepared.root, read_only=read_only, process=process,
                         run=run_id, decoder=decoder, fill_processes=processes)


def fill_cache(cache: cache_lib.Cache, rows: np.ndarray, desc: str, on_progress=None) -> int:
  """Decodes into `cache` every row it lacks, with progress."""
  todo = int(np.sum(~cache.cached(rows)))
  if not todo:
    return 0
  with progress.Progress(todo, desc, unit="rec") as bar:
    def update(n):
      bar.update(n)
      if on_progress is not None:
        on_progress(n)
    return cache.ensure(rows, progress=update)


def run_ingest(config, workdir: str) -> dict:
  """`--config.mode=ingest`: everything up to filled caches, with a report (no training)."""
  hosts = host_names(config.fault.local_hosts)
  prepared = prepare(config, workdir)
  run = paths.RunPaths(workdir, config)
  walk = placement_lib.walk_history(prepared.manifest, [hosts], seed=config.seed,
                                    vnodes=config.data.vnodes,
                                    method=config.data.placement_method)
  stats = placement_lib.load_stats(walk.current, prepared.manifest)
  host_batch = config.data.batch_size // len(hosts)
  plan = partition.plan_epoch(prepared.manifest, walk.current, seed=config.seed, epoch=0,
                              num_partitions=config.data.num_partitions,
                              host_batch_size=host_batch)
  cache_counts = {}
  for host in hosts:
    cache = open_cache(run, prepared, host)
    rows = recache.host_rows(config.data, prepared.manifest, walk, host)
    fill_cache(cache, rows.prefill, f"decoding {host}")
    cache_counts[host] = {**cache.counters, "rejected_at_decode": len(cache.rejected)}
  report = {
      "ingest": prepared.ingested.summary,
      "placement": {k: v for k, v in stats.items() if not isinstance(v, (list, np.ndarray))},
      "plan": {"epoch": 0, "partitions": len(plan.partitions), "steps": plan.num_steps,
               "padding_fraction": round(plan.padding_fraction, 4)},
      "cache": cache_counts,
  }
  with open(run.ingest_report, "w") as f:
    json.dump(report, f, indent=2, default=_jsonable)
  print(ingest_summary.format_summary(prepared.ingested.summary))
  print(f"placement over {len(hosts)} host(s): max/mean cost "
        f"{stats['cost_max_over_mean']:.4f}; epoch 0: {len(plan.partitions)} "
        f"partitions, {plan.num_steps} steps, padding {report['plan']['padding_fraction']:.2%}")
  for host, c in cache_counts.items():
    print(f"cache {host}: {c['records_written']} records decoded, {c['pfs_files']} files read, "
          f"{c['rejected_at_decode']} rejected at decode")
  return report


def _jsonable(value):
  if isinstance(value, np.generic):
    return value.item()
  if isinstance(value, np.ndarray):
    return value.tolist()
  raise TypeError(f"not JSON serialisable: {type(value)}")
