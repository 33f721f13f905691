"""Clinical tables: formats, resampling, and every kind of malformed row or value."""

import numpy as np
import pytest

from medjax.data import tables


def _write(tmp_path, name, text):
  path = tmp_path / name
  path.write_text(text)
  return str(path)


def _by_id(table):
  return dict(zip(table.ids.tolist(), table.values))


def test_labs_wide_blank_is_missing_and_order_follows_config(tmp_path):
  path = _write(tmp_path, "labs.csv", "patient_id,K,Na\nP1,4.1,140\nP2,,138\n")
  problems = tables.Problems("raise")
  labs = tables.read_labs(path, ("Na", "K", "Cl"), {}, problems)
  assert labs.analytes == ["Na", "K", "Cl"]
  values = _by_id(labs)
  np.testing.assert_allclose(values["P1"], [140, 4.1, np.nan])
  np.testing.assert_allclose(values["P2"], [138, np.nan, np.nan])


def test_labs_long_format_and_rename(tmp_path):
  path = _write(tmp_path, "labs.csv",
                "patient_id,analyte,value\nP1,K+,4.0\nP1,Na,141\nP2,Na,135\n")
  values = _by_id(tables.read_labs(path, ("Na", "K"), {"K+": "K"}, tables.Problems("raise")))
  np.testing.assert_allclose(values["P1"], [141, 4.0])
  np.testing.assert_allclose(values["P2"], [135, np.nan])


def test_unknown_analyte_column_names_file_column_and_fix(tmp_path):
  path = _write(tmp_path, "labs.csv", "patient_id,Na,K+\nP1,140,4\n")
  with pytest.raises(tables.TableError) as e:
    tables.read_labs(path, ("Na", "K"), {}, tables.Problems("raise"))
  msg = str(e.value)
  assert "labs.csv:1" in msg and "'K+'" in msg and "config.data.rename" in msg
  problems = tables.Problems("quarantine")
  values = _by_id(tables.read_labs(path, ("Na", "K"), {}, problems))
  np.testing.assert_allclose(values["P1"], [140, np.nan])
  assert [(p.source, p.line) for p in problems.items] == [("labs.csv", 1)]


def test_non_numeric_value_names_line_column_and_value(tmp_path):
  path = _write(tmp_path, "labs.csv", "patient_id,Na,K\nP1,140,4\nP2,13O,3.9\n")
  with pytest.raises(tables.TableError, match=r"labs.csv:3: column 'Na': value '13O'"):
    tables.read_labs(path, (), {}, tables.Problems("raise"))
  problems = tables.Problems("quarantine")
  values = _by_id(tables.read_labs(path, (), {}, problems))
  np.testing.assert_allclose(values["P2"], [np.nan, 3.9])  # only the bad cell is lost
  assert problems.items[0].line == 3 and problems.items[0].what == "values"
  assert problems.files["labs.csv"]["values"] == {"not_a_number": {"Na": 1}}


def test_duplicate_patient_row_keeps_first(tmp_path):
  path = _write(tmp_path, "labs.csv", "patient_id,Na\nP1,140\nP1,150\n")
  problems = tables.Problems("quarantine")
  values = _by_id(tables.read_labs(path, (), {}, problems))
  assert values["P1"][0] == 140
  assert problems.items[0].line == 3 and "duplicate" in problems.items[0].reason
  assert "P1" not in problems.items[0].reason  # reasons never carry patient ids
  with pytest.raises(tables.TableError, match="labs.csv:3: duplicate patient row"):
    tables.read_labs(path, (), {}, tables.Problems("raise"))


def test_labels_duplicates_and_lines(tmp_path):
  path = _write(tmp_path, "labels.csv", "patient_id,diagnosis\nP1,flu\nP2,copd\nP1,flu\n")
  problems = tables.Problems("quarantine")
  labels, lines = tables.read_labels(path, problems).as_dicts()
  assert labels == {"P1": "flu", "P2": "copd"} and lines == {"P1": 2, "P2": 3}
  assert problems.items[0].line == 4


CHANNELS = ("hr", "sbp", "dbp", "rr", "spo2", "temp")


def test_vitals_resampled_to_steps_with_mask(tmp_path):
  path = _write(tmp_path, "vitals.csv",
                "patient_id,hour,hr,sbp,dbp,rr,spo2,temp\n"
                "P1,0,80,120,80,16,98,37.0\n"
                "P1,0.5,90,,80,16,98,37.0\n"
                "P1,2,70,110,70,14,97,36.8\n"
                "P1,30,1,1,1,1,1,1\n")
  vitals = tables.read_vitals(path, CHANNELS, 4, 1.0, tables.Problems("raise"))
  v, late = _by_id(vitals)["P1"], vitals.late
  assert v.shape == (4, 6) and late == 1
  assert v[0, 0] == 85 and v[0, 1] == 120  # mean of the rows in the bin; blank ignored
  assert np.isnan(v[1]).all() and v[2, 0] == 70 and np.isnan(v[3]).all()


def test_vitals_iso_timestamps_count_from_first_row(tmp_path):
  path = _write(tmp_path, "vitals.csv",
                "patient_id,timestamp,hr,sbp,dbp,rr,spo2,temp\n"
                "P1,2024-01-01T10:00:00,80,120,80,16,98,37\n"
                "P1,2024-01-01T13:30:00,60,120,80,16,98,37\n")
  series = _by_id(tables.read_vitals(path, CHANNELS, 6, 1.0, tables.Problems("raise")))
  assert series["P1"][0, 0] == 80 and series["P1"][3, 0] == 60


def test_vitals_row_out_of_time_order(tmp_path):
  path = _write(tmp_path, "vitals.csv",
                "patient_id,hour,hr,sbp,dbp,rr,spo2,temp\n"
                "P1,3,80,120,80,16,98,37\nP2,0,70,120,80,16,98,37\nP1,1,90,120,80,16,98,37\n")
  with pytest.raises(tables.TableError, match=r"vitals.csv:4: row out of time order \(hour '1'"):
    tables.read_vitals(path, CHANNELS, 6, 1.0, tables.Problems("raise"))
  problems = tables.Problems("quarantine")
  series = _by_id(tables.read_vitals(path, CHANNELS, 6, 1.0, problems))
  assert series["P1"][3, 0] == 80 and np.isnan(series["P1"][1, 0])
  assert [p.line for p in problems.items] == [4]


def test_missing_channel_column_is_a_clear_error(tmp_path):
  path = _write(tmp_path, "vitals.csv", "patient_id,hour,hr\nP1,0,80\n")
  with pytest.raises(tables.TableError, match=r"channel columns \['sbp'"):
    tables.read_vitals(path, CHANNELS, 6, 1.0, tables.Problems("quarantine"))


def test_bad_policy_is_rejected():
  with pytest.raises(ValueError, match="config.data.on_error"):
    tables.Problems("ignore")
