"""Writing a synthetic cohort in one process and on every core, side by side in one run; writes
experiments/results/bench_synthetic.json.

  python -m experiments.bench_synthetic [--config quickstart] [--patients 0] [--rounds 2]

The config's cohort (`--patients` 0: the config's size) written `--rounds` times each way,
alternated, into fresh directories: `synthetic.generate(..., processes=1)` against the default
(one process per core, `medjax.data.synthetic.dicom`). Every synthetic run (the quickstart, the
benchmarks, many tests) starts with this. The two ways must write the same bytes; the first
round's trees are compared file by file.
"""

import argparse
import filecmp
import importlib
import json
import os
import tempfile
import time

import numpy as np

from medjax.data import pools
from medjax.data import synthetic


def _same_trees(a: str, b: str) -> tuple[int, int]:
  """(files in `a`, files that differ from or are missing in `b`)."""
  files = differ = 0
  for dirpath, _, names in os.walk(a):
    for name in names:
      path = os.path.join(dirpath, name)
      other = os.path.join(b, os.path.relpath(path, a))
      files += 1
      differ += not (os.path.exists(other) and filecmp.cmp(path, other, shallow=False))
  return files, differ


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--config", default="quickstart", help="a module in configs/")
  parser.add_argument("--patients", type=int, default=0)
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results",
                                                    "bench_synthetic.json"))
  args = parser.parse_args()
  cfg = importlib.import_module(f"configs.{args.config}").get_config().data.synthetic
  if args.patients:
    cfg.num_patients = args.patients
  sides = {"one_process": 1, "every_core": None}
  seconds = {side: [] for side in sides}
  with tempfile.TemporaryDirectory() as tmp:
    for r in range(args.rounds):
      for side, processes in sides.items():
        t0 = time.perf_counter()
        stats = synthetic.generate(cfg, os.path.join(tmp, f"{side}-{r}"), processes=processes)
        seconds[side].append(round(time.perf_counter() - t0, 2))
        print(f"round {r} {side}: {stats['num_image_files']} image files in "
              f"{seconds[side][-1]} s", flush=True)
    files, differ = _same_trees(os.path.join(tmp, "one_process-0"),
                                os.path.join(tmp, "every_core-0"))
  median = {side: round(float(np.median(s)), 3) for side, s in seconds.items()}
  result = {"config": args.config, "patients": cfg.num_patients,
            "image_files": stats["num_image_files"], "cores": pools.cores(),
            "seconds": seconds, "median_s": median,
            "speedup": round(median["one_process"] / median["every_core"], 3),
            "files_compared": files, "files_that_differ": differ,
            "date": time.strftime("%Y-%m-%d")}
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(result, f, indent=2)
  print(f"synthetic cohort of {cfg.num_patients} patients ({result['image_files']} image files): "
        f"{median['one_process']} s in one process, {median['every_core']} s on "
        f"{result['cores']} cores: {result['speedup']}x; {differ} of {files} files differ")
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
