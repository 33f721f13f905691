"""The public cohorts and medjax's comparison with the baselines on them.

  python -m experiments.real_cohorts build OUTDIR
      the four cohorts as medjax cohort folders (`cohorts.py` says what each label is)
  python -m experiments.real_cohorts compare OUTDIR [--seeds 10] [--config configs/tables.py]
                                                    [--label NAME] [--cohorts a,b] [--set k=v]
                                                    [--first-seed 0]
      medjax vs gradient boosting, logistic regression and the majority class on medjax's own
      splits (`compare.py`); writes OUTDIR/real_cohorts_<label>.json and prints the table
  python -m experiments.real_cohorts report OUTDIR --labels default,tables
      the tables of those comparisons (AUROC, accuracy, ECE, medjax before vs after) as
      markdown, and OUTDIR/real_cohorts.png
  python -m experiments.real_cohorts report OUTDIR --labels tables_ens4 --against tables,c2
      the goal table: the label against the better baseline and earlier labels, with ECE
"""

import argparse
import json
import os
import sys

from experiments.real_cohorts import cohorts, compare, report


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("command", choices=["build", "compare", "report"])
  parser.add_argument("outdir")
  parser.add_argument("--seeds", type=int, default=10)
  parser.add_argument("--first-seed", type=int, default=0, help="seeds first..first+seeds-1")
  parser.add_argument("--config", default="configs/tables.py")
  parser.add_argument("--label", default="")
  parser.add_argument("--labels", default="default,tables", help="report: before,after")
  parser.add_argument("--variants", default="", help="report: more labels, as one AUROC table")
  parser.add_argument("--against", default="",
                      help="report: the last of --labels against the better baseline and these "
                           "earlier labels, paired by seed (the goal table)")
  parser.add_argument("--cohorts", default="", help="comma-separated; default all four")
  parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                      help="a config override for medjax's runs, e.g. model.d_model=64")
  args = parser.parse_args()
  if args.command == "build":
    for name in cohorts.COHORTS:
      counts = cohorts.write(name, os.path.join(args.outdir, name))
      print(name, json.dumps(counts))
    return
  if args.command == "report":
    if args.against:
      print(report.against_better(_load(args.outdir, args.labels.split(",")[-1]),
                                  [_load(args.outdir, a) for a in args.against.split(",")]))
      return
    print(_report(args.outdir, args.labels.split(","),
                  [v for v in args.variants.split(",") if v]))
    return
  label = args.label or os.path.splitext(os.path.basename(args.config))[0]
  try:
    result = compare.compare(args.outdir, range(args.first_seed, args.first_seed + args.seeds),
                             label, args.config,
                             [f"--config.{s}" for s in args.set],
                             [c for c in args.cohorts.split(",") if c] or None)
  except ValueError as e:   # another config's record under this label
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  print(report.table(result))


def _load(outdir: str, label: str) -> dict:
  with open(os.path.join(outdir, f"real_cohorts_{label}.json")) as f:
    return json.load(f)


def _report(outdir: str, labels: list[str], variants: list[str]) -> str:
  results = [_load(outdir, label) for label in labels]
  parts = []
  for r in results:
    parts += [f"### medjax `{r['config']}` {' '.join(r['overrides'])} ({r['label']})",
              "", "Test AUROC:", "", report.table(r, "auroc"), "", "Test accuracy:", "",
              report.table(r, "accuracy"), "", "Test ECE (top class, 15 bins):", "",
              report.means(r, "ece"), "", "Wall time per run, s:", "",
              report.means(r, "wall_s"), ""]
  if len(results) > 1:
    parts += [f"### medjax {results[-1]['label']} - {results[0]['label']}, same splits", "",
              report.paired_runs(results[0], results[-1]), ""]
  if variants:
    parts += ["### Variants: medjax's mean test AUROC, and trees' on the same seeds", "",
              report.variants(results[0], [_load(outdir, v) for v in variants]), ""]
  report.plot(results, os.path.join(outdir, "real_cohorts.png"))
  return "\n".join(parts)


if __name__ == "__main__":
  main()
