"""The report's own PNGs: Table I as bars, and the simulator's goodput and waste against workers
(Figs. 3 and 4 are the lineage run's own loss_curve.png and per_class_f1.png)."""

from __future__ import annotations

import os

from matplotlib import figure

from experiments import failure_sim


def table_one(one: dict) -> figure.Figure:
  """Training wall time per strategy (clean part and time lost) and waste, side by side."""
  rows = list(one["rows"].values())
  labels = [r["label"].replace(" (", "\n(").replace(" + ", "\n+ ") for r in rows]
  clean = one["clean_training_wall_s"]
  fig = figure.Figure(figsize=(11, 4), layout="constrained")
  left, right = fig.subplots(1, 2)
  x = range(len(rows))
  left.bar(x, [clean] * len(rows), color="tab:blue", label="the run without failures")
  left.bar(x, [max(r["time_lost_s"], 0) for r in rows], bottom=[clean] * len(rows),
           color="tab:red", label="time lost to the 4 failures")
  left.set_xticks(list(x), labels, fontsize=8)
  left.set_ylabel("training wall time (s)")
  left.legend(fontsize=8)
  left.set_title("Training wall time, same failures (measured)", fontsize=10)
  right.bar(x, [100 * r["waste_fraction"] for r in rows], color="tab:orange", label="waste")
  right.bar([i + 0.3 for i in x], [100 * r["checkpoint_overhead"] for r in rows], width=0.3,
            color="tab:gray", label="checkpoint overhead")
  right.set_xticks(list(x), labels, fontsize=8)
  right.set_ylabel("% of training")
  right.legend(fontsize=8)
  right.set_title("Waste and checkpoint overhead (measured)", fontsize=10)
  return fig


def write(out: str, one: dict, sim: dict) -> list[str]:
  figs = {"table1_strategies.png": table_one(one)}
  for name, fig in failure_sim.figures(sim).items():
    figs[f"sim_{name}.png"] = fig
  for name, fig in figs.items():
    fig.savefig(os.path.join(out, name), dpi=110)
  return sorted(figs)
