"""The next epoch planned on the planning thread against on the training thread, side by side.

  python -m experiments.bench_plan_ahead [--records 53420] [--partitions 16] [--batch 512]
      [--step-ms 8.8] [--epochs 6] [--rounds 2]

`medjax.train.planned.PlannedSteps` over a paper-size manifest (sampled without pixels: 53,420
records, one host), each step a sleep of `--step-ms` (an H100's bfloat16 step of configs/paper.py)
standing in for the device, batches that cost nothing to read: what is left of each step is the
training thread's own time. Reported per side: the training thread's milliseconds a step, and
the milliseconds it spent getting each next epoch's plan (`PlannedSteps._planned`).
"""

import argparse
import json
import os
import time
import types

import ml_collections
import numpy as np

from medjax.data import partition as partition_lib
from medjax.data import synthetic
from medjax.data.cache import placement as placement_lib
from medjax.train import planned

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


class _Data:
  def __init__(self, manifest, placement, partitions: int, batch: int):
    self.manifest, self.placement, self.partitions, self.batch = (manifest, placement,
                                                                  partitions, batch)

  def plan(self, epoch: int, base_N=None):
    del base_N   # every epoch here starts a segment with nothing processed
    return partition_lib.plan_epoch(self.manifest, self.placement, seed=0, epoch=epoch,
                                    num_partitions=self.partitions, host_batch_size=self.batch)


class _Reader:
  """Batches that cost nothing to read: the training thread's own time is what is measured."""

  def local_rows(self, step):
    return step[0]

  def read(self, rows):
    return {"x": np.zeros(1, np.float32), "row": rows}


def walk(data, *, epochs: int, step_s: float, ahead: bool) -> dict:
  """The loop's walk over PlannedSteps (a step, read_ahead, the cursor moved), each step asleep
  for `step_s`; the training thread's time per step and per next-epoch plan."""
  config = ml_collections.ConfigDict({"data": {"batch_size": data.batch, "prefetch": "inline"}})
  prepared = types.SimpleNamespace(config=config, reader=_Reader(), batch_sharding=object(),
                                   data=data)
  cursor = types.SimpleNamespace(epoch=0, partition=0, offset=0, base_N=None, stopped=False,
                                 global_step=0)
  steps = planned.PlannedSteps(prepared, cursor, epochs, on_partition=lambda *a: None,
                               plan_ahead=ahead)
  waits = []
  planned_fn = steps._planned   # pylint: disable=protected-access

  def timed(epoch):
    t0 = time.perf_counter()
    try:
      return planned_fn(epoch)
    finally:
      waits.append(time.perf_counter() - t0)
  steps._planned = timed   # pylint: disable=protected-access
  n, t0 = 0, time.perf_counter()
  for step in steps:
    if step.batch is not None:
      time.sleep(step_s)
      steps.read_ahead()
      cursor.offset += 1
      n += 1
    if step.ends_partition:
      cursor.partition, cursor.offset = cursor.partition + 1, 0
      if cursor.partition == step.num_partitions:
        cursor.epoch, cursor.partition = cursor.epoch + 1, 0
  wall = time.perf_counter() - t0
  return {"steps": n, "ms_per_step": round(1e3 * wall / n, 3),
          "host_ms_per_step": round(1e3 * wall / n - 1e3 * step_s, 3),
          "next_plan_ms": [round(1e3 * w, 3) for w in waits]}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--records", type=int, default=53_420)
  parser.add_argument("--partitions", type=int, default=16)
  parser.add_argument("--batch", type=int, default=512)
  parser.add_argument("--step-ms", type=float, default=8.8)
  parser.add_argument("--epochs", type=int, default=6)
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--out", default=os.path.join(RESULTS, "bench_plan_ahead.json"))
  args = parser.parse_args()
  manifest = synthetic.manifest_without_pixels(args.records, seed=7)
  data = _Data(manifest, placement_lib.place(manifest, ["host-0"], seed=3), args.partitions,
               args.batch)
  sides = {"planning thread": [], "training thread": []}
  for _ in range(args.rounds):   # alternated
    for side, ahead in (("planning thread", True), ("training thread", False)):
      sides[side].append(walk(data, epochs=args.epochs, step_s=args.step_ms / 1e3, ahead=ahead))
  host = {side: float(np.median([r["host_ms_per_step"] for r in runs]))
          for side, runs in sides.items()}
  result = {"date": time.strftime("%Y-%m-%d"), "cpu_count": os.cpu_count(),
            "records": args.records, "partitions": args.partitions, "host_batch": args.batch,
            "step_ms": args.step_ms, "epochs": args.epochs, "sides": sides,
            "host_ms_per_step_median": host,
            "host_time_ratio": round(host["training thread"] / max(host["planning thread"], 1e-9),
                                     2)}
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(result, f, indent=1)
  for side, runs in sides.items():
    plans = [ms for r in runs for ms in r["next_plan_ms"]]
    print(f"{side}: the training thread's {host[side]:.3f} ms a step beside the "
          f"{args.step_ms} ms step; next epoch's plan {np.median(plans):.2f} ms (median), "
          f"{max(plans):.2f} ms at most")
  print(f"host time a step, planning inline over planning ahead: {result['host_time_ratio']}x; "
        f"wrote {args.out}")


if __name__ == "__main__":
  main()
