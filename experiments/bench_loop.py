"""The real training loop beside the in-memory step of the same config, in one process.

  python -m experiments.bench_loop [--config quickstart] [--patients N] [--epochs 3]
      [--set model.dtype=bfloat16 --set ckpt.strategy=none ...] [--null-step]
      [--out experiments/results/bench_loop.json]

Both sides run on one `prepare` (the cohort ingested and cached, the step compiled), so they
share the compiled step and the machine:

1. In memory: the step on batches already on the device, chained (each step's state feeds the
   next) and timed to the last result: what the device sustains.
2. The loop: `medjax.train.loop.run_prepared`, the function a launch.py worker runs, with the
   config's checkpoint, snapshot, ledger, metrics and monitor settings (this process commits its
   own lineage, as an unsupervised run does; a supervised worker adds heartbeats on another
   thread). Its steps are timed where they are dispatched; the first `--warm` steps are left out.

Reported: loop efficiency (in-memory step time over the loop's time per step, i.e. loop
examples/s over in-memory examples/s), the training thread's host time per step (its time
outside waits for the device), checkpoint blocking (seconds in save calls over training
seconds; saves committed and coalesced), and where the training thread's time goes per step:
cProfile over the loop's later steps, each function's time inside the loop's own calls grouped
by what it does (reading, batch assembly and transfer, dispatch, waiting for the device, ledger,
metrics, snapshots, saves, monitor, position), and the top functions.

`--null-step` swaps the model's step for one that only touches the batch (the model's state is
kept, so saves and snapshots cost what they cost): the loop's time per step is then the host's
(the CPU proxy of a fast accelerator; experiments/tests/test_bench_loop.py bounds it).
"""

from __future__ import annotations

import argparse
import cProfile
import importlib
import json
import os
import pstats
import shutil
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from experiments import bench_train
from experiments import loop_timeline
from medjax import lineage as lineage_lib
from medjax import paths
from medjax.runtime import context
from medjax.runtime import phases as phases_lib
from medjax.train import loop as loop_lib
from medjax.train import prepare as prepare_lib
from medjax.train import state as state_lib

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")

# Where the training thread's time goes: (category, file suffix, function name). A category's
# time is its functions' cumulative time, calls among them counted once; one called from inside
# another category's (metrics written by a save) counts in both.
CATEGORIES = (
    ("dispatch (transfer on CPU)", "experiments/bench_loop.py", "__call__"),
    ("reading", "medjax/data/loader.py", "read"),
    ("batch assembly and transfer", "medjax/data/loader.py", "to_global"),
    ("ledger", "medjax/runtime/ledger.py", "write"),
    ("snapshots", "medjax/checkpoint/snapshots.py", "save"),
    ("saves", "medjax/checkpoint/saver.py", "save"),
    ("saves", "medjax/checkpoint/saver.py", "commit_finalized"),
    ("metrics", "medjax/train/reporting.py", "step"),
    ("metrics", "medjax/train/reporting.py", "write"),
    ("metrics", "medjax/train/reporting.py", "flush"),
    ("monitor", "medjax/monitor.py", "step_done"),
    ("position", "medjax/lineage.py", "step_done"),
    ("fault injection", "medjax/runtime/inject.py", "after_step"),
    ("stop requests", "medjax/runtime/context.py", "stop_requested"),
)
WAITS = ("block_until_ready", "device_get")   # jax's calls that wait for the device


def log(msg: str) -> None:
  print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def get_config(name: str, patients: int, epochs: int, overrides: list[str]):
  config = importlib.import_module(f"configs.{name}").get_config()
  if patients:
    config.data.synthetic.num_patients = patients
  config.optim.epochs = epochs
  config.evals.bootstrap = 0
  config.evals.splits = ()
  config.fault.supervised = False
  bench_train.apply_overrides(config, overrides)
  return config


def null_step(prepared):
  """A step that reads one value of each batch field and advances the state's step counter."""
  def step(state, batch):
    touch = sum(jnp.ravel(v)[0].astype(jnp.float32) for v in batch.values())
    weight = jnp.sum(batch["weight"])
    metrics = {"loss": touch * 0.0 + 1.0, "accuracy": jnp.float32(0.0), "weight": weight,
               "grad_norm": jnp.float32(0.0), "learning_rate": jnp.float32(0.0)}
    return {**state, "step": state["step"] + 1}, metrics
  return jax.jit(step, in_shardings=(prepared.built.shardings, prepared.batch_sharding),
                 out_shardings=(prepared.built.shardings, state_lib.replicated(prepared.mesh)),
                 donate_argnums=(0,))


def step_flops(prepared) -> float:
  """The model's step FLOPs (`bench_train.model_flops`, from its jaxpr: the same for every
  platform and dtype), traced on the shapes of the state and of one batch."""
  p = prepared
  state = jax.eval_shape(p.built.create)
  plan = p.data.plan(0)
  part = next(steps for steps in plan.steps if len(steps))
  _, _, batch = next(iter(prepare_lib.data_batches(p.config, p.reader, part, 0,
                                                   p.batch_sharding)))
  shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), batch)
  return bench_train.model_flops(p.train_step, state, shapes)


def in_memory(prepared, step_fn, steps: int, rounds: int) -> list[float]:
  """Seconds per step over `steps` chained steps on batches already on the device, per round."""
  p = prepared
  plan = p.data.plan(0)
  batches = []
  for part in plan.steps:
    for s, _, batch in prepare_lib.data_batches(p.config, p.reader, part, 0, p.batch_sharding):
      batches.append(jax.block_until_ready(jax.device_put(batch, p.batch_sharding)))
      if len(batches) == min(steps, 16):
        break
    if len(batches) == min(steps, 16):
      break
  state = p.built.create()
  state, metrics = step_fn(state, batches[0])   # warm
  jax.block_until_ready(metrics)
  out = []
  for _ in range(rounds):
    t0 = time.perf_counter()
    for i in range(steps):
      state, metrics = step_fn(state, batches[i % len(batches)])
    jax.block_until_ready((state, metrics))
    out.append((time.perf_counter() - t0) / steps)
  del state
  return out


class _Timed:
  """The loop's step function, recording when each step is dispatched; profiles from step
  `profile_from` on (the training thread only)."""

  def __init__(self, fn, profile_from: int, timeline: loop_timeline.Timeline, warm: int):
    self.fn, self.profile_from, self.timeline, self.warm = fn, profile_from, timeline, warm
    self.at: list[float] = []
    self.end: float | None = None
    self.profile = cProfile.Profile()

  def __call__(self, state, batch):
    self.at.append(time.perf_counter())
    if len(self.at) == self.profile_from:
      self.profile.enable()
    if len(self.at) == self.warm + 1:
      self.timeline.active = True
    self.timeline.dispatched()
    with self.timeline.span("dispatch"):
      return self.fn(state, batch)

  def stop(self) -> None:
    """The loop ended (its last step's metrics fetched): the profile stops, the clock too."""
    if self.end is None:
      self.profile.disable()
      self.timeline.active = False
      self.end = time.perf_counter()


def _fresh_run(prepared) -> None:
  """Removes a previous loop run's checkpoints, lineage and metrics, so the loop starts at 0."""
  run = paths.RunPaths(prepared.workdir, prepared.config)
  for path in (run.checkpoints, run.lineage_store, os.path.join(prepared.workdir, "ledger"),
               os.path.join(prepared.workdir, "metrics.jsonl"),
               os.path.join(prepared.workdir, "tensorboard")):
    if os.path.isdir(path):
      shutil.rmtree(path)
    elif os.path.exists(path):
      os.remove(path)


def run_loop(prepared, step_fn, *, warm: int, profile: bool) -> dict:
  """The real loop over the config's epochs; dispatch times, its summary and the profile."""
  p = prepared
  _fresh_run(p)
  run = paths.RunPaths(p.workdir, p.config)
  ctx = context.Local(lineage_lib.LineageStore(run.lineage_store), run.checkpoints,
                      p.config.ckpt.max_to_keep, keep_best=p.config.ckpt.keep_best)
  total = p.total_steps
  timeline = loop_timeline.Timeline()
  timed = _Timed(step_fn, profile_from=(warm + (total - warm) // 2) if profile else total + 1,
                 timeline=timeline, warm=warm)
  p.train_step = timed
  stop_training = loop_lib._Loop.stop_training   # pylint: disable=protected-access

  blocked = []

  def stopped(self, **kwargs):
    timed.stop()
    blocked.append(self.ckpt.blocked_s)   # in save calls while training (not the last wait)
    return stop_training(self, **kwargs)
  loop_lib._Loop.stop_training = stopped   # pylint: disable=protected-access
  try:
    with timeline.wrapped():
      summary = loop_lib.run_prepared(p, ctx, phases=phases_lib.Phases())
  finally:
    loop_lib._Loop.stop_training = stop_training   # pylint: disable=protected-access
    timed.stop()
    p.train_step = step_fn
    p.ckpt = None
  at = np.asarray(timed.at + [timed.end])
  profiled = len(timed.at) - timed.profile_from + 1 if profile else 0
  split = len(timed.at) - max(profiled, 0)   # the first profiled step's dispatch
  kinds = timeline.kinds
  return {"steps": len(timed.at), "timed": timed, "summary": summary,
          # The training thread's wall time from the first step after the warm ones to the end.
          "timeline": timeline.report(
              wall_s=float(at[-1] - at[warm]), steps=len(timed.at) - warm,
              intervals=[(kinds[i], float(at[i] - at[i - 1]))
                         for i in range(warm + 1, len(at) - 1)]),
          "blocked_while_training_s": blocked[0] if blocked else None,
          # Seconds per step: unprofiled steps after the warm ones (to the first profiled
          # dispatch, or to the loop's end), each step's dispatch to the next's.
          "step_s": np.diff(at[warm:split + 1] if profiled > 0 else at[warm:]),
          "profiled_steps": max(profiled, 0)}


def _name(key) -> str:
  file, _, name = key
  return name if file == "~" else f"{os.path.relpath(file)}:{name}"


def profile_breakdown(profile: cProfile.Profile, steps: int, top: int = 15) -> dict:
  """The training thread's time per step (ms) by category, its waits for the device, and the
  top functions by cumulative and own time."""
  stats = pstats.Stats(profile)
  table = stats.stats   # (file, line, name) -> (cc, nc, tottime, cumtime, callers)
  wanted = {}
  for category, suffix, name in CATEGORIES:
    for key in table:
      if key[0].endswith(suffix) and key[2] == name:
        wanted[key] = category
  waits = {k for k in table if k[0].endswith(os.path.join("jax", "_src", "api.py"))
           and k[2] in WAITS}
  ms = lambda s: round(1e3 * s / max(steps, 1), 3)

  def outer_time(keys) -> float:
    """Cumulative time of `keys`' calls that are not made from inside another of them (a call
    whose caller started before the profile did has no caller on record: it counts whole)."""
    keys = set(keys)
    return sum(table[k][3] - sum(t for c, (_, _, _, t) in table[k][4].items() if c in keys)
               for k in keys)

  per_category = {}
  for category in dict.fromkeys(c for c, _, _ in CATEGORIES):
    keys = [k for k, c in wanted.items() if c == category]
    per_category[category] = outer_time(keys) if keys else 0.0
  cumulative = sorted(((v[3], _name(k)) for k, v in table.items()), reverse=True)
  own = sorted(((v[2], _name(k)) for k, v in table.items()), reverse=True)
  return {"steps": steps, "profiled_s": round(stats.total_tt, 3),
          "ms_per_step": {**{c: ms(s) for c, s in sorted(per_category.items(),
                                                        key=lambda kv: -kv[1])},
                          "waiting for the device": ms(outer_time(waits)),
                          "all": ms(stats.total_tt)},
          "top_cumulative_ms_per_step": [[name, ms(s)] for s, name in cumulative[:top]],
          "top_own_ms_per_step": [[name, ms(s)] for s, name in own[:top]]}


def measure(config, workdir: str, *, null: bool, warm: int, rounds: int, profile: bool) -> dict:
  t0 = time.perf_counter()
  phases = phases_lib.Phases()
  run = paths.RunPaths(workdir, config)
  prepare_lib.use_compilation_cache(run)
  prepared = prepare_lib.prepare(config, workdir, phases=phases)
  log(f"prepared in {time.perf_counter() - t0:.0f} s: {len(prepared.data.manifest)} records, "
      f"{prepared.steps_per_epoch} steps/epoch, {prepared.num_params:,} parameters "
      f"({dict(phases.seconds)})")
  step_fn = null_step(prepared) if null else prepared.train_step
  flops = 0.0 if null else step_flops(prepared)
  n = max(8, min(prepared.steps_per_epoch, 64))
  before = in_memory(prepared, step_fn, n, rounds)
  loop = run_loop(prepared, step_fn, warm=warm, profile=profile)
  after = in_memory(prepared, step_fn, n, rounds)
  mem_s = float(np.median(before + after))
  # The profiled steps run slower (cProfile's own cost): the loop's time per step is taken
  # from the steps before them.
  unprofiled = loop["step_s"]
  loop_s = float(np.median(unprofiled))
  mean_loop_s = float(np.mean(unprofiled))
  summary = loop["summary"]["train"]
  batch = config.data.batch_size
  validation_s = loop["timeline"]["ms_per_step"].get("validation", 0.0) * loop["timeline"][
      "steps"] / 1e3
  peak = bench_train.peak_tflops(jax.devices()[0], bench_train.dtype_name(config))
  breakdown = (profile_breakdown(loop["timed"].profile, loop["profiled_steps"])
               if profile and loop["profiled_steps"] else None)
  host_ms = None
  if breakdown:
    host_ms = round(breakdown["ms_per_step"]["all"]
                    - breakdown["ms_per_step"]["waiting for the device"], 3)
  result = {
      "step": "null (touches the batch only)" if null else "model",
      "global_batch": batch, "parameters": prepared.num_params,
      "steps_per_epoch": prepared.steps_per_epoch, "epochs": config.optim.epochs,
      "loop_steps": loop["steps"], "warm_steps_left_out": warm,
      "in_memory_step_ms": round(1e3 * mem_s, 3),
      "in_memory_step_ms_rounds": [round(1e3 * x, 3) for x in before + after],
      "loop_step_ms_median": round(1e3 * loop_s, 3),
      "loop_step_ms_mean": round(1e3 * mean_loop_s, 3),
      "loop_step_ms_p90": round(1e3 * float(np.percentile(unprofiled, 90)), 3),
      "loop_efficiency": round(mem_s / mean_loop_s, 4),
      "loop_efficiency_median_step": round(mem_s / loop_s, 4),
      "in_memory_examples_per_s": round(batch / mem_s, 1),
      "loop_examples_per_s": round(batch / mean_loop_s, 1),
      "host_ms_per_step_profiled": host_ms,
      "train_s": summary["seconds"],
      # Seconds in save calls while the loop ran, over its seconds (summary.json's
      # checkpoint_blocked_s also counts the wait for the last save, after training).
      "checkpoint_blocked_s": round(loop["blocked_while_training_s"], 4),
      "checkpoint_blocked_s_with_final_wait": summary["checkpoint_blocked_s"],
      "checkpoint_blocking_fraction": round(loop["blocked_while_training_s"]
                                            / max(summary["seconds"], 1e-9), 5),
      "checkpoints": {k: (v if not isinstance(v, list) else len(v))
                      for k, v in summary.get("checkpoints", {}).items()},
      "snapshots": summary["snapshots"],
      # The training thread's wall time by activity, and the loop without its validations
      # (epoch ends: device work of their own, beside the training steps).
      "timeline": loop["timeline"],
      "loop_efficiency_without_validation": round(
          mem_s * loop["timeline"]["steps"] / max(loop["timeline"]["wall_s"] - validation_s,
                                                   1e-9), 4),
      "model_flops_per_step": flops,
      "achieved_tflops_in_memory": round(flops / mem_s / 1e12, 3),
      "achieved_tflops_loop": round(flops / mean_loop_s / 1e12, 3),
      "peak_tflops": peak if flops else None,
      "fraction_of_peak_in_memory": (round(flops / mem_s / 1e12 / peak, 4) if peak and flops
                                     else None),
      "profile": breakdown,
      "phases_s": dict(phases.seconds)}
  log(f"{result['step']}: in memory {result['in_memory_step_ms']} ms/step, loop "
      f"{result['loop_step_ms_mean']} ms/step (median {result['loop_step_ms_median']}): loop "
      f"efficiency {result['loop_efficiency']}; checkpoint blocking "
      f"{100 * result['checkpoint_blocking_fraction']:.2f}% "
      f"({result['checkpoints']}); host {host_ms} ms/step (profiled); without validation "
      f"{result['loop_efficiency_without_validation']}; {result['achieved_tflops_in_memory']} "
      f"TFLOP/s in memory (peak {peak}); training thread, ms/step: "
      f"{result['timeline']['ms_per_step']}; by step kind: "
      f"{result['timeline']['intervals_by_kind']}")
  return result


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--config", default="quickstart", help="a module in configs/")
  parser.add_argument("--patients", type=int, default=0, help="cohort size (0: the config's)")
  parser.add_argument("--epochs", type=int, default=3)
  parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                      help="config override, e.g. model.dtype=bfloat16 (repeatable)")
  parser.add_argument("--null-step", action="store_true",
                      help="a step that only touches the batch: the loop's host cost alone")
  parser.add_argument("--warm", type=int, default=5, help="first loop steps left out")
  parser.add_argument("--rounds", type=int, default=3, help="in-memory rounds before and after")
  parser.add_argument("--no-profile", action="store_true")
  parser.add_argument("--workdir", default="", help="default: a temporary directory")
  parser.add_argument("--out", default=os.path.join(RESULTS, "bench_loop.json"))
  args = parser.parse_args()
  config = get_config(args.config, args.patients, args.epochs, args.set)
  t0 = time.perf_counter()
  with tempfile.TemporaryDirectory() as tmp:
    result = measure(config, args.workdir or tmp, null=args.null_step, warm=args.warm,
                     rounds=args.rounds, profile=not args.no_profile)
  result = {"device": str(jax.devices()[0]),
            "device_kind": getattr(jax.devices()[0], "device_kind", ""),
            "cpu_count": os.cpu_count(), "jax": jax.__version__,
            "date": time.strftime("%Y-%m-%d"), "config": f"configs/{args.config}.py",
            "patients": int(config.data.synthetic.num_patients), "overrides": args.set,
            **result, "wall_seconds": round(time.perf_counter() - t0, 1)}
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(result, f, indent=2)
  print(f"loop efficiency {result['loop_efficiency']} ({result['loop_step_ms_mean']} ms/step in "
        f"the loop vs {result['in_memory_step_ms']} in memory); checkpoint blocking "
        f"{100 * result['checkpoint_blocking_fraction']:.2f}% of training; wrote {args.out}")


if __name__ == "__main__":
  main()
