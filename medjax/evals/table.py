"""The plain-text summary table (model vs Bayes ceiling, overall and by subset).

Its own module, importing neither JAX nor matplotlib: the launcher of a supervised run prints it
from summary.json while the workers, not the launcher, do the run's work.
"""

from __future__ import annotations

from medjax.evals import metrics as metrics_lib

NO_ORACLE = "no oracle: the Bayes posterior exists for synthetic cohorts only"


def metric_keys(metrics: dict) -> list[str]:
  """The overall metrics a table shows, in order, for one split's `split_metrics`.

  Binary tasks: sensitivity, specificity, AUROC, AUPRC instead of top-3 and the macro AUROC.
  Top-3 is left out with 3 classes or fewer (1.0 by construction).
  """
  if "sensitivity" in metrics:
    return ["accuracy", "macro_f1", "sensitivity", "specificity", "auroc", "auprc",
            "rare_recall", "ece"]
  keys = ["accuracy", "macro_f1", "top3_accuracy", "rare_recall", "auroc_macro", "ece"]
  if len(metrics.get("per_class_f1", ())) <= metrics_lib.TOP_K:
    keys.remove("top3_accuracy")
  return keys


def _cell(value, width: int) -> str:
  return "-".rjust(width) if value is None else f"{value:{width}.4f}"


def _binary_extras(test: dict, reasons: dict) -> list[str]:
  """Calibration of p(positive), and the decision at the validation threshold."""
  lines = []
  calibration = test.get("calibration")
  if calibration:
    lines.append(f"calibration: ECE of p({test['positive_class']}) {calibration['ece']:.4f} "
                 f"over {len(calibration['bins'])} bins (reliability.png)")
  chosen = test.get("validation_threshold")
  if chosen:
    cells = "  ".join(f"{k} {_cell(chosen[k], 0).strip()}"
                      for k in ("sensitivity", "specificity", "accuracy", "macro_f1"))
    lines.append(f"at the validation threshold p >= {chosen['threshold']:.4f}: {cells}")
  elif "validation_threshold" in reasons:
    lines.append(f"validation threshold n/a ({reasons['validation_threshold']})")
  return lines


def format_summary(summary: dict) -> str:
  """Model vs ceiling, overall and by subset, as a plain-text table.

  Without a ceiling (no oracle) its columns are left out and one line says why; a metric that
  does not apply reads "n/a (reason)"; subsets without records are listed, not tabulated.
  """
  test, ceil = summary.get("test"), summary.get("ceiling")
  if not test:
    return "no test metrics (config.evals.splits has no 'test')"
  reasons = test.get("not_applicable", {})
  lines = [f"{'test':<14}{'model':>8}" + (f"{'ceiling':>9}{'ratio':>7}" if ceil else "")]
  for key in metric_keys(test):
    m = test.get(key)
    if m is None:
      lines.append(f"  {key:<12}{'n/a':>8} ({reasons.get(key, 'not computed')})")
      continue
    line = f"  {key:<12}{m:8.4f}"
    if ceil:
      c = ceil.get(key)
      line += _cell(c, 9) + (f"{m / c:7.3f}" if c else "")
    lines.append(line)
  if "positive_class" in test:
    n = test["count"]
    share = f" ({test['positives'] / n:.1%})" if n else ""
    lines.append(f"positive class {test['positive_class']!r}: {test['positives']} of {n} "
                 f"records{share}; the second class name (config.data.classes sets the order)")
    lines.append(f"decision: {test['decision']}")
    lines += _binary_extras(test, reasons)
  if not ceil:
    why = summary.get("not_applicable", {}).get("ceiling", NO_ORACLE)
    lines.append(f"Bayes ceiling n/a ({why})")
  lines.append(f"{'by subset':<14}{'n':>6}{'acc':>8}" + (f"{'ceiling':>9}" if ceil else ""))
  subsets = test.get("by_subset", {})
  for s, v in subsets.items():
    if v["count"] > 0:
      c = _cell(ceil["by_subset"][s]["accuracy"], 9) if ceil else ""
      lines.append(f"  {s:<12}{v['count']:6d}{_cell(v['accuracy'], 8)}{c}")
  absent = [s for s, v in subsets.items() if v["count"] == 0]
  if absent:
    lines.append(f"  no records: {', '.join(absent)}")
  early = summary.get("early_stopping")
  if early:
    stop = {"patience": f"stopped early after {early['epochs_run']} of "
                        f"{early['epochs_configured']} epochs ({early['patience']} without "
                        "improvement)",
            "pruned": f"pruned by the sweep after {early['epochs_run']} epochs"}.get(
                early["reason"], f"{early['epochs_run']} epochs")
    best = ("n/a" if early["best_value"] is None
            else f"{early['best_value']:.4f} at epoch {early['best_epoch']}")
    lines.append(f"validation {early['metric']}: best {best}; {stop}; tested: "
                 f"{early['evaluated_on']}")
  monitor = summary.get("monitor")
  if monitor:
    lines.append(f"energy: {monitor.get('energy')}")
  return "\n".join(lines)
