"""Every path in a sweep directory (docs/sweeps.md), joined here only.

  <sweep>/config.json         the sweep config (the command writes it)
  <sweep>/sweep.json          what a resumed sweep must match (base, overrides, space, study)
  <sweep>/study.db            the Optuna study (SQLite), unless config.study.storage names one
  <sweep>/data/               the one ingest every trial shares: cohort/, ingest/, cache/, secrets/
  <sweep>/jax_cache/          the JAX compilation cache every trial shares
  <sweep>/trials/trial-NNNN/  one ordinary medjax run per trial (ingest/ links to data/ingest)
  <sweep>/trials.csv, trials.md, optimization_history.png, param_importances.png,
  <sweep>/metric_vs_size.png, intermediate_values.png
"""

from __future__ import annotations

import dataclasses
import os


@dataclasses.dataclass(frozen=True)
class SweepPaths:
  workdir: str  # absolute

  def _in(self, *names: str) -> str:
    return os.path.join(self.workdir, *names)

  @property
  def identity(self) -> str:
    return self._in("sweep.json")

  @property
  def study_db(self) -> str:
    return self._in("study.db")

  @property
  def default_storage(self) -> str:
    return f"sqlite:///{self.study_db}"

  @property
  def data(self) -> str:
    """The shared run directory that holds the ingest (a `--config.mode=ingest` run)."""
    return self._in("data")

  @property
  def data_lock(self) -> str:
    return self._in("data.lock")

  @property
  def data_config(self) -> str:
    """The data-relevant config the shared ingest was made with."""
    return os.path.join(self.data, "sweep_data.json")

  @property
  def data_log(self) -> str:
    return os.path.join(self.data, "launcher.log")

  @property
  def compilation_cache(self) -> str:
    return self._in("jax_cache")

  @property
  def trials(self) -> str:
    return self._in("trials")

  def trial(self, number: int) -> str:
    return os.path.join(self.trials, f"trial-{number:04d}")

  @property
  def set_aside(self) -> str:
    """Trial directories found where a new trial starts (left by a deleted study)."""
    return os.path.join(self.trials, "set-aside")

  @property
  def trials_csv(self) -> str:
    return self._in("trials.csv")

  @property
  def trials_md(self) -> str:
    return self._in("trials.md")

  def plot(self, name: str) -> str:
    return self._in(f"{name}.png")

  def relative(self, path: str) -> str:
    return os.path.relpath(path, self.workdir)
