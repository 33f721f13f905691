"""The shape of a JSON file that medjax wrote, checked when it is read back.

A file left by an earlier run (the coordinator's state, a lineage record, a cache index, a
generation spec, a snapshot header, the ingest's manifest rows) can be valid JSON and still not
what its writer wrote: another version's copy, a hand edit, a bad merge. A reader that trusted
it crashed later, far from the file ("generation": "3" failed in an addition minutes after the
coordinator started, which then restarted into the same state). Each reader states the shape it
relies on with a few typed checks and calls `check` where it reads the file; a `SchemaError`
names the field, its value and what it should be, and the reader applies its file's rule (rebuild,
skip, start fresh, or one line for the user).

  FAILURE = schema.Object({"kind": schema.STR, "step": schema.Int(min=0)},
                          optional={"reason": schema.STR})
  schema.check(saved, FAILURE)   # SchemaError: field 'step' is '3', not an int >= 0

Extra keys are allowed unless `Object(extra=False)`: a newer version may add fields.
"""

from __future__ import annotations

import math
from typing import Any, Callable


class SchemaError(ValueError):
  """A value that does not have the shape its reader relies on; `field` is where (a path such
  as 'failures[2].step', '' for the value itself)."""

  def __init__(self, field: str, problem: str, wanted: str = ""):
    self.field, self.wanted = field, wanted
    super().__init__(f"field {field!r} {problem}" if field else f"the file {problem}")


def _show(value) -> str:
  text = repr(value)
  return text if len(text) <= 60 else text[:57] + "..."


def _wrong(field: str, value, wanted: str) -> SchemaError:
  return SchemaError(field, f"is {_show(value)}, not {wanted}", wanted)


class Check:
  """One typed check; `wanted` says what a good value is ("an int >= 0")."""
  wanted = "a value"

  def check(self, value, field: str) -> None:
    if not self.accepts(value):
      raise _wrong(field, value, self.wanted)

  def accepts(self, value) -> bool:   # pylint: disable=unused-argument
    return True


class Anything(Check):
  """Anything (a field whose value no reader interprets)."""


class Int(Check):
  """An int (never a bool, never a float or a string of digits), within [min, max]."""

  # pylint: disable-next=redefined-builtin
  def __init__(self, min: int | None = None, max: int | None = None):
    self.min, self.max = min, max
    bounds = [f">= {min}"] if min is not None else []
    bounds += [f"<= {max}"] if max is not None else []
    self.wanted = " ".join(["an int", " and ".join(bounds)]).strip()

  def accepts(self, value) -> bool:
    return (isinstance(value, int) and not isinstance(value, bool)
            and (self.min is None or value >= self.min)
            and (self.max is None or value <= self.max))


class Num(Check):
  """A number (int or float, never a bool), finite unless `finite=False`, and >= min."""

  # pylint: disable-next=redefined-builtin
  def __init__(self, min: float | None = None, finite: bool = True):
    self.min, self.finite = min, finite
    self.wanted = ("a finite number" if finite else "a number") + (
        f" >= {min}" if min is not None else "")

  def accepts(self, value) -> bool:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
      return False
    if self.finite and not math.isfinite(value):
      return False
    return self.min is None or value >= self.min


class Str(Check):
  """A string (non-empty if `nonempty`)."""

  def __init__(self, nonempty: bool = False):
    self.nonempty = nonempty
    self.wanted = "a non-empty string" if nonempty else "a string"

  def accepts(self, value) -> bool:
    return isinstance(value, str) and (bool(value) or not self.nonempty)


class OneOf(Check):
  """One of a few values (of their own types: 1 is not '1')."""

  def __init__(self, *values):
    self.values = values
    self.wanted = "one of " + ", ".join(repr(v) for v in values)

  def accepts(self, value) -> bool:
    return any(type(value) is type(v) and value == v for v in self.values)


class Nullable(Check):
  """None, or what `inner` accepts."""

  def __init__(self, inner: Check):
    self.inner = inner
    self.wanted = f"null or {inner.wanted}"

  def check(self, value, field: str) -> None:
    if value is None:
      return
    try:
      self.inner.check(value, field)
    except SchemaError as e:
      if e.field != field or not e.wanted:   # a field inside the value is wrong: that is news
        raise
      raise _wrong(field, value, f"null or {e.wanted}") from None


class AnyOf(Check):
  """What any of `options` accepts (each a scalar check)."""

  def __init__(self, *options: Check):
    self.options = options
    self.wanted = " or ".join(o.wanted for o in options)

  def accepts(self, value) -> bool:
    return any(o.accepts(value) for o in self.options)


class Satisfies(Check):
  """What `inner` accepts and `test` holds for; `wanted` describes both."""

  def __init__(self, inner: Check, test: Callable[[Any], bool], wanted: str):
    self.inner, self.test, self.wanted = inner, test, wanted

  def check(self, value, field: str) -> None:
    self.inner.check(value, field)
    try:
      good = self.test(value)
    except (TypeError, ValueError, OverflowError):
      good = False
    if not good:   # of the right type, wrong as a whole: no "null or" for `Nullable` to add
      raise SchemaError(field, f"is {_show(value)}, not {self.wanted}")


class List(Check):
  """A list whose items `item` accepts (at least `min_len` of them)."""

  def __init__(self, item: Check, min_len: int = 0):
    self.item, self.min_len = item, min_len
    self.wanted = "a list" + (f" of at least {min_len}" if min_len else "") + (
        f" (each {item.wanted})")

  def check(self, value, field: str) -> None:
    if not isinstance(value, list) or len(value) < self.min_len:
      raise _wrong(field, value, self.wanted)
    for i, item in enumerate(value):
      self.item.check(item, f"{field}[{i}]")


class Tuple(Check):
  """A list of exactly len(items) values, each checked by its own check."""

  def __init__(self, *items: Check):
    self.items = items
    self.wanted = "[" + ", ".join(i.wanted for i in items) + "]"

  def check(self, value, field: str) -> None:
    if not isinstance(value, list) or len(value) != len(self.items):
      raise _wrong(field, value, self.wanted)
    for i, (item, check) in enumerate(zip(value, self.items)):
      check.check(item, f"{field}[{i}]")


class Map(Check):
  """An object whose keys `key` accepts (any string if None) and whose values `value` does."""

  def __init__(self, value: Check, key: Check | None = None):
    self.value, self.key = value, key
    self.wanted = "an object" + (f" keyed by {key.wanted}" if key is not None else "")

  def check(self, value, field: str) -> None:
    if not isinstance(value, dict):
      raise _wrong(field, value, self.wanted)
    for k, v in value.items():
      if self.key is not None:
        try:
          self.key.check(k, field)
        except SchemaError:
          raise SchemaError(field, f"has a key {_show(k)}, not {self.key.wanted}") from None
      self.value.check(v, f"{field}.{k}" if field else str(k))


class Object(Check):
  """An object with `required` keys and maybe `optional` ones, each with its check; other keys
  are allowed (ignored) unless `extra=False`."""

  def __init__(self, required: dict[str, Check], optional: dict[str, Check] | None = None,
               extra: bool = True):
    self.required, self.optional, self.extra = required, optional or {}, extra
    self.wanted = "an object"

  def check(self, value, field: str) -> None:
    if not isinstance(value, dict):
      raise _wrong(field, value, "an object")
    for name, check in self.required.items():
      inner = f"{field}.{name}" if field else name
      if name not in value:
        raise SchemaError(inner, "is missing")
      check.check(value[name], inner)
    for name, check in self.optional.items():
      if name in value:
        check.check(value[name], f"{field}.{name}" if field else name)
    if not self.extra:
      known = set(self.required) | set(self.optional)
      unknown = sorted(str(k) for k in value if k not in known)
      if unknown:
        inner = f"{field}.{unknown[0]}" if field else unknown[0]
        raise SchemaError(inner, "is not a field of this file")


ANY = Anything()
STR = Str()
INT = Int()
COUNT = Int(min=0)
NUM = Num()


def check(value, schema: Check, field: str = ""):
  """`value` if `schema` accepts it; else SchemaError naming the first field that is wrong."""
  schema.check(value, field)
  return value
