"""Every path in a run directory, and its default: the one module that joins these names.

A run directory (the workdir, on shared storage in multi-host runs) holds what README.md's "What
a run writes" lists. Some locations can be moved by config (the decoded cache to node-local disk,
the lineage store to a kvstore URL, the salt and token to files shared between runs); `RunPaths`
gives the configured location, or the default inside the workdir.

  run = paths.RunPaths(workdir, config)
  run.checkpoints, run.lineage_store, run.cache(host), run.generation_spec(3)
"""

from __future__ import annotations

import dataclasses
import json
import os

import ml_collections

from medjax import errors


@dataclasses.dataclass(frozen=True)
class RunPaths:
  """Paths of one run. `config` may be None where only the workdir's own defaults are needed.

  Attributes:
    workdir: the run directory.
    config: the run config (ConfigDict); its data.cache_dir, data.salt_file, ckpt.lineage_store,
      fault.token_file and mesh.compilation_cache_dir move those locations out of the workdir.
  """
  workdir: str
  config: object = None

  def _in(self, *names: str) -> str:
    return os.path.join(self.workdir, *names)

  def _configured(self, section: str, field: str) -> str:
    if self.config is None:
      return ""
    return getattr(getattr(self.config, section), field, "") or ""

  # -- inputs and the data layer ------------------------------------------------------------

  @property
  def config_json(self) -> str:
    """The resolved config (agents and workers read it)."""
    return self._in("config.json")

  @property
  def cohort(self) -> str:
    """The synthetic cohort, when config.data.root is unset."""
    return self._in("cohort")

  @property
  def cohort_marker(self) -> str:
    """The synthetic config a generated cohort was made with (reused when it matches)."""
    return os.path.join(self.cohort, "synthetic.json")

  @property
  def ingest(self) -> str:
    """The ingest's outputs (below)."""
    return self._in("ingest")

  @property
  def manifest(self) -> str:
    return os.path.join(self.ingest, "manifest.jsonl")

  @property
  def quarantine(self) -> str:
    """Every rejected file or table row, with its reason."""
    return os.path.join(self.ingest, "quarantine.jsonl")

  @property
  def tables(self) -> str:
    """Parsed labs and vitals, with their normalisation statistics."""
    return os.path.join(self.ingest, "tables.npz")

  @property
  def ceiling(self) -> str:
    """The Bayes posterior of test records (synthetic cohorts)."""
    return os.path.join(self.ingest, "ceiling.npz")

  @property
  def ingest_summary(self) -> str:
    """Counts of the ingest; its presence marks a finished ingest."""
    return os.path.join(self.ingest, "summary.json")

  @property
  def ingest_report(self) -> str:
    """`--config.mode=ingest`'s report (placement, plan, cache)."""
    return os.path.join(self.ingest, "report.json")

  @property
  def salt(self) -> str:
    """The pseudonymisation salt (owner-only): config.data.salt_file or secrets/id_salt."""
    return self._configured("data", "salt_file") or self._in("secrets", "id_salt")

  @property
  def cache_root(self) -> str:
    """Node-local decoded caches, one folder per host: config.data.cache_dir or cache/."""
    return self._configured("data", "cache_dir") or self._in("cache")

  def cache(self, host: str) -> str:
    return os.path.join(self.cache_root, host)

  @property
  def cache_stats(self) -> str:
    """Each process's published cache counters (`<host>.<process>.json`)."""
    return self._in("cache_stats")

  # -- training -----------------------------------------------------------------------------

  @property
  def checkpoints(self) -> str:
    return self._in("checkpoints")

  @property
  def lineage_store(self) -> str:
    """A path or kvstore URL: config.ckpt.lineage_store or lineage/."""
    return self._configured("ckpt", "lineage_store") or self._in("lineage")

  @property
  def compilation_cache(self) -> str:
    """JAX's persistent compilation cache: config.mesh.compilation_cache_dir, else JAX's own
    JAX_COMPILATION_CACHE_DIR (`compilation_cache_or`), else jax_cache/."""
    return (self._configured("mesh", "compilation_cache_dir")
            or compilation_cache_or(self._in("jax_cache")))

  @property
  def metrics(self) -> str:
    return self._in("metrics.jsonl")

  @property
  def tensorboard(self) -> str:
    return self._in("tensorboard")

  @property
  def summary(self) -> str:
    return self._in("summary.json")

  def plot(self, name: str) -> str:
    return self._in(f"{name}.png")

  @property
  def ledger(self) -> str:
    """Rows of every executed step, `gen-<G>-proc-<P>.jsonl` (exactly-once checks)."""
    return self._in("ledger")

  def ledger_file(self, generation: int, process: int) -> str:
    return os.path.join(self.ledger, f"gen-{generation:03d}-proc-{process:03d}.jsonl")

  # -- fault tolerance ----------------------------------------------------------------------

  @property
  def token(self) -> str:
    """The coordinator's shared token (owner-only): config.fault.token_file or secrets/token."""
    return self._configured("fault", "token_file") or self._in("secrets", "token")

  @property
  def events(self) -> str:
    return self._in("events.jsonl")

  @property
  def coordinator_address(self) -> str:
    """{address, pid} of the serving coordinator."""
    return self._in("coordinator.json")

  @property
  def generations(self) -> str:
    return self._in("generations")

  def generation_spec(self, generation: int) -> str:
    return os.path.join(self.generations, f"gen-{generation:03d}.json")

  @property
  def faults(self) -> str:
    """Markers of injected and externally recorded faults (when each fired)."""
    return self._in("faults")

  # -- logs ---------------------------------------------------------------------------------

  @property
  def log(self) -> str:
    """The local launcher's (or an unsupervised run's) log."""
    return self._in("log.txt")

  @property
  def logs(self) -> str:
    return self._in("logs")

  def role_log(self, name: str) -> str:
    """A role's own log (`coordinator`, `agent-<host>`, `worker-<G>-<P>`)."""
    return os.path.join(self.logs, f"{name}.txt")

  def process_log(self, name: str) -> str:
    """A child process's stdout and stderr (`coordinator`, `agent-<host>`, `standby-<host>`,
    `gen-<G>-proc-<P>`)."""
    return os.path.join(self.logs, f"{name}.log")

  def worker_output(self, generation: int, process: int) -> str:
    return self.process_log(f"gen-{generation:03d}-proc-{process:03d}")

  def worker_error(self, generation: int, process: int) -> str:
    """The one-line error a worker leaves when it fails; its agent reports it with the exit."""
    return os.path.join(self.logs, f"gen-{generation:03d}-proc-{process:03d}.error")


def load_config(workdir: str) -> ml_collections.ConfigDict:
  """The run's config.json (written by the launcher or coordinator). Agents and standbys read
  it before anything heavy is imported (this module imports no jax)."""
  path = RunPaths(workdir).config_json
  try:
    with open(path) as f:
      return ml_collections.ConfigDict(json.load(f))
  except (OSError, ValueError, TypeError) as e:
    raise errors.InputError(f"{path} is damaged or unreadable ({type(e).__name__}); start the "
                            "coordinator or launcher again with --config to write it") from e


def compilation_cache_or(default: str) -> str:
  """JAX_COMPILATION_CACHE_DIR where the environment sets it (JAX's own setting: one cache that
  every run on the machine shares, so a run compiles only what no run compiled before), else
  `default`."""
  return os.environ.get("JAX_COMPILATION_CACHE_DIR") or default
