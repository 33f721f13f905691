"""Where training metrics go: metrics.jsonl (one line per step) and TensorBoard event files."""

from __future__ import annotations

import json
import math
import os
import threading

from tensorboardX import SummaryWriter

from medjax import jsonl
from medjax import paths


# Row fields that say where a row comes from, not what was measured: not TensorBoard scalars.
_NOT_SCALARS = ("time", "process")

# Events TensorBoard's writer thread may have pending before `add_scalar` waits for it. At
# tensorboardX's default of 10, the training thread waited on that thread (which serializes and
# checksums each event in Python) for ~11% of its time on the quickstart (py-spy), and training
# took ~12% longer, supervised or not. A run's scalars are a few thousand small events.
_TB_QUEUE = 100_000


class MetricWriter:
  """Appends scalars to <workdir>/metrics.jsonl and <workdir>/tensorboard/.

  Args:
    workdir: the run's directory.
    enabled: False writes nothing (training metrics are written by process 0 only).
    tensorboard: False writes metrics.jsonl only (the monitor rows of processes other than 0,
      appended one line per write, so that processes' lines never interleave).
  Thread-safe: the monitor writes from its own thread.
  """

  def __init__(self, workdir: str, *, enabled: bool = True, tensorboard: bool = True):
    self.enabled = enabled
    self._lock = threading.Lock()
    if not enabled:
      return
    run = paths.RunPaths(workdir)
    self._jsonl = open(run.metrics, "a")
    self._tb = (SummaryWriter(run.tensorboard, flush_secs=10, max_queue=_TB_QUEUE)
                if tensorboard else None)

  def write(self, step: int, scalars: dict[str, float], *, kind: str = "train") -> None:
    if not self.enabled:
      return
    clean = {k: (float(v) if v is not None and not (isinstance(v, float) and math.isnan(v))
                 else None) for k, v in scalars.items()}
    with self._lock:
      if self._jsonl.closed:
        return
      self._jsonl.write(json.dumps({"kind": kind, "step": int(step), **clean}) + "\n")
      self._jsonl.flush()
      if self._tb is not None:
        for k, v in clean.items():
          if v is not None and k not in _NOT_SCALARS:
            self._tb.add_scalar(f"{kind}/{k}", v, step)

  def close(self) -> None:
    if self.enabled:
      with self._lock:
        self._jsonl.close()
        if self._tb is not None:
          self._tb.close()


def read_metrics(workdir: str) -> list[dict]:
  return jsonl.read(paths.RunPaths(workdir).metrics)
