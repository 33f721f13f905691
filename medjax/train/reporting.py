"""Training metrics and progress, fetched from the device once per logging interval.

The training loop dispatches steps asynchronously; `Reporter.step` only queues each step's
metrics (device arrays) with its host-side facts. After the first step, then every `every` steps
and before each checkpoint, `flush` copies the queued metrics to the host in one transfer, checks
that every loss is finite (naming the first bad step and its records otherwise), writes one
metrics.jsonl row per step (TensorBoard: one point, the interval's mean), advances the progress
bar and reports progress to the fault-tolerance context; at a checkpoint in two halves, `check`
before the save and `write` after it. So the host waits for the device once per interval, not
once per step; a non-finite state is never checkpointed; and the progress the coordinator sees
is of steps that finished (a step dispatched may still wait on a peer that is compiling), so its
hang timeouts hold.
Between flushes, each new dispatch also reports the newest queued step whose results are ready
(`jax.Array.is_ready`, which does not wait): progress arrives step by step, so hang timeouts can
be learned from step times (`medjax.fault.policy`).
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable

import jax
import numpy as np

from medjax import errors


class TrainingError(errors.InputError):
  """Training cannot go on (a non-finite loss); the message says where and what to do. Resumed
  from the last good checkpoint it would diverge the same way, so it is reported like bad input
  (one line, exit 2) and a supervised run stops at once instead of restarting it."""


@dataclasses.dataclass
class _Pending:
  global_step: int
  epoch: int
  partition: int
  offset: int
  rows: np.ndarray      # this process's manifest rows of the step (-1 = padding)
  metrics: dict         # device arrays


def _finished(metrics: dict) -> bool:
  """Whether a dispatched step's results are computed (no wait; False where it cannot tell)."""
  loss = metrics.get("loss")
  try:
    return bool(loss.is_ready())
  except AttributeError:
    return False


class Reporter:
  """Queues per-step metrics and writes them at the logging interval.

  Args:
    writer: the `writers.MetricWriter` (enabled on process 0 only).
    bar: the `progress.Progress` bar of training steps.
    every: logging interval in steps (>= 1).
    lag: steps the interval's flush leaves queued, the newest ones (the loop passes its
      config.max_steps_in_flight): those older are finished already, so fetching them does not
      wait for the device, which keeps the steps queued behind them (a flush of every queued
      step would drain its queue once per interval). Checkpoints and the end flush all.
    processes: jax.process_count(), to turn this process's examples into the global rate.
    record_ids: the manifest's pseudonymous record ids, for the non-finite-loss error.
    resume_hint: text naming the last good checkpoint, for the non-finite-loss error.
    generation: the fault-tolerance generation, written with every row.
    on_progress: called after each flush with the last finished step's (global step, epoch,
      partition), e.g. the context's `progress`.
    fetch: queued metrics (a list of dicts of device arrays) -> host scalars (default
      `jax.device_get`); 'local' mode's reduces this process's replicas (`local_sgd.fetch_rows`).
  """

  def __init__(self, writer, bar, *, every: int, processes: int, record_ids: np.ndarray,
               resume_hint: Callable[[], str], generation: int = 0,
               on_progress: Callable[..., None] = lambda *_: None, lag: int = 0,
               fetch: Callable[[list], list] | None = None):
    self.writer, self.bar, self.every, self.processes = writer, bar, max(int(every), 1), processes
    self.lag = max(int(lag), 0)
    self.record_ids, self.resume_hint, self.generation = record_ids, resume_hint, generation
    self.on_progress = on_progress
    self.fetch = fetch or (lambda tree: jax.device_get(tree))
    self._pending: list[_Pending] = []
    self._flushed = False   # the first step is flushed at once: it ends compiling
    self._since = time.perf_counter()
    self._reported = -1     # the newest step reported as finished
    self._checked: list = []   # intervals' rows (step, scalars) fetched and checked, not written

  def step(self, *, global_step: int, epoch: int, partition: int, offset: int,
           rows: np.ndarray, metrics: dict) -> None:
    """Queues one dispatched step; flushes at the interval, and in between reports progress for
    the newest queued step that has finished (asked without waiting for the device)."""
    self._pending.append(_Pending(global_step, epoch, partition, offset, rows, metrics))
    if not self._flushed:
      self.flush()
      return
    if len(self._pending) >= self.every + self.lag:
      self.flush(keep=self.lag)
      return
    for p in reversed(self._pending[:-1]):
      if p.global_step <= self._reported:
        break
      if _finished(p.metrics):
        self._reported = p.global_step
        self.on_progress(p.global_step, p.epoch, p.partition)
        break

  def finite_guard(self) -> Callable[[], bool]:
    """A check, for the checkpoint writer's thread, that every queued step's loss is finite.

    The steps before them were checked at earlier flushes. Called where the state is written
    (`Checkpointer.save(guard=...)`), it waits for the device there instead of on the training
    thread, which then keeps dispatching: a save no longer drains the device's queue. A
    non-finite loss is still reported by the next flush (within the logging interval), as one
    line naming the step and its records.
    """
    metrics = [p.metrics for p in self._pending]
    return lambda: bool(np.all(np.isfinite(np.asarray(
        [m["loss"] for m in self.fetch(metrics)], np.float64))))

  def flush(self, keep: int = 0) -> None:
    """Fetches the queued metrics (one device-to-host copy), checks and writes them; the newest
    `keep` steps stay queued (the interval's flush: see `lag`)."""
    self.check(keep)
    self.write()

  def check(self, keep: int = 0) -> None:
    """Fetches the queued metrics and checks that every loss is finite (a TrainingError names
    the first step whose loss is not); `write` writes them. A checkpoint is saved in between:
    writing wakes TensorBoard's writer thread, whose Python would hold the GIL while the save
    dispatches its packing."""
    cut = len(self._pending) - max(keep, 0)
    if cut <= 0:
      return
    pending, self._pending, self._flushed = self._pending[:cut], self._pending[cut:], True
    fetched = self.fetch([p.metrics for p in pending])
    now = time.perf_counter()
    examples = sum(int(np.sum(p.rows >= 0)) for p in pending) * self.processes
    rate = examples / max(now - self._since, 1e-9)
    self._since = now
    rows = []
    for p, m in zip(pending, fetched):
      loss = float(m["loss"])
      if not math.isfinite(loss):
        self.write()
        self.writer.write_interval(rows)   # the steps before it, for the record
        bad = [str(self.record_ids[r]) for r in p.rows if r >= 0]
        raise TrainingError(
            f"non-finite loss {loss} at step {p.global_step} (epoch {p.epoch}, partition "
            f"{p.partition}, offset {p.offset - 1}); this process's records in the batch: "
            f"{bad[:8]}{'...' if len(bad) > 8 else ''}; {self.resume_hint()}. Lower "
            "config.optim.lr or check those records, then rerun to resume from it")
      rows.append((p.global_step, {
          **{k: float(v) for k, v in m.items() if k != "weight"},
          "examples_per_s": rate, "epoch": p.epoch, "partition": p.partition,
          "generation": self.generation}))
    self._checked.append(rows)

  def write(self) -> None:
    """Writes what `check` fetched: metrics.jsonl gets every step, TensorBoard one point per
    interval (its mean); then the progress bar and `on_progress`."""
    checked, self._checked = self._checked, []
    for rows in checked:
      self.writer.write_interval(rows)
      step, last = rows[-1]
      self.bar.update(len(rows), loss=f"{last['loss']:.3f}")
      self._reported = step
      self.on_progress(step, last["epoch"], last["partition"])

  def cache_counters(self, global_step: int, epoch: int, counts: dict, keys) -> None:
    """One metrics.jsonl row (kind 'cache') of every host's cache counters at an epoch end."""
    per_host = [("total", counts["total"]), *counts["hosts"].items()]
    self.writer.write(global_step, {"epoch": epoch, "time": time.time(),
                                    "generation": self.generation,
                                    **{f"{host}/{k}": c[k] for host, c in per_host
                                       for k in keys}}, kind="cache")
