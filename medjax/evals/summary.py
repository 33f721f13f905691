"""summary.json (strict JSON) and the figures of a run's results, written to its workdir."""

from __future__ import annotations

import json
import logging
import math

import numpy as np

from medjax import paths
from medjax import plots
from medjax.evals import table


def strict_json(value):
  """`value` with NaN and infinities as None and numpy scalars as Python ones (strict JSON)."""
  if isinstance(value, dict):
    return {k: strict_json(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [strict_json(v) for v in value]
  if isinstance(value, (float, np.floating)):
    return float(value) if math.isfinite(value) else None
  if isinstance(value, np.integer):
    return int(value)
  if isinstance(value, np.bool_):
    return bool(value)
  return value


def write_summary(workdir: str, summary: dict, class_names: list[str],
                  metrics_rows: list[dict]) -> None:
  """summary.json (strict JSON), the plots, and the summary table in the log.

  `metrics_rows`: the run's metrics.jsonl rows (`train.writers.read_metrics`), for the loss curve.
  """
  with open(paths.RunPaths(workdir).summary, "w") as f:
    json.dump(strict_json(summary), f, indent=2, allow_nan=False, default=float)
  write_plots(workdir, summary, class_names, metrics_rows)
  logging.info("summary\n%s", table.format_summary(summary))


def write_plots(workdir: str, summary: dict, class_names: list[str], metrics_rows: list[dict],
                events=None) -> list[str]:
  """PNG files in the workdir: loss curve, per-class F1, confusion matrix, accuracy by subset,
  and for binary tasks the reliability diagram."""
  figures = figures_for(summary, class_names, metrics_rows, events)
  written = []
  for name, fig in figures.items():
    path = paths.RunPaths(workdir).plot(name)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    written.append(path)
  plots.close(figures)
  return written


def figures_for(summary, class_names, metrics_rows, events=None) -> dict:
  """The figures of `summary` (and of the loss in `metrics_rows`, failures in `events` marked)."""
  figures = {}
  if metrics_rows:
    figures["loss_curve"] = plots.loss_curve(metrics_rows, events or [])
  if "test" in summary:
    ceiling = summary.get("ceiling")
    figures["per_class_f1"] = plots.per_class_f1(summary["test"], ceiling, class_names)
    figures["confusion"] = plots.confusion(summary["test"]["confusion"], class_names)
    figures["accuracy_by_subset"] = plots.by_subset(summary["test"], ceiling)
    if summary["test"].get("calibration"):
      figures["reliability"] = plots.reliability(summary["test"])
  return figures
