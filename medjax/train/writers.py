"""Where training metrics go: metrics.jsonl (one line per step) and TensorBoard event files."""

from __future__ import annotations

import json
import math
import os

from tensorboardX import SummaryWriter

from medjax import jsonl
from medjax import paths


class MetricWriter:
  """Appends scalars to <workdir>/metrics.jsonl and <workdir>/tensorboard/ (process 0 only)."""

  def __init__(self, workdir: str, *, enabled: bool = True):
    self.enabled = enabled
    if not enabled:
      return
    run = paths.RunPaths(workdir)
    self._jsonl = open(run.metrics, "a")
    self._tb = SummaryWriter(run.tensorboard, flush_secs=10)

  def write(self, step: int, scalars: dict[str, float], *, kind: str = "train") -> None:
    if not self.enabled:
      return
    clean = {k: (float(v) if v is not None and not (isinstance(v, float) and math.isnan(v))
                 else None) for k, v in scalars.items()}
    self._jsonl.write(json.dumps({"kind": kind, "step": int(step), **clean}) + "\n")
    self._jsonl.flush()
    for k, v in clean.items():
      if v is not None:
        self._tb.add_scalar(f"{kind}/{k}", v, step)

  def close(self) -> None:
    if self.enabled:
      self._jsonl.close()
      self._tb.close()


def read_metrics(workdir: str) -> list[dict]:
  return jsonl.read(paths.RunPaths(workdir).metrics)
