"""`python -m experiments.failure_sim`: `run` computes everything the entry point writes,
`main` parses the flags and writes the files."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from typing import Mapping, Sequence

from experiments.failure_sim import comm
from experiments.failure_sim import inputs
from experiments.failure_sim import model
from experiments.failure_sim import render
from experiments.failure_sim import validation

def run(results_dir: str = inputs.RESULTS, *, trials: int = 500, seed: int = 0,
        workers: Sequence[int] = inputs.WORKERS, price: float = inputs.PRICE,
        job: model.Job | None = None,
        costs: Mapping[str, inputs.Costs] | None = None,
        rates: Mapping[str, inputs.FailureRate] | None = None,
        time_interval_s: float = 1800.0) -> dict:
  """Everything the entry point writes, as one JSON-ready dict (see `markdown`).

  Defaults: the paper-scale job (`Job.paper_scale`), medjax's measured costs
  (`load_costs(results_dir)`) and the lineage paper's (`Costs.paper`), both failure rates
  (`RATES`), one accelerator per worker in the sweep, and the validation against
  <results_dir>/bench_fault.json.
  """
  t0 = time.perf_counter()
  job = job or model.Job.paper_scale()
  costs = dict(costs) if costs else {"medjax": inputs.load_costs(results_dir),
                                     "paper": inputs.Costs.paper()}
  rates = dict(rates) if rates else dict(inputs.RATES)
  strategies = model.default_strategies(job, time_interval_s)
  kw = {"trials": trials, "seed": seed, "price": price}
  out = {"what": "failure-and-checkpoint simulator (experiments/failure_sim): every number "
                 "under sweep, table_v, table_vi, intervals and validation.simulated is "
                 "simulated; inputs are labelled measured, published or assumption",
         "config": {"trials": trials, "seed": seed, "workers": list(workers), "price": price,
                    "price_source": inputs.PRICE_SOURCE, "time_interval_s": time_interval_s,
                    "time_interval_source": "assumption: the lineage paper gives no interval "
                                            "for its time-based strategy",
                    "sweep_scaling": "weak: the same job and failure-free time at every "
                                     "worker count; one accelerator per worker",
                    "young_daly": [inputs.YOUNG, inputs.DALY]},
         "inputs": {"job": dataclasses.asdict(job),
                    "costs": {k: dataclasses.asdict(c) for k, c in costs.items()},
                    "rates": {k: {**dataclasses.asdict(r), "mix": dict(r.mix)}
                              for k, r in rates.items()}},
         "sweep": {}, "table_v": {}, "table_vi": {}, "intervals": {}}
  for cn, c in costs.items():
    out["sweep"][cn], out["table_v"][cn], out["table_vi"][cn] = {}, {}, {}
    for rn, r in rates.items():
      out["sweep"][cn][rn] = [x.as_dict()
                              for x in model.sweep(job, c, r, strategies, workers, **kw)]
      out["table_v"][cn][rn] = model.table_v(c, r, job=job, trials=trials, seed=seed)
      out["table_vi"][cn][rn] = model.table_vi(c, r, job=job, strategies=strategies, **kw)
  try:
    measured = validation.measured_from_bench_fault(os.path.join(results_dir, "bench_fault.json"))
    out["validation"] = validation.validate(measured)
    jobs = [job, measured.job]
  except (ValueError, OSError) as e:
    out["validation"] = {"error": str(e)}
    jobs = [job]
  for cn, c in costs.items():
    out["intervals"][cn] = {rn: model.intervals(c, r, jobs, workers) for rn, r in rates.items()}
  out["exchange"] = exchange(results_dir, job, next(iter(costs.values())),
                             next(iter(rates.values())), trials=trials, seed=seed)
  out["left_out"] = list(render.LEFT_OUT)
  out["wall_s"] = round(time.perf_counter() - t0, 1)
  return render._finite(out)


def exchange(results_dir: str, job: model.Job, costs: inputs.Costs, rate: inputs.FailureRate,
             **kwargs) -> dict:
  """Table V with each gradient mode's exchange over each link (`comm`), and the same
  exchanges beside the measured GPU step under weak scaling."""
  nbytes, bytes_source = comm.load_bytes(results_dir)
  step, step_source = comm.step_s(results_dir)
  table_v = {}
  for mode, every in comm.MODES:
    for key, link in comm.LINKS.items():
      ex = comm.Exchange(mode, nbytes, link, every)
      table_v[f"{mode} H={every} {key}"] = model.table_v(costs, rate, job=job, exchange=ex,
                                                           **kwargs)
  return {"inputs": {"bytes": nbytes, "bytes_source": bytes_source, "step_s": step,
                     "step_source": step_source, "ring": comm.RING, "costs": costs.name,
                     "rate": rate.name,
                     "links": {k: dataclasses.asdict(v) for k, v in comm.LINKS.items()}},
          "table_v": table_v, "weak": comm.weak_scaling(step, nbytes, (2, 4, 8, 16, 32))}


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--trials", type=int, default=500,
                      help="Monte Carlo runs per row (the rare failures of small worker "
                           "counts make 'none' noisy below a few hundred)")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--price", type=float, default=inputs.PRICE, help="$ per accelerator-hour")
  parser.add_argument("--workers", default=",".join(map(str, inputs.WORKERS)))
  parser.add_argument("--results", default=inputs.RESULTS, help="where the measured JSON files are")
  parser.add_argument("--out", default=inputs.RESULTS)
  args = parser.parse_args(argv)
  try:
    workers = [int(w) for w in args.workers.split(",") if w]
  except ValueError:
    parser.error(f"--workers {args.workers!r}: write comma-separated integers, e.g. 4,8,16")
  if not workers or min(workers) < 1 or args.trials < 1:
    parser.error("--workers needs counts >= 1 and --trials >= 1")
  result = run(args.results, trials=args.trials, seed=args.seed, workers=workers,
               price=args.price)
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "failure_sim.json"), "w") as f:
    json.dump(result, f, indent=1)
  with open(os.path.join(args.out, "failure_sim.md"), "w") as f:
    f.write(render.markdown(result))
  for name, fig in render.figures(result).items():
    fig.savefig(os.path.join(args.out, f"failure_sim_{name}.png"), dpi=110)
  first = next(iter(result["sweep"]))
  for rn, rows in result["sweep"][first].items():
    print(f"goodput (simulated), costs {first}, failure rate {rn}:")
    print(render.goodput_table(rows))
  v = result["validation"]
  if "error" not in v:
    print("validation vs bench_fault.json: " + ", ".join(
        f"{k} {v['simulated'][k]:.4g} simulated vs {m:.4g} measured "
        f"({100 * v['relative_error'][k]:+.1f}%)" for k, m in v["measured"].items()))
  print(f"wrote failure_sim.json, .md, _goodput.png, _waste.png in {args.out} "
        f"({result['wall_s']} s)")
  return result
