"""The config checked before anything starts: one class of problem per test, exact lines."""

import importlib
import os
import subprocess
import sys
import time

import ml_collections
import pytest

from medjax import config_check
from medjax import errors
from medjax.config_check import rules as config_rules

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(overrides=None, *, name="quickstart", arg=None, drop=()):
  """configs/<name>.py's config with `overrides` ({'data.batch_size': 30}) applied as a config
  built from plain values would have them (so any type can be given), and `drop` removed."""
  tree = importlib.import_module(f"configs.{name}").get_config(arg).to_dict()
  for path, value in (overrides or {}).items():
    *parents, key = path.split(".")
    node = tree
    for p in parents:
      node = node[p]
    node[key] = value
  for path in drop:
    *parents, key = path.split(".")
    node = tree
    for p in parents:
      node = node[p]
    del node[key]
  return ml_collections.ConfigDict(tree)


def _error(config, role="local") -> str:
  with pytest.raises(errors.InputError) as e:
    config_check.validate(config, role=role)
  return str(e.value)


@pytest.mark.parametrize("name,arg", [("quickstart", None), ("quickstart", "ingest"),
                                      ("quickstart", "tiny"), ("default", None),
                                      ("default", "ingest"), ("paper", None), ("paper", "ingest"),
                                      ("tables", None)])
def test_shipped_configs_validate_clean(name, arg):
  config = importlib.import_module(f"configs.{name}").get_config(arg)
  assert config_check.problems(config) == []
  assert config_check.problems(config, role="coordinator") == []
  config_check.validate(config)


def test_splits_are_the_manifests():
  from medjax.data import manifest  # pylint: disable=import-outside-toplevel
  assert config_rules.SPLITS == manifest.SPLITS


def test_unknown_field_suggests_the_closest():
  assert _error(_config({"data.batch_sise": 3})) == (
      "config.data.batch_sise=3: no such field; did you mean config.data.batch_size?")
  # In the wrong section, and with nothing close.
  assert config_check.problems(_config({"optim.batch_size": 3, "nonsense": 1})) == [
      "config.nonsense=1: no such field; remove it (configs/default.py lists every field)",
      "config.optim.batch_size=3: no such field; did you mean config.data.batch_size?"]
  # Free-form mappings hold any names.
  assert config_check.problems(_config({"data.rename": {"K+": "K", "Natrium": "Na"}})) == []


def test_suggest_for_flag_overrides():
  names = config_check.field_names()
  assert "data.batch_size" in names and "data.synthetic.headers.rescale.ct" in names
  assert config_check.suggest("data.batch_sise", names) == "did you mean data.batch_size?"
  assert config_check.suggest("DATA.BATCH_SIZE", names) == "did you mean data.batch_size?"
  assert config_check.suggest("model.batch_size", names) == "did you mean data.batch_size?"
  assert config_check.suggest("trian", ["synth", "ingest", "train"]) == "did you mean train?"
  # A shared section alone is no likeness (it once offered optim.early_stopping_patience).
  assert config_check.suggest("optim.learning_rate", names) == ""
  assert config_check.suggest("zzz.qqq", names) == ""


def test_missing_field():
  assert _error(_config(drop=["model.dtype"])) == (
      "config.model.dtype: missing; derive the config from configs/default.py, which defines it")


@pytest.mark.parametrize("path,value,line", [
    ("data.batch_size", None, "config.data.batch_size=None: must be an int, not None"),
    ("data.batch_size", True, "config.data.batch_size=True: must be an int"),
    ("data.batch_size", 32.0, "config.data.batch_size=32.0: must be an int"),
    ("optim.lr", "3e-4", "config.optim.lr='3e-4': must be a finite number"),
    ("optim.lr", float("nan"), "config.optim.lr=nan: must be a finite number"),
    ("fault.elastic", 1, "config.fault.elastic=1: must be True or False"),
    ("model.image_channels", ("8",),
     "config.model.image_channels=('8',): must be a tuple of ints such as (16, 32, 64)"),
    ("data.split", ("(a,b)",),
     "config.data.split=('(a,b)',): must be a tuple of numbers such as (0.7, 0.1, 0.2)"),
    ("data.analytes", "Na,K", "config.data.analytes='Na,K': must be a tuple of strings"),
    ("data.root", 3, "config.data.root=3: must be a string"),
    ("model", 1, "config.model=1: must be a section (a ConfigDict) like configs/default.py's"),
])
def test_types(path, value, line):
  assert _error(_config({path: value})) == line


def test_types_accept_what_json_and_placeholders_give():
  # Lists for tuples (a config read back from config.json), ints for floats, None for data.root.
  config = _config({"data.split": [0.8, 0.1, 0.1], "optim.lr": 1, "data.root": None})
  assert config_check.problems(config) == []
  config = _config({"data.root": ""})  # like None: a synthetic cohort
  assert config_check.problems(config) == []


@pytest.mark.parametrize("path,value,line", [
    ("mode", "trian",
     "config.mode='trian': use one of ('synth', 'ingest', 'train') (did you mean 'train'?)"),
    ("data.on_error", "skip", "config.data.on_error='skip': use one of ('raise', 'quarantine')"),
    ("data.isolate_decoding", "some",
     "config.data.isolate_decoding='some': use one of ('compressed', 'all', 'none')"),
    ("data.prefetch", "grain",
     "config.data.prefetch='grain': use one of ('auto', 'inline', 'thread')"),
    ("data.placement_method", "hash",
     "config.data.placement_method='hash': use one of ('bounded', 'ring', 'modulo')"),
    ("data.cache_policy", "recahce", "config.data.cache_policy='recahce': use one of "
                                     "('recache', 'redirect') (did you mean 'recache'?)"),
    ("data.replicas", 3, "config.data.replicas=3: use one of (1, 2)"),
    ("model.fusion", "concat", "config.model.fusion='concat': use one of ('attention', 'gated')"),
    ("model.missing", "impute",
     "config.model.missing='impute': use one of ('learned', 'zero', 'mean', 'drop')"),
    ("model.dtype", "float64",
     "config.model.dtype='float64': use one of ('auto', 'float32', 'bfloat16', 'float16') "
     "(did you mean 'float16'?)"),
    ("ckpt.if_all_damaged", "ignore",
     "config.ckpt.if_all_damaged='ignore': use one of ('stop', 'start_fresh')"),
    ("ckpt.strategy", "daily",
     "config.ckpt.strategy='daily': use one of ('lineage', 'epoch', 'time', 'none')"),
    ("evals.splits", ("test", "holdout"),
     "config.evals.splits=('test', 'holdout'): use names from ('train', 'val', 'test')"),
    ("fault.inject", "kil@step=3:process=0",
     "config.fault.inject='kil@step=3:process=0': cannot read 'kil@step=3:process=0'; write "
     "KIND@step=N:process=P, KIND@partition=N:process=P or KIND@epoch=N:process=P with KIND in "
     "('kill', 'sigstop', 'hang', 'oom', 'sigterm', 'host', 'slow', 'pause')"),
])
def test_enums(path, value, line):
  assert _error(_config({path: value})) == line


@pytest.mark.parametrize("path,value,line", [
    ("optim.lr", 0.0, "config.optim.lr=0.0: must be > 0"),
    ("model.modality_dropout", 1.0, "config.model.modality_dropout=1.0: must be in [0, 1)"),
    ("optim.warmup_fraction", -0.1, "config.optim.warmup_fraction=-0.1: must be in [0, 1]"),
    ("data.batch_size", 0, "config.data.batch_size=0: must be >= 1"),
    ("data.vnodes", 0, "config.data.vnodes=0: must be >= 1 (100 is usual)"),
    ("optim.grad_accum", 0, "config.optim.grad_accum=0: must be >= 1 (1: no accumulation)"),
    ("fault.port", 70000, "config.fault.port=70000: must be in [0, 65535] (0: a free port)"),
    ("fault.timeout_training_s", 0.0, "config.fault.timeout_training_s=0.0: must be > 0"),
    ("mesh.data", 0, "config.mesh.data=0: must be -1 (all devices mesh.fsdp leaves) or a "
                     "positive axis size"),
    ("model.num_classes", 1, "config.model.num_classes=1: must be 0 (from the data) or >= 2"),
    ("data.classes", ("a", "b", "a"),
     "config.data.classes=('a', 'b', 'a'): ['a'] appear more than once; give each name once"),
    ("data.synthetic.image_size", 8, "config.data.synthetic.image_size=8: must be >= 16 (the "
                                     "synthetic images' air and marker regions need it)"),
    ("data.synthetic.frac_no_images", 1.5,
     "config.data.synthetic.frac_no_images=1.5: must be in [0, 1]"),
])
def test_ranges(path, value, line):
  assert _error(_config({path: value})) == line


@pytest.mark.parametrize("split,line", [
    ((0.5, 0.2, 0.2), "config.data.split=(0.5, 0.2, 0.2): sums to 0.9, not 1; give three "
                      "fractions (train, val, test), e.g. (0.7, 0.1, 0.2)"),
    ((0.8, 0.2), "config.data.split=(0.8, 0.2): has 2 entries; give three fractions (train, val, "
                 "test), e.g. (0.7, 0.1, 0.2)"),
    ((1.2, 0.0, -0.2), "config.data.split=(1.2, 0.0, -0.2): a fraction is negative; give three "
                       "fractions (train, val, test), e.g. (0.7, 0.1, 0.2)"),
    ((0.0, 0.5, 0.5), "config.data.split=(0.0, 0.5, 0.5): the train fraction is 0, so there is "
                      "nothing to train on; give train a positive share"),
    ((0.8, 0.2, 0.0), "config.data.split=(0.8, 0.2, 0.0): the test fraction is 0, so there is "
                      "nothing to evaluate; give test a positive share"),
])
def test_split(split, line):
  assert _error(_config({"data.split": split})) == line


def test_split_without_val_needs_evals_without_val():
  assert _error(_config({"data.split": (0.8, 0.0, 0.2)})) == (
      "config.evals.splits=('val', 'test'): evaluates 'val', which config.data.split leaves "
      "empty; drop it or give it a share")
  assert config_check.problems(_config({"data.split": (0.8, 0.0, 0.2),
                                        "evals.splits": ("test",)})) == []


def test_batch_splits_over_every_device_of_a_supervised_run():
  # 1 host x 4 worker processes x 1 device: the trainer's mesh has 4 devices (prepare.check_shapes).
  assert _error(_config({"data.batch_size": 30, "fault.workers_per_host": 4})) == (
      "config.data.batch_size=30: does not split evenly over the 4 devices of "
      "config.fault.local_hosts=1 hosts x 4 workers_per_host x 1 devices_per_worker; make it a "
      "multiple of 4 (or change config.fault.local_hosts, workers_per_host or "
      "devices_per_worker)")
  assert _error(_config({"data.batch_size": 36, "fault.hosts": 2, "fault.local_hosts": 2,
                         "fault.workers_per_host": 2, "fault.devices_per_worker": 4})) == (
      "config.data.batch_size=36: does not split evenly over the 16 devices of "
      "config.fault.hosts=2 hosts x 2 workers_per_host x 4 devices_per_worker; make it a "
      "multiple of 16 (or change config.fault.hosts, workers_per_host or devices_per_worker)")
  assert config_check.problems(_config({"data.batch_size": 48, "fault.local_hosts": 3})) == []


def test_workers_per_host_auto_is_this_machines_layout(monkeypatch):
  # 0 (the default): one worker process per CPU-only host, as the launcher will resolve it.
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  assert config_check.problems(_config({"data.batch_size": 30})) == []
  assert _error(_config({"data.batch_size": 30, "fault.devices_per_worker": 4})) == (
      "config.data.batch_size=30: does not split evenly over the 4 devices of "
      "config.fault.local_hosts=1 hosts x 1 workers_per_host (auto) x 4 devices_per_worker; "
      "make it a multiple of 4 (or change config.fault.local_hosts, workers_per_host or "
      "devices_per_worker)")
  assert _error(_config({"fault.inject": "kill@step=3:process=1"})) == (
      "config.fault.inject='kill@step=3:process=1': fault 'kill@step=3:process=1' names process "
      "1, but the run has 1 (0..0); it would never fire")
  assert _error(_config({"fault.workers_per_host": -1})).startswith(
      "config.fault.workers_per_host=-1: ")


def test_batch_splits_over_every_generation_of_an_elastic_run():
  # 3 hosts that may shrink to 2: generations of 6 and 4 devices; 24 fits both, 18 only 6.
  elastic = {"fault.local_hosts": 3, "fault.elastic": True, "fault.min_hosts": 2,
             "fault.workers_per_host": 2}
  assert config_check.problems(_config({**elastic, "data.batch_size": 24})) == []
  assert _error(_config({**elastic, "data.batch_size": 18})) == (
      "config.data.batch_size=18: does not split evenly over the devices of every generation: "
      "2..3 hosts (fault.elastic down to fault.min_hosts) x 2 workers_per_host x 1 "
      "devices_per_worker; make it a multiple of 12 (or change config.fault.local_hosts, "
      "workers_per_host or devices_per_worker)")
  assert _error(_config({**elastic, "fault.min_hosts": 4, "data.batch_size": 24})) == (
      "config.fault.min_hosts=4: exceeds the 3 hosts a generation needs "
      "(config.fault.local_hosts); lower it")


def test_batch_and_mesh_of_an_unsupervised_run(monkeypatch):
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
  alone = {"fault.supervised": False}
  assert _error(_config({**alone, "data.batch_size": 20})) == (
      "config.data.batch_size=20: does not split evenly over the 8 CPU devices that XLA_FLAGS "
      "gives this process; make it a multiple of 8 (or change XLA_FLAGS)")
  assert _error(_config({**alone, "mesh.data": 2, "mesh.fsdp": 2})) == (
      "config.mesh.data=2: with config.mesh.fsdp=2 makes a mesh of 4 devices, but the run has 8; "
      "set mesh.data=-1 (all devices mesh.fsdp leaves) or make the product equal")
  assert _error(_config({**alone, "mesh.fsdp": 3, "data.batch_size": 24})) == (
      "config.mesh.fsdp=3: does not divide the run's 8 devices; make it a divisor")
  # Where the device count is unknown here (an accelerator), the mesh gives what it can.
  monkeypatch.delenv("JAX_PLATFORMS")
  assert config_check.problems(_config({**alone, "data.batch_size": 20})) == []
  assert _error(_config({**alone, "data.batch_size": 20, "mesh.fsdp": 8})) == (
      "config.data.batch_size=20: does not split evenly over config.mesh.fsdp=8 parameter "
      "shards; make it a multiple of 8 (or change config.mesh.fsdp)")


def test_ingest_only_run_needs_a_record_per_host_and_step():
  assert _error(_config({"mode": "ingest", "fault.local_hosts": 4, "data.batch_size": 3})) == (
      "config.data.batch_size=3: is below config.fault.local_hosts=4; each host needs at least "
      "one record per step")
  assert config_check.problems(_config({"mode": "ingest", "data.batch_size": 3,
                                        "fault.local_hosts": 2})) == []


def test_local_run_cannot_wait_for_hosts_it_does_not_start():
  assert _error(_config({"fault.hosts": 2})) == (
      "config.fault.hosts=2: but the local launcher starts config.fault.local_hosts=1 hosts, so "
      "the run would wait for hosts that never come; set fault.hosts=0 or raise local_hosts")
  assert config_check.problems(_config({"fault.hosts": 2}), role="coordinator") == []


@pytest.mark.parametrize("overrides,line", [
    ({"data.cache_policy": "redirect", "data.replicas": 2},
     "config.data.replicas=2: config.data.cache_policy='redirect' never caches moved records; "
     "set replicas=1 or cache_policy='recache'"),
    ({"data.decode_memory_mb": 100},
     "config.data.decode_memory_mb=100: is too little for a decoder process to start; give 2048 "
     "or more (or config.data.isolate_decoding='none')"),
    ({"model.heads": 3, "model.fusion": "attention"},
     "config.model.heads=3: does not divide config.model.d_model=64; attention splits d_model "
     "over the heads"),
    ({"data.classes": ("a", "b", "c"), "model.num_classes": 2},
     "config.model.num_classes=2: but config.data.classes names 3 class names; set it to 3 (or "
     "0 to take it from the data)"),
    ({"model.vitals_channels": 4}, "config.model.vitals_channels=4: but "
                                   "config.data.vitals_channels names 6 channels; set it to 6 "
                                   "(or 0 to take it from the data)"),
    ({"data.vitals_steps": 12}, "config.data.synthetic.vitals_steps=24: but "
                                "config.data.vitals_steps=12; make them equal"),
    ({"data.vitals_channels": ("hr", "lactate")},
     "config.data.vitals_channels=('hr', 'lactate'): the synthetic vitals.csv has no ['lactate'] "
     "columns; use names from ('hr', 'sbp', 'dbp', 'rr', 'spo2', 'temp')"),
    ({"data.synthetic.mean_images": 5.0},
     "config.data.synthetic.mean_images=5.0: exceeds max_images=4; lower it or raise max_images"),
    ({"data.synthetic.headers.rescale.ct": -1.0},
     "config.data.synthetic.headers.rescale={'ct': -1.0, 'ct_half': 0.2, 'raw': 0.3}: weights "
     "must be >= 0 with a positive sum"),
    ({"fault.agent_interval_s": 5.0},
     "config.fault.agent_interval_s=5.0: is not below config.fault.host_timeout_s=5.0, so every "
     "host would look lost between heartbeats; lower it"),
    ({"fault.jax_heartbeat_timeout_s": 10},
     "config.fault.jax_heartbeat_timeout_s=10: must exceed config.fault.timeout_training_s and "
     "host_timeout_s (10) so that the coordinator, not jax.distributed, acts first"),
    ({"fault.backoff_max_s": 0.5},
     "config.fault.backoff_max_s=0.5: is below config.fault.backoff_s=1.0; raise it"),
    ({"fault.inject": "kill@step=3:process=2", "fault.workers_per_host": 2},
     "config.fault.inject='kill@step=3:process=2': fault 'kill@step=3:process=2' names process 2, "
     "but the run has 2 (0..1); it would never fire"),
    ({"fault.inject": "sigterm@partition=4:process=0"},
     "config.fault.inject='sigterm@partition=4:process=0': fault 'sigterm@partition=4:process=0' "
     "would never fire: partitions are 0..3 (config.data.num_partitions)"),
    ({"fault.inject": "host@epoch=1:process=0", "fault.supervised": False},
     "config.fault.inject='host@epoch=1:process=0': fault 'host@epoch=1:process=0' kills a host, "
     "which needs a supervised run; set config.fault.supervised=True"),
    ({"ckpt.strategy": "time"},
     "config.ckpt.every_seconds=0.0: must be > 0 with config.ckpt.strategy='time'; give the "
     "seconds between checkpoints, e.g. 600"),
    ({"ckpt.strategy": "epoch", "ckpt.every_steps": 25},
     "config.ckpt.every_steps=25: applies to config.ckpt.strategy='lineage', not 'epoch'; set it "
     "to 0 or use the lineage strategy"),
])
def test_across_fields(overrides, line):
  assert _error(_config(overrides)) == line


def test_paths(tmp_path):
  missing = str(tmp_path / "nowhere")
  assert _error(_config({"data.root": missing})) == (
      f"config.data.root={missing!r}: is not a directory; point it at a cohort folder with "
      "dicom/, labs.csv, vitals.csv, labels.csv (or leave it unset for a synthetic cohort)")
  empty = tmp_path / "empty"
  empty.mkdir()
  assert _error(_config({"data.root": str(empty)})) == (
      f"config.data.root={str(empty)!r}: holds none of dicom/, labs.csv, vitals.csv, labels.csv; "
      "point it at a cohort folder")
  (empty / "labs.csv").write_text("patient_id,Na\n")
  assert _error(_config({"data.root": str(empty)})) == (
      f"config.data.root={str(empty)!r}: has no labels.csv, which training needs; add it or run "
      "--config.mode=ingest")
  assert config_check.problems(_config({"data.root": str(empty), "mode": "ingest"})) == []
  (empty / "labels.csv.gz").write_bytes(b"")   # read as labels.csv (MIMIC ships .csv.gz)
  assert config_check.problems(_config({"data.root": str(empty)})) == []
  (empty / "labels.csv.gz").unlink()
  # A table saved under another name than medjax reads: named, with what to do.
  (empty / "Labels.xlsx").write_text("")
  assert _error(_config({"data.root": str(empty)})) == (
      f"config.data.root={str(empty)!r}: has no labels.csv, which training needs; found "
      "Labels.xlsx: a spreadsheet; save it as CSV to labels.csv to be read")
  other = tmp_path / "other"
  other.mkdir()
  (other / "LABS.CSV").write_text("patient_id,Na\n")
  (other / "vitals.tsv").write_text("patient_id\thour\n")
  (other / "labels.txt").write_text("patient_id,label\n")
  assert _error(_config({"data.root": str(other)})) == (
      f"config.data.root={str(other)!r}: holds none of dicom/, labs.csv, vitals.csv, labels.csv; "
      "found LABS.CSV: rename it labs.csv to be read (names are case-sensitive); found "
      "labels.txt: rename it labels.csv to be read; found vitals.tsv: rename it vitals.csv to be "
      "read")
  salt = str(tmp_path / "secrets" / "id_salt")
  assert _error(_config({"data.salt_file": salt})) == (
      f"config.data.salt_file={salt!r}: directory {tmp_path / 'secrets'} does not exist; create "
      "it or fix the path (a new salt there would change every pseudonym)")
  (tmp_path / "secrets").mkdir()
  assert config_check.problems(_config({"data.salt_file": salt})) == []


def test_token_and_tls_files_by_role(tmp_path, monkeypatch):
  monkeypatch.delenv("MEDJAX_TOKEN", raising=False)
  token = str(tmp_path / "token")
  # A local run creates its token file; a coordinator or agent must find it.
  assert config_check.problems(_config({"fault.token_file": token})) == []
  assert _error(_config({"fault.token_file": token}), role="agent") == (
      f"config.fault.token_file={token!r}: does not exist; copy the run's token there or set "
      "$MEDJAX_TOKEN")
  monkeypatch.setenv("MEDJAX_TOKEN", "secret")
  assert config_check.problems(_config({"fault.token_file": token}), role="agent") == []

  cert, key, ca = (str(tmp_path / n) for n in ("cert.pem", "key.pem", "ca.pem"))
  assert _error(_config({"fault.tls_cert": cert})) == (
      "config.fault.tls_key='': is unset but config.fault.tls_cert is set; TLS needs tls_cert and "
      "tls_key (coordinator) and tls_ca (agents, workers), or none")
  tls = _config({"fault.tls_cert": cert, "fault.tls_key": key, "fault.tls_ca": ca})
  (tmp_path / "ca.pem").write_text("ca")
  assert config_check.problems(tls, role="agent") == []
  assert config_check.problems(tls, role="coordinator") == [
      f"config.fault.tls_cert={cert!r}: does not exist; give the PEM file's path",
      f"config.fault.tls_key={key!r}: does not exist; give the PEM file's path"]


def test_many_problems_make_one_line_that_names_the_first_three():
  line = _error(_config({"optim.lr": 0.0, "optim.epochs": 0, "data.vnodes": 0, "mode": "x",
                         "fault.port": -1}))
  assert line == (
      "5 problems in the config: config.data.vnodes=0: must be >= 1 (100 is usual); "
      "config.fault.port=-1: must be in [0, 65535] (0: a free port); config.mode='x': use one of "
      "('synth', 'ingest', 'train'); and 2 more")
  assert "\n" not in line


def test_enum_copies_match_the_modules_that_consume_them():
  from medjax.data.cache import placement  # pylint: disable=import-outside-toplevel
  from medjax.data.cache import recache  # pylint: disable=import-outside-toplevel
  from medjax.model import fusion  # pylint: disable=import-outside-toplevel
  assert config_rules.PLACEMENT_METHODS == placement.METHODS
  assert config_rules.CACHE_POLICIES == recache.POLICIES
  assert config_rules.MISSING_POLICIES == fusion.MISSING_POLICIES
  from medjax.data.dicom import decoder  # pylint: disable=import-outside-toplevel
  assert config_rules.ISOLATE == decoder.ISOLATE
  from medjax.checkpoint import policy
  assert config_rules.CKPT_STRATEGIES == policy.STRATEGIES
  from medjax.train import local_sgd  # pylint: disable=import-outside-toplevel
  assert config_rules.OPTIM_MODES == local_sgd.MODES


def test_imports_no_jax():
  # Nor numpy: its thread pool would keep the local launcher, which checks the config first,
  # from forking its agents (medjax.fault.local); nor the synthetic generator's pydicom.
  code = ("import sys, configs.quickstart as q, medjax.config_check as c; "
          "c.validate(q.get_config()); "
          "print(sorted(m for m in ('jax', 'flax', 'tensorstore', 'grpc', 'numpy', 'pydicom') "
          "if m in sys.modules))")
  out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       check=True)
  assert out.stdout.strip() == "[]"


def test_launch_refuses_a_bad_config_in_one_line_fast(tmp_path):
  t0 = time.perf_counter()
  out = subprocess.run([sys.executable, "launch.py", "--config", "configs/quickstart.py",
                        "--config.data.split=(0.5,0.2,0.2)", f"--workdir={tmp_path / 'run'}"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
  seconds = time.perf_counter() - t0
  assert out.returncode == errors.EXIT_INPUT
  assert out.stderr.splitlines() == [
      "error: config.data.split=(0.5, 0.2, 0.2): sums to 0.9, not 1; give three fractions "
      "(train, val, test), e.g. (0.7, 0.1, 0.2)"]
  assert seconds < 2, f"{seconds:.2f} s"


@pytest.mark.parametrize("override, line", [
    ("--config.optim.learning_rate=0.1", "error: --config.optim.learning_rate: no such config "
     "field; configs/default.py lists every field"),
    ("--config.optim.optim.epochs=3", "error: --config.optim.optim.epochs: no such config field; "
     "did you mean optim.epochs?"),
    ("--config.nosuch.x=3", "error: --config.nosuch.x: no such config field; configs/default.py "
     "lists every field"),
    ("--config.optim.lrr=0.1", "error: --config.*: no config field 'lrr'; did you mean 'lr'? "
     "(configs/default.py lists every field)")])
def test_an_override_of_a_field_the_config_lacks_is_named_not_blamed_on_the_file(
    tmp_path, override, line):
  out = subprocess.run([sys.executable, "-m", "medjax", "--config", "configs/quickstart.py",
                        override, f"--workdir={tmp_path / 'run'}"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
  assert out.returncode == errors.EXIT_INPUT and out.stderr.splitlines() == [line]
  assert not (tmp_path / "run").exists()
