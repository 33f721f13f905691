"""The lineage store: committed steps and coordinator state, in a TensorStore kvstore.

Lineage says exactly which records a model state has trained on: the epoch, the plan segment (the
placement generation it was planned for and the records it covers), the partition and step offset
reached, the global step, the seed, and the epoch's processed-record bitmap. A step is committed
once its record is here (written by the coordinator after Orbax finalized the checkpoint on every
process). The store works on any TensorStore kvstore: a local path (default), or a URL such as
gs://bucket/run/lineage or s3://bucket/run/lineage.
"""

from __future__ import annotations

import base64
import json

import numpy as np
import tensorstore as ts

_LOG = "log/"
_STATE = "state/"


def pack_bitmap(processed_N: np.ndarray) -> str:
  return base64.b64encode(np.packbits(processed_N.astype(bool))).decode()


def unpack_bitmap(text: str, n: int) -> np.ndarray:
  return np.unpackbits(np.frombuffer(base64.b64decode(text), np.uint8), count=n).astype(bool)


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
    return json.loads(result.value) if result.state == "value" else None

  def commit(self, record: dict) -> None:
    """Writes the lineage record of a finalized checkpoint step (idempotent)."""
    self._put(f"{_LOG}{int(record['global_step']):012d}", record)

  def committed_steps(self) -> list[int]:
    keys = self._kv.list(ts.KvStore.KeyRange(_LOG, _LOG[:-1] + chr(ord("/") + 1))).result()
    return sorted(int(k.decode()[len(_LOG):]) for k in keys)

  def record(self, step: int) -> dict | None:
    return self._get(f"{_LOG}{int(step):012d}")

  def latest(self) -> dict | None:
    steps = self.committed_steps()
    return self.record(steps[-1]) if steps else None

  def put_state(self, name: str, value: dict) -> None:
    self._put(_STATE + name, value)

  def get_state(self, name: str) -> dict | None:
    return self._get(_STATE + name)
