"""The monitor's figure: throughput and memory over a run's wall time, failures marked.

Rows are metrics.jsonl's 'monitor' rows (`medjax.monitor.Monitor`, `writers.read_metrics`); marks
are `medjax.fault.report.plot_marks`'s ({"kind": "failure" | "recovered", "step": ..., and
"time" where known}). Drawn without pyplot, as `medjax.plots` does.
"""

from __future__ import annotations

import numpy as np

from medjax import plots

_MARK_STYLE = {"failure": ("tab:red", "--"), "recovered": ("tab:green", ":")}
# Lines in every color but the marks' (as in medjax.plots, failures red and recoveries green).
_LINE_COLORS = ("tab:blue", "tab:orange", "tab:purple", "tab:brown", "tab:pink", "tab:olive",
                "tab:cyan", "tab:gray")


def _restarts(rows: list[dict]) -> list[int]:
  """Indices i where rows[i + 1] comes from a new monitor (a restarted worker): more wall time
  passed than its own interval_s, or its global step or its monitor's step count went back."""
  out = []
  for i in range(len(rows) - 1):
    a, b = rows[i], rows[i + 1]
    went_back = any(a.get(k) is not None and b.get(k) is not None and b[k] < a[k]
                    for k in ("step", "steps"))
    gap = b.get("interval_s") is not None and b["time"] - a["time"] > b["interval_s"] + 1e-3
    if went_back or gap:
      out.append(i)
  return out


def mark_times(rows: list[dict], marks: list[dict]) -> list[float | None]:
  """Each mark's wall time: its own 'time', else placed from its step on the rows' restarts.

  A failure at step s goes at the last sample before the first unused restart whose generation
  ended at or below s; a recovery at step r at the first sample of the first unused generation
  that starts at or after r. Marks are taken in their list order, failures and recoveries each
  using a restart once. None where nothing fits (rows without steps, a failure with no restart).
  """
  rows = sorted((r for r in rows if r.get("time") is not None), key=lambda r: r["time"])
  if rows:
    first = min(r.get("process", 0) or 0 for r in rows)
    rows = [r for r in rows if (r.get("process", 0) or 0) == first]
  restarts = _restarts(rows)
  used = {"failure": set(), "recovered": set()}
  out = []
  for mark in marks:
    if mark.get("time") is not None:
      out.append(float(mark["time"]))
      continue
    kind, step, found = mark.get("kind"), mark.get("step"), None
    if step is not None and kind in used:
      for i in restarts:
        if i in used[kind]:
          continue
        if kind == "failure" and (rows[i].get("step") or 0) <= step:
          found = rows[i]["time"]
        elif kind == "recovered" and (rows[i + 1].get("step") or 0) >= step:
          found = rows[i + 1]["time"]
        if found is not None:
          used[kind].add(i)
          break
    out.append(found)
  return out


def plot_monitor(rows: list[dict], marks: list[dict], path: str) -> None:
  """Writes one PNG at `path`: examples/s, and memory (RSS, host used, GPU used) over wall time,
  failures (red) and recoveries (green) as vertical lines; a third panel of measured power where
  there is any."""
  rows = sorted((r for r in rows if r.get("kind", "monitor") == "monitor"
                 and r.get("time") is not None), key=lambda r: r["time"])
  power_keys = sorted({k for r in rows for k, v in r.items()
                       if v is not None and (k == "power_w" or k.endswith("_power_w"))})
  fig = plots.figure(figsize=(9, 7.5 if power_keys else 5.5))
  axes = fig.subplots(3 if power_keys else 2, 1, sharex=True)
  for ax in axes:
    ax.set_prop_cycle(color=_LINE_COLORS)
  t0 = rows[0]["time"] if rows else 0.0
  span = (rows[-1]["time"] - t0) if rows else 0.0
  scale, unit = (60.0, "min") if span > 600 else (1.0, "s")
  x = lambda t: (t - t0) / scale
  processes = sorted({int(r.get("process", 0) or 0) for r in rows})
  many = len(processes) > 1

  by_process = {p: [r for r in rows if int(r.get("process", 0) or 0) == p] for p in processes}
  breaks = {p: set(_restarts(by_process[p])) for p in processes}

  def series(key, process):
    """(x, y) of one field, NaN between generations so that no line bridges a restart."""
    pts = []
    for i, r in enumerate(by_process[process]):
      if r.get(key) is not None:
        pts.append((x(r["time"]), r[key]))
      if i in breaks[process] and pts:
        pts.append((np.nan, np.nan))
    return np.array(pts, dtype=np.float64).reshape(-1, 2)

  def draw(ax, key, label, process, divide=1.0, **style):
    pts = series(key, process)
    if len(pts):
      ax.plot(pts[:, 0], pts[:, 1] / divide, label=label + (f" (process {process})" if many
                                                            else ""), **style)

  for p in processes:
    draw(axes[0], "examples_per_s", "examples/s", p, lw=1.2)
    draw(axes[1], "rss_mb", "process RSS", p, 1024.0, lw=1.2)
    draw(axes[1], "host_mem_used_mb", "host used", p, 1024.0, lw=1.0, ls="--")
    for k in sorted({k for r in rows for k in r if k.endswith("_mem_used_mb")
                     and k.startswith("gpu")}):
      draw(axes[1], k, k.split("_")[0].upper() + " used", p, 1024.0, lw=1.0, ls="-.")
    for k in power_keys:
      draw(axes[2], k, "measured power" if k == "power_w" else k.split("_")[0].upper(), p, lw=1.0)
  axes[0].set_ylabel("examples/s")
  axes[1].set_ylabel("memory (GiB)")
  if power_keys:
    axes[2].set_ylabel("power (W)")
  axes[-1].set_xlabel(f"wall time since the first sample ({unit})")

  times = mark_times(rows, marks)
  shown, missing = set(), 0
  for mark, t in zip(marks, times):
    if t is None:
      missing += 1
      continue
    kind = mark.get("kind", "event")
    color, ls = _MARK_STYLE.get(kind, ("tab:gray", "-."))
    for ax in axes:
      ax.axvline(x(t), color=color, ls=ls, lw=1,
                 label=kind if (ax is axes[0] and kind not in shown) else None)
    shown.add(kind)
  title = "Throughput and memory" + ("" if rows else ": no monitor samples")
  if missing:
    title += f"\n({missing} mark(s) not placed: no time, and no restart at their step)"
  axes[0].set_title(title)
  for ax in axes:
    if rows:
      ax.set_ylim(bottom=0)
    if ax.get_legend_handles_labels()[0]:
      ax.legend(loc="best", fontsize=8)
  fig.savefig(path, dpi=110, bbox_inches="tight")
