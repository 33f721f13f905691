"""The config's schema (configs/default.py's fields, types and defaults) and matching names
against it ("did you mean")."""

from __future__ import annotations

import difflib
import functools
import math

import ml_collections


# Mappings whose keys are the user's names (labs.csv columns, channels), not fields.
FREE_FORM = ("data.rename", "data.value_ranges")


# Element types of tuple fields (str, int, or float for any number).
TUPLE_ITEMS = {"data.analytes": str, "data.classes": str, "data.vitals_channels": str,
               "data.split": float, "model.image_channels": int, "evals.splits": str}


def suggest(name: str, candidates) -> str:
  """'did you mean X?' for the candidate closest to `name` (case-insensitive), else ''.

  Dotted names (`data.batch_sise`) are compared whole, then by their last part, so a field put
  in the wrong section (`optim.batch_size`) still finds `data.batch_size`.
  """
  best = closest(name, candidates)
  return f"did you mean {best}?" if best else ""


def closest(name: str, candidates) -> str | None:
  """The candidate most like `name` (case-insensitive), or None. A dotted name is compared whole
  with the candidates whose last part is like its own (a shared section alone makes no match),
  then by its last part alone."""
  leaf = lambda n: n.rsplit(".", 1)[-1]
  by_lower = {}
  for c in candidates:
    by_lower.setdefault(str(c).lower(), str(c))
  alike = [c for c in by_lower if "." not in name
           or difflib.SequenceMatcher(None, leaf(name.lower()), leaf(c)).ratio() >= 0.6]
  hit = difflib.get_close_matches(name.lower(), alike, n=1, cutoff=0.6)
  if hit:
    return by_lower[hit[0]]
  if "." in name:
    by_leaf = {}
    for lower, c in by_lower.items():
      by_leaf.setdefault(leaf(lower), c)
    hit = difflib.get_close_matches(leaf(name.lower()), list(by_leaf), n=1, cutoff=0.8)
    if hit:
      return by_leaf[hit[0]]
  return None


def field_names(prefix: str = "") -> list[str]:
  """Every field and section of the schema as a dotted name (`data.batch_size`), for `suggest`."""
  out = []

  def walk(node, path):
    for key in node.keys():
      name = f"{path}{key}"
      out.append(prefix + name)
      if is_section(node[key]) and name not in FREE_FORM:
        walk(node[key], name + ".")
  walk(schema(), "")
  return out


@functools.lru_cache(maxsize=1)
def schema():
  """configs/default.py's config: every field, its type and default (never modified)."""
  from configs import default  # pylint: disable=import-outside-toplevel  (the repository's)
  return default.get_config()


def is_section(value) -> bool:
  return isinstance(value, (ml_collections.ConfigDict, dict))


def show(value) -> str:
  if isinstance(value, ml_collections.ConfigDict):
    value = value.to_dict()
  text = repr(tuple(value) if isinstance(value, list) else value)
  return text if len(text) <= 100 else text[:97] + "..."


def is_int(v) -> bool:
  return isinstance(v, int) and not isinstance(v, bool)


def is_number(v) -> bool:
  return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v)


KIND_TEXT = {bool: "True or False", int: "an int", float: "a finite number", str: "a string"}


ITEM_TEXT = {str: "strings", int: "ints", float: "numbers"}


IS = {bool: lambda v: isinstance(v, bool), int: is_int, float: is_number,
      str: lambda v: isinstance(v, str)}
