"""config.optim.mode='local': replicas that step on their own slices and average periodically."""

import threading
import time

import jax
import numpy as np
import optax
import pytest

from configs import default as default_config
from medjax import config_check
from medjax.fault import layout as layout_lib
from medjax.train import local_sgd
from medjax.train import optim
from medjax.train import state as state_lib
from medjax.train import step as step_lib
from tests.test_model import SHAPES, _batch


def _config(**optim_fields):
  config = default_config.get_config()
  config.model.fusion = "gated"          # compiles faster; the mode does not depend on it
  config.model.modality_dropout = 0.0
  config.model.update(d_model=16, image_channels=(4,), labs_hidden=16, vitals_hidden=8)
  config.optim.mode = "local"
  config.optim.update(optim_fields)
  return config


def _setup(config, devices, steps_per_epoch=100):
  """The inner step and the averaging, driven as the loop drives them: a round ends every
  local_steps steps and at the epoch's end (here every `steps_per_epoch` steps)."""
  mesh = state_lib.make_mesh(config.mesh, devices)
  tx, _ = optim.make(config.optim, 100)
  local = local_sgd.from_config(config.optim, mesh)
  state, built = state_lib.build(config.model, tx, mesh, num_classes=5, shapes=SHAPES, seed=0,
                                 local=local)
  inner = step_lib.make_train_step(built.graphdef, tx, built, mesh, seed=0, local=local)
  rounds = local_sgd.Rounds(local, step_lib.make_average(built, mesh, local),
                            local_sgd.replica_sharding(local, mesh))
  done = [0]

  def train_step(state, batch):
    rounds.take(done[0])
    state, metrics_R = inner(state, batch)
    done[0] += 1
    rounds.stepped(True, np.arange(4))
    if rounds.ends(done[0]) or done[0] % steps_per_epoch == 0:
      state, deferred = rounds.end(state, done[0])
      assert len(deferred) == 0
    return state, local_sgd.fetch_rows([metrics_R])[0]
  return mesh, tx, local, state, built, train_step


def _host(tree):
  return jax.tree.map(np.asarray, tree)


def _close(a, b, **kw):
  """Leaf by leaf, but for the gate's bias: softmax over tokens cancels it, so its gradient is
  rounding noise, which Adam scales up to steps of the learning rate's size."""
  def check(path, x, y):
    if "gate" not in jax.tree_util.keystr(path) or "bias" not in jax.tree_util.keystr(path):
      np.testing.assert_allclose(x, y, err_msg=jax.tree_util.keystr(path), **kw)
  jax.tree_util.tree_map_with_path(check, a, b)


def test_replicas_step_on_their_own_slices_and_average_every_h_steps():
  """Four replicas on 4 devices: between averagings the outer parameters stay put and each
  replica follows its own data; after H steps all four are the outer optimiser's result, which
  for outer SGD at lr 1 without momentum is the replicas' mean."""
  config = _config(replicas=4, local_steps=3, outer_lr=1.0, outer_momentum=0.0)
  mesh, tx, _, state, built, train_step = _setup(config, jax.devices()[:4])
  spec = built.shardings["local"]["params"]
  assert all(s.spec[0] == "data" for s in jax.tree.leaves(spec))
  leaf = jax.tree.leaves(state["local"]["params"])[0]
  assert leaf.shape[0] == 4 and len(leaf.addressable_shards) == 4
  assert leaf.addressable_shards[0].data.shape[0] == 1   # one replica per device
  outer0 = _host(state["params"])
  batches = [_batch(np.random.default_rng(i), n=16) for i in range(3)]
  # By hand: each replica's inner steps (the synchronous step on one replica's quarter) from
  # the same start; then their mean.
  one = _config()
  one.optim.mode = "sync"
  mesh1 = state_lib.make_mesh(one.mesh, jax.devices()[:1])
  _, b1 = state_lib.build(one.model, tx, mesh1, num_classes=5, shapes=SHAPES, seed=0)
  sync_step = step_lib.make_train_step(b1.graphdef, tx, b1, mesh1, seed=0)
  expected = []
  for r in range(4):
    s = b1.create()   # (the step donates its state)
    for batch in batches:
      s, _ = sync_step(s, {f: v[4 * r:4 * r + 4] for f, v in batch.items()})
    expected.append(_host(s["params"]))
  sharded = lambda b: jax.device_put(b, state_lib.batch_sharding(mesh))
  for k, batch in enumerate(batches[:2]):
    state, metrics = train_step(state, sharded(batch))
    assert np.isfinite(float(metrics["loss"]))
  _close(_host(state["params"]), outer0, rtol=0, atol=0)   # no averaging yet
  replicas = _host(state["local"]["params"])
  first = jax.tree.leaves(replicas)[-1]
  assert not np.allclose(first[0], first[1])
  state, _ = train_step(state, sharded(batches[2]))       # step 3: the round's end
  mean = jax.tree.map(lambda *xs: np.mean(xs, axis=0), *expected)
  _close(_host(state["params"]), mean, rtol=2e-4, atol=2e-6)
  for r in range(4):
    _close(jax.tree.map(lambda x: x[r], _host(state["local"]["params"])), mean, rtol=2e-4,
           atol=2e-6)


def test_an_epochs_end_averages_and_the_result_is_the_same_on_1_and_4_devices():
  """The averaging comes at an epoch's end too (evaluation sees one model); and replicas are
  the run's, not the mesh's: 4 replicas on one device give what they give on four, so a run
  restores onto another device count."""
  config = _config(replicas=4, local_steps=16)
  results = []
  for devices in (jax.devices()[:1], jax.devices()[:4]):
    mesh, _, _, state, _, train_step = _setup(config, devices, steps_per_epoch=2)
    start = _host(state["params"])
    for i in range(2):
      batch = jax.device_put(_batch(np.random.default_rng(i), n=16),
                             state_lib.batch_sharding(mesh))
      state, _ = train_step(state, batch)
      if i == 0:
        _close(_host(state["params"]), start, rtol=0, atol=0)
    leaves = jax.tree.leaves(_host(state["local"]["params"]))
    assert all(np.array_equal(x[0], x[3]) for x in leaves)   # averaged at step 2
    assert not all(np.allclose(a, b) for a, b in zip(jax.tree.leaves(_host(state["params"])),
                                                     jax.tree.leaves(start)))
    results.append(_host(state))
  _close(results[0], results[1], rtol=1e-4, atol=1e-6)


def test_the_mode_is_checked_and_the_launcher_fixes_the_replica_count():
  config = _config()
  config.optim.mode = "async"
  assert any("optim.mode" in p for p in config_check.problems(config))
  config = _config(local_steps=0)
  assert any("optim.local_steps" in p for p in config_check.problems(config))
  config = _config(late_after_s=0.5)
  assert not config_check.problems(config)
  config.optim.mode = "sync"
  assert any("optim.late_after_s" in p and "'local' only" in p
             for p in config_check.problems(config))
  config = _config(ema_epochs=1.0)             # replicas average their parameters each round
  assert any("optim.ema_epochs" in p and "'sync' only" in p
             for p in config_check.problems(config))
  config.optim.mode = "sync"
  assert not config_check.problems(config)
  config = _config()
  config.fault.local_hosts = 2
  layout_lib.resolve_replicas(config, layout_lib.Layout(2, 1, 'cpu', ''))
  assert config.optim.replicas == 4          # 2 hosts x 2 workers x 1 device
  config.optim.replicas = 3
  layout_lib.resolve_replicas(config, layout_lib.Layout(1, 1, 'cpu', ''))
  assert config.optim.replicas == 3          # explicit: kept
  sync = default_config.get_config()
  layout_lib.resolve_replicas(sync, layout_lib.Layout(2, 1, 'cpu', ''))
  assert sync.optim.replicas == 0
  mesh = state_lib.make_mesh(sync.mesh, jax.devices()[:1])
  assert local_sgd.from_config(sync.optim, mesh) is None
  with pytest.raises(Exception, match="does not divide among"):
    local_sgd._split({"x": np.zeros((6, 2))}, 4)


def test_the_inner_step_has_no_collective_and_the_averaging_weighs_by_steps_trained():
  """Processes do not wait for each other between averagings: the compiled inner step on 2
  devices holds no collective. A replica cut short (it trained a third of the steps the other
  did in the round) weighs a third as much in the round's mean; a round in which no replica
  trained averages plainly (not towards zero)."""
  import re
  config = _config(replicas=2, local_steps=3, outer_lr=1.0, outer_momentum=0.0)
  mesh = state_lib.make_mesh(config.mesh, jax.devices()[:2])
  tx, lr_schedule = optim.make(config.optim, 100)
  local = local_sgd.from_config(config.optim, mesh)
  state, built = state_lib.build(config.model, tx, mesh, num_classes=5, shapes=SHAPES, seed=0,
                                 local=local)
  inner = step_lib.make_train_step(built.graphdef, tx, built, mesh, seed=0, local=local,
                                   lr_schedule=lr_schedule)
  batch = jax.device_put(_batch(np.random.default_rng(0), n=16), state_lib.batch_sharding(mesh))
  hlo = inner.lower(state, batch).compile().as_text()
  assert not re.findall(r" (all-gather|all-reduce|collective-permute|all-to-all|reduce-scatter)"
                        r"(-start)?\(", hlo)
  state, _ = inner(state, batch)
  replicas = _host(state["local"]["params"])
  average = step_lib.make_average(built, mesh, local)
  trained = jax.device_put(np.array([3, 1], np.float32), local_sgd.replica_sharding(local, mesh))
  state = average(state, trained, np.int32(7), np.int32(5))
  expected = jax.tree.map(lambda r: 0.75 * r[0] + 0.25 * r[1], replicas)
  _close(_host(state["params"]), expected, rtol=1e-5, atol=1e-6)
  assert int(state["step"]) == 7
  # Every replica's schedule (and Adam's bias correction) goes on from the position given.
  counts = optax.tree_utils.tree_get_all_with_path(state["local"]["opt"], "count")
  assert counts and all(np.asarray(c).tolist() == [5, 5] for _, c in counts)
  state, metrics = inner(state, batch)
  np.testing.assert_allclose(np.asarray(metrics["learning_rate"]), [lr_schedule(6)] * 2)
  replicas = _host(state["local"]["params"])
  none = jax.device_put(np.zeros(2, np.float32), local_sgd.replica_sharding(local, mesh))
  state = average(state, none, np.int32(8), np.int32(8))
  _close(_host(state["params"]), jax.tree.map(lambda r: r.mean(axis=0), replicas), rtol=1e-5,
         atol=1e-6)


class _FakeExchange:
  processes = 2

  def __init__(self):
    self.done = set()

  def finished(self, start):
    return int(start in self.done)


def test_a_late_process_trains_until_late_after_s_past_the_quorum_then_skips_the_round():
  local = local_sgd.Local(replicas=2, every=4, outer=None, late_after_s=1.0)
  now = [0.0]
  rounds = local_sgd.Rounds(local, None, None, exchange=_FakeExchange(), clock=lambda: now[0])
  assert rounds.quorum == 1 and rounds.cuts
  taken = []
  for step in range(4):
    if step == 1:
      rounds.exchange.done.add(0)   # the other process finished the round started at step 0
    now[0] += 0.6
    t = rounds.take(step)
    taken.append(t)
    rounds.stepped(t, np.array([10 * step, 10 * step + 1, -1]))
    assert rounds.inside
  # Step 0 always trains; seen done at step 1 (t=1.2), still within 1 s at step 2 (t=1.8);
  # past it at step 3 (t=2.4): skipped, its records deferred.
  assert taken == [True, True, True, False]
  assert rounds.deferred == [30, 31] and rounds.trained == 3 and rounds.steps == 4
  # Without an exchange (one process, or late_after_s 0) every step trains.
  plain = local_sgd.Rounds(local, None, None)
  assert all(plain.take(s) for s in range(8)) and not plain.cuts


class _KeyValueStore:
  """jax.distributed's key-value client, in memory, for processes played by threads."""

  def __init__(self):
    self.kv, self.changed = {}, threading.Condition()

  def key_value_set(self, key, value):
    with self.changed:
      assert key not in self.kv, key
      self.kv[key] = value
      self.changed.notify_all()

  def key_value_dir_get(self, prefix):
    with self.changed:
      return [(k, v) for k, v in self.kv.items() if k.startswith(prefix)]

  def blocking_key_value_get(self, key, timeout_ms):
    with self.changed:
      assert self.changed.wait_for(lambda: key in self.kv, timeout_ms / 1000), key
      return self.kv[key]

  def key_value_delete(self, key):
    with self.changed:
      del self.kv[key]


@pytest.mark.parametrize("processes", [2, 3])
def test_a_paused_process_costs_the_others_throughput_not_a_stall_and_every_record_trains_once(
    processes):
  """Processes (threads over one key-value store) step a 12-step plan segment, rounds of 4.
  Process 1 freezes for 1 s at the start of the second round. The others reach that round's
  end, wait late_after_s, and train on to the segment's end instead of waiting; there all agree
  to end the round. Process 1, back, is cut short, skips up to there, and the records of the
  steps it skipped are every process's deferred rows: each step's records trained by its
  process or deferred, once. A save the last process wanted inside the round (decided without a
  collective) is every process's at its end."""
  local = local_sgd.Local(replicas=processes, every=4, outer=None, late_after_s=0.2)
  store = _KeyValueStore()
  sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  keep = lambda state, trained, step, position: state
  trained, deferred, counts, stops, saves = {}, {}, {}, {}, {}
  last = processes - 1

  def process(p):
    exchange = local_sgd.Exchange(store, generation=1, process=p, processes=processes,
                                  timeout_s=10)
    rounds = local_sgd.Rounds(local, keep, sharding, exchange=exchange)
    trained[p], deferred[p], saves[p] = [], [], []
    for step in range(12):
      if p == 1 and step == 4:
        time.sleep(1.0)
      rows = np.array([100 * p + step])
      took = rounds.take(step)
      trained[p] += [int(rows[0])] if took else []
      rounds.stepped(took, rows)
      if p == last and step == 5:
        rounds.save_wanted = True
      time.sleep(0.005)
      ended = rounds.ends(step + 1) or (step == 11 and rounds.ends(step + 1, segment_end=True))
      if step == 11 and not ended and rounds.steps:
        ended = True   # the loop's epoch end
      if ended:
        stops.setdefault(p, []).append(rounds.stop or step + 1)
        _, d = rounds.end(None, step + 1)
        deferred[p] += d.tolist()
        saves[p].append(rounds.save_wanted)
    counts[p] = rounds.counts

  threads = [threading.Thread(target=process, args=(p,)) for p in range(processes)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(30)
  fast = [p for p in range(processes) if p != 1]
  assert all(counts[p] == counts[0] and stops[p] == [4, 12] for p in range(processes)), (
      counts, stops)
  assert all(deferred[p] == deferred[0] for p in range(processes)) and deferred[0], deferred
  assert sorted(sum(trained.values(), []) + deferred[0]) == sorted(
      100 * p + s for p in range(processes) for s in range(12))
  # The others trained all 12 of their steps, 4 of them past the second round's end.
  assert all(trained[p] == [100 * p + s for s in range(12)] for p in fast), trained
  assert counts[0]["steps_extended"] == 4 * len(fast)
  assert counts[0]["rounds_extended"] == 1 and counts[0]["rounds_cut"] == 1
  assert all(saves[p] == [False, True] for p in range(processes)), saves
  assert not store.kv.keys() - {f"medjax/rounds/1/4.end/{p}" for p in range(processes)}


def test_the_ledger_counts_a_generations_steps_across_processes_that_skipped_some(tmp_path):
  """A late replica's process skips steps the others trained: the generation still executed
  them. Up to where the process that got least far stopped, every process's steps count."""
  from medjax.runtime import ledger
  for process, steps in ((0, [1, 2, 3, 4, 5, 6]), (1, [1, 2, 5])):
    w = ledger.Writer(str(tmp_path), 1, process)
    for s in steps:
      w.write(s, 0, np.array([s * 10 + process]))
    w.close()
  assert ledger.steps_by_generation(str(tmp_path)) == {1: [1, 2, 3, 4, 5]}


def test_the_schedule_follows_the_epochs_records_not_the_steps_a_replica_took():
  """At a round's end the inner schedule stands at the epochs done plus the share of this
  epoch's training records trained, in the plan's steps: steps a fast replica trained on past
  its peers, or an epoch's catch-up, do not run it ahead (validation rows do not count)."""
  import types
  train = np.arange(0, 200, 2)                       # 100 training rows among 200
  processed = np.zeros(200, bool)
  processed[1::2] = True                             # validation rows: not training progress
  cursor = types.SimpleNamespace(epoch=3, processed_N=processed)
  assert local_sgd.schedule_position(cursor, train, steps_per_epoch=40) == 120
  processed[train[:25]] = True
  assert local_sgd.schedule_position(cursor, train, steps_per_epoch=40) == 130
  processed[train] = True                            # the epoch's end, however many steps it took
  assert local_sgd.schedule_position(cursor, train, steps_per_epoch=40) == 160
  assert local_sgd.schedule_position(cursor, train, steps_per_epoch=40, grad_accum=4) == 40
