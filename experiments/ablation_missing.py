"""Missing-modality ablation: learned 'missing' embeddings vs zero-fill vs dropping incomplete
records (and optionally mean-fill), on one cohort and one train/val/test split, over seeds.

  python -m experiments.ablation_missing [--config quickstart|default] [--policies ...]
      [--seeds 0,1,2] [--patients N] [--epochs N] [--workdir /tmp/ablation_missing]

Every run trains the config (configs/quickstart.py or configs/default.py) single-process in a
child process of its own, calling `loop.train_and_evaluate(config, workdir)` as
`launch.py --config.fault.supervised=False` does.
What is held fixed across runs, and how:
  cohort  synthesised once into <workdir>/base/cohort and passed as config.data.root;
  salt    <workdir>/base/secrets/id_salt, passed as config.data.salt_file;
  split   ingested once (with --split-seed) into <workdir>/base/ingest and copied into each run's
          workdir, so `pipeline.ingested` reuses it instead of splitting again with config.seed
          (ingest's `stratified_split` is seeded by config.seed); after each run the script checks
          that the run's manifest has the base's record ids and split;
  cache   one decoded-record cache (<workdir>/cache, config.data.cache_dir) shared by the runs.
config.seed then changes only the initialisation, modality dropout and data order. Runs whose
summary.json exists are reused, so an interrupted ablation resumes where it stopped.

Writes experiments/results/ablation_missing.json and .md: the lineage paper's Table IV (rows All 3
/ Any 2 / Single; accuracy and macro F1 per policy, mean +- std over seeds) beside the Bayes
ceiling on the same test records, and accuracy per modality subset (ILV ... V).
"""

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import time

import numpy as np
from scipy import stats

from configs import default
from configs import quickstart
from medjax import paths
from medjax.data import ingest
from medjax.data import pipeline
from medjax.evals import metrics as metrics_lib

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
CONFIGS = {"quickstart": quickstart.get_config, "default": default.get_config}
ROWS = (("all3", "All 3 (I,L,V)"), ("any2", "Any 2"), ("single", "Single"))
# The lineage paper's Table IV (its learned-embedding model on its own cohort), for reference.
PAPER = {"all3": (0.892, 0.854), "any2": (0.858, 0.817), "single": (0.793, 0.742)}


REUSED = []  # runs whose summary.json an earlier invocation left


def log(msg: str) -> None:
  print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def get_config(args):
  return CONFIGS[args.config](args.variant or None)


def base_config(args):
  config = get_config(args)
  if args.patients:
    config.data.synthetic.num_patients = args.patients
  if args.epochs:
    config.optim.epochs = args.epochs
  config.fault.supervised = False
  config.seed = args.split_seed
  return config


def prepare_base(args, config) -> dict:
  """Synthesises the cohort and ingests it once; returns the paths every run shares."""
  base = os.path.join(args.workdir, "base")
  os.makedirs(base, exist_ok=True)
  salt = os.path.join(base, "secrets", "id_salt")
  config.data.salt_file = salt
  t0 = time.perf_counter()
  root = pipeline.cohort_root(config, base)
  result = pipeline.ingested(config, base, root)
  log(f"base: cohort {root}, {len(result.manifest)} records, split seed {args.split_seed} "
      f"({time.perf_counter() - t0:.0f} s)")
  return {"base": base, "root": root, "salt": salt, "manifest": result.manifest,
          "cache": os.path.join(args.workdir, "cache"),
          "jax_cache": os.path.join(args.workdir, "jax_cache")}


def overrides(args, shared, policy: str, seed: int) -> dict:
  flat = {"fault.supervised": False, "seed": seed, "model.missing": policy,
          "data.root": shared["root"], "data.salt_file": shared["salt"],
          "data.cache_dir": shared["cache"], "mesh.compilation_cache_dir": shared["jax_cache"]}
  if args.patients:
    flat["data.synthetic.num_patients"] = args.patients
  if args.epochs:
    flat["optim.epochs"] = args.epochs
  return flat


def child(args) -> None:
  """One training run in this process (the driver starts one process per run)."""
  from medjax.train import loop  # pylint: disable=import-outside-toplevel
  workdir = args.child
  config = get_config(args)
  for key, value in json.loads(args.child_overrides).items():
    *path, leaf = key.split(".")
    node = config
    for name in path:
      node = node[name]
    node[leaf] = value
  config.lock()
  with open(os.path.join(workdir, "config.json"), "w") as f:
    f.write(config.to_json_best_effort(indent=2, sort_keys=True))
  handler = logging.FileHandler(os.path.join(workdir, "log.txt"))
  handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
  logging.getLogger().addHandler(handler)
  logging.getLogger().setLevel(logging.INFO)
  logging.getLogger("absl").setLevel(logging.WARNING)
  loop.train_and_evaluate(config, workdir)


def last_progress(log_path: str) -> str:
  if not os.path.exists(log_path):
    return "starting"
  with open(log_path, errors="replace") as f:
    lines = [line for line in f.read().splitlines()[-50:]
             if ": " in line and ("training:" in line or "decoding" in line or "summary" in line)]
  return lines[-1].split(" INFO ", 1)[-1] if lines else "compiling / preparing"


def run_one(args, shared, policy: str, seed: int) -> dict:
  """Trains one (policy, seed) in its own workdir (reusing a finished one); returns summary.json."""
  workdir = os.path.join(args.workdir, "runs", f"{policy}-seed{seed}")
  summary_path = os.path.join(workdir, "summary.json")
  if os.path.exists(summary_path):
    log(f"{policy} seed {seed}: reusing {summary_path}")
    REUSED.append(f"{policy}-seed{seed}")
  else:
    if os.path.exists(workdir):
      shutil.rmtree(workdir)  # an interrupted run: start it again (lineage resume is not the point)
    os.makedirs(workdir)
    shutil.copytree(paths.RunPaths(shared["base"]).ingest, paths.RunPaths(workdir).ingest)
    cmd = [sys.executable, "-m", "experiments.ablation_missing", f"--child={workdir}",
           f"--config={args.config}", f"--variant={args.variant}",
           f"--child-overrides={json.dumps(overrides(args, shared, policy, seed))}"]
    log(f"{policy} seed {seed}: training in {workdir}")
    t0 = time.perf_counter()
    with open(os.path.join(workdir, "stdout.txt"), "w") as out:
      proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
      while proc.poll() is None:
        try:
          proc.wait(timeout=args.poll_s)
        except subprocess.TimeoutExpired:
          log(f"{policy} seed {seed}: {last_progress(os.path.join(workdir, 'log.txt'))} "
              f"[{time.perf_counter() - t0:.0f} s]")
    if proc.returncode != 0 or not os.path.exists(summary_path):
      with open(os.path.join(workdir, "stdout.txt"), errors="replace") as f:
        tail = f.read()[-3000:]
      raise RuntimeError(f"{policy} seed {seed}: the run exited {proc.returncode}; see "
                         f"{workdir}/stdout.txt and log.txt. Tail:\n{tail}")
    log(f"{policy} seed {seed}: done in {time.perf_counter() - t0:.0f} s")
  check_split(shared, workdir)
  with open(summary_path) as f:
    return json.load(f)


def check_split(shared, workdir: str) -> None:
  """The run trained and evaluated on the base's records and split (its ingest was reused)."""
  run = ingest.load(workdir).manifest
  base = shared["manifest"]
  if not (np.array_equal(run.record_ids, base.record_ids) and np.array_equal(run.split, base.split)):
    raise RuntimeError(f"{workdir}/ingest: record ids or split differ from the base ingest in "
                       f"{shared['base']}/ingest; the run ingested again instead of reusing it")


def mean_std(values) -> dict:
  """Mean, sample std, the 95% interval of the mean over seeds (Student's t, n - 1 degrees of
  freedom; None with one seed) and the values; None where a subset had no test records."""
  v = np.asarray(values, np.float64)
  if np.isnan(v).all():
    return {"mean": None, "std": None, "ci95": None, "values": [None] * len(v)}
  mean, std = float(np.mean(v)), float(np.std(v, ddof=1)) if len(v) > 1 else 0.0
  half = float(stats.t.ppf(0.975, len(v) - 1) * std / np.sqrt(len(v))) if len(v) > 1 else None
  return {"mean": mean, "std": std,
          "ci95": None if half is None else [mean - half, mean + half],
          "values": [float(x) for x in v]}


def aggregate(summaries: dict, policies, seeds) -> dict:
  """Mean and std over seeds of every reported metric, per policy; the ceiling once."""
  out = {"policies": {}, "ceiling": None}
  for policy in policies:
    runs = [summaries[(policy, s)]["test"] for s in seeds]
    entry = {"overall": {m: mean_std([r[m] for r in runs]) for m in ("accuracy", "macro_f1")},
             "table_iv": {}, "by_subset": {},
             "train_seconds": mean_std([summaries[(policy, s)]["train"]["seconds"]
                                        for s in seeds])}
    for row, _ in ROWS:
      entry["table_iv"][row] = {m: mean_std([r["table_iv"][row][m] for r in runs])
                                for m in ("accuracy", "macro_f1")}
      entry["table_iv"][row]["count"] = runs[0]["table_iv"][row]["count"]
    for s in metrics_lib.SUBSETS:
      entry["by_subset"][s] = {m: mean_std([r["by_subset"][s][m] for r in runs])
                               for m in ("accuracy", "macro_f1")}
      entry["by_subset"][s]["count"] = runs[0]["by_subset"][s]["count"]
    out["policies"][policy] = entry
  ceilings = [summaries[k].get("ceiling") for k in summaries]
  if all(c is not None for c in ceilings):
    c = ceilings[0]
    if any(json.dumps(x["table_iv"], sort_keys=True) != json.dumps(c["table_iv"], sort_keys=True)
           for x in ceilings):
      raise RuntimeError("the Bayes ceiling differs between runs: their test sets differ")
    out["ceiling"] = {"overall": {m: c[m] for m in ("accuracy", "macro_f1")},
                      "table_iv": c["table_iv"], "by_subset": c["by_subset"]}
  # Paired by seed (same init seed and data order): learned minus each other policy.
  if "learned" in policies:
    out["paired_vs_learned"] = {}
    for policy in policies:
      if policy == "learned":
        continue
      out["paired_vs_learned"][policy] = {
          row: {m: mean_std([summaries[("learned", s)]["test"]["table_iv"][row][m]
                             - summaries[(policy, s)]["test"]["table_iv"][row][m] for s in seeds])
                for m in ("accuracy", "macro_f1")}
          for row, _ in ROWS}
      out["paired_vs_learned"][policy]["overall"] = {
          m: mean_std([summaries[("learned", s)]["test"][m] - summaries[(policy, s)]["test"][m]
                       for s in seeds]) for m in ("accuracy", "macro_f1")}
  return out


def _finite(value):
  """NaN (a metric over no records) -> null, so the JSON stays strict."""
  if isinstance(value, dict):
    return {k: _finite(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_finite(v) for v in value]
  if isinstance(value, float) and np.isnan(value):
    return None
  return value


def pct(ms: dict) -> str:
  if ms["mean"] is None:
    return "–"
  return f"{100 * ms['mean']:.1f} ± {100 * ms['std']:.1f}"


def markdown(result: dict) -> str:
  agg, policies = result["aggregate"], result["policies"]
  ceiling = agg["ceiling"]
  lines = [
      f"# Missing-modality ablation ({result['config']})", "",
      f"{result['records']} records ({result['train_records']} train, "
      f"{result['complete_train_records']} of them with all three modalities: what 'drop' trains "
      f"on), {result['test_records']} test; one cohort, salt and split; seeds "
      f"{', '.join(map(str, result['seeds']))} (init, modality dropout, data order); "
      f"{result['epochs']} epochs. Test-set values in %, mean ± std over seeds (sample std).", "",
      "## Table IV: accuracy and macro F1 by available modalities", ""]
  head = "| Modalities | n |" + "".join(f" {p} acc | {p} F1 |" for p in policies)
  sep = "|---|---:|" + "---:|---:|" * len(policies)
  if ceiling:
    head += " Bayes acc | Bayes F1 |"
    sep += "---:|---:|"
  head += " paper acc | paper F1 |"
  sep += "---:|---:|"
  lines += [head, sep]
  for row, label in ROWS:
    first = agg["policies"][policies[0]]["table_iv"][row]
    cells = [label, str(first["count"])]
    for p in policies:
      t = agg["policies"][p]["table_iv"][row]
      cells += [pct(t["accuracy"]), pct(t["macro_f1"])]
    if ceiling:
      cells += [f"{100 * ceiling['table_iv'][row]['accuracy']:.1f}",
                f"{100 * ceiling['table_iv'][row]['macro_f1']:.1f}"]
    cells += [f"{100 * PAPER[row][0]:.1f}", f"{100 * PAPER[row][1]:.1f}"]
    lines.append("| " + " | ".join(cells) + " |")
  cells = ["Overall", str(result["test_records"])]
  for p in policies:
    o = agg["policies"][p]["overall"]
    cells += [pct(o["accuracy"]), pct(o["macro_f1"])]
  if ceiling:
    cells += [f"{100 * ceiling['overall']['accuracy']:.1f}",
              f"{100 * ceiling['overall']['macro_f1']:.1f}"]
  cells += ["87.3", "82.1"]
  lines.append("| " + " | ".join(cells) + " |")
  lines += ["", "Rows are the library's `table_iv`: per-subset metrics averaged with subset-count "
            "weights (so a row's F1 is a weighted mean of the subsets' macro F1s, not the macro F1 "
            "of the pooled records). The paper's numbers are its learned-embedding model on its "
            "53,420-patient cohort (37 classes), for orientation only.", "",
            "## Accuracy by modality subset", ""]
  head = "| Subset | n |" + "".join(f" {p} |" for p in policies) + (" Bayes |" if ceiling else "")
  lines += [head, "|---|---:|" + "---:|" * (len(policies) + bool(ceiling))]
  for s in metrics_lib.SUBSETS:
    cells = [s, str(agg["policies"][policies[0]]["by_subset"][s]["count"])]
    cells += [pct(agg["policies"][p]["by_subset"][s]["accuracy"]) for p in policies]
    if ceiling:
      c = ceiling["by_subset"][s]["accuracy"]
      cells.append("–" if c is None or np.isnan(c) else f"{100 * c:.1f}")
    lines.append("| " + " | ".join(cells) + " |")
  if "paired_vs_learned" in agg:
    lines += ["", "## Learned minus each policy, paired by seed (accuracy points)", "",
              "| Policy | All 3 | Any 2 | Single | Overall |", "|---|---:|---:|---:|---:|"]
    for p, d in agg["paired_vs_learned"].items():
      lines.append(f"| {p} | " + " | ".join(
          f"{100 * d[r]['accuracy']['mean']:+.1f} ± {100 * d[r]['accuracy']['std']:.1f}"
          for r in ("all3", "any2", "single", "overall")) + " |")
  half = {p: np.mean([(r["test"]["ci95"]["accuracy"][1] - r["test"]["ci95"]["accuracy"][0]) / 2
                      for k, r in result["runs"].items() if k.startswith(p + "-seed")])
          for p in policies}
  lines += ["", "The ± above is over seeds on one fixed test set; sampling the test records adds "
            "more: the library's bootstrap 95% interval of overall accuracy is ± " + ", ".join(
                f"{100 * h:.1f} ({p})" for p, h in half.items()) + " points (half-width, mean "
            "over seeds). Paired differences cancel most of it, since every policy sees the same "
            "test records."]
  lines += ["", "Training time per run (s, mean over seeds): " + ", ".join(
      f"{p} {agg['policies'][p]['train_seconds']['mean']:.0f}" for p in policies)
      + f" (the machine's 2 cores were shared with other jobs); this invocation "
      f"{result['wall_seconds']:.0f} s, reusing {len(result['reused_runs'])} finished runs.", ""]
  return "\n".join(lines)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
  parser.add_argument("--policies", default="learned,zero,drop",
                      help="comma-separated config.model.missing values (learned,zero,mean,drop)")
  parser.add_argument("--seeds", default="0,1,2")
  parser.add_argument("--config", default="quickstart", choices=sorted(CONFIGS),
                      help="configs/<name>.py: every run trains it")
  parser.add_argument("--patients", type=int, default=0, help="0: the config's")
  parser.add_argument("--epochs", type=int, default=0, help="0: the config's")
  parser.add_argument("--variant", default="", help="the config's variant, e.g. 'tiny'")
  parser.add_argument("--split-seed", type=int, default=0, help="config.seed of the one ingest")
  parser.add_argument("--workdir", default="/tmp/ablation_missing")
  parser.add_argument("--poll-s", type=float, default=60.0, help="progress line interval")
  parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                    "results", "ablation_missing"),
                      help="output path without extension (.json and .md are written)")
  parser.add_argument("--child", default="", help=argparse.SUPPRESS)
  parser.add_argument("--child-overrides", default="{}", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    child(args)
    return
  policies = [p.strip() for p in args.policies.split(",") if p.strip()]
  seeds = [int(s) for s in args.seeds.split(",")]
  if len(seeds) < 2:
    log("warning: fewer than two seeds; the std columns will be 0")
  t0 = time.perf_counter()
  config = base_config(args)
  shared = prepare_base(args, config)
  summaries = {}
  for seed in seeds:  # seed-major, so a partial ablation has every policy for its first seeds
    for policy in policies:
      summaries[(policy, seed)] = run_one(args, shared, policy, seed)
      t = summaries[(policy, seed)]["test"]
      log(f"{policy} seed {seed}: test accuracy {t['accuracy']:.4f}, macro F1 "
          f"{t['macro_f1']:.4f}; all3/any2/single accuracy " + "/".join(
              f"{t['table_iv'][r]['accuracy']:.3f}" for r, _ in ROWS))
  manifest = shared["manifest"]
  train = manifest.indices("train")
  result = {
      "config": f"configs/{args.config}.py" + (f":{args.variant}" if args.variant else ""),
      "policies": policies, "seeds": seeds, "split_seed": args.split_seed,
      "patients": int(config.data.synthetic.num_patients), "epochs": int(config.optim.epochs),
      "records": len(manifest), "train_records": int(len(train)),
      "complete_train_records": int(manifest.modality_mask[train].all(axis=1).sum()),
      "test_records": int(len(manifest.indices("test"))),
      "split_identical_across_runs": True,  # check_split raised otherwise
      "workdir": args.workdir,
      "wall_seconds": round(time.perf_counter() - t0, 1), "reused_runs": REUSED,
      "aggregate": aggregate(summaries, policies, seeds),
      "runs": {f"{p}-seed{s}": {"test": {k: summaries[(p, s)]["test"][k]
                                          for k in ("accuracy", "macro_f1", "table_iv",
                                                    "by_subset", "ci95")},
                                 "train_seconds": summaries[(p, s)]["train"]["seconds"]}
               for p in policies for s in seeds},
  }
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out + ".json", "w") as f:
    json.dump(_finite(result), f, indent=2, allow_nan=False)
  text = markdown(result)
  with open(args.out + ".md", "w") as f:
    f.write(text)
  print(text)
  log(f"wrote {args.out}.json and {args.out}.md")


if __name__ == "__main__":
  main()
