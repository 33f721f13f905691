"""The end of a supervised run: summary.json's fault_tolerance block and the loss curve's marks.

docs/fault-tolerance.md, "What the summary numbers mean", says what each key means. The
coordinator calls `write_summary` once every worker exited 0, with its policy's state and the
lineage store.
"""

from __future__ import annotations

import json
import os

import numpy as np

from medjax import jsonl
from medjax import lineage as lineage_lib
from medjax import paths
from medjax.data import manifest as manifest_lib
from medjax.fault import run_state
from medjax.runtime import ledger

_FAILURE_KEYS = ("kind", "worker", "step", "detected_s", "recovered_s", "generation", "host")
# A recovery's phases in the order they happen (medjax.runtime.phases names the worker's).
WORKER_PHASES = ("handover", "process_start", "distributed_init", "data_setup", "data_takeover",
                 "model_build", "compile", "restore", "first_step")


def recovery(events: list[dict], failure: run_state.Failure) -> dict | None:
  """How a failure's recovery went, from events.jsonl: the path (warm_standby, standby,
  relaunch) and seconds per phase, from detection to the next generation's first step.

  stop: detection -> the generation's workers gone; backoff: -> the next generation started;
  agent: -> its agent handed a worker the generation; then the worker's own phases
  (`medjax.runtime.phases`) of its slowest process; report: its first step -> the coordinator
  heard of it; other: the rest of `recovered_s` (the worker's time between its phases).
  """
  after = [e for e in events if e.get("time", 0) >= failure.t_detect - 1e-3]
  find = lambda name, test: next((e for e in after if e["event"] == name and test(e)), None)
  started = find("generation_start", lambda e: e.get("generation", 0) > failure.generation)
  if started is None:
    return None
  gen = started["generation"]
  stopped = find("generation_stopped", lambda e: e.get("generation") == failure.generation)
  first = find("first_step", lambda e: e.get("generation") == gen)
  reports = sorted((e for e in after if e["event"] == "generation_phases"
                    and e.get("generation") == gen), key=lambda e: e.get("process_id", 0))
  # The first step waits for every process: the slowest one's phases are the recovery's.
  report = max(reports, key=lambda e: e.get("total_s") or 0.0) if reports else {}
  parts: dict[str, float] = {}
  if stopped is not None and stopped["time"] <= started["time"]:
    parts["stop"] = stopped["time"] - failure.t_detect
    parts["backoff"] = started["time"] - stopped["time"]
  else:
    parts["stop_and_backoff"] = started["time"] - failure.t_detect
  if report.get("assigned_at"):
    parts["agent"] = report["assigned_at"] - started["time"]
  for name in WORKER_PHASES:
    if name in report.get("phases", {}):
      parts[name] = report["phases"][name]
  stepped = [e["first_step_at"] for e in reports if e.get("first_step_at")]
  if first is not None and stepped:
    parts["report"] = first["time"] - min(stepped)
  if failure.recovered_s is not None:
    parts["other"] = failure.recovered_s - sum(parts.values())
  return {"path": report.get("path", "unknown"), "generation": gen,
          "process": report.get("process_id"),
          "phases_s": {k: round(max(v, 0.0) if k == "other" else v, 3)
                       for k, v in parts.items()},
          "compile_cache": report.get("compile_cache"),
          "restored_from": report.get("restored") or None,
          "prepared_ahead_s": report.get("prepared") or None,
          "paths_by_process": {str(e.get("process_id")): e.get("path") for e in reports},
          **({"phases_by_process": {str(e.get("process_id")): e.get("phases") for e in reports}}
             if len(reports) > 1 else {})}


def _steps_lost(by_gen: dict[int, list[int]], generation: int) -> dict:
  """From the ledger: the last step the failed generation executed, the step the next one
  resumed after (its first step - 1) and the steps thrown away between them; {} without a
  ledger or when either generation executed none."""
  failed = by_gen.get(generation)
  later = [g for g in sorted(by_gen) if g > generation and by_gen[g]]
  if not failed or not later:
    return {}
  last, resumed = max(failed), by_gen[later[0]][0] - 1
  return {"last_step": last, "resumed_step": resumed, "steps_lost": max(last - resumed, 0)}


def train_rows(run: paths.RunPaths) -> np.ndarray:
  """The training split's manifest rows, which the exactly-once check covers. The manifest
  alone (json and numpy): loading the whole ingest imported pandas and pydicom, about 1 s
  between the last worker's exit and the end of the run."""
  return manifest_lib.Manifest.load(run.manifest).indices("train")


def fault_tolerance(run: paths.RunPaths, state: run_state.State,
                    store: lineage_lib.LineageStore, train: np.ndarray | None = None) -> dict:
  """The summary's fault_tolerance block: failures, restarts, waste, checkpoint overhead, and the
  ledger's exactly-once check of the committed steps (over `train`, the training split's rows,
  read from the manifest if not given)."""
  final = store.latest()
  final_step, final_epoch = (final.global_step, final.epoch) if final else (0, 0)
  stats = state.gen_stats.values()
  # The ledger has every step a generation dispatched; progress reports miss those after a
  # SIGKILLed or SIGSTOPped worker's last report, so they count waste short.
  by_gen = ledger.steps_by_generation(run.workdir)
  executed = sum(len(by_gen[int(gen)]) if int(gen) in by_gen else int(g.get("executed", 0))
                 for gen, g in state.gen_stats.items())
  blocked = sum(float(g.get("blocked_s", 0.0)) for g in stats)
  writes = sum(int(g.get("writes", 0)) for g in stats)
  write_s = sum(float(g.get("write_s", 0.0)) for g in stats)
  training = sum(float(g.get("training_s", 0.0)) for g in stats)
  check = ledger.exactly_once(run.workdir, final_step,
                              train_rows(run) if train is None else train, final_epoch)
  events = jsonl.read(run.events) if os.path.exists(run.events) else []
  failures = []
  for f in state.failures:
    entry = {k: getattr(f, k) for k in _FAILURE_KEYS}
    entry["recovery"] = recovery(events, f)
    entry.update(_steps_lost(by_gen, f.generation))
    failures.append(entry)
  return {
      "failures": failures,
      "restarts": max(state.generation - 1, 0),
      "steps_executed": executed,
      "steps_committed": int(final_step),
      "waste_fraction": round(max(executed - final_step, 0) / max(executed, 1), 5),
      "executed_from": "ledger" if by_gen else "progress reports (no ledger: a lower bound)",
      "checkpoint_blocking_fraction": round(blocked / training, 5) if training else None,
      # An async save's write on the saver thread, to finalized on disk: a failure before it
      # ends loses the steps the save would have kept.
      "checkpoint_write_s": round(write_s / writes, 4) if writes else None,
      "exactly_once": check["exactly_once"],
      "exactly_once_detail": check,
      "generations": state.gen_stats,
  }


def plot_marks(run: paths.RunPaths, state: run_state.State) -> list[dict]:
  """Failures (at the step each one hit) and recoveries (at the first step after), for the plot."""
  marks = [{"kind": "failure", "step": f.step, "time": f.t_detect} for f in state.failures]
  marks += [{"kind": "recovered", "step": e["step"], "time": e.get("time")}
            for e in jsonl.read(run.events) if e["event"] == "recovered"]
  return marks


def write_summary(run: paths.RunPaths, state: run_state.State,
                  store: lineage_lib.LineageStore, train: np.ndarray | None = None) -> dict:
  """Adds the fault_tolerance block to summary.json and redraws the loss curve with the marks
  (the chief worker drew every plot already; without failures there is nothing to mark)."""
  summary = {}
  if os.path.exists(run.summary):
    with open(run.summary) as f:
      summary = json.load(f)
  summary["fault_tolerance"] = fault_tolerance(run, state, store, train)
  with open(run.summary, "w") as f:
    json.dump(summary, f, indent=2, default=float)
  marks = plot_marks(run, state)
  if marks:
    # Imported here: plotting takes seconds to import, which a restarted coordinator should not
    # wait for before it serves the agents again.
    from medjax import monitor_plots  # pylint: disable=import-outside-toplevel
    from medjax import plots  # pylint: disable=import-outside-toplevel
    from medjax.train import writers  # pylint: disable=import-outside-toplevel
    rows = writers.read_metrics(run.workdir)
    if rows:
      figure = plots.loss_curve(rows, marks)
      figure.savefig(run.plot("loss_curve"), dpi=110, bbox_inches="tight")
      plots.close({"loss_curve": figure})
      if any(r.get("kind") == "monitor" for r in rows):
        monitor_plots.plot_monitor(rows, marks, run.plot("monitor"))
  return summary
