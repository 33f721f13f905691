"""What real exports put in the tables: identifier columns, placeholder dates, thousands
separators, missing-value markers as ids and classes, classes spelt in several cases. Each is
read as meant or set aside with its reason; none stops the ingest, misreads a value quietly or
quotes what may identify a patient."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from medjax import errors
from medjax.data import ingest_summary
from medjax.data import tables
from medjax.data.tables import analytes
from medjax.data.tables import values as values_lib


def _write(tmp_path, name: str, text: str) -> str:
  path = tmp_path / name
  path.write_text(text)
  return str(path)


def _reasons(problems: tables.Problems) -> list[str]:
  return [p.reason for p in problems.items]


def _ingest_table(problems: tables.Problems) -> str:
  """The ingest table's text for a cohort of these tables alone (its lines about the tables)."""
  return ingest_summary.format_summary({
      "patients": 0, "splits": {"train": 0, "val": 0, "test": 0}, "dicom_files": 0, "images": 0,
      "quarantined": 0, "groups": {}, "missing": {}, "classes": {}, "quarantine_reasons": {},
      "tables": ingest_summary.tables_summary(problems, [], {}, {}, False)})


def test_identifier_columns_are_no_analytes_and_their_values_are_never_quoted(tmp_path):
  """An MRN beside the PatientID was an analyte (each patient's MRN a float in tables.npz);
  a name and a birth date were too, quoted in the report as values that are not numbers."""
  path = _write(tmp_path, "labs.csv", "PatientID,MRN,patient_name,Date of Birth,Na,K\n"
                "P1,55012345,Smith^John,01/10/67,135,3.5\n"
                "P2,55012346,Doe^Jane,02/11/68,Smith^Jane,3.6\n")
  problems = tables.Problems("quarantine")
  labs = tables.read_labs(path, (), {}, problems)
  assert labs.analytes == ["Na", "K"]
  np.testing.assert_allclose(labs.values, [[135, 3.5], [np.nan, 3.6]], rtol=1e-6)
  reasons = _reasons(problems)
  for column, name in ((2, "'MRN'"), (3, "'patient_name'"), (4, "'Date of Birth'")):
    assert (f"column {column} ({name}) identifies patients rather than measuring them; its "
            "values are ignored") in reasons
  assert "column 'Na': value (withheld: it may identify a patient) is not a number; set to " \
         "missing" in reasons
  assert not any(text in r for r in reasons for text in ("Smith", "Doe", "/67", "5501"))


def test_a_value_that_is_not_a_number_is_quoted_only_when_it_cannot_be_a_name_or_date():
  ids: set[str] = set()
  for text in ("1,2.3", "5.4 mmol/L", "inf", "-Infinity", "#N/A"):
    assert values_lib.shown_value(text, ids) == f"'{text}'"
  for text in ("Smith^John", "positive", "01/10/67", "3.1.24"):
    assert values_lib.shown_value(text, ids) == "(withheld: it may identify a patient)"


def test_thousands_separators_are_not_read_as_decimal_commas(tmp_path):
  """A US tab-separated export: '1,050' was read as 1.05. It is set aside unless the column
  also holds an unambiguous decimal comma ('36,6'), which says what its commas are."""
  path = _write(tmp_path, "labs.csv", "patient_id\tGlucose\tTemp\n"
                "P1\t1,050\t36,6\nP2\t98\t1,375\nP3\t105\xa0\t37,25\n")
  problems = tables.Problems("quarantine")
  labs = tables.read_labs(path, (), {}, problems, ranges={})
  np.testing.assert_allclose(labs.values, [[np.nan, 36.6], [98, 1.375], [105, 37.25]],
                             rtol=1e-6)
  assert problems.files["labs.csv"]["values"] == {"ambiguous_comma": {"Glucose": 1}}
  assert ("column 'Glucose': value '1,050' may hold a decimal comma or a thousands separator, "
          "and no other value in the column says which; set to missing") in _reasons(problems)


def test_a_placeholder_date_costs_its_row_not_the_file(tmp_path):
  """'9999-12-31' and '1600-01-01' are valid timestamps outside pandas' nanosecond range:
  subtracting the epoch in nanoseconds stopped the whole ingest (OutOfBoundsDatetime)."""
  rows = "".join(f"P1,2024-03-01T{10 + h:02d}:00:00,{70 + h}\n" for h in range(4))
  path = _write(tmp_path, "vitals.csv", "patient_id,time,hr\n" + rows
                + "P1,1600-01-01,99\nP2,2024-03-01T10:00:00,80\nP2,9999-12-31,81\n")
  problems = tables.Problems("quarantine")
  vitals = tables.read_vitals(path, ["hr"], 6, 1.0, problems)
  hr = dict(zip(vitals.ids.tolist(), vitals.values[:, :, 0]))
  np.testing.assert_array_equal(hr["P1"][:4], [70, 71, 72, 73])
  assert hr["P2"][0] == 80
  assert any(p.line == 6 and "time (withheld" in p.reason for p in problems.items)


def test_missing_value_markers_are_no_id_and_no_class(tmp_path):
  """'NULL' and '#N/A' as ids made patients joining every such row; as classes, classes."""
  path = _write(tmp_path, "labels.csv", "patient_id,diagnosis\nP1,flu\nNULL,flu\n#N/A,copd\n"
                "P2,#N/A\nP3,NULL\nP4,copd\n")
  problems = tables.Problems("quarantine")
  labels = tables.read_labels(path, problems)
  assert labels.ids.tolist() == ["P1", "P4"] and labels.classes.tolist() == ["flu", "copd"]
  assert sorted(p.line for p in problems.items) == [3, 4, 5, 6]
  assert all("missing-value marker" in r for r in _reasons(problems))


def test_classes_spelt_in_several_cases_are_one_class(tmp_path):
  path = _write(tmp_path, "labels.csv", "patient_id,diagnosis\nP1,Normal\nP2,normal \n"
                "P3,NORMAL\nP4,Normal\nP5,Abnormal\n")
  problems = tables.Problems("quarantine")
  labels = tables.read_labels(path, problems)
  assert labels.classes.tolist() == ["Normal"] * 4 + ["Abnormal"]
  assert problems.files["labels.csv"]["classes_merged_by_case"] == {
      "NORMAL": "Normal", "normal": "Normal"}
  configured = tables.read_labels(path, tables.Problems("quarantine"),
                                  classes=("normal", "abnormal"))
  assert configured.classes.tolist() == ["normal"] * 4 + ["abnormal"]


def test_rows_off_each_patients_time_order_are_found_with_patients_interleaved():
  """Each patient's rows gathered by one sort (selecting them patient by patient took rows x
  patients: 200,000 patients written newest first, 165 s); the rows found are the same."""
  ids = np.array(["A", "B", "A", "B", "A", "A", "B", "C"], dtype=object)
  hours = np.array([0, 5, 2, 4, 1, 2, 6, 0], dtype=np.float64)
  out_of_order, repeated = tables.vitals._off_the_longest_run(ids, hours, np.ones(8, bool))
  assert np.flatnonzero(out_of_order).tolist() == [3] and np.flatnonzero(repeated).tolist() == [2]


def test_long_labs_name_their_columns_as_exports_do_and_analytes_in_any_case(tmp_path):
  """'result' for the value (read as a wide file before: analytes 'analyte' and 'result');
  'Na', 'NA', 'na' for one analyte (three before)."""
  path = _write(tmp_path, "labs.csv", "patient_id,test,result\nP1,Na,135\nP1,K,3.5\n"
                "P2,NA,136\nP3,na,137\nP3,k,3.7\n")
  problems = tables.Problems("quarantine")
  labs = tables.read_labs(path, (), {}, problems)
  assert labs.analytes == ["K", "Na"]
  np.testing.assert_allclose(labs.values, [[3.5, 135], [np.nan, 136], [3.7, 137]], rtol=1e-6)
  assert problems.files["labs.csv"]["analytes_merged_by_case"] == {"NA": "Na", "k": "K",
                                                                   "na": "Na"}


def test_vitals_times_with_decimal_commas_and_times_that_are_not_hours(tmp_path):
  path = _write(tmp_path, "vitals.csv", "patient_id;hour;hr\nP1;0,5;70\nP1;1,5;71\n")
  vitals = tables.read_vitals(path, ["hr"], 4, 1.0, tables.Problems("quarantine"))
  np.testing.assert_array_equal(vitals.values[0, :2, 0], [70, 71])
  # Epoch seconds as hours: every row past the series, said once for the file.
  path = _write(tmp_path, "vitals.csv", "patient_id,hour,hr\nP1,1709287200,70\n"
                "P1,1709290800,71\n")
  problems = tables.Problems("quarantine")
  vitals = tables.read_vitals(path, ["hr"], 4, 1.0, problems)
  assert vitals.late == 2
  (problem,) = problems.items
  assert problem.line == 1 and problem.reason.startswith(
      "every row's 'hour' lies past the last step (4 hours: data.vitals_steps x "
      "vitals_hours_per_step): are they hours since admission?")


def test_a_date_column_beside_times_of_day_makes_them_timestamps(tmp_path):
  """A flowsheet export splits each time into 'Recorded Date' and 'Recorded Time' (10:00 PM):
  every vitals row was set aside ('time '22:00' is neither hours nor an ISO timestamp'), and a
  labs file's draws were all at one unreadable time, the later kept as the first in the file.
  A time of day beside a date column is that date's time (a 12-hour clock, a date a spreadsheet
  wrote with midnight, a series across midnight); a row with no time is 'empty', not 'nan'."""
  path = _write(tmp_path, "vitals.csv", "MRN,Recorded Date,Recorded Time,hr\n"
                "P1,01/31/2024 00:00:00,10:00 PM,80\nP1,01/31/2024,11:00 pm,81\n"
                "P1,02/01/2024,12:00 AM,82\nP1,02/01/2024,1:00,83\n"
                "P2,02/05/2024,,70\nP2,02/05/2024,09:00:00,71\n")
  problems = tables.Problems("quarantine")
  vitals = tables.read_vitals(path, ["hr"], 6, 1.0, problems)
  np.testing.assert_allclose(vitals.values[:, :4, 0], [[80, 81, 82, 83],
                                                       [71, np.nan, np.nan, np.nan]])
  assert [p.reason for p in problems.items] == ["empty 'Recorded Time'; the row is set aside"]
  assert problems.files["vitals.csv"]["times_dated"] == {"date_column": "Recorded Date",
                                                         "rows": 5}
  labs = _write(tmp_path, "labs.csv", "patient_id,Date,Time,analyte,value\n"
                "P1,2024-01-02,08:00,Na,150\nP1,2024-01-01,23:00,Na,140\n")
  problems = tables.Problems("quarantine")
  np.testing.assert_allclose(tables.read_labs(labs, (), {}, problems).values, [[140]])
  assert problems.items == [] and problems.files["labs.csv"]["later_draws"] == 1


def test_hl7_compact_timestamps_are_timestamps(tmp_path):
  """An HL7 feed's times as digits (202401010800, 20240101083015, a date 20240102) were hours
  since admission: every row past the last step. A number of 8, 12 or 14 digits that is a valid
  date and time is a timestamp; epoch seconds are not (still past the last step, reported)."""
  path = _write(tmp_path, "vitals.csv", "patient_id,charttime,hr\nP1,202401012300,80\n"
                "P1,20240102000000,81\nP1,202401020130,82\nP2,20240105,70\nP2,,71\n")
  problems = tables.Problems("quarantine")
  vitals = tables.read_vitals(path, ["hr"], 4, 1.0, problems)
  np.testing.assert_allclose(vitals.values[:, :, 0], [[80, 81, 82, np.nan],
                                                      [70, np.nan, np.nan, np.nan]])
  assert [p.line for p in problems.items] == [6]
  labs = _write(tmp_path, "labs.csv", "patient_id,result_time,analyte,value\n"
                "P1,202401020800,Na,150\nP1,202401012300,Na,140\n")
  np.testing.assert_allclose(tables.read_labs(labs, (), {}, tables.Problems("raise")).values,
                             [[140]])
  epoch = _write(tmp_path, "epoch.csv", "patient_id,time,hr\nP1,1704067200,80\n")
  problems = tables.Problems("quarantine")
  tables.read_vitals(epoch, ["hr"], 4, 1.0, problems)
  assert "lies past the last step" in problems.items[0].reason


def test_a_monitor_exports_channel_names_are_the_channels(tmp_path):
  """'NIBP Systolic', 'NIBP Diastolic' (a bedside monitor's export), 'Resp', 'Systolic' were
  not channel names: the file was refused ('channel columns ['sbp', 'dbp'] not found')."""
  for header in ("MRN,Time,Pulse,NIBP Systolic,NIBP Diastolic,Resp Rate,SpO2 (%),Temp (F)",
                 "MRN,Time,ECG Heart Rate,Systolic,Diastolic,Resp,Pulse Ox,Body Temp"):
    path = _write(tmp_path, "vitals.csv", header + "\nP1,0,80,120,80,16,98,98.6\n")
    vitals = tables.read_vitals(path, ["hr", "sbp", "dbp", "rr", "spo2", "temp"], 2, 1.0,
                                tables.Problems("raise"))
    np.testing.assert_allclose(vitals.values[0, 0], [80, 120, 80, 16, 98, 37], rtol=1e-4)


def test_a_long_file_is_never_read_as_one_analyte_mixing_them_all(tmp_path):
  """An HL7 export's 'observation_identifier'/'observation_value' and Epic's 'Component'/'Result
  Value' were not a long file's columns: the file was read as wide, its value column one
  analyte mixing sodium and potassium (or, with few analytes, the names became categories).
  Those names are a long file's now; a column of analyte names under any other name is
  refused with the config.data.rename that reads it."""
  for header in ("patient_id,observation_datetime,observation_identifier,observation_value,"
                 "units", "MRN,Order Date,Component,Result Value,Reference Unit"):
    path = _write(tmp_path, "labs.csv", header + "\nP1,202401010800,Sodium,140 H,mmol/L\n"
                  "P1,202401010800,Potassium,4.1,mmol/L\nP2,202401020800,Sodium,135,mmol/L\n")
    labs = tables.read_labs(path, (), {}, tables.Problems("raise"))
    assert labs.analytes == ["Potassium", "Sodium"]
    np.testing.assert_allclose(labs.values, [[4.1, 140], [np.nan, 135]])
  for names in (("Sodium", "Potassium"), ("Sodium", "Sodium")):
    path = _write(tmp_path, "labs.csv", "patient_id,obx_3,obx_5\n"
                  f"P1,{names[0]},140\nP2,{names[1]},4.1\n")
    with pytest.raises(errors.InputError, match=(
        r"labs.csv: column 2 \('obx_3'\) names analytes \('Sodium', .*\) as a long file's "
        r"analyte column does, under a name none of \[.*\]; map it and its value column with "
        r"config.data.rename, e.g. \{'obx_3': 'analyte', <the value column>: 'value'\}")):
      tables.read_labs(path, (), {}, tables.Problems("quarantine"))
  # A wide file's categories are not analyte names.
  path = _write(tmp_path, "labs.csv", "patient_id,Na,specimen\n" + "".join(
      f"P{i},140,{'blood' if i % 2 else 'serum'}\n" for i in range(10)))
  assert "specimen=blood" in tables.read_labs(path, (), {}, tables.Problems("raise")).analytes


def test_vitals_written_newest_first_or_in_no_order_keep_their_rows(tmp_path):
  """Order is checked where the file keeps one: newest first it runs backwards (50 of 60 rows
  were set aside as out of order), and a patient whose rows hold no order (an export without
  ORDER BY: 9,808 of 10,000 set aside) keeps every row but those repeating a time. A mostly
  ordered series still loses only its odd row."""
  newest_first = "".join(f"P{p},{h},{70 + h}\n" for p in range(3) for h in (5, 4, 3, 2, 1, 0))
  path = _write(tmp_path, "vitals.csv", "patient_id,hour,hr\n" + newest_first)
  problems = tables.Problems("quarantine")
  vitals = tables.read_vitals(path, ["hr"], 6, 1.0, problems)
  np.testing.assert_array_equal(vitals.values[:, :, 0], [[70, 71, 72, 73, 74, 75]] * 3)
  assert not problems.items
  hours = np.random.default_rng(0).permutation(20)
  shuffled = "".join(f"P1,{h},{70 + h}\n" for h in hours) + f"P1,{hours[0]},99\nP2,0,60\n" \
      "P2,2,61\nP2,1,62\nP2,3,63\n"
  path = _write(tmp_path, "vitals.csv", "patient_id,hour,hr\n" + shuffled)
  problems = tables.Problems("quarantine")
  vitals = tables.read_vitals(path, ["hr"], 20, 1.0, problems)
  hr = dict(zip(vitals.ids.tolist(), vitals.values[:, :, 0]))
  np.testing.assert_array_equal(hr["P1"], 70 + np.arange(20))
  assert [(p.line, p.reason.split(" ")[0]) for p in problems.items] == [
      (22, "duplicate"), (25, "row")]   # P1's repeated hour; P2's hour 1 after 2


def test_long_labs_rows_in_another_unit_are_set_aside_not_mixed_in(tmp_path):
  """A long export's unit column was ignored: CRP in mg/dL (5.4) sat beside mg/L (90-95) as
  one analyte, its z-score meaning nothing. An analyte's unit is the one most of its rows give,
  compared without case, spaces or the micro sign's spelling; a row in a multiple of it (CRP
  mg/dL, 10 mg/L) is converted where its values then lie nearer the other rows' (lactate
  0.8 'mmol/L' beside 10-12 µmol/L would be 800: a wrong unit cell); a row in another unit
  (one `_SI_UNITS` does not convert, or that wrong cell) is set aside with its reason, a row
  without a unit kept."""
  rows = [f"P{p},crp,{90 + p},mg/L" for p in range(6)]
  rows += ["P6,crp,5.4,mg/dL", "P7,crp,100,MG/L ", "P8,crp,101,", "P9,crp,3,mmol/L",
           "P10,crp,97,ug/mL",
           "P1,lactate,10,µmol/L", "P2,lactate,12,umol/l", "P3,lactate,0.8,mmol/L",
           "P4,ferritin,30,P4"]   # a shifted row: the unit cell holds the patient's id
  path = _write(tmp_path, "labs.csv", "patient_id,test,valuenum,valueuom\n"
                + "\n".join(rows) + "\n")
  problems = tables.Problems("quarantine")
  labs = tables.read_labs(path, (), {}, problems)
  assert labs.analytes == ["crp", "ferritin", "lactate"]
  by_id = dict(zip(labs.ids.tolist(), labs.values.tolist()))
  assert by_id["P6"][0] == pytest.approx(54) and by_id["P7"][0] == 100 and by_id["P8"][0] == 101
  assert "P9" not in by_id and by_id["P10"][0] == 97
  assert by_id["P1"][2] == 10 and by_id["P2"][2] == 12 and np.isnan(by_id["P3"][2])
  assert _reasons(problems) == [
      "analyte 'crp' in 'mmol/L', where most of its rows are in 'mg/L'; convert the values "
      "to that unit or give them another analyte name; the row is set aside",
      "analyte 'lactate' in 'mmol/L', where most of its rows are in 'µmol/L'; convert the "
      "values to that unit or give them another analyte name; the row is set aside"]
  assert [p.patient for p in problems.items] == ["P9", "P3"]
  assert problems.files["labs.csv"]["units_rescaled"] == 2
  assert problems.files["labs.csv"]["analyte_units"] == {
      "crp": "mg/L", "ferritin": "(withheld: it may identify a patient)", "lactate": "µmol/L"}


def test_long_labs_in_si_units_are_converted_to_the_conventional_ones(tmp_path):
  """A European export's creatinine in µmol/L (88) and haemoglobin in g/L (140) lay outside
  the plausible ranges (0-40 mg/dL, 0-30 g/dL), so every value was set to missing; beside a
  site in mg/dL, its rows were set aside as in another unit. Known SI units are converted to
  the conventional ones (counted; the analyte's unit is then the conventional one)."""
  rows = ["P1,Creatinine,88.42,µmol/L", "P2,Creatinine,1.2,mg/dL", "P3,Creatinine,176,umol/l",
          "P1,Hemoglobin,140,g/L", "P2,Hemoglobin,13.5,g/dL", "P3,Glucose,5.5,mmol/L",
          "P1,Sodium,140,mmol/L", "P2,Sodium,141,mEq/L", "P3,Hemoglobin,<50,g/L",
          "P4,Creatinine,9,mg/L", "P4,Glucose,1.05,g/L"]   # a French lab's
  path = _write(tmp_path, "labs.csv", "subject_id,label,valuenum,valueuom\n"
                + "\n".join(rows) + "\n")
  problems = tables.Problems("raise")
  labs = tables.read_labs(path, (), {}, problems,
                          ranges={"creatinine": (0.0, 40.0), "hemoglobin": (0.0, 30.0)})
  assert labs.analytes == ["Creatinine", "Glucose", "Hemoglobin", "Sodium"]
  np.testing.assert_allclose(labs.values, [[1.0, np.nan, 14.0, 140], [1.2, np.nan, 13.5, 141],
                                           [1.99, 99.1, 5.0, np.nan],
                                           [0.9, 105, np.nan, np.nan]], rtol=2e-3)
  info = problems.files["labs.csv"]
  assert info["si_units_converted"] == 7
  assert info["analyte_units"] == {"Creatinine": "mg/dL", "Glucose": "mg/dL",
                                   "Hemoglobin": "g/dL", "Sodium": "mmol/L"}
  assert "7 values in SI units or counts per µL (creatinine µmol/L, haemoglobin g/L, " in \
      _ingest_table(problems)


def test_wide_labs_headers_with_units_are_their_analytes_in_conventional_units(tmp_path):
  """'Creatinine (umol/L)' was an analyte of that whole name: no range check and its µmol/L
  kept beside another site's mg/dL. A header's bracketed unit is read: the analyte is the name
  before it, an SI unit is converted, the unit goes to analyte_units. Bracketed text that is
  no unit ('Calcium (ionized)'), a header config.data.analytes names whole and two headers one
  name apart by unit stay whole."""
  path = _write(tmp_path, "labs.csv", "patient_id,Creatinine (umol/L),Haemoglobin [g/L],"
                "Glucose (mg/dL),Calcium (ionized),ALT (U/L),Na (mmol/L),Na (mEq/L)\n"
                "P1,88.42,140,100,1.1,30,140,\nP2,176.84,<50,250,1.2,45,,141\n")
  problems = tables.Problems("raise")
  labs = tables.read_labs(path, (), {}, problems, tables.value_ranges())
  assert labs.analytes == ["Creatinine", "Haemoglobin", "Glucose", "Calcium (ionized)", "ALT",
                           "Na (mmol/L)", "Na (mEq/L)"]
  np.testing.assert_allclose(labs.values[:, :5], [[1.0, 14.0, 100, 1.1, 30],
                                                  [2.0, 5.0, 250, 1.2, 45]], rtol=1e-5)
  info = problems.files["labs.csv"]
  assert info["si_units_converted"] == 4
  assert info["analyte_units"] == {"Creatinine": "mg/dL", "Haemoglobin": "g/dL",
                                   "Glucose": "mg/dL", "ALT": "U/L"}
  # A header the config names whole is that analyte, its values as they are.
  labs = tables.read_labs(path, ("Creatinine (umol/L)", "Glucose"), {},
                          tables.Problems("quarantine"), tables.value_ranges())
  assert labs.values[:, 0].tolist() == [pytest.approx(88.42), pytest.approx(176.84)]
  assert labs.values[:, 1].tolist() == [100, 250]


def test_values_written_with_their_unit_are_numbers_in_it(tmp_path):
  """A spreadsheet typed by hand writes '140 mmol/L' in the cell: every such value was 'not a
  number' (and the column one of text). The unit is now read as a header's would be: an SI
  unit converted ('88.42umol/L'), a value at a limit kept ('<0.01 ng/mL'), a unit medjax does
  not convert sets the column aside. Where plain numbers beside them may be in another unit (a
  convertible analyte, its header giving none), the cells with a unit stay unread."""
  rows = [f"P{i},{135 + i} mmol/L,{88.42 * (1 + i % 2):.2f}umol/L,"
          f"{'<0.01 ng/mL' if i % 2 else '0.05 ng/mL'},{'140 g/L' if i % 2 else '13.5'},"
          f"0.6{i} mmol/L" for i in range(6)]
  path = _write(tmp_path, "labs.csv", "patient_id,Sodium,Creatinine,Troponin I,Hb,Albumin\n"
                + "\n".join(rows) + "\n")
  problems = tables.Problems("quarantine")
  labs = tables.read_labs(path, (), {}, problems, tables.value_ranges())
  assert labs.analytes == ["Sodium", "Creatinine", "Troponin I", "Hb"]
  np.testing.assert_allclose(labs.values[:2, :3], [[135, 1.0, 0.05], [136, 2.0, 0.01]],
                             rtol=1e-4)
  assert labs.values[0, 3] == 13.5 and np.isnan(labs.values[1, 3])
  info = problems.files["labs.csv"]
  assert info["units_in_cells"] == 24 and info["si_units_converted"] == 6
  assert info["values"]["not_a_number"] == {"Hb": 3} and info["units_not_converted"] == 1
  assert info["analyte_units"] == {"Sodium": "mmol/L", "Creatinine": "mg/dL",
                                   "Troponin I": "ng/mL"}
  assert "24 values written with their unit" in _ingest_table(problems)


def test_values_with_the_lab_s_abnormal_flag_are_their_numbers(tmp_path):
  """A results report appends the lab's flag to an abnormal value ('5.6 H', '140 (L)', '7.8*',
  '2.1 HH'): each was 'not a number', set to missing, so the abnormal values, the ones that
  matter, were the ones lost. Each is its number, counted as values_flagged, wide and long; a
  dipstick's '3+' and a word are still no numbers."""
  path = _write(tmp_path, "labs.csv", "patient_id,K,Glucose,Troponin I\n"
                "P1,5.6 H,140 (H),<0.01\nP2,2.1 LL,7.8*,0.9 !\nP3,4.0,3+,high\n")
  problems = tables.Problems("quarantine")
  labs = tables.read_labs(path, (), {}, problems, tables.value_ranges())
  np.testing.assert_allclose(labs.values, [[5.6, 140, 0.01], [2.1, 7.8, 0.9],
                                           [4.0, np.nan, np.nan]], rtol=1e-6)
  info = problems.files["labs.csv"]
  assert info["values_flagged"] == 5
  assert info["values"]["not_a_number"] == {"Glucose": 1, "Troponin I": 1}
  assert "5 values with the lab's abnormal flag" in _ingest_table(problems)
  path = _write(tmp_path, "labs.csv", "subject_id,label,valuenum\nP1,K,5.6 H\nP2,K,3.9\n")
  problems = tables.Problems("quarantine")
  labs = tables.read_labs(path, (), {}, problems, tables.value_ranges())
  assert labs.values[:, 0].tolist() == [pytest.approx(5.6), pytest.approx(3.9)]
  assert problems.files["labs.csv"]["values_flagged"] == 1


def test_vitals_typed_with_their_unit_are_numbers_and_fahrenheit_is_converted(tmp_path):
  """'80 bpm', '120 mmHg', '97 %' and '98.6 °F' in a wide vitals file were each 'not a number':
  every channel lost. Each is its number, and a temperature whose cells say °F is converted
  to Celsius (here, where its values alone would say so too, and in a column of fevers only
  in °F, which they would not)."""
  rows = [f"P{i},{h},{80 + i} bpm,120 mmHg,80,16/min,97 %,{t} °F" for i, t in enumerate(
      (98.6, 102.2, 104.0)) for h in range(2)]
  path = _write(tmp_path, "vitals.csv", "patient_id,hour,hr,sbp,dbp,rr,spo2,temp\n"
                + "\n".join(rows) + "\n")
  problems = tables.Problems("quarantine")
  series = tables.read_vitals(path, ["hr", "sbp", "dbp", "rr", "spo2", "temp"], 4, 1.0,
                              problems)
  np.testing.assert_allclose(series.values[:, 0], [[80, 120, 80, 16, 97, 37.0],
                                                   [81, 120, 80, 16, 97, 39.0],
                                                   [82, 120, 80, 16, 97, 40.0]], rtol=1e-5)
  info = problems.files["vitals.csv"]
  assert info["units_in_cells"] == 30 and info["fahrenheit_to_celsius"] == 6
  assert not problems.items


def test_numbers_in_full_width_digits_or_with_a_unicode_minus_are_read(tmp_path):
  """A base excess pasted from a word processor is '−2.5' (U+2212), an East Asian system's
  sodium '１４０' (full-width digits): each was 'not a number', set to missing. Each is read,
  counted as unicode_numbers; a word in full-width letters is still no number."""
  path = _write(tmp_path, "labs.csv", "patient_id,Na,BE\nP1,１４０,−2.5\nP2,141,–1\n"
                "P3,ＮＥＧ,0.5\n")
  problems = tables.Problems("quarantine")
  labs = tables.read_labs(path, (), {}, problems, tables.value_ranges())
  np.testing.assert_allclose(labs.values, [[140, -2.5], [141, -1], [np.nan, 0.5]])
  info = problems.files["labs.csv"]
  assert info["unicode_numbers"] == 3 and info["values"]["not_a_number"] == {"Na": 1}
  assert "3 numbers in full-width digits or with a Unicode minus" in _ingest_table(problems)


def test_a_line_of_units_under_the_header_is_read_as_the_columns_units(tmp_path):
  """A report's second header line gives the columns' units (',mmol/L,umol/L,%'): it was a row
  with an empty id, set aside, and the units unused (creatinine's µmol/L then read as mg/dL,
  out of range). It is now the columns' units, a 'line' entry naming no patient; in a vitals
  file too, its temperature in °F converted. A first row with a number in it is a row."""
  path = _write(tmp_path, "labs.csv", "patient_id,Na,Creatinine,HbA1c\nUnits,mmol/L,umol/L,%"
                "\nP1,140,88.42,6.1\nP2,141,176.84,7.0\n")
  problems = tables.Problems("quarantine")
  labs = tables.read_labs(path, (), {}, problems, tables.value_ranges())
  assert labs.ids.tolist() == ["P1", "P2"]
  np.testing.assert_allclose(labs.values, [[140, 1.0, 6.1], [141, 2.0, 7.0]], rtol=1e-5)
  assert [(p.line, p.what) for p in problems.items] == [(2, "line")]
  assert problems.files["labs.csv"]["units_line"] == 2
  assert problems.files["labs.csv"]["rows"] == 2
  assert "line 2 read as the columns' units" in _ingest_table(problems)
  path = _write(tmp_path, "vitals.csv", "patient_id,hour,hr,temp\n,,bpm,°F\nP1,0,80,98.6\n")
  problems = tables.Problems("quarantine")
  vitals = tables.read_vitals(path, ["hr", "temp"], 2, 1.0, problems)
  np.testing.assert_allclose(vitals.values[0, 0], [80, 37.0], rtol=1e-5)
  path = _write(tmp_path, "labs.csv", "patient_id,Na,Unit\n,140,mmol/L\nP1,141,mmol/L\n")
  problems = tables.Problems("quarantine")
  labs = tables.read_labs(path, (), {}, problems, tables.value_ranges())
  assert "units_line" not in problems.files["labs.csv"]


def test_a_long_file_s_units_in_its_names_or_its_values_are_read(tmp_path):
  """A long file without a unit column may give the unit in the analyte's name ('Creatinine
  (umol/L)': an analyte of that whole name, no range, no conversion) or after the value ('135
  mmol/L': 'not a number'). Each is now the row's unit, read as a unit column's is: the names
  are their analytes, SI converted, two sites' glucose in mg/dL and mmol/L one analyte."""
  rows = [f"P{i},Creatinine (umol/L),{88.42 * (1 + i % 2):.2f}" for i in range(4)]
  rows += [f"P{i},Sodium,{135 + i} mmol/L" for i in range(4)]
  rows += [f"P{i},Glucose (mg/dL),{90 + i}" for i in range(3)] + ["P3,Glucose (mmol/L),5.5"]
  path = _write(tmp_path, "labs.csv", "patient_id,analyte,value\n" + "\n".join(rows) + "\n")
  problems = tables.Problems("quarantine")
  labs = tables.read_labs(path, (), {}, problems, tables.value_ranges())
  assert labs.analytes == ["Creatinine", "Glucose", "Sodium"]
  np.testing.assert_allclose(labs.values, [[1, 90, 135], [2, 91, 136], [1, 92, 137],
                                           [2, 99.09, 138]], rtol=1e-3)
  info = problems.files["labs.csv"]
  assert info["units_in_names"] == 8 and info["units_in_cells"] == 4
  assert info["analyte_units"] == {"Creatinine": "mg/dL", "Glucose": "mg/dL",
                                   "Sodium": "mmol/L"}
  # A name config.data.analytes gives whole stays whole, its values as they are.
  labs = tables.read_labs(path, ("Creatinine (umol/L)",), {}, tables.Problems("quarantine"),
                          tables.value_ranges())
  assert labs.values[:2, 0].tolist() == [pytest.approx(88.42), pytest.approx(176.84)]


@pytest.mark.parametrize("stamp, order, said", [
    (lambda d, h: f"03/{d:02d}/2020 {h}:00", "auto", "month/day"),         # a US export
    (lambda d, h: f"{d:02d}.03.2020 {h:02d}:00:00", "auto", "day/month"),  # a German one
    (lambda d, h: f"03/{d:02d}/20 {(h - 1) % 12 + 1}:00 {'AM' if h < 12 else 'PM'}", "auto",
     "month/day"),
    (lambda d, h: f"{d:02d}/03/2020 {h}:00", "day_first", "")])
def test_timestamps_written_as_exports_write_them_are_read(tmp_path, stamp, order, said):
  """'03/14/2020 10:00' was 'neither hours nor an ISO timestamp': every row of a US export's
  vitals set aside, the modality lost. Dates with the day and month as numbers are read, the
  order from a day past 12 (config.data.date_order to say it), in vitals and long labs."""
  rows = [f"P1,{stamp(d, h)},{60 + h}" for d, h in ((13, 23), (14, 0), (14, 1))]
  path = _write(tmp_path, "vitals.csv", "patient_id,charttime,hr\n" + "\n".join(rows) + "\n")
  problems = tables.Problems("quarantine")
  vitals = tables.read_vitals(path, ["hr"], 4, 1.0, problems, date_order=order)
  assert not problems.items
  np.testing.assert_equal(vitals.values[0, :, 0], [83, 60, 61, np.nan])
  assert problems.files["vitals.csv"].get("date_order", "") == said
  path = _write(tmp_path, "labs.csv", "patient_id,charttime,analyte,value\n"
                f"P1,{stamp(14, 9)},K,4.0\nP1,{stamp(13, 9)},K,5.0\n")
  labs = tables.read_labs(path, (), {}, tables.Problems("quarantine"), date_order=order)
  assert labs.values[0, 0] == 5.0   # the earlier draw, by date


def test_a_written_date_that_is_no_time_is_unread():
  """A written date is a time only where it is one: no 25:00, 13:30 PM, 30 February or
  13th month (a day past 12 in both places says nothing of the order: the separator does)."""
  from medjax.data.tables import timestamps
  cells = ["03/14/2020 23:59:59", "03/14/2020 25:00", "03/14/2020 13:30 PM", "02/30/2020",
           "13/13/2020", "03/14/2020 12:00 AM", "12/31/9999 10:00"]
  hours, kind = timestamps.times(pd.Series(cells, dtype=object), order="month_first")
  assert kind.tolist() == [2, 0, 0, 0, 0, 2, 2]
  assert hours[0] - hours[5] == pytest.approx(24 - 1 / 3600)


def test_hours_written_with_their_unit_are_hours(tmp_path):
  """'2 h' and '3.5 hrs' in a vitals file's hour column were 'neither hours nor an ISO
  timestamp': every row set aside. They are hours."""
  path = _write(tmp_path, "vitals.csv", "patient_id,hour,hr\nP1,0 h,80\nP1,1h,81\n"
                "P1,2 hrs,82\nP1,3 hours,83\n")
  problems = tables.Problems("quarantine")
  vitals = tables.read_vitals(path, ["hr"], 4, 1.0, problems)
  assert vitals.values[0, :, 0].tolist() == [80, 81, 82, 83] and not problems.items


def test_dates_no_day_says_the_order_of_are_read_as_assumed_and_said(tmp_path):
  """No day past 12: a '/' file reads month/day (a US export's, pandas'), a '.' file day/month,
  each said in the ingest table with the field that changes it."""
  path = _write(tmp_path, "vitals.csv", "patient_id,charttime,hr\nP1,03/01/2020 10:00,80\n"
                "P1,03/01/2020 11:00,81\n")
  problems = tables.Problems("quarantine")
  vitals = tables.read_vitals(path, ["hr"], 4, 1.0, problems)
  np.testing.assert_equal(vitals.values[0, :2, 0], [80, 81])
  assert problems.files["vitals.csv"]["date_order"] == "month/day (assumed)"
  assert ("dates read month/day (assumed) (set config.data.date_order if not)"
          in _ingest_table(problems))


def test_a_long_vitals_file_s_units_in_names_or_values_are_read(tmp_path):
  """A long vitals file (chartevents-like) with '80 bpm' and '98.6 °F' as values, or its units
  in the names ('Heart Rate (bpm)', 'Temperature (F)'): every value was 'not a number', or
  every row another measurement than the channels. Each is its channel's number, °F to °C."""
  for hr, temp, hv, tv in (("Heart Rate", "Temperature", "80 bpm", "98.6 °F"),
                           ("Heart Rate (bpm)", "Temperature (F)", "80", "98.6")):
    rows = [f"P1,2150-01-01 0{h}:00,{name},{v}" for h in range(2)
            for name, v in ((hr, hv), (temp, tv))]
    path = _write(tmp_path, "vitals.csv", "subject_id,charttime,label,value\n"
                  + "\n".join(rows) + "\n")
    problems = tables.Problems("quarantine")
    vitals = tables.read_vitals(path, ["hr", "temp"], 3, 1.0, problems)
    np.testing.assert_allclose(vitals.values[0, :2], [[80, 37.0], [80, 37.0]], rtol=1e-5)
    assert not problems.items and problems.files["vitals.csv"]["fahrenheit_to_celsius"] == 2


def test_numbers_grouped_by_spaces_or_apostrophes_are_read(tmp_path):
  """A French or Swiss export groups thousands with a space, a no-break space or an apostrophe
  ('250 000', '300\u00a0000', "1'234.5", '1 234,5' beside a decimal comma): every such value
  was 'not a number', set to missing. Groups of three so written are thousands; '120 80' (two
  numbers in one cell) is still not a number."""
  path = _write(tmp_path, "labs.csv", "patient_id;Platelets;Glucose;odd\n"
                "P1;250 000;5,5;120 80\nP2;300\u00a0000;1 234,5;\nP3;1'234.5;6,1;\n"
                "P4;180\u202f000;7;\n")
  problems = tables.Problems("quarantine")
  labs = tables.read_labs(path, (), {}, problems, {})
  np.testing.assert_allclose(labs.values[:, :2], [[250000, 5.5], [300000, 1234.5],
                                                  [1234.5, 6.1], [180000, 7]])
  info = problems.files["labs.csv"]
  assert info["thousands_separators"] == 5 and info["values"]["not_a_number"] == {"odd": 1}
  # Counts per µL converted by their values (250 000/µL is 250 x 10^9/L) are counted too: the
  # numbers converted no longer show their separators.
  problems = tables.Problems("quarantine")
  labs = tables.read_labs(path, (), {}, problems, tables.value_ranges())
  np.testing.assert_allclose(labs.values[[0, 1, 3], 0], [250, 300, 180])
  assert problems.files["labs.csv"]["thousands_separators"] == 5


def test_numbers_with_thousands_separators_are_read(tmp_path):
  """A spreadsheet's number format writes a platelet count as "250,000" (quoted in a comma
  file): it was 'not a number', set to missing. Groups of three after the first digits are
  read as thousands (counted as thousands_separators), in a comma file and, where no comma can
  be a decimal one ('1,234,567', '1,234.5'), in any; a comma file's column that also holds a
  decimal comma ('36,6') keeps both unread, and a tab file's '1,050' is still ambiguous."""
  path = _write(tmp_path, "labs.csv", 'patient_id,Platelets,WBC,odd\n'
                'P1,"250,000","12,500.5","1,050"\nP2,"1,234,567",7.5,"36,6"\nP3,180,,\n')
  problems = tables.Problems("quarantine")
  labs = tables.read_labs(path, (), {}, problems, {})
  np.testing.assert_allclose(labs.values, [[250000, 12500.5, np.nan], [1234567, 7.5, np.nan],
                                           [180, np.nan, np.nan]])
  info = problems.files["labs.csv"]
  assert info["thousands_separators"] == 3
  assert info["values"]["not_a_number"] == {"odd": 2}
  assert "3 numbers with thousands separators read" in _ingest_table(problems)
  path = _write(tmp_path, "labs.csv", "patient_id\tNa\tPlatelets\nP1\t1,050\t1,234.5\n")
  problems = tables.Problems("quarantine")
  labs = tables.read_labs(path, (), {}, problems, {})
  assert np.isnan(labs.values[0, 0]) and labs.values[0, 1] == 1234.5
  assert problems.files["labs.csv"]["values"]["ambiguous_comma"] == {"Na": 1}


def test_a_wide_header_unit_medjax_does_not_convert_sets_the_column_aside(tmp_path):
  """'Creatinine (mmol/L)' was read as mg/dL: 0.09 mmol/L is a plausible 0.09 mg/dL, 11 times
  too small. A header unit that is neither the analyte's conventional unit nor an SI unit of it
  medjax converts sets the column aside, one 'column' entry that says what to do; mg% and
  'mcmol/L' are spellings of mg/dL and µmol/L; data.rename of the whole header reads it as it
  is."""
  path = _write(tmp_path, "labs.csv", "patient_id,Creatinine (mmol/L),BUN (mg%),"
                "Bilirubin (mcmol/L),Hemoglobin (mg/dL),Na (mmol/L)\n"
                "P1,0.09,14,17.104,13.5,140\nP2,0.18,20,34.208,12.0,141\n")
  problems = tables.Problems("quarantine")
  labs = tables.read_labs(path, (), {}, problems, tables.value_ranges())
  assert labs.analytes == ["BUN", "Bilirubin", "Na"]
  np.testing.assert_allclose(labs.values, [[14, 1.0, 140], [20, 2.0, 141]], rtol=1e-5)
  assert _reasons(problems) == [
      "column 2 ('Creatinine (mmol/L)') is in 'mmol/L'; medjax reads 'Creatinine' in mg/dL and "
      "converts only umol/l or mg/l to it, so its values are ignored (convert them, or map "
      "the whole header to 'Creatinine' with config.data.rename to read them as mg/dL)",
      "column 5 ('Hemoglobin (mg/dL)') is in 'mg/dL'; medjax reads 'Hemoglobin' in g/dL and "
      "converts only g/l or mmol/l to it, so its values are ignored (convert them, or map the "
      "whole header to 'Hemoglobin' with config.data.rename to read them as g/dL)"]
  assert problems.files["labs.csv"]["units_not_converted"] == 2
  assert "2 columns in a unit medjax does not convert" in _ingest_table(problems)
  labs = tables.read_labs(path, (), {"Creatinine (mmol/L)": "Creatinine"},
                          tables.Problems("quarantine"), tables.value_ranges())
  assert labs.analytes[0] == "Creatinine" and labs.values[0, 0] == pytest.approx(0.09)


def test_wide_labs_without_units_in_si_are_converted_by_their_values(tmp_path):
  """A European cohort's wide file without units (SUPPORT-like names: crea 88, hgb 140, alb 40)
  lost those analytes: every value lay outside the plausible range in US units, or, named 'crea'
  or 'sod', got no range check at all. Names exports give an analyte get its range; a column
  most of whose values lie in the range only in the analyte's SI unit is read in that unit,
  every value of it (creatinine 35 µmol/L too); a column mostly in US units keeps its odd
  value out of range, set to missing, and a value beyond an analyte's range is still caught."""
  path = _write(tmp_path, "labs.csv", "patient_id,crea,hgb,sod,alb,alk.phos,Creatinine\n"
                "P1,88.42,140,140,40,13862,1.0\nP2,35.37,95,999,35,200,88\n"
                "P3,600,120,135,,,1.2\n")
  problems = tables.Problems("quarantine")
  labs = tables.read_labs(path, (), {}, problems, tables.value_ranges())
  # 'crea' and 'Creatinine' name one analyte: one column of the model, 'crea''s value first.
  assert labs.analytes == ["crea", "hgb", "sod", "alb", "alk.phos"]
  np.testing.assert_allclose(labs.values, [[1.0, 14.0, 140, 4.0, 13862],
                                           [0.4, 9.5, np.nan, 3.5, 200],
                                           [6.786, 12.0, 135, np.nan, np.nan]], rtol=1e-3)
  info = problems.files["labs.csv"]
  assert info["si_units_by_value"] == 8
  assert info["analyte_units"] == {"crea": "mg/dL", "hgb": "g/dL", "alb": "g/dL"}
  assert info["values"]["out_of_range"] == {"sod": 1, "crea": 1}
  assert "column 'Creatinine': value '88.0' is outside" in problems.items[1].reason
  assert problems.items[2].reason.startswith("columns 'crea' and 'Creatinine' both give analyte")
  assert "8 values read as SI units or counts per µL by their values" in _ingest_table(problems)


def test_a_study_databases_id_and_class_columns_are_found(tmp_path):
  """REDCap's 'record_id', a study's 'participant_id' and a 'dx' column were refused ('not a
  header with a patient id column'); they are a patient id's and a class's names now."""
  labels = tables.read_labels(_write(tmp_path, "labels.csv", "record_id,dx\n1,copd\n2,flu\n"),
                              tables.Problems("raise"))
  assert labels.ids.tolist() == ["1", "2"] and labels.classes.tolist() == ["copd", "flu"]
  labs = tables.read_labs(_write(tmp_path, "labs.csv", "Participant ID,Na\nS-01,140\n"), (),
                          {}, tables.Problems("raise"))
  assert labs.ids.tolist() == ["S-01"] and labs.analytes == ["Na"]


def test_headers_spelt_as_exports_spell_them_name_the_same_columns(tmp_path):
  """'Patient ID', 'Diagnosis', 'HR' and MIMIC's labevents (subject_id, label, a text 'value'
  beside 'valuenum', valueuom) were refused ('not a header with a patient id column') or read
  wrong: a column's role is matched ignoring case, spaces, '_', '-' and '.'; a long file's
  numeric value column is preferred to a text one."""
  labels = tables.read_labels(_write(tmp_path, "labels.csv", "Patient ID,Diagnosis\nP1,copd\n"
                                     "P2,normal\n"), tables.Problems("raise"))
  assert labels.ids.tolist() == ["P1", "P2"] and labels.classes.tolist() == ["copd", "normal"]
  path = _write(tmp_path, "labs.csv", "subject_id,hadm_id,charttime,label,value,valuenum,valueuom\n"
                "P1,H9,2150-01-01 08:00,Sodium,135,135,mEq/L\n"
                "P1,H9,2150-01-01 08:00,Potassium,___,,mEq/L\n"
                "P2,H8,2150-01-02 08:00,Sodium,>150,151,mEq/L\n")
  problems = tables.Problems("quarantine")
  labs = tables.read_labs(path, (), {}, problems)
  assert labs.analytes == ["Potassium", "Sodium"] and labs.ids.tolist() == ["P1", "P2"]
  np.testing.assert_allclose(labs.values, [[np.nan, 135], [np.nan, 151]])
  assert _reasons(problems) == []
  wide = tables.read_labs(_write(tmp_path, "wide.csv", "Subject ID,CHARTTIME,Na\n"
                                 "P1,2150-01-01 08:00,135\n"), (), {}, tables.Problems("raise"))
  assert wide.analytes == ["Na"]   # the draw's time is no analyte
  path = _write(tmp_path, "vitals.csv", "PATIENT.ID,Hours,HR,Sp O2\nP1,0,80,97\nP1,1,82,98\n")
  vitals = tables.read_vitals(path, ["hr", "spo2"], 2, 1.0, tables.Problems("raise"))
  np.testing.assert_allclose(vitals.values, [[[80, 97], [82, 98]]])


def test_a_header_without_a_role_s_column_names_the_spellings_allowed(tmp_path):
  """The refusal names the file, the role and its spellings, never a header cell (it may be a
  row of patient ids), and says what to do."""
  path = _write(tmp_path, "labels.csv", "pt_no,diagnosis\nP1,copd\n")
  with pytest.raises(tables.TableError) as refused:
    tables.read_labels(path, tables.Problems("quarantine"))
  message = str(refused.value)
  assert "labels.csv: line 1 is not a header with a patient id column" in message
  assert "subject_id" in message and "name the file's patient id column one of these" in message
  assert "config.data.rename (e.g. {'record_id': 'patient_id'})" in message
  assert "pt_no" not in message


def test_a_cohort_s_own_column_names_are_read_by_id_or_config_data_rename(tmp_path):
  """R's datasets name the patient 'id' and the PBC trial its outcome 'status': labels.csv was
  refused ('not a header with a patient id column'), and beside a patient_id, an 'id' column
  became a lab analyte (record numbers as a feature). 'id' is now a patient column, the last
  spelling tried, so one beside another is an identifier, never an analyte;
  config.data.rename maps any other name to a role's ({'status': 'diagnosis'}, 'draw_time' to
  'time'), in labels, labs and vitals."""
  labels_path = _write(tmp_path, "labels.csv", "id,status,age\n1,dead,50\n2,alive,61\n")
  with pytest.raises(tables.TableError, match="not a header with a label column"):
    tables.read_labels(labels_path, tables.Problems("raise"))
  labels = tables.read_labels(labels_path, tables.Problems("raise"),
                              rename={"status": "diagnosis"})
  assert labels.ids.tolist() == ["1", "2"] and labels.classes.tolist() == ["dead", "alive"]
  labs = tables.read_labs(_write(tmp_path, "labs.csv", "id,bili,albumin\n1,1.2,3.5\n"), (), {},
                          tables.Problems("raise"), tables.value_ranges())
  assert labs.analytes == ["bili", "albumin"] and labs.ids.tolist() == ["1"]
  problems = tables.Problems("quarantine")
  labs = tables.read_labs(_write(tmp_path, "labs.csv", "patient_id,id,draw_time,Na\n"
                                 "P1,7,2150-01-01 08:00,140\n"), (), {"draw_time": "time"},
                          problems, tables.value_ranges())
  assert labs.analytes == ["Na"] and labs.ids.tolist() == ["P1"]
  assert any("column 2 ('id') identifies patients" in r for r in _reasons(problems))
  vitals = tables.read_vitals(_write(tmp_path, "vitals.csv", "record_id,draw_time,hr\nP1,0,80\n"
                                     "P1,1,90\n"), ["hr"], 2, 1.0, tables.Problems("raise"),
                              rename={"record_id": "patient_id", "draw_time": "hour"})
  assert vitals.ids.tolist() == ["P1"] and vitals.values[0, :, 0].tolist() == [80, 90]


def test_sas_and_stata_missing_values_are_empty_cells_not_bad_values(tmp_path):
  """A SAS or Stata export writes a missing value as '.' ('.A' for a special one): every such
  cell was a value 'not a number', reported and counted as set to missing (the OPT trial's 27
  per column). They are empty cells now, only counted (missing_dots); other text still is not a
  number."""
  problems = tables.Problems("quarantine")
  labs = tables.read_labs(_write(tmp_path, "labs.csv", "patient_id,Na,K\nP1,.,4.0\n"
                                 "P2,140,.A\nP3,141,x\n"), (), {}, problems,
                          tables.value_ranges())
  np.testing.assert_allclose(labs.values, [[np.nan, 4.0], [140, np.nan], [141, np.nan]])
  assert problems.files["labs.csv"]["missing_dots"] == 2
  assert problems.files["labs.csv"]["values"] == {"not_a_number": {"K": 1}}
  problems = tables.Problems("raise")
  vitals = tables.read_vitals(_write(tmp_path, "vitals.csv", "patient_id,hour,hr\nP1,0,.\n"
                                     "P1,1,80\n"), ["hr"], 2, 1.0, problems)
  assert np.isnan(vitals.values[0, 0, 0]) and vitals.values[0, 1, 0] == 80
  assert "1 cells of '.' (SAS's and Stata's missing value) read as missing" in \
      _ingest_table(problems)


def test_a_column_of_bands_is_categorical_one_of_values_at_a_limit_numbers(tmp_path):
  """The Rotterdam tumour bank's size ('<=20', '20-50', '>50') was read as numbers: '<=20' at
  its limit (20), '>50' as 50, and each '20-50' (43% of the rows) set to missing as not a
  number. A column of bands is categorical now; a troponin column of values at the assay's
  limit ('<0.01'), a few plain values and one word ('hemolysed') is still numbers."""
  bands = ["<=20", "20-50", ">50"]
  rows = [f"P{i},{bands[i % 3]},{'hemolysed' if i == 4 else '<0.01' if i % 4 else 0.05}"
          for i in range(30)]
  problems = tables.Problems("quarantine")
  labs = tables.read_labs(_write(tmp_path, "labs.csv", "patient_id,size,trop\n"
                                 + "\n".join(rows) + "\n"), (), {}, problems,
                          tables.value_ranges())
  assert labs.analytes == ["size=20-50", "size=<=20", "size=>50", "trop"]
  np.testing.assert_allclose(labs.values[:5], [[0, 1, 0, 0.05], [1, 0, 0, 0.01], [0, 0, 1, 0.01],
                                               [0, 1, 0, 0.01], [1, 0, 0, np.nan]], rtol=1e-6)
  info = problems.files["labs.csv"]
  assert info["categorical_columns"] == {"size": bands[1:2] + bands[:1] + bands[2:]}
  assert info["values"] == {"not_a_number": {"trop": 1}}


def test_a_blood_pressure_written_as_systolic_over_diastolic_is_split(tmp_path):
  """Epic's flowsheets and many exports chart blood pressure as one value, 'BP' 120/80: a wide
  file without sbp and dbp columns was refused ('channel columns ['sbp', 'dbp'] not found'),
  and a long file's BP rows were other measurements, not read. The value is split into sbp and
  dbp; a cell not written so is reported, both set to missing; in a long file the first of a
  channel's rows at one time wins, as ever."""
  channels = ["hr", "sbp", "dbp"]
  problems = tables.Problems("quarantine")
  vitals = tables.read_vitals(_write(tmp_path, "vitals.csv", "patient_id,hour,HR,BP (mmHg)\n"
                                     "P1,0,80,120/80\nP1,1,82,118 / 76\nP2,0,90,see note\n"
                                     "P2,1,91,\n"), channels, 2, 1.0, problems)
  np.testing.assert_allclose(vitals.values, [[[80, 120, 80], [82, 118, 76]],
                                             [[90, np.nan, np.nan], [91, np.nan, np.nan]]])
  info = problems.files["vitals.csv"]
  assert info["pressures_split"] == 2 and info["values"] == {"not_a_number": {"BP (mmHg)": 1}}
  assert [(p.line, p.count) for p in problems.items] == [(4, 1)]
  assert "2 blood pressures written as systolic/diastolic ('120/80') split" in \
      _ingest_table(problems)
  problems = tables.Problems("quarantine")
  vitals = tables.read_vitals(_write(tmp_path, "vitals.csv", "patient_id,charttime,label,value\n"
                                     "P1,2150-01-01 08:00,Blood Pressure,120/80\n"
                                     "P1,2150-01-01 09:00,BP,118/76\n"
                                     "P1,2150-01-01 09:00,Systolic BP,119\n"
                                     "P2,2150-01-01 08:00,BP,130\n"
                                     "P2,2150-01-01 08:00,Heart Rate,90\n"), channels, 2, 1.0,
                              problems)
  np.testing.assert_allclose(vitals.values, [[[np.nan, 120, 80], [np.nan, 118, 76]],
                                             [[90, np.nan, np.nan], [np.nan] * 3]])
  assert [(p.line, p.reason.split(";")[0]) for p in problems.items] == [
      (4, "duplicate value for channel 'sbp' at this time for this patient"),
      (5, "'BP': a blood pressure not written as systolic/diastolic ('120/80')")]


def test_a_long_file_s_results_in_words_are_categories(tmp_path):
  """MIMIC's labevents give a dipstick's result as text ('NEG', 'TR', 'POS') with an empty
  valuenum: every such result was missing, the analyte lost. An analyte whose results are
  words (as a wide file's categorical column) becomes a 0/1 indicator per category, from each
  patient's earliest draw; an analyte of numbers with one word among them is numbers still.
  Where config.data.analytes is given, only an analyte it names an indicator of is read so."""
  results = ["NEG"] * 14 + ["TR", "POS", "pos", "MOD", "NEG"]
  rows = [f"P{i},2150-01-01 08:00,Urine Blood,{r}," for i, r in enumerate(results)]
  rows += ["P0,2150-01-02 08:00,Urine Blood,POS,", "P1,2150-01-01 08:00,Sodium,140,140",
           "P2,2150-01-01 08:00,Sodium,see note,", "P3,2150-01-01 08:00,Urine Blood,,"]
  path = _write(tmp_path, "labs.csv", "subject_id,charttime,label,value,valuenum\n"
                + "\n".join(rows) + "\n")
  problems = tables.Problems("quarantine")
  labs = tables.read_labs(path, (), {}, problems, tables.value_ranges())
  assert labs.analytes == ["Sodium", "Urine Blood=MOD", "Urine Blood=NEG", "Urine Blood=POS",
                           "Urine Blood=TR"]
  by_id = dict(zip(labs.ids.tolist(), labs.values.tolist()))
  np.testing.assert_equal(by_id["P0"], [np.nan, 0, 1, 0, 0])   # the earliest draw's NEG
  np.testing.assert_equal(by_id["P1"], [140, 0, 1, 0, 0])
  np.testing.assert_equal(by_id["P16"], [np.nan, 0, 0, 1, 0])  # 'pos' is 'POS'
  np.testing.assert_equal(by_id["P3"], [np.nan, 0, 1, 0, 0])   # its later empty row adds none
  info = problems.files["labs.csv"]
  assert info["categorical_analytes"] == {"Urine Blood": ["MOD", "NEG", "POS", "TR"]}
  assert "1 categorical analyte as 0/1 indicators (Urine Blood 4)" in _ingest_table(problems)
  labs = tables.read_labs(path, ("Sodium", "Urine Blood"), {}, tables.Problems("quarantine"),
                          tables.value_ranges())
  assert np.isnan(labs.values[:, 1]).all()
  labs = tables.read_labs(path, ("Sodium", "Urine Blood=POS"), {},
                          tables.Problems("quarantine"), tables.value_ranges())
  assert np.nansum(labs.values[:, 1]) == 2


def test_a_categorical_analyte_s_row_is_one_row_in_counts_and_reasons(tmp_path):
  """A long file's categorical analyte is read as one row per indicator: a repeated row was one
  'duplicate value' entry per category (three rows set aside for one), its later draws were
  counted once per category, and with config.data.analytes naming one indicator every row
  was also an 'analyte not in config.data.analytes; the row is set aside' per other category,
  rows that were read. Each row is one row again: one entry, one later draw."""
  rows = []
  for i in range(10):
    rows += [f"P{i},2150-01-01 10:00,Protein,{['NEG', 'TR', 'POS'][i % 3]}",
             f"P{i},2150-01-02 10:00,Protein,{['NEG', 'TR', 'POS'][(i + 1) % 3]}"]
  rows.append("P1,2150-01-01 10:00,Protein,POS")   # line 22: a second value at line 4's time
  path = _write(tmp_path, "labs.csv", "subject_id,charttime,label,value\n"
                + "\n".join(rows) + "\n")
  for wanted, analytes in [((), ["Protein=NEG", "Protein=POS", "Protein=TR"]),
                           (("Protein=POS",), ["Protein=POS"])]:
    problems = tables.Problems("quarantine")
    labs = tables.read_labs(path, wanted, {}, problems, tables.value_ranges())
    assert labs.analytes == analytes
    assert labs.values[:3, analytes.index("Protein=POS")].tolist() == [0, 0, 1]
    assert [(p.line, p.reason) for p in problems.items] == [
        (22, "duplicate value for analyte 'Protein' (line 4 has it for this patient at this "
             "time); the row is set aside")]
    assert problems.files["labs.csv"]["later_draws"] == 10


def test_wide_labs_with_a_row_per_draw_keep_each_analytes_first_value(tmp_path):
  """An export with one row per draw lost every later draw's analytes (the first row won, the
  rest were set aside), where the same data in a long file kept them: each analyte's first
  usable value now wins in both. A later row that adds nothing is still set aside; a value it
  repeats is reported, not used."""
  path = _write(tmp_path, "labs.csv", "patient_id,Na,Glucose\n"
                "P1,140,\nP1,150,95\n"     # Glucose from the second draw
                "P2,141,96\nP2,142,97\n"   # adds nothing: set aside
                "P3,,\nP3,x,98\nP3,139,\n")
  problems = tables.Problems("quarantine")
  labs = tables.read_labs(path, (), {}, problems)
  assert labs.ids.tolist() == ["P1", "P2", "P3"]
  np.testing.assert_allclose(labs.values, [[140, 95], [141, 96], [139, 98]])
  assert [(p.line, p.what) for p in problems.items] == [(3, "values"), (5, "row"), (7, "values")]
  assert "'Na': a later row of a patient gives it again" in problems.items[0].reason
  assert problems.items[1].reason.startswith("duplicate patient row (line 4 has this patient)")
  assert problems.files["labs.csv"]["rows_merged"] == 3
  long = _write(tmp_path, "long.csv", "patient_id,analyte,value\nP1,Na,140\nP1,Na,150\n"
                "P1,Glucose,95\nP2,Na,141\nP2,Glucose,96\nP3,Na,x\nP3,Glucose,98\nP3,Na,139\n")
  same = tables.read_labs(long, ("Na", "Glucose"), {}, tables.Problems("quarantine"))
  np.testing.assert_allclose(same.values, labs.values)


def test_labs_with_a_draw_date_keep_each_patients_earliest_draw(tmp_path):
  """An export newest first (a 'date' or 'collection_date' column) kept each patient's latest
  labs, where a file with MIMIC's charttime kept the earliest: a wide file's row per draw, or a
  long file's later value, read as a duplicate of the first in the file. A draw date is a draw
  time now, wide or long: each analyte's earliest value wins, a later draw is counted, not
  reported; two rows on one date are still duplicates."""
  wide = _write(tmp_path, "labs.csv", "patient_id,Collection Date,Na,Glucose\n"
                "P1,2024-03-01,150,99\nP1,2024-01-01,140,\n"   # Glucose from the later draw
                "P2,2024-01-01,141,96\nP2,2024-01-01,142,97\n"  # one date twice: a duplicate
                "P3,unknown,138,90\nP3,2024-02-01,139,\n")      # an unreadable date goes last
  problems = tables.Problems("quarantine")
  labs = tables.read_labs(wide, (), {}, problems)
  assert labs.ids.tolist() == ["P1", "P2", "P3"] and labs.analytes == ["Na", "Glucose"]
  np.testing.assert_allclose(labs.values, [[140, 99], [141, 96], [139, 90]])
  assert [(p.line, p.what) for p in problems.items] == [(5, "row")]
  assert problems.items[0].reason.startswith("duplicate patient row (line 4 has this patient)")
  assert problems.files["labs.csv"]["later_draws"] == 2
  long = _write(tmp_path, "long.csv", "patient_id,date,analyte,value\nP1,2024-03-01,Na,150\n"
                "P1,2024-03-01,Glucose,99\nP1,2024-01-01,Na,140\nP2,2024-01-01,Na,141\n"
                "P2,2024-01-01,Glucose,96\nP3,2024-02-01,Na,139\nP3,unknown,Glucose,90\n")
  problems = tables.Problems("quarantine")
  same = tables.read_labs(long, ("Na", "Glucose"), {}, problems)
  np.testing.assert_allclose(same.values, labs.values)
  assert problems.items == [] and problems.files["long.csv"]["later_draws"] == 1


def test_wide_columns_that_name_one_analyte_are_one_analyte(tmp_path):
  """Two lab systems' columns in one wide export, 'Na' beside 'SODIUM': with config.data.analytes
  naming 'sodium', both were ignored as 'not in config.data.analytes' and every sodium was lost;
  without, they were two analytes, each half empty. Columns that name one analyte (as a long
  file's rows do: `analytes.same_analyte`) are one, spelt as config.data.analytes spells it;
  where both give a value the first column's is used, and a disagreement is reported."""
  path = _write(tmp_path, "labs.csv", "patient_id,Na,SODIUM,Hgb\n"
                "P1,140,,13\nP2,,141,12\nP3,138,138,11\nP4,135,145,10\n")
  for analytes, spelt in (((), "Na"), (("sodium", "Hgb"), "sodium")):
    problems = tables.Problems("quarantine")
    labs = tables.read_labs(path, analytes, {}, problems, tables.value_ranges())
    assert labs.analytes == [spelt, "Hgb"]
    np.testing.assert_allclose(labs.values, [[140, 13], [141, 12], [138, 11], [135, 10]])
    assert [(p.line, p.what) for p in problems.items] == [(5, "values")]
    assert problems.items[0].reason == (
        f"columns 'Na' and 'SODIUM' both give analyte {spelt!r} and differ; the value in 'Na' "
        "is used")
    assert problems.files["labs.csv"]["columns_merged"] == {spelt: 2}
  problems = tables.Problems("quarantine")   # config.data.rename mapping two columns to one
  labs = tables.read_labs(path, ("Na", "Hgb"), {"SODIUM": "Na"}, problems)
  np.testing.assert_allclose(labs.values[:, 0], [140, 141, 138, 135])


def test_labels_columns_that_are_not_read_are_named_not_dropped_quietly(tmp_path):
  """An export's age and sex beside the class were ignored without a word; they are named in
  the file's summary (a header cell that may identify a patient withheld) and the ingest table
  says where measurements go."""
  path = _write(tmp_path, "labels.csv", "patient_id,diagnosis,age,Sex,P2\nP1,flu,71,F,x\n"
                "P2,copd,64,M,y\n")
  problems = tables.Problems("quarantine")
  labels = tables.read_labels(path, problems)
  assert labels.classes.tolist() == ["flu", "copd"] and problems.items == []
  assert problems.files["labels.csv"]["columns_not_read"] == [
      "'age'", "'Sex'", "(withheld: it may identify a patient)"]


def test_mEq_and_mmol_per_litre_are_one_unit_for_monovalent_ions_only(tmp_path):
  """Two lab systems' sodium, in mEq/L and mmol/L, are one scale (1 mEq/L of a monovalent ion is
  1 mmol/L): half of it was set aside. Magnesium's are not (1 mmol/L is 2 mEq/L): still set
  aside. Calcium's both become mg/dL (`_SI_UNITS`: 2.3 mmol/L and 4.6 mEq/L are 9.2 mg/dL)."""
  path = _write(tmp_path, "labs.csv", "patient_id,test,value,unit\n"
                "P1,Sodium,140,mEq/L\nP2,Sodium,138,mmol/L\nP3,Sodium,141,mEq/L\n"
                "P1,Mg,0.8,mmol/L\nP2,Mg,0.9,mmol/L\nP3,Mg,1.6,mEq/L\n"
                "P1,Ca,2.3,mmol/L\nP2,Ca,2.4,mmol/L\nP3,Ca,4.6,mEq/L\n")
  problems = tables.Problems("quarantine")
  labs = tables.read_labs(path, (), {}, problems)
  assert labs.analytes == ["Ca", "Mg", "Sodium"]
  np.testing.assert_allclose(labs.values, [[9.22, 0.8, 140], [9.62, 0.9, 138],
                                           [9.22, np.nan, 141]], rtol=1e-3)
  assert [p.line for p in problems.items] == [7]
  assert problems.items[0].reason.startswith(
      "analyte 'Mg' in 'mEq/L', where most of its rows are in 'mmol/L'")


def test_cell_counts_in_any_spelling_of_their_unit_are_one_scale(tmp_path):
  """Two lab systems' platelets, in K/uL and 10^9/L (one scale: 10^3/µL is 10^9/L), lost the
  rows of the minority unit as 'in another unit'; counts per µL (platelets 270,000/µL, WBC
  7,500 cells/mm3) were set to missing as out of range. Every spelling of a count's unit is one
  unit ('x10E9/L', '10³/µL', 'G/L'), and counts per µL or mm³ are converted, in long and wide
  files, by header or, without one, by the column's values."""
  path = _write(tmp_path, "labs.csv", "patient_id,test,value,unit\n"
                "P1,Platelets,250,K/uL\nP2,Platelets,260,10^9/L\nP3,Platelets,270000,/uL\n"
                "P4,Platelets,280,x10E9/L\nP5,WBC,7500,cells/mm3\nP6,WBC,8.1,10³/µL\n"
                "P1,WBC,6.0,G/L\nP2,RBC,4.5,M/uL\nP3,RBC,4.6,10^12/L\nP4,WBC,3,/hpf\n")
  problems = tables.Problems("quarantine")
  labs = tables.read_labs(path, (), {}, problems, tables.value_ranges())
  assert labs.analytes == ["Platelets", "RBC", "WBC"]
  np.testing.assert_allclose(labs.values, [[250, np.nan, 6.0], [260, 4.5, np.nan],
                                           [270, 4.6, np.nan], [280, np.nan, np.nan],
                                           [np.nan, np.nan, 7.5], [np.nan, np.nan, 8.1]])
  assert problems.files["labs.csv"]["si_units_converted"] == 3
  # Urine WBC per high-power field is another measurement: set aside.
  assert [p.patient for p in problems.items] == ["P4"]
  assert "analyte 'WBC' in '/hpf'" in problems.items[0].reason
  wide = _write(tmp_path, "wide.csv", "patient_id,Platelets (/uL),WBC (K/µL),plt,Hb\n"
                "P1,250000,7.5,,14\nP2,,8.2,310000,13\nP3,180000,4.0,180000,12\n")
  problems = tables.Problems("raise")
  labs = tables.read_labs(wide, (), {}, problems, tables.value_ranges())
  assert labs.analytes == ["Platelets", "WBC", "Hb"]   # 'plt' is Platelets: one column
  np.testing.assert_allclose(labs.values, [[250, 7.5, 14], [310, 8.2, 13], [180, 4.0, 12]])
  info = problems.files["wide.csv"]
  assert info["si_units_converted"] == 2 and info["si_units_by_value"] == 2
  assert info["analyte_units"] == {"Platelets": "10^9/L", "WBC": "K/µL"}


def test_a_long_files_names_of_one_analyte_are_one_analyte(tmp_path):
  """Two lab systems' rows merged into one file: 'Platelets' beside 'PLT' and 'Platelet Count',
  'Hb' beside 'Hemoglobin', were separate analytes, each patient's value in one of them and
  missing in the others. Names exports give one analyte are one, spelt as most rows spell it
  (as config.data.analytes does, where it lists one); signs keep 'Neutrophils %' and
  'Neutrophils #' apart, and a name that may identify a patient is never merged nor shown."""
  path = _write(tmp_path, "labs.csv", "patient_id,test,value,unit\n"
                "P1,Platelets,250,K/uL\nP2,PLT,260,10^9/L\nP3,Platelet Count,270000,/uL\n"
                "P4,Platelets,280,K/uL\nP1,Hb,14,g/dL\nP2,Hemoglobin,130,g/L\nP3,HGB,12,g/dL\n"
                "P3,Neutrophils %,60,%\nP3,Neutrophils #,4.1,K/uL\nP1,total_bilirubin,1.0,\n"
                "P2,Total Bilirubin,1.2,\nP3,P1-x,5,\nP4,p1 x,6,\n")
  problems = tables.Problems("quarantine")
  problems.known_ids.update({"p1-x", "p1 x"})
  labs = tables.read_labs(path, (), {}, problems, tables.value_ranges())
  assert labs.analytes == ["Hb", "Neutrophils #", "Neutrophils %", "Platelets",
                           "total_bilirubin"]
  np.testing.assert_allclose(labs.values, [[14, np.nan, np.nan, 250, 1.0],
                                           [13, np.nan, np.nan, 260, 1.2],
                                           [12, 4.1, 60, 270, np.nan],
                                           [np.nan, np.nan, np.nan, 280, np.nan]])
  assert problems.files["labs.csv"]["analytes_merged_by_name"] == {
      "HGB": "Hb", "Hemoglobin": "Hb", "PLT": "Platelets", "Platelet Count": "Platelets",
      "Total Bilirubin": "total_bilirubin"}
  labs = tables.read_labs(path, ("Hemoglobin", "Platelets", "PLT"), {},
                          tables.Problems("quarantine"), tables.value_ranges())
  assert labs.analytes == ["Hemoglobin", "Platelets", "PLT"]
  np.testing.assert_allclose(labs.values[:, 0], [14, 13, 12, np.nan])


def test_units_of_one_quantity_per_volume_rescale_and_others_do_not():
  r = lambda a, b: analytes.rescale(analytes.unit(a), analytes.unit(b))
  assert r("mg/dL", "mg/L") == pytest.approx(10) and r("µg/mL", "mg/L") == pytest.approx(1)
  assert r("mmol/L", "µmol/L") == pytest.approx(1000) and r("U/mL", "U/L") == pytest.approx(1000)
  assert r("mIU/mL", "IU/L") == pytest.approx(1) and r("ng/dL", "pg/mL") == pytest.approx(10)
  assert r("IU/L", "U/L") == pytest.approx(1) and r("mcg/dL", "µg/dL") == pytest.approx(1)
  # Mass and amount, amount and charge, a rate and a count are other quantities.
  for a, b in (("mg/dL", "mmol/L"), ("mEq/L", "mmol/L"), ("mL/min", "mL/s"), ("%", "mg/L"),
               ("/uL", "10^9/L"), ("mg/24h", "mg/dL")):
    assert r(a, b) is None, (a, b)


def test_excels_sep_line_names_the_delimiter_and_is_no_header(tmp_path):
  """Excel writes 'sep=;' as the first line of a CSV meant for another locale: the file was
  refused ('line 1 is not a header with a patient id column'). The line names the delimiter
  (the header's own count of delimiters is not asked) and the header follows it."""
  path = _write(tmp_path, "labs.csv", "sep=;\npatient_id;Na;K\nP1;140;4,1\nP2;138;3,9\n")
  problems = tables.Problems("raise")
  labs = tables.read_labs(path, (), {}, problems)
  assert labs.analytes == ["Na", "K"]
  np.testing.assert_allclose(labs.values, [[140, 4.1], [138, 3.9]], rtol=1e-6)
  assert problems.files["labs.csv"]["sep_line"] == 1
  # Quoted, CRLF, a one-column header that names no delimiter of its own: still the sep's.
  path = _write(tmp_path, "labels.csv", '"sep=|"\r\npatient_id|diagnosis\r\nP1|flu\r\n')
  labels = tables.read_labels(path, tables.Problems("raise"))
  assert labels.ids.tolist() == ["P1"]
  with pytest.raises(tables.TableError, match="holds only a 'sep=' line"):
    tables.read_labs(_write(tmp_path, "only.csv", "sep=,\n\n"), (), {}, tables.Problems("raise"))


def test_values_beyond_an_assays_limit_are_read_at_the_limit_and_counted(tmp_path):
  """'<0.01' (troponin under the detection limit) and '>60' (eGFR, the lab's cap) were set to
  missing as not numbers: the patient was measured, and the limit is the value the lab gives.
  They are read at the limit, counted in the file's info and named in the ingest summary."""
  path = _write(tmp_path, "labs.csv", "patient_id,troponin_i,egfr,crp\n"
                "P1,<0.01,>60,< 5\nP2,0.4,≥ 90,<=3\nP3,> x,45,<>\n")
  problems = tables.Problems("quarantine")
  labs = tables.read_labs(path, (), {}, problems)
  np.testing.assert_allclose(labs.values, [[0.01, 60, 5], [0.4, 90, 3], [np.nan, 45, np.nan]],
                             rtol=1e-6)
  info = problems.files["labs.csv"]
  assert info["values_at_limit"] == 5
  assert info["values"] == {"not_a_number": {"troponin_i": 1, "crp": 1}}
  assert ("labs.csv: 5 values beyond an assay's limit ('<0.01', '>60') read at the limit"
          in _ingest_table(problems))
  long = _write(tmp_path, "long.csv", "patient_id;analyte;value\nP1;troponin_i;<0,01\n"
                "P2;troponin_i;0,5\n")
  problems = tables.Problems("raise")
  labs = tables.read_labs(long, (), {}, problems)
  np.testing.assert_allclose(labs.values, [[0.01], [0.5]], rtol=1e-6)
  assert problems.files["long.csv"]["values_at_limit"] == 1
  assert problems.files["long.csv"]["decimal_commas"] == 2
  # An hour is no assay: '<5' stays a time that is not a number.
  hours, kinds, read = values_lib.numbers(pd.Series(["<5", "1"], dtype=object), False)
  assert np.isnan(hours[0]) and kinds[0] == values_lib.NOT_A_NUMBER and read == {}



def test_mimic_labevents_limits_in_the_text_value_are_read_where_valuenum_is_empty(tmp_path):
  """MIMIC leaves valuenum empty where value is '<0.01' or '>1000': those measured patients
  were missing, silently. The text value is taken where it reads as one; 'NEG' and MIMIC's
  '___' stay missing, as the export meant, without a report."""
  path = _write(tmp_path, "labs.csv", "subject_id,label,value,valuenum,valueuom\n"
                "P1,Troponin T,<0.01,,ng/mL\nP2,Troponin T,0.05,0.05,ng/mL\n"
                "P3,Troponin T,NEG,,ng/mL\nP4,Troponin T,___,,ng/mL\n"
                "P5,Troponin T,>25,,ng/mL\nP5,Sodium,140,140,mEq/L\n")
  problems = tables.Problems("quarantine")
  labs = tables.read_labs(path, (), {}, problems)
  assert labs.analytes == ["Sodium", "Troponin T"]
  by_id = dict(zip(labs.ids.tolist(), labs.values.tolist()))
  np.testing.assert_allclose([by_id[p][1] for p in ("P1", "P2", "P5")], [0.01, 0.05, 25],
                             rtol=1e-6)
  assert "P3" not in by_id and "P4" not in by_id   # no usable value: no labs row
  assert _reasons(problems) == []
  info = problems.files["labs.csv"]
  assert info["values_from_text"] == 2 and info["values_at_limit"] == 2


def test_raw_mimic_labevents_are_long_labs_named_by_itemid_and_record_ids_no_analytes(tmp_path):
  """MIMIC-IV's hosp/labevents.csv as shipped (itemid, no label: that is in d_labitems) was read
  as a wide file: labevent_id, specimen_id and itemid became analytes, valueuom and flag values
  'not a number'. It is a long file whose analytes are its itemid codes; a wide file's columns
  that are record ids ('specimen_id', 'OrderID') are no analytes either, and 'Lipid' still is."""
  path = _write(tmp_path, "labs.csv", "labevent_id,subject_id,hadm_id,specimen_id,itemid,"
                "order_provider_id,charttime,storetime,value,valuenum,valueuom,ref_range_lower,"
                "ref_range_upper,flag,priority,comments\n"
                "1,10000032,,2595786,50912,,2180-03-23 11:51:00,2180-03-23 12:25:00,0.4,0.4,"
                "mg/dL,0.4,1.1,,ROUTINE,\n"
                "2,10000032,,2595786,50971,,2180-03-23 11:51:00,2180-03-23 12:25:00,3.7,3.7,"
                "mEq/L,3.3,5.1,,ROUTINE,\n"
                "3,10000033,,2595787,50912,,2180-03-24 11:51:00,2180-03-24 12:25:00,1.4,1.4,"
                "mg/dL,0.4,1.1,abnormal,STAT,\n")
  problems = tables.Problems("quarantine")
  labs = tables.read_labs(path, (), {}, problems)
  assert labs.analytes == ["50912", "50971"] and labs.ids.tolist() == ["10000032", "10000033"]
  np.testing.assert_allclose(labs.values, [[0.4, 3.7], [1.4, np.nan]], rtol=1e-6)
  assert _reasons(problems) == []
  assert problems.files["labs.csv"]["analyte_codes"] == "itemid"
  renamed = tables.read_labs(path, (), {"50912": "creatinine"}, tables.Problems("raise"))
  assert renamed.analytes == ["50971", "creatinine"]
  assert ("labs.csv: analytes named by their 'itemid' codes (join the code table's names"
          in _ingest_table(problems))

  wide = _write(tmp_path, "wide.csv", "patient_id,specimen_id,OrderID,Lipid,Na\n"
                "P1,2595786,77,1.2,140\n")
  problems = tables.Problems("quarantine")
  labs = tables.read_labs(wide, (), {}, problems)
  assert labs.analytes == ["Lipid", "Na"]
  assert _reasons(problems) == [
      f"column {j} ('{name}') identifies records (its name ends in 'id'), not a measurement; "
      "its values are ignored" for j, name in ((2, "specimen_id"), (3, "OrderID"))]


def test_long_vitals_as_chartevents_are_gathered_into_a_row_per_patient_and_time(tmp_path):
  """MIMIC-IV's icu/chartevents (one row per measurement, by itemid) and exports that name the
  measurement ('Heart Rate') were refused: no 'hr' column. Their channels' rows are gathered
  into one row per patient and time; other items are counted, a channel given twice at one time
  keeps its first value (the later row set aside), and data.rename names other spellings."""
  path = _write(tmp_path, "vitals.csv", "subject_id,stay_id,charttime,itemid,value,valuenum\n"
                "P1,2,2180-01-01 08:00,220045,80,80\n"
                "P1,2,2180-01-01 08:00,220277,97,97\n"
                "P1,2,2180-01-01 08:00,226512,70,70\n"       # admission weight: no channel
                "P1,2,2180-01-01 09:10,220045,82,82\n"
                "P1,2,2180-01-01 09:10,220045,84,84\n"       # hr again at 09:10
                "P2,2,2180-01-02 10:00,Heart Rate,90,\n"     # valuenum empty: its text value
                "P2,2,2180-01-02 10:00,core temp,36.6,36.6\n"
                "P2,2,2180-01-02 11:30,SBP,150,150\n"
                "P3,2,2180-01-03 10:00,223761,98.6,98.6\n")    # Temperature Fahrenheit
  problems = tables.Problems("quarantine")
  vitals = tables.read_vitals(path, ["hr", "sbp", "spo2", "temp"], 3, 1.0, problems,
                              rename={"core temp": "temp"})
  assert vitals.ids.tolist() == ["P1", "P2", "P3"]
  nan = np.nan
  np.testing.assert_allclose(vitals.values, [
      [[80, nan, 97, nan], [82, nan, nan, nan], [nan] * 4],
      [[90, nan, nan, 36.6], [nan, 150, nan, nan], [nan] * 4],
      [[nan, nan, nan, 37.0], [nan] * 4, [nan] * 4]], rtol=1e-6)
  assert [(p.line, p.reason) for p in problems.items] == [
      (6, "duplicate value for channel 'hr' at this time for this patient; the row is set aside")]
  info = problems.files["vitals.csv"]
  assert info["rows_other_items"] == 1 and info["values_from_text"] == 1
  assert info["fahrenheit_to_celsius"] == 1
  # By its unit too (a ';' file: decimal commas), and only for the temperature.
  path = _write(tmp_path, "v3.csv", "patient_id;hour;test;value;unit\nP1;0;temp;99,5;°F\n"
                "P1;0;hr;80;F\nP1;1;Temperature;37,1;°C\n")
  problems = tables.Problems("raise")
  vitals = tables.read_vitals(path, ["hr", "temp"], 2, 1.0, problems)
  np.testing.assert_allclose(vitals.values, [[[80, 37.5], [nan, 37.1]]], rtol=1e-6)
  assert problems.files["v3.csv"]["fahrenheit_to_celsius"] == 1
  # Neither wide nor long: the refusal says what a long file needs.
  with pytest.raises(tables.TableError, match="names them in an analyte column"):
    tables.read_vitals(_write(tmp_path, "v2.csv", "patient_id,hour,beat\nP1,0,80\n"), ["hr"],
                       3, 1.0, tables.Problems("quarantine"))


def test_long_labs_with_times_keep_each_analytes_earliest_draw_and_count_the_later_ones(tmp_path):
  """A long file with a charttime holds every draw (MIMIC's labevents: hundreds per patient);
  each later one was set aside as a duplicate, a quarantine entry per draw, and the first in
  the file was kept even when it was not the earliest. The earliest is kept, the later draws
  are counted; a second value at the same time is still a duplicate, set aside."""
  path = _write(tmp_path, "labs.csv", "subject_id,charttime,label,valuenum\n"
                "P1,2180-01-01 10:00,Sodium,140\n"
                "P1,2180-01-01 08:00,Sodium,135\n"
                "P1,2180-01-01 08:00,Sodium,136\n"
                "P1,2180-01-02 08:00,Potassium,4.0\n"
                "P2,soon,Sodium,150\n"
                "P2,2180-01-03 09:00,Sodium,141\n")
  problems = tables.Problems("quarantine")
  labs = tables.read_labs(path, (), {}, problems)
  assert labs.analytes == ["Potassium", "Sodium"] and labs.ids.tolist() == ["P1", "P2"]
  np.testing.assert_allclose(labs.values, [[4.0, 135], [np.nan, 141]])
  assert [(p.line, p.reason) for p in problems.items] == [
      (4, "duplicate value for analyte 'Sodium' (line 3 has it for this patient at this time); "
          "the row is set aside")]
  assert problems.files["labs.csv"]["later_draws"] == 2   # P1's 10:00, P2's unreadable time


def test_omop_measurement_rows_read_by_source_name_and_earliest_datetime(tmp_path):
  """OMOP CDM's measurement table: person_id, a concept id beside the source name, the value
  as a number and measurement_datetime, which was no time column (the first row in the file
  was kept, each later draw quarantined)."""
  path = _write(tmp_path, "labs.csv", "measurement_id,person_id,measurement_concept_id,"
                "measurement_datetime,value_as_number,unit_source_value,measurement_source_value\n"
                "11,7,3019550,2020-05-02T08:00:00,139,mmol/L,Sodium\n"
                "12,7,3019550,2020-05-01T08:00:00,141,mmol/L,Sodium\n"
                "13,7,3023103,2020-05-01T08:00:00,4.2,mmol/L,Potassium\n")
  problems = tables.Problems("raise")
  labs = tables.read_labs(path, (), {}, problems)
  assert labs.analytes == ["Potassium", "Sodium"] and labs.ids.tolist() == ["7"]
  np.testing.assert_allclose(labs.values, [[4.2, 141]], rtol=1e-6)
  assert problems.files["labs.csv"]["later_draws"] == 1


def test_categorical_labs_columns_become_indicators_and_identifying_ones_do_not(tmp_path):
  """A wide column of categories (sex, smoking status) was all 'not a number', set to missing:
  each category is now a 0/1 column (compared without case, empty where the cell is), True/
  False one 0/1 column. A column with a few numbers stays as it was; dates, and words that
  could identify a patient (an id), are no analytes (see the next test)."""
  rows = [f"P{i},{60 + i},{'m' if i % 2 else ('F' if i % 4 else 'f')},"
          f"{['never', 'former', 'current'][i % 3] if i % 7 else ''},{'True' if i % 3 else 'False'},"
          f"2020-01-{1 + i % 3:02d},{'P1' if i % 2 else 'P2'},{i if i % 5 else 'n/k'},"
          f"{'<0.01' if i % 10 else 0.5},{'NA' if i % 2 else 'inf'}" for i in range(30)]
  path = _write(tmp_path, "labs.csv", "patient_id,age,sex,smoking,diabetic,visit,ref,score,"
                "troponin_i,crp\n" + "\n".join(rows) + "\n")
  problems = tables.Problems("quarantine")
  labs = tables.read_labs(path, (), {}, problems)
  assert labs.analytes == ["age", "sex=f", "sex=m", "smoking=current", "smoking=former",
                           "smoking=never", "diabetic", "score", "troponin_i", "crp"]
  nan = np.nan
  np.testing.assert_allclose(labs.values[:2, :7], [[60, 1, 0, nan, nan, nan, 0],
                                                   [61, 0, 1, 0, 1, 0, 1]])
  info = problems.files["labs.csv"]
  assert info["categorical_columns"] == {"sex": ["f", "m"],
                                         "smoking": ["current", "former", "never"]}
  assert info["values"]["not_a_number"] == {"score": 6}
  assert info["date_columns"] == 1 and info["text_columns"] == 1
  assert info["values_at_limit"] == 27 and info["values"]["non_finite"] == {"crp": 30}
  assert "2 categorical columns as 0/1 indicators (sex 2, smoking 3)" in _ingest_table(problems)


@pytest.mark.parametrize("cells", [
    lambda i: f"19{50 + i}-0{1 + i % 9}-1{i % 10}",          # ISO, R's Date (JASA's birth.dt)
    lambda i: f"0{1 + i % 9}/1{i % 10}/19{50 + i} 10:3{i % 10} PM",
    lambda i: f"1{i % 10}-Mar-19{50 + i}",
    lambda i: f"1{i % 10}MAR19{50 + i}:08:00:00",             # SAS's datetime20.
    lambda i: f'"Mar {1 + i % 28}, 19{50 + i}"',
    lambda i: f"{19500101 + 10000 * i}",                      # YYYYMMDD, read as a number
    lambda i: f"0{i % 10}:{15 + i}"])                         # a time of day
def test_a_wide_column_of_dates_is_no_analyte_nor_is_one_of_free_text(tmp_path, cells):
  """A wide labs column of dates (a birth date as an export writes it) became an analyte of
  'not a number' values, or, written YYYYMMDD, of numbers that are birth dates, carried into
  tables.npz; free text (a comment) became an analyte no patient has. Each is now no analyte,
  one 'column' entry; a titre ('1:40') and an assay's limit ('<0.5') are no dates."""
  rows = [f"P{i},{cells(i)},{135 + i},note {i} on the draw,{'1:40' if i % 2 else '1:80'},"
          f"{'<0.5' if i % 3 else 0.7},2020-02-0{1 + i % 9}" for i in range(20)]
  path = _write(tmp_path, "labs.csv", "patient_id,born,Na,comment,ana_titre,crp,admit_date\n"
                + "\n".join(rows) + "\n")
  problems = tables.Problems("quarantine")
  labs = tables.read_labs(path, (), {}, problems)
  assert labs.analytes == ["Na", "ana_titre=1:40", "ana_titre=1:80", "crp"]
  np.testing.assert_allclose(labs.values[:2], [[135, 0, 1, 0.7], [136, 1, 0, 0.5]])
  reasons = _reasons(problems)
  assert reasons == [
      "column 2 ('born') holds dates or times, not measurements; its values are ignored",
      "column 7 ('admit_date') holds dates or times, not measurements; its values are ignored",
      "column 4 ('comment') holds text and no number, and not categories (at most 20 distinct "
      "values, 5 rows each on average, none that may identify a patient); its values are "
      "ignored"]
  info = problems.files["labs.csv"]
  assert info["date_columns"] == 2 and info["text_columns"] == 1 and "values" not in info
  text = _ingest_table(problems)
  assert "2 columns of dates or times not read as analytes" in text
  assert "1 columns of text and no number" in text


def test_wide_vitals_columns_as_exports_name_them_are_their_channels_fahrenheit_converted(
    tmp_path):
  """A wide file's 'Heart Rate' or 'Temp F' column was no channel (the file was refused, naming
  the channels not found): a channel's column is found by its own name, data.rename or the names
  exports give it, one column a channel; a Fahrenheit column's values are converted to Celsius,
  and the ingest table names the columns read for the channels."""
  path = _write(tmp_path, "vitals.csv", "MRN,Hour,Heart Rate,Pulse,HR (bpm),SBP mmHg,Resp Rate,"
                "SpO2 [%],Temp F\nP1,0,80,81,82,120,16,97,98.6\nP1,1,84,85,86,130,18,,100.4\n")
  problems = tables.Problems("raise")
  vitals = tables.read_vitals(path, ["hr", "pulse", "sbp", "rr", "spo2", "temp"], 2, 1.0,
                              problems, rename={"SBP mmHg": "sbp"})
  np.testing.assert_allclose(vitals.values[0], [[82, 81, 120, 16, 97, 37.0],
                                                [86, 85, 130, 18, np.nan, 38.0]], rtol=1e-6)
  info = problems.files["vitals.csv"]
  assert info["fahrenheit_to_celsius"] == 2
  assert info["channel_columns"] == {"hr": "HR", "sbp": "SBP mmHg", "rr": "Resp Rate",
                                     "spo2": "SpO2", "temp": "Temp F"}
  assert ("vitals.csv: channels from columns hr 'HR', sbp 'SBP mmHg', rr 'Resp Rate', spo2 "
          "'SpO2', temp 'Temp F', 2 temperatures in Fahrenheit converted to Celsius") in \
      _ingest_table(problems)
  # A unit in brackets says Fahrenheit too; 'Heart Rate' serves hr where no column is 'hr'.
  path = _write(tmp_path, "v2.csv", "patient_id,hour,Heart Rate,Temp (°F)\nP1,0,80,98.6\n")
  problems = tables.Problems("raise")
  vitals = tables.read_vitals(path, ["hr", "temp"], 1, 1.0, problems)
  np.testing.assert_allclose(vitals.values[0], [[80, 37.0]], rtol=1e-6)
  assert problems.files["v2.csv"]["channel_columns"] == {"hr": "Heart Rate", "temp": "Temp"}


def test_a_temp_column_mostly_in_fahrenheit_is_read_so_one_mostly_in_celsius_is_not(tmp_path):
  """A US export's temp column (98.6) lost every value as out of range [25, 45]. Where most of
  the column's values lie in the range only as Fahrenheit, those are converted; a Celsius value
  among them stays as it is. One 98.6 among Celsius values is a slip, set aside as before."""
  rows = "".join(f"P{i},{h},{t}\n" for i, temps in enumerate(
      ((98.6, 99.5, 37.2), (101.3, 97.7, 500)), 1) for h, t in enumerate(temps))
  path = _write(tmp_path, "vitals.csv", "patient_id,hour,temp\n" + rows)
  problems = tables.Problems("quarantine")
  vitals = tables.read_vitals(path, ["temp"], 3, 1.0, problems)
  np.testing.assert_allclose(vitals.values[..., 0], [[37, 37.5, 37.2], [38.5, 36.5, np.nan]],
                             rtol=1e-6)
  info = problems.files["vitals.csv"]
  assert info["fahrenheit_by_value"] == 4 and info["values"] == {"out_of_range": {"temp": 1}}
  assert "4 temperatures read as Fahrenheit by their values" in _ingest_table(problems)
  path = _write(tmp_path, "v2.csv", "patient_id,hour,temp\nP1,0,37.0\nP1,1,98.6\nP1,2,36.8\n")
  problems = tables.Problems("quarantine")
  vitals = tables.read_vitals(path, ["temp"], 3, 1.0, problems)
  np.testing.assert_allclose(vitals.values[0, :, 0], [37, np.nan, 36.8], rtol=1e-6)
  assert "fahrenheit_by_value" not in problems.files["v2.csv"]
  # A range the config widens to take both readings converts nothing.
  problems = tables.Problems("quarantine")
  vitals = tables.read_vitals(path, ["temp"], 3, 1.0, problems, ranges={"temp": (0.0, 120.0)})
  assert vitals.values[0, 1, 0] == pytest.approx(98.6)
