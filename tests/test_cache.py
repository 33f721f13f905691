"""The node-local decoded cache: written once, read by batch, validated on reopen, self-healing."""

import glob
import json
import logging
import multiprocessing
import os
import re
import shutil
import signal
import subprocess
import sys

import numpy as np
import psutil
import pytest

from configs import default as default_config
from medjax import errors
from medjax.data import cache as cache_lib
from medjax.data import host
from medjax.data import ingest
from medjax.data import loader
from medjax.data import pools
from medjax.data import records
from medjax.data.cache import fill
from tests import cohorts


@pytest.fixture
def ingested(tmp_path):
  root = cohorts.tiny_cohort(str(tmp_path / "cohort"))
  config = default_config.get_config()
  config.data.vitals_steps = 6
  config.data.image_size = 16
  result = ingest.run(config, str(tmp_path / "work"), root)
  return config, result, root


def _open(tmp_path, config, result, root, **kw):
  shapes = records.shapes_for(config.data, result.tables)
  return cache_lib.Cache(str(tmp_path / "cache"), result.manifest, result.tables, shapes, root, **kw)


def test_read_equals_decode_and_counts_hits(tmp_path, ingested):
  config, result, root = ingested
  cache = _open(tmp_path, config, result, root)
  rows = np.arange(len(result.manifest))
  assert cache.ensure(rows) == len(rows)
  assert cache.ensure(rows) == 0  # written once
  batch = cache.read(np.concatenate([rows, [-1]]))
  assert cache.counters["hits"] == len(rows) and cache.counters["misses"] == 0
  for i in rows:
    rec, _, _ = records.decode(result.manifest, i, result.tables, root, cache.shapes)
    np.testing.assert_allclose(batch["images"][i], rec["images"], atol=1e-3)  # float16 storage
    for k in ("image_mask", "labs", "labs_mask", "vitals", "vitals_mask"):
      np.testing.assert_array_equal(batch[k][i], rec[k])
  assert not batch["image_mask"][-1].any() and not batch["labs_mask"][-1].any()  # padding row
  assert batch["images"].shape == (len(rows) + 1, 4, 16, 16)


def test_records_without_images_are_built_from_the_tables_not_stored(tmp_path, ingested):
  config, result, root = ingested
  manifest = result.manifest
  table_only = np.array([r for r in range(len(manifest)) if not manifest.image_files[r]])
  imaged = np.array([r for r in range(len(manifest)) if manifest.image_files[r]])
  assert len(table_only) and len(imaged)
  cache = _open(tmp_path, config, result, root)
  assert cache.ensure(table_only) == len(table_only)
  # Indexed, counted as written, nothing read from shared storage, no chunk written.
  assert all(cache.index[manifest.record_ids[r]][0] == cache_lib.TABLES for r in table_only)
  assert cache.counters["records_written"] == len(table_only)
  assert cache.counters["pfs_reads"] == 0
  assert not glob.glob(str(tmp_path / "cache" / "tab" / "*.*")) or all(
      os.path.basename(p) in (".zarray",) for p in glob.glob(str(tmp_path / "cache" / "tab" / "*")))
  rows = np.concatenate([table_only, imaged])
  batch = cache.read(rows)   # a mixed batch: hits from the tables, misses decoded
  assert cache.counters["hits"] == len(table_only)
  assert cache.counters["misses"] == cache.counters["pfs_reads"] == len(imaged)
  for i, r in enumerate(rows):
    rec, _, _ = records.decode(manifest, r, result.tables, root, cache.shapes)
    for k in records.KEYS:
      np.testing.assert_allclose(batch[k][i], rec[k], atol=1e-3)
  # Reopened: the entries stand; a changed table value makes that record's entry stale.
  cache.flush()   # what a run does at an epoch end (index.json is written at most once a second)
  result.tables["vitals"][table_only[0], 0, 0] = 123.0
  reopened = _open(tmp_path, config, result, root)
  assert reopened.counters["dropped_stale"] == 1
  assert reopened.ensure(rows) == 1


def test_reopen_reuses_and_validates_against_manifest(tmp_path, ingested):
  config, result, root = ingested
  cache = _open(tmp_path, config, result, root)
  cache.ensure(np.arange(len(result.manifest)))
  reopened = _open(tmp_path, config, result, root)
  assert reopened.counters["dropped_stale"] == 0
  assert reopened.ensure(np.arange(len(result.manifest))) == 0
  # A changed lab value (a re-ingest with an edited table) invalidates exactly that record.
  result.tables["labs"][0, 0] += 1.0
  changed = _open(tmp_path, config, result, root)
  assert changed.counters["dropped_stale"] == 1
  assert changed.ensure(np.arange(len(result.manifest))) == 1


def test_shape_change_rebuilds(tmp_path, ingested):
  config, result, root = ingested
  _open(tmp_path, config, result, root).ensure(np.arange(len(result.manifest)))
  config.data.image_size = 8
  cache = _open(tmp_path, config, result, root)
  assert not cache.cached(np.arange(len(result.manifest))).any()


def test_damaged_chunk_is_decoded_again_alone(tmp_path, ingested):
  config, result, root = ingested
  cache = _open(tmp_path, config, result, root)
  rows = np.arange(len(result.manifest))
  cache.ensure(rows)
  image_rows = [r for r in rows if result.manifest.modality_mask[r, 0]]
  victim = image_rows[0]
  slot = cache.index[result.manifest.record_ids[victim]][0]
  chunk = glob.glob(os.path.join(str(tmp_path / "cache"), "images", f"{slot}.*"))[0]
  with open(chunk, "r+b") as f:
    f.seek(20)
    f.write(b"\xff" * 64)
  reopened = _open(tmp_path, config, result, root)
  before = dict(reopened.counters)
  batch = reopened.read(rows)
  assert reopened.counters["damaged"] - before["damaged"] == 1
  assert reopened.counters["pfs_reads"] - before["pfs_reads"] == 1   # that record, and only it
  assert (reopened.counters["pfs_files"] - before["pfs_files"]
          == len(result.manifest.image_files[victim]))
  rec, _, _ = records.decode(result.manifest, victim, result.tables, root, reopened.shapes)
  np.testing.assert_allclose(batch["images"][victim], rec["images"], atol=1e-3)
  assert _open(tmp_path, config, result, root).read(rows) is not None


def test_chunks_a_power_loss_left_missing_or_empty_are_decoded_again(tmp_path, ingested):
  """The cache's writes are not fsynced: after a power loss, index.json may name chunks that
  never reached the disk, or reached it empty. Each such record is decoded again, alone."""
  config, result, root = ingested
  cache = _open(tmp_path, config, result, root)
  rows = np.arange(len(result.manifest))
  cache.ensure(rows)
  image_rows = [r for r in rows if result.manifest.modality_mask[r, 0]]
  chunk = lambda array, row: glob.glob(os.path.join(
      str(tmp_path / "cache"), array, f"{cache.index[result.manifest.record_ids[row]][0]}.*"))[0]
  os.remove(chunk("images", image_rows[0]))
  open(chunk("tab", image_rows[1]), "wb").close()
  reopened = _open(tmp_path, config, result, root)
  before = dict(reopened.counters)
  batch = reopened.read(rows)
  assert reopened.counters["damaged"] - before["damaged"] == 2
  assert reopened.counters["pfs_reads"] - before["pfs_reads"] == 2
  for row in image_rows[:2]:
    rec, _, _ = records.decode(result.manifest, row, result.tables, root, reopened.shapes)
    np.testing.assert_allclose(batch["images"][row], rec["images"], atol=1e-3)
    np.testing.assert_array_equal(batch["labs_mask"][row], rec["labs_mask"])


def test_records_held_in_memory_read_the_same(tmp_path, ingested):
  config, result, root = ingested
  cache = _open(tmp_path, config, result, root)
  rows = np.arange(len(result.manifest))
  cache.ensure(rows[1:])
  assert cache.hold_in_memory(rows, budget_mb=0.001) == 0   # over budget: nothing held
  assert cache.hold_in_memory(rows, budget_mb=64) == len(rows) - 1   # only cached records
  cache.ensure(rows[:1])   # cached later: read from disk, not memory
  batch = np.concatenate([rows[::-1], [-1]])
  held = cache.read(batch)
  reference = _open(tmp_path, config, result, root).read(batch)
  for k in held:
    np.testing.assert_array_equal(held[k], reference[k])
  assert cache.counters["hits"] == len(rows) and cache.counters["misses"] == 0
  # Only held records (one gather per field), and the same with padding (-1 must not wrap around
  # to the last row, which is held).
  for batch in (rows[:0:-1], np.concatenate([rows[:0:-1], [-1]])):
    held, reference = cache.read(batch), _open(tmp_path, config, result, root).read(batch)
    assert sorted(held) == sorted(reference)
    for k in held:
      np.testing.assert_array_equal(held[k], reference[k])
  assert cache.counters["hits"] == 3 * len(rows) - 2


@pytest.mark.parametrize("name,garbage", [("index.json", b"{\"r-1\": [0, "),
                                          ("index.json", b"[1, 2, 3]"),
                                          ("index.json", b'{"r-x": "nonsense"}'),
                                          ("spec.json", b"\xff\xfe"),
                                          ("images/.zarray", b"not json")])
def test_damaged_cache_metadata_rebuilds_the_cache(tmp_path, ingested, name, garbage):
  config, result, root = ingested
  cache = _open(tmp_path, config, result, root)
  rows = np.arange(len(result.manifest))
  cache.ensure(rows)
  expected = cache.read(rows)
  with open(os.path.join(cache.path, name), "wb") as f:
    f.write(garbage)
  again = _open(tmp_path, config, result, root)
  got = again.read(rows)      # decoded again where the cache lost them (float32, not float16)
  for key, value in expected.items():
    np.testing.assert_allclose(got[key], value, atol=1e-3)


def _write(path, value) -> None:
  with open(path, "w") as f:
    f.write(value if isinstance(value, str) else json.dumps(value))


def _filled(tmp_path, ingested_):
  config, result, root = ingested_
  cache = _open(tmp_path, config, result, root, run="run-a")
  rows = np.arange(len(result.manifest))
  cache.ensure(rows)
  cache.save_counters()
  return cache, rows


@pytest.mark.parametrize("saved, field", [
    ([1, 2], ""),                                     # a list: Cache() raised AttributeError
    ("null", ""),
    ({"hits": "3", "run": "run-a"}, "hits"),
    ({"hits": True, "run": "run-a"}, "hits"),
    ({"hits": -4, "run": "run-a"}, "hits"),
    ({"decode_s": "NaN", "run": "run-a"}, "decode_s"),
    ({"hits": 3, "run": 7}, "run"),
    ({"hits": 3, "run": "run-a", "membership": 1.5}, "membership"),
    ({"hits": 3, "run": "run-a", "hitz": 3}, "hitz"),
])
def test_a_counters_file_of_another_shape_starts_the_counters_at_zero(tmp_path, ingested, caplog,
                                                                      saved, field):
  config, result, root = ingested
  cache, rows = _filled(tmp_path, ingested)
  path = os.path.join(cache.path, "counters.0.json")
  _write(path, saved)
  with caplog.at_level(logging.WARNING):
    again = _open(tmp_path, config, result, root, run="run-a")
  assert {k: again.counters[k] for k in cache_lib.COUNTERS} == dict.fromkeys(cache_lib.COUNTERS, 0)
  assert again.counters["run"] == "run-a"
  warning = next(r.getMessage() for r in caplog.records if "counters.0.json" in r.getMessage())
  assert "is damaged" in warning and warning.endswith("its counters start again from zero")
  assert (f"field {field!r}" if field else "the file is") in warning
  # The cache itself is whole: every record a hit, and the counters file is right again.
  again.read(rows)
  assert again.counters["hits"] == len(rows) and again.counters["pfs_reads"] == 0
  again.save_counters()
  with open(path) as f:
    assert json.load(f)["hits"] == len(rows)


@pytest.mark.parametrize("entry, field", [
    (["0", "fingerprint", 1], "[0]"),          # slot
    ([True, "fingerprint", 1], "[0]"),
    ([-7, "fingerprint", 1], "[0]"),
    ([0.0, "fingerprint", 1], "[0]"),
    ([0, 5, 1], "[1]"),                         # fingerprint
    ([0, "", 1], "[1]"),
    ([0, "fingerprint", "1"], "[2]"),           # crc32
    ([0, "fingerprint", -1], "[2]"),
    ([0, "fingerprint", 2**32], "[2]"),
    ([0, "fingerprint"], ""),
    ({"slot": 0}, ""),
])
def test_an_index_entry_of_another_shape_starts_an_empty_index(tmp_path, ingested, caplog, entry,
                                                               field):
  config, result, root = ingested
  cache, rows = _filled(tmp_path, ingested)
  expected = cache.read(rows)
  path = os.path.join(cache.path, "index.json")
  with open(path) as f:
    index = json.load(f)
  victim = sorted(index)[0]
  index[victim] = entry
  _write(path, index)
  with caplog.at_level(logging.WARNING):
    again = _open(tmp_path, config, result, root, run="run-a")
  assert again.index == {}
  warning = next(r.getMessage() for r in caplog.records if "index.json" in r.getMessage())
  assert f"field {victim + field!r}" in warning and "starting an empty index" in warning
  got = again.read(rows)    # decoded again, the same records
  for key, value in expected.items():
    np.testing.assert_allclose(got[key], value, atol=1e-3)
  assert len(again.index) == len(rows)


def test_an_index_naming_slots_in_arrays_made_anew_decodes_them_again(tmp_path, ingested, caplog):
  """index.json kept, the arrays gone: its slots name nothing, and one far past the end no
  longer makes the new arrays that long."""
  config, result, root = ingested
  cache, rows = _filled(tmp_path, ingested)
  path = os.path.join(cache.path, "index.json")
  with open(path) as f:
    index = json.load(f)
  imaged = [rid for rid, e in index.items() if e[0] != cache_lib.TABLES]
  index[imaged[0]][0] = 10**12
  _write(path, index)
  for name in ("images", "tab"):
    shutil.rmtree(os.path.join(cache.path, name))
  with caplog.at_level(logging.WARNING):
    again = _open(tmp_path, config, result, root, run="run-a")
  assert "arrays were made anew" in caplog.text
  assert again.disk.capacity == 64
  assert set(again.index) == {rid for rid, e in index.items() if e[0] == cache_lib.TABLES}
  before = again.counters["damaged"]
  again.read(rows)
  assert again.counters["damaged"] == before and len(again.index) == len(rows)


@pytest.mark.parametrize("spec", [[1, 2], "null", {"version": "1"}, {"image_size": 16.0}])
def test_a_spec_of_another_shape_rebuilds_the_cache(tmp_path, ingested, caplog, spec):
  config, result, root = ingested
  cache, rows = _filled(tmp_path, ingested)
  _write(os.path.join(cache.path, "spec.json"), spec)
  with caplog.at_level(logging.WARNING):
    again = _open(tmp_path, config, result, root, run="run-a")
  assert again.index == {}
  assert any("rebuilding" in r.getMessage() and cache.path in r.getMessage()
             for r in caplog.records if r.levelno == logging.WARNING)
  assert again.ensure(rows) == len(rows)
  with open(os.path.join(cache.path, "spec.json")) as f:
    assert json.load(f) == again.disk._spec()  # pylint: disable=protected-access


def test_a_reader_keeps_its_index_when_the_writers_is_damaged(tmp_path, ingested, caplog):
  config, result, root = ingested
  cache, rows = _filled(tmp_path, ingested)
  reader = _open(tmp_path, config, result, root, run="run-a", read_only=True, process=1)
  held = dict(reader.index)
  path = os.path.join(cache.path, "index.json")
  _write(path, {"r-x": ["0", "fp", 1]})
  os.utime(path, ns=(1, 1))   # another mtime: the reader looks at it
  with caplog.at_level(logging.WARNING):
    reader.disk.follow_writer()
  assert reader.index == held and "keeping the entries read before" in caplog.text
  assert reader.read(rows) is not None and reader.counters["pfs_reads"] == 0


def test_a_fill_decoded_in_processes_equals_one_decoded_here(tmp_path, ingested, monkeypatch):
  """A fill decodes on every core (`cache.fill`): the same records, counters and quarantined
  files as decoding in this process, a file damaged after ingest included."""
  config, result, root = ingested
  monkeypatch.setattr(fill, "MIN_RECORDS", 0)   # the tiny cohort is far below it
  rows = np.arange(len(result.manifest))
  damaged = next(f for files in result.manifest.image_files for f in files)
  with open(os.path.join(root, damaged), "r+b") as f:
    f.truncate(os.path.getsize(os.path.join(root, damaged)) - 100)
  here = _open(tmp_path / "here", config, result, root)
  pooled = _open(tmp_path / "pooled", config, result, root, fill_processes=2)
  assert here.ensure(rows) == pooled.ensure(rows) == len(rows)
  a, b = here.read(rows), pooled.read(rows)
  for k in a:
    np.testing.assert_array_equal(a[k], b[k])
  for k in ("pfs_reads", "pfs_files", "pfs_bytes", "records_written"):
    assert here.counters[k] == pooled.counters[k], k
  assert list(pooled.rejected) == list(here.rejected) == [damaged]


def _python(script: str) -> str:
  """What `script` prints in a fresh interpreter (which starts its own forkserver)."""
  return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                        check=True, timeout=60).stdout


def test_pool_processes_start_with_the_decoding_code_imported():
  """The data layer's pools fork from a forkserver that imported the decoding code once: a pool
  process that has run nothing but os.getpid has TensorStore's and PIL's libraries loaded. In a
  fresh interpreter, whose forkserver this starts."""
  maps = _python("import concurrent.futures, os\n"
                 "from medjax.data import pools\n"
                 "ctx = pools.context()\n"
                 "with concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx) as p:\n"
                 "  pid = p.submit(os.getpid).result()\n"
                 "  print(open(f'/proc/{pid}/maps').read())\n")
  assert "_tensorstore" in maps and "_imaging" in maps


def test_one_process_per_core_counts_the_cores_this_process_may_use():
  """A job given one core of a bigger machine (a SLURM allocation, a cpuset, taskset) decodes in
  one process, not one per core of the machine."""
  out = _python("import os\n"
                "os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"
                "from medjax.data import pools\n"
                "from medjax.data.cache import fill\n"
                "print(pools.cores(), fill.processes_for(0), fill.processes_for(3))\n")
  assert out.split() == ["1", "1", "3"]


_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A main module that notes each process that runs it (the script, then `__mp_main__` copies),
# and whose pool of 4 runs a function of its own, 8 times.
_NOTED_MAIN = """
import concurrent.futures, os, sys, time
with open(os.path.join(os.environ["NOTES"], str(os.getpid())), "w") as f:
  f.write(__name__)
def job(_):
  time.sleep(0.05)
  return os.getpid()
if __name__ == "__main__":
  from medjax.data import pools
  with concurrent.futures.ProcessPoolExecutor(4, mp_context=pools.context()) as pool:
    print(len(set(pool.map(job, range(8), chunksize=1))))
"""


@pytest.mark.parametrize("how", ["script", "module"])
def test_a_pools_processes_do_not_run_the_main_module_again(tmp_path, how):
  """The forkserver runs the caller's main module once (`medjax.data.pool_main`); before, each
  pool process of `python launch.py` or `python -m experiments.bench_data` ran it again
  (Python < 3.13 ignores a '__main__' preload). The pool still runs the module's functions."""
  (tmp_path / "noted_main.py").write_text(_NOTED_MAIN)
  notes = tmp_path / "notes"
  notes.mkdir()
  args = ["noted_main.py"] if how == "script" else ["-m", "noted_main"]
  env = dict(os.environ, NOTES=str(notes),
             PYTHONPATH=os.pathsep.join([str(tmp_path), _REPO]))
  out = subprocess.run([sys.executable, *args], cwd=tmp_path, env=env, capture_output=True,
                       text=True, check=True, timeout=120).stdout
  assert out.split()[-1] == "4"   # the pool ran `job` in its 4 processes
  names = sorted(p.read_text() for p in notes.iterdir())
  assert names == ["__main__", "__mp_main__"], names   # the script, and the forkserver


def test_prefetch_threads_yield_the_steps_in_order_as_read_inline(tmp_path, ingested):
  """The 'thread' path (accelerators) reads several steps at once and keeps their order."""
  config, result, root = ingested
  cache = _open(tmp_path, config, result, root)
  reader = loader.BatchReader(cache, result.manifest, result.tables)
  n = len(result.manifest)
  rng = np.random.default_rng(0)
  steps = np.stack([rng.choice(np.arange(-1, n), (1, 4)) for _ in range(9)]).astype(np.int32)
  inline = list(loader.prefetched(reader, steps, threads=1))
  threaded = list(loader.prefetched(reader, steps, start=2, threads=3))
  assert [s for s, _, _ in threaded] == list(range(2, 9))
  for (s, a, _), (t, b, _) in zip(inline[2:], threaded):
    assert s == t
    for k in a:
      np.testing.assert_array_equal(a[k], b[k])


def test_a_fill_whose_decoding_process_dies_goes_on_in_this_process(tmp_path, ingested, caplog):
  """A pool process killed mid-fill (as the OOM killer would) costs the pool, not the fill."""
  config, result, root = ingested
  shapes = records.shapes_for(config.data, result.tables)
  rows = [r for r in range(len(result.manifest)) if result.manifest.image_files[r]]
  jobs = [(result.manifest.image_files[r], root, shapes, None) for r in rows]
  expected = [records.decode_images_timed(j)[0]["images"] for j in jobs]
  with fill.DecodePool(2, fill.MIN_RECORDS) as pool:
    assert len(pool.decode(jobs[:2])) == 2   # the processes are up
    for process in list(pool._pool._processes.values()):   # pylint: disable=protected-access
      process.kill()
      process.join()
    with caplog.at_level(logging.WARNING):
      got = pool.decode(jobs)
    assert pool.processes == 1 and "a decoding process died" in caplog.text
  for a, (b, *_) in zip(expected, got):
    np.testing.assert_array_equal(a, b["images"])


def _square_or_die(job: tuple[int, str]) -> int:
  """job[0] squared, except that the first pool process to take job 5 is killed (SIGKILL, as the
  OOM killer would)."""
  i, marker = job
  if i == 5 and _first_pool_process(marker):
    os.kill(os.getpid(), signal.SIGKILL)
  return i * i


def _first_pool_process(marker: str) -> bool:
  """True in the first pool process to ask with this marker (a file it creates); never here."""
  if multiprocessing.parent_process() is None:
    return False
  try:
    open(marker, "x").close()
  except FileExistsError:
    return False
  return True


def test_a_pool_whose_process_dies_finishes_every_map_under_way_here(tmp_path, caplog):
  """The scan's, the fill's and the synthetic writer's pool: two maps handed out, then a pool
  process killed mid-way. Both return every result, in order; the pool warns once and runs what
  comes after in this process."""
  marker = str(tmp_path / "killed")
  with caplog.at_level(logging.WARNING), pools.Pool(2, "test pool: a process died") as pool:
    assert pools.MAIN_ENV not in os.environ   # set only while the forkserver started
    first = pool.map(_square_or_die, [(i, marker) for i in range(12)])
    second = pool.map(_square_or_die, [(i, marker) for i in range(12, 20)])
    assert list(first) == [i * i for i in range(12)]
    assert list(second) == [i * i for i in range(12, 20)]
    assert os.path.exists(marker) and pool.processes == 1
    assert list(pool.map(_square_or_die, [(5, marker)])) == [25]
  assert caplog.text.count("test pool: a process died") == 1


def _square_or_stop(job: tuple[int, str, str]) -> tuple[int, int]:
  """(pid, job[0] squared), except that the first pool process to take a job whose text is in
  `stop` stops itself (SIGSTOP), as a read the storage never answers leaves it."""
  i, marker, stop = job
  if stop in f"job {i};" and _first_pool_process(marker):
    os.kill(os.getpid(), signal.SIGSTOP)
  return os.getpid(), i * i


def _stall(max_jobs: int = 8) -> pools.Stall:
  return pools.Stall(seconds=lambda job: 1.5, result=lambda job: (0, -1),
                     name=lambda job: f"job {job[0]}", what="test pool", max_jobs=max_jobs)


def test_a_pool_job_past_its_time_is_replaced_and_its_process_killed(tmp_path, caplog):
  """A pool process stopped mid-job (SIGSTOP): the job's result is the stall's, that process is
  killed, the two maps under way return every other result in order from new processes, and
  the pool stays a pool."""
  marker = str(tmp_path / "stopped")
  with caplog.at_level(logging.WARNING), pools.Pool(2, "test pool: a process died",
                                                    stall=_stall()) as pool:
    first = pool.map(_square_or_stop, [(i, marker, "job 5;") for i in range(12)], chunksize=3)
    second = pool.map(_square_or_stop, [(i, marker, "job 5;") for i in range(12, 20)])
    got_first, got_second = list(first), list(second)
    assert [r for _, r in got_first] == [-1 if i == 5 else i * i for i in range(12)]
    assert [r for _, r in got_second] == [i * i for i in range(12, 20)]
    assert os.path.exists(marker) and pool.processes == 2
    later = list(pool.map(_square_or_stop, [(i, marker, "job 5;") for i in range(4)]))
    assert [r for _, r in later] == [0, 1, 4, 9]
  assert caplog.text.count("test pool: job 5 took more than 1.5 s in a pool process") == 1
  assert "a process died" not in caplog.text
  # The stopped process is gone (killed: SIGKILL ends a stopped process too).
  stopped = int(caplog.text.split("(pid ")[1].split(")")[0])
  assert not psutil.pid_exists(stopped) or psutil.Process(stopped).status() == "zombie"
  assert stopped not in {pid for pid, _ in got_second + later}


def test_a_pool_whose_jobs_keep_stalling_fails_with_one_line_naming_them(tmp_path):
  """Every job stalls (the storage under them is not answering): past `max_jobs` the map fails
  with an InputError naming the first files, instead of waiting for ever."""
  jobs = [(i, str(tmp_path / f"stopped{i}"), f"job {i};") for i in range(6)]
  # Jobs stall one poll apart or at once, as their processes took them: 2 or more in all. A job
  # whose process is killed with a stalled one before its own time is up runs again in a new
  # process (and there does not stop), so the first named need not be job 0.
  with pools.Pool(2, "test pool: a process died", stall=_stall(max_jobs=1)) as pool, \
      pytest.raises(errors.InputError, match=r"test pool: [2-6] files took longer than their "
                    r"time limit to read \(job \d, job \d, .*\): the storage they are on is "
                    r"not answering; check it \(or raise config.data.decode_timeout_s\)") as got:
    list(pool.map(_square_or_stop, jobs))
  named = re.findall(r"job (\d)", str(got.value))
  assert len(set(named)) == len(named) >= 2


def test_the_memory_budget_is_as_set_or_a_quarter_of_the_free_memory_shared_by_processes():
  assert host.memory_budget_mb(0, 2) == 0 and host.memory_budget_mb(512, 4) == 512
  free_mb = psutil.virtual_memory().available / 2**20
  auto = host.memory_budget_mb(-1, 1)
  assert 0.2 * free_mb < auto < 0.3 * free_mb   # free memory moves a little between the calls
  assert 0.15 * auto < host.memory_budget_mb(-1, 4) < 0.35 * auto


def test_batches_carry_images_as_stored_however_they_were_read(tmp_path, ingested):
  """float16 (records.IMAGE_DTYPE) from a miss decoded here, a hit on disk, a held record and
  padding alike: one dtype for the compiled step, and a record reads the same before and after
  it was cached."""
  config, result, root = ingested
  cache = _open(tmp_path, config, result, root)
  rows = np.concatenate([np.arange(len(result.manifest)), [-1]])
  missed = cache.read(rows)   # nothing cached yet: decoded here
  assert cache.counters["misses"] == len(rows) - 1
  from_disk = _open(tmp_path, config, result, root).read(rows)
  cache.hold_in_memory(rows[:-1], budget_mb=64)
  held = cache.read(rows)
  for batch in (missed, from_disk, held):
    assert batch["images"].dtype == records.IMAGE_DTYPE == np.float16
    assert batch["labs"].dtype == batch["vitals"].dtype == np.float32
    for k in batch:
      np.testing.assert_array_equal(batch[k], missed[k])
