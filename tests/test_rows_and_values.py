"""One bad row costs its own row, one bad value its own value (issue 32, items 2 and 3): for every
column kind a file with one bad row among good ones keeps the good ones whole, and numbers are
checked as float64 (finite, within float32, plausible) before anything narrows them, so that no
infinity or NaN reaches tables.npz."""

import os

import numpy as np
import pytest

from configs import default as default_config
from medjax.data import ingest
from medjax.data import tables

CHANNELS = ("hr", "sbp", "dbp", "rr", "spo2", "temp")
VITALS_HEADER = "patient_id,{time},hr,sbp,dbp,rr,spo2,temp\n"


def _write(tmp_path, name, text):
  path = tmp_path / name
  path.write_bytes(text.encode() if isinstance(text, str) else text)
  return str(path)


def _problems():
  return tables.Problems("quarantine")


# -- labels ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", ["P3,measles", "P3,co\x01pd", 'P3,"copd', "P3,", "P3,copd,x",
                                 ",copd", "P3,co\x00pd", "P3\tcopd"])
@pytest.mark.parametrize("where", [0, 2, 4])
def test_one_bad_label_row_costs_its_row(tmp_path, bad, where):
  good = [f"P{i},{'flu' if i % 2 else 'copd'}" for i in (1, 2, 4, 5)]
  rows = good[:where] + [bad] + good[where:]
  path = _write(tmp_path, "labels.csv", "patient_id,diagnosis\n" + "\n".join(rows) + "\n")
  problems = _problems()
  labels = tables.read_labels(path, problems, classes=("flu", "copd"))
  assert dict(zip(labels.ids, labels.classes)) == {
      "P1": "flu", "P2": "copd", "P4": "copd", "P5": "flu"}
  assert [p.line for p in problems.items] == [where + 2]


# -- labs -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("bad,lost", [
    ("P3,abc,4.0", {"Na"}), ("P3,140,1e39", {"K"}), ("P3,-1e300,4.0", {"Na"}),
    ("P3,140,inf", {"K"}), ("P3,999,4.0", {"Na"}), ("P3,140,4\x01.0", "row"),
    ("P3,140", "row"), ("P3,140,4.0,9", "row")])
def test_one_bad_wide_lab_cell_or_row_costs_its_own(tmp_path, bad, lost):
  rows = ["P1,140,4.0", "P2,141,4.1", bad, "P4,142,4.2"]
  path = _write(tmp_path, "labs.csv", "patient_id,Na,K\n" + "\n".join(rows) + "\n")
  labs = tables.read_labs(path, ("Na", "K"), {}, _problems(), tables.value_ranges())
  by_id = dict(zip(labs.ids, labs.values))
  for pid, na, k in (("P1", 140, 4.0), ("P2", 141, 4.1), ("P4", 142, 4.2)):
    np.testing.assert_allclose(by_id[pid], [na, k], rtol=1e-6)
  if lost == "row":
    assert "P3" not in by_id
  else:
    kept = {"Na", "K"} - lost
    values = dict(zip(("Na", "K"), by_id["P3"]))
    assert all(np.isnan(values[a]) for a in lost) and all(np.isfinite(values[a]) for a in kept)


@pytest.mark.parametrize("bad", ["P1,Na,abc", "P1,Xx,3", "P1,Na,1e40", "P1,Na,140", "P1,N\x02a,3",
                                 "P1,,3"])
def test_one_bad_long_lab_row_costs_its_row(tmp_path, bad):
  rows = ["P1,Na,140", "P1,K,4.0", bad, "P2,Na,141", "P2,K,4.1"]
  path = _write(tmp_path, "labs.csv", "patient_id,analyte,value\n" + "\n".join(rows) + "\n")
  labs = tables.read_labs(path, ("Na", "K"), {}, _problems(), tables.value_ranges())
  by_id = dict(zip(labs.ids, labs.values))
  np.testing.assert_allclose(by_id["P1"], [140, 4.0], rtol=1e-6)
  np.testing.assert_allclose(by_id["P2"], [141, 4.1], rtol=1e-6)


# -- vitals ---------------------------------------------------------------------------------------

def _vitals(tmp_path, rows, time="hour", steps=6):
  path = _write(tmp_path, "vitals.csv", VITALS_HEADER.format(time=time) + "\n".join(rows) + "\n")
  problems = _problems()
  out = tables.read_vitals(path, CHANNELS, steps, 1.0, problems)
  return dict(zip(out.ids, out.values)), problems


def _row(pid, t, hr):
  return f"{pid},{t},{hr},120,80,16,98,37"


@pytest.mark.parametrize("bad", ["soon", "-3", "2024-01-01T03:00:00", "", "1e400", "nan"])
@pytest.mark.parametrize("where", [0, 2, 5])
def test_one_bad_hour_costs_its_row_only(tmp_path, bad, where):
  good = [_row("P1", t, 60 + t) for t in range(5)]
  rows = good[:where] + [_row("P1", bad, 999)] + good[where:]
  series, problems = _vitals(tmp_path, rows + [_row("P2", 0, 70)])
  np.testing.assert_array_equal(series["P1"][:5, 0], [60, 61, 62, 63, 64])
  assert series["P2"][0, 0] == 70
  assert [p.line for p in problems.items if p.what == "row"] == [where + 2]


@pytest.mark.parametrize("bad_hour", [1000, 3])
@pytest.mark.parametrize("where", [1, 3])
def test_a_mistyped_hour_costs_its_row_not_the_rest_of_the_series(tmp_path, bad_hour, where):
  """A hour typed too large (1000: past the last step) or out of place (3 among 0,1,2,4,...)
  leaves every other row of the patient where it was."""
  hours = [0, 1, 2, 4, 5]
  rows = [_row("P1", t, 60 + t) for t in hours]
  rows.insert(where, _row("P1", bad_hour, 999))
  series, problems = _vitals(tmp_path, rows)
  for t in hours:
    assert series["P1"][t, 0] == 60 + t
  assert series["P1"][3, 0] != 999   # the odd row went nowhere near another hour's bin


@pytest.mark.parametrize("bad_year", ["2013", "2033"])
@pytest.mark.parametrize("where", [0, 2, 5])
def test_a_mistyped_year_costs_its_row_not_the_series(tmp_path, bad_year, where):
  good = [_row("P1", f"2023-05-01T{h:02d}:00:00", 60 + h) for h in range(5)]
  rows = good[:where] + [_row("P1", f"{bad_year}-05-01T02:30:00", 999)] + good[where:]
  series, problems = _vitals(tmp_path, rows + [_row("P2", "2023-06-01T00:00:00", 70)],
                             time="timestamp")
  np.testing.assert_array_equal(series["P1"][:5, 0], [60, 61, 62, 63, 64])
  assert series["P2"][0, 0] == 70
  reasons = [p.reason for p in problems.items if p.what == "row"]
  late = problems.files["vitals.csv"]["rows_past_last_step"]
  # Set aside with its reason; or, a last row years later, past the series' last step (counted).
  assert len(reasons) + late == 1 and not any(bad_year in r for r in reasons)


def test_a_stay_longer_than_the_series_starts_at_its_first_row(tmp_path):
  """Timestamps over 3 days without a gap are one stay: the series starts at admission and the
  rows past its last step are counted, none set aside; a separate earlier visit, days before,
  is cut off before the stay that holds most rows."""
  rows = [_row("P1", f"2023-05-0{1 + h // 24}T{h % 24:02d}:00:00", 60 + h % 24)
          for h in range(0, 72, 2)]
  series, problems = _vitals(tmp_path, rows, time="timestamp")
  np.testing.assert_array_equal(series["P1"][[0, 2, 4], 0], [60, 62, 64])
  assert not problems.items and problems.files["vitals.csv"]["rows_past_last_step"] == 33
  series, problems = _vitals(tmp_path, [_row("P1", "2023-04-20T08:00:00", 99)] + rows,
                             time="timestamp")
  np.testing.assert_array_equal(series["P1"][[0, 2, 4], 0], [60, 62, 64])
  assert len(problems.items) == 1 and "lies more than 6 hours before" in problems.items[0].reason


def test_rows_of_two_kinds_follow_the_files_majority(tmp_path):
  """The first row's kind no longer decides: one timestamp first in an hours file costs itself."""
  rows = [_row("P1", "2024-01-01T00:00:00", 99)] + [_row("P1", t, 60 + t) for t in range(4)]
  series, problems = _vitals(tmp_path, rows)
  np.testing.assert_array_equal(series["P1"][:4, 0], [60, 61, 62, 63])
  assert "most of the file's times are hours" in problems.items[0].reason


@pytest.mark.parametrize("bad", ["abc", "1e39", "-1e39", "inf", "700"])
def test_one_bad_vitals_value_costs_its_value(tmp_path, bad):
  rows = [_row("P1", t, 60 + t) for t in range(3)] + [f"P1,3,{bad},121,81,17,97,36.5"]
  series, problems = _vitals(tmp_path, rows)
  np.testing.assert_array_equal(series["P1"][:3, 0], [60, 61, 62])
  assert np.isnan(series["P1"][3, 0]) and series["P1"][3, 1] == 121
  assert [p.what for p in problems.items] == ["values"]


# -- numbers beyond float32, and tables.npz -------------------------------------------------------

@pytest.mark.parametrize("value", ["3.5e38", "-3.5e38", "1e300", "-1e300", "3.4028236e38"])
def test_a_value_beyond_float32_is_set_to_missing_with_its_reason(tmp_path, value):
  path = _write(tmp_path, "labs.csv", f"patient_id,Na,Extra\nP1,140,{value}\nP2,141,2\n")
  problems = _problems()
  labs = tables.read_labs(path, ("Na", "Extra"), {}, problems, tables.value_ranges())
  assert np.isfinite(labs.values[1]).all() and np.isnan(labs.values[0, 1])
  (p,) = problems.items
  assert p.line == 2 and "beyond what float32 holds" in p.reason and value not in p.reason


def test_labs_have_plausible_ranges_like_vitals(tmp_path):
  path = _write(tmp_path, "labs.csv", "patient_id,NA,Glucose,Creatinine\nP1,1400,95,-1\n"
                                      "P2,141,95000,1.1\n")
  problems = _problems()
  labs = tables.read_labs(path, ("NA", "Glucose", "Creatinine"), {}, problems,
                          tables.value_ranges())
  assert np.isnan(labs.values).sum() == 3
  assert all("outside the plausible range" in p.reason for p in problems.items)


def test_no_infinity_or_nan_reaches_tables_npz(tmp_path):
  root = tmp_path / "cohort"
  root.mkdir()
  (root / "labels.csv").write_text("patient_id,diagnosis\nP1,flu\nP2,copd\nP3,flu\n")
  (root / "labs.csv").write_text("patient_id,Na,K,Extra\nP1,140,inf,1e39\nP2,nan,4.1,-1e300\n"
                                 "P3,139,,3.4e38\n")
  (root / "vitals.csv").write_text(VITALS_HEADER.format(time="hour")
                                   + "P1,0,1e39,120,80,16,98,37\nP2,0,80,-inf,80,16,98,37\n")
  config = default_config.get_config()
  config.data.vitals_steps = 4
  config.data.split = (0.5, 0.0, 0.5)
  config.data.analytes = ()
  result = ingest.run(config, str(tmp_path / "work"), str(root))
  with np.load(os.path.join(tmp_path, "work", "ingest", "tables.npz")) as f:
    saved = dict(f)
  for key, value in saved.items():
    if value.dtype.kind == "f":
      assert np.isfinite(value).all(), key
  assert saved["labs_mask"].sum() == 4 and saved["vitals_mask"].sum() == 10
  kinds = result.summary["tables"]
  assert kinds["values_beyond_float32"] == {"Extra": 2, "hr": 1}
  assert kinds["values_non_finite"] == {"K": 1, "Na": 1, "sbp": 1}
