"""The comparison as a markdown table and a plot."""

from __future__ import annotations

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
