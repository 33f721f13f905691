"""The cache under membership changes: what moves, recache-once in the background, replicas,
the redirect baseline, restarted workers and read-only processes."""

import os
import threading
import time

import numpy as np
import pytest

from configs import default as default_config
from medjax.data import cache as cache_lib
from medjax.data import ingest
from medjax.data import records
from medjax.data import synthetic
from medjax.data.cache import placement as placement_lib
from medjax.data.cache import recache

HOSTS = ["host-0", "host-1", "host-2"]
SURVIVORS = ["host-0", "host-1"]   # host-2 leaves


@pytest.fixture(scope="module")
def cohort(tmp_path_factory):
  base = tmp_path_factory.mktemp("recache")
  config = default_config.get_config()
  config.data.synthetic.num_patients = 150
  config.data.synthetic.image_size = 32
  config.data.image_size = 16
  root = str(base / "cohort")
  synthetic.generate(config.data.synthetic, root)
  result = ingest.run(config, str(base / "work"), root)
  return config, result, root


def _config(config, **data):
  config = config.copy_and_resolve_references()
  for k, v in data.items():
    config.data[k] = v
  return config


def _rows(config, result, history, host):
  walk = placement_lib.walk_history(result.manifest, history, seed=config.seed,
                                    vnodes=config.data.vnodes,
                                    method=config.data.placement_method)
  return recache.host_rows(config.data, result.manifest, walk, host)


def _cache(path, config, result, root, host, **kw):
  shapes = records.shapes_for(config.data, result.tables)
  return cache_lib.Cache(os.path.join(str(path), host), result.manifest, result.tables, shapes,
                         root, **kw)


def _imaged(result, rows) -> int:
  """How many of `rows` have images: only they are read from shared storage (a record without
  images is built from the tables in memory, `cache.TABLES`)."""
  return sum(1 for r in rows if result.manifest.image_files[r])


def _first_generation(path, config, result, root) -> dict:
  """Every host's cache filled for the first host set, as training's prefill does."""
  caches = {}
  for host in HOSTS:
    caches[host] = _cache(path, config, result, root, host)
    rows = _rows(config, result, [HOSTS], host)
    assert not len(rows.background) and not len(rows.moved_in)   # nothing moved yet
    caches[host].ensure(rows.prefill)
  return caches


def test_only_the_departed_hosts_records_move(cohort):
  config, result, _ = cohort
  before = {h: _rows(config, result, [HOSTS], h) for h in HOSTS}
  after = {h: _rows(config, result, [HOSTS, SURVIVORS], h) for h in SURVIVORS}
  moved = np.concatenate([after[h].moved_in for h in SURVIVORS])
  np.testing.assert_array_equal(np.sort(moved), before["host-2"].wanted)
  for h in SURVIVORS:
    assert np.isin(before[h].wanted, after[h].wanted).all()   # survivors keep all they had
    np.testing.assert_array_equal(after[h].background, after[h].moved_in)
    assert after[h].membership == 1 and not len(after[h].no_cache)
  ideal = len(result.manifest) / len(HOSTS)
  assert len(moved) <= 1.05 * ideal + 1


def test_modulo_baseline_moves_most_records(cohort):
  config, result, _ = cohort
  config = _config(config, placement_method="modulo")
  moved = sum(len(_rows(config, result, [HOSTS, SURVIVORS], h).moved_in) for h in SURVIVORS)
  assert moved > 0.5 * len(result.manifest)   # vs ~1/3 with consistent hashing


def test_survivor_decodes_each_moved_record_once_while_training_reads(tmp_path, cohort):
  config, result, root = cohort
  _first_generation(tmp_path, config, result, root)
  # A new worker process on host-0 after host-2 left: it reopens the node-local cache.
  rows = _rows(config, result, [HOSTS, SURVIVORS], "host-0")
  cache = _cache(tmp_path, config, result, root, "host-0")
  before = dict(cache.counters)
  cache.configure(moved=rows.moved_in)
  assert cache.ensure(rows.prefill) == 0   # what it had is not decoded again
  # The background recacher and the training reader (another order) want the same records.
  order = recache.plan_order(rows.moved_in[::2], rows.background)
  recacher = recache.Recacher(cache, order, chunk=4).start()
  reads = [cache.read(batch) for batch in np.array_split(rows.moved_in[::-1], 8)]
  recacher.done.wait(60)
  recacher.close()
  assert all(r["labs"].shape[0] for r in reads)
  new = {k: cache.counters[k] - before[k] for k in ("pfs_reads", "moved_reads", "records_written")}
  imaged = _imaged(result, rows.moved_in)
  assert 0 < imaged < len(rows.moved_in)
  assert new == {"pfs_reads": imaged, "moved_reads": imaged,
                 "records_written": len(rows.moved_in)}, new
  again = cache.counters["pfs_reads"]
  cache.read(rows.wanted)
  assert cache.counters["pfs_reads"] == again   # all cached now
  assert cache.counters["recache_s"] > 0


def test_restarted_worker_reuses_its_hosts_cache(tmp_path, cohort):
  config, result, root = cohort
  caches = _first_generation(tmp_path, config, result, root)
  wanted = _rows(config, result, [HOSTS], "host-1").wanted
  decoded = caches["host-1"].counters["pfs_reads"]
  assert decoded == _imaged(result, wanted)
  del caches   # the worker process dies; its node-local cache stays
  reopened = _cache(tmp_path, config, result, root, "host-1")
  reopened.read(wanted)
  assert reopened.counters["pfs_reads"] == decoded   # cumulative, and nothing new
  assert reopened.counters["hits"] == len(wanted)


def test_read_only_process_waits_for_the_writer_instead_of_decoding(tmp_path, cohort):
  config, result, root = cohort
  _first_generation(tmp_path, config, result, root)
  rows = _rows(config, result, [HOSTS, SURVIVORS], "host-1")
  writer = _cache(tmp_path, config, result, root, "host-1")
  writer.configure(moved=rows.moved_in)
  reader = _cache(tmp_path, config, result, root, "host-1", read_only=True, process=1)
  reader.configure(moved=rows.moved_in, expect=rows.background)
  got = {}
  thread = threading.Thread(target=lambda: got.update(reader.read(rows.moved_in)))
  thread.start()   # misses everything at first and waits
  # The writer starts once the reader has looked (else it may find some records already cached:
  # CI saw 16 misses of 25).
  deadline = time.monotonic() + 30
  while reader.counters["misses"] < len(rows.moved_in) and time.monotonic() < deadline:
    time.sleep(0.01)
  recacher = recache.Recacher(writer, rows.background).start()
  thread.join(60)
  recacher.close()
  assert not thread.is_alive()
  assert reader.counters["pfs_reads"] == 0 and reader.counters["misses"] == len(rows.moved_in)
  assert writer.counters["moved_reads"] == _imaged(result, rows.moved_in)
  expected = writer.read(rows.moved_in)
  np.testing.assert_array_equal(got["labs"], expected["labs"])
  np.testing.assert_array_equal(got["images"], expected["images"])


def test_replicas_two_survive_one_host_loss_without_shared_storage_reads(tmp_path, cohort):
  config, result, root = cohort
  config = _config(config, replicas=2)
  caches = _first_generation(tmp_path, config, result, root)
  primary = {h: _rows(_config(config, replicas=1), result, [HOSTS], h).wanted for h in HOSTS}
  assert sum(c.counters["pfs_reads"] for c in caches.values()) == 2 * _imaged(
      result, range(len(result.manifest)))
  for host in SURVIVORS:
    rows = _rows(config, result, [HOSTS, SURVIVORS], host)
    assert len(rows.moved_in) and np.isin(rows.moved_in, primary["host-2"]).all()
    cache = _cache(tmp_path, config, result, root, host)
    cache.configure(moved=rows.moved_in)
    before = cache.counters["pfs_reads"]
    assert cache.cached(rows.moved_in).all()
    cache.read(rows.moved_in)
    assert cache.counters["pfs_reads"] == before and cache.counters["moved_reads"] == 0
    # Re-replication (records whose second copy was on host-2) is new work, not moved records.
    assert not np.isin(rows.background, rows.moved_in).any()


def test_redirect_baseline_reads_moved_records_at_every_read(tmp_path, cohort):
  config, result, root = cohort
  config = _config(config, cache_policy="redirect")
  _first_generation(tmp_path, config, result, root)
  rows = _rows(config, result, [HOSTS, SURVIVORS], "host-0")
  np.testing.assert_array_equal(rows.no_cache, rows.moved_in)
  assert not len(rows.background)
  cache = _cache(tmp_path, config, result, root, "host-0")
  cache.configure(no_cache=rows.no_cache, moved=rows.moved_in)
  for _ in range(3):   # three epochs
    cache.read(rows.moved_in)
  assert cache.counters["moved_reads"] == 3 * _imaged(result, rows.moved_in)
  assert not cache.cached(rows.moved_in).any()


def test_bad_policies_are_named(cohort):
  config, result, _ = cohort
  with pytest.raises(ValueError, match="cache_policy='lru'"):
    _rows(_config(config, cache_policy="lru"), result, [HOSTS], "host-0")
  with pytest.raises(ValueError, match="replicas must be 1"):
    _rows(_config(config, cache_policy="redirect", replicas=2), result, [HOSTS], "host-0")


def test_published_counters_sum_per_host_and_keep_departed_hosts(tmp_path):
  recache.publish(str(tmp_path), "host-0", 0, {"pfs_reads": 3, "hits": 1})
  recache.publish(str(tmp_path), "host-0", 1, {"pfs_reads": 2, "hits": 5})
  recache.publish(str(tmp_path), "host-1", 0, {"pfs_reads": 7, "recache_s": 0.5})
  counts = recache.gathered(str(tmp_path))
  assert counts["hosts"]["host-0"]["pfs_reads"] == 5 and counts["hosts"]["host-0"]["hits"] == 6
  assert counts["total"]["pfs_reads"] == 12 and counts["total"]["recache_s"] == 0.5
