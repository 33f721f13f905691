"""Placement: which host owns (caches and trains on) each manifest row.

Ownership is consistent hashing with bounded loads, applied per stratum. A stratum is (split,
modality group, min(num_images, 4)): records in one stratum cost about the same to decode and
train on, so giving every host the same count (±1) of every stratum balances each host's record
count per modality group, per split (so training steps need little padding) and expected cost.

Hosts and records sit on a hash ring (positions from blake2b, never Python's salted `hash()`);
each host has `vnodes` virtual nodes. Within a stratum every host has an exact quota (n // W, plus
one for n % W hosts) and records, in ring order, go clockwise to the first host with room left.

When the host set changes, `replace_hosts` keeps every record whose owner is still present where
it is, unless that owner is over its new quota (only possible when hosts join); records of
departed hosts and released surplus walk clockwise to the next host with room. Removing a host
therefore moves exactly that host's records, the ideal 1/W, and keeps all other caches valid;
adding one moves records only to the newcomer, about n / W' of them.

A placement is a pure function of (manifest, seed, vnodes, host history); see `place_history`.
`method='ring'` (plain consistent hashing, no load bound) and `method='modulo'` (hash mod W) are
baselines for the cache study; they re-place from scratch on every host-set change.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any, Iterable, Sequence

import numpy as np

from medjax.data import manifest as manifest_lib

METHODS = ("bounded", "ring", "modulo")
# Strata distinguish 0..4 images; records with more images join the 4-image stratum.
MAX_STRATUM_IMAGES = 4


@dataclasses.dataclass(frozen=True)
class Placement:
  """Owner of every manifest row for one generation of the host set.

  Attributes:
    hosts: this generation's hosts, sorted.
    owner_N: (N,) int32 index into `hosts`, one per manifest row (all splits).
    generation: 0 for the initial placement, +1 per `replace_hosts`.
    method: 'bounded' (default), 'ring' or 'modulo'.
    seed: the seed of the hash positions (replace_hosts must be given the same one).
    vnodes: virtual nodes per host on the ring.
  """
  hosts: tuple[str, ...]
  owner_N: np.ndarray = dataclasses.field(repr=False)
  generation: int
  method: str = "bounded"
  seed: int | None = None
  vnodes: int = 100

  def __eq__(self, other: object) -> bool:
    if not isinstance(other, Placement):
      return NotImplemented
    return (self.hosts == other.hosts and self.generation == other.generation
            and self.method == other.method and self.seed == other.seed
            and self.vnodes == other.vnodes and np.array_equal(self.owner_N, other.owner_N))

  @property
  def num_hosts(self) -> int:
    return len(self.hosts)

  def host_index(self, host: str) -> int:
    """Index of `host` in `hosts`; ValueError naming the hosts when it is not one of them."""
    try:
      return self.hosts.index(host)
    except ValueError:
      raise ValueError(f"host {host!r} is not in placement generation {self.generation} "
                       f"(hosts: {', '.join(self.hosts)})") from None

  def rows_of(self, host: str) -> np.ndarray:
    """Manifest rows owned by `host`, sorted."""
    return np.flatnonzero(self.owner_N == self.host_index(host))

  def owner_names(self) -> np.ndarray:
    """(N,) host name per manifest row."""
    return np.asarray(self.hosts, dtype=object)[self.owner_N]


def stable_hash64(keys: Iterable[str]) -> np.ndarray:
  """uint64 blake2b hash of each string; identical in every process and Python version."""
  digests = b"".join(hashlib.blake2b(k.encode(), digest_size=8).digest() for k in keys)
  return np.frombuffer(digests, dtype="<u8").astype(np.uint64)


def record_positions(manifest: manifest_lib.Manifest, seed: int) -> np.ndarray:
  """(N,) uint64 ring position of each record, from (seed, record_id) (read-only).

  Computed once per manifest and seed: hashing every id is most of a replace_hosts call, and
  replica_owners makes one per host.
  """
  def make():
    pos_N = stable_hash64(f"{seed}/{rid}" for rid in manifest.record_ids)
    pos_N.flags.writeable = False
    return pos_N
  return manifest.derived(("ring_positions", int(seed)), make)


def ring(hosts: Sequence[str], *, seed: int, vnodes: int) -> tuple[np.ndarray, np.ndarray]:
  """The hash ring: (positions_V uint64 sorted, host_V int32 index into `hosts`)."""
  pos_V = stable_hash64(f"{seed}/{h}/{v}" for h in hosts for v in range(vnodes))
  host_V = np.repeat(np.arange(len(hosts), dtype=np.int32), vnodes)
  order = np.lexsort((host_V, pos_V))
  return pos_V[order], host_V[order]


def strata(manifest: manifest_lib.Manifest) -> np.ndarray:
  """(N,) int stratum id: (split, modality group, min(num_images, 4)) packed into one integer."""
  split_N = np.full(len(manifest), len(manifest_lib.SPLITS), np.int64)
  for i, name in enumerate(manifest_lib.SPLITS):
    split_N[manifest.split == name] = i
  has_images_N = manifest.modality_mask[:, manifest_lib.IMAGES]
  images_N = np.where(has_images_N, np.minimum(manifest.num_images, MAX_STRATUM_IMAGES), 0)
  return (split_N * 8 + manifest.groups) * (MAX_STRATUM_IMAGES + 1) + images_N


def stratum_name(stratum: int) -> str:
  """'train/IL/2' for a stratum id from `strata`."""
  rest, images = divmod(int(stratum), MAX_STRATUM_IMAGES + 1)
  split, group = divmod(rest, 8)
  split_name = manifest_lib.SPLITS[split] if split < len(manifest_lib.SPLITS) else "other"
  mask = ((group >> 0) & 1, (group >> 1) & 1, (group >> 2) & 1)
  return f"{split_name}/{manifest_lib.group_name(mask) or '-'}/{images}"


def _check_hosts(hosts: Sequence[str]) -> tuple[str, ...]:
  if isinstance(hosts, str):
    raise ValueError(f"hosts must be a sequence of host names, got the string {hosts!r}; "
                     f"pass [{hosts!r}] for one host")
  hosts = tuple(hosts)
  if not hosts:
    raise ValueError("hosts is empty; a placement needs at least one host")
  bad = [h for h in hosts if not isinstance(h, str) or not h]
  if bad:
    raise ValueError(f"hosts must be non-empty strings such as 'host-0'; got {bad[:3]!r}")
  if len(set(hosts)) != len(hosts):
    dups = sorted({h for h in hosts if hosts.count(h) > 1})
    raise ValueError(f"hosts names {dups} more than once; each host must appear once")
  return tuple(sorted(hosts))


def _check_args(seed: int, vnodes: int, method: str) -> None:
  if not isinstance(seed, (int, np.integer)):
    raise ValueError(f"seed must be an int, got {seed!r}")
  if vnodes < 1:
    raise ValueError(f"vnodes={vnodes}: each host needs at least one virtual node (100 is usual)")
  if method not in METHODS:
    raise ValueError(f"placement method {method!r} is not one of {METHODS}")


def _clockwise(ring_pos_V: np.ndarray, pos_M: np.ndarray) -> np.ndarray:
  """Index of the first vnode at or after each position, wrapping past the top of the ring."""
  idx_M = np.searchsorted(ring_pos_V, pos_M, side="left")
  idx_M[idx_M == len(ring_pos_V)] = 0
  return idx_M


def _walk_bounded(pos_M: np.ndarray, ring_pos_V: np.ndarray, ring_host_V: np.ndarray,
                  capacity_W: np.ndarray) -> np.ndarray:
  """Owner of each record: in ring order, to the first vnode clockwise whose host has room.

  Equivalent to the sequential walk, but vectorised: between two moments where a host fills up,
  every record's choice is one searchsorted on the ring of hosts with room. A host fills at most
  once, so this loops at most W times.
  """
  m = len(pos_M)
  owner_M = np.full(m, -1, np.int32)
  remaining_W = capacity_W.astype(np.int64).copy()
  if remaining_W.sum() < m:
    raise AssertionError(f"bounded walk: capacity {remaining_W.sum()} < {m} records")
  todo = np.argsort(pos_M, kind="stable")
  while len(todo):
    live_V = remaining_W[ring_host_V] > 0
    rpos_V, rhost_V = ring_pos_V[live_V], ring_host_V[live_V]
    h_T = rhost_V[_clockwise(rpos_V, pos_M[todo])]
    # Rank of each record among the records choosing the same host, in walk order.
    by_host = np.argsort(h_T, kind="stable")
    h_sorted = h_T[by_host]
    rank_T = np.empty(len(h_T), np.int64)
    rank_T[by_host] = np.arange(len(h_T)) - np.searchsorted(h_sorted, h_sorted, side="left")
    full_T = rank_T >= remaining_W[h_T]
    stop = int(np.argmax(full_T)) if full_T.any() else len(todo)
    owner_M[todo[:stop]] = h_T[:stop]
    remaining_W -= np.bincount(h_T[:stop], minlength=len(remaining_W))
    todo = todo[stop:]
  return owner_M


class _Balance:
  """Running per-host totals that decide which hosts get a stratum's extra (ceil) quota."""

  def __init__(self, num_hosts: int):
    self.group_WxG = np.zeros((num_hosts, 8), np.int64)
    self.split_WxS = np.zeros((num_hosts, len(manifest_lib.SPLITS) + 1), np.int64)
    self.count_W = np.zeros(num_hosts, np.int64)
    self.cost_W = np.zeros(num_hosts, np.float64)

  def quotas(self, n: int, load_W: np.ndarray, new_W: np.ndarray, group: int,
             split: int) -> np.ndarray:
    """Exact quotas (n // W, +1 for n % W hosts) for one stratum.

    The extras (ceil quotas) go first to hosts already holding more than n // W records and to
    hosts that just joined: when hosts only leave, no survivor is over its quota (so none gives up
    records), and when hosts only join, no survivor is under it (so records go only to the
    newcomers). Among those, and then among the rest, the hosts lowest in (group count, split
    count, total count, total cost) so far get them, which keeps those totals balanced too.
    """
    w = len(load_W)
    base, extra = divmod(n, w)
    quota_W = np.full(w, base, np.int64)
    if extra:
      second_W = ~((load_W > base) | new_W)
      order = np.lexsort((np.arange(w), self.cost_W, self.count_W, self.split_WxS[:, split],
                          self.group_WxG[:, group], second_W))
      quota_W[order[:extra]] += 1
    return quota_W

  def add(self, owner_M: np.ndarray, cost_M: np.ndarray, group: int, split: int) -> None:
    w = len(self.count_W)
    counts_W = np.bincount(owner_M, minlength=w)
    self.group_WxG[:, group] += counts_W
    self.split_WxS[:, split] += counts_W
    self.count_W += counts_W
    self.cost_W += np.bincount(owner_M, weights=cost_M, minlength=w)


def _rebalance(manifest: manifest_lib.Manifest, owner_N: np.ndarray, hosts: tuple[str, ...],
               new_W: np.ndarray, *, seed: int, vnodes: int) -> np.ndarray:
  """Bounded-load owners for `hosts`, keeping current owners (owner_N >= 0) wherever possible.

  `owner_N` is -1 for rows without an owner (all of them initially, a departed host's after a
  change); `new_W` marks hosts that just joined (all of them initially).
  """
  w = len(hosts)
  pos_N = record_positions(manifest, seed)
  ring_pos_V, ring_host_V = ring(hosts, seed=seed, vnodes=vnodes)
  stratum_N = strata(manifest)
  balance = _Balance(w)
  new_owner_N = owner_N.astype(np.int32).copy()
  by_stratum = np.argsort(stratum_N, kind="stable")
  ids, starts = np.unique(stratum_N[by_stratum], return_index=True)
  rows_by_stratum = np.split(by_stratum, starts[1:])
  # Expensive strata first, so the cheap ones can even out what their extras left uneven.
  mean_cost = np.array([manifest.cost[rows].mean() for rows in rows_by_stratum])
  for k in np.argsort(-mean_cost, kind="stable"):
    rows_M = rows_by_stratum[k]
    split, group = divmod(int(ids[k]) // (MAX_STRATUM_IMAGES + 1), 8)
    cur_M = new_owner_N[rows_M]
    load_W = np.bincount(cur_M[cur_M >= 0], minlength=w)
    quota_W = balance.quotas(len(rows_M), load_W, new_W, group, split)
    excess_W = np.maximum(load_W - quota_W, 0)
    release_M = cur_M < 0
    if excess_W.any():
      # A host over quota (hosts joined) gives up first the records whose first choice on the new
      # ring is another host, i.e. those a newcomer's vnodes now claim; then in ring order.
      first_M = ring_host_V[_clockwise(ring_pos_V, pos_N[rows_M])]
      cand_M = np.flatnonzero((cur_M >= 0) & (excess_W[np.maximum(cur_M, 0)] > 0))
      order = np.lexsort((pos_N[rows_M[cand_M]], first_M[cand_M] == cur_M[cand_M], cur_M[cand_M]))
      cand_M = cand_M[order]
      owners = cur_M[cand_M]
      rank = np.arange(len(cand_M)) - np.searchsorted(owners, owners, side="left")
      release_M[cand_M[rank < excess_W[owners]]] = True
    capacity_W = quota_W - (load_W - excess_W)
    moving_M = rows_M[release_M]
    new_owner_N[moving_M] = _walk_bounded(pos_N[moving_M], ring_pos_V, ring_host_V, capacity_W)
    balance.add(new_owner_N[rows_M], manifest.cost[rows_M], group, split)
  return new_owner_N


def _place_baseline(manifest: manifest_lib.Manifest, hosts: tuple[str, ...], *, seed: int,
                    vnodes: int, method: str) -> np.ndarray:
  pos_N = record_positions(manifest, seed)
  if method == "modulo":
    return (pos_N % np.uint64(len(hosts))).astype(np.int32)
  ring_pos_V, ring_host_V = ring(hosts, seed=seed, vnodes=vnodes)
  return ring_host_V[_clockwise(ring_pos_V, pos_N)].astype(np.int32)


def place(manifest: manifest_lib.Manifest, hosts: Sequence[str], *, seed: int, vnodes: int = 100,
          method: str = "bounded") -> Placement:
  """The initial (generation 0) placement of every manifest row.

  Args:
    manifest: the cohort; every row (all splits) gets an owner.
    hosts: host names; their order does not matter.
    seed: seeds every ring position; the same seed must be used for later `replace_hosts`.
    vnodes: virtual nodes per host.
    method: 'bounded' (per-stratum consistent hashing with bounded loads), or the baselines
      'ring' (consistent hashing, unbounded) and 'modulo' (hash mod W).

  Returns:
    The placement; identical inputs give identical placements.
  """
  hosts = _check_hosts(hosts)
  _check_args(seed, vnodes, method)
  if method == "bounded":
    owner_N = _rebalance(manifest, np.full(len(manifest), -1, np.int32), hosts,
                         np.ones(len(hosts), bool), seed=seed, vnodes=vnodes)
  else:
    owner_N = _place_baseline(manifest, hosts, seed=seed, vnodes=vnodes, method=method)
  return Placement(hosts=hosts, owner_N=owner_N, generation=0, method=method, seed=int(seed),
                   vnodes=vnodes)


def replace_hosts(prev: Placement, manifest: manifest_lib.Manifest, hosts: Sequence[str], *,
                  seed: int, vnodes: int = 100) -> Placement:
  """The next generation's placement after the host set changed, moving as little as possible.

  For 'bounded', records whose owner is still present stay, except a host's surplus over its new
  quota when hosts joined (that surplus goes to the newcomers); records of departed hosts walk
  clockwise to the next survivor with room. Every host again holds n // W or n // W + 1 records of
  each stratum. 'ring' and 'modulo' re-place from scratch, which is how those schemes behave.

  Args:
    prev: the current placement (same manifest).
    manifest: the cohort `prev` was made for.
    hosts: the new host set, in any order.
    seed: the seed `prev` was made with.
    vnodes: the vnode count `prev` was made with.

  Returns:
    The placement with generation prev.generation + 1.
  """
  hosts = _check_hosts(hosts)
  _check_args(seed, vnodes, prev.method)
  if len(prev.owner_N) != len(manifest):
    raise ValueError(f"placement generation {prev.generation} covers {len(prev.owner_N)} rows but "
                     f"the manifest has {len(manifest)}; a new manifest needs a fresh place()")
  if prev.seed is not None and (prev.seed != seed or prev.vnodes != vnodes):
    raise ValueError(f"replace_hosts(seed={seed}, vnodes={vnodes}) but generation "
                     f"{prev.generation} was placed with seed={prev.seed}, vnodes={prev.vnodes}; "
                     f"pass the same seed and vnodes or nearly every record would move")
  if prev.method == "bounded":
    new_index = {h: i for i, h in enumerate(hosts)}
    remap_W = np.array([new_index.get(h, -1) for h in prev.hosts], np.int32)
    new_W = np.array([h not in prev.hosts for h in hosts])
    owner_N = _rebalance(manifest, remap_W[prev.owner_N], hosts, new_W, seed=seed, vnodes=vnodes)
  else:
    owner_N = _place_baseline(manifest, hosts, seed=seed, vnodes=vnodes, method=prev.method)
  return Placement(hosts=hosts, owner_N=owner_N, generation=prev.generation + 1,
                   method=prev.method, seed=int(seed), vnodes=vnodes)


@dataclasses.dataclass(frozen=True)
class Walk:
  """The placements a host history leads through.

  Attributes:
    first: the first host set's placement.
    previous: the placement before the latest membership change (`first` if none).
    current: the latest host set's placement.
    changes: membership changes in the history (its length - 1).
  """
  first: Placement
  previous: Placement
  current: Placement
  changes: int


def walk_history(manifest: manifest_lib.Manifest, host_history: Sequence[Sequence[str]], *,
                 seed: int, vnodes: int = 100, method: str = "bounded") -> Walk:
  """Places the first host set, then `replace_hosts` for each later one, in one walk.

  The current placement's generation is len(host_history) - 1 (an unchanged host set still
  counts as a generation, with nothing moved).
  """
  if isinstance(host_history, str) or not len(host_history):
    raise ValueError("host_history must be a non-empty sequence of host sets, e.g. "
                     "[['host-0', 'host-1'], ['host-0']]")
  first = place(manifest, host_history[0], seed=seed, vnodes=vnodes, method=method)
  previous = current = first
  for hosts in host_history[1:]:
    previous, current = current, replace_hosts(current, manifest, hosts, seed=seed, vnodes=vnodes)
  return Walk(first, previous, current, len(host_history) - 1)


def place_history(manifest: manifest_lib.Manifest, host_history: Sequence[Sequence[str]], *,
                  seed: int, vnodes: int = 100, method: str = "bounded") -> Placement:
  """The placement after a sequence of host sets (`walk_history`'s current placement)."""
  return walk_history(manifest, host_history, seed=seed, vnodes=vnodes, method=method).current


def fingerprint(placement: Placement) -> str:
  """Names a placement (its owners and hosts) in lineage records."""
  h = hashlib.sha256(np.ascontiguousarray(placement.owner_N).tobytes())
  h.update(json.dumps(list(placement.hosts)).encode())
  return h.hexdigest()[:16]


def replica_owners(placement: Placement, manifest: manifest_lib.Manifest) -> np.ndarray:
  """(N,) int32 second owner of every row (index into `placement.hosts`).

  A row's second owner is where it would move if its owner left next: its owner under
  `replace_hosts(placement, hosts - {owner})`. Placement is a pure function of the host history,
  so when that host does leave, each of its rows moves to exactly its second owner, and a second
  owner that caches its replicas has every moved record already (replication r = 2). With one
  host there is no second owner (-1).
  """
  second_N = np.full(len(manifest), -1, np.int32)
  if placement.num_hosts < 2:
    return second_N
  for w, host in enumerate(placement.hosts):
    rows = placement.owner_N == w
    without = replace_hosts(placement, manifest, [h for h in placement.hosts if h != host],
                            seed=placement.seed, vnodes=placement.vnodes)
    remap = np.array([placement.hosts.index(h) for h in without.hosts], np.int32)
    second_N[rows] = remap[without.owner_N[rows]]
  return second_N


def moved(prev: Placement, new: Placement) -> np.ndarray:
  """(N,) bool: rows whose owning host (by name) differs between two placements."""
  if len(prev.owner_N) != len(new.owner_N):
    raise ValueError(f"placements cover {len(prev.owner_N)} and {len(new.owner_N)} rows; "
                     f"compare placements of the same manifest")
  return prev.owner_names() != new.owner_names()


def load_stats(placement: Placement, manifest: manifest_lib.Manifest) -> dict[str, Any]:
  """Per-host load and balance figures (plain Python types, ready for JSON).

  Returns:
    A dict with `hosts`, per-host `count` and `cost` (ms), `count_max`, `count_mean`,
    `count_max_over_mean`, `cost_max`, `cost_mean`, `cost_max_over_mean`, `stratum_spread`
    (stratum name -> max - min per-host count), `max_stratum_spread`, `group_spread` (modality
    group -> max - min per-host count) and `max_group_spread`.
  """
  if len(placement.owner_N) != len(manifest):
    raise ValueError(f"placement covers {len(placement.owner_N)} rows, manifest has "
                     f"{len(manifest)}")
  w = placement.num_hosts
  owner_N = placement.owner_N
  count_W = np.bincount(owner_N, minlength=w)
  cost_W = np.bincount(owner_N, weights=manifest.cost.astype(np.float64), minlength=w)

  def spreads(key_N: np.ndarray, name) -> dict[str, int]:
    keys, inv = np.unique(key_N, return_inverse=True)
    table = np.bincount(inv * w + owner_N, minlength=len(keys) * w).reshape(len(keys), w)
    return {name(k): int(row.max() - row.min()) for k, row in zip(keys, table)}

  group_names = manifest_lib.group_names()
  stratum_spread = spreads(strata(manifest), stratum_name)
  group_spread = spreads(manifest.groups, lambda g: group_names[int(g) - 1] if g else "-")
  return {
      "hosts": list(placement.hosts),
      "count": count_W.tolist(),
      "cost": cost_W.tolist(),
      "count_max": int(count_W.max()),
      "count_mean": float(count_W.mean()),
      "count_max_over_mean": float(count_W.max() / count_W.mean()),
      "cost_max": float(cost_W.max()),
      "cost_mean": float(cost_W.mean()),
      "cost_max_over_mean": float(cost_W.max() / cost_W.mean()),
      "stratum_spread": stratum_spread,
      "max_stratum_spread": max(stratum_spread.values()),
      "group_spread": group_spread,
      "max_group_spread": max(group_spread.values()),
  }
