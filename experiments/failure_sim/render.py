"""What the simulator writes: failure_sim.md's tables (`markdown`), the PNGs (`figures`), and
the JSON cleaning (`_finite`)."""

from __future__ import annotations

import math

import numpy as np

from experiments.failure_sim import inputs

# --- The tables, figures and files --------------------------------------------------------

LEFT_OUT = (
    "stragglers and step-time variance (a synchronous step waits for the slowest worker)",
    "correlated failures (a switch or power domain taking many hosts at once, a bad node "
    "failing again after it rejoins) and failures while the job is down or restoring",
    "communication and parallel efficiency (strong scaling is perfect here)",
    "checkpoint and recovery costs growing with scale: write contention, storage bandwidth, "
    "restore and jax.distributed start-up time on many hosts",
    "at scale, the async write time of a save (it commits when its blocking part ends; the "
    "validation replay models it), and the CPU its background write takes from training",
    "data-loader warm-up and cache refill after a restart or a host change; the first compile",
    "elastic shrinking, waiting for a replacement machine, back-off after repeated failures",
    "silent data corruption and loss spikes that force a rollback past the last checkpoint",
    "evaluation passes")


def _finite(obj):
  """JSON without NaN or Infinity (None instead), floats rounded."""
  if isinstance(obj, dict):
    return {k: _finite(v) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return [_finite(v) for v in obj]
  if isinstance(obj, (float, np.floating)):
    return round(float(obj), 6) if math.isfinite(obj) else None
  if isinstance(obj, np.integer):
    return int(obj)
  if isinstance(obj, np.bool_):
    return bool(obj)
  return obj


def _hours(h) -> str:
  if h is None:
    return "never"
  return f"{h:,.1f} h" if h < 1e6 else f"{h:.0e} h (never)"


def _goodput(r: dict) -> str:
  return f"{r['goodput']:.3f}" if r["goodput"] >= 0.001 else "<0.001"


def _pct(x) -> str:
  return "-" if x is None else f"{100 * x:.2f}%"


def goodput_table(rows: list[dict]) -> str:
  """Workers down, strategies across: simulated goodput."""
  names = list(dict.fromkeys(r["strategy"] for r in rows))
  by = {(r["strategy"], r["workers"]): r for r in rows}
  lines = ["| workers | job MTBF | " + " | ".join(names) + " |",
           "|---:|---:|" + "---:|" * len(names)]
  for w in sorted({r["workers"] for r in rows}):
    cells = [_goodput(by[n, w]) for n in names]
    lines.append(f"| {w:,} | {by[names[0], w]['job_mtbf_h']:,.2f} h | " + " | ".join(cells)
                 + " |")
  return "\n".join(lines)


def detail_table(rows: list[dict]) -> str:
  lines = ["| strategy | workers | time to train | goodput | waste | checkpoint overhead | "
           "downtime | failures | accelerator-hours | cost | method |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
  for r in rows:
    ok = r["time_h"] is not None and r["time_h"] < 1e6
    lines.append(
        f"| {r['strategy']} | {r['workers']:,} | {_hours(r['time_h'])} | {_goodput(r)} | "
        f"{_pct(r['waste_fraction'])} | {_pct(r['checkpoint_overhead'])} | "
        f"{_pct(r['downtime_fraction'])} | "
        + (f"{r['failures']:,.1f} | {r['accelerator_hours']:,.0f} | ${r['cost_usd']:,.0f}"
           if ok else "- | - | -") + f" | {r['method']} |")
  return "\n".join(lines)


def _inputs_md(result: dict) -> list[str]:
  lines = ["| input | value | label |", "|---|---|---|"]
  for cn, c in result["inputs"]["costs"].items():
    values = {"checkpoint_s": c["checkpoint_s"],
              **{f"detect_s.{k}": v for k, v in c["detect_s"].items()},
              **{f"recover_s.{k}": v for k, v in c["recover_s"].items()}}
    for k, v in values.items():
      used = " (used)" if k == f"recover_s.{c['recovery_path']}" else ""
      lines.append(f"| costs {cn}: {k}{used} | {v:.4g} s | {c['sources'].get(k, '-')} |")
  for rn, r in result["inputs"]["rates"].items():
    mix = ", ".join(f"{k} {v:.3f}" for k, v in r["mix"].items())
    lines.append(f"| rate {rn}: MTBF per accelerator | {r['accelerator_mtbf_h']:,.0f} h | "
                 f"{r['source']} |")
    lines.append(f"| rate {rn}: mix | {mix} | {r['mix_source']} |")
  j = result["inputs"]["job"]
  lines.append(f"| job {j['name']} | {j['epochs']} epochs x {j['partitions_per_epoch']} "
               f"partitions x {j['partition_steps']} steps of {j['step_s']:.1f} s | "
               f"{j['source']} |")
  cfg = result["config"]
  lines.append(f"| price | ${cfg['price']:.2f} per accelerator-hour | {cfg['price_source']} |")
  lines.append(f"| time strategy interval | {cfg['time_interval_s'] / 60:g} min | "
               f"{cfg['time_interval_source']} |")
  return lines


def _exchange_md(ex: dict | None) -> list[str]:
  """Table V with each mode's all-reduce, and the weak-scaling table beside the GPU step."""
  if not ex:
    return []
  i = ex["inputs"]
  workers = [r["workers"] for r in next(iter(ex["table_v"].values()))]
  out = ["## Table V with communication, per gradient mode and link (simulated)", "",
         f"Every step adds its share of one ring all-reduce of {i['bytes'] / 1e6:,.1f} MB "
         f"({i['bytes_source']}) between workers: every step in 'sync', every H steps in "
         f"'local'; {i['ring']}. Costs {i['costs']}, rate {i['rate']}. Links: "
         + "; ".join(f"{v['name']}: {v['source']}" for v in i["links"].values()) + ".", "",
         "| mode | link | " + " | ".join(f"eff. {w}" for w in workers) + " | exchange share "
         f"at {workers[-1]} |", "|---|---|" + "---:|" * (len(workers) + 1)]
  paper = [inputs.PAPER_TABLE_V.get(w, {}).get("efficiency") for w in workers]
  out.append("| paper | - | " + " | ".join(_pct(p) for p in paper) + " | - |")
  for key, rows in ex["table_v"].items():
    mode, every, link = key.split(" ")
    out.append(f"| {mode if mode == 'sync' else f'{mode} {every}'} | {link} | "
               + " | ".join(_pct(r["efficiency"]) for r in rows)
               + f" | {_pct(rows[-1]['comm_share'])} |")
  weak_workers = list(next(iter(ex["weak"]))["by_workers"])
  out += ["", "The paper-scale job's steps are long (its 18.2 h over 800 steps: 82 s at 16 "
          "workers), so its exchange is small beside them. medjax's own step is not: "
          f"beside the measured step of {1000 * i['step_s']:.1f} ms ({i['step_source']}), "
          "each worker keeping its batch of 512 (weak scaling), efficiency = step / (step + "
          "exchange):", "",
          "| mode | link | " + " | ".join(f"eff. {w}" for w in weak_workers)
          + f" | exchange at {weak_workers[-1]} | MB sent per step |",
          "|---|---|" + "---:|" * (len(weak_workers) + 2)]
  for r in ex["weak"]:
    last = r["by_workers"][weak_workers[-1]]
    out.append(f"| {r['mode']}{' H=' + str(r['every']) if r['mode'] == 'local' else ''} | "
               f"{r['link']} | " + " | ".join(_pct(r["by_workers"][w]["efficiency"])
                                            for w in weak_workers)
               + f" | {last['exchange_ms']:,.1f} ms | {last['sent_mb_per_step']:,.1f} |")
  return out


def markdown(result: dict) -> str:
  """failure_sim.md: the inputs with their labels, then every table (all simulated)."""
  cfg = result["config"]
  out = ["# Failures and checkpoints at scale (simulated; Tables V-VI of the lineage paper)", "",
         f"`python -m experiments.failure_sim` ({cfg['trials']} Monte Carlo trials per row, "
         f"seed {cfg['seed']}, {result['wall_s']} s). Every number in the tables below is "
         "**simulated**; every input is labelled *measured on this machine*, *published: "
         "source* or *assumption*. Sweep: " + cfg["sweep_scaling"] + ".", "",
         "## Inputs", "", *_inputs_md(result), ""]
  for cn, by_rate in result["sweep"].items():
    for rn, rows in by_rate.items():
      out += [f"## Goodput (simulated): costs {cn}, failure rate {rn}", "",
              goodput_table(rows), ""]
  first_c, first_r = next(iter(result["sweep"])), next(iter(result["sweep"][next(iter(
      result["sweep"]))]))
  rows = result["sweep"][first_c][first_r]
  out += [f"## Per strategy and worker count (simulated): costs {first_c}, rate {first_r}", "",
          detail_table(rows), ""]
  top = max(cfg["workers"])
  out += [f"## At {top:,} workers (simulated goodput)", "",
          "| costs | rate | " + " | ".join(dict.fromkeys(r["strategy"] for r in rows)) + " |",
          "|---|---|" + "---:|" * len(dict.fromkeys(r["strategy"] for r in rows))]
  for cn, by_rate in result["sweep"].items():
    for rn, rs in by_rate.items():
      cells = [_goodput(r) for r in rs if r["workers"] == top]
      out.append(f"| {cn} | {rn} | " + " | ".join(cells) + " |")
  out += ["", "## Table V beside the paper (simulated: lineage strategy, strong scaling of the "
          "paper-scale job from 16 workers, 8 GPUs per worker)", "",
          "| workers | paper time | sim. time | paper speedup | sim. speedup | paper eff. | "
          "sim. eff. | paper O/H | sim. O/H | costs | rate |",
          "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
  for cn, by_rate in result["table_v"].items():
    for rn, rs in by_rate.items():
      for r in rs:
        p = r["paper"] or {}
        out.append(f"| {r['workers']} | {p.get('time_h', '-')} h | {r['time_h']:.1f} h | "
                   f"{p.get('speedup', '-')} | {r['speedup']:.2f} | {_pct(p.get('efficiency'))} | "
                   f"{_pct(r['efficiency'])} | {_pct(p.get('overhead'))} | {_pct(r['overhead'])} "
                   f"| {cn} | {rn} |")
  out += ["", "Simulated efficiency counts failure and checkpoint losses only (no "
          "communication model; the next table adds it); the paper's includes communication "
          "and stragglers.", ""] + _exchange_md(result.get("exchange")) + ["",
          "## Table VI beside the paper (simulated: 16 workers x 8 GPUs, the paper-scale job, "
          f"${cfg['price']:.2f} per GPU-hour)", "",
          "| strategy | paper approach | paper GPU-h | paper cost | sim. GPU-h | sim. cost | "
          "costs | rate |", "|---|---|---:|---:|---:|---:|---|---|"]
  for cn, by_rate in result["table_vi"].items():
    for rn, rs in by_rate.items():
      for r in rs:
        p = r["paper"] or {}
        sim = (f"{r['accelerator_hours']:,.0f} | ${r['cost_usd']:,.0f}"
               if r["time_h"] is not None and r["time_h"] < 1e6 else "never | -")
        paper = (f"{p['approach']} | {p['gpu_hours']:,} | ${p['cost']:,}" if p else "- | - | -")
        out.append(f"| {r['strategy']} | {paper} | {sim} | {cn} | {rn} |")
  out += ["", "## Young/Daly interval vs medjax's choices (seconds of training between saves)",
          "", f"Young: sqrt(2 C M) ({inputs.YOUNG}); Daly: {inputs.DALY}. C = the costs' "
          "checkpoint time; M = the job's MTBF at that worker count (one accelerator per "
          "worker).", ""]
  for cn, by_rate in result["intervals"].items():
    for rn, rs in by_rate.items():
      jobs = [k for k in rs[0] if isinstance(rs[0][k], dict)]
      head = " | ".join(f"{j} partition | {j} every-k" for j in jobs)
      out += [f"costs {cn}, rate {rn}:", "", f"| workers | MTBF | Young | Daly | {head} |",
              "|---:|---:|---:|---:|" + "---:|---:|" * len(jobs)]
      for r in rs:
        cells = " | ".join(f"{r[j]['partition_s']:,.1f} | " + (
            f"{r[j]['every_k_s']:,.1f}" if r[j]["every_k_s"] else "-") for j in jobs)
        out.append(f"| {r['workers']:,} | {r['job_mtbf_h']:,.2f} h | {r['young_s']:,.1f} | "
                   f"{r['daly_s']:,.1f} | {cells} |")
      out.append("")
  v = result["validation"]
  out += ["## Validation against a measured run (quickstart, 3 injected failures)", ""]
  if "error" in v:
    out += [f"Not run: {v['error']}", ""]
  else:
    out += ["| number | measured | simulated | relative error | within "
            f"{100 * v['tolerance']:g}% |", "|---|---:|---:|---:|---|"]
    for k, m in v["measured"].items():
      out.append(f"| {k} | {m:.5g} | {v['simulated'][k]:.5g} | "
                 f"{100 * v['relative_error'][k]:+.1f}% | {v['within_tolerance'][k]} |")
    out += [""] + [f"- {k}: {s}" for k, s in v["inputs"]["sources"].items()]
    out += [f"- note: {n}" for n in v.get("notes", [])] + [""]
  out += ["## What the simulator leaves out", ""] + [f"- {x}" for x in result["left_out"]]
  return "\n".join(out) + "\n"


def figures(result: dict) -> dict:
  """'goodput' and 'waste' vs workers, one panel per (costs, rate), a line per strategy."""
  from matplotlib import figure  # pylint: disable=import-outside-toplevel
  panels = [(cn, rn, rows) for cn, by in result["sweep"].items() for rn, rows in by.items()]
  figs = {}
  for key, label in (("goodput", "goodput (simulated)"),
                     ("waste_fraction", "waste fraction (simulated)")):
    cols = min(2, len(panels))
    rows_ = math.ceil(len(panels) / cols)
    fig = figure.Figure(figsize=(5.5 * cols, 3.8 * rows_), layout="constrained")
    axes = fig.subplots(rows_, cols, squeeze=False).ravel()
    for ax, (cn, rn, rows) in zip(axes, panels):
      for name in dict.fromkeys(r["strategy"] for r in rows):
        rs = [r for r in rows if r["strategy"] == name]
        ax.plot([r["workers"] for r in rs], [r[key] for r in rs], marker="o", ms=3, label=name)
      ax.set_xscale("log", base=2)
      ax.set_ylim(0, 1.02)
      ax.set_xlabel("workers (1 accelerator each)")
      ax.set_ylabel(label)
      ax.set_title(f"costs: {cn}; failure rate: {rn}", fontsize=9)
      ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{label} vs workers, job {result['inputs']['job']['name']} at every worker "
                 "count; inputs: measured (medjax costs) or published (paper costs, rates)",
                 fontsize=10)
    figs["goodput" if key == "goodput" else "waste"] = fig
  return figs
