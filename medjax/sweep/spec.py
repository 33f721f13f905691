"""The sweep config: its base run config, its search space, and each trial's config and flags.

A sweep config (`configs/sweep.py`) names a base run config file (`base`), fields fixed for every
trial (`overrides`), and a search space (`space`) mirroring the run config's sections; each
searched field's entry is one of

  ("loguniform", low, high)         a float, log-uniform on [low, high]
  ("uniform", low, high)            a float, uniform on [low, high]
  ("int", low, high[, step])        an int in [low, high]
  ("categorical", a, b, ...)        one of the values (tuples for tuple fields)
  ()                                not searched (so `--config.space.x.y="()"` drops a field)

`load(config)` checks all of it and the base config with its overrides (config_check) and raises
one `errors.InputError` naming the first problems. It imports neither jax nor optuna.

Fields that decide the ingest or the decoded records (every `data.*` field but the few in
`RUNTIME_DATA`) cannot be searched: trials share one ingest and one decoded cache. Set such a
field in `overrides` (one value per sweep) or run one sweep per value.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import importlib.util
import math
import os
from typing import Any

import ml_collections

import configs
from medjax import config_check
from medjax import errors

KINDS = ("loguniform", "uniform", "int", "categorical")
SAMPLERS = ("tpe", "random")
PRUNERS = ("asha", "hyperband", "none")
# data.* fields read only while training: searching them leaves the shared ingest and cache valid.
RUNTIME_DATA = ("data.batch_size", "data.num_partitions", "data.placement_method", "data.vnodes",
                "data.prefetch", "data.cache_memory_mb", "data.cache_policy", "data.replicas")
# Set by the sweep itself for every trial (or naming files the trials must not each own).
WIRED = ("mode", "trial", "evals.validation_metric", "evals.splits", "data.root",
         "data.salt_file", "data.cache_dir", "data.reingest", "mesh.compilation_cache_dir")
# The sweep config's own fields, with their types (a nested ConfigDict for the three sections).
SCHEMA = {
    "mode": str, "base": str, "overrides": dict, "space": dict,
    "study": {"name": str, "storage": str, "metric": str, "n_trials": int, "sampler": str,
              "seed": int, "start_with_base": bool},
    "pruner": {"kind": str, "min_resource": int, "reduction_factor": int},
    "trials": {"heartbeat_s": int, "grace_s": int, "max_retry": int, "timeout_s": float,
               "max_failures_in_a_row": int},
}


@dataclasses.dataclass(frozen=True)
class Param:
  """One searched config field; `field` (dotted) is also its Optuna parameter name."""
  field: str
  kind: str
  low: float = 0.0
  high: float = 0.0
  step: int = 1
  choices: tuple = ()

  def suggest(self, trial) -> Any:
    """The trial's value for this field, as the run config holds it."""
    if self.kind == "loguniform":
      return trial.suggest_float(self.field, self.low, self.high, log=True)
    if self.kind == "uniform":
      return trial.suggest_float(self.field, self.low, self.high)
    if self.kind == "int":
      return trial.suggest_int(self.field, int(self.low), int(self.high), step=self.step)
    return self.decode(trial.suggest_categorical(self.field, self.encoded_choices))

  @property
  def encoded_choices(self) -> tuple:
    return tuple(self.encode(c) for c in self.choices)

  def encode(self, value) -> Any:
    """Optuna's categorical values are None, bool, int, float or str: tuples go as their repr."""
    if self.kind == "categorical" and isinstance(value, (tuple, list)):
      return repr(tuple(value))
    return value

  def decode(self, raw) -> Any:
    """A stored parameter value back to the config's value."""
    if self.kind != "categorical":
      return raw
    for choice in self.choices:
      if self.encode(choice) == raw:
        return choice
    raise ValueError(f"{self.field}: {raw!r} is not one of {self.choices}")

  def contains(self, value) -> bool:
    if self.kind == "categorical":
      return any(_same(value, c) for c in self.choices)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
      return False
    if self.kind == "int":
      return (float(value).is_integer() and self.low <= value <= self.high
              and (value - self.low) % self.step == 0)
    return self.low <= value <= self.high


@dataclasses.dataclass(frozen=True)
class Sweep:
  """A checked sweep config.

  Attributes:
    config: the sweep config (ConfigDict).
    base_file: the base config as `medjax --config` takes it (absolute path[:variant]).
    base: the base run config with the overrides applied (never modified).
    overrides: dotted field -> value, fixed for every trial.
    params: the searched fields.
  """
  config: Any
  base_file: str
  base: Any
  overrides: dict
  params: tuple

  @property
  def metric(self) -> str:
    return self.config.study.metric

  @property
  def epochs(self) -> int:
    return int(self.base.optim.epochs)

  def param(self, field: str) -> Param:
    return next(p for p in self.params if p.field == field)

  def base_values(self) -> dict:
    """The base config's value of each searched field that lies in the space."""
    out = {}
    for p in self.params:
      value = _get(self.base, p.field)
      if p.contains(value):
        out[p.field] = p.encode(value)
    return out

  def identity(self) -> dict:
    """What must not change when a sweep is resumed in the same workdir."""
    c = self.config
    return {"base": c.base, "overrides": _jsonable(self.overrides),
            "space": {p.field: _jsonable(dataclasses.asdict(p)) for p in self.params},
            "metric": c.study.metric, "study": c.study.name,
            # Hashed: a database URL may hold a password.
            "storage": hashlib.sha256(c.study.storage.encode()).hexdigest()[:16]
                       if c.study.storage else ""}


def load(config) -> Sweep:
  """The checked sweep; raises one `errors.InputError` naming what is wrong and what to do."""
  found = _check_fields(config)
  if found:
    _raise(found)
  base_file, base = load_config_file(config.base)
  overrides = flatten(config.overrides)
  found = []
  for field, value in overrides.items():
    if field.split(".")[0] in ("mode", "trial"):
      found.append(f"config.overrides.{field}: the sweep sets it for every trial; remove it")
      continue
    found.extend(_set(base, field, value, f"config.overrides.{field}"))
  if found:
    _raise(found)
  if base.mode != "train":
    _raise([f"config.base={config.base!r}: its mode is {base.mode!r}; a sweep trains: give a "
            "training config (no :ingest variant)"])
  params, found = [], []
  for field, spec in flatten(config.space).items():
    param, problem = _param(base, field, spec)
    if problem:
      found.append(f"config.space.{field}={spec!r}: {problem}")
    elif param is not None:
      params.append(param)
  if not params and not found:
    found.append("config.space: no field is searched; give at least one, e.g. "
                 "config.space.optim.lr = ('loguniform', 1e-4, 1e-2)")
  if len(base.data.split) == 3 and not base.data.split[1] > 0:
    found.append(f"config.base data.split={tuple(base.data.split)}: the validation fraction is 0; "
                 "trials are judged on the validation split: give it records, e.g. "
                 "config.overrides.data.split = (0.7, 0.1, 0.2)")
  if found:
    _raise(found)
  # The base as a trial would have it (validation split evaluated), checked in full.
  probe = copy.deepcopy(base)
  probe.evals.validation_metric = config.study.metric
  probe.evals.splits = eval_splits(base)
  found = [f"config.base {config.base} with config.overrides: {p}"
           for p in config_check.problems(probe)]
  if found:
    _raise(found)
  # Each searched value alone on the base (combinations are checked per trial, where a bad one
  # fails that trial only).
  for param in params:
    values = param.choices if param.kind == "categorical" else (param.low, param.high)
    for value in values:
      one = copy.deepcopy(probe)
      _set(one, param.field, int(value) if param.kind == "int" else value, param.field)
      problems = config_check.problems(one)
      if problems:
        found.append(f"config.space.{param.field}: the value {value!r} is refused: "
                     f"{problems[0]}")
        break
  if found:
    _raise(found)
  return Sweep(config=config, base_file=base_file, base=base, overrides=overrides,
               params=tuple(params))


def eval_splits(base) -> tuple:
  """The base's evaluated splits with 'val' added: a trial's result is its validation metric."""
  splits = tuple(base.evals.splits)
  return splits if "val" in splits else ("val",) + splits


def trial_config(sweep: Sweep, values: dict, wiring: dict):
  """The run config a trial's process will build from `trial_flags` (for checking it here)."""
  config = copy.deepcopy(sweep.base)
  for field, value in {**values, **wiring}.items():
    problems = _set(config, field, value, field)
    if problems:
      raise errors.InputError(problems[0])
  return config


def trial_flags(sweep: Sweep, values: dict, wiring: dict) -> list[str]:
  """`--config.<field>=<value>` for the overrides, the trial's values and the sweep's wiring."""
  fields = {**sweep.overrides, **values, **wiring}
  return [f"--config.{field}={flag_value(value)}" for field, value in fields.items()
          if value is not None]


def flag_value(value) -> str:
  """A value as ml_collections' config_flags parses it back for a field of its type."""
  if isinstance(value, (tuple, list)):
    return repr(tuple(value))
  if isinstance(value, float):
    return repr(value)
  return str(value)


def flatten(section, prefix: str = "") -> dict:
  """A nested ConfigDict as {dotted field: leaf value}."""
  out = {}
  for key in section.keys():
    value = section[key]
    if isinstance(value, (ml_collections.ConfigDict, dict)):
      out.update(flatten(value, f"{prefix}{key}."))
    else:
      out[prefix + key] = value
  return out


def load_config_file(spec: str):
  """`path.py[:variant]` -> (the absolute spec --config takes, get_config(variant))."""
  path, _, variant = spec.partition(":")
  # configs/x.py from anywhere: beside the `configs` package (the checkout, or where installed).
  beside = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(configs.__file__))), path)
  if not os.path.isabs(path) and not os.path.exists(path) and os.path.exists(beside):
    path = beside
  path = os.path.abspath(path)
  if not os.path.isfile(path):
    raise errors.InputError(f"config.base={spec!r}: no such file; give a run config such as "
                            "configs/quickstart.py (or configs/quickstart.py:tiny)")
  module_spec = importlib.util.spec_from_file_location(
      f"medjax_sweep_base_{abs(hash(path))}", path)
  module = importlib.util.module_from_spec(module_spec)
  try:
    module_spec.loader.exec_module(module)
    config = module.get_config(variant or None)
  except Exception as e:  # pylint: disable=broad-except  # the config file's own error
    raise errors.InputError(f"config.base={spec!r}: the config file raised "
                            f"{type(e).__name__}: {e}") from e
  return (f"{path}:{variant}" if variant else path), config


# -- checks --------------------------------------------------------------------------------------

def _check_fields(config) -> list[str]:
  if "base" not in config.keys() and "model" in config.keys():
    return ["config.mode='sweep' needs a sweep config such as configs/sweep.py (it names its "
            "base run config in config.base), not a run config"]
  found = []

  def walk(node, schema, prefix):
    for key in node.keys():
      if key not in schema:
        best = config_check.suggest(prefix + key, _schema_names())
        found.append(f"config.{prefix}{key}: no such sweep field"
                     + (f"; {best}" if best else "; configs/sweep.py lists every field"))
    for key, kind in schema.items():
      if key not in node.keys():
        found.append(f"config.{prefix}{key}: missing; start from configs/sweep.py")
        continue
      value = node[key]
      if isinstance(kind, dict):
        if isinstance(value, (ml_collections.ConfigDict, dict)):
          walk(value, kind, f"{prefix}{key}.")
        else:
          found.append(f"config.{prefix}{key}: must be a section like configs/sweep.py's")
      elif kind is dict:
        if not isinstance(value, (ml_collections.ConfigDict, dict)):
          found.append(f"config.{prefix}{key}: must be a ConfigDict of run config sections")
      elif not _is(value, kind):
        found.append(f"config.{prefix}{key}={value!r}: must be {kind.__name__}")
  walk(config, SCHEMA, "")
  if found:
    return found
  s, p, t = config.study, config.pruner, config.trials
  for bad, text in (
      (config.mode != "sweep", "config.mode: must be 'sweep' in a sweep config"),
      (s.sampler not in SAMPLERS, f"config.study.sampler={s.sampler!r}: use one of {SAMPLERS}"),
      (p.kind not in PRUNERS, f"config.pruner.kind={p.kind!r}: use one of {PRUNERS}"),
      (not s.name.strip(), "config.study.name: give the study a name"),
      (not s.metric.strip(), "config.study.metric: name a validation metric, e.g. 'macro_f1'"),
      (s.n_trials < 1, f"config.study.n_trials={s.n_trials}: must be >= 1"),
      (p.min_resource < 1, f"config.pruner.min_resource={p.min_resource}: must be >= 1 (epochs)"),
      (p.reduction_factor < 2,
       f"config.pruner.reduction_factor={p.reduction_factor}: must be >= 2"),
      (t.heartbeat_s < 1, f"config.trials.heartbeat_s={t.heartbeat_s}: must be >= 1"),
      (t.grace_s <= t.heartbeat_s, f"config.trials.grace_s={t.grace_s}: must exceed "
                                   f"heartbeat_s={t.heartbeat_s} (a live trial is not stale)"),
      (t.max_retry < 0, f"config.trials.max_retry={t.max_retry}: must be >= 0"),
      (t.timeout_s < 0, f"config.trials.timeout_s={t.timeout_s}: must be >= 0 (0: none)"),
      (t.max_failures_in_a_row < 1,
       f"config.trials.max_failures_in_a_row={t.max_failures_in_a_row}: must be >= 1")):
    if bad:
      found.append(text)
  return found


def _param(base, field: str, spec) -> tuple[Param | None, str | None]:
  """The Param for `config.space.<field>`, or what is wrong with it."""
  if not isinstance(spec, (tuple, list)):
    return None, f"give a tuple: (kind, ...) with kind one of {KINDS}, or () to skip it"
  if not spec:
    return None, None
  current = _get(base, field)
  if current is _MISSING or isinstance(current, (ml_collections.ConfigDict, dict)):
    best = config_check.suggest(field, config_check.field_names())
    return None, "no such run config field" + (f"; {best}" if best else "")
  section = field.split(".")[0]
  if field.startswith("data.") and field not in RUNTIME_DATA:
    return None, ("changes the ingest or the decoded records, which every trial shares; set it "
                  "in config.overrides (one value for the sweep) or run one sweep per value; "
                  f"data fields that can be searched: {', '.join(RUNTIME_DATA)}")
  if field in WIRED or section in WIRED:
    return None, "the sweep sets it for every trial; it cannot be searched"
  kind, args = spec[0], tuple(spec[1:])
  if kind not in KINDS:
    best = config_check.suggest(str(kind), KINDS)
    return None, f"unknown kind {kind!r}; use one of {KINDS}" + (f" ({best})" if best else "")
  if kind == "categorical":
    if not args:
      return None, "give at least one value: ('categorical', a, b, ...)"
    wrong = [a for a in args if not _fits(current, a)]
    if wrong:
      return None, (f"{wrong[0]!r} is not a value of the field's type (the base has "
                    f"{current!r})")
    return Param(field, kind, choices=args), None
  numeric = ("an int", int) if kind == "int" else ("a float", float)
  if not _fits(current, numeric[1](1)) or isinstance(current, bool):
    return None, f"{kind} needs {numeric[0]} field; the base has {current!r}"
  if len(args) not in ((2, 3) if kind == "int" else (2,)):
    return None, f"give ('{kind}', low, high" + (", [step])" if kind == "int" else ")")
  if not all(_is(a, int if kind == "int" else float) for a in args):
    return None, "low, high" + (" and step must be ints" if kind == "int" else " must be numbers")
  low, high = args[0], args[1]
  if not low < high:
    return None, f"low={low} must be below high={high}"
  if kind == "loguniform" and low <= 0:
    return None, f"low={low}: a log-uniform range needs low > 0"
  step = args[2] if len(args) == 3 else 1
  if kind == "int" and step < 1:
    return None, f"step={step} must be >= 1"
  return Param(field, kind, low=low, high=high, step=step), None


def _set(config, field: str, value, name: str) -> list[str]:
  node, keys = config, field.split(".")
  for key in keys[:-1]:
    if not isinstance(node, ml_collections.ConfigDict) or key not in node.keys():
      node = None
      break
    node = node[key]
  if not isinstance(node, ml_collections.ConfigDict) or keys[-1] not in node.keys():
    best = config_check.suggest(field, config_check.field_names())
    return [f"{name}: no such run config field" + (f"; {best}" if best else "")]
  try:
    node[keys[-1]] = tuple(value) if isinstance(value, list) else value
  except TypeError as e:
    return [f"{name}={value!r}: {e}"]
  return []


_MISSING = object()


def _get(config, field: str):
  node = config
  for key in field.split("."):
    if not isinstance(node, (ml_collections.ConfigDict, dict)) or key not in node.keys():
      return _MISSING
    node = node[key]
  return node


def _is(value, kind) -> bool:
  if kind is bool:
    return isinstance(value, bool)
  if isinstance(value, bool):
    return False
  if kind is float:
    return isinstance(value, (int, float)) and math.isfinite(value)
  return isinstance(value, kind)


def _fits(current, value) -> bool:
  """Whether `value` can stand in a field whose base value is `current`."""
  if current is None:
    return isinstance(value, str)  # a placeholder(str)
  if isinstance(current, (tuple, list)):
    return isinstance(value, (tuple, list))
  if isinstance(current, float):
    return _is(value, float)
  return _is(value, type(current))


def _same(a, b) -> bool:
  if isinstance(a, (tuple, list)) or isinstance(b, (tuple, list)):
    return (isinstance(a, (tuple, list)) and isinstance(b, (tuple, list))
            and tuple(a) == tuple(b))
  if isinstance(a, bool) or isinstance(b, bool):
    return a is b
  return a == b


def _schema_names() -> list[str]:
  out = []
  for key, kind in SCHEMA.items():
    out.append(key)
    if isinstance(kind, dict):
      out.extend(f"{key}.{k}" for k in kind)
  return out


def _jsonable(value):
  if isinstance(value, dict):
    return {k: _jsonable(v) for k, v in value.items()}
  if isinstance(value, (tuple, list)):
    return [_jsonable(v) for v in value]
  return value


def _raise(found: list[str]) -> None:
  if len(found) == 1:
    raise errors.InputError(found[0])
  more = f"; and {len(found) - 3} more" if len(found) > 3 else ""
  raise errors.InputError(f"{len(found)} problems in the sweep config: " + "; ".join(found[:3])
                          + more)
