"""config.optim.mode='local': local SGD with periodic averaging, in DiLoCo's form.

R replicas (config.optim.replicas; 0: the mesh's 'data' axis) each take inner steps with the
inner optimiser (the same AdamW and schedule as 'sync') on their own slice of every global batch;
every config.optim.local_steps global steps, and at the end of every plan segment (an epoch's
end, so that validation and the test split see one model), the loop ends the round: the outer
optimiser (SGD with Nesterov momentum, DiLoCo's choice: Douillard et al. 2023) takes the mean
delta, outer params minus the replicas' mean, as its gradient, and every replica starts again
from the result.

The replicas are one more leading axis of the state, sharded over the mesh's 'data' axis when it
divides it, replicated otherwise. Two jitted programs over global arrays: the inner step, which
has no collective (each device updates its own replicas and reports their metrics; processes do
not wait for each other between averagings), and the averaging, whose weighted mean is the
round's only all-reduce. Same ledger, lineage and checkpoints as 'sync'.

Late replicas (config.optim.late_after_s > 0, several processes): once `quorum` other processes
have reached a round's end (posted through jax.distributed's key-value store, `Exchange`), a
process still inside it waits at most late_after_s more, then skips the rest of its round's steps
(`Rounds.take`). A process at the round's end waits at most late_after_s for the others; while
any is missing it trains on past the end, checking after every step, so that a stopped or slow
peer costs it throughput, not a stall; once all are in (or at a plan segment's end, which no round
crosses this way) the processes agree on the furthest step any of them reached, and those behind
skip up to it (`Rounds.ends`). The averaging weighs each replica's delta by the steps it trained
in the round, and sets every replica's learning-rate schedule to the epoch's progress in records
(`schedule_position`), however many steps it took. The records of the skipped steps go back to
their epoch: the round's end (or a segment's end inside the round: `Rounds.settle`) unmarks
them in the lineage, and when the epoch's plan is done a catch-up segment trains them (`loop`),
so every record still trains exactly once per epoch. Checkpoints and snapshots then fall on
round boundaries only, where the lineage knows every skip. A process stopped for good (SIGSTOP)
holds the others at the plan segment's end until the coordinator's hang detection replaces it.

State: {'params': the outer (averaged) parameters, which evaluation and prediction use,
'fill', 'opt': the outer optimiser's state, 'local': {'params', 'opt'} stacked over replicas,
'step'}.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from medjax import errors

MODES = ("sync", "local")


@dataclasses.dataclass(frozen=True)
class Local:
  """What the 'local' mode's state and programs need beyond 'sync''s."""
  replicas: int
  every: int                    # global steps between averagings
  outer: optax.GradientTransformation
  late_after_s: float = 0.0     # 0: a round waits for every replica
  quorum: int = 0               # processes done before the rest may be cut short (0: half)


def from_config(optim_config, mesh) -> Local | None:
  """Local for config.optim.mode='local' on `mesh`, None for 'sync'."""
  mode = optim_config.get("mode", "sync")
  if mode not in MODES:
    raise errors.InputError(f"config.optim.mode={mode!r}: use one of {MODES}")
  if mode == "sync":
    return None
  replicas = int(optim_config.get("replicas", 0)) or mesh.shape["data"]
  outer = optax.sgd(optim_config.outer_lr, momentum=optim_config.outer_momentum or None,
                    nesterov=optim_config.outer_momentum > 0)
  return Local(replicas, int(optim_config.local_steps), outer,
               float(optim_config.get("late_after_s", 0.0)),
               int(optim_config.get("late_quorum", 0)))


def init(local: Local, params, tx: optax.GradientTransformation) -> dict:
  """The state's 'opt' (outer) and 'local' entries for fresh `params`."""
  stack = lambda tree: jax.tree.map(
      lambda x: jnp.broadcast_to(x, (local.replicas, *jnp.shape(x))), tree)
  return {"opt": local.outer.init(params),
          "local": {"params": stack(params), "opt": stack(tx.init(params))}}


def over_data(local: Local, mesh) -> bool:
  """Whether the replicas are sharded over 'data' (its size divides their count): each device,
  hence each process, then holds replicas of its own."""
  return local.replicas % mesh.shape["data"] == 0


def replica_sharding(local: Local, mesh, inner_spec: P = P()) -> NamedSharding:
  """The leading replica axis over 'data' when it divides it, then `inner_spec`."""
  axis = "data" if over_data(local, mesh) else None
  return NamedSharding(mesh, P(axis, *inner_spec))


def _split(batch: dict, replicas: int) -> dict:
  def split(x):
    if x.shape[0] % replicas:
      raise errors.InputError(
          f"config.data.batch_size={x.shape[0]} does not divide among "
          f"config.optim.replicas={replicas}; make it a multiple")
    return x.reshape(replicas, x.shape[0] // replicas, *x.shape[1:])
  return jax.tree.map(split, batch)


def make_inner(update, local: Local, mesh, *, base_key, lr_schedule=None, grad_accum: int = 1):
  """state, batch -> (state, metrics per replica [R]): one inner step on every replica, no
  collective. `update(params, opt, fill, batch, rng) -> (params, opt, metrics)` is the
  synchronous step's update, here one replica's.

  Where the replicas are sharded over 'data', each device steps its own under shard_map: left to
  the SPMD partitioner, the replica-batched convolutions' gradients came out all-gathered, a
  collective per step that held every process to the slowest."""
  replicas_step = jax.vmap(update, in_axes=(0, 0, None, 0, 0))
  if over_data(local, mesh) and mesh.shape["data"] > 1:
    replicas_step = jax.shard_map(
        replicas_step, mesh=mesh, in_specs=(P("data"), P("data"), P(), P("data"), P("data")),
        out_specs=P("data"), axis_names={"data"}, check_vma=False)

  def step(state, batch):
    rng = jax.random.fold_in(base_key, state["step"])
    keys = jax.vmap(lambda r: jax.random.fold_in(rng, r))(jnp.arange(local.replicas))
    params_R, opt_R, metrics_R = replicas_step(
        state["local"]["params"], state["local"]["opt"], state["fill"],
        _split(batch, local.replicas), keys)
    done = state["step"] + 1
    if lr_schedule is not None:
      # Each replica's own schedule position (`make_average` sets it at a round's end).
      counted = optax.tree_utils.tree_get(opt_R, "ScaleByScheduleState")
      position = (jnp.broadcast_to(done // grad_accum, (local.replicas,)) if counted is None
                  else counted.count)
      metrics_R["learning_rate"] = lr_schedule(position)
    return {**state, "local": {"params": params_R, "opt": opt_R}, "step": done}, metrics_R

  return step


def make_average(local: Local):
  """state, trained_R, global_step, position -> state: the round's end. The outer optimiser
  steps on outer params minus the replicas' mean weighted by the steps each trained in the round
  (`trained_R`; equal counts, or none at all: the plain mean), and every replica restarts from
  its result, its inner optimiser's update count set to `position` (`schedule_position`, in
  updates): a replica that trained on past its peers, or the extra steps of an epoch's catch-up,
  move the learning-rate schedule only as far as the epoch's progress."""

  def average(state, trained_R, global_step, position):
    total = jnp.sum(trained_R).astype(jnp.float32)
    w_R = jnp.where(total > 0, trained_R.astype(jnp.float32) / jnp.maximum(total, 1.0),
                    1.0 / local.replicas)
    params_R = state["local"]["params"]
    delta = jax.tree.map(
        lambda o, p: o - jnp.tensordot(w_R, p.astype(jnp.float32), axes=1).astype(o.dtype),
        state["params"], params_R)
    updates, outer_opt = local.outer.update(delta, state["opt"], state["params"])
    outer = optax.apply_updates(state["params"], updates)
    params_R = jax.tree.map(lambda o, p: jnp.broadcast_to(o, p.shape).astype(p.dtype),
                            outer, params_R)
    opt_R = optax.tree_utils.tree_set(
        state["local"]["opt"], count=jnp.full((local.replicas,), position, jnp.int32))
    return {**state, "params": outer, "opt": outer_opt,
            "local": {"params": params_R, "opt": opt_R},
            "step": jnp.asarray(global_step, state["step"].dtype)}

  return average


def host_metrics(fetched: list[dict]) -> list[dict]:
  """Per-replica metrics as fetched (`fetch_local`: this process's replicas) -> one row of
  scalars per step: loss and accuracy weighted by each replica's examples."""
  rows = []
  for m in fetched:
    w = np.asarray(m["weight"], np.float64)
    total = max(float(w.sum()), 1e-9)
    row = {k: float(np.sum(np.asarray(m[k], np.float64) * w) / total)
           for k in ("loss", "accuracy")}
    row["weight"] = float(w.sum())
    row["grad_norm"] = float(np.sqrt(np.mean(np.square(np.asarray(m["grad_norm"], np.float64)))))
    if "learning_rate" in m:
      row["learning_rate"] = float(np.asarray(m["learning_rate"]).ravel()[0])
    rows.append(row)
  return rows


def fetch_rows(metrics: list[dict]) -> list[dict]:
  """The reporter's fetch in 'local' mode: one row of scalars per step, from this process's
  replicas (the chief's rows in metrics.jsonl are its replicas')."""
  return host_metrics(fetch_local(metrics))


def fetch_local(tree):
  """`tree`'s arrays copied to the host, each as this process's part of it (the replicas it
  holds, in order; a whole array where it is fully addressable): no collective."""
  def local(x):
    if getattr(x, "is_fully_addressable", True):
      return np.asarray(jax.device_get(x))
    parts = {}
    for s in x.addressable_shards:
      parts.setdefault(s.index[0].start or 0, s.data)
    return np.concatenate([np.asarray(parts[k]) for k in sorted(parts)])
  return jax.tree.map(local, tree)


class Exchange:
  """Who reached which round's end, and the round's records, through jax.distributed's
  key-value store (every process posts its own; a round's keys start with the global step it
  started at)."""

  def __init__(self, client, *, generation: int, process: int, processes: int,
               timeout_s: float, poll_s: float = 0.002):
    self.client, self.process, self.processes = client, process, processes
    self.prefix, self.timeout_ms = f"medjax/rounds/{generation}", int(timeout_s * 1000)
    self.poll_s = poll_s

  def _key(self, key: str, process: int) -> str:
    return f"{self.prefix}/{key}/{process}"

  def finished(self, start: int) -> int:
    """Processes other than this one that reached the end of the round started at `start`
    (no wait)."""
    entries = self.client.key_value_dir_get(f"{self.prefix}/{start}/")
    return sum(1 for k, _ in entries if not k.endswith(f"/{self.process}"))

  def wait_finished(self, start: int, timeout_s: float) -> bool:
    """Whether every other process reached the round's end within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while self.finished(start) < self.processes - 1:
      if time.monotonic() >= deadline:
        return False
      time.sleep(self.poll_s)
    return True

  def post(self, key, record: dict) -> None:
    self.client.key_value_set(self._key(key, self.process), json.dumps(record))

  def gather(self, key) -> list[dict]:
    """Every process's record under `key` (waiting for those not posted yet)."""
    return [json.loads(self.client.blocking_key_value_get(self._key(key, p), self.timeout_ms))
            for p in range(self.processes)]

  def forget(self, key) -> None:
    self.client.key_value_delete(self._key(key, self.process))


def exchange_for_run(local: Local, mesh, *, generation: int,
                     timeout_s: float) -> Exchange | None:
  """The key-value exchange where late replicas may be cut short: several processes, each
  holding its own replicas, and config.optim.late_after_s > 0."""
  if (local.late_after_s <= 0 or jax.process_count() == 1
      or not over_data(local, mesh)):
    return None
  from jax._src import distributed  # pylint: disable=import-outside-toplevel
  return Exchange(distributed.global_state.client, generation=generation,
                  process=jax.process_index(), processes=jax.process_count(),
                  timeout_s=timeout_s)


class Rounds:
  """The host's side of the rounds: whether this process trains its next step, when a round
  ends, and the averaging with who trained what.

  Args:
    local: the mode's settings.
    average: the jitted `make_average` program.
    trained_sharding: `replica_sharding(local, mesh)`, for the per-replica step counts.
    exchange: where late replicas may be cut (`exchange_for_run`), else None.
    clock: monotonic seconds (tests pass their own).
  """

  def __init__(self, local: Local, average, trained_sharding, *, exchange: Exchange | None = None,
               clock=time.monotonic):
    self.local, self.average, self.trained_sharding = local, average, trained_sharding
    self.exchange, self.clock = exchange, clock
    # Other processes done before the rest may be cut: late_quorum, or half of them (at least 1).
    self.others = exchange.processes - 1 if exchange else 0
    self.quorum = (min(local.quorum, self.others) if local.quorum
                   else max((self.others + 1) // 2, 1))
    self.save_wanted = self.preempt_wanted = False
    self._mine: list[str] = []        # this process's keys in the exchange not yet forgotten
    # Run-wide (every process's records of every round): the same in every process.
    self.counts = {"rounds": 0, "rounds_cut": 0, "steps_skipped": 0, "records_deferred": 0,
                   "rounds_extended": 0, "steps_extended": 0}
    self._reset()

  def _reset(self) -> None:
    self.start = None         # global step the current round started at
    self.steps = self.trained = 0
    self.deferred: list[int] = []   # this process's rows of the steps it skipped
    self._seen = None                # when `quorum` others were first seen done
    self._cut = False
    self._settles = 0                # segment ends settled in the round
    self._reached = None             # the global step at which this process reached the end
    self._past = 0                   # steps it trained past the end, waiting for the others
    self.stop = None                 # the step every process agreed the round ends at
    self._records = None             # every process's final records, where the agreement had them

  @functools.cached_property
  def _held(self) -> int:
    """How many replicas this process holds (the sharding is the run's: counted once)."""
    shape = (self.local.replicas,)
    return len({r for index in self.trained_sharding.addressable_devices_indices_map(shape).values()
                for r in range(*index[0].indices(shape[0]))})

  @property
  def cuts(self) -> bool:
    """Whether rounds may be cut (saves then wait for a round's end)."""
    return self.exchange is not None

  @property
  def inside(self) -> bool:
    """Inside a round that may still be cut: no checkpoint or snapshot here."""
    return self.cuts and self.steps > 0

  def take(self, global_step: int) -> bool:
    """Whether this process trains the step after `global_step`: False for the rest of a round
    once `quorum` other processes reached its end more than late_after_s ago, and for the steps
    up to where the others agreed to end it; True past its end while it waits for the others."""
    if self.start is None:
      self.start = global_step
    if self.stop is not None:
      return False
    if not self.cuts or self.steps == 0 or self._reached is not None:
      return True   # a round's first step always trains: each round moves every process on
    if self._cut:
      return False
    if self._seen is None:
      if self.exchange.finished(self.start) < self.quorum:
        return True
      self._seen = self.clock()
    self._cut = self.clock() - self._seen >= self.local.late_after_s
    return not self._cut

  def stepped(self, trained: bool, rows_b: np.ndarray) -> None:
    """One global step went by; this process trained it or skipped it (its records `rows_b`,
    -1: padding, then wait for the epoch's catch-up)."""
    self.steps += 1
    if trained:
      self.trained += 1
      self._past += self._reached is not None
    else:
      self.deferred.extend(int(r) for r in np.asarray(rows_b).ravel() if r >= 0)

  def ends(self, global_step: int, *, segment_end: bool = False) -> bool:
    """Whether the round ends after `global_step` (the loop then calls `end`): every
    config.optim.local_steps global steps. Where late replicas may be cut, a process there posts
    that it got there and waits at most late_after_s for the others; while any is missing it
    trains on (False), asking again after every step. Once all are in, or at a plan segment's end
    (`segment_end`: the round goes no further), every process posts the step it reached and the
    round ends at the furthest: those behind skip up to it (`take`)."""
    if not self.steps:
      return False
    if self.stop is not None:
      return global_step >= self.stop
    due = global_step % self.local.every == 0
    if self.exchange is None:
      return due
    if self._reached is None:
      if not due:
        return False
      self._reached = global_step
      self._post(str(self.start), {})
      if self.exchange.wait_finished(self.start, self.local.late_after_s):
        return self._agree(global_step)
      return False
    if segment_end or self.exchange.finished(self.start) >= self.others:
      return self._agree(global_step)
    return False

  def _record(self) -> dict:
    return {"steps": self.steps, "trained": self.trained, "past": self._past,
            "deferred": self.deferred, "save": self.save_wanted, "preempt": self.preempt_wanted}

  def _agree(self, global_step: int) -> bool:
    records = self._exchange(f"{self.start}.stop", {**self._record(), "at": global_step})
    self.stop = max(r["at"] for r in records)
    # Where every process stopped there, nobody skips more: these records are the round's.
    self._records = records if all(r["at"] == self.stop for r in records) else None
    return global_step >= self.stop

  def end(self, state, global_step: int, position: int | None = None):
    """The averaging; returns (state, rows every process skipped in the round). `position`: the
    inner optimisers' schedule position after it, in updates (`schedule_position`; None:
    `global_step`)."""
    start, deferred, records = self.start, [], self._records
    if self.exchange is not None and records is None:
      records = self._exchange(f"{start}.end", self._record())
    # Each of this process's replicas weighs the steps it trained in the round: equal for all
    # replicas unless a round was cut, so a run restored inside a round averages as the
    # uninterrupted one does (examples would differ by the padding before the restore).
    trained = jax.make_array_from_process_local_data(
        self.trained_sharding, np.full(self._held, self.trained, np.float32),
        (self.local.replicas,))
    state = self.average(state, trained, np.int32(global_step),
                         np.int32(global_step if position is None else position))
    if records is not None:
      # A save one process wanted inside the round (decided without a collective: processes
      # may be at different steps there) is every process's at its end.
      self.save_wanted = any(r["save"] for r in records)
      self.preempt_wanted = any(r["preempt"] for r in records)
      deferred = [r for rec in records for r in rec["deferred"]]
      late = sum(r["trained"] < r["steps"] for r in records)
      past = sum(r["past"] for r in records)
      self.counts["steps_skipped"] += sum(r["steps"] - r["trained"] for r in records)
      self.counts["steps_extended"] += past
      self.counts["rounds_extended"] += past > 0
      if late:
        self.counts["rounds_cut"] += 1
        self.counts["records_deferred"] += len(deferred)
        logging.info("round from step %d: %d of %d processes cut short, %d records deferred to "
                     "the epoch's catch-up; the others trained %d steps past its end while "
                     "they waited", start, late, len(records), len(deferred), past)
    self.counts["rounds"] += 1
    self._reset()
    return state, np.asarray(deferred, np.int64)

  def settle(self) -> np.ndarray:
    """A plan segment's end inside a round that may be cut: every process's records skipped in
    the round so far, exchanged without averaging, so that the epoch's catch-up can plan them
    while the round goes on (ending it there would make each catch-up a short round)."""
    if self.exchange is None or not self.steps:
      return np.zeros(0, np.int64)
    key = f"{self.start}.{self._settles}"
    self._settles += 1
    deferred = [r for rec in self._exchange(key, {"deferred": self.deferred})
                for r in rec["deferred"]]
    self.counts["records_deferred"] += len(deferred)
    self.deferred = []
    return np.asarray(deferred, np.int64)

  def _post(self, key: str, record: dict) -> None:
    self.exchange.post(key, record)
    self._mine.append(key)

  def _exchange(self, key: str, record: dict) -> list[dict]:
    """Posts this process's record under `key` and gathers every process's; then forgets this
    process's earlier keys (every process posted this one after reading those)."""
    self._post(key, record)
    records = self.exchange.gather(key)
    for old in self._mine[:-1]:
      self.exchange.forget(old)
    self._mine = [key]
    return records


def schedule_position(cursor, train_rows: np.ndarray, steps_per_epoch: int,
                      grad_accum: int = 1) -> int:
  """Where the inner optimisers' learning-rate schedule stands at a round's end, in updates:
  the epochs done plus this epoch's share of its training records trained, in the plan's steps
  per epoch. In a run no replica cut short this is the global step up to partitions' padding; a
  replica that trained on past its peers, or an epoch's catch-up, does not run the schedule
  ahead of the data (it counted replica steps: the fast replica of a run with a slowed peer
  spent its second half at the schedule's floor)."""
  done = int(np.count_nonzero(cursor.processed_N[train_rows]))
  steps = cursor.epoch * steps_per_epoch + done * steps_per_epoch // max(1, len(train_rows))
  return steps // grad_accum


def catch_up(cursor, data) -> bool:
  """At a plan segment's end: where late replicas left records of the epoch untrained, a new
  segment of the same epoch plans just those (True); else the epoch is done (False)."""
  left = int(np.sum(~cursor.processed_N[data.manifest.indices("train")]))
  if not left:
    return False
  logging.info("epoch %d: catching up %d records that late replicas skipped", cursor.epoch, left)
  cursor.new_segment(epoch=cursor.epoch, placement=data.placement_id, hosts=data.placement.hosts,
                     base_N=cursor.processed_N.copy())
  return True
