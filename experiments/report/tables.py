"""The report's numbers (report.json) and tables (report.md), each beside the seed paper's value
and labelled measured (on this machine, in this report's runs), reused (a committed result in
experiments/results/, named) or simulated."""

from __future__ import annotations

import math

from experiments.report import measure

# The lineage paper's tables (../shared/papers/fault-tolerant-multimodal-training.txt).
PAPER_I = {"No checkpoint": {"time": "72h", "failures": 3, "waste": "100%", "overhead": "0%"},
           "Epoch-level": {"time": "54.0h", "failures": 2, "waste": "~40%", "overhead": "0.4%"},
           "Time-based": {"time": "31.2h", "failures": 2, "waste": "~15m", "overhead": "2.5%"},
           "Ours": {"time": "18.2h", "failures": 3, "waste": "15%", "overhead": "1.1%"}}
PAPER_II = [("4.3h", "W7", "OOM", "28s", "47s", "0.3h"), ("11.8h", "W3", "Network", "32s", "43s",
                                                          "0.5h"),
            ("16.1h", "W12", "GPU", "29s", "46s", "0.4h")]
PAPER_III = {"accuracy": 0.873, "macro_f1": 0.821, "top3_accuracy": 0.947, "rare_recall": 0.764}
PAPER_IV = {"all3": (0.892, 0.854), "any2": (0.858, 0.817), "single": (0.793, 0.742)}
IV_ROWS = (("all3", "All 3 (I,L,V)"), ("any2", "Any 2"), ("single", "Single"))
III_ROWS = (("accuracy", "Overall accuracy"), ("macro_f1", "Macro F1"),
            ("top3_accuracy", "Top-3 accuracy"), ("rare_recall", "Rare-disease recall"))


def pct(x, digits: int = 1) -> str:
  return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else \
      f"{100 * x:.{digits}f}%"


def table_one_numbers(t1: dict) -> dict:
  """Per strategy: training wall time (first step to the end), failures, waste, checkpoint
  overhead, time lost against the clean run, test accuracy, restarts, exactly-once."""
  rows = {}
  for name, label, paper in measure.STRATEGIES:
    if name not in t1["runs"]:
      continue
    s = t1["runs"][name]
    ft = s["fault_tolerance"]
    span = measure.training_span_s(s["_workdir"])
    rows[name] = {
        "label": label, "paper_row": paper,
        "training_wall_s": round(span, 2), "launch_wall_s": s["_wall_s"],
        "failures": len(ft["failures"]), "kinds": [f["kind"] for f in ft["failures"]],
        "restarts": ft["restarts"], "steps_executed": ft["steps_executed"],
        "steps_committed": ft["steps_committed"], "waste_fraction": ft["waste_fraction"],
        "checkpoint_overhead": ft["checkpoint_blocking_fraction"],
        "time_lost_s": round(span - t1["clean_span_s"], 2),
        "time_lost_fraction": round(span / t1["clean_span_s"] - 1, 4),
        "exactly_once": ft["exactly_once"], "test_accuracy": s["test"]["accuracy"],
        "commits": sum(1 for e in measure.events(s["_workdir"]) if e["event"] == "commit"),
        "workdir": s["_workdir"]}
  return {"clean_training_wall_s": round(t1["clean_span_s"], 2),
          "clean_test_accuracy": t1["clean"]["test"]["accuracy"],
          "total_steps": t1["total_steps"], "faults": t1["faults"],
          "time_interval_s": t1["time_interval_s"], "rows": rows}


def table_one_md(n: dict) -> list[str]:
  out = ["| strategy | training wall | failures | waste | checkpoint overhead | time lost | "
         "test acc. | exactly once | paper: time | fail. | waste | O/H |",
         "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|"]
  for r in n["rows"].values():
    p = PAPER_I.get(r["paper_row"] or "", {})
    out.append(
        f"| {r['label']} | {r['training_wall_s']:.1f} s | {r['failures']} | "
        f"{pct(r['waste_fraction'])} | {pct(r['checkpoint_overhead'], 2)} | "
        f"{r['time_lost_s']:+.1f} s ({pct(r['time_lost_fraction'])}) | "
        f"{r['test_accuracy']:.3f} | {r['exactly_once']} | {p.get('time', '-')} | "
        f"{p.get('failures', '-')} | {p.get('waste', '-')} | {p.get('overhead', '-')} |")
  return out


def table_two_numbers(t1: dict, strategy: str = "lineage") -> list[dict]:
  """Each failure of the lineage run: when (seconds after its first step), worker, kind,
  detection, recovery, steps lost and time lost (detection + recovery + the lost steps at the
  clean run's step time)."""
  s = t1["runs"][strategy]
  evs = measure.events(s["_workdir"])
  start = next(e["time"] for e in evs if e["event"] == "first_step")
  failure_events = [e for e in evs if e["event"] == "failure"]
  step_s = t1["clean"]["train"]["seconds"] / max(t1["total_steps"], 1)
  rows = []
  for f, event in zip(s["fault_tolerance"]["failures"], failure_events):
    # The ledger's count (the failed generation's last step to the next one's restore point);
    # without a ledger, the worker's last reported step less the newest committed when the
    # failure was seen (a lower bound).
    lost_steps = f.get("steps_lost")
    if lost_steps is None:
      lost_steps = max(int(f.get("step") or 0) - int(event.get("committed_step") or 0), 0)
    at = event["time"]
    recovered = f.get("recovered_s")
    rows.append({"time_s": round(at - start, 2), "worker": f["worker"], "host": f.get("host"),
                 "kind": f["kind"], "detected_s": f["detected_s"], "recovered_s": recovered,
                 "recovery_path": (f.get("recovery") or {}).get("path"),
                 "steps_lost": lost_steps,
                 "time_lost_s": round(f["detected_s"] + (recovered or 0) + lost_steps * step_s,
                                      2)})
  return rows


def table_two_md(rows: list[dict]) -> list[str]:
  out = ["| time | worker | failure | detection | recovery (path) | steps lost | time lost |",
         "|---:|---|---|---:|---:|---:|---:|"]
  for r in rows:
    rec = "-" if r["recovered_s"] is None else f"{r['recovered_s']:.2f} s ({r['recovery_path']})"
    who = r["host"] if r["kind"] == "host_lost" else f"W{r['worker']} ({r['host']})"
    out.append(f"| {r['time_s']:.1f} s | {who} | {r['kind']} | "
               f"{r['detected_s']:.2f} s | {rec} | {r['steps_lost']} | {r['time_lost_s']:.2f} s |")
  out += ["", "Paper (Table II, 16 workers x 8 GPUs): " + "; ".join(
      f"{t} {w} {k}: detected {d}, recovered {r}, lost {lost}" for t, w, k, d, r, lost in
      PAPER_II) + "."]
  return out


def table_three_numbers(summary: dict) -> dict:
  test, ceiling = summary["test"], summary.get("ceiling") or {}
  ci = test.get("ci95") or {}
  return {k: {"value": test.get(k), "ci95": ci.get(k), "ceiling": ceiling.get(k),
              "paper": PAPER_III[k]} for k, _ in III_ROWS} | {
      "count": test.get("count"), "not_applicable": test.get("not_applicable")}


def table_three_md(n: dict) -> list[str]:
  out = ["| metric | medjax | 95% interval | Bayes ceiling | paper |", "|---|---:|---:|---:|---:|"]
  for k, label in III_ROWS:
    r = n[k]
    ci = "-" if not r["ci95"] else f"{pct(r['ci95'][0])} - {pct(r['ci95'][1])}"
    out.append(f"| {label} | {pct(r['value'])} | {ci} | {pct(r['ceiling'])} | "
               f"{pct(r['paper'])} |")
  return out


def table_four_md(summary: dict, ablation: dict | None) -> list[str]:
  test, ceiling = summary["test"], summary.get("ceiling") or {}
  out = ["| modalities | test records | accuracy | macro F1 | ceiling acc. | ceiling F1 | paper "
         "acc. | paper F1 |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
  for key, label in IV_ROWS:
    r = (test.get("table_iv") or {}).get(key) or {}
    c = (ceiling.get("table_iv") or {}).get(key) or {}
    pa, pf = PAPER_IV[key]
    out.append(f"| {label} | {r.get('count', 0)} | {pct(r.get('accuracy'))} | "
               f"{pct(r.get('macro_f1'))} | {pct(c.get('accuracy'))} | {pct(c.get('macro_f1'))} "
               f"| {pct(pa)} | {pct(pf)} |")
  if ablation:
    agg = ablation["aggregate"]["policies"]
    out += ["", f"Missing-modality ablation ({ablation['config']}, {ablation['patients']:,} "
            f"patients, {ablation['epochs']} epochs, seeds {ablation['seeds']}; test accuracy, "
            "mean over seeds +- std and [95% interval of the mean, t with n - 1 degrees of "
            "freedom]; one split):", "",
            "| policy | overall | " + " | ".join(label for _, label in IV_ROWS) + " |",
            "|---|---:|" + "---:|" * len(IV_ROWS)]
    for policy, a in agg.items():
      cells = [a["overall"]["accuracy"]] + [a["table_iv"][k]["accuracy"] for k, _ in IV_ROWS]
      out.append(f"| {policy} | " + " | ".join(_mean_interval(c) for c in cells) + " |")
    paired = ablation["aggregate"].get("paired_vs_learned") or {}
    if paired:
      out += ["", "Learned minus each other policy, paired by seed (same initialisation and data "
              "order): the difference in test accuracy:", "",
              "| learned minus | overall | " + " | ".join(label for _, label in IV_ROWS) + " |",
              "|---|---:|" + "---:|" * len(IV_ROWS)]
      for policy, d in paired.items():
        cells = [d["overall"]["accuracy"]] + [d[k]["accuracy"] for k, _ in IV_ROWS]
        out.append(f"| {policy} | " + " | ".join(_mean_interval(c) for c in cells) + " |")
  return out


def _mean_interval(c: dict) -> str:
  """'80.2% +- 0.2% [79.7, 80.7]' from ablation_missing's mean_std (older results: no interval)."""
  text = f"{pct(c['mean'])} +- {pct(c['std'])}"
  if c.get("ci95"):
    text += f" [{100 * c['ci95'][0]:.1f}, {100 * c['ci95'][1]:.1f}]"
  return text


def cache_md(cache_sim: dict | None, cache_study: dict | None) -> list[str]:
  out = []
  if cache_sim:
    cfg = cache_sim["config"]
    out += [f"Load distribution when one of {cfg['hosts']:,} hosts leaves ({cfg['records']:,} "
            f"records, {cfg['records_per_host']:g} per host; {cfg['trials']} trials):", "",
            "| placement | receivers | max/mean load after | records moved / ideal |",
            "|---|---:|---:|---:|"]
    for name, m in cache_sim["methods"].items():
      s = m["summary"]
      out.append(f"| {name} | {s.get('receivers_mean', float('nan')):.1f} | "
                 f"{s.get('max_over_mean_after_mean', float('nan')):.4f} | "
                 f"{s.get('moved_over_ideal_mean', float('nan')):.3f} |")
  if cache_study:
    out += ["", f"A real run that loses one of 3 hosts ({cache_study['config']['patients']:,} "
            f"patients, {cache_study['config']['epochs']} epochs; shared-storage reads after the "
            "loss):", "",
            "| variant | records moved | moved / ideal | shared-storage reads after the loss | "
            "reads per moved record | training after the loss | exactly once |",
            "|---|---:|---:|---:|---:|---:|---|"]
    for name, v in cache_study["variants"].items():
      out.append(f"| {name} | {v.get('records_moved', '-')} | {v.get('moved_over_ideal', '-')} "
                 f"| {v.get('pfs_reads_after_loss', '-')} | {v.get('reads_per_moved_record', '-')}"
                 f" | {v.get('train_seconds_after_loss', '-')} s | {v.get('exactly_once', '-')} |")
  return out
