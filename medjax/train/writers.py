"""Where training metrics go: metrics.jsonl (one line per step) and TensorBoard event files.

Training steps reach TensorBoard once per logging interval, as the mean of the interval's steps
(`write_interval`, the convention of Flax's examples and clu's writers); metrics.jsonl keeps every
step. TensorBoard's writer thread serializes each event in Python: with every step's scalars it
held the GIL while the training thread dispatched a checkpoint's packing (on the quickstart,
1.0-1.3 ms of a save against 0.3-0.4 ms without TensorBoard).
"""

from __future__ import annotations

import json
import math
import threading

from tensorboardX import SummaryWriter

from medjax import jsonl
from medjax import paths


# Row fields that say where a row comes from, not what was measured: not TensorBoard scalars.
_NOT_SCALARS = ("time", "process")
# Where a training step ran: an interval's TensorBoard point takes its last step's.
_WHERE = ("epoch", "partition", "generation")

# Events TensorBoard's writer thread may have pending before `add_scalar` waits for it. At
# tensorboardX's default of 10, the training thread waited on that thread (which serializes and
# checksums each event in Python) for ~11% of its time on the quickstart (py-spy), and training
# took ~12% longer, supervised or not. (With one point per logging interval a run writes a few
# hundred small events.)
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
    """One metrics.jsonl row and its TensorBoard scalars at `step`."""
    self.write_interval([(step, scalars)], kind=kind)

  def write_interval(self, rows: list[tuple[int, dict[str, float]]], *,
                     kind: str = "train") -> None:
    """A metrics.jsonl row per (step, scalars) in `rows`, and one TensorBoard point at the last
    step: each scalar's mean over the rows that have it (the last row's for `_WHERE` fields)."""
    if not self.enabled or not rows:
      return
    cleaned = [(int(step), {k: _clean(v) for k, v in scalars.items()}) for step, scalars in rows]
    with self._lock:
      if self._jsonl.closed:
        return
      self._jsonl.write("".join(json.dumps({"kind": kind, "step": step, **clean}) + "\n"
                                for step, clean in cleaned))
      self._jsonl.flush()
      if self._tb is None:
        return
      last_step, last = cleaned[-1]
      for k in last:
        if k in _NOT_SCALARS:
          continue
        values = [c[k] for _, c in cleaned if c.get(k) is not None]
        value = last[k] if k in _WHERE else (sum(values) / len(values) if values else None)
        if value is not None:
          self._tb.add_scalar(f"{kind}/{k}", value, last_step)

  def close(self) -> None:
    if self.enabled:
      with self._lock:
        self._jsonl.close()
        if self._tb is not None:
          self._tb.close()


def _clean(v) -> float | None:
  return float(v) if v is not None and not (isinstance(v, float) and math.isnan(v)) else None


def read_metrics(workdir: str) -> list[dict]:
  return jsonl.read(paths.RunPaths(workdir).metrics)
