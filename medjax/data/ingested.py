"""What ingest wrote under `<workdir>/ingest/`, read back.

Apart from `medjax.data.ingest` so that a run reusing its ingest (the launcher's check, every
worker and standby, every restart) imports neither pandas nor the table and DICOM readers that
only an ingest needs: ~0.3 s of every process start on 2 cores.
"""

from __future__ import annotations

import dataclasses
import json
import os
import zipfile

import numpy as np

from medjax import errors
from medjax import jsonl
from medjax import paths
from medjax.data import manifest as manifest_lib


@dataclasses.dataclass
class Ingested:
  """What ingest produced (also on disk under `<workdir>/ingest/`)."""
  manifest: manifest_lib.Manifest
  tables: dict[str, np.ndarray]
  quarantine: list[dict]
  summary: dict


def load(workdir: str) -> Ingested:
  """Reads back what `medjax.data.ingest.run` wrote."""
  run_paths = paths.RunPaths(workdir)
  redo = ("run the ingest again: --config.data.reingest=True (record ids stay the same with the "
          "same salt)")
  try:
    manifest = manifest_lib.Manifest.load(run_paths.manifest)
    with np.load(run_paths.tables, allow_pickle=False) as f:
      table_arrays = dict(f)
    quarantine = jsonl.read(run_paths.quarantine)
    with open(run_paths.ingest_summary) as f:
      summary = json.load(f)
  except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile) as e:
    raise errors.InputError(f"{run_paths.ingest} is damaged or incomplete ({type(e).__name__}: "
                            f"{' '.join(str(e).split())[:120]}); {redo}") from e
  if not np.array_equal(table_arrays.get("record_ids"), manifest.record_ids):
    raise errors.InputError(f"{run_paths.ingest}: tables.npz and manifest.jsonl disagree on "
                            f"record ids; {redo}")
  return Ingested(manifest, table_arrays, quarantine, summary)


def load_ceiling(workdir: str) -> dict[str, np.ndarray] | None:
  """The Bayes posterior of the test records (synthetic cohorts), or None."""
  path = paths.RunPaths(workdir).ceiling
  if not os.path.exists(path):
    return None
  with np.load(path) as f:
    return dict(f)
