"""The worker's side of fault tolerance: progress heartbeats, commits, stop requests.

`Local` serves single-process runs with no coordinator: a commit writes the lineage record itself
and applies retention. `Remote` talks to the coordinator: a background thread sends heartbeats
carrying progress (phase, step, partition, a progress counter) and picks up stop requests;
commits are queued and resent until the coordinator takes them (it writes the record and applies
retention), so a coordinator outage loses nothing. Either way exactly one party prunes
checkpoints: whoever commits.
"""

from __future__ import annotations

import collections
import logging
import threading
import time

import grpc

from medjax import lineage as lineage_lib
from medjax.checkpoint import retention


PHASES = ("starting", "preparing", "compiling", "restoring", "training", "checkpointing",
          "validating", "epoch_end", "finishing", "evaluating", "done")


class Local:
  """No coordinator: commits go straight to the lineage store, then retention is applied.

  Args:
    store: the run's lineage store.
    checkpoints: the checkpoint directory retention applies to.
    max_to_keep: committed checkpoints kept (config.ckpt.max_to_keep; 0 or None: all).
    keep_best: also keep the best-on-validation checkpoint (config.ckpt.keep_best).
  """

  generation = 0
  process_id = 0

  def __init__(self, store: lineage_lib.LineageStore, checkpoints: str, max_to_keep: int | None,
               keep_best: bool = False):
    self.store, self.checkpoints, self.max_to_keep = store, checkpoints, max_to_keep
    self.keep_best = keep_best
    self.phase, self.step, self.counter = "starting", 0, 0
    self.blocked_s, self.executed = 0.0, 0
    self.writes, self.write_s = 0, 0.0

  def set_phase(self, phase: str) -> None:
    self.phase = phase

  def progress(self, step: int = 0, epoch: int = 0, partition: int = 0) -> None:
    """Training steps up to `step` finished (the phase is 'training' from then on).

    `executed`, which the trainer counts up as it dispatches steps, is what the summary's waste
    counts; progress is of finished steps, which hang detection watches.
    """
    self.phase = "training"
    self.step = step
    self.counter += 1

  def alive(self) -> None:
    """Progress that is not a training step (e.g. a record decoded into the cache)."""
    self.counter += 1

  def stop_requested(self) -> bool:
    return False

  def commit(self, lineage: lineage_lib.Lineage, write_s: float | None = None) -> None:
    del write_s  # the coordinator's events record it; a local run has none
    self.store.commit(lineage, committed_at=time.time())
    best = lineage_lib.best_step(lineage) if self.keep_best else None
    retention.prune(self.checkpoints, self.store.committed_steps(), self.max_to_keep,
                    also_keep=() if best is None else (best,))

  def flush(self, timeout_s: float = 0.0) -> bool:
    return True

  def close(self) -> None:
    pass


class Remote(Local):
  """Heartbeats and commits to the coordinator; survives its outages by buffering."""

  def __init__(self, client, *, generation: int, process_id: int, interval_s: float = 0.25):
    self.client, self.generation, self.process_id = client, generation, process_id
    self.phase, self.step, self.epoch, self.partition, self.counter = "starting", 0, 0, 0, 0
    # Gaps between progress reports while training (seconds): the coordinator learns its hang
    # timeout from the longest recent one.
    self._gaps: collections.deque = collections.deque(maxlen=200)
    self._last_progress: float | None = None
    # Steps those gaps spanned (reports come in bursts where steps run ahead of the host): the
    # coordinator's warm-up counts steps, not reports.
    self._gap_steps = 0
    # Gaps between this worker's heartbeats as sent (its interval plus scheduling and RPC
    # delays): the coordinator learns how long silence may last from the longest recent one.
    self._beat_gaps: collections.deque = collections.deque(maxlen=200)
    self._last_beat: float | None = None
    self._heard: str | None = None   # the phase the coordinator last took from a heartbeat
    self.blocked_s, self.executed = 0.0, 0
    self.writes, self.write_s = 0, 0.0
    self._stop = threading.Event()
    self._closed = threading.Event()
    self._pending: collections.deque = collections.deque()
    self._lock = threading.Lock()
    self._interval = interval_s
    self._reachable = True
    self._beat_now = threading.Event()   # a beat before the interval is up (closing)
    self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)
    self._thread.start()
    # Commits go out from a thread of their own as soon as they are queued: the caller (the
    # checkpoint saver thread) does not wait for the coordinator, which writes the record and
    # prunes old checkpoints before it answers.
    self._commit_ready = threading.Event()
    self._sender = threading.Thread(target=self._send_loop, name="commit-sender", daemon=True)
    self._sender.start()

  def set_phase(self, phase: str) -> None:
    """The coordinator hears of it with the next heartbeat (within `interval_s`, far inside
    the shortest timeout it could change: 2 x fault.hang_floor_s without a step). The caller
    (the training thread, twice a checkpoint) neither waits for a call nor, as a rule, wakes the
    heartbeat thread for one: a synchronous heartbeat per phase change made supervised training
    6-10% slower on 2 cores, and a woken one still sent two calls per checkpoint (on the
    quickstart a checkpoint every ~0.2 s, each phase lasting under a millisecond).

    The exception: back to training after a phase the coordinator heard (a beat fell inside a
    checkpoint, a validation or an epoch end), it is told at once. Until then it holds the worker
    to that phase's fixed timeout (minutes at an epoch end), so a freeze in the next quarter
    second went unnoticed that long. That costs at most one call per heartbeat interval."""
    self.phase = phase
    self.counter += 1
    self._last_progress = None   # a gap across another phase is not a training step
    if phase == "training" and self._heard not in (None, "training"):
      self._beat_now.set()

  def progress(self, step: int = 0, epoch: int = 0, partition: int = 0) -> None:
    first = self.phase != "training"
    now = time.monotonic()
    if not first and self._last_progress is not None:
      self._gaps.append(now - self._last_progress)
      self._gap_steps += max(step - self.step, 0)
    self._last_progress = now
    self.phase = "training"
    self.step, self.epoch, self.partition = step, epoch, partition
    self.counter += 1
    if first:
      self._beat()  # the coordinator times recovery to the first step of a generation

  def stop_requested(self) -> bool:
    return self._stop.is_set()

  def commit(self, lineage: lineage_lib.Lineage, write_s: float | None = None) -> None:
    """Queues `lineage` for the coordinator, which writes it to the store and prunes (and
    records in its commit event how long the save took to write, `write_s`); sent at once by
    the commit sender, retried while the coordinator is unreachable."""
    with self._lock:
      self._pending.append({"record": lineage.to_dict(),
                            "write_s": None if write_s is None else round(write_s, 4)})
    self._commit_ready.set()

  def flush(self, timeout_s: float = 30.0) -> bool:
    """Waits until every queued commit reached the coordinator (or the timeout)."""
    deadline = time.monotonic() + timeout_s
    while self._pending and time.monotonic() < deadline:
      self._send_commits()
      if self._pending:
        time.sleep(0.2)
    return not self._pending

  def _send_commits(self) -> None:
    with self._lock:
      while self._pending:
        try:
          self.client.call("Commit", {"generation": self.generation, **self._pending[0]})
        except grpc.RpcError:
          return
        self._pending.popleft()

  def _beat(self) -> None:
    now = time.monotonic()
    phase = self.phase
    if self._last_beat is not None and phase == "training":
      self._beat_gaps.append(now - self._last_beat)
    self._last_beat = now
    try:
      reply = self.client.call("WorkerHeartbeat", {
          "generation": self.generation, "process_id": self.process_id, "phase": phase,
          "step": self.step, "epoch": self.epoch, "partition": self.partition,
          "counter": self.counter, "blocked_s": round(self.blocked_s, 4),
          "writes": self.writes, "write_s": round(self.write_s, 4),
          "executed": self.executed, "time": time.time(),
          "gap_s": round(max(self._gaps), 4) if self._gaps else None,
          "gaps": len(self._gaps), "gap_steps": self._gap_steps, "beat_s": self._interval,
          "beat_gap_s": round(max(self._beat_gaps), 4) if self._beat_gaps else None})
    except grpc.RpcError:
      if self._reachable:
        logging.warning("worker %d: coordinator unreachable; training goes on, reports are "
                        "buffered", self.process_id)
      self._reachable = False
      return
    self._heard = phase
    if phase != "training" and self.phase == "training":
      # Back to training while this beat was under way: `set_phase` found the phase before it
      # heard, so it did not ask for a beat; the next regular one could come after a freeze.
      self._beat_now.set()
    if not self._reachable:
      logging.info("worker %d: coordinator reachable again", self.process_id)
    self._reachable = True
    if reply.get("stop"):
      self._stop.set()

  def _run(self) -> None:
    while True:
      self._beat_now.wait(self._interval)
      self._beat_now.clear()
      if self._closed.is_set():
        return
      self._beat()

  def _send_loop(self) -> None:
    while not self._closed.is_set():
      self._commit_ready.wait(self._interval)
      self._commit_ready.clear()
      if self._pending:
        self._send_commits()

  def close(self) -> None:
    self._closed.set()
    self._commit_ready.set()
    self._beat_now.set()
    self._beat()
