"""The comparison as markdown tables and a plot."""

from __future__ import annotations

import numpy as np

METHODS = ("majority", "logistic", "trees", "medjax")


def _interval(p: dict) -> str:
  return f"{p['mean']:+.3f} [{p['lo']:+.3f}, {p['hi']:+.3f}]"


def table(result: dict, metric: str = "auroc") -> str:
  """Cohorts x methods: mean test `metric` over seeds, and medjax's paired differences."""
  lines = [f"| cohort | seeds | {' | '.join(METHODS)} | medjax - trees [95%] "
           f"| medjax - logistic [95%] |", "|---" * (len(METHODS) + 4) + "|"]
  for name, s in result["summary"].items():
    cells = [f"{s[m][metric]:.3f}" for m in METHODS]
    lines.append(f"| {name} | {s['seeds']} | {' | '.join(cells)} | "
                 f"{_interval(s['medjax_vs_trees'][metric])} | "
                 f"{_interval(s['medjax_vs_logistic'][metric])} |")
  return "\n".join(lines)


def means(result: dict, metric: str) -> str:
  """Cohorts x methods: mean test `metric` (ECE, wall time) over seeds."""
  lines = [f"| cohort | {' | '.join(METHODS)} |", "|---" * (len(METHODS) + 1) + "|"]
  for name, s in result["summary"].items():
    lines.append(f"| {name} | {' | '.join(f'{s[m][metric]:.3f}' for m in METHODS)} |")
  return "\n".join(lines)


def paired_runs(before: dict, after: dict, metric: str = "auroc") -> str:
  """medjax after - medjax before, paired by cohort and seed (the same splits)."""
  from experiments.real_cohorts import compare  # pylint: disable=import-outside-toplevel
  lines = [f"| cohort | seeds | {before['label']} | {after['label']} | difference [95%] |",
           "|---|---|---|---|---|"]
  for name in after["per_seed"]:
    seeds = sorted(set(after["per_seed"][name]) & set(before["per_seed"].get(name, {})))
    if not seeds:
      continue
    a = [after["per_seed"][name][k]["medjax"][metric] for k in seeds]
    b = [before["per_seed"][name][k]["medjax"][metric] for k in seeds]
    lines.append(f"| {name} | {len(seeds)} | {np.mean(b):.3f} | {np.mean(a):.3f} | "
                 f"{_interval(compare.paired(a, b))} |")
  return "\n".join(lines)


def plot(results: list[dict], path: str, metric: str = "auroc") -> None:
  """Per cohort, each method's mean test `metric` with its seeds' spread (one panel per cohort),
  medjax once per result (before/after)."""
  from matplotlib import figure  # pylint: disable=import-outside-toplevel
  names = list(results[-1]["summary"])
  fig = figure.Figure(figsize=(3.2 * len(names), 3.6))
  axes = fig.subplots(1, len(names), squeeze=False)[0]
  for ax, name in zip(axes, names):
    rows = [("majority", results[-1]), ("logistic", results[-1]), ("trees", results[-1])]
    rows += [("medjax", r) for r in results]
    labels, values = [], []
    for method, r in rows:
      seeds = r["per_seed"].get(name, {})
      values.append([s[method][metric] for s in seeds.values()])
      labels.append(method if method != "medjax" else f"medjax\n{r['label']}")
    ax.boxplot(values[1:], tick_labels=labels[1:], widths=0.6)
    ax.set_title(name)
    ax.tick_params(axis="x", labelsize=7)
  axes[0].set_ylabel(f"test {metric.upper()} over seeds")
  fig.tight_layout()
  fig.savefig(path, dpi=110)


def variants(before: dict, others: list[dict]) -> str:
  """Per variant and cohort: medjax's mean AUROC, before's on the same seeds, and the trees'."""
  lines = ["| variant | overrides | cohort | seeds | medjax | before | trees |",
           "|---|---|---|---|---|---|---|"]
  for r in others:
    for name, seeds in r["per_seed"].items():
      keys = sorted(seeds)
      mean = lambda run, m, ks=keys, c=name: np.mean(
          [run["per_seed"][c][k][m]["auroc"] for k in ks])
      base = [k for k in keys if k in before["per_seed"].get(name, {})]
      overrides = " ".join(o.replace("--config.", "") for o in r["overrides"])
      lines.append(f"| {r['label']} | `{overrides}` | {name} | {len(keys)} | "
                   f"{mean(r, 'medjax'):.3f} | "
                   f"{mean(before, 'medjax', base) if base else float('nan'):.3f} | "
                   f"{mean(r, 'trees'):.3f} |")
  return "\n".join(lines)


def against_better(result: dict, earlier: list[dict], metric: str = "auroc") -> str:
  """Per cohort: medjax against the better baseline (higher mean `metric` on the same seeds),
  each baseline, and each `earlier` medjax result on their common seeds, paired by seed; then
  the test ECE of medjax and both baselines (the issue's goal table)."""
  from experiments.real_cohorts import compare  # pylint: disable=import-outside-toplevel
  head = ["cohort", "seeds", "logistic", "trees", "medjax", "medjax - better baseline [95%]",
          "- trees [95%]", "- logistic [95%]", *[f"- {r['label']} [95%]" for r in earlier],
          "ECE logistic / trees / medjax"]
  lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
  for name, seeds in result["per_seed"].items():
    keys = sorted(seeds)
    get = lambda method, r=result, ks=keys, c=name, m=metric: [
        r["per_seed"][c][k][method][m] for k in ks]
    ours = get("medjax")
    diffs = {b: compare.paired(ours, get(b)) for b in ("trees", "logistic")}
    better = max(("trees", "logistic"), key=lambda b: np.mean(get(b)))
    cells = [name, str(len(keys)), f"{np.mean(get('logistic')):.3f}",
             f"{np.mean(get('trees')):.3f}", f"{np.mean(ours):.3f}",
             f"{_interval(diffs[better])} ({better})", _interval(diffs["trees"]),
             _interval(diffs["logistic"])]
    for r in earlier:
      common = [k for k in keys if k in r["per_seed"].get(name, {})]
      a = [seeds[k]["medjax"][metric] for k in common]
      b = [r["per_seed"][name][k]["medjax"][metric] for k in common]
      cells.append(f"{_interval(compare.paired(a, b))} ({len(common)})" if common else "")
    ece = " / ".join(f"{np.mean(get(m, m='ece')):.3f}" for m in ("logistic", "trees", "medjax"))
    lines.append("| " + " | ".join(cells + [ece]) + " |")
  return "\n".join(lines)
