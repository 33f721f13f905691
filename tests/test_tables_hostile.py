"""Hostile clinical tables: odd encodings and delimiters, malformed lines, absurd values, ids that
differ by whitespace or case. Every labels.csv line ends in the manifest or in the quarantine
report, and no raw patient id reaches any output."""

import csv
import io
import json
import logging
import os
import re
import tempfile

import numpy as np
import pydicom
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from configs import default as default_config
from configs import quickstart
from medjax import errors
from medjax.data import ingest
from medjax.data import ingest_summary
from medjax.data import pipeline
from medjax.data import synthetic
from medjax.data import tables
from medjax.data.tables import analytes
from medjax.data.synthetic import tables as synthetic_tables
from tests import testdata

CHANNELS = ("hr", "sbp", "dbp", "rr", "spo2", "temp")


def _write(tmp_path, name, data):
  path = tmp_path / name
  path.write_bytes(data if isinstance(data, bytes) else data.encode())
  return str(path)


def _labels(path, on_error="quarantine", **kw):
  problems = tables.Problems(on_error)
  labels, lines = tables.read_labels(path, problems, **kw).as_dicts()
  return labels, lines, problems


def _config(**data):
  config = default_config.get_config()
  config.data.vitals_steps = 6
  config.data.split = (0.5, 0.0, 0.5)
  config.data.scan_workers = 1
  config.data.update(data)
  return config


def _dicom(path, patient_id):
  ds = pydicom.dcmread(testdata.dicom_test_file("CT_small.dcm"))
  ds.PatientID = patient_id
  ds.SOPInstanceUID = pydicom.uid.generate_uid()
  ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
  os.makedirs(os.path.dirname(path), exist_ok=True)
  ds.save_as(path)


# -- rule 1: encodings, delimiters, line endings; unreadable files are refused ------------------

@pytest.mark.parametrize("encoding,expected,bom", [
    ("utf-8", "utf-8", False), ("utf-8-sig", "utf-8", True), ("cp1252", "cp1252", False),
    ("utf-16", "utf-16", True)])
def test_encodings_are_read_and_reported(tmp_path, encoding, expected, bom):
  text = "patient_id,diagnosis\nP1,Hämoglobin niedrig\nP2,café\n"
  labels, _, problems = _labels(_write(tmp_path, "labels.csv", text.encode(encoding)))
  assert labels == {"P1": "Hämoglobin niedrig", "P2": "café"}
  info = problems.files["labels.csv"]
  assert (info["encoding"], info["bom"]) == (expected, bom) and not problems.items


def test_latin1_file_is_reported_in_the_ingest_summary(tmp_path):
  root = tmp_path / "cohort"
  root.mkdir()
  (root / "labels.csv").write_bytes("patient_id,diagnosis\nP1,grippe aviaire é\n".encode("cp1252"))
  (root / "labs.csv").write_bytes(b"patient_id;Na\nP1;140,5\n")
  result = ingest.run(_config(), str(tmp_path / "w"), str(root))
  assert result.summary["tables"]["labels.csv"]["encoding"] == "cp1252"
  assert result.summary["tables"]["labs.csv"]["delimiter"] == ";"
  assert result.manifest.class_names == ["grippe aviaire é"]
  assert result.tables["labs"][0, 0] == pytest.approx(140.5)   # decimal comma, ';' file
  text = ingest_summary.format_summary(result.summary)
  assert "labels.csv: read as cp1252 (not UTF-8)" in text and "delimiter ';'" in text


def test_ids_written_as_floats_join_the_same_patients(tmp_path):
  """pandas writes an integer id column with a missing cell as floats: labs.csv's '7.0' was
  another patient than labels.csv's '7', the labs lost and the patient without them. An
  all-digit id written as a float is its digits (counted per file); '7.5' and 'A7.0' are
  ids as they are."""
  root = tmp_path / "cohort"
  root.mkdir()
  (root / "labels.csv").write_text("patient_id,diagnosis\n" + "".join(
      f"{i},{'copd' if i % 2 else 'normal'}\n" for i in range(1, 7)) + "7.5,copd\nA7.0,copd\n")
  (root / "labs.csv").write_text("patient_id,Na\n" + "".join(f"{i}.0,14{i}\n" for i in range(1, 7))
                                 + ",150\n7.5,139\nA7.0,138\n")
  result = ingest.run(_config(), str(tmp_path / "w"), str(root))
  assert len(result.manifest.record_ids) == 8
  assert result.summary["tables"]["labs.csv"]["ids_written_as_floats"] == 6
  assert not [q for q in result.quarantine if q.get("stage") == "link"]
  assert "labs.csv: 6 ids written as floats" in ingest_summary.format_summary(result.summary)


def test_ids_written_as_a_spreadsheet_s_text_formula_are_their_text(tmp_path):
  """An export meant for Excel writes an id as ="00123" to keep its leading zeros: it was
  the id '="00123"', another patient than DICOM's and labels.csv's 00123. It is its text."""
  root = tmp_path / "cohort"
  root.mkdir()
  (root / "labels.csv").write_text("patient_id,diagnosis\n" + "".join(
      f"00{i},{'copd' if i % 2 else 'normal'}\n" for i in range(1, 7)))
  (root / "labs.csv").write_text("patient_id,Na\n" + "".join(f'="00{i}",14{i}\n'
                                                           for i in range(1, 7)))
  result = ingest.run(_config(), str(tmp_path / "w"), str(root))
  assert len(result.manifest.record_ids) == 6
  assert result.summary["tables"]["labs.csv"]["ids_as_text_formulas"] == 6
  assert not [q for q in result.quarantine if q.get("stage") == "link"]
  assert "6 ids written as a spreadsheet's text formula" in ingest_summary.format_summary(
      result.summary)


def test_a_spreadsheet_s_error_values_are_missing_values(tmp_path):
  """'#VALUE!' in labels.csv's class column was a class (the model learnt one of that name),
  '#REF!' an id; '#DIV/0!' in a labs cell 'not a number', and '#DIV/0' with its '!' read as a
  flagged value. Each is a missing value, as '#N/A' was: the row set aside, the value missing
  and counted as non-finite."""
  root = tmp_path / "cohort"
  root.mkdir()
  (root / "labels.csv").write_text("patient_id,diagnosis\n" + "".join(
      f"P{i},{'copd' if i % 2 else 'normal'}\n" for i in range(6)) + "P6,#VALUE!\n#REF!,copd\n")
  (root / "labs.csv").write_text("patient_id,Na,eGFR\n" + "".join(
      f"P{i},14{i},{'#DIV/0!' if i % 2 else 60}\n" for i in range(7)))
  result = ingest.run(_config(), str(tmp_path / "w"), str(root))
  assert result.manifest.class_names == ["copd", "normal"]
  assert len(result.manifest.record_ids) == 6
  assert result.summary["tables"]["values_non_finite"] == {"eGFR": 3}
  reasons = [q["reason"] for q in result.quarantine if q.get("path") == "labels.csv"]
  assert len(reasons) == 2 and all("missing-value marker" in r for r in reasons)


def test_an_integer_class_written_as_a_float_is_the_integer(tmp_path):
  """An outcome column pandas wrote with a gap reads '1.0' where another export reads '1': two
  classes of one outcome, each half the patients. '1.0' is the class '1'; '1.5' is itself."""
  text = "patient_id,outcome\n" + "".join(f"P{i},{['0', '1', '0.0', '1.0'][i % 4]}\n"
                                           for i in range(8)) + "P8,1.5\n"
  labels, _, problems = _labels(_write(tmp_path, "labels.csv", text))
  assert sorted(set(labels.values())) == ["0", "1", "1.5"]
  assert not problems.items


def test_a_quoted_field_with_line_breaks_is_one_record(tmp_path):
  """An EHR export's free-text comment keeps its line breaks inside quotes: each of its lines
  was an 'unbalanced quote' row set aside, the patient's label with them. The record is read
  whole (the breaks as spaces, counted as fields_across_lines), each later line a 'line' entry
  saying so (every line of labels.csv is a patient or an entry); a stray quote whose next line
  is a row of its own still costs its own line only, and the line numbers stay the file's."""
  text = ('patient_id,diagnosis,note\nP1,copd,"seen at 10:00\ncalled back, no answer\n'
          'review"\nP2,normal,ok\nP3,copd,"stray\nP4,normal,fine\nP5,normal,x\n')
  labels, lines, problems = _labels(_write(tmp_path, "labels.csv", text))
  assert labels == {"P1": "copd", "P2": "normal", "P4": "normal", "P5": "normal"}
  assert lines == {"P1": 2, "P2": 5, "P4": 7, "P5": 8}
  assert [(p.line, p.what, p.reason.split(" (")[0]) for p in problems.items] == [
      (3, "line", "continues the quoted field of line 2"),
      (4, "line", "continues the quoted field of line 2"), (6, "row", "unbalanced quote")]
  info = problems.files["labels.csv"]
  assert info["fields_across_lines"] == 1 and info["blank_lines"] == 0 and info["rows"] == 5


def test_files_joined_end_to_end_set_their_repeated_headers_aside(tmp_path):
  """Two exports joined with `cat` repeat the header mid-file (with the second's byte order
  mark, or quoted): the line was a row, a patient 'patient_id' of class 'diagnosis' (a class
  the model then learnt) or of all-missing labs. It is now set aside, one 'line' entry that
  names no patient, and counted; the rows after it are read."""
  root = tmp_path / "cohort"
  root.mkdir()
  (root / "labels.csv").write_text(
      "patient_id,diagnosis\n" + "".join(f"P{i},{'copd' if i % 2 else 'normal'}\n"
                                          for i in range(6))
      + '\ufeff"Patient_ID","Diagnosis"\n' + "".join(f"P{i},copd\n" for i in range(6, 9)))
  (root / "labs.csv").write_text("patient_id,Na\nP0,140\npatient_id,Na\n"
                                 + "".join(f"P{i},14{i}\n" for i in range(1, 9)))
  result = ingest.run(_config(), str(tmp_path / "w"), str(root))
  assert result.manifest.class_names == ["copd", "normal"]
  assert len(result.manifest.record_ids) == 9
  entries = [q for q in result.quarantine if q.get("stage") == "tables"]
  assert [(q["path"], q["line"], q["set_aside"]) for q in entries] == [
      ("labels.csv", 8, "line"), ("labs.csv", 3, "line")]
  assert entries[0]["reason"] == ("repeats the header line (files joined end to end?); the "
                                  "line is set aside")
  info = result.summary["tables"]["labels.csv"]
  assert info["repeated_headers"] == 1 and info["rows"] == 9 and info["rows_quarantined"] == 0
  assert result.summary["tables"]["labs.csv"]["rows"] == 9
  assert "1 lines repeating the header" in ingest_summary.format_summary(result.summary)
  with pytest.raises(tables.TableError, match="labs.csv:3: repeats the header line"):
    tables.read_labs(str(root / "labs.csv"), (), {}, tables.Problems("raise"))


@pytest.mark.parametrize("above, below", [
    (["----------,---------"], ["", "(6 rows affected)", "",             # sqlcmd -s","
                                "Completion time: 2026-12-01T10:00:00.1234567+01:00"]),
    (["-----------+-----------"], ["(6 rows)"]),                         # psql, '|' to ','
    (["+------------+-----------+"], ["6 rows in set (0.00 sec)"]),      # mysql
    ([], ["", "6 rows selected."])])                                    # SQL*Plus
def test_a_sql_tool_s_text_output_is_read_without_its_rule_and_row_count(tmp_path, above, below):
  """A query's result saved from a SQL tool's text output has a rule of dashes under the header
  and a row count after the rows: the rule was a patient '----------' of class '---------', the
  count a patient named '(6 rows affected)' set aside. Each is now a 'line' entry naming no
  patient, counted as sql_tool_lines."""
  rows = [f"P{i} ,{'copd' if i % 2 else 'normal'}   " for i in range(6)]
  text = "\n".join(["patient_id,diagnosis", *above, *rows, *below]) + "\n"
  labels, _, problems = _labels(_write(tmp_path, "labels.csv", text))
  assert labels == {f"P{i}": "copd" if i % 2 else "normal" for i in range(6)}
  assert sorted(problems.named) == [f"P{i}" for i in range(6)]
  tool = [p for p in problems.items if p.what == "line"]
  assert len(tool) == len([x for x in above + below if x]) == len(problems.items)
  assert tool[0].reason.startswith("a rule or row count of a SQL tool's text output, not a row")
  info = problems.files["labels.csv"]
  assert info["sql_tool_lines"] == len(tool) and info["rows"] == 6


@pytest.mark.parametrize("delimiter", [",", ";", "\t", "|"])
@pytest.mark.parametrize("eol", ["\n", "\r\n", "\r"])
def test_delimiters_and_line_endings(tmp_path, delimiter, eol):
  d = delimiter
  text = eol.join([f"patient_id{d}diagnosis", f"P1{d}flu", f'"P{d}2"{d}"copd, severe"',
                   f"P3{d}asthma"]) + eol
  labels, lines, problems = _labels(_write(tmp_path, "labels.csv", text))
  assert labels == {"P1": "flu", f"P{d}2": "copd, severe", "P3": "asthma"}
  assert lines == {"P1": 2, f"P{d}2": 3, "P3": 4} and not problems.items
  assert problems.files["labels.csv"]["delimiter"] == d


@pytest.mark.parametrize("data,what", [
    (b"", "empty"), (b"\n  \n\n", "only blank lines"), (bytes(range(256)) * 8, "not a text"),
    (b"MRN001-SECRET,flu\nMRN002-SECRET,copd\n", "not a header"),
    (b"patient_id,diagnosis,Diagnosis\nP1,a,b\n", "columns 2 and 3 of the header have the same"),
    (b"\xff\xfep\x00\x00\xd8", "not valid UTF-16")])
def test_unreadable_files_are_refused_in_one_line(tmp_path, data, what):
  path = _write(tmp_path, "labels.csv", data)
  with pytest.raises(errors.InputError) as e:
    tables.read_labels(path, tables.Problems("quarantine"))
  message = str(e.value)
  assert isinstance(e.value, tables.TableError) and what in message
  assert path in message and "\n" not in message
  assert "SECRET" not in message  # a header-less file's first row is never echoed


@pytest.mark.parametrize("ident", ["MRN0042", "Jane Doe 1961-04-02", "4417 8821"])
def test_a_header_cell_that_may_identify_a_patient_is_never_echoed(tmp_path, ident):
  """Rule 7: a header cell is shown in a message only where it cannot identify anyone; an
  identifier pasted into a header (a shifted row, a stray cell) reaches no message, no table
  and no analyte name."""
  root = tmp_path / "cohort"
  root.mkdir()
  (root / "labels.csv").write_text("patient_id,diagnosis\nP1,flu\nP2,copd\n")
  (root / "labs.csv").write_text(f"patient_id,Na,{ident}\nP1,140,1\nP2,141,2\n")
  (root / "vitals.csv").write_text(f"patient_id,hour,{ident},hr\nP1,0,1,80\n")
  result = ingest.run(_config(analytes=(), vitals_channels=("hr",)), str(tmp_path / "w"),
                      str(root))
  assert result.tables["analytes"].tolist() == ["Na"]
  everything = json.dumps([result.quarantine, result.summary])
  assert ident not in everything and "withheld" in everything
  renamed = _config(analytes=("Na",), rename={ident: "Na"}, vitals_channels=("hr",))
  (root / "labs.csv").write_text(f"patient_id,Na,{ident},{ident}\nP1,1,2,3\n")   # one name twice
  with pytest.raises(errors.InputError) as e:
    ingest.run(renamed, str(tmp_path / "w2"), str(root))
  assert ident not in str(e.value)
  (root / "labs.csv").write_text(f"patient_id,Na,{ident}\nP1,140,150\n")   # two give Na
  result = ingest.run(renamed, str(tmp_path / "w2"), str(root))
  everything = json.dumps([result.quarantine, result.summary])
  assert "both give analyte 'Na' and differ" in everything and ident not in everything
  (root / "labs.csv").unlink()
  (root / "vitals.csv").write_text(f"patient_id,hour,{ident}\nP1,0,1\n")   # no hr column
  with pytest.raises(errors.InputError) as e:
    ingest.run(_config(vitals_channels=("hr",)), str(tmp_path / "w3"), str(root))
  assert "['hr']" in str(e.value) and ident not in str(e.value)


def test_an_id_in_a_class_or_a_merged_name_reaches_no_summary_and_no_class(tmp_path):
  """A patient's id in the class column (a shifted row) became a class: named in the manifest's
  class names, summary.json's classes and every per-class metric; an id that an analyte cell
  spelt twice ('P2', 'p2') was kept in summary.json's analytes_merged_by_case. Such a row is set
  aside with the id withheld, and the files' counts are redacted like the reasons are; integer
  classes beside integer ids are classes."""
  root = tmp_path / "cohort"
  root.mkdir()
  (root / "labels.csv").write_text("patient_id,diagnosis\nP1,flu\nP2,copd\nP3,P4\nP4,flu\n"
                                   "P5,p4\n")
  (root / "labs.csv").write_text("patient_id,analyte,value\nP1,Na,140\nP2,Na,141\nP3,Na,142\n"
                                 "P4,Na,143\nP5,Na,144\nP1,P2,1\nP3,p2,2\n")
  result = ingest.run(_config(analytes=(), classes=()), str(tmp_path / "w"), str(root))
  assert result.manifest.class_names == ["copd", "flu"]
  everything = json.dumps([result.quarantine, result.summary])
  assert not re.search(r"\b[Pp][24]\b", everything)
  assert [q["line"] for q in result.quarantine if q.get("path") == "labels.csv"] == [4, 6]
  assert "class (withheld: it is a patient's id; a shifted row?)" in everything
  (root / "labels.csv").write_text("patient_id,outcome\n1,0\n2,1\n3,1\n")
  (root / "labs.csv").write_text("patient_id,Na\n1,140\n2,141\n3,142\n")
  result = ingest.run(_config(analytes=(), classes=()), str(tmp_path / "w2"), str(root))
  assert result.manifest.class_names == ["0", "1"] and len(result.manifest) == 3


def test_a_long_labs_analyte_cell_holding_an_id_becomes_no_analyte(tmp_path):
  root = tmp_path / "cohort"
  root.mkdir()
  (root / "labels.csv").write_text("patient_id,diagnosis\nPTX7009K,flu\nP2,copd\n")
  (root / "labs.csv").write_text("patient_id,analyte,value\nPTX7009K,Na,140\nP2,Na,141\n"
                                 "P2,PTX7009K,3\nP2,K,4\n")
  result = ingest.run(_config(analytes=()), str(tmp_path / "w"), str(root))
  assert result.tables["analytes"].tolist() == ["K", "Na"]
  with open(tmp_path / "w" / "ingest" / "tables.npz", "rb") as f:
    raw = f.read()
  for encoding in ("utf-8", "utf-32-le"):
    assert "PTX7009K".encode(encoding) not in raw
  assert "PTX7009K" not in json.dumps([result.quarantine, result.summary])
  (row,) = [q for q in result.quarantine if q["path"] == "labs.csv" and q.get("line") == 4]
  assert "withheld" in row["reason"]


def test_absent_tables_are_optional(tmp_path):
  root = tmp_path / "cohort"
  root.mkdir()
  (root / "labels.csv").write_text("patient_id,diagnosis\nP1,flu\nP2,copd\n")
  (root / "labs.csv").write_text("patient_id,Na\nP1,140\nP2,141\n")
  result = ingest.run(_config(), str(tmp_path / "w"), str(root))   # no vitals.csv, no dicom/
  assert len(result.manifest) == 2 and set(result.summary["tables"]) >= {"labs.csv"}
  assert "vitals.csv" not in result.summary["tables"] and not result.quarantine


# -- rule 2: a malformed line costs that line only ------------------------------------------------

def test_unbalanced_quote_on_line_17_costs_line_17_only(tmp_path):
  rows = [f"P{i},{'flu' if i % 2 else 'copd'}" for i in range(1, 41)]
  rows[15] = 'P16,"copd'   # physical line 17
  path = _write(tmp_path, "labels.csv", "patient_id,diagnosis\n" + "\n".join(rows) + "\n")
  labels, _, problems = _labels(path)
  assert len(labels) == 39 and "P16" not in labels and labels["P17"] == "flu"
  assert [(p.line, p.what) for p in problems.items] == [(17, "row")]
  assert "unbalanced quote" in problems.items[0].reason
  with pytest.raises(tables.TableError, match=r"labels.csv:17: unbalanced quote"):
    _labels(path, on_error="raise")


@pytest.mark.parametrize("bad,reason", [
    (b"P2\x00,copd", "control character (byte 0x00)"),
    (b"P2,co\x01pd", "control character (byte 0x01)"), (b"P2\x7f,copd", "(byte 0x7f)"),
    (b"P2,copd\x1b", "(byte 0x1b)"), (b"P2,copd,extra", "3 fields, the header has 2"),
    (b'P2,"co"pd', "malformed quoting"), (b"P2,copd\xe9", "not valid UTF-8"),
    (b"P2", "1 fields, the header has 2")])
def test_malformed_line_is_set_aside_with_line_and_reason(tmp_path, bad, reason):
  data = ("patient_id,diagnosis\nP1,flu\n".encode() + bad + "\nP3,asthme sévère\n".encode()
          + b"".join(f"P{i},flu\n".encode() for i in range(4, 30)))
  labels, lines, problems = _labels(_write(tmp_path, "labels.csv", data))
  assert "P1" in labels and labels["P3"] == "asthme sévère" and "P2" not in labels
  assert len(labels) == 28 and lines["P3"] == 4
  assert [p.line for p in problems.items] == [3] and reason in problems.items[0].reason
  assert problems.files["labels.csv"]["encoding"] == "utf-8"


def test_blank_lines_are_counted_not_quarantined(tmp_path):
  labels, lines, problems = _labels(_write(tmp_path, "labels.csv",
                                           "\npatient_id,diagnosis\nP1,flu\n\n , \nP2,copd\n"))
  assert lines == {"P1": 3, "P2": 6} and not problems.items
  assert problems.files["labels.csv"]["blank_lines"] == 3
  assert problems.files["labels.csv"]["rows"] == 2


# -- rule 4: non-finite, unparseable and absurd values --------------------------------------------

def test_values_non_finite_unparseable_and_absurd_are_missing_and_counted(tmp_path):
  path = _write(tmp_path, "vitals.csv",
                "patient_id,hour,hr,sbp,dbp,rr,spo2,temp\n"
                "P1,0,80,120,80,16,98,37\n"
                "P1,1,inf,120,80,16,0.97,98.6\n"       # SpO2 as a fraction, temp in Fahrenheit
                "P1,2,NaN,120,80,16,98,37\n"
                "P1,3,abc,120,80,16,98,37\n"
                "P1,4,1e400,999,80,16,98,37\n")
  problems = tables.Problems("quarantine")
  v = tables.read_vitals(path, CHANNELS, 6, 1.0, problems).values[0]
  assert v[0].tolist() == [80, 120, 80, 16, 98, 37]
  assert np.isnan(v[1:5, 0]).all() and np.isnan([v[1, 4], v[1, 5], v[4, 1]]).all()
  assert v[1, 1] == 120 and v[4, 2] == 80   # only the bad cells are lost
  assert problems.files["vitals.csv"]["values"] == {
      "non_finite": {"hr": 3}, "not_a_number": {"hr": 1},
      "out_of_range": {"spo2": 1, "temp": 1, "sbp": 1}}
  entry = next(p for p in problems.items if "'hr'" in p.reason and p.what == "values"
               and "finite" in p.reason)
  assert (entry.line, entry.count, entry.lines) == (3, 3, (3, 4, 6))
  with pytest.raises(tables.TableError, match=r"vitals.csv:3: column 'hr': value 'inf'"):
    tables.read_vitals(path, CHANNELS, 6, 1.0, tables.Problems("raise"))


def test_value_ranges_config():
  defaults = tables.value_ranges(None)
  assert {name: analytes.range_for(defaults, name) for name in tables.DEFAULT_VALUE_RANGES} == (
      tables.DEFAULT_VALUE_RANGES)
  config = default_config.get_config()
  assert tables.value_ranges(config.data.value_ranges) == defaults
  config.data.value_ranges.K = (1, 10)
  config.data.value_ranges.hr = (20, 250)
  config.data.value_ranges.temp = None
  config.data.value_ranges["Total Bilirubin"] = (0, 50)
  ranges = tables.value_ranges(config.data.value_ranges)
  # Names are matched ignoring case: the override of 'K' is the default 'k' analyte's.
  assert ranges["k"] == (1, 10) and ranges["hr"] == (20, 250) and "temp" not in ranges
  assert analytes.range_for(ranges, "K") == (1, 10) and analytes.range_for(ranges, "NA") == (
      80.0, 220.0)
  # ... and spacing and punctuation, and a name exports give a known analyte is the analyte's:
  # the override of 'Total Bilirubin' is total_bilirubin's, also for a column named 'bili'.
  assert analytes.range_for(ranges, "total_bilirubin") == analytes.range_for(ranges, "bili") == (
      0, 50)
  for name in ("Sodium", "SOD", "Calcium, Total", "Urea Nitrogen", "White Blood Cells", "Hgb",
               "Alk. Phos"):
    assert analytes.range_for(ranges, name) is not None, name
  # A name that may mean another analyte gets no built-in range.
  for name in ("protein", "neutrophils", "troponin", "co2", "Calcium (ionized)"):
    assert analytes.range_for(ranges, name) is None, name
  with pytest.raises(errors.InputError, match=r"config.data.value_ranges.K=\(10, 1\)"):
    tables.value_ranges({"K": (10, 1)})


@pytest.mark.parametrize("num_patients", [300, 6000])
def test_synthetic_cohorts_fall_inside_the_default_ranges(num_patients):
  cfg = quickstart.get_config().data.synthetic
  cfg.num_patients = num_patients
  cohort = synthetic.sample_cohort(cfg)
  for c, name in enumerate(synthetic.VITALS_CHANNELS):
    low, high = tables.DEFAULT_VALUE_RANGES[name]
    values = cohort.vitals[..., c]
    assert low <= np.nanmin(values) and np.nanmax(values) <= high, name
  for a, name in enumerate(cohort.model.lab_names):
    bounds = analytes.range_for(tables.value_ranges(), name)
    values = cohort.labs[:, a]
    if bounds is not None and not np.all(np.isnan(values)):
      assert bounds[0] <= np.nanmin(values) and np.nanmax(values) <= bounds[1], name


def test_quickstart_tiny_cohort_has_no_value_set_aside(tmp_path):
  cfg = quickstart.get_config("tiny").data.synthetic
  cohort = synthetic.sample_cohort(cfg)
  synthetic_tables.write_tables(cohort, str(tmp_path), synthetic.VITALS_CHANNELS)
  result = ingest.run(quickstart.get_config("tiny"), str(tmp_path / "w"), str(tmp_path))
  # No DICOM was written: only patients with images alone are left out (label without data).
  with_tables = cohort.modality_mask[:, 1:].any(1)
  assert len(result.manifest) == with_tables.sum()
  assert {q["reason"].split(" (")[0] for q in result.quarantine} <= {
      "label for a patient with no data", "a label but no data"}
  t = result.summary["tables"]
  assert not t["values_out_of_range"] and not t["values_not_a_number"]
  assert not t["values_non_finite"]


# -- rule 5: vitals times ----------------------------------------------------------------------

def test_vitals_bad_times_set_their_row_aside(tmp_path):
  path = _write(tmp_path, "vitals.csv",
                "patient_id,hour,hr,sbp,dbp,rr,spo2,temp\n"
                "P1,0,80,120,80,16,98,37\n"
                "P1,-2,81,120,80,16,98,37\n"
                "P1,soon,82,120,80,16,98,37\n"
                "P1,2024-01-01T10:00:00,83,120,80,16,98,37\n"
                "P1,,84,120,80,16,98,37\n"
                "P1,2,85,120,80,16,98,37\n")
  problems = tables.Problems("quarantine")
  v = tables.read_vitals(path, CHANNELS, 4, 1.0, problems).values[0]
  assert v[0, 0] == 80 and v[2, 0] == 85 and np.isnan(v[1, 0])
  reasons = {p.line: p.reason for p in problems.items}
  assert sorted(reasons) == [3, 4, 5, 6]
  assert "negative time" in reasons[3] and "neither hours nor" in reasons[4]
  assert "timestamp but most of the file's times are hours" in reasons[5]
  assert "2024" not in reasons[5]   # dates are withheld


# -- rules 3, 6: labels, duplicates, unknown classes, ids' whitespace and case ------------------

def test_labels_unknown_class_and_empty_fields_are_quarantined_not_fatal(tmp_path):
  root = tmp_path / "cohort"
  root.mkdir()
  (root / "labels.csv").write_text("patient_id,diagnosis\nP1,flu\nP2,gout\nP3,\n,flu\nP1,flu\n"
                                   "P4,copd\n")
  (root / "labs.csv").write_text("patient_id,Na\nP1,140\nP2,141\nP3,142\nP4,143\n")
  result = ingest.run(_config(classes=("flu", "copd")), str(tmp_path / "w"), str(root))
  assert len(result.manifest) == 2 and result.manifest.class_names == ["flu", "copd"]
  reasons = {q["line"]: q["reason"] for q in result.quarantine if q["path"] == "labels.csv"
             and q["stage"] == "tables"}
  assert sorted(reasons) == [3, 4, 5, 6]
  assert "not in config.data.classes" in reasons[3] and "empty" in reasons[4]
  assert "empty" in reasons[5] and "duplicate patient row (line 2" in reasons[6]
  assert result.summary["tables"]["labels.csv"]["rows_quarantined"] == 4
  assert result.summary["tables"]["ids"]["data_without_label"] == 2   # P2, P3 have labs only


def test_ids_are_stripped_everywhere_and_case_differences_are_counted(tmp_path):
  root = tmp_path / "cohort"
  _dicom(str(root / "dicom" / "a.dcm"), " MRN-Alpha")   # leading space in the DICOM header
  _dicom(str(root / "dicom" / "b.dcm"), "mrn-beta")
  (root / "labels.csv").write_text("patient_id,diagnosis\n  MRN-Alpha ,flu\nMRN-Beta,copd\n"
                                   "mrn-beta,flu\n MRN-Gamma,copd\n")
  (root / "labs.csv").write_text("patient_id,Na\nMRN-ALPHA,140\n\tMRN-Gamma ,141\n")
  result = ingest.run(_config(), str(tmp_path / "w"), str(root))
  t = result.summary["tables"]
  # MRN-Alpha (DICOM + label), mrn-beta (DICOM + label), MRN-Gamma (labs + label); MRN-Beta has
  # no data; MRN-ALPHA's labs row has no label.
  assert len(result.manifest) == 3 and sorted(result.manifest.num_images > 0) == [0, 1, 1]
  assert t["ids_case_only_mismatch"] == 2 and t["ids"]["labels_without_data"] == 1
  assert t["ids"]["data_without_label"] == 1
  assert "ids differing only by letter case: 2" in ingest_summary.format_summary(result.summary)

  merged = ingest.run(_config(ids_case_insensitive=True), str(tmp_path / "w2"), str(root))
  t = merged.summary["tables"]
  assert len(merged.manifest) == 3 and t["ids_case_only_mismatch"] == 0
  assert merged.manifest.modality_mask.sum(0).tolist() == [2, 2, 0]
  dup = [q for q in merged.quarantine if q["path"] == "labels.csv" and q.get("line") == 4]
  assert dup and "duplicate patient row (line 3" in dup[0]["reason"]


def test_ids_a_spreadsheet_mangled_are_counted_with_what_to_do(tmp_path, caplog):
  """DICOM's 000123 is labs.csv's 123 once a spreadsheet has dropped the zeros, and a long
  number saved from one reads 1.23457E+11: they linked nothing, quietly (two patients each with
  half the data). They stay apart (000123 and 123 may be two patients) but are counted, in the
  summary and the ingest table, with what to do."""
  root = tmp_path / "cohort"
  _dicom(str(root / "dicom" / "a.dcm"), "000123")
  _dicom(str(root / "dicom" / "b.dcm"), "0042")
  (root / "labels.csv").write_text("patient_id,diagnosis\n000123,flu\n0042,copd\n"
                                   "1.23457E+11,flu\nA0042,copd\n")
  (root / "labs.csv").write_text("patient_id,Na\n123,140\n42,141\n1.23457E+11,139\n"
                                 "A0042,138\n")
  with caplog.at_level("WARNING"):
    result = ingest.run(_config(), str(tmp_path / "w"), str(root))
  t = result.summary["tables"]
  assert t["ids_leading_zeros_only_mismatch"] == 2 and t["ids_in_scientific_notation"] == 1
  assert t["ids_case_only_mismatch"] == 0 and t["ids"]["labs_without_label"] == 2
  table = ingest_summary.format_summary(result.summary)
  assert "ids differing only by leading zeros: 2" in table
  assert "ids in scientific notation: 1" in table
  assert "2 patient ids differ from another only by leading zeros" in caplog.text


# -- rule 7: every labels.csv line is in the manifest or in the quarantine report -----------------

_ID_CHARS = list("aAzZ09 \t\"',;|-._éÉßİıü") + ["\u00a0", "\u0301", "Ω", "日"]
_IDS = st.text(alphabet=_ID_CHARS, min_size=0, max_size=7)
_ROWS = st.lists(st.tuples(
    st.sampled_from(["good", "good", "good", "quote", "fields", "nul", "blank"]), _IDS,
    st.sampled_from(["flu", "copd", " asthma ", "Flu", ""]), st.booleans()), min_size=1,
    max_size=25)


def _labels_file(rows, delimiter, eol, bom) -> bytes:
  out = io.StringIO()
  writer = csv.writer(out, delimiter=delimiter, lineterminator=eol)
  writer.writerow(["patient_id", "diagnosis"])
  for kind, pid, cls, _ in rows:
    plain = pid.replace('"', "").replace(delimiter, "")
    if kind == "good":
      writer.writerow([pid, cls])
    elif kind == "quote":
      out.write(f'"{plain}{delimiter}flu{eol}')
    elif kind == "fields":
      writer.writerow([pid, "flu", "extra"])
    elif kind == "nul":
      out.write(f"{plain}\x00{delimiter}copd{eol}")
    else:
      out.write(f" {delimiter} {eol}")
  return ("\ufeff" if bom else "").encode() + out.getvalue().encode()


def _data_lines(data: bytes, delimiter: str) -> int:
  text = data.decode("utf-8-sig").replace("\r\n", "\n").replace("\r", "\n")
  lines = text.split("\n")[1:]
  return sum(1 for line in lines if line.strip(" \t" + delimiter))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=_ROWS, delimiter=st.sampled_from([",", ";"]), eol=st.sampled_from(["\n", "\r\n"]),
       bom=st.booleans())
def test_every_labels_line_is_in_the_manifest_or_quarantined(rows, delimiter, eol, bom):
  rows = rows + [("good", "anchor-patient", "flu", True)]
  with tempfile.TemporaryDirectory() as tmp:
    root = os.path.join(tmp, "cohort")
    os.makedirs(root)
    labels = _labels_file(rows, delimiter, eol, bom)
    with open(os.path.join(root, "labels.csv"), "wb") as f:
      f.write(labels)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["patient_id", "Na"])
    writer.writerows([pid, "140"] for _, pid, _, has_labs in rows if has_labs)
    with open(os.path.join(root, "labs.csv"), "w") as f:
      f.write(out.getvalue())
    result = ingest.run(_config(), os.path.join(tmp, "w"), root)
  quarantined = [q["line"] for q in result.quarantine
                 if q["path"] == "labels.csv" and q["stage"] == "tables"]
  assert len(quarantined) == len(set(quarantined))   # one reason per line
  data_lines = _data_lines(labels, delimiter)
  assert len(result.manifest) + len(quarantined) == data_lines
  assert result.summary["tables"]["labels.csv"]["rows"] == data_lines
  assert len(result.manifest) >= 1


# -- rule 8: no raw patient id in any output ----------------------------------------------------

SECRETS = ["Quokka-Alpha-Zeta", "quokka-alpha-zeta", "Wombat-Bravo", "Numbat-Charlie",
           "Dunnart-Delta", "Bilby-Echo", "Possum-Foxtrot", "Dingo-Golf", "Koala-Hotel",
           "Emu-India"]


def _secret_cohort(root):
  os.makedirs(root)
  _dicom(os.path.join(root, "dicom", "x.dcm"), " Possum-Foxtrot ")
  _dicom(os.path.join(root, "dicom", "y.dcm"), "Koala-Hotel")   # no label
  with open(os.path.join(root, "labels.csv"), "w") as f:
    f.write("patient_id,diagnosis\n"
            "Quokka-Alpha-Zeta,flu\n"
            "quokka-alpha-zeta,copd\n"           # differs by case only
            "  Wombat-Bravo ,flu\n"
            '"Numbat-Charlie,copd\n'              # unbalanced quote
            "Dunnart-Delta,flu,extra\n"          # a field too many
            "Wombat-Bravo,copd\n"                # duplicate
            "Bilby-Echo,Dingo-Golf\n"            # unknown class that is an id
            "Possum-Foxtrot,flu\n"
            "Emu-India,\n"                       # empty class
            "Dingo-Golf,flu\n")                  # no data
  with open(os.path.join(root, "labs.csv"), "w") as f:
    f.write("patient_id,Na,K\nQuokka-Alpha-Zeta,140,Wombat-Bravo\nquokka-alpha-zeta,139,4\n"
            "Wombat-Bravo,Bilby-Echo,4.1\nBilby-Echo,135,Possum-Foxtrot\nEmu-India,2,3\n")
  with open(os.path.join(root, "vitals.csv"), "w") as f:
    f.write("patient_id,hour,hr,sbp,dbp,rr,spo2,temp\nBilby-Echo,0,80,120,80,16,98,37\n"
            "Bilby-Echo,Quokka-Alpha-Zeta,80,120,80,16,98,37\nWombat-Bravo,1,Emu-India,1,1,1,1,1\n"
            "Koala-Hotel,0,1,1,1,1,1,1\n")


def _found(text: str) -> list[str]:
  folded = text.casefold()
  return [s for s in SECRETS if s.casefold() in folded]


def _output_text(path: str) -> str:
  if path.endswith(".npz"):
    with np.load(path) as f:
      return " ".join(" ".join(map(str, f[k].ravel().tolist())) for k in f.files
                      if f[k].dtype.kind in "US")
  with open(path, "rb") as f:
    return f.read().decode("utf-8", "replace")


def test_no_raw_patient_id_in_any_output(tmp_path, caplog):
  caplog.set_level(logging.DEBUG)
  root = str(tmp_path / "cohort")
  _secret_cohort(root)
  workdir = str(tmp_path / "w")
  result = ingest.run(_config(classes=("flu", "copd")), workdir, root)
  # What the cohort must have exercised: every kind of row set aside, values set aside.
  reasons = " | ".join(q["reason"] for q in result.quarantine)
  for what in ("unbalanced quote", "3 fields", "duplicate patient row", "config.data.classes",
               "empty", "no data", "not a number", "neither hours nor"):
    assert what in reasons, what
  assert "withheld" in reasons
  assert result.summary["tables"]["ids_case_only_mismatch"] >= 1
  outputs = [os.path.join(dp, f) for dp, _, fs in os.walk(workdir) for f in fs
             if "secrets" not in dp]
  assert {os.path.basename(p) for p in outputs} >= {"manifest.jsonl", "quarantine.jsonl",
                                                      "summary.json", "tables.npz"}
  for path in outputs:
    assert not _found(_output_text(path)), path
  assert not _found(caplog.text) and caplog.records
  assert not _found(ingest_summary.format_summary(result.summary))
  assert not _found(json.dumps(result.summary) + json.dumps(result.quarantine))
  # In raise mode the first problem becomes the error: one line, no id either.
  with pytest.raises(errors.InputError) as e:
    ingest.run(_config(on_error="raise"), str(tmp_path / "w2"), root)
  assert "labels.csv:3:" not in str(e.value) and "labels.csv:5: unbalanced quote" in str(e.value)
  assert not _found(str(e.value))


# -- rule 9, 10: counts in the summary; speed ----------------------------------------------------

def test_raise_mode_reports_the_lowest_line_of_the_file(tmp_path):
  path = _write(tmp_path, "labs.csv", "patient_id,Na,K\nP1,140,4\nP2,13O,x\nP2,1,1\nP3,\"1\n")
  with pytest.raises(tables.TableError, match=r"^labs.csv:3: column 'Na': value '13O'"):
    tables.read_labs(path, (), {}, tables.Problems("raise"))


def test_a_split_column_in_labels_csv_decides_the_split(tmp_path, caplog):
  """A cohort's own split (labels.csv's 'split' column, as MIMIC-CXR ships one) was ignored
  quietly and config.data.split drew another: test patients could train. The column decides;
  a row naming no split is set aside with its reason; with no 'train' at all, one clear error."""
  root = tmp_path / "cohort"
  rows = ["P1,flu,train", "P2,copd,Training", "P3,flu,val", "P4,copd, TEST ", "P5,flu,test",
          "P6,copd,", "P7,flu,fold3", "P8,copd,train"]
  (root / "labels.csv").parent.mkdir(parents=True)
  (root / "labels.csv").write_text("patient_id,diagnosis,Split,age\n"
                                   + "".join(f"{r},70\n" for r in rows))
  (root / "labs.csv").write_text("patient_id,Na\n" + "".join(f"P{i},{130 + i}\n"
                                                             for i in range(1, 9)))
  with caplog.at_level("INFO"):
    result = ingest.run(_config(), str(tmp_path / "w"), str(root))
  m = result.manifest
  by_record = dict(zip(m.record_ids.tolist(), m.split.tolist()))
  want = {"P1": "train", "P2": "train", "P3": "val", "P4": "test", "P5": "test", "P8": "train"}
  salt = ingest.load_or_create_salt(str(tmp_path / "w" / "secrets" / "id_salt"))
  assert {p: by_record[ingest.pseudonym(p, salt)] for p in want} == want
  assert len(m) == 6
  reasons = {q["line"]: q["reason"] for q in result.quarantine if q["path"] == "labels.csv"
             and q["stage"] == "tables"}
  assert reasons[7].startswith("empty 'Split' (train, val or test")
  assert reasons[8].startswith("'Split' 'fold3' is not a split")
  assert result.summary["tables"]["labels.csv"]["split_column"] == "Split"
  table = ingest_summary.format_summary(result.summary)
  assert "1 column not read ('age': it gives each patient's class and split" in table
  assert "the split from its 'Split' column" in table
  assert "config.data.split is not used): train 3, val 1, test 2" in caplog.text

  (root / "labels.csv").write_text("patient_id,diagnosis,split\nP1,flu,test\nP2,copd,val\n")
  with pytest.raises(errors.InputError, match="puts none of the patients ingest kept in 'train'"):
    ingest.run(_config(), str(tmp_path / "w2"), str(root))


def test_a_split_without_val_is_refused_before_training_that_needs_one(tmp_path):
  """labels.csv's split with train and test only, and early stopping on: each worker failed at
  its first epoch's end (a reshape of no validation rows) until the crash-loop guard stopped the
  run. The ingest (new or reused) refuses it at once, naming the field; ingest-only mode and a
  run that needs no validation split go on."""
  root = tmp_path / "cohort"
  root.mkdir()
  (root / "labels.csv").write_text("patient_id,diagnosis,split\n" + "".join(
      f"P{i},{'flu' if i % 2 else 'copd'},{'test' if i % 4 == 0 else 'train'}\n"
      for i in range(1, 9)))
  (root / "labs.csv").write_text("patient_id,Na\n" + "".join(f"P{i},{130 + i}\n"
                                                             for i in range(1, 9)))
  config = _config(root=str(root))
  config.optim.early_stopping_patience = 2
  for _ in ("a new ingest", "the ingest reused"):
    with pytest.raises(errors.InputError, match=r"config.optim.early_stopping_patience needs a "
                       r"validation split, and the ingested cohort has no 'val' patient"):
      pipeline.ingested(config, str(tmp_path / "w"), str(root))
  config.optim.early_stopping_patience = 0
  assert len(pipeline.ingested(config, str(tmp_path / "w"), str(root)).manifest) == 8
  config.optim.early_stopping_patience, config.mode = 2, "ingest"
  assert len(pipeline.ingested(config, str(tmp_path / "w"), str(root)).manifest) == 8


def test_a_dicom_patientid_that_is_a_missing_value_marker_is_quarantined_as_such(tmp_path):
  root = tmp_path / "cohort"
  _dicom(str(root / "dicom" / "a.dcm"), "NULL")
  _dicom(str(root / "dicom" / "b.dcm"), "P1")
  (root / "labels.csv").write_text("patient_id,diagnosis\nP1,flu\n")
  result = ingest.run(_config(), str(tmp_path / "w"), str(root))
  assert len(result.manifest) == 1
  assert {q["path"]: q["reason"] for q in result.quarantine}["dicom/a.dcm"] == (
      "its PatientID is blank or a missing-value marker ('NULL', 'N/A', 'None'); give the file "
      "its patient's id")
