"""Figures people look at: each returns a matplotlib Figure.

Figures are made without pyplot, so no backend is chosen here: scripts and workers need no
display, and a notebook keeps its own inline backend. matplotlib itself is imported by the first
figure (`figure`), not with this module: every worker and standby imports it, and 0.3 s of
import at each process start is recovery time and CPU taken from training (issue 12).
"""

from __future__ import annotations

import numpy as np

SUBSETS = ("ILV", "IL", "IV", "LV", "I", "L", "V")


def figure(**kwargs):
  """A new matplotlib Figure (matplotlib imported on first use)."""
  from matplotlib import figure as figure_lib  # pylint: disable=import-outside-toplevel
  return figure_lib.Figure(**kwargs)


def close(figures: dict) -> None:
  """Drops the figures' canvases (nothing to do without pyplot; kept for callers)."""
  figures.clear()


def loss_curve(rows: list[dict], events: list[dict]):
  """Training loss per step; failures (red) and recoveries (green) marked, as in Fig. 3."""
  train = [r for r in rows if r.get("kind") == "train" and r.get("loss") is not None]
  fig = figure(figsize=(8, 4))
  ax = fig.subplots()
  steps = np.array([r["step"] for r in train])
  loss = np.array([r["loss"] for r in train])
  ax.plot(steps, loss, lw=0.6, alpha=0.4, color="tab:blue", label="loss")
  if len(loss) >= 10:
    k = max(len(loss) // 50, 5)
    smooth = np.convolve(loss, np.ones(k) / k, mode="valid")
    ax.plot(steps[k - 1:], smooth, lw=1.8, color="tab:blue", label=f"mean of {k} steps")
  for i, e in enumerate(events):
    if e.get("kind") == "failure":
      ax.axvline(e["step"], color="tab:red", ls="--", lw=1,
                 label="failure" if i == 0 else None)
    elif e.get("kind") == "recovered":
      ax.axvline(e["step"], color="tab:green", ls=":", lw=1,
                 label="recovered" if i == 1 else None)
  ax.set_xlabel("global step")
  ax.set_ylabel("training loss")
  ax.legend(loc="upper right")
  ax.set_title("Training loss")
  return fig


def per_class_f1(test: dict, ceiling: dict | None, class_names: list[str]):
  f1 = np.array([np.nan if v is None else v for v in test["per_class_f1"]])
  order = np.argsort(-np.nan_to_num(f1, nan=-1))
  fig = figure(figsize=(max(8, 0.28 * len(class_names)), 4))
  ax = fig.subplots()
  x = np.arange(len(order))
  ax.bar(x, f1[order], color="tab:blue", label="model")
  if ceiling is not None:
    c = np.array([np.nan if v is None else v for v in ceiling["per_class_f1"]])
    ax.plot(x, c[order], "k_", ms=10, mew=2, label="Bayes ceiling")
  ax.set_xticks(x, [class_names[i] for i in order], rotation=75, ha="right", fontsize=7)
  ax.set_ylabel("F1 (test)")
  ax.set_ylim(0, 1)
  ax.legend()
  ax.set_title("Per-class F1")
  return fig


def confusion(cm, class_names: list[str]):
  cm = np.asarray(cm, np.float64)
  norm = cm / np.maximum(cm.sum(1, keepdims=True), 1)
  side = max(6, 0.22 * len(class_names))
  fig = figure(figsize=(side, side))
  ax = fig.subplots()
  im = ax.imshow(norm, cmap="Blues", vmin=0, vmax=1)
  many = len(class_names) > 10
  fontsize = 6 if many else 9
  ax.set_xticks(range(len(class_names)), class_names, rotation=90 if many else 0,
                fontsize=fontsize)
  ax.set_yticks(range(len(class_names)), class_names, fontsize=fontsize)
  ax.set_xlabel("predicted")
  ax.set_ylabel("true")
  if len(class_names) <= 10:  # few classes: the counts themselves are readable in the cells
    for (i, j), n in np.ndenumerate(cm.astype(np.int64)):
      ax.text(j, i, str(n), ha="center", va="center", fontsize=9,
              color="white" if norm[i, j] > 0.5 else "black")
  fig.colorbar(im, ax=ax, fraction=0.046, label="row-normalised")
  ax.set_title("Confusion matrix (test)")
  return fig


def by_subset(test: dict, ceiling: dict | None):
  """Accuracy per available-modality subset, model beside the Bayes ceiling, with counts."""
  subsets = [s for s in SUBSETS if test["by_subset"][s]["count"] > 0]
  x = np.arange(len(subsets))
  fig = figure(figsize=(8, 4))
  ax = fig.subplots()
  ax.bar(x - 0.2, [test["by_subset"][s]["accuracy"] for s in subsets], 0.4, label="model")
  if ceiling is not None:
    ax.bar(x + 0.2, [ceiling["by_subset"][s]["accuracy"] for s in subsets], 0.4,
           label="Bayes ceiling", color="tab:gray")
  ax.set_xticks(x, [f"{s}\n(n={test['by_subset'][s]['count']})" for s in subsets])
  ax.set_ylabel("accuracy (test)")
  ax.set_ylim(0, 1)
  ax.legend()
  ax.set_title("Accuracy by available modalities (I images, L labs, V vitals)")
  return fig


def reliability(test: dict):
  """Reliability diagram of p(positive) on the test split: observed share of positives against
  the mean predicted probability per bin (the diagonal is perfect calibration), with the
  records per bin beneath."""
  calibration = test["calibration"]
  bins = [b for b in calibration["bins"] if b["count"]]
  fig = figure(figsize=(5, 5.5))
  ax, counts = fig.subplots(2, 1, height_ratios=(3, 1), sharex=True)
  ax.plot([0, 1], [0, 1], ls="--", color="grey", lw=1, label="perfect calibration")
  ax.plot([b["predicted"] for b in bins], [b["observed"] for b in bins], "o-",
          color="tab:blue", label=f"model (ECE {calibration['ece']:.3f})")
  if "validation_threshold" in test:
    ax.axvline(test["validation_threshold"]["threshold"], color="tab:orange", ls=":",
               label="validation threshold")
  ax.set_ylabel(f"observed share of {test['positive_class']!r}")
  ax.set_ylim(0, 1)
  ax.legend(loc="upper left")
  ax.set_title("Reliability (test split)")
  width = calibration["bins"][0]["hi"] - calibration["bins"][0]["lo"]
  counts.bar([b["lo"] + width / 2 for b in calibration["bins"]],
             [b["count"] for b in calibration["bins"]], width=0.9 * width, color="tab:blue")
  counts.set_xlabel(f"predicted p({test['positive_class']})")
  counts.set_ylabel("records")
  counts.set_xlim(0, 1)
  return fig
