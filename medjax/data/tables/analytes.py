"""What medjax knows of lab analytes and vitals channels by name: the names exports give them,
their plausible ranges, their units and the SI units (and counts per µL) of common analytes with
conversions."""

from __future__ import annotations

import re

from medjax import errors

# Built-in plausible ranges (inclusive) of the known vitals channels: wide enough for any real
# patient and for the synthetic generator (which writes SpO2 up to ~103 and heart rates down to
# ~7), narrow enough to catch unit slips (temperature in Fahrenheit, SpO2 as a fraction).
VITALS_RANGES = {"hr": (0.0, 350.0), "sbp": (0.0, 400.0), "dbp": (0.0, 300.0),
                 "rr": (0.0, 150.0), "spo2": (20.0, 105.0), "temp": (25.0, 45.0)}
# And of common lab analytes, in conventional US units (the synthetic cohort's 43): what a
# living patient's sample can hold, extremes included (the PBC trial's alkaline phosphatase
# reached 13,862 U/L); a value outside is a unit slip, a typo or another analyte. Names are
# matched by `key`; config.data.value_ranges overrides any.
LAB_RANGES = {
    "na": (80.0, 220.0), "k": (0.5, 15.0), "cl": (40.0, 180.0), "hco3": (0.0, 70.0),
    "bun": (0.0, 400.0), "creatinine": (0.0, 40.0), "glucose": (0.0, 3000.0), "ca": (1.0, 25.0),
    "wbc": (0.0, 1500.0), "rbc": (0.0, 15.0), "hemoglobin": (0.0, 30.0),
    "hematocrit": (0.0, 100.0), "mcv": (30.0, 200.0), "mch": (5.0, 80.0), "mchc": (10.0, 60.0),
    "rdw": (5.0, 60.0), "platelets": (0.0, 5000.0), "neutrophils_pct": (0.0, 100.0),
    "alt": (0.0, 30000.0), "ast": (0.0, 50000.0), "alp": (0.0, 50000.0),
    "total_bilirubin": (0.0, 100.0), "direct_bilirubin": (0.0, 80.0), "albumin": (0.0, 10.0),
    "total_protein": (0.0, 20.0), "ggt": (0.0, 10000.0), "total_cholesterol": (0.0, 3000.0),
    "ldl": (0.0, 2000.0), "hdl": (0.0, 500.0), "triglycerides": (0.0, 20000.0),
    "pt": (0.0, 300.0), "inr": (0.0, 30.0), "aptt": (0.0, 500.0), "fibrinogen": (0.0, 3000.0),
    "d_dimer": (0.0, 100000.0), "tsh": (0.0, 1000.0), "free_t4": (0.0, 20.0),
    "free_t3": (0.0, 50.0), "troponin_i": (0.0, 1000.0), "bnp": (0.0, 100000.0),
    "ck_mb": (0.0, 3000.0), "crp": (0.0, 1000.0), "esr": (0.0, 200.0)}
DEFAULT_VALUE_RANGES = {**VITALS_RANGES, **LAB_RANGES}

# The names exports give known analytes (MIMIC's labels, SUPPORT's and the PBC trial's
# abbreviations, European spellings), each the analyte's for its plausible range and units.
# Only names that mean one analyte: not 'protein' (urine protein is in mg/dL), 'neutrophils'
# (a count or a percentage), 'troponin' (I or T, ng/mL or ng/L) or 'co2' (pCO2 in mmHg).
ANALYTE_NAMES = {
    "na": ("sodium", "serum sodium", "sod"), "k": ("potassium", "pot"), "cl": ("chloride",),
    "hco3": ("bicarbonate", "bicarb", "total co2", "tco2"),
    "bun": ("urea nitrogen", "blood urea nitrogen", "urea"),
    "creatinine": ("creat", "crea", "serum creatinine", "scr"),
    "glucose": ("glu", "blood glucose", "serum glucose"),
    "ca": ("calcium", "calcium total", "total calcium"),
    "wbc": ("white blood cells", "white blood cell count", "wbc count", "leukocytes", "wblc"),
    "rbc": ("red blood cells", "red blood cell count", "rbc count", "erythrocytes"),
    "hemoglobin": ("haemoglobin", "hgb", "hb"), "hematocrit": ("haematocrit", "hct"),
    "platelets": ("platelet count", "platelet", "plt"),
    "alt": ("alanine aminotransferase", "sgpt", "alat"),
    "ast": ("aspartate aminotransferase", "sgot", "asat"),
    "alp": ("alkaline phosphatase", "alk phos"),
    "total_bilirubin": ("bilirubin total", "bilirubin", "tbil", "tbili", "bili"),
    "direct_bilirubin": ("bilirubin direct", "dbil", "conjugated bilirubin"),
    "albumin": ("alb",), "total_protein": ("protein total",),
    "ggt": ("gamma glutamyltransferase", "gamma gt", "ggtp"),
    "total_cholesterol": ("cholesterol", "cholesterol total", "chol"),
    "ldl": ("ldl cholesterol", "cholesterol ldl"), "hdl": ("hdl cholesterol", "cholesterol hdl"),
    "triglycerides": ("triglyceride", "trig", "tg"), "pt": ("prothrombin time", "protime"),
    "inr": ("pt inr", "inr pt"), "aptt": ("ptt", "partial thromboplastin time"),
    "tsh": ("thyroid stimulating hormone",), "free_t4": ("ft4", "t4 free"),
    "free_t3": ("ft3", "t3 free"), "crp": ("c reactive protein",),
    "esr": ("sed rate", "sedimentation rate"), "li": ("lithium",)}


def _plain(name) -> str:
  return re.sub(r"[\W_]", "", str(name).casefold())


_OF_NAME = {_plain(n): _plain(a) for a, names in ANALYTE_NAMES.items() for n in names}


def key(name) -> str:
  """An analyte's or channel's name as looked up: casefolded, letters and digits only ('Total
  Bilirubin', 'total_bilirubin' and 'Calcium, Total' are one spelling), a name exports give a
  known analyte (`ANALYTE_NAMES`) the analyte's ('Sodium' is 'na')."""
  plain = _plain(name)
  return _OF_NAME.get(plain, plain)


def same_analyte(name) -> str:
  """How a long file's analyte names compare: without case, spaces, '_', '-', ',' or '.', a
  name exports give a known analyte (`ANALYTE_NAMES`: 'PLT', 'Platelet Count') as that
  analyte's. Other signs keep names apart ('Neutrophils %' and 'Neutrophils #' are two)."""
  folded = re.sub(r"[\s_\-.,]+", "", str(name).casefold())
  return _OF_NAME.get(folded, folded)


def value_ranges(config_ranges=None) -> dict[str, tuple[float, float]]:
  """`DEFAULT_VALUE_RANGES` updated by config.data.value_ranges (name -> (low, high) or None),
  keyed by `key`: an override of 'Sodium' is Na's, for every column named as sodium."""
  ranges = {key(name): bounds for name, bounds in DEFAULT_VALUE_RANGES.items()}
  for name, bounds in dict(config_ranges or {}).items():
    if bounds is None:
      ranges.pop(key(name), None)
      continue
    try:
      low, high = (float(b) for b in bounds)
      valid = low <= high
    except (TypeError, ValueError):
      valid = False
    if not valid:
      raise errors.InputError(f"config.data.value_ranges.{name}={bounds!r}: give (low, high) with "
                              "low <= high, or None for no check")
    ranges[key(name)] = (low, high)
  return ranges


def range_for(ranges: dict[str, tuple[float, float]], name: str):
  """The plausible (low, high) of analyte or channel `name` in `value_ranges`, or None."""
  return ranges.get(key(name))


# Spellings of one unit (after `unit`'s folding): mg% and mg/100 mL are mg/dL.
_UNIT_SPELLINGS = {"mg%": "mg/dl", "mg/100ml": "mg/dl", "g%": "g/dl", "g/100ml": "g/dl",
                   "mcmol/l": "umol/l", "micromol/l": "umol/l", "mmol/litre": "mmol/l",
                   "umol/litre": "umol/l", "g/litre": "g/l"}


# Cell counts: per litre as a power of ten, per µL or mm³ as thousands or millions, or one by
# one ('x10^9/L', '10*9/L', '10E9/L', '10⁹/L', 'K/uL', 'thou/mm3'; '/uL', 'cells/mm3', '/cumm').
_POWER = r"(?:x|\*)?10(?:\^|\*\*?|e)?"
_PER_UL = r"/(?:ul|mm3|mm\^3|cumm|cmm)"
_COUNTS = ((re.compile(rf"^(?:{_POWER}9/l|(?:k|thou|thous|{_POWER}3){_PER_UL})$"), "10^9/l"),
           (re.compile(rf"^(?:{_POWER}12/l|(?:m|mil|mill|{_POWER}6){_PER_UL})$"), "10^12/l"),
           (re.compile(rf"^(?:cells)?{_PER_UL}$"), "/ul"))
_SUPERSCRIPTS = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹", "0123456789")


def unit(text) -> str:
  """A unit as written, compared without case, spaces or the micro sign's spelling ('mg/dL',
  'MG/DL'; 'µmol/L', 'umol/L', 'mcmol/L'; 'mg%' and 'mg/100 mL' are mg/dL; a cell count's
  '10^9/L', 'x10E9/L' and 'K/uL' are one unit, '/uL' and 'cells/mm3' another)."""
  text = "" if text is None or text != text else str(text)
  text = "".join(text.split()).casefold().replace("\u00b5", "u").replace("\u03bc", "u")
  text = _UNIT_SPELLINGS.get(text, text)
  if "/" in text:
    counted = text.translate(_SUPERSCRIPTS)
    for pattern, canonical in _COUNTS:
      if pattern.match(counted):
        return canonical
  return text


# A header's trailing unit in brackets ('Heart Rate (bpm)', 'Creatinine [umol/L]'): base, unit.
UNIT_SUFFIX = re.compile(r"^(.*?)\s*[(\[]([^()\[\]]*)[)\]]\s*$")
# Bracketed text that is a unit, not part of the name ('Calcium (ionized)' is another analyte).
_UNIT_TEXT = re.compile(r"^(?:.*[/%^].*|fl|pg|s|sec|seconds|ratio|mmhg|bpm|u|iu|units?"
                        r"|°?[cf]|deg(?:rees)?[cf]|celsius|fahrenheit|℃|℉)$")


def is_unit(text) -> bool:
  """Whether `text` reads as a unit ('mmol/L', '%', 'bpm', 'U/L'; not 'mg' alone, nor a word)."""
  return bool(text) and bool(_UNIT_TEXT.match(unit(text)))


def name_and_unit(header: str) -> tuple[str, str]:
  """A wide column's header as analyte and unit: 'Creatinine (umol/L)' is ('Creatinine',
  'umol/L'), 'Calcium (ionized)' and 'Na' their whole selves without a unit."""
  m = UNIT_SUFFIX.match(str(header))
  if m and m[1].strip() and _UNIT_TEXT.match(unit(m[2])):
    return m[1].strip(), m[2].strip()
  return str(header), ""


# Analytes of one charge, for which mEq/L and mmol/L are one unit (sodium 140 mEq/L is
# 140 mmol/L); calcium's and magnesium's are not (1 mmol/L = 2 mEq/L).
MONOVALENT = frozenset(map(key, ("na", "k", "cl", "hco3", "co2", "li")))

# SI units of common analytes (and cell counts per µL), converted to the conventional (US)
# unit LAB_RANGES and most cohorts use: {analyte: (conventional unit, {unit (`unit`): factor})},
# by `key`. A count's 10^9/L is its 10^3/µL and its G/L (giga, as French labs write it); French
# labs' creatinine in mg/L and glucose and lipids in g/L are converted too.
_SI_UNITS = {
    "wbc": ("10^9/L", {"/ul": 1e-3, "g/l": 1.0}),
    "platelets": ("10^9/L", {"/ul": 1e-3, "g/l": 1.0}),
    "rbc": ("10^12/L", {"/ul": 1e-6, "t/l": 1.0}),
    "creatinine": ("mg/dL", {"umol/l": 1 / 88.42, "mg/l": 0.1}),
    "hemoglobin": ("g/dL", {"g/l": 0.1, "mmol/l": 1.611}),
    "mchc": ("g/dL", {"g/l": 0.1}), "albumin": ("g/dL", {"g/l": 0.1}),
    "total_protein": ("g/dL", {"g/l": 0.1}),
    "glucose": ("mg/dL", {"mmol/l": 18.016, "g/l": 100.0}),
    "bun": ("mg/dL", {"mmol/l": 2.801}),
    "ca": ("mg/dL", {"mmol/l": 4.008, "meq/l": 2.004}),
    "total_bilirubin": ("mg/dL", {"umol/l": 1 / 17.104}),
    "direct_bilirubin": ("mg/dL", {"umol/l": 1 / 17.104}),
    "total_cholesterol": ("mg/dL", {"mmol/l": 38.67, "g/l": 100.0}),
    "ldl": ("mg/dL", {"mmol/l": 38.67}), "hdl": ("mg/dL", {"mmol/l": 38.67}),
    "triglycerides": ("mg/dL", {"mmol/l": 88.57, "g/l": 100.0}),
    "hematocrit": ("%", {"l/l": 100.0}), "fibrinogen": ("mg/dL", {"g/l": 100.0})}
_SI_BY_KEY = {key(name): conversion for name, conversion in _SI_UNITS.items()}


def si_conversion(name: str) -> tuple[str, dict[str, float]] | None:
  """(conventional unit, {SI unit: factor}) of analyte `name`, or None where it has none."""
  return _SI_BY_KEY.get(key(name))


# Units of one quantity per volume: mass (g), amount (mol), charge (Eq) or enzyme activity (U,
# IU) with a metric prefix, over L, dL, mL or µL; a value in one is a fixed multiple of its
# value in another of the same quantity (CRP 0.5 mg/dL is 5 mg/L).
_QUANTITY = re.compile(r"^(k|d|c|mc|m|u|n|p)?(g|mol|eq|iu|u)/(d|c|m|u)?l$")
_PREFIXES = {None: 1.0, "k": 1e3, "d": 0.1, "c": 1e-2, "m": 1e-3, "mc": 1e-6, "u": 1e-6,
             "n": 1e-9, "p": 1e-12}
_QUANTITY_OF = {"g": "g", "mol": "mol", "eq": "eq", "iu": "u", "u": "u"}


def rescale(given: str, to: str) -> float | None:
  """The factor taking a value in unit `given` to unit `to` (both as `unit` folds them) where
  both are one quantity per volume (mg/dL and mg/L, mmol/L and µmol/L, U/L and mU/mL, µg/mL and
  mg/L: 1); None where they are not."""
  a, b = _QUANTITY.match(given), _QUANTITY.match(to)
  if not (a and b) or _QUANTITY_OF[a[2]] != _QUANTITY_OF[b[2]]:
    return None
  return (_PREFIXES[a[1]] / _PREFIXES[a[3]]) / (_PREFIXES[b[1]] / _PREFIXES[b[3]])
