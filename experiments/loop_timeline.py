"""Where the training thread's wall time goes in the real loop, by activity (for bench_loop).

cProfile cannot say: from Python 3.12 on it records every thread (sys.monitoring), so the saver's,
the snapshot writer's and the readers' time lands in the training thread's categories. Here the
loop's own calls are wrapped with a wall clock that counts only on the training thread, nested
calls counted once (in the innermost activity), and the steps are classified by what came
before them (a partition's boundary, an epoch's end), so that the cost of each kind of step is
seen apart from the others.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time

import numpy as np

from medjax.checkpoint import saver as saver_lib
from medjax.checkpoint import snapshots as snapshots_lib
from medjax.data import loader
from medjax.runtime import ledger as ledger_lib
from medjax.train import loop as loop_lib
from medjax.train import reporting
from medjax.train import stopping

# (activity, class, method): what each wrapped call's time is counted as.
# pylint: disable=protected-access
WRAPPED = (
    ("in-flight wait, monitor", loop_lib._Loop, "dispatched"),
    ("reading (inline)", loader.Ahead, "read_ahead"),
    ("ledger", ledger_lib.Writer, "write"),
    ("snapshots", snapshots_lib.Snapshots, "save"),
    ("metrics", reporting.Reporter, "step"),
    ("metrics", reporting.Reporter, "flush"),
    ("saves", saver_lib.Saver, "save"),
    ("saves", saver_lib.Saver, "commit_finalized"),
    ("validation", stopping.Validator, "epoch_end"),
    ("boundary (other)", loop_lib._Loop, "partition_end"),
    ("cache counters", loop_lib._Loop, "_publish_cache_counters"),
)
# pylint: enable=protected-access


class Timeline:
  """Wall seconds of the training thread by activity while `active`; the step kinds.

  `next_batch` is the time the loop waited for its next planned step (reading, or a new epoch's
  plan and reader); `dispatch` the step function's call; everything else the training thread did
  is 'other' (the loop's own code, fault injection, stop checks).
  """

  def __init__(self):
    self.seconds: dict[str, float] = collections.defaultdict(float)
    self.active = False
    self._thread = threading.get_ident()
    self._stack: list[list] = []      # [activity, start, children's seconds]
    self._after: str = "plain"        # what came before the next step
    self.kinds: list[str] = []        # per dispatched step: 'plain', 'boundary', 'epoch end'

  @contextlib.contextmanager
  def span(self, activity: str):
    if not self.active or threading.get_ident() != self._thread:
      yield
      return
    frame = [activity, time.perf_counter(), 0.0]
    self._stack.append(frame)
    try:
      yield
    finally:
      self._stack.pop()
      spent = time.perf_counter() - frame[1]
      self.seconds[activity] += spent - frame[2]
      if self._stack:
        self._stack[-1][2] += spent

  def dispatched(self) -> None:
    """Called as each step is dispatched: its kind is what came before it."""
    self.kinds.append(self._after)
    self._after = "plain"

  def boundary(self, epoch_end: bool) -> None:
    self._after = "epoch end" if epoch_end else (
        self._after if self._after == "epoch end" else "boundary")

  @contextlib.contextmanager
  def wrapped(self):
    """Wraps WRAPPED's methods and the planned steps' iteration for the duration."""
    originals = []
    timeline = self

    def wrap(activity, cls, name):
      original = getattr(cls, name)

      def call(*args, **kwargs):
        with timeline.span(activity):
          return original(*args, **kwargs)
      originals.append((cls, name, original))
      setattr(cls, name, call)

    for activity, cls, name in WRAPPED:
      wrap(activity, cls, name)
    loop_class = loop_lib._Loop   # pylint: disable=protected-access
    partition_end = loop_class.partition_end

    def marked_end(loop, state, step):
      timeline.boundary(loop.cursor.partition + 1 == step.num_partitions)
      return partition_end(loop, state, step)
    loop_class.partition_end = marked_end
    originals.append((loop_class, "partition_end", partition_end))
    plan_iter = loop_lib.PlannedSteps.__iter__

    def timed_iter(plan):
      steps = plan_iter(plan)
      while True:
        with timeline.span("next batch"):
          try:
            step = next(steps)
          except StopIteration:
            return
        yield step
    loop_lib.PlannedSteps.__iter__ = timed_iter
    originals.append((loop_lib.PlannedSteps, "__iter__", plan_iter))
    try:
      yield self
    finally:
      for cls, name, original in reversed(originals):
        setattr(cls, name, original)

  def report(self, *, wall_s: float, steps: int, intervals: list[tuple[str, float]]) -> dict:
    """ms per step by activity over `steps` steps and `wall_s` seconds; per step kind, the count
    and median of `intervals`: (kind of a step, seconds from the previous dispatch to its own,
    which hold the work its kind names)."""
    ms = lambda s: round(1e3 * s / max(steps, 1), 3)
    known = sum(self.seconds.values())
    by_activity = {k: ms(v) for k, v in sorted(self.seconds.items(), key=lambda kv: -kv[1])}
    by_activity["other"] = ms(max(wall_s - known, 0.0))
    per_kind = {}
    for kind in ("plain", "boundary", "epoch end"):
      spans = [s for k, s in intervals if k == kind]
      if spans:
        per_kind[kind] = {"count": len(spans),
                          "median_ms": round(1e3 * float(np.median(spans)), 3),
                          "total_ms": round(1e3 * float(np.sum(spans)), 1)}
    return {"ms_per_step": by_activity, "wall_s": round(wall_s, 3), "steps": steps,
            "intervals_by_kind": per_kind}
