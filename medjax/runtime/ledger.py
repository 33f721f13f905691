"""The ledger: which records each executed step trained on, per generation and process.

Independent of checkpoints and lineage, so it can check them: the final model trained on, for
each committed global step, the rows of that step's LAST execution (earlier executions of a step
were discarded by a restart). Those rows must cover every training record exactly once per epoch.
"""

from __future__ import annotations

import collections
import glob
import json
import os

import numpy as np

from medjax import jsonl
from medjax import paths


class Writer:
  """Appends {step, epoch, rows} lines to <workdir>/ledger/gen-G-proc-P.jsonl."""

  def __init__(self, workdir: str, generation: int, process: int, *, enabled: bool = True):
    self._f = None
    if enabled:
      run = paths.RunPaths(workdir)
      os.makedirs(run.ledger, exist_ok=True)
      self._f = open(run.ledger_file(generation, process), "a")

  def write(self, step: int, epoch: int, rows: np.ndarray) -> None:
    if self._f is not None:
      rows = np.asarray(rows)
      self._f.write(json.dumps({"step": int(step), "epoch": int(epoch),
                                "rows": rows[rows >= 0].tolist()}) + "\n")
      self._f.flush()

  def close(self) -> None:
    if self._f is not None:
      self._f.close()


def _files(workdir: str):
  """(generation, the file's entries) for every ledger file, in name order."""
  pattern = os.path.join(paths.RunPaths(workdir).ledger, "gen-*-proc-*.jsonl")
  for path in sorted(glob.glob(pattern)):
    yield int(os.path.basename(path).split("-")[1]), jsonl.read(path)


def last_executions(workdir: str, final_step: int) -> dict[int, tuple[int, list[int]]]:
  """global step -> (epoch, rows of all processes) from the newest generation that ran it."""
  by_step: dict[int, dict[int, tuple[int, list[int]]]] = collections.defaultdict(dict)
  for generation, entries in _files(workdir):
    for entry in entries:
      gen_rows = by_step[entry["step"]].setdefault(generation, (entry["epoch"], []))
      gen_rows[1].extend(entry["rows"])
  out = {}
  for step in range(1, final_step + 1):
    if step in by_step:
      generation = max(by_step[step])
      out[step] = by_step[step][generation]
  return out


def steps_by_generation(workdir: str) -> dict[int, list[int]]:
  """generation -> the global steps it executed (dispatched), in order, from the ledger: what a
  SIGKILLed or SIGSTOPped worker ran after its last progress report is here too. A step runs on
  every process (its collectives need them all): where one process died, the others may have
  dispatched steps that never ran, so the steps up to where the process that got least far
  stopped count: every process's steps up to there (in 'local' mode a late replica skips steps
  that the others trained). {} without a ledger."""
  per_process: dict[int, list[list[int]]] = collections.defaultdict(list)
  for generation, entries in _files(workdir):
    per_process[generation].append([int(e["step"]) for e in entries])
  out: dict[int, list[int]] = {}
  for generation, lists in per_process.items():
    last = min(steps[-1] if steps else -1 for steps in lists)
    out[generation] = sorted({s for steps in lists for s in steps if s <= last})
  return out


def exactly_once(workdir: str, final_step: int, train_rows: np.ndarray, epochs: int) -> dict:
  """Checks that committed steps cover every training record exactly once per epoch."""
  executions = last_executions(workdir, final_step)
  missing_steps = [s for s in range(1, final_step + 1) if s not in executions]
  counts = np.zeros((epochs, int(train_rows.max()) + 1 if len(train_rows) else 0), np.int64)
  for epoch, rows in executions.values():
    if epoch < epochs:
      np.add.at(counts[epoch], rows, 1)
  per_epoch = counts[:, train_rows] if len(train_rows) else counts
  return {"exactly_once": bool(not missing_steps and np.all(per_epoch == 1)),
          "missing_steps": missing_steps[:10], "records_seen_twice": int(np.sum(per_epoch > 1)),
          "records_never_seen": int(np.sum(per_epoch == 0))}
