"""The sweep's report, rewritten after every trial: trials.csv, trials.md and PNGs.

  trials.csv / trials.md       one row per trial: state (complete, pruned, failed with its reason,
                               running, waiting), val metric, epochs run, parameters, wall time,
                               energy (or "not measured"), the searched values, the run directory
  optimization_history.png     Optuna's optimisation history (complete trials)
  param_importances.png        Optuna's parameter importances (>= 2 complete trials)
  intermediate_values.png      the val metric at each epoch of every trial (pruning visible)
  metric_vs_size.png           val metric against parameter count, log x, by state (DiagnoseNET's
                               Table 4 / Fig. 4 view: result by model size)

Files are written whole and renamed into place, so a reader (or another sweep process writing
the same report) never sees half of one.
"""

from __future__ import annotations

import os
import sys
import warnings

import numpy as np
import optuna
import pandas as pd
from matplotlib.figure import Figure

from medjax.sweep import layout as layout_lib
from medjax.sweep import log
from medjax.sweep import studies

STATES = {optuna.trial.TrialState.COMPLETE: "complete", optuna.trial.TrialState.PRUNED: "pruned",
          optuna.trial.TrialState.FAIL: "failed", optuna.trial.TrialState.RUNNING: "running",
          optuna.trial.TrialState.WAITING: "waiting"}
COLOURS = {"complete": "tab:blue", "pruned": "tab:orange"}


def rows(study: optuna.Study, sweep) -> list[dict]:
  """One dict per trial, in trial order (the CSV's columns)."""
  trials = study.get_trials(deepcopy=False)
  retried_as = {}
  for t in trials:
    for n in t.system_attrs.get("retry_history") or []:
      retried_as.setdefault(n, t.number)
  out = []
  for t in trials:
    a = t.user_attrs
    state = STATES.get(t.state, t.state.name.lower())
    note = a.get("fail_reason") or ""
    if t.state == optuna.trial.TrialState.FAIL and not note:
      note = "interrupted (its sweep process stopped or was lost)"
      if t.number in retried_as:
        note += f"; retried as trial {retried_as[t.number]}"
    retry = studies.retried_number(t)
    if retry is not None:
      note = (note + "; " if note else "") + f"retry of trial {retry}"
    row = {"number": t.number, "state": state,
           "value": t.value if t.state in (optuna.trial.TrialState.COMPLETE,
                                           optuna.trial.TrialState.PRUNED) else None,
           "epochs_run": a.get("epochs_run"), "epochs": a.get("epochs"),
           "best_epoch": a.get("best_epoch"),
           "steps": a.get("steps"), "parameters": a.get("parameters"),
           "wall_s": a.get("wall_s"), "energy_j": a.get("energy_j"),
           "note": note, "workdir": a.get("workdir")}
    for p in sweep.params:
      raw = t.params.get(p.field)
      row[p.field] = None if raw is None else _decode(p, raw)
    out.append(row)
  return out


def write(study: optuna.Study, where: layout_lib.SweepPaths, sweep) -> dict | None:
  """Writes every report file; returns the best complete trial's row (None if none yet)."""
  table = rows(study, sweep)
  frame = pd.DataFrame(table)
  _replace(where.trials_csv, frame.to_csv(index=False))
  complete = [r for r in table if r["state"] == "complete" and r["value"] is not None]
  best = max(complete, key=lambda r: r["value"]) if complete else None
  if best is not None:
    best = {**best, "params": {p.field: best[p.field] for p in sweep.params}}
  figures = _figures(study, where, sweep, table)
  _replace(where.trials_md, markdown(study, sweep, table, best, figures, where))
  return best


def markdown(study, sweep, table: list[dict], best: dict | None, figures: dict,
             where: layout_lib.SweepPaths) -> str:
  c = sweep.config
  counts = {s: sum(r["state"] == s for r in table) for s in
            ("complete", "pruned", "failed", "running", "waiting")}
  lines = [f"# Sweep `{c.study.name}`", "",
           f"Base config `{c.base}`; objective: maximise val `{sweep.metric}`; sampler "
           f"`{c.study.sampler}`, pruner `{c.pruner.kind}`; {c.study.n_trials} trials asked.",
           "", "Trials: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n) + ".", ""]
  if best is not None:
    lines += [f"Best: trial {best['number']}, val {sweep.metric} {best['value']:.4f}, "
              f"{_size(best['parameters'])} parameters, in `{best['workdir']}`: "
              + ", ".join(f"`{k}={_show(v)}`" for k, v in best["params"].items()), ""]
  columns = (["trial", "state", f"val {sweep.metric}", "epochs run", "parameters", "wall s",
              "energy J"] + [p.field for p in sweep.params] + ["note"])
  lines += ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
  for r in table:
    cells = [str(r["number"]), r["state"],
             "" if r["value"] is None else f"{r['value']:.4f}",
             "" if r["epochs_run"] is None else f"{r['epochs_run']}/{r['epochs'] or '?'}",
             _size(r["parameters"]),
             "" if r["wall_s"] is None else f"{r['wall_s']:.1f}",
             _energy(r["energy_j"])]
    cells += [_show(r[p.field]) for p in sweep.params]
    cells.append(r["note"].replace("|", "/"))
    lines.append("| " + " | ".join(cells) + " |")
  unmeasured = sorted({r["energy_j"] for r in table if isinstance(r["energy_j"], str)
                       and r["state"] in ("complete", "pruned")})
  if unmeasured:
    lines += ["", "Energy: " + "; ".join(unmeasured) + "."]
  lines += ["", "## Figures", ""]
  for name, status in figures.items():
    lines.append(f"- `{name}.png`: {status}")
  url = studies.shown_url(studies.storage_url(c.study.storage, where.default_storage))
  lines += ["", "Open the study in Optuna's dashboard (`pip install optuna-dashboard`):", "",
            f"    optuna-dashboard {url}", ""]
  return "\n".join(lines)


def metric_vs_size(table: list[dict], metric: str) -> Figure | None:
  """Val metric against parameter count (log x), complete and pruned trials by colour."""
  points = [r for r in table if r["value"] is not None and r["parameters"]]
  if not points:
    return None
  fig = Figure(figsize=(7, 4.5))
  ax = fig.subplots()
  for state, colour in COLOURS.items():
    mine = [r for r in points if r["state"] == state]
    if mine:
      label = f"{state} ({len(mine)}" + ("; at its last epoch)" if state == "pruned" else ")")
      ax.scatter([r["parameters"] for r in mine], [r["value"] for r in mine], c=colour,
                 label=label, s=36, alpha=0.85, edgecolors="none")
  for r in points:
    ax.annotate(str(r["number"]), (r["parameters"], r["value"]), fontsize=7,
                xytext=(3, 3), textcoords="offset points")
  complete = [r for r in points if r["state"] == "complete"]
  if complete:
    top = max(complete, key=lambda r: r["value"])
    ax.scatter([top["parameters"]], [top["value"]], marker="*", s=220, c="gold",
               edgecolors="black", linewidths=0.6, label=f"best (trial {top['number']})",
               zorder=3)
  ax.set_xscale("log")
  ax.set_xlabel("model parameters")
  ax.set_ylabel(f"val {metric}")
  failed = sum(r["state"] == "failed" for r in table)
  ax.set_title(f"val {metric} by model size" + (f" ({failed} failed trials not shown)"
                                                  if failed else ""))
  ax.grid(True, which="both", alpha=0.3)
  ax.legend(fontsize=8)
  return fig


def _figures(study, where, sweep, table) -> dict:
  """Draws what can be drawn; name -> what it shows, or why it is not there."""
  status = {}
  complete = [r for r in table if r["state"] == "complete"]
  size = metric_vs_size(table, sweep.metric)
  status["metric_vs_size"] = _save(size, where.plot("metric_vs_size"),
                                   "val metric against model parameters (log x)",
                                   "not drawn: no finished trial with a parameter count yet")
  plots = _optuna_plots()
  if plots is None:
    for name in ("optimization_history", "param_importances", "intermediate_values"):
      status[name] = "not drawn: optuna's matplotlib plots are not available here"
    return status
  if complete:
    status["optimization_history"] = _save_axes(
        lambda: plots.plot_optimization_history(study), where.plot("optimization_history"),
        "Optuna's optimisation history", ylabel=f"val {sweep.metric}")
  else:
    status["optimization_history"] = "not drawn: no complete trial yet"
  if len(complete) >= 2:
    status["param_importances"] = _save_axes(
        lambda: plots.plot_param_importances(study), where.plot("param_importances"),
        "Optuna's parameter importances (PED-ANOVA)")
  else:
    status["param_importances"] = (f"not drawn: needs at least 2 complete trials "
                                   f"(have {len(complete)})")
  if any(t.intermediate_values for t in study.get_trials(deepcopy=False)):
    status["intermediate_values"] = _save_axes(
        lambda: plots.plot_intermediate_values(study), where.plot("intermediate_values"),
        f"val {sweep.metric} at each epoch of every trial", xlabel="epoch",
        ylabel=f"val {sweep.metric}")
  else:
    status["intermediate_values"] = "not drawn: no trial has reported an epoch's value yet"
  return status


def _optuna_plots():
  if "matplotlib.pyplot" not in sys.modules:
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")  # no display needed; a notebook that imported pyplot keeps its own
  try:
    from optuna.visualization import matplotlib as plots  # pylint: disable=import-outside-toplevel
  except ImportError:
    return None
  return plots


def _save_axes(draw, path: str, what: str, xlabel: str = "", ylabel: str = "") -> str:
  import matplotlib  # pylint: disable=import-outside-toplevel
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  # Optuna's plots set a global style (ggplot): kept inside this context, off other figures.
  with matplotlib.rc_context(), warnings.catch_warnings():
    warnings.simplefilter("ignore")
    try:
      ax = draw()
    except Exception as e:  # pylint: disable=broad-except  # e.g. importances of a constant metric
      log.detail(f"sweep report: {os.path.basename(path)} not drawn: {e}")
      return f"not drawn: {type(e).__name__}: {' '.join(str(e).split())[:160]}"
    if not isinstance(ax, np.ndarray):
      ax.set_xlabel(xlabel or ax.get_xlabel())
      ax.set_ylabel(ylabel or ax.get_ylabel())
    fig = ax.figure if not isinstance(ax, np.ndarray) else ax.flat[0].figure
    try:
      _save_figure(fig, path)
    finally:
      plt.close(fig)
  return what


def _save(fig, path: str, what: str, missing: str) -> str:
  if fig is None:
    return missing
  _save_figure(fig, path)
  return what


def _save_figure(fig, path: str) -> None:
  tmp = f"{path}.tmp-{os.getpid()}.png"
  fig.savefig(tmp, dpi=110, bbox_inches="tight")
  os.replace(tmp, path)


def _replace(path: str, text: str) -> None:
  tmp = f"{path}.tmp-{os.getpid()}"
  with open(tmp, "w") as f:
    f.write(text)
  os.replace(tmp, path)


def _decode(param, raw):
  try:
    return param.decode(raw)
  except ValueError:
    return raw


def _size(n) -> str:
  if not n:
    return ""
  return f"{n / 1e6:.2f}M" if n >= 1e5 else f"{n / 1e3:.1f}k"


def _energy(v) -> str:
  if isinstance(v, (int, float)) and not isinstance(v, bool):
    return f"{v:.0f}"
  return str(v or "").split(":")[0]


def _show(v) -> str:
  if v is None:
    return ""
  if isinstance(v, float):
    return f"{v:.4g}"
  return str(v)
