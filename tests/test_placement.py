"""Tests for medjax.data.cache.placement: balance per stratum, minimal movement, determinism, speed."""

import hashlib
import time

import numpy as np
import pytest

from medjax.data import manifest as manifest_lib
from medjax.data import synthetic
from medjax.data.cache import placement as placement_lib

PAPER_RECORDS, PAPER_HOSTS = 53_420, 16


def hosts_of(w: int) -> list[str]:
  return [f"host-{i}" for i in range(w)]


def per_host_table(placement, key_N: np.ndarray) -> np.ndarray:
  """[K, W] count of rows per (key value, host)."""
  _, inv = np.unique(key_N, return_inverse=True)
  w = placement.num_hosts
  return np.bincount(inv * w + placement.owner_N, minlength=(inv.max() + 1) * w).reshape(-1, w)


def spread(table_KxW: np.ndarray) -> int:
  return int((table_KxW.max(1) - table_KxW.min(1)).max())


@pytest.fixture(scope="module")
def paper_manifest():
  """The paper's cohort shape from the synthetic generator, sampled without pixels."""
  return synthetic.manifest_without_pixels(PAPER_RECORDS, seed=7)


@pytest.fixture(scope="module")
def paper_placement(paper_manifest):
  start = time.perf_counter()
  placement = placement_lib.place(paper_manifest, hosts_of(PAPER_HOSTS), seed=3)
  seconds = time.perf_counter() - start
  print(f"\nplace {PAPER_RECORDS} records over {PAPER_HOSTS} hosts: {seconds:.3f} s")
  assert seconds < 2.0
  return placement


def test_paper_scale_balanced(paper_manifest, paper_placement):
  m, p = paper_manifest, paper_placement
  assert p.hosts == tuple(sorted(hosts_of(PAPER_HOSTS))) and p.generation == 0
  assert p.owner_N.dtype == np.int32 and p.owner_N.shape == (PAPER_RECORDS,)
  assert p.owner_N.min() >= 0 and p.owner_N.max() < PAPER_HOSTS
  stats = placement_lib.load_stats(p, m)
  print(f"\ncost max/mean {stats['cost_max_over_mean']:.5f}, "
        f"count max/mean {stats['count_max_over_mean']:.5f}")
  assert stats["cost_max_over_mean"] <= 1.02
  assert max(stats["count"]) - min(stats["count"]) <= 2  # the sum of ±1 strata
  assert spread(per_host_table(p, m.groups)) <= 1
  assert spread(per_host_table(p, placement_lib.strata(m))) <= 1
  assert stats["max_stratum_spread"] <= 1 and stats["max_group_spread"] <= 1
  train_W = np.bincount(p.owner_N[m.split == "train"], minlength=PAPER_HOSTS)
  assert train_W.max() - train_W.min() <= 1
  # rows_of partitions the manifest.
  rows = np.concatenate([p.rows_of(h) for h in p.hosts])
  assert np.array_equal(np.sort(rows), np.arange(PAPER_RECORDS))
  assert all(np.all(np.diff(p.rows_of(h)) > 0) for h in p.hosts)


def test_removing_a_host_moves_only_its_records(paper_manifest, paper_placement):
  m, p = paper_manifest, paper_placement
  gone = "host-5"
  survivors = [h for h in hosts_of(PAPER_HOSTS) if h != gone]
  q = placement_lib.replace_hosts(p, m, survivors, seed=3)
  assert q.generation == 1 and gone not in q.hosts
  moved_N = placement_lib.moved(p, q)
  fraction = moved_N.mean()
  print(f"\nremove one of {PAPER_HOSTS}: moved fraction {fraction:.5f} (1/W = "
        f"{1 / PAPER_HOSTS:.5f})")
  assert np.array_equal(moved_N, p.owner_names() == gone)
  assert moved_N.sum() == len(p.rows_of(gone))
  assert fraction <= 1.1 / PAPER_HOSTS
  # Exact ±1 per stratum is what placement guarantees after a change; a group sums up to five
  # strata (image counts) and a host's total all of them, so those may drift by a few records.
  assert spread(per_host_table(q, placement_lib.strata(m))) <= 1
  assert spread(per_host_table(q, m.groups)) <= 3
  stats = placement_lib.load_stats(q, m)
  assert stats["cost_max_over_mean"] <= 1.02
  assert max(stats["count"]) - min(stats["count"]) <= 3
  # The departed host's records are spread over many survivors, not dumped on one neighbour.
  assert len(np.unique(q.owner_N[moved_N])) >= PAPER_HOSTS // 2


def test_adding_a_host_moves_records_only_to_it(paper_manifest, paper_placement):
  m, p = paper_manifest, paper_placement
  q = placement_lib.replace_hosts(p, m, hosts_of(PAPER_HOSTS) + ["host-new"], seed=3)
  moved_N = placement_lib.moved(p, q)
  assert np.all(q.owner_names()[moved_N] == "host-new")
  assert moved_N.sum() == len(q.rows_of("host-new"))
  # The newcomer's share is the ideal n / W' (±1), no more.
  assert abs(moved_N.sum() - PAPER_RECORDS / (PAPER_HOSTS + 1)) <= 1
  assert spread(per_host_table(q, placement_lib.strata(m))) <= 1
  assert placement_lib.load_stats(q, m)["cost_max_over_mean"] <= 1.02


def test_host_order_irrelevant_and_deterministic(paper_manifest, paper_placement):
  shuffled = list(np.random.default_rng(0).permutation(hosts_of(PAPER_HOSTS)))
  again = placement_lib.place(paper_manifest, shuffled, seed=3)
  assert again == paper_placement
  assert np.array_equal(again.owner_N, paper_placement.owner_N)
  other_seed = placement_lib.place(paper_manifest, hosts_of(PAPER_HOSTS), seed=4)
  assert not np.array_equal(other_seed.owner_N, paper_placement.owner_N)


def test_baselines_move_more_or_balance_worse(paper_manifest, paper_placement):
  m = paper_manifest
  survivors = [h for h in hosts_of(PAPER_HOSTS) if h != "host-5"]
  modulo = placement_lib.place(m, hosts_of(PAPER_HOSTS), seed=3, method="modulo")
  modulo_moved = placement_lib.moved(
      modulo, placement_lib.replace_hosts(modulo, m, survivors, seed=3)).mean()
  ring = placement_lib.place(m, hosts_of(PAPER_HOSTS), seed=3, method="ring")
  ring_next = placement_lib.replace_hosts(ring, m, survivors, seed=3)
  ring_moved_N = placement_lib.moved(ring, ring_next)
  print(f"\nmoved on removal: modulo {modulo_moved:.3f}, ring {ring_moved_N.mean():.3f}; cost "
        f"max/mean: ring {placement_lib.load_stats(ring, m)['cost_max_over_mean']:.3f}, modulo "
        f"{placement_lib.load_stats(modulo, m)['cost_max_over_mean']:.3f}")
  assert abs(modulo_moved - (PAPER_HOSTS - 1) / PAPER_HOSTS) < 0.02
  assert modulo_moved > 10 / PAPER_HOSTS
  # Plain consistent hashing also moves only the departed host's records (its share, which is
  # uneven), but without the load bound hosts differ far more in load and per stratum.
  assert np.array_equal(ring_moved_N, ring.owner_names() == "host-5")
  assert placement_lib.load_stats(ring, m)["cost_max_over_mean"] > 1.05
  assert placement_lib.load_stats(ring, m)["max_group_spread"] > 50
  assert ring_next.generation == 1 and ring_next.method == "ring"


def test_history_is_a_pure_function_and_keeps_invariants():
  m = synthetic.random_manifest(6000, seed=1)
  history = [hosts_of(8), hosts_of(8)[1:], hosts_of(8)[1:] + ["host-x", "host-y"],
             ["host-y", "host-x"] + hosts_of(8)[3:], ["host-y", "host-x"] + hosts_of(8)[3:]]
  p = placement_lib.place(m, history[0], seed=11)
  for gen, hosts in enumerate(history[1:], start=1):
    q = placement_lib.replace_hosts(p, m, hosts, seed=11)
    moved_N = placement_lib.moved(p, q)
    gone = set(p.hosts) - set(q.hosts)
    joined = set(q.hosts) - set(p.hosts)
    departed_N = np.isin(p.owner_names(), list(gone))
    if not joined:
      assert np.array_equal(moved_N, departed_N)  # only departed hosts' records move
    if not gone:
      assert np.all(np.isin(q.owner_names()[moved_N], list(joined)))
    if not joined and not gone:
      assert not moved_N.any()
    assert q.generation == gen
    assert spread(per_host_table(q, placement_lib.strata(m))) <= 1
    p = q
  again = placement_lib.place_history(m, [list(reversed(h)) for h in history], seed=11)
  assert again == p and again.generation == len(history) - 1


def test_all_hosts_replaced_and_tiny_strata():
  m = synthetic.random_manifest(40, seed=2)  # most strata hold fewer records than there are hosts
  p = placement_lib.place(m, hosts_of(16), seed=0)
  assert spread(per_host_table(p, placement_lib.strata(m))) <= 1
  q = placement_lib.replace_hosts(p, m, ["a", "b", "c"], seed=0)
  assert placement_lib.moved(p, q).all()
  assert spread(per_host_table(q, placement_lib.strata(m))) <= 1
  one = placement_lib.place(m, ["solo"], seed=0)
  assert np.all(one.owner_N == 0)


def test_stable_hash_is_blake2b():
  expected = int.from_bytes(hashlib.blake2b(b"3/host-1/7", digest_size=8).digest(), "little")
  assert int(placement_lib.stable_hash64(["3/host-1/7"])[0]) == expected


def test_load_stats_consistent(paper_manifest, paper_placement):
  stats = placement_lib.load_stats(paper_placement, paper_manifest)
  assert sum(stats["count"]) == PAPER_RECORDS
  assert np.isclose(sum(stats["cost"]), paper_manifest.cost.astype(np.float64).sum())
  assert stats["count_max"] == max(stats["count"])
  assert set(stats["group_spread"]) <= set(manifest_lib.group_names())
  assert any(name.startswith("train/ILV/") for name in stats["stratum_spread"])


def test_errors_name_the_problem():
  m = synthetic.random_manifest(50)
  with pytest.raises(ValueError, match="hosts is empty"):
    placement_lib.place(m, [], seed=0)
  with pytest.raises(ValueError, match="more than once"):
    placement_lib.place(m, ["a", "a"], seed=0)
  with pytest.raises(ValueError, match="string 'a'"):
    placement_lib.place(m, "a", seed=0)
  with pytest.raises(ValueError, match="method 'hash'"):
    placement_lib.place(m, ["a"], seed=0, method="hash")
  with pytest.raises(ValueError, match="vnodes=0"):
    placement_lib.place(m, ["a"], seed=0, vnodes=0)
  p = placement_lib.place(m, ["a", "b"], seed=0)
  with pytest.raises(ValueError, match="seed=0, vnodes=100; pass the same seed"):
    placement_lib.replace_hosts(p, m, ["a"], seed=1)
  with pytest.raises(ValueError, match="manifest has 60"):
    placement_lib.replace_hosts(p, synthetic.random_manifest(60), ["a"], seed=0)
  with pytest.raises(ValueError, match="'c' is not in placement"):
    p.rows_of("c")
  with pytest.raises(ValueError, match="non-empty sequence"):
    placement_lib.place_history(m, [], seed=0)
