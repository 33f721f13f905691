"""Tests for medjax.data.partition: coverage, ownership, balance, stratification, re-planning."""

import time

import numpy as np
import pytest

from medjax.data import partition as partition_lib
from medjax.data import synthetic
from medjax.data.cache import placement as placement_lib

HOSTS = ("host-0", "host-1", "host-2", "host-3")


@pytest.fixture(scope="module")
def setup():
  m = synthetic.random_manifest(6000, seed=5)
  p = placement_lib.place(m, HOSTS, seed=2)
  plan = partition_lib.plan_epoch(m, p, seed=9, epoch=0, num_partitions=5, host_batch_size=8)
  return m, p, plan


def real_rows(steps_SxWxB: np.ndarray) -> np.ndarray:
  flat = steps_SxWxB.reshape(-1)
  return flat[flat >= 0]


def check_plan(plan, placement, rows: np.ndarray) -> None:
  """Exactly-once coverage of `rows` and host ownership of every step column."""
  stepped = np.concatenate([real_rows(s) for s in plan.steps])
  assert np.array_equal(np.sort(stepped), np.sort(rows))
  assert np.array_equal(np.sort(np.concatenate(plan.partitions)), np.sort(rows))
  for part, steps in zip(plan.partitions, plan.steps):
    assert np.all(np.diff(part) > 0)
    assert np.array_equal(np.sort(real_rows(steps)), part)
    assert steps.dtype == np.int32
    assert steps.shape[1:] == (placement.num_hosts, plan.host_batch_size)
    host_SxWxB = np.broadcast_to(np.arange(placement.num_hosts)[None, :, None], steps.shape)
    real = steps >= 0
    assert np.array_equal(placement.owner_N[steps[real]], host_SxWxB[real])


def test_covers_train_rows_exactly_once_on_their_hosts(setup):
  m, p, plan = setup
  check_plan(plan, p, m.indices("train"))
  assert plan.epoch == 0 and plan.generation == 0 and plan.hosts == p.hosts
  assert plan.num_partitions == 5
  assert plan.num_steps == sum(s.shape[0] for s in plan.steps)


def test_partition_and_host_balance(setup):
  m, p, plan = setup
  sizes = [len(part) for part in plan.partitions]
  assert max(sizes) - min(sizes) <= 1
  per_host_PxW = np.stack([np.bincount(p.owner_N[part], minlength=len(HOSTS))
                           for part in plan.partitions])
  assert np.all(per_host_PxW.max(0) - per_host_PxW.min(0) <= 1)


def test_partitions_are_stratified(setup):
  m, p, plan = setup
  train = m.indices("train")
  part_N = np.full(len(m), -1)
  for i, part in enumerate(plan.partitions):
    part_N[part] = i

  def counts(key_N, rows):  # [P, K] count per partition and key value
    _, inv = np.unique(key_N[rows], return_inverse=True)
    table = np.zeros((plan.num_partitions, inv.max() + 1), int)
    np.add.at(table, (part_N[rows], inv), 1)
    return table

  def spread(table_PxK):
    return int((table_PxK.max(0) - table_PxK.min(0)).max())

  cell_N = (p.owner_N * 8 + m.groups) * 64 + m.labels
  host_group_N = p.owner_N * 8 + m.groups
  host_label_N = p.owner_N * 64 + m.labels
  # Each host deals its rows sorted by (group, label): every (host, group, label) cell and every
  # (host, group) is split ±1 across partitions; a label spans 7 groups, so ±7 per host.
  assert spread(counts(cell_N, train)) <= 1
  assert spread(counts(host_group_N, train)) <= 1
  assert spread(counts(host_label_N, train)) <= 7
  assert spread(counts(m.groups, train)) <= len(HOSTS)
  # Distribution close to the whole: total variation distance of each partition's label and group
  # mix from the epoch's (a random split of this size is about 0.07 for labels, 0.03 for groups).
  for key_N, limit in ((m.labels, 0.035), (m.groups, 0.005)):
    table = counts(key_N, train)
    whole_K = table.sum(0) / table.sum()
    for counts_K in table:
      assert 0.5 * np.abs(counts_K / counts_K.sum() - whole_K).sum() < limit


def test_padding_is_a_suffix_and_small(setup):
  m, p, plan = setup
  for steps in plan.steps:
    for w in range(len(HOSTS)):
      seq = steps[:, w, :].reshape(-1)  # host w's records in step order
      real = seq >= 0
      assert np.all(real[:real.sum()]), "padding must only follow a host's last real record"
    counts_W = np.bincount(p.owner_N[real_rows(steps)], minlength=len(HOSTS))
    assert steps.shape[0] == -(-counts_W.max() // plan.host_batch_size)
  print(f"\npadding fraction {plan.padding_fraction:.4f}")
  assert plan.padding_fraction < 0.05


def test_deterministic_and_seeded_by_epoch(setup):
  m, p, plan = setup
  again = partition_lib.plan_epoch(m, p, seed=9, epoch=0, num_partitions=5, host_batch_size=8)
  assert again == plan and again.fingerprint() == plan.fingerprint()
  for a, b in zip(plan.steps, again.steps):
    assert np.array_equal(a, b)
  # Host order of the placement does not matter either.
  p2 = placement_lib.place(m, list(reversed(HOSTS)), seed=2)
  assert partition_lib.plan_epoch(m, p2, seed=9, epoch=0, num_partitions=5,
                                  host_batch_size=8) == plan
  next_epoch = partition_lib.plan_epoch(m, p, seed=9, epoch=1, num_partitions=5,
                                        host_batch_size=8)
  other_seed = partition_lib.plan_epoch(m, p, seed=10, epoch=0, num_partitions=5,
                                        host_batch_size=8)
  for other in (next_epoch, other_seed):
    check_plan(other, p, m.indices("train"))
    assert not np.array_equal(other.steps[0], plan.steps[0])
    assert not np.array_equal(other.partitions[0], plan.partitions[0])


def test_replan_remaining_rows_after_host_loss(setup):
  m, p, plan = setup
  done = plan.processed_rows(completed=[0, 1], in_progress=2, step=3)
  remaining = plan.remaining_rows(completed=[0, 1], in_progress=2, step=3)
  assert len(np.intersect1d(done, remaining)) == 0
  assert np.array_equal(np.union1d(done, remaining), m.indices("train"))
  assert len(done) == len(plan.partitions[0]) + len(plan.partitions[1]) + int(
      (plan.steps[2][:3] >= 0).sum())
  survivors = placement_lib.replace_hosts(p, m, HOSTS[:3], seed=2)
  replan = partition_lib.plan_epoch(m, survivors, seed=9, epoch=0, num_partitions=3,
                                    host_batch_size=16, rows=remaining)
  check_plan(replan, survivors, remaining)
  assert replan.generation == 1 and len(replan.hosts) == 3
  # Rows given in any order plan the same.
  shuffled = np.random.default_rng(0).permutation(remaining)
  assert partition_lib.plan_epoch(m, survivors, seed=9, epoch=0, num_partitions=3,
                                  host_batch_size=16, rows=shuffled) == replan


def test_step_index_helpers(setup):
  _, _, plan = setup
  for g in (0, 1, plan.steps_per_partition[0], plan.num_steps - 1):
    p, s = plan.locate(g)
    assert plan.global_step_index(p, s) == g
  with pytest.raises(ValueError, match="outside"):
    plan.locate(plan.num_steps)


def test_partition_steps_shape_and_subset_order(setup):
  m, p, _ = setup
  rows = m.indices("train")[:203]
  steps = partition_lib.partition_steps(rows, p, host_batch_size=8, seed=4)
  counts_W = np.bincount(p.owner_N[rows], minlength=len(HOSTS))
  assert steps.shape == (-(-counts_W.max() // 8), len(HOSTS), 8)
  # A subset keeps the relative order it had in the full set (per-row keys).
  sub = rows[::2]
  sub_steps = partition_lib.partition_steps(sub, p, host_batch_size=8, seed=4)
  for w in range(len(HOSTS)):
    full_seq = real_rows(steps[:, w, :])
    assert np.array_equal(full_seq[np.isin(full_seq, sub)], real_rows(sub_steps[:, w, :]))


def test_paper_scale_plan_is_fast_and_tight():
  m = synthetic.random_manifest(53_420, seed=7)
  p = placement_lib.place(m, [f"host-{i}" for i in range(16)], seed=3)
  start = time.perf_counter()
  plan = partition_lib.plan_epoch(m, p, seed=0, epoch=3, num_partitions=8, host_batch_size=16)
  seconds = time.perf_counter() - start
  print(f"\nplan 53,420 records / 16 hosts / 8 partitions: {seconds:.3f} s, "
        f"padding {plan.padding_fraction:.4f}, {plan.num_steps} steps")
  assert seconds < 1.0
  check_plan(plan, p, m.indices("train"))
  assert plan.padding_fraction < 0.02


def test_errors_name_the_problem(setup):
  m, p, _ = setup
  kw = dict(seed=0, epoch=0, host_batch_size=4)
  with pytest.raises(ValueError, match="num_partitions=0"):
    partition_lib.plan_epoch(m, p, num_partitions=0, **kw)
  with pytest.raises(ValueError, match="host_batch_size=0"):
    partition_lib.plan_epoch(m, p, num_partitions=2, seed=0, epoch=0, host_batch_size=0)
  with pytest.raises(ValueError, match="outside the manifest"):
    partition_lib.plan_epoch(m, p, num_partitions=2, rows=np.array([0, 6000]), **kw)
  with pytest.raises(ValueError, match="more than once"):
    partition_lib.plan_epoch(m, p, num_partitions=1, rows=np.array([1, 1]), **kw)
  with pytest.raises(ValueError, match="only 3 training records.*at most 3"):
    partition_lib.plan_epoch(m, p, num_partitions=4, rows=np.array([1, 2, 3]), **kw)
  with pytest.raises(ValueError, match="nothing left"):
    partition_lib.plan_epoch(m, p, num_partitions=1, rows=np.array([], np.int64), **kw)
  with pytest.raises(ValueError, match="manifest has 10"):
    partition_lib.plan_epoch(synthetic.random_manifest(10), p, num_partitions=1, **kw)
