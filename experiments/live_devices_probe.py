"""Can the survivors of a multi-process JAX job go on without a relaunch? A probe of JAX's
recoverability features (jax_enable_recoverability, multihost_utils.live_devices); writes
experiments/results/live_devices.json.

  python -m experiments.live_devices_probe [--processes 3] [--platform cpu|gpu]

N processes join one jax.distributed job (CPU: one device each, gloo collectives; GPU: one GPU each,
NCCL, or, where there are fewer GPUs than processes, GPUs shared round-robin without preallocation,
which NCCL may refuse: the result says what happened) with recoverability on, agree on the live
devices once, and the last process exits hard (os._exit, as a crash). The survivors then run a
collective over every device (the dead one's included, as a training step in flight would), catch
the ProcessFailureError that live_devices raises, agree on the devices left, and run the collective
over those. Recorded: how long the in-flight collective took to fail, how long the new agreement
took, and whether the survivors' collective gave the right answer.

What it found on CPU (jax 0.10.2, 2 cores, 3 processes): the collective that includes the dead
process blocks for gloo's 30 s timeout before live_devices reports the failure; after that the
survivors agree in under 1 s and compute over the 2 live devices correctly, without a relaunch.
So on CPU a relaunch from the newest committed checkpoint (medjax's path, 2-8 s) is faster than
surviving in place. On GPU, NCCL communicators can be aborted when a peer fails, which is what
the feature is built for: `experiments/tests/test_live_devices.py` runs this probe where two or
more GPUs are present and expects the survivors to go on within 10 s. On one H200 shared by two
processes (jax 0.11.2, experiments/results/gpu_h200/live_devices.json) the survivor's collective
was still blocked 35 s after the crash; one GPU cannot say what two do.
"""

import argparse
import faulthandler
import json
import os
import subprocess
import sys
import time

from medjax.fault import layout
from medjax.fault import protocol

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def worker(pid: int, n: int, port: int, platform: str, heartbeat_s: int, dump_s: float) -> None:
  faulthandler.dump_traceback_later(dump_s, exit=False)   # where a stuck process is stuck
  if platform == "cpu":
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
    os.environ["JAX_PLATFORMS"] = "cpu"
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
  if platform == "cpu":
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.config.update("jax_enable_recoverability", True)
  jax.distributed.initialize(f"127.0.0.1:{port}", n, pid, heartbeat_timeout_seconds=heartbeat_s)

  def total(devices) -> float:
    mesh = jax.sharding.Mesh(devices, ("d",))
    x = jax.device_put(jnp.ones(len(devices)),
                       jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("d")))
    return float(jax.jit(lambda a: a.sum())(x))

  out = {"process": pid}
  with multihost_utils.live_devices(jax.devices()) as devices:
    out["devices_at_start"] = len(devices)
  if pid == n - 1:
    time.sleep(1.0)
    os._exit(1)  # pylint: disable=protected-access  # a crash: no clean-up, no goodbye
  time.sleep(3.0)
  t0 = time.monotonic()
  for attempt in range(5):
    try:
      with multihost_utils.live_devices(jax.devices()) as devices:
        out.setdefault("agreed_s", []).append(round(time.monotonic() - t0, 3))
        value = total(devices)
      out.update(live_devices=len(devices), total=value, expected=float(len(devices)),
                 survived_s=round(time.monotonic() - t0, 3), attempts=attempt + 1)
      break
    except Exception as e:  # pylint: disable=broad-except  (ProcessFailureError, or gloo's)
      out.setdefault("errors", []).append(
          {"after_s": round(time.monotonic() - t0, 3), "error": f"{type(e).__name__}: {e}"[:300]})
      time.sleep(0.5)
  print("RESULT " + json.dumps(out), flush=True)
  if pid != 0:
    os._exit(0)  # pylint: disable=protected-access
  time.sleep(2.0)  # process 0 holds the distributed service: the others leave first
  os._exit(0)  # pylint: disable=protected-access


def probe(processes: int = 3, platform: str = "cpu", heartbeat_s: int = 3,
          timeout_s: float = 180.0) -> dict:
  """Runs the probe; returns what the survivors recorded."""
  port = protocol.free_port()
  gpus = layout.accelerators(environ={})[1] if platform == "gpu" else 0
  procs = []
  for pid in range(processes):
    env = dict(os.environ)
    if platform == "gpu":
      env.pop("JAX_PLATFORMS", None)   # the tests pin CPU for themselves
      env.pop("XLA_FLAGS", None)
      env["CUDA_VISIBLE_DEVICES"] = str(pid % max(gpus, 1))
      if processes > gpus:
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    procs.append(subprocess.Popen(
        [sys.executable, "-m", "experiments.live_devices_probe", "--worker", str(pid),
         f"--processes={processes}", f"--port={port}", f"--platform={platform}",
         f"--heartbeat-s={heartbeat_s}", f"--timeout-s={timeout_s}"], env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT))
  t0 = time.monotonic()
  survivors, silent = [], []
  for pid, p in enumerate(procs):
    try:
      stdout, stderr = p.communicate(timeout=max(timeout_s - (time.monotonic() - t0), 1.0))
    except subprocess.TimeoutExpired:
      p.kill()
      stdout, stderr = p.communicate()
    results = [json.loads(line[len("RESULT "):]) for line in
               stdout.decode(errors="replace").splitlines() if line.startswith("RESULT ")]
    survivors += results
    if not results and pid != processes - 1:   # the last one is the crash
      silent.append({"process": pid, "exit_code": p.returncode,
                     "stderr_tail": stderr.decode(errors="replace")[-2000:]})
  import jax  # pylint: disable=import-outside-toplevel
  return {"platform": platform, "processes": processes, "gpus": gpus,
          "jax": jax.__version__, "heartbeat_timeout_s": heartbeat_s,
          "survivors": survivors, "silent": silent,
          "went_on": len(survivors) == processes - 1 and all(
              s.get("total") == s.get("expected") for s in survivors),
          "wall_s": round(time.monotonic() - t0, 1)}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--processes", type=int, default=3)
  parser.add_argument("--platform", choices=("cpu", "gpu"), default="cpu")
  parser.add_argument("--heartbeat-s", type=int, default=3)
  parser.add_argument("--timeout-s", type=float, default=180.0)
  parser.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
  parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
  parser.add_argument("--out", default=os.path.join(ROOT, "experiments", "results",
                                                    "live_devices.json"))
  args = parser.parse_args()
  if args.worker is not None:
    worker(args.worker, args.processes, args.port, args.platform, args.heartbeat_s,
           max(args.timeout_s - 10, 5))
    return
  result = probe(args.processes, args.platform, args.heartbeat_s, args.timeout_s)
  print(json.dumps(result, indent=2))
  with open(args.out, "w") as f:
    json.dump(result, f, indent=2)
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
