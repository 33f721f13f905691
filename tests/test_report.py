"""`python -m experiments.report` at its tiny scale, end to end: real supervised runs with four
injected failures under two checkpoint strategies, the tables beside the paper's, the simulator
calibrated by what the runs measured, the PNGs."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_tiny_report_measures_simulates_and_labels_every_table(tmp_path):
  out, workdir = tmp_path / "report", tmp_path / "runs"
  argv = [sys.executable, "-m", "experiments.report", "--scale=tiny", "--strategies=none,lineage",
          f"--out={out}", f"--workdir={workdir}"]
  proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  report = json.loads((out / "report.json").read_text())

  one = report["table_i"]
  assert one["source"] == "measured" and list(one["rows"]) == ["none", "lineage"]
  for row in one["rows"].values():
    # The same four failures, recovered, with no partition skipped or trained twice.
    assert sorted(row["kinds"]) == ["crash", "hang", "host_lost", "oom"], row
    assert row["exactly_once"] is True and row["restarts"] == 4
  none, lineage = one["rows"]["none"], one["rows"]["lineage"]
  assert none["commits"] == 1 and lineage["commits"] > 1   # 'none' saves only the end
  assert none["steps_executed"] > lineage["steps_committed"]

  # The lost host's place was taken by a spare agent under its name (fault.local_spares).
  run = workdir / "faulty-lineage"
  registered = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()
                if '"agent_registered"' in line]
  assert [e["host"] for e in registered] == ["host-0"]
  assert "a spare agent takes its place (0 spare(s) left)" in (workdir / "faulty-lineage.log"
                                                              ).read_text()

  two = report["table_ii"]["rows"]
  assert [r["kind"] for r in two] == ["crash", "hang", "oom", "host_lost"]
  assert all(r["detected_s"] > 0 and r["recovered_s"] > 0 for r in two), two
  assert report["table_iii"]["accuracy"]["paper"] == 0.873
  assert report["ablation"]["source"].startswith("reused: experiments/results/ablation_missing")
  sim = report["simulation"]
  assert sim["inputs"]["costs"]["medjax"]["sources"]["checkpoint_s"].startswith("measured: ")
  assert {r["workers"] for r in sim["sweep"]["medjax"]["llama3"]} == {4, 64, 16384}
  assert "wall_s" in sim["validation_report"]["lineage"]["measured"]
  load = report["cache"]["load"]["methods"]
  assert load["bounded (medjax)"]["only_departed_moved"] and not load["modulo"][
      "only_departed_moved"]

  text = (out / "report.md").read_text()
  for heading in ("## Table I", "## Table II and Fig. 3", "## Table III", "## Table IV",
                  "## Tables V-VI", "## FT-Cache"):
    assert heading in text
  assert "| No checkpoint |" in text and "| 72h | 3 | 100% | 0% |" in text
  for png in ("table1_strategies.png", "fig3_loss_curve.png", "fig4_per_class_f1.png",
              "sim_goodput.png"):
    assert (out / png).stat().st_size > 10_000, png
  assert (out / "simulation.md").exists()
