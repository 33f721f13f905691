"""Cache under host loss, real processes: a supervised run on 3 hosts loses one when epoch 1
starts (elastic shrink to 2) and trains on; compared side by side in one run:

  medjax    bounded-load placement, moved records decoded once in the background (recache)
  redirect  bounded-load placement, moved records read from shared storage at every read
  modulo    hash-mod-W placement (most records move), recached
  r2        medjax with replication r = 2 (moved records are already on their new owner)

  python -m experiments.cache_study [--patients 3000] [--epochs 4]

Per variant: records moved (against the ideal, the departed host's share), shared-storage reads
per moved record over the remaining epochs (target: exactly 1; redirect: one per epoch; 0 with
r = 2), per-epoch shared-storage reads, epoch times (from the chief's epoch-end cache lines in
metrics.jsonl), and reads that waited for the recacher. Writes
experiments/results/cache_study.{json,md} and cache_study_*.png.
"""

import argparse
import collections
import json
import os

import numpy as np

from experiments import bench_fault
from medjax import plots
from medjax.data import ingest
from medjax.data.cache import placement
from medjax.runtime import inject
from medjax.train import writers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIANTS = {
    "medjax": [],
    "redirect": ["--config.data.cache_policy=redirect"],
    "modulo": ["--config.data.placement_method=modulo"],
    "r2": ["--config.data.replicas=2"],
}
HOSTS = ["host-0", "host-1", "host-2"]


def cache_lines(workdir: str) -> list[dict]:
  """The chief's epoch-end cache lines, in the order written (re-run epochs log again)."""
  return [row for row in writers.read_metrics(workdir) if row.get("kind") == "cache"]


def analyse(workdir: str, summary: dict, method: str) -> dict:
  """Counts after the host loss: from the last epoch-end line before it to the run's end."""
  cache = summary["cache"]
  total = cache["total"]
  manifest = ingest.load(workdir).manifest
  before = placement.place(manifest, HOSTS, seed=0, method=method)
  after = placement.place_history(manifest, [HOSTS, HOSTS[:-1]], seed=0, method=method)
  moved_N = placement.moved(before, after)
  moved_train = int(np.sum(moved_N & (np.asarray(manifest.split) == "train")))
  lost_at = min(f["time"] for f in inject.fired(workdir) if f["kind"] == "host")
  lines = cache_lines(workdir)
  earlier = [r for r in lines if r["generation"] == lines[0]["generation"]]
  keys = ("pfs_reads", "moved_reads", "wait_s")
  base = ({k: earlier[-1][f"total/{k}"] for k in keys} if earlier else dict.fromkeys(keys, 0))
  base_time = earlier[-1]["time"] if earlier else None
  per_epoch, prev, prev_time = [], base, base_time
  for r in lines[len(earlier):]:
    now = {k: r[f"total/{k}"] for k in keys}
    per_epoch.append({"epoch": int(r["epoch"]), **{k: now[k] - prev[k] for k in keys},
                      "seconds": round(r["time"] - prev_time, 2) if prev_time else None})
    prev, prev_time = now, r["time"]
  moved = total["records_moved_in"]
  return {
      "records": len(manifest), "ideal_moved": round(len(manifest) / len(HOSTS), 1),
      "records_moved": moved, "moved_train_records": moved_train,
      "moved_over_ideal": round(moved / (len(manifest) / len(HOSTS)), 4),
      "moved_reads": total["moved_reads"],
      "reads_per_moved_record": round(total["moved_reads"] / moved, 4) if moved else None,
      "reads_per_moved_train_record_per_epoch": [
          round(r["moved_reads"] / moved_train, 4) if moved_train else None for r in per_epoch],
      "pfs_reads_total": total["pfs_reads"],
      "pfs_reads_after_loss": int(total["pfs_reads"] - base["pfs_reads"]),
      "pfs_reads_after_loss_in_epochs": int(sum(r["pfs_reads"] for r in per_epoch)),
      "recache_s": total["recache_s"], "wait_s": total["wait_s"],
      "epochs_after_loss": per_epoch, "hosts": cache["hosts"],
      "restarts": summary["fault_tolerance"]["restarts"],
      "exactly_once": summary["fault_tolerance"]["exactly_once"],
      "train_seconds_after_loss": round(lines[-1]["time"] - lost_at, 2) if lines else None,
      "test_accuracy": summary["test"]["accuracy"],
  }


def write_markdown(results: dict, path: str, args) -> None:
  rows = ["| variant | moved / ideal | reads per moved record | per moved training record, by epoch | "
          "shared-storage reads after loss | of them re-replication | epoch seconds after loss "
          "| waited s |",
          "|---|---|---|---|---|---|---|---|"]
  for name, r in results.items():
    secs = ", ".join(f"{e['seconds']:.1f}" for e in r["epochs_after_loss"]
                     if e["seconds"] is not None)
    per = ", ".join(f"{x:g}" for x in r["reads_per_moved_train_record_per_epoch"])
    rows.append(f"| {name} | {r['moved_over_ideal']:.3f} | {r['reads_per_moved_record']} | "
                f"{per} | {r['pfs_reads_after_loss']} | "
                f"{r['pfs_reads_after_loss'] - r['moved_reads']} | {secs} | {r['wait_s']:.2f} |")
  with open(path, "w") as f:
    f.write(f"# Cache under host loss ({args.patients} patients, 3 hosts -> 2 when epoch "
            f"{args.lose_at_epoch} starts, {args.epochs} epochs)\n\n")
    f.write("\n".join(rows) + "\n\n")
    f.write("Reads per moved record count every shared-storage read of a record that moved to "
            "a new owner, over the rest of the run (training epochs and the final evaluation). "
            "Epochs after the loss are counted from the chief's last epoch-end line before it; "
            "the first of them includes detection, recovery and any re-run steps. With r = 2 "
            "the survivors also restore a second copy of each record (re-replication, in the "
            "background): reads of records that did not move.\n")


def plot(results: dict, prefix: str) -> list[str]:
  names = list(results)
  fig = plots.Figure(figsize=(10, 4))
  ax_reads, ax_time = fig.subplots(1, 2)
  width = 0.8 / len(names)
  for i, name in enumerate(names):
    per = results[name]["epochs_after_loss"]
    x = np.array([r["epoch"] for r in per]) + (i - len(names) / 2 + 0.5) * width
    ax_reads.bar(x, [r["pfs_reads"] for r in per], width, label=name)
    secs = [(r["epoch"], r["seconds"]) for r in per if r["seconds"] is not None]
    ax_time.plot([e for e, _ in secs], [s for _, s in secs], marker="o", label=name)
  ax_reads.set_xlabel("epoch")
  ax_reads.set_ylabel("records read from shared storage")
  ax_reads.set_title("shared-storage reads per epoch after the loss")
  ax_reads.legend()
  ax_time.set_xlabel("epoch")
  ax_time.set_ylabel("seconds")
  ax_time.set_title("epoch wall time")
  ax_time.legend()
  fig.tight_layout()
  path = f"{prefix}_epochs.png"
  fig.savefig(path, dpi=120)
  return [path]


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
  parser.add_argument("--config", default="configs/quickstart.py")
  parser.add_argument("--patients", type=int, default=3000)
  parser.add_argument("--epochs", type=int, default=4)
  parser.add_argument("--lose-at-epoch", type=int, default=1)
  parser.add_argument("--variants", default=",".join(VARIANTS))
  parser.add_argument("--out", default=os.path.join(ROOT, "experiments", "results",
                                                    "cache_study.json"))
  args = parser.parse_args()
  size = f"--config.data.synthetic.num_patients={args.patients}"
  base, common = bench_fault.synthesized("cache_study_", args.config, [size])
  common += [size, f"--config.optim.epochs={args.epochs}", "--config.data.batch_size=36",
             "--config.fault.local_hosts=3", "--config.fault.workers_per_host=1",
             "--config.fault.elastic=True", "--config.fault.host_timeout_s=3",
             "--config.evals.splits=('test',)", "--config.evals.bootstrap=50"]
  lose = f"--config.fault.inject=host@epoch={args.lose_at_epoch}:process=2"
  results = collections.OrderedDict()
  for name in args.variants.split(","):
    print(f"{name}: 3 hosts, host-2 lost when epoch {args.lose_at_epoch} starts", flush=True)
    workdir = f"{base}/{name}"
    summary = bench_fault.launch(workdir, common + VARIANTS[name] + [lose], args.config)
    results[name] = analyse(workdir, summary, "modulo" if name == "modulo" else "bounded")
    r = results[name]
    print(f"  moved {r['records_moved']} records ({r['moved_over_ideal']:.3f}x ideal), "
          f"{r['reads_per_moved_record']} shared-storage reads per moved record, "
          f"{r['pfs_reads_after_loss']} reads after the loss, epochs after it "
          f"{[e['seconds'] for e in r['epochs_after_loss']]} s",
          flush=True)
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  prefix = os.path.splitext(args.out)[0]
  out = {"config": vars(args), "workdirs": base, "variants": results,
         "targets": {"moved_over_ideal": 1.05, "reads_per_moved_record": {
             "medjax": 1, "redirect": "one per remaining epoch", "r2": 0}},
         "plots": plot(results, prefix)}
  with open(args.out, "w") as f:
    json.dump(out, f, indent=2)
  write_markdown(results, prefix + ".md", args)
  with open(prefix + ".md") as f:
    print(f.read())
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
