"""The run config checked in full before any ingest or process starts.

`validate(config)` collects every problem and raises one `errors.InputError` that lists the first
few, each as `config.<field>=<value>: what is wrong; what to do`. It imports no jax (launch.py
answers a bad config in well under 2 s). What it checks:

- Fields: every field is one of configs/default.py's (`get_config()`, the schema), with a "did you
  mean" suggestion (`suggest`) for an unknown one, and none is missing. The free-form mappings
  (`FREE_FORM`: data.rename, data.value_ranges) may hold any names.
- Types: int, float (finite), str, bool, tuples of str/int/numbers, as the schema's value says;
  None only for a placeholder (data.root).
- Enums: mode, data.on_error, data.isolate_decoding, data.prefetch, data.placement_method,
  data.cache_policy, data.replicas, model.fusion, model.missing, model.dtype,
  ckpt.if_all_damaged, evals.splits, and the fault.inject grammar (`medjax.runtime.inject.parse`).
- Ranges: sizes and counts >= 1 (or >= 0 where 0 means "from the data" or "off"), fractions,
  0 <= dropout < 1, lr > 0, Adam betas in [0, 1), timeouts > 0, ports 0..65535, the synthetic
  cohort's fractions, sizes and header weights.
- data.split: three fractions >= 0 that sum to 1, train and test > 0.
- Topology: the global batch (data.batch_size) splits evenly over every device of every
  generation the run can have: hosts (fault.hosts, else fault.local_hosts; with fault.elastic
  every count down to fault.min_hosts) x fault.workers_per_host (0: "auto", resolved for this
  machine as the launcher will, `medjax.fault.layout`) x fault.devices_per_worker in
  supervised runs; the mesh (mesh.data x mesh.fsdp, or the CPU devices XLA_FLAGS asks for when
  JAX_PLATFORMS=cpu) in an unsupervised one. mesh.data x mesh.fsdp covers those devices. An
  ingest-only run needs a batch of at least one record per host; a local run starts
  fault.local_hosts hosts, so fault.hosts cannot ask for more. (optim.grad_accum averages the
  gradients of whole global batches, so it adds no divisibility condition.)
- Consistency: data.decode_memory_mb against isolated decoding; model.num_classes /
  num_analytes / vitals_channels against data.classes / analytes / vitals_channels; attention
  heads divide model.d_model; cache_policy 'redirect' with replicas 1; a synthetic cohort's
  vitals_steps, channels and size against data.*; evals.splits against empty splits; fault
  timeouts (agent_interval_s < host_timeout_s, jax_heartbeat_timeout_s above ours,
  backoff_max_s >= backoff_s); fault.min_hosts against the host count; TLS fields all set or
  none; injected faults that could never fire.
- Paths: data.root (a directory holding dicom/, labs.csv, vitals.csv or labels.csv; labels.csv to
  train); data.salt_file's directory; fault.token_file and the fault.tls_* files that `role`
  reads (local: all of them; coordinator: cert and key; agent, worker: CA). A local run creates a
  missing token file; the other roles need it (or $MEDJAX_TOKEN).
"""

from __future__ import annotations

import difflib
import functools
import math
import os
import re
from typing import Any, Callable

import ml_collections

from medjax import errors
from medjax.data.synthetic import config as synthetic_config
from medjax.runtime import inject
from medjax.fault import layout

FREE_FORM = ("data.rename", "data.value_ranges")
ROLES = ("local", "coordinator", "agent", "worker")
SHOWN = 3  # problems spelled out in the error line; the rest are counted

# Accepted values, copied from where each is consumed (importing those modules costs jax,
# TensorStore or decoders; tests/test_config_check.py keeps the copies equal to the constants).
MODES = ("synth", "ingest", "train")                       # launch.py
ON_ERROR = ("raise", "quarantine")                         # data/tables.py Problems
ISOLATE = ("compressed", "all", "none")                    # data/decoder.py ISOLATE
PREFETCH = ("auto", "inline", "thread")                    # data/loader.py batches
PLACEMENT_METHODS = ("bounded", "ring", "modulo")          # data/placement.py METHODS
CACHE_POLICIES = ("recache", "redirect")                   # data/recache.py POLICIES
FUSIONS = ("attention", "gated")                           # model/fusion.py FusionModel
MISSING_POLICIES = ("learned", "zero", "mean", "drop")     # model/fusion.py MISSING_POLICIES
DTYPES = ("float32", "bfloat16", "float16")                # model/fusion.py jnp.dtype
IF_ALL_DAMAGED = ("stop", "start_fresh")                   # configs/default.py ckpt
CKPT_STRATEGIES = ("lineage", "epoch", "time", "none")      # medjax/train/checkpointing.py
WARM_STANDBY = ("after_failure", "always", "never")          # medjax/fault/agent.py warm_key
# Higher is better: keys of a split's metrics (medjax/evals/metrics.py); binary tasks have the
# last four instead of top-3 and the macro AUROC.
VALIDATION_METRICS = ("macro_f1", "accuracy", "top3_accuracy", "rare_recall", "auroc_macro",
                      "auroc", "auprc", "sensitivity", "specificity")
# manifest.SPLITS, spelled out: importing the manifest imports numpy, whose thread pool would
# keep the local launcher from forking its agents (medjax.fault.local).
SPLITS = ("train", "val", "test")
COHORT_FILES = ("dicom", "labs.csv", "vitals.csv", "labels.csv")

# Element types of tuple fields (str, int, or float for any number).
TUPLE_ITEMS = {"data.analytes": str, "data.classes": str, "data.vitals_channels": str,
               "data.split": float, "model.image_channels": int, "evals.splits": str}

_MISSING = object()
Check = Callable[[Any], "str | None"]


# -- per-field checks: each returns what is wrong and what to do, or None ----------------------

def _at_least(lo, hint: str = "") -> Check:
  return lambda v: None if v >= lo else f"must be >= {lo}{hint}"


def _above(lo, hint: str = "") -> Check:
  return lambda v: None if v > lo else f"must be > {lo}{hint}"


def _within(lo, hi, *, hi_open: bool = False, hint: str = "") -> Check:
  def check(v):
    if lo <= v and (v < hi if hi_open else v <= hi):
      return None
    return f"must be in [{lo}, {hi}{')' if hi_open else ']'}{hint}"
  return check


def _one_of(*names) -> Check:
  def check(v):
    if v in names:
      return None
    best = _closest(v, [n for n in names if isinstance(n, str)]) if isinstance(v, str) else None
    return f"use one of {names}" + (f" (did you mean {best!r}?)" if best else "")
  return check


def _names(v) -> str | None:
  if any(not x.strip() for x in v):
    return "names must be non-empty"
  dups = sorted({x for x in v if list(v).count(x) > 1})
  return f"{dups} appear more than once; give each name once" if dups else None


def _split(v) -> str | None:
  example = "give three fractions (train, val, test), e.g. (0.7, 0.1, 0.2)"
  if len(v) != 3:
    return f"has {len(v)} entries; {example}"
  if min(v) < 0:
    return f"a fraction is negative; {example}"
  if abs(sum(v) - 1) > 1e-6:
    return f"sums to {sum(v):g}, not 1; {example}"
  if v[0] <= 0:
    return "the train fraction is 0, so there is nothing to train on; give train a positive share"
  if v[2] <= 0:
    return "the test fraction is 0, so there is nothing to evaluate; give test a positive share"
  return None


def _rules() -> dict[str, tuple[Check, ...]]:
  """Field -> its checks, applied in order once its type is right (the first failure counts)."""
  rules: dict[str, tuple[Check, ...]] = {}

  def each(check: Check, fields: str) -> None:
    for name in fields.split():
      rules[name] = rules.get(name, ()) + (check,)

  syn = lambda names: " ".join(f"data.synthetic.{n}" for n in names.split())
  each(_at_least(1), "log_every_steps data.vitals_steps data.image_size data.max_images "
       "data.num_partitions data.batch_size data.max_pixels data.max_decoded_mb data.max_file_mb "
       "data.decode_workers model.d_model model.labs_hidden model.vitals_hidden "
       "model.heads model.mlp_dim model.labs_layers model.vitals_layers optim.epochs mesh.fsdp "
       "fault.local_hosts fault.devices_per_worker fault.min_hosts "
       "fault.jax_heartbeat_timeout_s " + syn("num_patients num_analytes max_images "
       "mean_images latent_dim_shared class_rank_shared image_latent_dim max_missing_panels"))
  each(_at_least(0), "seed data.cache_memory_mb model.fusion_layers optim.weight_decay "
       "optim.class_weight_power fault.replacement_wait_s fault.backoff_s fault.backoff_max_s "
       "fault.workers_per_host fault.local_spares "
       "fault.max_failures_without_progress fault.max_coordinator_restarts fault.hang_factor "
       "fault.hang_warmup_steps " + syn(
           "seed model_seed class_prior_exponent rare_twins twin_offset latent_dim_image "
           "class_sep vitals_trend junk_files"))
  each(_above(0), "data.vitals_hours_per_step data.decode_timeout_s optim.lr optim.clip_norm "
       "fault.timeout_training_s fault.timeout_compile_s fault.host_timeout_s fault.stop_grace_s "
       "fault.agent_interval_s fault.coordinator_lost_s fault.hang_floor_s "
       + syn("lab_noise vitals_noise image_noise"))
  each(_within(0, 1), "optim.warmup_fraction optim.end_lr_fraction " + syn(
      "frac_no_images frac_no_labs frac_partial_labs frac_no_vitals frac_missing_vitals_steps "
      "frac_missing_vitals_cells headers.frac_monochrome1 headers.frac_no_window "
      "headers.frac_padding headers.frac_dx"))
  each(_within(0, 1, hi_open=True), "model.modality_dropout optim.b1 optim.b2")
  each(_names, "data.analytes data.classes data.vitals_channels evals.splits")
  for field, names in (("mode", MODES), ("data.on_error", ON_ERROR), ("data.prefetch", PREFETCH),
                       ("data.isolate_decoding", ISOLATE),
                       ("data.placement_method", PLACEMENT_METHODS), ("data.replicas", (1, 2)),
                       ("data.cache_policy", CACHE_POLICIES), ("model.fusion", FUSIONS),
                       ("model.missing", MISSING_POLICIES), ("model.dtype", DTYPES),
                       ("ckpt.if_all_damaged", IF_ALL_DAMAGED),
                       ("ckpt.strategy", CKPT_STRATEGIES),
                       ("fault.warm_standby", WARM_STANDBY),
                       ("evals.validation_metric", VALIDATION_METRICS)):
    each(_one_of(*names), field)
  each(_at_least(0, " (0: never stop early)"), "optim.early_stopping_patience")
  each(_at_least(0, " (0: off)"), "monitor.interval_s monitor.nominal_power_w")
  each(_split, "data.split")
  each(_at_least(16, " (the synthetic images' air and marker regions need it)"),
       syn("image_size"))
  each(_at_least(2, " (vitals are a series)"), syn("vitals_steps"))
  each(_at_least(2), syn("num_classes"))
  each(_at_least(0, " (0: one per CPU core)"), "data.scan_workers")
  each(_at_least(1, " (100 is usual)"), "data.vnodes")
  each(_at_least(0, " (0: from the data)"), "model.num_analytes model.vitals_channels")
  each(lambda v: None if v == 0 or v >= 2 else "must be 0 (from the data) or >= 2",
       "model.num_classes")
  each(lambda v: None if all(c >= 1 for c in v) else "channel counts must be >= 1",
       "model.image_channels")
  each(_at_least(1, " (1: no accumulation)"), "optim.grad_accum")
  each(lambda v: None if v == -1 or v >= 1 else "must be -1 (all devices mesh.fsdp leaves) or a "
       "positive axis size", "mesh.data")
  each(_at_least(0, " (0: keep all)"), "ckpt.max_to_keep")
  each(_at_least(0, " (0: no confidence intervals)"), "evals.bootstrap")
  each(_at_least(0, " (0: only at partition boundaries)"), "ckpt.every_steps")
  each(_at_least(0), "ckpt.every_seconds")
  each(_at_least(0, " (0: a checkpoint at every boundary)"), "ckpt.min_interval_s")
  each(_at_least(0, " (0: no host-local snapshots)"), "ckpt.snapshot_every_steps")
  each(_at_least(0, " (0: unbounded)"), "max_steps_in_flight")
  each(lambda v: None if set(v) <= set(SPLITS) else f"use names from {SPLITS}", "evals.splits")
  each(lambda v: None if len(v) != 1 else "names one class; training needs at least two (or () "
       "for the names in labels.csv)", "data.classes")
  each(lambda v: None if v else "name at least one channel", "data.vitals_channels")
  each(_at_least(0, " (0: fault.local_hosts)"), "fault.hosts")
  # jax.distributed.initialize takes whole seconds (int(timeout_start_s)).
  each(_at_least(1), "fault.timeout_start_s")
  each(_within(0, 65535, hint=" (0: a free port)"), "fault.port")
  return rules


FIELD_CHECKS = _rules()


# -- public API ---------------------------------------------------------------------------------

def validate(config, *, role: str = "local") -> None:
  """Raises one `errors.InputError` naming the config's first problems; returns if it has none.

  Args:
    config: the run config (ConfigDict), as launch.py has it after the overrides.
    role: launch.py's --role; it decides which secret and TLS files must exist here.
  """
  found = problems(config, role=role)
  if not found:
    return
  if len(found) == 1:
    raise errors.InputError(found[0])
  more = f"; and {len(found) - SHOWN} more" if len(found) > SHOWN else ""
  raise errors.InputError(f"{len(found)} problems in the config: " + "; ".join(found[:SHOWN])
                          + more)


def problems(config, *, role: str = "local") -> list[str]:
  """Every problem `validate` would report, one line each: field by field (in the config's key
  order, unknown fields first at each level), then those across fields."""
  if role not in ROLES:
    raise ValueError(f"role={role!r}: use one of {ROLES}")
  checker = _Checker(config, role)
  checker.walk(config, _schema(), "")
  checker.cross()  # skips the fields `walk` reported
  return checker.found


def suggest(name: str, candidates) -> str:
  """'did you mean X?' for the candidate closest to `name` (case-insensitive), else ''.

  Dotted names (`data.batch_sise`) are compared whole, then by their last part, so a field put
  in the wrong section (`optim.batch_size`) still finds `data.batch_size`.
  """
  best = _closest(name, candidates)
  return f"did you mean {best}?" if best else ""


def _closest(name: str, candidates) -> str | None:
  by_lower = {}
  for c in candidates:
    by_lower.setdefault(str(c).lower(), str(c))
  hit = difflib.get_close_matches(name.lower(), list(by_lower), n=1, cutoff=0.6)
  if hit:
    return by_lower[hit[0]]
  if "." in name:
    by_leaf = {}
    for lower, c in by_lower.items():
      by_leaf.setdefault(lower.rsplit(".", 1)[-1], c)
    hit = difflib.get_close_matches(name.rsplit(".", 1)[-1].lower(), list(by_leaf), n=1,
                                    cutoff=0.8)
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
      if _is_section(node[key]) and name not in FREE_FORM:
        walk(node[key], name + ".")
  walk(_schema(), "")
  return out


# -- the checker --------------------------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def _schema():
  """configs/default.py's config: every field, its type and default (never modified)."""
  from configs import default  # pylint: disable=import-outside-toplevel  (the repository's)
  return default.get_config()


def _is_section(value) -> bool:
  return isinstance(value, (ml_collections.ConfigDict, dict))


def _show(value) -> str:
  if isinstance(value, ml_collections.ConfigDict):
    value = value.to_dict()
  text = repr(tuple(value) if isinstance(value, list) else value)
  return text if len(text) <= 100 else text[:97] + "..."


def _is_int(v) -> bool:
  return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
  return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v)


_KIND_TEXT = {bool: "True or False", int: "an int", float: "a finite number", str: "a string"}
_ITEM_TEXT = {str: "strings", int: "ints", float: "numbers"}
_IS = {bool: lambda v: isinstance(v, bool), int: _is_int, float: _is_number,
       str: lambda v: isinstance(v, str)}


class _Checker:
  """Collects problems; `bad` holds the fields already reported, which later checks skip."""

  def __init__(self, config, role: str):
    self.config, self.role = config, role
    self.found: list[str] = []
    self.bad: set[str] = set()

  def add(self, path: str, text: str, value: Any = _MISSING) -> None:
    value = self.get(path) if value is _MISSING else value
    shown = "" if value is _MISSING else f"={_show(value)}"
    self.found.append(f"config.{path}{shown}: {text}")
    self.bad.add(path)

  def get(self, path: str) -> Any:
    node = self.config
    for key in path.split("."):
      if not _is_section(node) or key not in node.keys():
        return _MISSING
      node = node[key]
    return node

  def ok(self, *paths: str) -> bool:
    """All of `paths` are present, set and passed their own checks."""
    return all(p not in self.bad and self.get(p) not in (_MISSING, None) for p in paths)

  # -- fields, types, enums, ranges --

  def walk(self, node, schema, prefix: str) -> None:
    for key in node.keys():
      if key not in schema.keys():
        path = prefix + key
        best = _closest(path, field_names())
        self.add(path, f"no such field; did you mean config.{best}?" if best else
                 "no such field; remove it (configs/default.py lists every field)", node[key])
    for key in schema.keys():
      path = prefix + key
      if key not in node.keys():
        self.add(path, "missing; derive the config from configs/default.py, which defines it")
        continue
      value, expected = node[key], schema[key]
      if path in FREE_FORM and _is_section(expected):
        self._free_form(path, value)
      elif _is_section(expected):
        if _is_section(value):
          self.walk(value, expected, path + ".")
        else:
          self.add(path, "must be a section (a ConfigDict) like configs/default.py's", value)
      elif self._typed(path, value, expected, schema.get_type(key)):
        for check in FIELD_CHECKS.get(path, ()):
          text = check(value)
          if text:
            self.add(path, text, value)
            break

  def _free_form(self, path: str, value) -> None:
    if not _is_section(value):
      self.add(path, "must be a mapping (a ConfigDict)", value)
    elif not all(isinstance(k, str) and k for k in value.keys()):
      self.add(path, "keys must be non-empty strings", value)
    elif path == "data.rename" and not all(isinstance(value[k], str) and value[k]
                                           for k in value.keys()):
      self.add(path, "maps labs.csv column names to analyte names; give strings", value)

  def _typed(self, path: str, value, expected, field_type) -> bool:
    """Whether `value` has the schema's type; reports it if not."""
    if value is None:
      if expected is None:
        return False  # an unset placeholder
      self.add(path, f"must be {self._kind_text(path, expected, field_type)}, not None", value)
      return False
    kind = field_type if expected is None else type(expected)
    if kind in (tuple, list):
      item = TUPLE_ITEMS.get(path, type(expected[0]) if expected else str)
      if isinstance(value, (tuple, list)) and all(_IS[item](x) for x in value):
        return True
    elif kind in _IS and _IS[kind](value):
      return True
    self.add(path, f"must be {self._kind_text(path, expected, field_type)}", value)
    return False

  @staticmethod
  def _kind_text(path: str, expected, field_type) -> str:
    kind = field_type if expected is None else type(expected)
    if kind in (tuple, list):
      item = TUPLE_ITEMS.get(path, type(expected[0]) if expected else str)
      example = f" such as {expected!r}" if expected else ""
      return f"a tuple of {_ITEM_TEXT[item]}{example}"
    return _KIND_TEXT.get(kind, kind.__name__)

  # -- across fields --

  def cross(self) -> None:
    self._data_and_model()
    self._synthetic()
    self._fault_timing()
    self._topology()
    self._inject()
    self._paths()

  def _data_and_model(self) -> None:
    g = self.get
    if self.ok("data.cache_policy", "data.replicas") and (
        g("data.cache_policy") == "redirect" and g("data.replicas") != 1):
      self.add("data.replicas", "config.data.cache_policy='redirect' never caches moved "
                                "records; set replicas=1 or cache_policy='recache'")
    if self.ok("data.isolate_decoding", "data.decode_memory_mb") and (
        g("data.isolate_decoding") != "none" and g("data.decode_memory_mb") < 256):
      self.add("data.decode_memory_mb", "is too little for a decoder process to start; give 2048 "
                                        "or more (or config.data.isolate_decoding='none')")
    for model_field, data_field, what in (
        ("model.num_classes", "data.classes", "class names"),
        ("model.num_analytes", "data.analytes", "analytes"),
        ("model.vitals_channels", "data.vitals_channels", "channels")):
      if self.ok(model_field, data_field) and g(data_field) and g(model_field) and (
          g(model_field) != len(g(data_field))):
        self.add(model_field, f"but config.{data_field} names {len(g(data_field))} {what}; set "
                              f"it to {len(g(data_field))} (or 0 to take it from the data)")
    if self.ok("model.fusion", "model.d_model", "model.heads", "model.fusion_layers") and (
        g("model.fusion") == "attention"):
      if g("model.d_model") % g("model.heads"):
        self.add("model.heads", f"does not divide config.model.d_model={g('model.d_model')}; "
                                "attention splits d_model over the heads")
      if g("model.fusion_layers") < 1:
        self.add("model.fusion_layers", "attention fusion needs at least 1 layer (0 would ignore "
                                        "every modality); use >= 1 or model.fusion='gated'")
    if self.ok("evals.splits", "data.split") and len(g("data.split")) == 3:
      empty = [s for s, f in zip(SPLITS, g("data.split")) if f == 0 and s in g("evals.splits")]
      if empty:
        self.add("evals.splits", f"evaluates {empty[0]!r}, which config.data.split leaves empty; "
                                 f"drop it or give it a share")
    if self.ok("ckpt.strategy", "ckpt.every_seconds", "ckpt.every_steps"):
      strategy = g("ckpt.strategy")
      if strategy == "time" and g("ckpt.every_seconds") <= 0:
        self.add("ckpt.every_seconds", "must be > 0 with config.ckpt.strategy='time'; give the "
                                       "seconds between checkpoints, e.g. 600")
      if strategy != "lineage" and g("ckpt.every_steps"):
        self.add("ckpt.every_steps", f"applies to config.ckpt.strategy='lineage', not "
                                     f"{strategy!r}; set it to 0 or use the lineage strategy")
    wants = [f for f in ("optim.early_stopping_patience", "ckpt.keep_best") if g(f)]
    if (wants and self.ok("data.split") and len(g("data.split")) == 3
        and g("data.split")[1] == 0):
      self.add(wants[0], "needs a validation split, which config.data.split leaves empty; give "
                         "'val' a share (e.g. --config.data.split='(0.8, 0.1, 0.1)') or turn it off")

  def _synthetic(self) -> None:
    """What a synthetic cohort (data.root unset) needs of data.* and of itself."""
    if self.get("data.root") or "data.root" in self.bad:
      return
    g, s = self.get, "data.synthetic."
    if self.ok(s + "vitals_steps", "data.vitals_steps") and (
        g(s + "vitals_steps") != g("data.vitals_steps")):
      self.add(s + "vitals_steps", f"but config.data.vitals_steps={g('data.vitals_steps')}; make "
                                   "them equal")
    if self.ok("data.vitals_channels"):
      unknown = [c for c in g("data.vitals_channels") if c not in synthetic_config.VITALS_CHANNELS]
      if unknown:
        self.add("data.vitals_channels", f"the synthetic vitals.csv has no {unknown} columns; use "
                                         f"names from {synthetic_config.VITALS_CHANNELS}")
    if self.ok(s + "num_analytes", "data.analytes", "model.num_analytes") and (
        not g("data.analytes") and g("model.num_analytes")
        and g("model.num_analytes") != g(s + "num_analytes")):
      self.add("model.num_analytes", f"but the synthetic cohort has "
                                     f"config.data.synthetic.num_analytes={g(s + 'num_analytes')}"
                                     "; set it to that (or 0 to take it from the data)")
    if self.ok(s + "frac_no_labs", s + "frac_partial_labs") and (
        g(s + "frac_no_labs") + g(s + "frac_partial_labs") > 1):
      self.add(s + "frac_partial_labs", f"plus frac_no_labs={g(s + 'frac_no_labs')} exceeds 1; "
                                        "lower one")
    if self.ok(s + "mean_images", s + "max_images") and g(s + "mean_images") > g(s + "max_images"):
      self.add(s + "mean_images", f"exceeds max_images={g(s + 'max_images')}; lower it or raise "
                                  "max_images")
    if self.ok(s + "rare_twins", s + "num_classes") and (
        2 * g(s + "rare_twins") > g(s + "num_classes")):
      self.add(s + "rare_twins", f"needs 2 x rare_twins <= num_classes={g(s + 'num_classes')}; "
                                 "lower it")
    for table in ("rescale", "transfer_syntax"):
      path = f"{s}headers.{table}"
      weights = g(path)
      if path not in self.bad and _is_section(weights) and weights.keys():
        values = [weights[k] for k in weights.keys()]
        if all(_is_number(v) for v in values) and (min(values) < 0 or sum(values) <= 0):
          self.add(path, "weights must be >= 0 with a positive sum", dict(weights))
    if self.ok("data.num_partitions", s + "num_patients") and (
        g("data.num_partitions") > g(s + "num_patients")):
      self.add("data.num_partitions", f"exceeds the {g(s + 'num_patients')} synthetic patients; "
                                      "a partition needs at least one training record")

  def _fault_timing(self) -> None:
    g, f = self.get, "fault."
    if self.ok(f + "backoff_s", f + "backoff_max_s") and g(f + "backoff_max_s") < g(
        f + "backoff_s"):
      self.add(f + "backoff_max_s", f"is below config.fault.backoff_s={g(f + 'backoff_s')}; "
                                    "raise it")
    if self.ok(f + "agent_interval_s", f + "host_timeout_s") and (
        g(f + "agent_interval_s") >= g(f + "host_timeout_s")):
      self.add(f + "agent_interval_s", f"is not below config.fault.host_timeout_s="
                                       f"{g(f + 'host_timeout_s')}, so every host would look "
                                       "lost between heartbeats; lower it")
    if self.ok(f + "jax_heartbeat_timeout_s", f + "timeout_training_s", f + "host_timeout_s"):
      ours = max(g(f + "timeout_training_s"), g(f + "host_timeout_s"))
      if g(f + "jax_heartbeat_timeout_s") <= ours:
        self.add(f + "jax_heartbeat_timeout_s", f"must exceed config.fault.timeout_training_s and "
                                                f"host_timeout_s ({ours:g}) so that the "
                                                "coordinator, not jax.distributed, acts first")

  # -- hosts, processes, devices and the batch --

  def _supervised(self) -> bool:
    return self.role != "local" or bool(self.get("fault.supervised"))

  def _host_counts(self) -> list[int]:
    """Every host count a generation can have (fault.hosts or local_hosts; down to min_hosts)."""
    g = self.get
    wanted = g("fault.hosts") or g("fault.local_hosts")
    if g("fault.elastic") and self.ok("fault.min_hosts"):
      return list(range(min(g("fault.min_hosts"), wanted), wanted + 1))
    return [wanted]

  def _topology(self) -> None:
    g = self.get
    if not self.ok("fault.hosts", "fault.local_hosts", "fault.workers_per_host",
                   "fault.devices_per_worker", "fault.elastic", "mode", "data.batch_size",
                   "mesh.data", "mesh.fsdp"):
      return
    batch, local = g("data.batch_size"), self.role == "local"
    if local and g("mode") == "ingest" and batch < g("fault.local_hosts"):
      self.add("data.batch_size", f"is below config.fault.local_hosts={g('fault.local_hosts')}; "
                                  "each host needs at least one record per step")
    if local and g("mode") != "train":
      return
    hosts_field = "fault.hosts" if g("fault.hosts") else "fault.local_hosts"
    if self._supervised():
      if local and g("fault.hosts") > g("fault.local_hosts"):
        self.add("fault.hosts", f"but the local launcher starts config.fault.local_hosts="
                                f"{g('fault.local_hosts')} hosts, so the run would wait for hosts "
                                "that never come; set fault.hosts=0 or raise local_hosts")
      if g("fault.elastic") and self.ok("fault.min_hosts") and (
          g("fault.min_hosts") > g(hosts_field)):
        self.add("fault.min_hosts", f"exceeds the {g(hosts_field)} hosts a generation needs "
                                    f"(config.{hosts_field}); lower it")
    devices, where, fields = self._devices(hosts_field)
    self._mesh(devices)
    multiple = math.lcm(*devices)
    if batch % multiple:
      self.add("data.batch_size", f"does not split evenly over {where}; make it a multiple of "
                                  f"{multiple} (or change {fields})")

  def _workers_per_host(self) -> int:
    """fault.workers_per_host, with 0 ("auto") resolved for this machine as the launcher will
    (`medjax.fault.layout`: one process on a CPU host, one per accelerator)."""
    if self.get("fault.workers_per_host"):
      return self.get("fault.workers_per_host")
    return layout.resolve(ml_collections.ConfigDict(
        {"workers_per_host": 0,
         "devices_per_worker": self.get("fault.devices_per_worker")})).workers_per_host

  def _devices(self, hosts_field: str) -> tuple[list[int], str, str]:
    """(device count of each possible generation, those words, the fields that set them)."""
    g = self.get
    if self._supervised():
      counts = self._host_counts()
      wph, dpw = self._workers_per_host(), g("fault.devices_per_worker")
      auto = " (auto)" if not g("fault.workers_per_host") else ""
      shape = f"x {wph} workers_per_host{auto} x {dpw} devices_per_worker"
      fields = f"config.{hosts_field}, workers_per_host or devices_per_worker"
      if len(counts) == 1:
        return ([counts[0] * wph * dpw], f"the {counts[0] * wph * dpw} devices of "
                f"config.{hosts_field}={counts[0]} hosts {shape}", fields)
      return ([h * wph * dpw for h in counts], f"the devices of every generation: {counts[0]}.."
              f"{counts[-1]} hosts (fault.elastic down to fault.min_hosts) {shape}", fields)
    data, fsdp, env = g("mesh.data"), g("mesh.fsdp"), _cpu_devices()
    if env is not None:
      return [env], f"the {env} CPU devices that XLA_FLAGS gives this process", "XLA_FLAGS"
    if data > 0:
      return ([data * fsdp], f"the {data * fsdp} devices of config.mesh.data={data} x "
              f"fsdp={fsdp}", "config.mesh.data and fsdp")
    return [fsdp], f"config.mesh.fsdp={fsdp} parameter shards", "config.mesh.fsdp"

  def _mesh(self, devices: list[int]) -> None:
    """mesh.data x mesh.fsdp covers each device count (medjax.train.state.make_mesh)."""
    g = self.get
    data, fsdp = g("mesh.data"), g("mesh.fsdp")
    if data > 0:
      wrong = [d for d in devices if data * fsdp != d]
      if wrong:
        self.add("mesh.data", f"with config.mesh.fsdp={fsdp} makes a mesh of {data * fsdp} "
                              f"devices, but the run has {wrong[0]}; set mesh.data=-1 (all devices "
                              "mesh.fsdp leaves) or make the product equal")
    else:
      wrong = [d for d in devices if d % fsdp]
      if wrong:
        self.add("mesh.fsdp", f"does not divide the run's {wrong[0]} devices; make it a "
                              "divisor")

  def _inject(self) -> None:
    g = self.get
    if not self.ok("fault.inject") or not g("fault.inject").strip():
      return
    try:
      faults = inject.parse(g("fault.inject"))
    except ValueError as e:
      self.add("fault.inject", str(e).split(": ", 1)[-1])
      return
    supervised = self._supervised()
    processes = None
    if self.ok("fault.hosts", "fault.local_hosts", "fault.workers_per_host"):
      processes = ((g("fault.hosts") or g("fault.local_hosts")) * self._workers_per_host()
                   if supervised else 1)
    for fault in faults:
      text, name = None, f"{fault.kind}@{fault.when}={fault.at}:process={fault.process}"
      if fault.kind == "host" and not supervised:
        text = (f"fault {name!r} kills a host, which needs a supervised run; set "
                "config.fault.supervised=True")
      elif processes is not None and not 0 <= fault.process < processes:
        text = (f"fault {name!r} names process {fault.process}, but the run has "
                f"{processes} (0..{processes - 1}); it would never fire")
      elif fault.when == "step" and fault.at < 1:
        text = f"fault {name!r} would never fire: steps count from 1"
      elif (fault.when == "partition" and self.ok("data.num_partitions")
            and not 0 <= fault.at < g("data.num_partitions")):
        text = (f"fault {name!r} would never fire: partitions are 0.."
                f"{g('data.num_partitions') - 1} (config.data.num_partitions)")
      elif (fault.when == "epoch" and self.ok("optim.epochs")
            and not 0 <= fault.at < g("optim.epochs")):
        text = (f"fault {name!r} would never fire: epochs are 0..{g('optim.epochs') - 1} "
                "(config.optim.epochs)")
      if text:
        self.add("fault.inject", text)
        return

  # -- files --

  def _paths(self) -> None:
    g = self.get
    if self.ok("data.root") and g("data.root"):
      root = g("data.root")
      if not os.path.isdir(root):
        self.add("data.root", "is not a directory; point it at a cohort folder with dicom/, "
                              "labs.csv, vitals.csv, labels.csv (or leave it unset for a "
                              "synthetic cohort)")
      elif not any(os.path.exists(os.path.join(root, n)) for n in COHORT_FILES):
        self.add("data.root", "holds none of dicom/, labs.csv, vitals.csv, labels.csv; point it "
                              "at a cohort folder")
      elif (self.ok("mode") and g("mode") == "train"
            and not os.path.exists(os.path.join(root, "labels.csv"))):
        self.add("data.root", "has no labels.csv, which training needs; add it or run "
                              "--config.mode=ingest")
    if self.ok("data.salt_file") and g("data.salt_file") and self.role in ("local", "coordinator"):
      salt = g("data.salt_file")
      parent = os.path.dirname(os.path.abspath(salt))
      if os.path.isdir(salt):
        self.add("data.salt_file", "is a directory; give a file path (the salt is created there "
                                   "on the first ingest)")
      elif not os.path.isdir(parent):
        self.add("data.salt_file", f"directory {parent} does not exist; create it or fix the "
                                   "path (a new salt there would change every pseudonym)")
    if self.ok("fault.token_file") and g("fault.token_file"):
      token = g("fault.token_file")
      if os.path.isdir(token):
        self.add("fault.token_file", "is a directory; give the token file's path")
      elif (self.role != "local" and not os.path.isfile(token)
            and not os.environ.get("MEDJAX_TOKEN")):
        self.add("fault.token_file", "does not exist; copy the run's token there or set "
                                     "$MEDJAX_TOKEN")
    tls = ("fault.tls_cert", "fault.tls_key", "fault.tls_ca")
    if all(p not in self.bad and isinstance(g(p), str) for p in tls):
      given = [p for p in tls if g(p)]
      if given and len(given) < 3:
        missing = [p for p in tls if not g(p)]
        self.add(missing[0], f"is unset but config.{given[0]} is set; TLS needs tls_cert and "
                             "tls_key (coordinator) and tls_ca (agents, workers), or none")
        return
      needed = {"local": tls, "coordinator": tls[:2], "agent": tls[2:], "worker": tls[2:]}
      for path in needed[self.role] if given else ():
        if not os.path.isfile(g(path)):
          self.add(path, "does not exist; give the PEM file's path")


def _cpu_devices() -> int | None:
  """This process's device count when JAX_PLATFORMS=cpu pins it (XLA_FLAGS), else None."""
  if os.environ.get("JAX_PLATFORMS", "") != "cpu":
    return None
  counts = re.findall(r"--xla_force_host_platform_device_count=(\d+)",
                      os.environ.get("XLA_FLAGS", ""))
  return int(counts[-1]) if counts else 1
