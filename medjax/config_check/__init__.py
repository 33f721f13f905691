"""The run config checked in full before any ingest or process starts.

`validate(config)` collects every problem and raises one `errors.InputError` that lists the first
few, each as `config.<field>=<value>: what is wrong; what to do`. It imports no jax (the command
line answers a bad config in well under 2 s). What it checks:

- Fields: every field is one of configs/default.py's (`get_config()`, the schema), with a "did you
  mean" suggestion (`suggest`) for an unknown one, and none is missing. The free-form mappings
  (`FREE_FORM`: data.rename, data.value_ranges) may hold any names.
- Types: int, float (finite), str, bool, tuples of str/int/numbers, as the schema's value says;
  None only for a placeholder (data.root).
- Enums: mode, data.on_error, data.date_order, data.isolate_decoding, data.prefetch,
  data.placement_method, data.cache_policy, data.replicas, model.fusion, model.missing,
  model.dtype, ckpt.if_all_damaged, evals.splits, and the fault.inject grammar (`medjax.runtime.inject.parse`).
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

from medjax import errors
from medjax.config_check import checker
from medjax.config_check import schema

# The schema's names, for "did you mean" elsewhere (the sweep's spec, the tests).
field_names = schema.field_names
suggest = schema.suggest

ROLES = ("local", "coordinator", "agent", "worker")
SHOWN = 3  # problems spelled out in the error line; the rest are counted



def validate(config, *, role: str = "local") -> None:
  """Raises one `errors.InputError` naming the config's first problems; returns if it has none.

  Args:
    config: the run config (ConfigDict), as the command line has it after the overrides.
    role: the command's --role; it decides which secret and TLS files must exist here.
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
  check = checker.Checker(config, role)
  check.walk(config, schema.schema(), "")
  check.cross()  # skips the fields `walk` reported
  return check.found
