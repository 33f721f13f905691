"""How much signal nwtco holds: a clinician-statistician's logistic model, specified from the
National Wilms Tumor Study's own analyses, on the same splits as medjax and the baselines.

The NWTS relapse models (Breslow and Chatterjee 1999; Kulich and Lin 2004, on this case-cohort
data) put histology and stage in with their interaction (unfavourable histology matters most at
advanced stages) and age as a smooth curve. Here: central histology, stage (one indicator per
stage), histology x stage, local histology, study, and age as a cubic spline (4 knots at its
training quantiles); fitted as `baselines.logistic` (L2, C chosen on validation AUROC). If this
model, the trees and medjax score alike, the cohort's five columns are what limits them, not the
models.

  python -m experiments.real_cohorts.reference OUTDIR --label tables_ema2 [--seeds 10]
      needs OUTDIR/runs/<label>/nwtco/seed<k> (their manifests give the splits) and
      OUTDIR/real_cohorts_<label>.json; prints the paired table and writes
      OUTDIR/real_cohorts_<label>_nwtco_reference.json
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
from sklearn import preprocessing

from experiments.real_cohorts import baselines, cohorts, compare


def design(features, age_spline=None):
  """(design matrix, fitted spline) from nwtco's columns (instit, histol, stage, study, age)."""
  x = features.to_numpy(np.float64)
  instit, histol, stage, study, age = (x[:, i] for i in range(5))
  unfavourable = (histol == 2).astype(float)
  stages = np.stack([(stage == s).astype(float) for s in (2, 3, 4)], axis=1)
  if age_spline is None:
    age_spline = preprocessing.SplineTransformer(n_knots=4, degree=3, knots="quantile",
                                                 extrapolation="linear").fit(age[:, None])
  columns = [unfavourable[:, None], stages, unfavourable[:, None] * stages,
             (instit == 2).astype(float)[:, None], (study == 4).astype(float)[:, None],
             age_spline.transform(age[:, None])]
  return np.concatenate(columns, axis=1), age_spline


def run(outdir: str, label: str, seeds) -> dict:
  with open(os.path.join(outdir, f"real_cohorts_{label}.json")) as f:
    earlier = json.load(f)["per_seed"]["nwtco"]
  ids, labels, features, _ = cohorts.table("nwtco")
  y = (labels == sorted(set(labels))[1]).astype(int)
  per_seed = {}
  for seed in seeds:
    workdir = os.path.join(outdir, "runs", label, "nwtco", f"seed{seed}")
    split = compare.split_of(workdir, ids, compare.salt_file(outdir, seed))
    _, spline = design(features[split == "train"])
    x, _ = design(features, spline)
    parts = [(x[split == s], y[split == s]) for s in ("train", "val", "test")]
    p, _ = baselines.logistic(*parts[0], *parts[1], parts[2][0], seed)
    per_seed[seed] = {"clinical": baselines.scores(p, parts[2][1])["auroc"],
                      **{m: earlier[str(seed)][m]["auroc"] for m in ("medjax", "trees",
                                                                     "logistic")}}
    print(f"nwtco seed {seed}: AUROC clinical {per_seed[seed]['clinical']:.4f} "
          f"trees {per_seed[seed]['trees']:.4f} medjax {per_seed[seed]['medjax']:.4f}",
          flush=True)
  runs = list(per_seed.values())
  result = {"label": label, "per_seed": per_seed,
            "mean": {m: float(np.mean([r[m] for r in runs])) for m in runs[0]},
            "paired": {f"{a} - {b}": compare.paired([r[a] for r in runs], [r[b] for r in runs])
                       for a, b in (("clinical", "trees"), ("medjax", "clinical"),
                                    ("medjax", "trees"))}}
  with open(os.path.join(outdir, f"real_cohorts_{label}_nwtco_reference.json"), "w") as f:
    json.dump(result, f, indent=1)
  return result


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("outdir")
  parser.add_argument("--label", required=True)
  parser.add_argument("--seeds", type=int, default=10)
  args = parser.parse_args()
  result = run(args.outdir, args.label, range(args.seeds))
  print(" | ".join(f"{m} {v:.3f}" for m, v in result["mean"].items()))
  for name, p in result["paired"].items():
    print(f"{name}: {p['mean']:+.3f} [{p['lo']:+.3f}, {p['hi']:+.3f}]")


if __name__ == "__main__":
  main()
