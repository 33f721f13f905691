"""Ingest of a cohort holding hostile DICOM inputs: peak memory, exit code and each file's fate.

  python -m experiments.bench_ingest_hostile [--patients 300] [--quickstart-patients 6000]

1. A small synthetic cohort plus every hostile input of tests/hostile.py (a JPEG-LS file that
   aborts gdcm, a 1.2 KB RLE file claiming 65535 x 65535, a JPEG 2000 SIZ claiming 40000 x
   40000, a 1 MB deflate bomb inflating to 1.1 GB, a 4.5 MB RLE image of 12000 x 12000 zeros
   that takes ~3 GB to decode, FIFO, socket, /dev/zero and escaping symlinks, a directory
   loop, a duplicate instance, inconsistent BitsAllocated, a 2 GB sparse file) is ingested with
   `launch.py --config.mode=ingest` (scan, manifest, placement, cache fill) in a subprocess,
   once with config.data.isolate_decoding='compressed' (the default) and once with 'none'
   (decoders in the ingest process, as before). The process tree's RSS (decoder children
   included) is sampled every 10 ms (psutil); also reported: each process's own peak (VmHWM) for
   the ingest process and its decoder children, their sum (a bound on the tree while decoding),
   and the largest single process's peak (exact, getrusage of the reaped tree). Target with
   isolation: exit 0, tree peak < 2 GB.
2. Isolation overhead on the quickstart cohort (configs/quickstart.py, 6000 patients): the same
   ingest with 'compressed' and with 'none', alternated, side by side; reports wall time and the
   cache's decode seconds.

Writes experiments/results/ingest_hostile.json.
"""

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time

import psutil

from configs import quickstart
from medjax.data import synthetic
from tests import hostile

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
MB = 1 << 20
# Runs the command given as its arguments; writes its exit code and the largest peak RSS of any
# process of its tree (getrusage of reaped descendants) to the file named first.
_WRAPPER = ("import json, resource, subprocess, sys\n"
            "rc = subprocess.call(sys.argv[2:])\n"
            "peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024\n"
            "json.dump({'rc': rc, 'largest_process_peak': peak}, open(sys.argv[1], 'w'))\n")


def _hwm(proc: psutil.Process) -> int:
  """The process's own peak RSS so far (VmHWM), in bytes."""
  with open(f"/proc/{proc.pid}/status") as f:
    for line in f:
      if line.startswith("VmHWM:"):
        return int(line.split()[1]) * 1024
  return 0


def measure(cmd: list[str], tmp: str, interval_s: float) -> dict:
  """Runs `cmd`, sampling its process tree's memory every `interval_s`."""
  out_file = os.path.join(tmp, f"wrapper-{time.monotonic_ns()}.json")
  err_file = open(out_file + ".stderr", "w+b")  # a file, not a pipe nobody reads while it runs
  t0 = time.perf_counter()
  wrapper = subprocess.Popen([sys.executable, "-c", _WRAPPER, out_file, *cmd], cwd=REPO,
                             stdout=subprocess.DEVNULL, stderr=err_file)
  root = psutil.Process(wrapper.pid)
  peak_sum, hwm, decoders, ingest_pid = 0, {}, set(), None
  while wrapper.poll() is None:
    try:
      procs = [root] + root.children(recursive=True)
      ingest_pid = ingest_pid or next((c.pid for c in root.children()), None)
    except psutil.Error:
      break
    total = 0
    for p in procs:
      try:
        total += p.memory_info().rss
        hwm[p.pid] = max(hwm.get(p.pid, 0), _hwm(p))
        if "medjax.data.dicom.decoder_child" in p.cmdline():
          decoders.add(p.pid)
      except (psutil.Error, OSError):
        pass
    peak_sum = max(peak_sum, total)
    time.sleep(interval_s)
  wrapper.wait()
  seconds = time.perf_counter() - t0
  err_file.seek(0)
  stderr = err_file.read().decode(errors="replace")
  err_file.close()
  with open(out_file) as f:
    result = json.load(f)
  ingest_peak = hwm.get(ingest_pid, 0)
  decoder_peak = max([hwm[p] for p in decoders], default=0)
  return {"exit_code": result["rc"], "seconds": round(seconds, 2),
          "tree_peak_rss_mb": round(peak_sum / MB, 1),
          "largest_process_peak_rss_mb": round(result["largest_process_peak"] / MB, 1),
          "ingest_process_peak_rss_mb": round(ingest_peak / MB, 1),
          "decoder_peak_rss_mb": round(decoder_peak / MB, 1),
          # Decoding runs one child at a time in an ingest, after the scan's worker processes
          # have exited: the tree cannot hold more than the ingest process's and one child's
          # peaks together then.
          "tree_bound_mb": round((ingest_peak + decoder_peak) / MB, 1),
          "decoder_processes_started": len(decoders), "stderr_tail": stderr[-600:]}


def ingest_cmd(root: str, workdir: str, config: str, isolate: str) -> list[str]:
  return [sys.executable, "launch.py", "--config", config, "--config.mode=ingest",
          f"--config.data.root={root}", f"--workdir={workdir}",
          f"--config.data.isolate_decoding={isolate}"]


def _read_jsonl(path: str) -> list[dict]:
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def outcomes(workdir: str, expected: dict, exit_code: int) -> dict:
  """Each hostile file's fate in this run: quarantined (stage, reason), ingested, or lost."""
  found = {q["path"]: q for q in _read_jsonl(os.path.join(workdir, "ingest", "quarantine.jsonl"))}
  found.update({q["path"]: q for q in _read_jsonl(
      os.path.join(workdir, "cache", "host-0", "decode_quarantine.jsonl"))})
  out = {}
  for path, (stage, reason) in sorted(expected.items()):
    q = found.get(path)
    got = ({"stage": q["stage"], "reason": q["reason"]} if q
           else {"stage": "ingested" if exit_code == 0 else "lost",
                 "reason": "" if exit_code == 0 else f"the ingest process died ({exit_code})"})
    got["as_expected"] = got["stage"] == stage and got["reason"].startswith(reason)
    out[path] = got
  return out


def hostile_part(tmp: str, patients: int) -> dict:
  config = quickstart.get_config("tiny")
  config.data.synthetic.num_patients = patients
  root = os.path.join(tmp, "hostile_cohort")
  synthetic.generate(config.data.synthetic, root)
  # A labelled patient whose only images are the hostile files that pass the scan, so that all
  # of them are decoded (a record decodes at most config.data.max_images files).
  labels = os.path.join(root, "labels.csv")
  with open(labels) as f:
    diagnosis = next(csv.DictReader(f))["diagnosis"]
  with open(labels, "a") as f:
    f.write(f"HOSTILE-1,{diagnosis}\n")
  expected = hostile.add_to_cohort(root, os.path.join(tmp, "outside"), "HOSTILE-1")
  runs = {}
  for isolate in ("compressed", "none"):
    workdir = os.path.join(tmp, f"hostile_{isolate}")
    run = measure(ingest_cmd(root, workdir, "configs/quickstart.py:tiny", isolate), tmp, 0.01)
    run["files"] = outcomes(workdir, expected, run["exit_code"])
    report = os.path.join(workdir, "ingest", "report.json")
    if os.path.exists(report):
      with open(report) as f:
        cache = json.load(f)["cache"]["host-0"]
      run["records_decoded"] = cache["records_written"]
      run["rejected_at_decode"] = cache["rejected_at_decode"]
    runs[isolate] = run
  return {"patients": patients, "hostile_files": len(expected), "runs": runs}


def overhead_part(tmp: str, patients: int, repeats: int) -> dict:
  config = quickstart.get_config()
  config.data.synthetic.num_patients = patients
  root = os.path.join(tmp, "quickstart_cohort")
  t0 = time.perf_counter()
  synthetic.generate(config.data.synthetic, root)
  generate_s = time.perf_counter() - t0
  runs = {"compressed": [], "none": []}
  for k in range(repeats):
    for isolate in (("compressed", "none") if k % 2 == 0 else ("none", "compressed")):
      workdir = os.path.join(tmp, f"quickstart_{isolate}_{k}")
      # Sampled rarely: on a small machine a 10 ms sampler would slow the ingest it times.
      run = measure(ingest_cmd(root, workdir, "configs/quickstart.py", isolate), tmp, 0.5)
      with open(os.path.join(workdir, "ingest", "report.json")) as f:
        report = json.load(f)
      cache = report["cache"]["host-0"]
      runs[isolate].append({"seconds": run["seconds"], "exit_code": run["exit_code"],
                            "ingest_s": report["ingest"].get("seconds"),
                            "decode_s": round(cache["decode_s"], 2),
                            "records": cache["records_written"], "files": cache["pfs_files"],
                            "tree_peak_rss_mb": run["tree_peak_rss_mb"],
                            "decoder_processes_started": run["decoder_processes_started"]})
  best = {m: min(r["seconds"] for r in rs) for m, rs in runs.items()}
  decode = {m: min(r["decode_s"] for r in rs) for m, rs in runs.items()}
  return {"patients": patients, "generate_s": round(generate_s, 1), "repeats": repeats,
          "runs": runs, "best_seconds": best, "best_decode_s": decode,
          "wall_ratio_compressed_over_none": round(best["compressed"] / best["none"], 3),
          "decode_ratio_compressed_over_none": round(decode["compressed"] / decode["none"], 3)}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--patients", type=int, default=300)
  parser.add_argument("--quickstart-patients", type=int, default=6000)
  parser.add_argument("--repeats", type=int, default=2)
  parser.add_argument("--out", default=os.path.join(REPO, "experiments", "results",
                                                    "ingest_hostile.json"))
  args = parser.parse_args()
  with tempfile.TemporaryDirectory() as tmp:
    result = {"hostile": hostile_part(tmp, args.patients),
              "overhead": overhead_part(tmp, args.quickstart_patients, args.repeats)}
  result["machine"] = {"cpus": os.cpu_count(),
                       "memory_gb": round(psutil.virtual_memory().total / 2**30, 1)}
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(result, f, indent=2)

  h = result["hostile"]["runs"]
  print(f"hostile cohort: {result['hostile']['patients']} patients + "
        f"{result['hostile']['hostile_files']} hostile inputs")
  print(f"{'isolate_decoding':<18}{'exit':>6}{'tree peak MB':>14}{'ingest MB':>11}"
        f"{'decoder MB':>12}{'bound MB':>10}{'seconds':>9}")
  for mode, r in h.items():
    print(f"{mode:<18}{r['exit_code']:>6}{r['tree_peak_rss_mb']:>14.0f}"
          f"{r['ingest_process_peak_rss_mb']:>11.0f}{r['decoder_peak_rss_mb']:>12.0f}"
          f"{r['tree_bound_mb']:>10.0f}{r['seconds']:>9.1f}")
  print("\nfile (isolate_decoding='compressed')    stage     reason")
  for path, o in h["compressed"]["files"].items():
    mark = "" if o["as_expected"] else "  <-- UNEXPECTED"
    print(f"  {path[len('dicom/hostile/'):]:<28}{o['stage']:<10}{o['reason'][:90]}{mark}")
  o = result["overhead"]
  print(f"\nquickstart cohort ({o['patients']} patients), best of {o['repeats']}: ingest "
        f"{o['best_seconds']['compressed']:.1f} s isolated vs {o['best_seconds']['none']:.1f} s "
        f"in-process (x{o['wall_ratio_compressed_over_none']}); cache decode "
        f"{o['best_decode_s']['compressed']:.1f} s vs {o['best_decode_s']['none']:.1f} s "
        f"(x{o['decode_ratio_compressed_over_none']})")
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
