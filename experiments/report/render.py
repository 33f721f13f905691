"""report.md: every table with the seed's value beside medjax's and what each number is."""

from __future__ import annotations

from experiments import failure_sim
from experiments.report import cache
from experiments.report import tables

LEGEND = ("Every number is labelled: **measured** (by this report's runs on this machine), "
          "**reused** (a committed result in experiments/results/, named with the commit that "
          "wrote it) or **simulated** (experiments/failure_sim, with labelled inputs). The "
          "paper's numbers are from 16 workers x 8 GPUs, 53,420 real patients and 72 h runs; "
          "medjax's from a synthetic cohort on one CPU machine, so the comparable quantities are "
          "the fractions (waste, overhead, time lost) and the shape of each table, not the hours.")


def _sim_md(sim: dict) -> list[str]:
  out = []
  top = max(sim["config"]["workers"])
  rows = sim["sweep"]["medjax"]
  names = list(dict.fromkeys(r["strategy"] for r in next(iter(rows.values()))))
  out += [f"Goodput (failure-free time / wall time) at {top:,} workers, per strategy "
          "(simulated):", "", "| costs | failure rate | " + " | ".join(names) + " |",
          "|---|---|" + "---:|" * len(names)]
  for cn, by_rate in sim["sweep"].items():
    for rn, rs in by_rate.items():
      # pylint: disable-next=protected-access
      cells = [failure_sim._goodput(r) for r in rs if r["workers"] == top]
      out.append(f"| {cn} | {rn} | " + " | ".join(cells) + " |")
  first_rate = next(iter(rows))
  out += ["", f"Goodput by worker count (simulated; medjax's measured costs, failure rate "
          f"{first_rate}):", "", failure_sim.goodput_table(rows[first_rate]), "",
          "Table VI beside the paper (simulated: 16 workers x 8 GPUs, the paper-scale job, "
          f"${sim['config']['price']:.2f} per GPU-hour):", "",
          "| strategy | paper approach | paper GPU-h | paper cost | sim. GPU-h | sim. cost | costs "
          "| rate |", "|---|---|---:|---:|---:|---:|---|---|"]
  for cn, by_rate in sim["table_vi"].items():
    for rn, rs in by_rate.items():
      for r in rs:
        p = r["paper"] or {}
        s = (f"{r['accelerator_hours']:,.0f} | ${r['cost_usd']:,.0f}"
             if r["time_h"] is not None and r["time_h"] < 1e6 else "never | -")
        paper = f"{p['approach']} | {p['gpu_hours']:,} | ${p['cost']:,}" if p else "- | - | -"
        out.append(f"| {r['strategy']} | {paper} | {s} | {cn} | {rn} |")
  out += ["", "Table V (simulated, lineage strategy, strong scaling from 16 workers) is in "
          "simulation.md with the Young/Daly intervals against medjax's partition-boundary and "
          "every-k choices, every input and its source, and what the simulator leaves out.", ""]
  out += ["Validation: the simulator replays this report's lineage runs (same plan, checkpoint "
          "policy, failures at the steps the ledger says each failed generation reached, each "
          "with its measured detection and recovery, the measured step and save blocking time; "
          "each save's async write time drawn from the run's measured writes, since whether the "
          "last save is committed when a failure comes is a race at this scale: the simulated "
          "value is the mean over the draws, p10-p90 their spread); target: within 20%.", "",
          "| run | number | measured | simulated | p10-p90 | relative error | within 20% |",
          "|---|---|---:|---:|---:|---:|---|"]
  for run, v in sim["validation_report"].items():
    if "error" in v:
      out.append(f"| {run} | not validated: {v['error']} | | | | | |")
      continue
    for k, m in v["measured"].items():
      band = v.get("simulated_p10_p90", {}).get(k)
      band = f"{band[0]:.4g} - {band[1]:.4g}" if band else "-"
      out.append(f"| {run} | {k} | {m:.4g} | {v['simulated'][k]:.4g} | {band} | "
                 f"{100 * v['relative_error'][k]:+.1f}% | {v['within_tolerance'][k]} |")
  return out


def markdown(report: dict, lineage: dict, ablation: dict | None, cache_study: dict | None,
             sim: dict) -> str:
  scale, one = report["scale"], report["table_i"]
  out = [f"# medjax: the seeds' tables regenerated ({scale['name']} scale)", "",
         f"`python -m experiments.report --scale {scale['name']}` on {report['machine']['cpus']} "
         f"CPU cores ({report['machine']['platform']}), {report['written']}, code "
         f"{report['code']}; {report['wall_s'] / 60:.1f} min"
         + (f" (reused runs: {', '.join(report['reused_runs'])})" if report["reused_runs"] else "")
         + ".", "", LEGEND, "",
         "## Table I: checkpoint strategies under the same failures (measured)", "",
         f"{scale['config']}: {one['total_steps']} global steps; the same four failures in "
         f"every run (`{one['faults']}`: a worker crash, a hang, an out-of-memory error and a "
         "lost host, replaced by a spare agent) under each `config.ckpt.strategy`; time-based "
         f"saves every {one['time_interval_s']} s (a tenth of the clean run's training). Training "
         "wall: first step to the end, failures included; time lost: against the same run "
         f"without failures or checkpoints ({one['clean_training_wall_s']} s, test accuracy "
         f"{one['clean_test_accuracy']:.3f}); waste: steps executed and thrown away / steps "
         "executed (counted in the ledger, which has every step a failed worker ran); "
         "overhead: time blocked in checkpoint calls / training time. Async saves go on "
         "writing after they stop blocking; a failure before a save's write is finalized "
         "loses the steps it would have kept, so a fault at a partition's end can cost two "
         "partitions.", "",
         *tables.table_one_md(one), "",
         "![Table I](table1_strategies.png)", "",
         "## Table II and Fig. 3: the lineage run's failures (measured)", "",
         *tables.table_two_md(report["table_ii"]["rows"]), "",
         "![Fig. 3](fig3_loss_curve.png)", "",
         "## Table III: test metrics of the lineage run (measured)", "",
         f"{lineage['test'].get('count')} test patients; 95% intervals by bootstrap; the Bayes "
         "ceiling is the synthetic cohort's generating model on the same records.", "",
         *tables.table_three_md(report["table_iii"]), "",
         "## Table IV: by available modalities (measured) and the missing-modality ablation "
         f"({report['ablation']['source']})", "",
         *tables.table_four_md(lineage, ablation), "",
         "![Fig. 4](fig4_per_class_f1.png)", "",
         "## Tables V-VI: failures at scale (simulated, calibrated by measurement)", "",
         *_sim_md(sim), "",
         "## FT-Cache: load distribution and a lost host", "",
         *cache.load_study_md(report["cache"]["load"]), "",
         f"Source of the table below: {report['cache']['lost_host_run']['source']}.",
         *tables.cache_md(None, cache_study), ""]
  return "\n".join(out) + "\n"
