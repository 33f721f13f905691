"""Lineage: which records a model state has trained on; its store, in a TensorStore kvstore.

A `Lineage` is a value: the epoch, the plan segment (the placement generation it was planned for
and the records of the epoch it covers), the partition and step offset reached, the global step,
the seed, the epoch's processed-record bitmap, and the generation that produced it. The trainer
produces it (through a `Cursor`, its position in the plan), the checkpoint module stores it as a
checkpoint's metadata, the coordinator commits it to the `LineageStore`; no other module spells
its fields as strings.

A step is committed once its record is in the store (written by whoever commits: the coordinator
in supervised runs, the single process otherwise, after Orbax finalized the checkpoint on every
process). The store works on any TensorStore kvstore: a local path (default), or a URL such as
gs://bucket/run/lineage or s3://bucket/run/lineage.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json

import numpy as np
import tensorstore as ts

from medjax import errors
from medjax import schema

_LOG = "log/"
_STATE = "state/"


class LineageError(errors.InputError):
  """A lineage record that cannot be read; the message names the field and the value."""


def pack_bitmap(bits_N: np.ndarray) -> str:
  """A bool array as base64 text (one bit per record)."""
  return base64.b64encode(np.packbits(np.asarray(bits_N, bool))).decode()


def unpack_bitmap(text: str, n: int) -> np.ndarray:
  """The first `n` bits of `pack_bitmap`'s text, as a writable bool array."""
  return np.unpackbits(np.frombuffer(base64.b64decode(text), np.uint8), count=n).astype(bool)


@dataclasses.dataclass(frozen=True)
class Segment:
  """A plan segment: the rest of an epoch, planned under one placement.

  Attributes:
    placement: the placement's fingerprint (`medjax.data.cache.placement.fingerprint`).
    hosts: the placement's hosts.
    base: packed bitmap of the epoch's records processed before the segment began.
  """
  placement: str
  hosts: tuple[str, ...]
  base: str


@dataclasses.dataclass(frozen=True)
class Lineage:
  """What a checkpointed state has trained on, exactly (see the module docstring)."""
  global_step: int
  epoch: int
  partition: int
  offset: int
  seed: int
  segment: Segment
  processed: str
  generation: int = 0
  # Validation at each finished epoch ((epoch, value or None, global step), ...) and why
  # training stopped early ('' : it did not): `medjax.train.stopping`.
  validation: tuple = ()
  stopped: str = ""

  @classmethod
  def start(cls, *, epoch: int, global_step: int, seed: int, placement: str,
            hosts: tuple[str, ...], base_N: np.ndarray, generation: int = 0) -> "Lineage":
    """A fresh segment: the records of `epoch` not in `base_N`, planned under `placement`."""
    packed = pack_bitmap(base_N)
    return cls(global_step=global_step, epoch=epoch, partition=0, offset=0, seed=seed,
               segment=Segment(placement, tuple(hosts), packed), processed=packed,
               generation=generation)

  def base_N(self, n: int) -> np.ndarray:
    return unpack_bitmap(self.segment.base, n)

  def processed_N(self, n: int) -> np.ndarray:
    return unpack_bitmap(self.processed, n)

  def to_dict(self) -> dict:
    """JSON-ready fields (the format of checkpoint metadata and the store's records)."""
    out = dataclasses.asdict(self)
    out["segment"]["hosts"] = list(self.segment.hosts)
    out["validation"] = [list(e) for e in self.validation]
    return out

  @classmethod
  def from_dict(cls, d: dict) -> "Lineage":
    """Parses and validates `to_dict`'s output (`RECORD`; no value is coerced); extra keys
    (e.g. `committed_at`) are ignored.

    Raises:
      LineageError: a field is missing or has a value of the wrong kind (named in the message).
    """
    if not isinstance(d, dict):
      raise LineageError(f"lineage record is a {type(d).__name__}, not an object")
    try:
      schema.check(d, RECORD)
    except schema.SchemaError as e:
      raise LineageError(f"lineage {e}") from None
    seg = d["segment"]
    return cls(global_step=d["global_step"], epoch=d["epoch"], partition=d["partition"],
               offset=d["offset"], seed=d["seed"],
               segment=Segment(placement=seg["placement"], hosts=tuple(seg["hosts"]),
                               base=seg["base"]),
               processed=d["processed"], generation=d.get("generation", 0),
               validation=tuple((e[0], None if e[1] is None else float(e[1]), e[2])
                                for e in d.get("validation", [])),
               stopped=d.get("stopped", ""))


def _is_bitmap(text: str) -> bool:
  try:
    base64.b64decode(text, validate=True)
  except binascii.Error:
    return False
  return True


_BITMAP = schema.Satisfies(schema.STR, _is_bitmap, "a packed bitmap (base64)")
_POSITION = schema.Int(min=0)

# What `Lineage.to_dict` writes. Records of earlier versions may lack generation, validation
# and stopped (their defaults apply); nothing else may be absent.
RECORD = schema.Object(
    {"global_step": _POSITION, "epoch": _POSITION, "partition": _POSITION,
     "offset": _POSITION, "seed": schema.INT,
     "segment": schema.Object({"placement": schema.STR, "hosts": schema.List(schema.STR),
                               "base": _BITMAP}),
     "processed": _BITMAP},
    optional={"generation": _POSITION, "stopped": schema.STR,
              # [epoch, value or null, global step] at each finished epoch.
              "validation": schema.List(schema.Tuple(
                  _POSITION, schema.Nullable(schema.Num(finite=False)), _POSITION))})


def best(validation) -> tuple | None:
  """(epoch, value, step) of the best entry of a validation history (higher is better; the
  earliest of equals), or None while no entry has a value."""
  scored = [e for e in validation if e[1] is not None]
  if not scored:
    return None
  top = max(e[1] for e in scored)
  return next(tuple(e) for e in scored if e[1] == top)


def best_step(lineage: Lineage | None) -> int | None:
  """The global step of `lineage`'s best validated epoch (its checkpoint: ckpt.keep_best)."""
  entry = best(lineage.validation) if lineage is not None else None
  return None if entry is None else int(entry[2])


class Cursor:
  """The trainer's position in the partition plan, advanced step by step.

  Holds the epoch's processed-record bitmap unpacked (a step only sets bits); `lineage()` packs a
  snapshot when a checkpoint needs one.

  Args:
    lineage: where to start (a restored checkpoint's lineage, or `Lineage.start`).
    num_records: the manifest's length.
    generation: the generation producing the snapshots.
  """

  def __init__(self, lineage: Lineage, num_records: int, *, generation: int = 0):
    self.num_records, self.generation = num_records, generation
    self._set(lineage)

  def _set(self, lineage: Lineage) -> None:
    self.validation, self.stopped = lineage.validation, lineage.stopped
    self.global_step, self.epoch = lineage.global_step, lineage.epoch
    self.partition, self.offset, self.seed = lineage.partition, lineage.offset, lineage.seed
    self.segment = lineage.segment
    self.base_N = lineage.base_N(self.num_records)
    self.processed_N = lineage.processed_N(self.num_records)

  def step_done(self, rows: np.ndarray) -> None:
    """One global step trained on `rows` (manifest rows of every host; -1 = padding)."""
    rows = np.asarray(rows).ravel()
    self.processed_N[rows[rows >= 0]] = True
    self.offset += 1
    self.global_step += 1

  def partition_done(self) -> None:
    self.partition, self.offset = self.partition + 1, 0

  def new_segment(self, *, epoch: int, placement: str, hosts: tuple[str, ...],
                  base_N: np.ndarray) -> None:
    """Starts planning `epoch`'s records not in `base_N` under another placement (or epoch)."""
    validation, stopped = self.validation, self.stopped
    self._set(Lineage.start(epoch=epoch, global_step=self.global_step, seed=self.seed,
                            placement=placement, hosts=hosts, base_N=base_N,
                            generation=self.generation))
    self.validation, self.stopped = validation, stopped

  def lineage(self) -> Lineage:
    return Lineage(global_step=self.global_step, epoch=self.epoch, partition=self.partition,
                   offset=self.offset, seed=self.seed, segment=self.segment,
                   processed=pack_bitmap(self.processed_N), generation=self.generation,
                   validation=self.validation, stopped=self.stopped)


def kvstore_spec(location: str) -> dict | str:
  """A TensorStore kvstore spec for a local path or a kvstore URL."""
  if "://" in location:
    return location if location.endswith("/") else location + "/"
  return {"driver": "file", "path": location.rstrip("/") + "/"}


class LineageStore:
  """Committed-step records (`log/<step>`) and named JSON state (`state/<name>`)."""

  def __init__(self, location: str):
    self.location = location
    self._kv = ts.KvStore.open(kvstore_spec(location)).result()

  def _put(self, key: str, value: dict) -> None:
    self._kv.write(key, json.dumps(value, sort_keys=True).encode()).result()

  def _get(self, key: str) -> dict | None:
    result = self._kv.read(key).result()
    if result.state != "value":
      return None
    try:
      value = json.loads(result.value)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
      raise LineageError(f"{self.location}/{key}: not JSON ({e}); the file is damaged") from e
    if not isinstance(value, dict):
      raise LineageError(f"{self.location}/{key}: holds {type(value).__name__}, not a record")
    return value

  def retract(self, step: int) -> None:
    """Moves a committed step's record aside (`damaged/<step>`): its checkpoint is damaged, so
    the step no longer counts as committed and can be trained, saved and committed again."""
    key = f"{_LOG}{int(step):012d}"
    raw = self._kv.read(key).result()
    if raw.state == "value":
      self._kv.write(f"damaged/{int(step):012d}", raw.value).result()
      self._kv.delete_range(ts.KvStore.KeyRange(key, key + "\x00")).result()

  def commit(self, lineage: Lineage, *, committed_at: float) -> None:
    """Writes the record of a finalized checkpoint step (idempotent)."""
    self._put(f"{_LOG}{lineage.global_step:012d}",
              {**lineage.to_dict(), "committed_at": committed_at})

  def committed_steps(self) -> list[int]:
    keys = self._kv.list(ts.KvStore.KeyRange(_LOG, _LOG[:-1] + chr(ord("/") + 1))).result()
    # A stray file in the log directory (an editor's backup, a partial copy) is not a step.
    names = [k.decode(errors="replace")[len(_LOG):] for k in keys]
    return sorted(int(n) for n in names if n.isdigit())

  def record(self, step: int) -> Lineage | None:
    raw = self._get(f"{_LOG}{int(step):012d}")
    return None if raw is None else Lineage.from_dict(raw)

  def latest(self) -> Lineage | None:
    steps = self.committed_steps()
    return self.record(steps[-1]) if steps else None

  def put_state(self, name: str, value: dict) -> None:
    self._put(_STATE + name, value)

  def get_state(self, name: str, shape: schema.Check | None = None) -> dict | None:
    """The state `name` (None if never put); with `shape`, checked against it.

    Raises:
      LineageError: the state is not JSON, or not an object of `shape`; names the file and
        the field.
    """
    value = self._get(_STATE + name)
    if value is not None and shape is not None:
      try:
        schema.check(value, shape)
      except schema.SchemaError as e:
        raise LineageError(f"{self.location}/{_STATE}{name}: {e}; the file is damaged") from None
    return value


