"""The node-local decoded-record cache, in TensorStore (zarr) on the host's local disk.

Records are decoded from shared storage once (`records.decode`) and written into two arrays with
one chunk per record, named by an index (`medjax.data.cache.disk`: the directory's layout).
A record without image files is not copied: it is all in the ingest's tables, which every process
holds in memory, so its entry has slot `TABLES` (-1) and a read builds it from the tables (a
table-only cohort of 20,000 patients is "cached" in well under a second, with no per-record
chunk files). It counts as written and as a hit, never as a shared-storage read.

Nothing on disk is trusted blindly. On open, the cache checks its shapes against the config and
each entry's fingerprint (manifest row + table values) against the manifest; stale entries are
dropped. On read, each record's bytes are checked against its crc32; a damaged or unreadable record
is decoded again from shared storage, and only that record.

A host's first process writes its cache; its other processes open it read-only. The cache is
thread-safe: the background recacher (`medjax.data.cache.recache`) and the training reader share
it, and a record wanted by both is decoded once (the second waits for the first). A read-only
process that misses a record the writer has promised (`expect`) waits for the writer instead of
decoding it again. Counters (`COUNTERS`) are cumulative over the cache's life on this node, per
process, and kept in `counters.<process>.json` beside the cache.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time

import numpy as np

from medjax import schema
from medjax.data import records
from medjax.data.cache import disk as disk_lib
from medjax.data.cache import fill as fill_lib
from medjax.data.dicom import decoder as decoder_lib

FORMAT_VERSION = disk_lib.FORMAT_VERSION
TABLES = disk_lib.TABLES
write_json = disk_lib.write_json
# Per process, cumulative. pfs_reads: records read from shared storage (one record = its files);
# moved_reads: those of records moved to this host by a membership change; recache_s: seconds
# decoding those; wait_s: seconds reads waited for another thread or the writer process.
COUNTERS = ("hits", "misses", "damaged", "pfs_reads", "pfs_files", "pfs_bytes", "records_written",
            "decode_s", "dropped_stale", "moved_reads", "records_moved_in", "recache_s", "wait_s")
_PERSIST_S = 1.0   # how often a fill rewrites index.json and the counters
# counters.<process>.json: the counters (a file of an earlier version may lack some), the run
# they belong to, and the membership change whose moved records were counted last.
COUNTERS_FILE = schema.Object(
    {}, optional={**dict.fromkeys(COUNTERS, schema.Num(min=0)), "run": schema.STR,
                  "membership": schema.COUNT}, extra=False)


class Cache:
  """Decoded records of one host, keyed by record id.

  Args:
    path: node-local directory (created if missing).
    manifest: the ingest manifest (rows are addressed by manifest row index).
    tables: the ingested tables (`ingest.load(...).tables`).
    shapes: record shapes (`records.shapes_for`).
    data_root: the shared-storage cohort root that manifest image paths are relative to.
    read_only: never write (a process that is not the host's cache writer).
    process: this process's index among its host's processes (names its counters file).
    run: the run the counters belong to; counters left by another run start again from zero.
    memory_mb: memory for recently read records, on top of the on-disk cache.
    wait_limit_s: how long a read-only process waits for a record the writer has promised
      before decoding it itself.
    decoder: DICOM budgets and decoder isolation (`medjax.data.dicom.decoder`; default: the config
      defaults).
    fill_processes: processes that decode a large `ensure` (a fill; `medjax.data.cache.fill`).
  """

  def __init__(self, path, manifest, tables, shapes: records.Shapes, data_root: str, *,
               read_only: bool = False, process: int = 0, run: str = "",
               memory_mb: int = 256, wait_limit_s: float = 300.0,
               decoder: decoder_lib.Decoder | None = None, fill_processes: int = 1):
    self.path, self.manifest, self.tables, self.shapes = path, manifest, tables, shapes
    self.data_root, self.read_only = data_root, read_only
    self.decoder = decoder or decoder_lib.default()
    self.fill_processes = fill_processes
    self.wait_limit_s = wait_limit_s
    self.rejected: dict[str, dict] = {}
    self._row_of = {rid: i for i, rid in enumerate(manifest.record_ids)}
    n = len(manifest)
    self._no_cache_N = np.zeros(n, bool)   # read from shared storage every time (redirect)
    self._moved_N = np.zeros(n, bool)      # moved here by the latest membership change
    self._expect_N = np.zeros(n, bool)     # the writer process will cache these (read-only)
    self._cond = threading.Condition()
    self._inflight: set[int] = set()
    self._reserved: set[int] = set()      # slots being written outside the lock
    self._persisted_at, self._dirty = 0.0, False
    self._held: dict[str, np.ndarray] | None = None   # hold_in_memory
    self._held_slot_N = np.zeros(0, np.int64)
    self.disk = disk_lib.Disk(path, shapes, read_only=read_only, memory_mb=memory_mb,
                              lock=self._cond)
    self._counters_path = os.path.join(path, f"counters.{process}.json")
    self.counters = {**dict.fromkeys(COUNTERS, 0), "run": run}
    saved = self._saved_counters()
    if saved is not None and saved.get("run", "") == run:
      self.counters.update(saved)
    self._validate()

  def _saved_counters(self) -> dict | None:
    """This process's counters as last saved; None when there are none or they are damaged
    (with a warning): counting starts again from zero."""
    return disk_lib.read_json(self._counters_path, COUNTERS_FILE,
                              "its counters start again from zero")

  @property
  def index(self) -> dict[str, list]:
    """record id -> [slot, fingerprint, crc32] (`disk.Disk`)."""
    return self.disk.index

  def hold_in_memory(self, rows, budget_mb: float) -> int:
    """Keeps the cached ones of `rows` in memory too, if they fit in `budget_mb`.

    Reads of held records skip TensorStore (its per-chunk reads and checks cost about 1 ms per
    batch of 32, which on a small CPU competes with the training step). They are read, and their
    checksums checked, once here. Returns how many records are held (0: over budget).
    """
    rows = np.asarray([r for r in rows if self.manifest.record_ids[r] in self.index], np.int64)
    per_record = sum(v.nbytes for v in records.empty(self.shapes, 1).values())
    if not len(rows) or len(rows) * per_record > budget_mb * 2**20:
      if len(rows):
        logging.warning("cache %s: %d records need %.0f MB, over the %.0f MB budget; reading them "
                        "from disk, slower (raise config.data.cache_memory_mb)", self.path,
                        len(rows), len(rows) * per_record / 2**20, budget_mb)
      return 0
    hits = self.counters["hits"]
    batch = self.read(rows)
    with self._cond:
      self.counters["hits"] = hits   # loading is not a training read
    slot_N = np.full(len(self.manifest), -1, np.int64)
    slot_N[rows] = np.arange(len(rows))
    self._held, self._held_slot_N = batch, slot_N
    return len(rows)

  def note_membership(self, change: int, moved_in: int) -> None:
    """Counts `moved_in` records for membership change `change` (once, however many restarts)."""
    with self._cond:
      if self.counters.get("membership", 0) < change:
        self.counters["membership"] = change
        self.counters["records_moved_in"] += moved_in

  def configure(self, *, no_cache=(), moved=(), expect=()) -> None:
    """Sets which rows are never cached, moved here (counted apart), or promised by the writer."""
    with self._cond:
      for mask, rows in ((self._no_cache_N, no_cache), (self._moved_N, moved),
                         (self._expect_N, expect)):
        mask[:] = False
        mask[np.asarray(rows, np.int64)] = True

  def promote(self) -> None:
    """A read-only cache becomes its host's writer (a warm standby taking over from a writer
    process that is gone). What it validated and holds in memory stays; it picks up the entries
    and counters the writer saved since it opened, so it neither re-reads nor re-checks them
    (each record's bytes are still checked against its crc32 on read)."""
    with self._cond:
      self.disk.follow_writer()
      self.read_only = self.disk.read_only = False
      self._expect_N[:] = False
      saved = self._saved_counters()
      if saved is not None and saved.get("run", "") == self.counters.get("run", ""):
        self.counters.update(saved)

  def save_counters(self) -> dict:
    """Writes this process's counters beside the cache; returns a copy."""
    if self._dirty:
      self._dirty = False
      self.disk.save_index()   # the counters count records that the index must name
    with self._cond:
      counters = dict(self.counters)
    disk_lib.write_json(self._counters_path, counters)
    return counters

  # -- validation ------------------------------------------------------------------------------

  def _validate(self) -> None:
    """Drops entries whose record left the manifest or whose inputs changed."""
    stale = []
    for rid, (slot, fp, _) in self.index.items():
      row = self._row_of.get(rid)
      if (row is None or fp != disk_lib.fingerprint(self.manifest, row, self.tables)
          or slot >= self.disk.capacity):
        stale.append(rid)
    for rid in stale:
      del self.disk.index[rid]
    self.counters["dropped_stale"] += len(stale)
    if stale:
      logging.info("cache %s: %d entries no longer match the manifest; they will be decoded again",
                   self.path, len(stale))
      self.disk.save_index()

  # -- writing ---------------------------------------------------------------------------------

  def cached(self, rows: np.ndarray) -> np.ndarray:
    """bool per row: an entry exists (its bytes are verified only on read)."""
    return np.array([self.manifest.record_ids[r] in self.index for r in rows], bool)

  def _table_only(self, row: int) -> bool:
    return not self.manifest.image_files[row]

  def _from_tables(self, rows) -> dict[str, np.ndarray]:
    """A batch of records without images, built from the tables (no storage read)."""
    rows = np.asarray(rows, np.int64)
    out = records.empty(self.shapes, len(rows))
    for key in ("labs", "vitals"):   # finite values, 0 where missing, and the masks (tables.npz)
      out[key + "_mask"] = self.tables[key + "_mask"][rows]
      out[key] = self.tables[key][rows].astype(np.float32)
    return out

  def _start_decode(self, rows: list[int], pool: fill_lib.DecodePool | None = None):
    """Starts reading `rows` from shared storage (called without the lock held): their images
    decoded in `pool`'s processes (under way when this returns; as the cache stores them, for
    `_write`) or, without one, here when `_finish_decode` collects them; a record without
    images is built from the tables."""
    jobs = [r for r in rows if not self._table_only(r)]
    args = [(self.manifest.image_files[r], self.data_root, self.shapes, self.decoder)
            for r in jobs]
    return rows, jobs, (fill_lib.DecodePool(1, 0).start(args) if pool is None
                        else pool.start(args, fill_lib.decode_stored))

  def _finish_decode(self, started) -> list[dict[str, np.ndarray]]:
    rows, jobs, results = started
    out = {r: {k: v[0] for k, v in self._from_tables([r]).items()}
           for r in rows if self._table_only(r)}
    for row, (images, rejected, nbytes, seconds) in zip(jobs, results()):
      out[row] = records.with_tables(images, self.tables, row)
      self._account(row, rejected, nbytes, seconds)
    return [out[r] for r in rows]

  def _account(self, row: int, rejected: list[dict], nbytes: int, seconds: float) -> None:
    """Counts a record decoded from shared storage; quarantines its files that were rejected."""
    with self._cond:
      c = self.counters
      c["decode_s"] += seconds
      c["pfs_reads"] += 1
      c["pfs_files"] += len(self.manifest.image_files[row])
      c["pfs_bytes"] += nbytes
      if self._moved_N[row]:
        c["moved_reads"] += 1
        c["recache_s"] += seconds
      for entry in rejected:
        if entry["path"] not in self.rejected:
          self.rejected[entry["path"]] = entry
          if not self.read_only:
            with open(os.path.join(self.path, "decode_quarantine.jsonl"), "a") as f:
              f.write(json.dumps(entry) + "\n")

  def _write(self, rows: list[int], recs: list[dict[str, np.ndarray]]) -> None:
    """Stores decoded records. Called without the lock: readers and the other decoding thread go
    on while the chunks are written; only the slot reservation and the index update take it."""
    keep = [(r, rec) for r, rec in zip(rows, recs) if not self._no_cache_N[r]]
    if self.read_only or not keep:
      return
    self._note_table_only([r for r, _ in keep if self._table_only(r)])
    keep = [(r, rec) for r, rec in keep if not self._table_only(r)]
    if not keep:
      self._persist()
      return
    rows, recs = [r for r, _ in keep], [rec for _, rec in keep]
    packed = [self.disk.pack(r) for r in recs]
    images = np.stack([p[0] for p in packed])
    tab = np.stack([p[1] for p in packed])
    with self._cond:
      slots = self.disk.reserve_slots(len(rows), self._reserved)
      self._reserved.update(slots)
    try:
      self.disk.write_slots(slots, images, tab)
      with self._cond:
        for row, slot, (im, tb) in zip(rows, slots, packed):
          rid = self.manifest.record_ids[row]
          self.disk.index[rid] = [slot, disk_lib.fingerprint(self.manifest, row, self.tables),
                                  self.disk.crc(im, tb)]
        self.counters["records_written"] += len(rows)
    finally:
      with self._cond:
        self._reserved.difference_update(slots)
    self._persist()

  def _note_table_only(self, rows: list[int]) -> None:
    """Index entries (slot TABLES) for records without images: nothing to store."""
    if self.read_only or not rows:
      return
    fp = lambda r: disk_lib.fingerprint(self.manifest, r, self.tables)
    entries = {self.manifest.record_ids[r]: [TABLES, fp(r), 0] for r in rows}
    with self._cond:
      self.disk.index.update(entries)
      self.counters["records_written"] += len(entries)
    self._persist()

  def _persist(self, force: bool = False) -> None:
    """Writes index.json and the counters (which count what it names), at most every
    `_PERSIST_S` unless forced: rewriting a large index after every batch of a fill cost more
    than the fill. An entry not yet written is only decoded again after a crash."""
    now = time.monotonic()
    if not force and now - self._persisted_at < _PERSIST_S:
      self._dirty = True
      return
    self._persisted_at, self._dirty = now, False
    self.disk.save_index()
    self.save_counters()

  def flush(self) -> None:
    """Writes what `_persist` held back (end of a fill, an epoch, a run)."""
    if self._dirty:
      self._persist(force=True)

  def _claim(self, rows) -> list[int]:
    """Rows to decode now: not cached, not being decoded by another thread (lock held)."""
    ids = self.manifest.record_ids
    mine = [r for r in dict.fromkeys(rows) if ids[r] not in self.index and r not in self._inflight]
    self._inflight.update(mine)
    return mine

  def _release(self, rows: list[int]) -> None:
    self._inflight.difference_update(rows)
    self._cond.notify_all()

  def ensure(self, rows, *, batch: int = 64, progress=None, stop=None,
             processes: int | None = None) -> int:
    """Decodes and caches the rows that are not cached yet; returns how many this call decoded.

    Rows another thread is decoding are left to it; `stop` (a threading.Event) ends early.
    `processes`: decoding processes (`medjax.data.cache.fill`; default `fill_processes`).
    """
    todo = [int(r) for r in rows if not self._no_cache_N[r]]
    with fill_lib.DecodePool(self.fill_processes if processes is None else processes,
                             len(todo)) as pool:
      return self._ensure(todo, batch=max(batch, 16 * pool.processes), progress=progress,
                          stop=stop, pool=pool)

  def _ensure(self, todo: list[int], *, batch: int, progress, stop,
              pool: fill_lib.DecodePool) -> int:
    done = 0
    if not self.read_only:   # records without images first, all at once: nothing to decode
      with self._cond:
        tables_only = self._claim([r for r in todo if self._table_only(r)])
      try:
        self._note_table_only(tables_only)
      finally:
        with self._cond:
          self._release(tables_only)
      done += len(tables_only)
      if progress is not None and tables_only:
        progress(len(tables_only))
      todo = [r for r in todo if not self._table_only(r)]
    # Chunk k+1 decodes (in the pool's processes) while chunk k is written here.
    ahead = None   # (rows claimed, their images' rows, the decode started, rows asked)
    try:
      for start in range(0, len(todo), batch):
        if stop is not None and stop.is_set():
          break
        with self._cond:
          chunk = self._claim(todo[start:start + batch])
        try:
          self._note_table_only([r for r in chunk if self._table_only(r)])
          chunk_images = [r for r in chunk if not self._table_only(r)]
          started = self._start_decode(chunk_images, pool)
        except BaseException:
          with self._cond:
            self._release(chunk)
          raise
        if ahead is not None:
          done += self._complete(ahead, progress)
        ahead = (chunk, chunk_images, started, len(todo[start:start + batch]))
      if ahead is not None:
        done, ahead = done + self._complete(ahead, progress), None
    finally:
      if ahead is not None:   # an error: what was claimed is another thread's to decode
        with self._cond:
          self._release(ahead[0])
    self.flush()
    return done

  def _complete(self, ahead, progress) -> int:
    """Writes a chunk whose decode `_ensure` started, and releases it."""
    chunk, chunk_images, started, asked = ahead
    try:
      self._write(chunk_images, self._finish_decode(started))
    finally:
      with self._cond:
        self._release(chunk)
    if progress is not None:
      progress(asked)
    return len(chunk)

  # -- reading ---------------------------------------------------------------------------------

  def read(self, rows) -> dict[str, np.ndarray]:
    """A batch for manifest rows (-1 = padding, all-missing), decoding any miss or damage.

    A miss that another thread (or, read-only, the writer process) is about to fill is waited for
    rather than decoded twice.
    """
    rows_B = np.asarray(rows, np.int64)
    if self._held is not None and len(rows_B) and (rows_B >= 0).all():
      slot_B = self._held_slot_N[rows_B]
      if (slot_B >= 0).all():   # no padding and all held: one gather per field
        with self._cond:
          self.counters["hits"] += len(slot_B)
        return {k: v[slot_B] for k, v in self._held.items()}
    rows = [int(r) for r in rows]
    out = records.empty(self.shapes, len(rows))
    todo = [(i, r) for i, r in enumerate(rows) if r >= 0]
    if self._held is not None and todo:
      at_B = np.array([i for i, _ in todo])
      slot_B = self._held_slot_N[[r for _, r in todo]]
      held = slot_B >= 0
      for k, v in self._held.items():
        out[k][at_B[held]] = v[slot_B[held]]
      with self._cond:
        self.counters["hits"] += int(held.sum())
      todo = [t for t, h in zip(todo, held) if not h]
    counted: set[int] = set()
    damaged: set[int] = set()   # read-only: damaged here, so decoded here, not waited for
    waited_since = None
    while todo:
      with self._cond:
        if self.read_only:
          self.disk.follow_writer()
        missing = self._read_hits(todo, out, damaged)
        fresh = [r for _, r in missing if r not in counted]
        self.counters["misses"] += len(fresh)
        counted.update(fresh)
        expired = (waited_since is not None
                   and time.perf_counter() - waited_since > self.wait_limit_s)
        wait = [(i, r) for i, r in missing if r in self._inflight
                or (self.read_only and self._expect_N[r] and r not in damaged and not expired)]
        mine = [(i, r) for i, r in missing if (i, r) not in wait]
        claimed = self._claim([r for _, r in mine])
        if expired and wait:
          logging.warning("cache %s: the writer process did not cache %d records in %.0f s; "
                          "decoding them here", self.path, len(wait), self.wait_limit_s)
      try:
        unique = list(dict.fromkeys(r for _, r in mine))
        decoded = dict(zip(unique, self._finish_decode(self._start_decode(unique))))
        self._write(claimed, [decoded[r] for r in claimed])
      finally:
        with self._cond:
          self._release(claimed)
      for i, r in mine:
        for k, v in decoded[r].items():
          out[k][i] = v
      todo = wait
      if todo:
        t0 = time.perf_counter()
        waited_since = waited_since or t0
        with self._cond:
          self._cond.wait(timeout=0.05)
          self.counters["wait_s"] += time.perf_counter() - t0
    return out

  def _read_hits(self, todo: list[tuple[int, int]], out: dict,
                 damaged: set[int]) -> list[tuple[int, int]]:
    """Fills `out` with the cached ones of (batch index, row) pairs; returns the rest (lock held).

    Rows whose bytes fail their check are added to `damaged` and returned with the misses.
    """
    ids = self.manifest.record_ids
    hits = [(i, r) for i, r in todo if ids[r] in self.index]
    missing = [(i, r) for i, r in todo if ids[r] not in self.index]
    from_tables = [(i, r) for i, r in hits if self.index[ids[r]][0] == TABLES]
    if from_tables:
      batch = self._from_tables([r for _, r in from_tables])
      at = [i for i, _ in from_tables]
      for k, v in batch.items():
        out[k][at] = v
      self.counters["hits"] += len(from_tables)
      hits = [(i, r) for i, r in hits if self.index[ids[r]][0] != TABLES]
    if not hits:
      return missing
    slots = [self.index[ids[r]][0] for _, r in hits]
    together = self.disk.read_slots(slots)
    if together is None:   # Some chunk is unreadable: read one by one to find which.
      alone = [self.disk.read_slots([slot]) for slot in slots]
      together = [None if a is None else (a[0][0], a[1][0]) for a in alone]
    else:
      together = list(zip(*together))
    good = []
    for j, (i, r) in enumerate(hits):
      one = together[j]
      if one is None or self.disk.crc(*one) != self.index[ids[r]][2]:
        self.counters["damaged"] += 1
        del self.disk.index[ids[r]]
        damaged.add(r)
        missing.append((i, r))
      else:
        good.append(j)
    self.counters["hits"] += len(good)
    if good:
      batch = self.disk.unpack(np.stack([together[j][0] for j in good]),
                               np.stack([together[j][1] for j in good]))
      at = [hits[j][0] for j in good]
      for k, v in batch.items():
        out[k][at] = v
    return missing
