"""One host's cache directory on its local disk: what the decoded records are stored in.

  spec.json    the shapes the cache was built for (another config rebuilds it)
  images/      zarr, float16 [slots, M, S, S], one chunk per record
  tab/         zarr, float32 [slots, everything else packed], one chunk per record
  index.json   record id -> [slot, fingerprint, crc32]; slot `TABLES` (-1): built from the tables

The cache's writer process writes it; its other processes open it read-only and follow what the
writer adds (`follow_writer`). `medjax.data.cache.store` decides what goes in and reads it back.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import threading
import zlib

import numpy as np
import tensorstore as ts

from medjax import schema
from medjax.data import records

FORMAT_VERSION = 1
TABLES = -1        # the slot of a record without images: built from the tables, not stored
_COMPRESSOR = {"id": "blosc", "cname": "lz4", "clevel": 1, "shuffle": 2}


def read_json(path: str, shape: schema.Check, then: str = "rebuilding from the cohort"):
  """A cache metadata file's value, or None when it is absent, or damaged: not JSON, or JSON of
  another shape than `shape` (with a warning that says what is wrong and `then`, what is done
  instead): a cache is rebuilt from the cohort, never trusted when its own records of itself
  are garbled."""
  if not os.path.exists(path):
    return None
  try:
    with open(path, "rb") as f:
      return schema.check(json.loads(f.read()), shape)
  except (OSError, ValueError) as e:   # (schema.SchemaError is a ValueError)
    why = str(e) if isinstance(e, schema.SchemaError) else type(e).__name__
    logging.warning("cache: %s is damaged (%s); %s", path, why, then)
    return None


# index.json: record id -> [slot (TABLES for a record built from the tables), the fingerprint of
# what it was decoded from, crc32 of its stored bytes].
INDEX = schema.Map(schema.Tuple(schema.Int(min=TABLES), schema.Str(nonempty=True),
                                schema.Int(min=0, max=2**32 - 1)))


def write_json(path: str, value) -> None:
  """Writes `value` as JSON so that readers see the old file or the new one, never half of one.

  `json.dumps`, not `json.dump`: the latter encodes in Python, piece by piece (a fill's index of
  50,000 records took ~10x longer to write)."""
  text = json.dumps(value)
  with open(path + ".tmp", "w") as f:
    f.write(text)
  os.replace(path + ".tmp", path)


def fingerprint(manifest, row: int, tables: dict[str, np.ndarray]) -> str:
  """Changes whenever what record `row` decodes to could change."""
  h = hashlib.blake2b(manifest.row_fingerprint(row).encode(), digest_size=12)
  for key in ("labs", "labs_mask", "vitals", "vitals_mask"):
    h.update(np.ascontiguousarray(tables[key][row]).tobytes())
  return h.hexdigest()


class Disk:
  """The directory's arrays and index, opened (a mismatching or damaged one rebuilt).

  Args:
    path: the node-local directory (created if missing).
    shapes: record shapes (`records.shapes_for`).
    read_only: never write (a process that is not the host's cache writer).
    memory_mb: TensorStore's memory for recently read chunks.
    lock: the caller's lock, held around `index` changes, `reserve_slots` and `follow_writer`;
      `save_index` takes it itself to snapshot the index.
  """

  def __init__(self, path: str, shapes: records.Shapes, *, read_only: bool, memory_mb: int,
               lock: threading.Condition):
    self.path, self.shapes, self.read_only, self._lock = path, shapes, read_only, lock
    self._shapes = shapes.record_shapes()
    self._tab_sizes = [int(np.prod(self._shapes[k])) for k in records.KEYS if k != "images"]
    self._index_io = threading.Lock()     # orders index.json writes (snapshots taken locked)
    self._index_version = self._index_written = 0
    self._index_mtime = None
    # Decoded chunks stay in memory (TensorStore's cache pool), revalidated against the file.
    # Writes are not fsynced (file_io_sync): each record is two chunk files, and syncing both
    # took 3/4 of a fill's writing. A cache needs no durability: a chunk that a power loss
    # leaves empty or missing fails its crc32 on read and is decoded again, like a damaged one.
    self._memory = {"context": {"cache_pool": {"total_bytes_limit": int(memory_mb) << 20},
                                "file_io_sync": False},
                    "recheck_cached_data": True}
    os.makedirs(path, exist_ok=True)
    self.index: dict[str, list] = {}
    self._open()

  @property
  def record_shapes(self) -> dict[str, tuple]:
    return self._shapes

  @property
  def capacity(self) -> int:
    return self.images.shape[0]

  def _spec(self) -> dict:
    return {"version": FORMAT_VERSION, **self.shapes.as_dict()}

  def _open(self) -> None:
    spec_path = os.path.join(self.path, "spec.json")
    spec = read_json(spec_path, schema.Map(schema.ANY))   # any other content differs: rebuilt
    if spec != self._spec():
      if spec is not None:
        logging.warning("cache %s: built for %s, config wants %s; rebuilding it", self.path, spec,
                        self._spec())
      if self.read_only:
        raise RuntimeError(f"cache {self.path} does not match the config and this process may not "
                           "rebuild it; start the host's cache writer first")
      for name in ("images", "tab", "index.json"):
        target = os.path.join(self.path, name)
        if os.path.isdir(target):
          shutil.rmtree(target)
        elif os.path.exists(target):
          os.remove(target)
      with open(spec_path, "w") as f:
        json.dump(self._spec(), f)
    index_path = os.path.join(self.path, "index.json")
    self.index: dict[str, list] = read_json(
        index_path, INDEX, "starting an empty index (records are decoded again)") or {}
    if os.path.exists(index_path):
      self._index_mtime = os.stat(index_path).st_mtime_ns
    s, m = self.shapes.image_size, self.shapes.max_images
    self.images, made_images = self._array("images", ts.dtype(records.IMAGE_DTYPE), [64, m, s, s])
    self.tab, made_tab = self._array("tab", ts.float32, [64, sum(self._tab_sizes)])
    if (made_images or made_tab) and any(e[0] != TABLES for e in self.index.values()):
      # New arrays hold no record: the entries that name a slot name nothing (and a slot past
      # the arrays' end is no reason to make them that large).
      logging.warning("cache %s: its arrays were made anew; the records index.json names in "
                      "them are decoded again", self.path)
      self.index = {rid: e for rid, e in self.index.items() if e[0] == TABLES}

  def _array(self, name: str, dtype, shape: list[int]):
    """(array, made): the array as it is on disk (it may have grown), or one made with
    `shape`."""
    kvstore = {"driver": "file", "path": os.path.join(self.path, name)}
    if os.path.exists(os.path.join(self.path, name, ".zarray")):
      try:
        array = ts.open({"driver": "zarr", "kvstore": kvstore, **self._memory}, open=True,
                        dtype=dtype).result()
      except ValueError as e:   # damaged metadata: a cache can always be built again
        logging.warning("cache %s: the %r array cannot be opened (%s); building it again",
                        self.path, name, " ".join(str(e).split())[:200])
        array = None
      if array is not None and list(array.shape[1:]) == list(shape[1:]):
        return array, False
    if self.read_only:
      raise RuntimeError(f"cache {self.path}: no usable {name!r} array and this process may not "
                         "create it; the host's first process fills the cache")
    return ts.open({"driver": "zarr", "kvstore": kvstore, "metadata": {"compressor": _COMPRESSOR},
                    **self._memory},
                   create=True, delete_existing=True, dtype=dtype, shape=shape,
                   chunk_layout=ts.ChunkLayout(read_chunk_shape=[1, *shape[1:]])).result(), True

  def save_index(self) -> None:
    """Writes index.json from a snapshot taken under the lock; a newer snapshot written by
    another thread meanwhile is never overwritten by an older one."""
    if self.read_only:
      return
    with self._lock:
      self._index_version += 1
      version, snapshot = self._index_version, dict(self.index)
    with self._index_io:
      if version <= self._index_written:
        return
      path = os.path.join(self.path, "index.json")
      write_json(path, snapshot)
      self._index_written = version
      self._index_mtime = os.stat(path).st_mtime_ns

  def follow_writer(self) -> None:
    """Read-only: picks up what the writer process added since (index and grown arrays)."""
    index_path = os.path.join(self.path, "index.json")
    try:
      mtime = os.stat(index_path).st_mtime_ns
    except FileNotFoundError:
      return
    if mtime == self._index_mtime:
      return
    self._index_mtime = mtime
    index = read_json(index_path, INDEX, "keeping the entries read before (the writer "
                      "rewrites it)")
    if index is None:
      return
    capacity = max([slot for slot, _, _ in index.values()], default=-1) + 1
    if capacity > self.images.shape[0]:
      self.images, _ = self._array("images", ts.dtype(records.IMAGE_DTYPE), list(self.images.shape))
      self.tab, _ = self._array("tab", ts.float32, list(self.tab.shape))
    self.index = {rid: e for rid, e in index.items() if e[0] < self.images.shape[0]}

  # -- packing ---------------------------------------------------------------------------------

  def pack(self, rec: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    tab = np.concatenate([rec[k].astype(np.float32).ravel() for k in records.KEYS
                          if k != "images"])
    return np.asarray(rec["images"], records.IMAGE_DTYPE), tab   # no copy when it is already

  def unpack(self, images: np.ndarray, tab: np.ndarray) -> dict[str, np.ndarray]:
    """One record's arrays from its packed form, or a batch's (leading batch axis on both)."""
    lead = tab.shape[:-1]
    out = {"images": images}   # as stored: batches carry float16 images (records.IMAGE_DTYPE)
    offset = 0
    for k, size in zip([k for k in records.KEYS if k != "images"], self._tab_sizes):
      value = tab[..., offset:offset + size].reshape(*lead, *self._shapes[k])
      out[k] = value > 0.5 if k.endswith("mask") else value
      offset += size
    return out

  @staticmethod
  def crc(images: np.ndarray, tab: np.ndarray) -> int:
    return zlib.crc32(tab.tobytes(), zlib.crc32(images.tobytes()))

  def reserve_slots(self, n: int, reserved: set[int]) -> list[int]:
    """`n` slots no entry uses and not in `reserved` (another writer's), growing the arrays
    (lock held)."""
    used = {slot for slot, _, _ in self.index.values()} | reserved
    free = [s for s in range(self.images.shape[0]) if s not in used][:n]
    if len(free) < n:
      capacity = self.images.shape[0]
      new_capacity = max(int(capacity * 1.5), capacity + n - len(free))
      self.images = self.images.resize(
          exclusive_max=[new_capacity, *self.images.shape[1:]], expand_only=True).result()
      self.tab = self.tab.resize(
          exclusive_max=[new_capacity, *self.tab.shape[1:]], expand_only=True).result()
      free += list(range(capacity, capacity + n - len(free)))
    return free

  def read_slots(self, slots: list[int]) -> tuple[np.ndarray, np.ndarray] | None:
    try:
      images = self.images.oindex[np.asarray(slots)].read().result()
      tab = self.tab.oindex[np.asarray(slots)].read().result()
    except Exception:  # pylint: disable=broad-except  (a damaged chunk: isolate it below)
      return None
    return images, tab

  def write_slots(self, slots: list[int], images: np.ndarray, tab: np.ndarray) -> None:
    """Writes packed records into `slots` (reserved), outside the lock: both arrays' chunks in
    one transaction, committed together before the index names them."""
    with self._lock:
      images_array, tab_array = self.images, self.tab
    with ts.Transaction() as txn:
      writes = [images_array.with_transaction(txn)[slots].write(images),
                tab_array.with_transaction(txn)[slots].write(tab)]
      for w in writes:
        w.result()
