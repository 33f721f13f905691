"""`python -m experiments.report`: runs or reuses what the report needs, writes it (see the
package docstring)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
import subprocess
import time

from experiments import failure_sim
from experiments.report import cache
from experiments.report import figures
from experiments.report import measure
from experiments.report import render
from experiments.report import scales as scales_lib
from experiments.report import tables

RESULTS = os.path.join(measure.ROOT, "experiments", "results")


def reused_result(name: str) -> tuple[dict | None, str]:
  """A committed result in experiments/results/ and a label naming the commit that wrote it."""
  path = os.path.join(RESULTS, name)
  if not os.path.exists(path):
    return None, f"not available: {path} missing"
  commit = subprocess.run(["git", "log", "-1", "--format=%h %cs", "--", path], cwd=measure.ROOT,
                          capture_output=True, text=True).stdout.strip() or "uncommitted"
  with open(path) as f:
    return json.load(f), f"reused: experiments/results/{name} (commit {commit})"


def calibrated_costs(t1: dict, table_two: list[dict]) -> failure_sim.Costs:
  """medjax's committed costs (failure_sim.load_costs), with the checkpoint, detection and
  recovery times this report measured in its lineage runs put in their place."""
  base = failure_sim.load_costs(RESULTS, recovery_path="warm_standby")
  detect, recover, sources = dict(base.detect_s), dict(base.recover_s), dict(base.sources)
  for kind in failure_sim.KINDS:
    sources[f"detect_s.{kind}"] = "reused: " + sources.get(f"detect_s.{kind}", "-")
  by_kind, by_path = {}, {}
  for r in table_two:
    kind = failure_sim.KIND_OF.get(r["kind"])
    if kind:
      by_kind.setdefault(kind, []).append(r["detected_s"])
    if r["recovered_s"] is not None and r["recovery_path"]:
      by_path.setdefault(r["recovery_path"], []).append(r["recovered_s"])
  for kind, values in by_kind.items():
    detect[kind] = sum(values) / len(values)
    sources[f"detect_s.{kind}"] = f"measured: this report's lineage run, mean of {values}"
  for path, values in by_path.items():
    recover[path] = sum(values) / len(values)
    sources[f"recover_s.{path}"] = f"measured: this report's lineage run, mean of {values}"
  run = t1["runs"]["lineage"]
  saves = tables.table_one_numbers(t1)["rows"]["lineage"]["commits"]
  blocked = run["train"]["checkpoint_blocked_s"]
  checkpoint_s = blocked / max(saves, 1)
  sources["checkpoint_s"] = (f"measured: this report's lineage run, {blocked} s blocked over "
                             f"{saves} commits (process 0)")
  path = max(by_path, key=lambda p: len(by_path[p])) if by_path else base.recovery_path
  return failure_sim.Costs(checkpoint_s, detect, recover, path, sources, name="medjax")


def simulate(scale: scales_lib.Scale, t1: dict, table_two: list[dict]) -> dict:
  costs = {"medjax": calibrated_costs(t1, table_two), "paper": failure_sim.Costs.paper()}
  result = failure_sim.run(RESULTS, trials=scale.sim_trials, workers=scale.sim_workers,
                           costs=costs)
  validation = {}
  for name in (n for n in ("lineage", "lineage_k") if n in t1["runs"]):
    try:
      measured = failure_sim.measured_from_workdir(t1["runs"][name]["_workdir"])
      validation[name] = failure_sim.validate(measured)
    except (ValueError, KeyError, OSError) as e:
      validation[name] = {"error": str(e)}
  result["validation_report"] = validation
  return result


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--scale", default="quickstart", choices=sorted(scales_lib.SCALES))
  parser.add_argument("--out", default="", help="default: experiments/results/report for the "
                      "quickstart scale, experiments/results/report-<scale> for the others")
  parser.add_argument("--workdir", default="", help="default: /tmp/medjax_report/<scale>")
  parser.add_argument("--no-reuse", action="store_true", help="run every measured run again")
  parser.add_argument("--strategies", default=",".join(s for s, _, _ in measure.STRATEGIES),
                      help="Table I's rows (lineage is required: Tables II-IV and the "
                           "simulator's calibration come from it)")
  args = parser.parse_args(argv)
  scale = scales_lib.SCALES[args.scale]
  strategies = tuple(s.strip() for s in args.strategies.split(",") if s.strip())
  known = [s for s, _, _ in measure.STRATEGIES]
  if "lineage" not in strategies or not set(strategies) <= set(known):
    parser.error(f"--strategies {args.strategies!r}: name some of {known}, lineage included")
  workdir = args.workdir or os.path.join("/tmp/medjax_report", scale.name)
  args.out = args.out or os.path.join(
      RESULTS, "report" if scale.name == "quickstart" else f"report-{scale.name}")
  t0 = time.perf_counter()
  os.makedirs(args.out, exist_ok=True)
  runner = measure.Runner(workdir, scale, reuse=not args.no_reuse)

  measure.log(f"Table I: the same run and failures under {len(strategies)} strategies")
  t1 = measure.table_one(runner, strategies)
  one = tables.table_one_numbers(t1)
  two = tables.table_two_numbers(t1)
  lineage = t1["runs"]["lineage"]
  three = tables.table_three_numbers(lineage)
  ablation = measure.ablation(runner, os.path.join(args.out, "ablation_missing"))
  ablation_label = "measured: this report"
  if ablation is None:
    ablation, ablation_label = reused_result("ablation_missing.json")
  measure.log("FT-Cache load study")
  load = cache.load_study(trials=3 if scale.name == "tiny" else 50)
  cache_study, cache_study_label = reused_result("cache_study.json")
  measure.log("Tables V-VI: simulating")
  sim = simulate(scale, t1, two)

  for name in ("loss_curve.png", "per_class_f1.png", "accuracy_by_subset.png"):
    src = os.path.join(lineage["_workdir"], name)
    if os.path.exists(src):
      shutil.copy(src, os.path.join(args.out, {"loss_curve.png": "fig3_loss_curve.png",
                                               "per_class_f1.png": "fig4_per_class_f1.png"}.get(
                                                   name, name)))
  pngs = figures.write(args.out, one, sim)

  report = {
      "scale": dataclasses.asdict(scale), "machine": {"cpus": os.cpu_count(),
                                                      "platform": platform.platform()},
      "code": runner.fingerprint, "written": time.strftime("%Y-%m-%d %H:%M"),
      "reused_runs": runner.reused,
      "table_i": {"source": "measured", **one}, "table_ii": {"source": "measured", "rows": two},
      "table_iii": {"source": "measured (the lineage run of Table I)", **three},
      "table_iv": {"source": "measured (the lineage run of Table I)",
                   "test": lineage["test"].get("table_iv"),
                   "ceiling": (lineage.get("ceiling") or {}).get("table_iv"),
                   "by_subset": lineage["test"].get("by_subset")},
      "ablation": {"source": ablation_label,
                   "aggregate": (ablation or {}).get("aggregate")},
      "simulation": {"source": "simulated (experiments/failure_sim)", **sim},
      "cache": {"load": {"source": "measured", **load},
                "lost_host_run": {"source": cache_study_label,
                                  "variants": (cache_study or {}).get("variants")}},
      "figures": pngs, "wall_s": round(time.perf_counter() - t0, 1)}
  with open(os.path.join(args.out, "report.json"), "w") as f:
    json.dump(failure_sim._finite(report), f, indent=1)  # pylint: disable=protected-access
  with open(os.path.join(args.out, "simulation.md"), "w") as f:
    f.write(failure_sim.markdown(sim))
  with open(os.path.join(args.out, "report.md"), "w") as f:
    f.write(render.markdown(report, lineage, ablation, cache_study, sim))
  measure.log(f"wrote {args.out}/report.md, report.json and {len(pngs)} PNGs in "
              f"{report['wall_s']:.0f} s")
  return report
