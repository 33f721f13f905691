"""python -m experiments.real_cohorts build OUTDIR: the four cohorts as medjax cohort folders
(`cohorts.py` says what each label is). The comparison with gradient boosting and logistic
regression is issue 34's next step."""

import argparse
import json
import os

from experiments.real_cohorts import cohorts


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("command", choices=["build"])
  parser.add_argument("outdir")
  args = parser.parse_args()
  for name in cohorts.COHORTS:
    counts = cohorts.write(name, os.path.join(args.outdir, name))
    print(name, json.dumps(counts))


if __name__ == "__main__":
  main()
