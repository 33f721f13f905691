"""Each field's own checks (types are the schema's): ranges, enums, names; one table,
`FIELD_CHECKS`.

The accepted values are copied from where each is consumed: importing those modules costs jax,
TensorStore or decoders (tests/test_config_check.py keeps the copies equal to the constants).
"""

from __future__ import annotations

from typing import Any, Callable

from medjax.config_check import schema


MODES = ("synth", "ingest", "train")                       # medjax/cli.py
ON_ERROR = ("raise", "quarantine")                         # data/tables/values.py Problems
DATE_ORDERS = ("auto", "month_first", "day_first")         # data/tables/timestamps.py
ISOLATE = ("compressed", "all", "none")                    # data/dicom/decoder.py ISOLATE
PREFETCH = ("auto", "inline", "thread")                    # data/loader.py batches
PLACEMENT_METHODS = ("bounded", "ring", "modulo")          # data/cache/placement.py METHODS
CACHE_POLICIES = ("recache", "redirect")                   # data/cache/recache.py POLICIES
FUSIONS = ("attention", "gated")                           # model/fusion.py FusionModel
OPTIM_MODES = ("sync", "local")                            # train/local_sgd.py MODES
MISSING_POLICIES = ("learned", "zero", "mean", "drop")     # model/fusion.py MISSING_POLICIES
NUMERIC_EMBEDDINGS = ("none", "piecewise", "periodic")     # model/encoders.py
DTYPES = ("auto", "float32", "bfloat16", "float16")        # model/fusion.py compute_dtype
IF_ALL_DAMAGED = ("stop", "start_fresh")                   # configs/default.py ckpt
CKPT_STRATEGIES = ("lineage", "epoch", "time", "none")      # checkpoint/policy.py STRATEGIES
WARM_STANDBY = ("after_failure", "always", "never")          # fault/agent.py warm_key
# Higher is better: keys of a split's metrics (medjax/evals/metrics.py); binary tasks have the
# last four instead of top-3 and the macro AUROC.
VALIDATION_METRICS = ("macro_f1", "accuracy", "top3_accuracy", "rare_recall", "auroc_macro",
                      "auroc", "auprc", "sensitivity", "specificity", "neg_log_loss")
# manifest.SPLITS, spelled out: importing the manifest imports numpy, whose thread pool would
# keep the local launcher from forking its agents (medjax.fault.local).
SPLITS = ("train", "val", "test")
COHORT_FILES = ("dicom", "labs.csv", "vitals.csv", "labels.csv")

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
    best = (schema.closest(v, [n for n in names if isinstance(n, str)]) if isinstance(v, str)
            else None)
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
       "model.labs_embed_width model.labs_bins model.labs_frequencies model.members "
       "optim.local_steps fault.local_hosts fault.devices_per_worker fault.min_hosts "
       "fault.jax_heartbeat_timeout_s " + syn("num_patients num_analytes max_images "
       "mean_images latent_dim_shared class_rank_shared image_latent_dim max_missing_panels"))
  each(_at_least(-1, " (-1: a quarter of the free memory; 0: none)"), "data.cache_memory_mb")
  each(_at_least(0), "seed model.fusion_layers optim.weight_decay ckpt.every_seconds "
       "optim.class_weight_power fault.replacement_wait_s fault.backoff_s fault.backoff_max_s "
       "fault.workers_per_host fault.local_spares optim.replicas optim.late_after_s "
       "fault.max_failures_without_progress fault.max_coordinator_restarts fault.hang_factor "
       "fault.hang_warmup_steps optim.late_quorum fault.slow_step_s fault.pause_s " + syn(
           "seed model_seed class_prior_exponent rare_twins twin_offset latent_dim_image "
           "class_sep vitals_trend junk_files"))
  each(_above(0), "data.vitals_hours_per_step data.decode_timeout_s optim.lr optim.clip_norm "
       "optim.outer_lr model.labs_frequency_scale "
       "fault.timeout_training_s fault.timeout_compile_s fault.host_timeout_s fault.stop_grace_s "
       "fault.agent_interval_s fault.coordinator_lost_s fault.hang_floor_s "
       + syn("lab_noise vitals_noise image_noise"))
  each(_within(0, 1), "optim.warmup_fraction optim.end_lr_fraction " + syn(
      "frac_no_images frac_no_labs frac_partial_labs frac_no_vitals frac_missing_vitals_steps "
      "frac_missing_vitals_cells headers.frac_monochrome1 headers.frac_no_window "
      "headers.frac_padding headers.frac_dx"))
  each(_within(0, 1, hi_open=True), "model.modality_dropout optim.b1 optim.b2 optim.outer_momentum")
  each(_names, "data.analytes data.classes data.vitals_channels evals.splits")
  for field, names in (("mode", MODES), ("data.on_error", ON_ERROR), ("data.prefetch", PREFETCH),
                       ("data.date_order", DATE_ORDERS), ("data.isolate_decoding", ISOLATE),
                       ("data.placement_method", PLACEMENT_METHODS), ("data.replicas", (1, 2)),
                       ("data.cache_policy", CACHE_POLICIES), ("model.fusion", FUSIONS),
                       ("model.missing", MISSING_POLICIES), ("optim.mode", OPTIM_MODES),
                       ("model.labs_embedding", NUMERIC_EMBEDDINGS), ("model.dtype", DTYPES),
                       ("ckpt.if_all_damaged", IF_ALL_DAMAGED),
                       ("ckpt.strategy", CKPT_STRATEGIES),
                       ("fault.warm_standby", WARM_STANDBY),
                       ("evals.validation_metric", VALIDATION_METRICS)):
    each(_one_of(*names), field)
  each(_at_least(0, " (0: never stop early)"), "optim.early_stopping_patience")
  each(_at_least(0, " (0: off)"), "monitor.interval_s monitor.nominal_power_w optim.ema_epochs")
  each(_split, "data.split")
  each(_at_least(16, " (the synthetic images' air and marker regions need it)"),
       syn("image_size"))
  each(_at_least(2, " (vitals are a series)"), syn("vitals_steps"))
  each(_at_least(2), syn("num_classes"))
  each(_at_least(0, " (0: one per CPU core)"), "data.scan_workers data.decode_processes")
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
  each(_at_least(0, " (0: a checkpoint at every boundary)"), "ckpt.min_interval_s")
  each(_at_least(0, " (0: no host-local snapshots)"), "ckpt.snapshot_every_steps")
  each(lambda v: None if 0 < v <= 1 else "must be in (0, 1] (1: no rest)", "ckpt.writer_duty")
  each(_at_least(-1, " (0: unbounded; -1: 2 on CPU, 4 on a GPU or TPU)"), "max_steps_in_flight")
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
