"""A worker's start-up, phase by phase, in wall-clock seconds: where a recovery's time goes.

Each worker of a generation times its own phases from the moment its agent handed it the
generation (`assigned_at`, the agent's clock: the same machine) to its first finished training
step, and sends the result once, in the heartbeat that reports that step (`Reporting`, a client
wrapper: the heartbeat itself is `medjax.runtime.context`'s). The coordinator writes it to
events.jsonl (`generation_phases`) and summary.json breaks each failure's recovery down with it
(`medjax.fault.report`).

Phases (absent when a path skips them):
  handover           a standby read its assignment (the agent wrote it at `assigned_at`)
  process_start      a relaunched worker: process start, Python and imports, up to `worker.run`
  distributed_init   jax.distributed.initialize (multi-process generations only)
  data_setup         manifest, placement, cache open and validation, records held in memory
  data_takeover      a warm standby's prepared data becomes the generation's (cache writer)
  model_build        model, optimizer and the training state's shape (on a thread beside
                     data_setup: `beside_data`, with the compile's own seconds)
  compile            the training step compiled (from the persistent cache when it holds it):
                     what its compilation, started beside data_setup, took after the data was
                     ready
  restore            the newest committed checkpoint, or a newer host-local snapshot, restored
                     (or a fresh start); `restored` says which and its step
  first_step         from the training loop's start to its first finished step
A warm standby did data_setup, model_build and compile before its generation existed: they are
reported under `prepared` (with `prepared_before_s`, how long before the hand-over it was ready).
"""

from __future__ import annotations

import contextlib
import threading
import time

# When the agent started a worker process (time.time()): its process_start phase ends in
# `medjax.fault.worker.run`.
ASSIGNED_AT_ENV = "MEDJAX_ASSIGNED_AT"

_CACHE_EVENTS = {"/jax/compilation_cache/cache_hits": "hits",
                 "/jax/compilation_cache/cache_misses": "misses"}
_cache_counts = {"hits": 0, "misses": 0}
_listening = False
_lock = threading.Lock()


def _listen_to_compilation_cache() -> None:
  """Counts JAX's persistent-cache hits and misses (once per process)."""
  global _listening
  with _lock:
    if _listening:
      return
    _listening = True
  import jax  # pylint: disable=import-outside-toplevel

  def on_event(event: str, **_):
    name = _CACHE_EVENTS.get(event)
    if name is not None:
      _cache_counts[name] += 1
  jax.monitoring.register_event_listener(on_event)


class Phases:
  """Times named phases (`with phases.phase(name):`) and the first training step.

  Args:
    path: how the worker got its generation: 'warm_standby', 'standby' or 'relaunch' (or
      'single' for an unsupervised run).
    assigned_at: when the agent handed it the generation (time.time()), if known.
  """

  def __init__(self, path: str = "single", assigned_at: float | None = None):
    self.path, self.assigned_at = path, assigned_at
    self.seconds: dict[str, float] = {}
    self.beside_data: dict[str, float] = {}   # done on a thread during data_setup (`beside`)
    self.prepared: dict[str, float] = {}
    self.compile_cache: dict[str, int] = {}
    self.first_step_at: float | None = None
    # Where training went on from: {"from": "snapshot" | "checkpoint" | "start", "step": N}.
    self.restored: dict = {}
    self._first_step_start: float | None = None
    _listen_to_compilation_cache()

  @contextlib.contextmanager
  def phase(self, name: str):
    t0 = time.perf_counter()
    try:
      yield
    finally:
      self.add(name, time.perf_counter() - t0)

  @contextlib.contextmanager
  def beside(self, name: str):
    """Times `name` (model_build, compile) done on a thread beside data_setup: reported under
    `beside_data`, not as a phase (the phases are the start's critical path; the main thread's
    `compile` phase is then what the compilation still took after the data was ready). A
    compile's cache hits and misses are counted here."""
    t0 = time.perf_counter()
    before = dict(_cache_counts)
    try:
      yield
    finally:
      if name == "compile":
        self.compile_cache = {k: _cache_counts[k] - before[k] for k in before}
      self.beside_data[name] = round(time.perf_counter() - t0, 3)

  def add(self, name: str, seconds: float) -> None:
    self.seconds[name] = round(self.seconds.get(name, 0.0) + max(seconds, 0.0), 3)

  def since_assigned(self, name: str) -> None:
    """Records `name` as the time from the hand-over to now (handover, process_start)."""
    if self.assigned_at is not None:
      self.add(name, time.time() - self.assigned_at)

  def adopt_prepared(self, prepared: "Phases", ready_at: float) -> None:
    """This worker's generation runs on what a standby prepared earlier (`prepared`'s phases)."""
    self.prepared = {**prepared.seconds,
                     **{f"{k}_beside_data": v for k, v in prepared.beside_data.items()}}
    self.compile_cache = dict(prepared.compile_cache)
    if self.assigned_at is not None:
      self.prepared["prepared_before_s"] = round(self.assigned_at - ready_at, 3)

  def start_first_step(self) -> None:
    self._first_step_start = time.perf_counter()

  def first_step_done(self) -> None:
    if self.first_step_at is None and self._first_step_start is not None:
      self.add("first_step", time.perf_counter() - self._first_step_start)
      self.first_step_at = time.time()

  @property
  def complete(self) -> bool:
    return self.first_step_at is not None

  def report(self) -> dict:
    """What the heartbeat carries: path, phases, what was prepared ahead, the total."""
    total = (round(self.first_step_at - self.assigned_at, 3)
             if self.assigned_at is not None and self.first_step_at is not None else None)
    cache = self.compile_cache
    hit = (None if not cache or not (cache.get("hits") or cache.get("misses"))
           else "hit" if not cache.get("misses") else "miss" if not cache.get("hits")
           else "partial")
    return {"path": self.path, "phases": dict(self.seconds),
            "beside_data": dict(self.beside_data), "prepared": dict(self.prepared),
            "compile_cache": hit, "compile_cache_counts": dict(cache),
            "restored": dict(self.restored),
            "assigned_at": self.assigned_at, "first_step_at": self.first_step_at,
            "total_s": total}


class Reporting:
  """A coordinator client whose worker heartbeats carry `phases.report()` once it is complete,
  until one such heartbeat got through; `on_stop` is called when a heartbeat's reply asks the
  worker to stop (`medjax.fault.worker` leaves if the training thread does not)."""

  def __init__(self, client, phases: Phases, on_stop=lambda: None):
    self._client, self._phases, self._on_stop = client, phases, on_stop
    self._sent = False
    self.address = client.address

  def call(self, method: str, msg: dict | None = None):
    if method != "WorkerHeartbeat":
      return self._client.call(method, msg)
    if not self._sent and self._phases.complete and (msg or {}).get("phase") == "training":
      reply = self._client.call(method, {**msg, "phases": self._phases.report()})
      self._sent = True
    else:
      reply = self._client.call(method, msg)
    if (reply or {}).get("stop"):
      self._on_stop()
    return reply
