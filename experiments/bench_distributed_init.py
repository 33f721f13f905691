"""jax.distributed's start in a restart, with and without waiting for process 0's service to
listen, side by side; writes experiments/results/distributed_init.json.

  python -m experiments.bench_distributed_init [--repeats 5] [--processes 2]

In a restart every worker of the new generation is handed its assignment at once, so a process
other than 0 often calls jax.distributed.initialize before process 0's coordination service
listens. Its gRPC channel then fails to connect and tries again only after gRPC's initial
reconnect backoff (1 s). medjax's workers other than 0 first wait until the service's port
accepts TCP connections (`medjax.fault.protocol.wait_for_listener`). Each trial starts the
processes the way a restart does (already imported; process 0 told last, a few milliseconds
after the others, as a hand-over in process order can make it), times each process's
initialize, and takes the slowest: the generation cannot start its first step before then.
The variants alternate, `--repeats` times each.
"""

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

from medjax.fault import protocol

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHILD = """
import os, sys, time
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
os.environ["JAX_PLATFORMS"] = "cpu"
import jax
from medjax.fault import protocol
jax.config.update("jax_cpu_collectives_implementation", "gloo")
pid, n, address, wait = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4] == "1"
print("ready", flush=True)
sys.stdin.readline()          # the hand-over
t0 = time.perf_counter()
if wait and pid != 0:
  protocol.wait_for_listener(address, 60.0)
jax.distributed.initialize(address, n, pid, initialization_timeout=60,
                           coordinator_bind_address=address)
print(f"{time.perf_counter() - t0:.4f}", flush=True)
os._exit(0)
"""


def trial(n: int, wait: bool, lead_s: float) -> float:
  """The slowest process's initialize, in seconds, for one generation of `n` processes."""
  address = f"127.0.0.1:{protocol.free_port()}"
  procs = [subprocess.Popen([sys.executable, "-c", CHILD, str(p), str(n), address,
                             "1" if wait else "0"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True) for p in range(n)]
  for p in procs:
    assert p.stdout.readline().strip() == "ready"
  for p in procs[1:] + procs[:1]:   # process 0 last
    p.stdin.write("go\n")
    p.stdin.flush()
    if p is procs[-1]:
      time.sleep(lead_s)
  times = [float(p.stdout.readline()) for p in procs]
  for p in procs:
    p.wait(timeout=30)
  return max(times)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--processes", type=int, default=2)
  parser.add_argument("--lead-s", type=float, default=0.005,
                      help="how long before process 0 the others are handed their assignment")
  parser.add_argument("--out", default=os.path.join(ROOT, "experiments", "results",
                                                    "distributed_init.json"))
  args = parser.parse_args()
  runs = {"connect_at_once": [], "wait_for_listener": []}
  for r in range(args.repeats):
    for name in runs:
      runs[name].append(round(trial(args.processes, name == "wait_for_listener", args.lead_s), 4))
      print(f"  {r}: {name:<18} {runs[name][-1]:.3f} s", flush=True)
  result = {"processes": args.processes, "lead_s": args.lead_s, "runs": runs,
            "median_s": {k: float(np.median(v)) for k, v in runs.items()}}
  result["ratio_wait_over_at_once"] = round(
      result["median_s"]["wait_for_listener"] / result["median_s"]["connect_at_once"], 3)
  print(f"jax.distributed start, slowest of {args.processes} processes (median of "
        f"{args.repeats}): {result['median_s']['connect_at_once']:.3f} s connecting at once, "
        f"{result['median_s']['wait_for_listener']:.3f} s waiting for the listener "
        f"({result['ratio_wait_over_at_once']:.3f}x)")
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(result, f, indent=2)
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
