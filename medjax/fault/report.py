"""The end of a supervised run: summary.json's fault_tolerance block and the loss curve's marks.

README.md, "What the summary numbers mean", says what each key means. The coordinator calls
`write_summary` once every worker exited 0, with its policy's state and the lineage store.
"""

from __future__ import annotations

import json
import os

from medjax import jsonl
from medjax import lineage as lineage_lib
from medjax import paths
from medjax.data import ingest
from medjax.fault import ledger
from medjax.fault import policy as policy_lib

_FAILURE_KEYS = ("kind", "worker", "step", "detected_s", "recovered_s", "generation", "host")


def fault_tolerance(run: paths.RunPaths, state: policy_lib.State,
                    store: lineage_lib.LineageStore) -> dict:
  """The summary's fault_tolerance block: failures, restarts, waste, checkpoint overhead, and the
  ledger's exactly-once check of the committed steps."""
  final = store.latest()
  final_step, final_epoch = (final.global_step, final.epoch) if final else (0, 0)
  stats = state.gen_stats.values()
  executed = sum(int(g.get("executed", 0)) for g in stats)
  blocked = sum(float(g.get("blocked_s", 0.0)) for g in stats)
  training = sum(float(g.get("training_s", 0.0)) for g in stats)
  manifest = ingest.load(run.workdir).manifest
  check = ledger.exactly_once(run.workdir, final_step, manifest.indices("train"), final_epoch)
  return {
      "failures": [{k: getattr(f, k) for k in _FAILURE_KEYS} for f in state.failures],
      "restarts": max(state.generation - 1, 0),
      "steps_executed": executed,
      "steps_committed": int(final_step),
      "waste_fraction": round(max(executed - final_step, 0) / max(executed, 1), 5),
      "checkpoint_blocking_fraction": round(blocked / training, 5) if training else None,
      "exactly_once": check["exactly_once"],
      "exactly_once_detail": check,
      "generations": state.gen_stats,
  }


def plot_marks(run: paths.RunPaths, state: policy_lib.State) -> list[dict]:
  """Failures (at the step each one hit) and recoveries (at the first step after), for the plot."""
  marks = [{"kind": "failure", "step": f.step} for f in state.failures]
  marks += [{"kind": "recovered", "step": e["step"]} for e in jsonl.read(run.events)
            if e["event"] == "recovered"]
  return marks


def write_summary(run: paths.RunPaths, state: policy_lib.State,
                  store: lineage_lib.LineageStore) -> dict:
  """Adds the fault_tolerance block to summary.json and redraws the plots with the marks."""
  # Imported here: evaluate pulls in the model and plotting (seconds), which a restarted
  # coordinator should not wait for before it serves the agents again.
  from medjax import evaluate  # pylint: disable=import-outside-toplevel
  summary = {}
  if os.path.exists(run.summary):
    with open(run.summary) as f:
      summary = json.load(f)
  summary["fault_tolerance"] = fault_tolerance(run, state, store)
  with open(run.summary, "w") as f:
    json.dump(summary, f, indent=2, default=float)
  evaluate.write_plots(run.workdir, summary, ingest.load(run.workdir).manifest.class_names,
                       events=plot_marks(run, state))
  return summary
