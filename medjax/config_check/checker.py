"""The checker: walks the config against the schema, then checks fields against each other."""

from __future__ import annotations

import math
import os
import re
from typing import Any

import ml_collections

from medjax.config_check import rules
from medjax.config_check import schema
from medjax.data import accounting
from medjax.data.synthetic import config as synthetic_config
from medjax.fault import layout
from medjax.runtime import inject


_MISSING = object()


class Checker:
  """Collects problems; `bad` holds the fields already reported, which later checks skip."""

  def __init__(self, config, role: str):
    self.config, self.role = config, role
    self.found: list[str] = []
    self.bad: set[str] = set()

  def add(self, path: str, text: str, value: Any = _MISSING) -> None:
    value = self.get(path) if value is _MISSING else value
    shown = "" if value is _MISSING else f"={schema.show(value)}"
    self.found.append(f"config.{path}{shown}: {text}")
    self.bad.add(path)

  def get(self, path: str) -> Any:
    node = self.config
    for key in path.split("."):
      if not schema.is_section(node) or key not in node.keys():
        return _MISSING
      node = node[key]
    return node

  def ok(self, *paths: str) -> bool:
    """All of `paths` are present, set and passed their own checks."""
    return all(p not in self.bad and self.get(p) not in (_MISSING, None) for p in paths)

  # -- fields, types, enums, ranges --

  def walk(self, node, section, prefix: str) -> None:
    """Checks `node` against `section`, the schema's section at `prefix`."""
    for key in node.keys():
      if key not in section.keys():
        path = prefix + key
        best = schema.closest(path, schema.field_names())
        self.add(path, f"no such field; did you mean config.{best}?" if best else
                 "no such field; remove it (configs/default.py lists every field)", node[key])
    for key in section.keys():
      path = prefix + key
      if key not in node.keys():
        self.add(path, "missing; derive the config from configs/default.py, which defines it")
        continue
      value, expected = node[key], section[key]
      if path in schema.FREE_FORM and schema.is_section(expected):
        self._free_form(path, value)
      elif schema.is_section(expected):
        if schema.is_section(value):
          self.walk(value, expected, path + ".")
        else:
          self.add(path, "must be a section (a ConfigDict) like configs/default.py's", value)
      elif self._typed(path, value, expected, section.get_type(key)):
        for check in rules.FIELD_CHECKS.get(path, ()):
          text = check(value)
          if text:
            self.add(path, text, value)
            break

  def _free_form(self, path: str, value) -> None:
    if not schema.is_section(value):
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
      item = schema.TUPLE_ITEMS.get(path, type(expected[0]) if expected else str)
      if isinstance(value, (tuple, list)) and all(schema.IS[item](x) for x in value):
        return True
    elif kind in schema.IS and schema.IS[kind](value):
      return True
    self.add(path, f"must be {self._kind_text(path, expected, field_type)}", value)
    return False

  @staticmethod
  def _kind_text(path: str, expected, field_type) -> str:
    kind = field_type if expected is None else type(expected)
    if kind in (tuple, list):
      item = schema.TUPLE_ITEMS.get(path, type(expected[0]) if expected else str)
      example = f" such as {expected!r}" if expected else ""
      return f"a tuple of {schema.ITEM_TEXT[item]}{example}"
    return schema.KIND_TEXT.get(kind, kind.__name__)

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
      empty = [s for s, f in zip(rules.SPLITS, g("data.split"))
               if f == 0 and s in g("evals.splits")]
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
    if self.ok("optim.mode", "optim.late_after_s") and (
        g("optim.late_after_s") > 0 and g("optim.mode") != "local"):
      self.add("optim.late_after_s", "cuts late replicas short in config.optim.mode='local' only "
                                     "(a 'sync' step needs every worker); set it to 0 or use "
                                     "mode 'local'")
    if self.ok("optim.mode", "optim.ema_epochs") and (
        g("optim.ema_epochs") > 0 and g("optim.mode") != "sync"):
      self.add("optim.ema_epochs", "averages the parameters in config.optim.mode='sync' only "
                                   "('local' replicas average theirs each round); set it to 0 or "
                                   "use mode 'sync'")
    wants = [f for f in ("optim.early_stopping_patience", "ckpt.keep_best") if g(f)]
    if (wants and self.ok("data.split") and len(g("data.split")) == 3
        and g("data.split")[1] == 0):
      self.add(wants[0], "needs a validation split, which config.data.split leaves empty; give "
                         "'val' a share (e.g. --config.data.split='(0.8, 0.1, 0.1)') or turn it "
                         "off")

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
      if path not in self.bad and schema.is_section(weights) and weights.keys():
        values = [weights[k] for k in weights.keys()]
        if all(schema.is_number(v) for v in values) and (min(values) < 0 or sum(values) <= 0):
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
      elif not os.access(root, os.R_OK | os.X_OK):
        self.add("data.root", "cannot be read (permission denied); give the process read "
                              "and search permission on the cohort folder")
      elif not any(accounting.table_file(root, n) for n in rules.COHORT_FILES):
        found = "; ".join(accounting.misnamed_tables(root).values())
        self.add("data.root", "holds none of dicom/, labs.csv, vitals.csv, labels.csv; "
                              + (found or "point it at a cohort folder"))
      elif (self.ok("mode") and g("mode") == "train"
            and not accounting.table_file(root, "labels.csv")):
        found = accounting.misnamed_tables(root).get("labels.csv")
        self.add("data.root", "has no labels.csv, which training needs; "
                              + (found or "add it or run --config.mode=ingest"))
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
