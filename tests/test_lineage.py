"""The Lineage type: serialisation, validation, the trainer's Cursor."""

import json

import numpy as np
import pytest

from medjax import lineage


def _start(n=20, epoch=0, step=0, base=None):
  return lineage.Lineage.start(epoch=epoch, global_step=step, seed=3, placement="abc",
                               hosts=("host-0", "host-1"),
                               base_N=np.zeros(n, bool) if base is None else base)


def test_round_trip_through_json_equals_the_original():
  base = np.zeros(20, bool)
  base[[1, 5, 19]] = True
  original = _start(base=base, epoch=2, step=40)
  text = json.dumps(original.to_dict())
  again = lineage.Lineage.from_dict(json.loads(text))
  assert again == original
  assert again.segment.hosts == ("host-0", "host-1")
  np.testing.assert_array_equal(again.base_N(20), base)
  np.testing.assert_array_equal(again.processed_N(20), base)
  # The store adds when it committed; that is not part of the lineage.
  assert lineage.Lineage.from_dict({**original.to_dict(), "committed_at": 5.0}) == original


def test_records_without_generation_from_earlier_versions_still_read():
  d = _start().to_dict()
  del d["generation"]
  assert lineage.Lineage.from_dict(d).generation == 0


@pytest.mark.parametrize("change, message", [
    (lambda d: d.pop("epoch"), "field 'epoch' is missing"),
    (lambda d: d.update(global_step="7"), "field 'global_step' is '7', not an int >= 0"),
    (lambda d: d.update(global_step=7.0), "field 'global_step' is 7.0, not an int >= 0"),
    (lambda d: d.update(offset=True), "field 'offset' is True, not an int >= 0"),
    (lambda d: d.update(seed=None), "field 'seed' is None, not an int"),
    (lambda d: d.update(segment=[]), "field 'segment' is [], not an object"),
    (lambda d: d["segment"].update(hosts="host-0"),
     "field 'segment.hosts' is 'host-0', not a list (each a string)"),
    (lambda d: d["segment"].update(hosts=["host-0", 1]),
     "field 'segment.hosts[1]' is 1, not a string"),
    (lambda d: d["segment"].update(placement=5), "field 'segment.placement' is 5, not a string"),
    (lambda d: d["segment"].pop("base"), "field 'segment.base' is missing"),
    (lambda d: d.update(processed="not*base64"), "field 'processed' is 'not*base64', not a packed "
                                                 "bitmap"),
    (lambda d: d.update(processed=None), "field 'processed' is None, not a string"),
    (lambda d: d.update(partition=-1), "field 'partition' is -1, not an int >= 0"),
    # No coercion: what from_dict once read as int("3") or str(0) is refused.
    (lambda d: d.update(generation="3"), "field 'generation' is '3', not an int >= 0"),
    (lambda d: d.update(generation=-2), "field 'generation' is -2, not an int >= 0"),
    (lambda d: d.update(stopped=0), "field 'stopped' is 0, not a string"),
    (lambda d: d.update(stopped=None), "field 'stopped' is None, not a string"),
    (lambda d: d.update(validation={"0": 0.5}), "field 'validation' is {'0': 0.5}, not a list"),
    (lambda d: d.update(validation=[[0, 0.5]]), "field 'validation[0]' is [0, 0.5], not ["),
    (lambda d: d.update(validation=[[0, True, 5]]), "field 'validation[0][1]' is True, not null "
                                                    "or a number"),
    (lambda d: d.update(validation=[[0, "0.5", 5]]), "field 'validation[0][1]' is '0.5'"),
    (lambda d: d.update(validation=[[0, 0.5, 5], ["1", 0.6, 10]]),
     "field 'validation[1][0]' is '1', not an int >= 0"),
])
def test_damaged_records_are_refused_naming_the_field(change, message):
  d = _start().to_dict()
  d["validation"] = [[0, 0.25, 4]]
  assert lineage.Lineage.from_dict(json.loads(json.dumps(d))).validation == ((0, 0.25, 4),)
  change(d)
  with pytest.raises(lineage.LineageError) as e:
    lineage.Lineage.from_dict(d)
  assert str(e.value).startswith("lineage " + message), str(e.value)
  with pytest.raises(lineage.LineageError, match="not an object"):
    lineage.Lineage.from_dict(["not", "a", "dict"])


def test_cursor_steps_partitions_and_segments():
  cursor = lineage.Cursor(_start(n=10), 10, generation=4)
  cursor.step_done(np.array([[0, 1], [2, -1]]))
  cursor.step_done(np.array([[3, 4], [-1, -1]]))
  snap = cursor.lineage()
  assert (snap.global_step, snap.epoch, snap.partition, snap.offset) == (2, 0, 0, 2)
  assert snap.generation == 4
  np.testing.assert_array_equal(np.flatnonzero(snap.processed_N(10)), [0, 1, 2, 3, 4])
  # A snapshot is a value: later steps do not change it.
  cursor.step_done(np.array([[5]]))
  assert snap.offset == 2 and not snap.processed_N(10)[5]
  cursor.partition_done()
  assert (cursor.partition, cursor.offset) == (1, 0)
  # Resuming from a snapshot continues from exactly there.
  resumed = lineage.Cursor(cursor.lineage(), 10)
  assert resumed.lineage() == lineage.Cursor(cursor.lineage(), 10).lineage()
  np.testing.assert_array_equal(resumed.processed_N, cursor.processed_N)
  # A new segment (next epoch, or another placement) starts at partition 0 with its base.
  base = np.zeros(10, bool)
  base[[7]] = True
  cursor.new_segment(epoch=1, placement="xyz", hosts=("host-0",), base_N=base)
  nxt = cursor.lineage()
  assert (nxt.global_step, nxt.epoch, nxt.partition, nxt.offset) == (3, 1, 0, 0)
  assert nxt.segment.placement == "xyz" and nxt.generation == 4
  np.testing.assert_array_equal(nxt.base_N(10), base)
  np.testing.assert_array_equal(nxt.processed_N(10), base)


def test_store_commits_typed_records_and_skips_nothing(tmp_path):
  store = lineage.LineageStore(str(tmp_path / "lineage"))
  assert store.latest() is None and store.record(3) is None
  a, b = _start(step=3), _start(step=9, epoch=1)
  store.commit(b, committed_at=2.0)
  store.commit(a, committed_at=1.0)
  assert store.committed_steps() == [3, 9]
  assert store.record(3) == a and store.latest() == b
