"""Training-step benchmark, side by side in one run; writes experiments/results/bench_train.json.

  python -m experiments.bench_train [--config quickstart] [--patients 1500]
      [--batch-sizes 32,128,512] [--rounds 5]

1. Achieved FLOP/s of a config's training step (FLOPs from the lowered step's XLA cost
   analysis: one count for every dtype and platform; time from chained donated steps) over the
   FLOP/s of a large jitted matmul in the model's dtype on the same device (target on CPU:
   >= 0.3), and beside the chip's data-sheet peak where one is known (`PEAK_TFLOPS`). The first
   batch size should be the config's global batch (32 for quickstart and default, 512 for
   paper); other batch sizes show how the fraction scales.
2. Step time fed by the real input pipeline (BatchReader on a filled cache held in memory,
   `loader.batches` per partition and `to_global`, exactly as `loop.train_and_evaluate` does)
   over the same steps fed from batches already on device (target: within 5%, i.e. ratio <= 1.05).
3. Diagnostic for 1: each strided conv of the image encoder alone (forward, input gradient,
   kernel gradient) at the smallest and largest batch, in GFLOP/s (best of 15 calls).

Both comparisons interleave their two sides (the FLOP/s one in short rounds, the pipeline one
step by step) and report the median ratio over rounds with its interquartile range, so that load
from other processes on the machine hits both sides alike; the ratio of each side's best round is
given too.
"""

import argparse
import ast
import importlib
import json
import os
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from medjax.data import host
from medjax.data import loader
from medjax.data import partition
from medjax.model import fusion
from medjax.train import optim
from medjax.train import state as state_lib
from medjax.train import step as step_lib


def apply_overrides(config, items: list[str]) -> None:
  """`--set field.path=value` items (values as Python literals, else strings) onto `config`."""
  for item in items:
    key, value = item.split("=", 1)
    *path, leaf = key.split(".")
    node = config
    for name in path:
      node = getattr(node, name)
    try:
      value = ast.literal_eval(value)
    except (ValueError, SyntaxError):
      pass
    setattr(node, leaf, value)


def log(msg: str) -> None:
  print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def cost_flops(lowered) -> float:
  """'flops' from a computation's cost analysis (a dict, or a list of one per module).

  Pass the *lowered* computation (`jit(f).lower(...)`): its HLO is the program as written, the
  same on every platform and for every dtype. A compiled one's count depends on the backend: on
  a GPU, XLA counted 28.5 GFLOP for the paper step in float32 (convolutions and matmuls become
  library calls it does not count) and 200 in bfloat16, for the same model.
  """
  cost = lowered.cost_analysis()
  if isinstance(cost, (list, tuple)):
    return float(sum(max(c.get("flops", 0.0), 0.0) for c in cost if c))
  return max(float(cost.get("flops", 0.0)), 0.0) if cost else 0.0


def jaxpr_flops(jaxpr) -> float:
  """The FLOPs of a jaxpr's matrix products and convolutions (2 per multiply-add), nested jaxprs
  included (a scan's body times its length; a cond's costliest branch; a while loop's body once).

  Counted from the program as traced, before any backend sees it: the same number on every
  platform and for every dtype (XLA's cost analysis of a GPU program counts neither the cuBLAS
  and cuDNN calls nor, on jax 0.11, anything at all). Elementwise work is left out, as the
  usual model-FLOPs utilisation leaves it out.
  """
  jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
  total = 0.0
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    if name == "dot_general":
      (contract, _), _ = eqn.params["dimension_numbers"]
      lhs = eqn.invars[0].aval
      total += 2.0 * np.prod(eqn.outvars[0].aval.shape) * np.prod(
          [lhs.shape[d] for d in contract])
    elif name == "conv_general_dilated":
      rhs, spec = eqn.invars[1].aval, eqn.params["dimension_numbers"].rhs_spec
      per_output = rhs.shape[spec[1]] * np.prod([rhs.shape[d] for d in spec[2:]])
      total += 2.0 * np.prod(eqn.outvars[0].aval.shape) * per_output
    subs = [jaxpr_flops(v) for v in _sub_jaxprs(eqn.params)]
    if name == "cond":
      total += max(subs, default=0.0)
    elif name == "scan":
      total += eqn.params["length"] * sum(subs)
    else:
      total += sum(subs)
  return float(total)


def _sub_jaxprs(params: dict) -> list:
  out = []
  for value in params.values():
    for v in (value if isinstance(value, (tuple, list)) else (value,)):
      if isinstance(v, (jax.extend.core.ClosedJaxpr, jax.extend.core.Jaxpr)):
        out.append(v)
  return out


def model_flops(fn, *args) -> float:
  """`jaxpr_flops` of `fn(*args)` (a jitted step and its arguments, or their shapes)."""
  return jaxpr_flops(jax.make_jaxpr(fn)(*args))


# Dense peak TFLOP/s by device kind and dtype, from the vendor's data sheets (NVIDIA H100 and
# H200 Tensor Core GPU datasheets; the rates without sparsity). float32 is the TF32 tensor-core
# rate: under JAX's default matmul precision XLA runs float32 matrix products and convolutions as
# TF32 on these chips (the paper step measured 146 TFLOP/s in float32 on an H100 SXM, above the
# 67 of its non-tensor-core float32 rate). Other devices: no peak (reported as such).
PEAK_TFLOPS = {
    "H100 80GB HBM3": {"float32": 494.5, "bfloat16": 989.0},    # H100 SXM5
    "H100 PCIe": {"float32": 378.0, "bfloat16": 756.0},
    "H100 NVL": {"float32": 417.5, "bfloat16": 835.5},
    "H200": {"float32": 494.5, "bfloat16": 989.0},               # H200 SXM
}


def dtype_name(config) -> str:
  """config.model.dtype as the dtype the model computes in ('auto' resolved for this platform)."""
  return fusion.compute_dtype(str(config.model.dtype)).name


def peak_tflops(device, dtype: str) -> float | None:
  kind = getattr(device, "device_kind", "")
  for name, peaks in PEAK_TFLOPS.items():
    if name in kind:
      return peaks.get(dtype)
  return None


# -- side 1: matmul peak ------------------------------------------------------------------------

class Matmul:
  """A jitted n x n matmul in `dtype`; `run(k)` times k chained products (seconds per product).

  Its FLOPs are counted, not asked of XLA (2 n^3, whatever the backend calls): a compiled
  matmul's cost analysis on a GPU gave a negative count, hence negative GFLOP/s.
  """

  def __init__(self, n: int, dtype: str = "float32"):
    self.n, self.dtype = n, dtype
    keys = jax.random.split(jax.random.key(0), 2)
    self.a = jax.random.normal(keys[0], (n, n), dtype)
    self.b = (jax.random.normal(keys[1], (n, n), jnp.float32) / np.sqrt(n)).astype(dtype)
    self.fn = jax.jit(jnp.dot)
    self.flops = 2.0 * n ** 3
    self.run(2)  # warm up

  def run(self, k: int) -> float:
    x = jax.block_until_ready(self.a)
    t0 = time.perf_counter()
    for _ in range(k):
      x = self.fn(x, self.b)
    jax.block_until_ready(x)   # the products run asynchronously: time them to the last one
    return (time.perf_counter() - t0) / k


# -- side 2: the training step ------------------------------------------------------------------

class Trainer:
  """The config's model, optimizer, sharded state and jitted step for one global batch size."""

  def __init__(self, config, prepared, batch_size: int):
    self.config, self.batch_size = config, batch_size
    self.mesh = state_lib.make_mesh(config.mesh)
    self.sharding = state_lib.batch_sharding(self.mesh)
    tx, _ = optim.make(config.optim, total_steps=10_000)
    self.state, built = state_lib.build(config.model, tx, self.mesh,
                                        num_classes=len(prepared.manifest.class_names),
                                        shapes=prepared.shapes, seed=config.seed)
    self.params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(self.state["params"]))
    self.step = step_lib.make_train_step(built.graphdef, tx, built, self.mesh, seed=config.seed)
    self.compiled = None

  def compile(self, batch) -> float:
    t0 = time.perf_counter()
    lowered = self.step.lower(self.state, batch)
    self.flops = model_flops(self.step, self.state, batch)
    self.xla_flops = cost_flops(lowered)   # for comparison: XLA's own count, platform-dependent
    self.compiled = lowered.compile()
    return time.perf_counter() - t0

  def run_on_device(self, batches) -> float:
    """Seconds per step over batches already on device, fetching metrics each step."""
    t0 = time.perf_counter()
    for batch in batches:
      self.state, metrics = self.step(self.state, batch)
      jax.device_get(metrics)
    return (time.perf_counter() - t0) / len(batches)

  def timed_step(self, batch, before_wait=None) -> float:
    """Seconds for one step as the loop runs it: dispatch, `before_wait()`, fetch the metrics."""
    t0 = time.perf_counter()
    self.state, metrics = self.step(self.state, batch)
    if before_wait is not None:
      before_wait()
    jax.device_get(metrics)
    return time.perf_counter() - t0


def prepare_data(config, workdir: str):
  """Synthesises and ingests the config's cohort and fills the one host's decoded cache."""
  t0 = time.perf_counter()
  data = host.setup(config, workdir)   # one host: every record, held in memory when it fits
  log(f"data: {len(data.manifest)} records ingested and cached in "
      f"{time.perf_counter() - t0:.0f} s")
  return data, data.reader()


def plan_partitions(config, prepared, batch_size: int) -> list[np.ndarray]:
  plan = partition.plan_epoch(prepared.manifest, prepared.placement, seed=config.seed, epoch=0,
                              num_partitions=config.data.num_partitions,
                              host_batch_size=batch_size)
  return list(plan.steps)


def device_batches(reader, sharding, batch_size, partitions) -> list[dict]:
  """Every step's global batch, already on device (one process: `to_global` may keep host
  arrays, which the step would copy at dispatch)."""
  out = []
  for steps in partitions:
    for step_Wxb in steps:
      batch = loader.to_global(reader.read(reader.local_rows(step_Wxb)), sharding, batch_size)
      out.append(jax.block_until_ready(jax.device_put(batch, sharding)))
  return out


def spread(values) -> dict:
  """Median and interquartile range (the machine may be shared: load varies between rounds)."""
  q = np.percentile(np.asarray(values, np.float64), [25, 50, 75])
  return {"median": round(float(q[1]), 4), "p25": round(float(q[0]), 4),
          "p75": round(float(q[2]), 4)}


def bench_flops(config, prepared, reader, batch_sizes, rounds: int, matmul: Matmul,
                chunk_s: float) -> list[dict]:
  """Per batch size: rounds of (~chunk_s of steps, ~chunk_s of matmuls), order alternating."""
  out = []
  for bs in batch_sizes:
    trainer = Trainer(config, prepared, bs)
    steps = plan_partitions(config, prepared, bs)[0]
    batches = device_batches(reader, trainer.sharding, bs, [steps[:1]])
    compile_s = trainer.compile(batches[0])
    trainer.run_on_device(batches * 3)  # warm up
    k_step = max(1, int(chunk_s / trainer.run_on_device(batches * 3)))
    k_mm = max(1, int(chunk_s / matmul.run(3)))
    step_s, mm_s = [], []
    for r in range(rounds):
      pair = [lambda: step_s.append(trainer.run_on_device(batches * k_step)),
              lambda: mm_s.append(matmul.run(k_mm))]
      for fn in (pair if r % 2 == 0 else pair[::-1]):
        fn()
    ratios = [(trainer.flops / a) / (matmul.flops / b) for a, b in zip(step_s, mm_s)]
    best = (trainer.flops / min(step_s)) / (matmul.flops / min(mm_s))
    entry = {"global_batch": bs, "parameters": trainer.params, "compile_s": round(compile_s, 2),
             "step_flops": trainer.flops, "xla_step_flops": trainer.xla_flops,
             "steps_per_round": k_step,
             "matmuls_per_round": k_mm, "rounds": rounds,
             "step_ms_median": round(1e3 * float(np.median(step_s)), 3),
             "examples_per_s": round(bs / float(np.median(step_s)), 1),
             "step_gflops_per_s": round(trainer.flops / float(np.median(step_s)) / 1e9, 3),
             "matmul_gflops_per_s": round(matmul.flops / float(np.median(mm_s)) / 1e9, 3),
             "fraction_of_matmul": spread(ratios),
             "fraction_best_round_each_side": round(best, 4), "target_fraction": 0.3}
    peak = peak_tflops(jax.devices()[0], dtype_name(config))
    entry["achieved_tflops"] = round(entry["step_gflops_per_s"] / 1e3, 4)
    entry["peak_tflops"] = peak   # None: no data-sheet peak for this device
    entry["fraction_of_peak"] = round(entry["achieved_tflops"] / peak, 4) if peak else None
    log(f"flops: batch {bs}: step {entry['step_ms_median']} ms, "
        f"{entry['step_flops'] / 1e9:.3f} GFLOP/step -> {entry['step_gflops_per_s']} GFLOP/s vs "
        f"matmul {entry['matmul_gflops_per_s']} GFLOP/s: "
        f"{entry['fraction_of_matmul']['median']:.3f} (IQR {entry['fraction_of_matmul']['p25']:.3f}"
        f"-{entry['fraction_of_matmul']['p75']:.3f}; best rounds {best:.3f})")
    out.append(entry)
  return out


def _piped_step(trainer, it, step_batches) -> float:
  """Seconds to take the next batch from `loader.batches` and run its step, reading ahead."""
  t0 = time.perf_counter()
  _, _, batch = next(it)
  trainer.timed_step(batch, step_batches.read_ahead)
  return time.perf_counter() - t0


def bench_pipeline(config, prepared, reader, batch_size: int, rounds: int) -> dict:
  """Rounds of one epoch, alternating pipeline-fed and in-memory steps one step at a time.

  A pipeline-fed step is timed from taking its batch from `loader.batches` (a new one per
  partition, as the training loop makes them; the first batch of a partition is read then)
  through dispatch, reading the next batch ahead, and fetching the step's metrics. The in-memory
  step next to it runs the same plan step from a batch already on device.
  """
  trainer = Trainer(config, prepared, batch_size)
  partitions = plan_partitions(config, prepared, batch_size)
  batches = device_batches(reader, trainer.sharding, batch_size, partitions)
  trainer.compile(batches[0])
  # Warm up both sides (a host-array batch may compile once more than device arrays do).
  warm = loader.batches(reader, partitions[0][:3], start=0, sharding=trainer.sharding,
                        global_batch=batch_size, how=config.data.prefetch)
  for (_, _, piped), batch in zip(warm, batches):
    trainer.timed_step(piped, warm.read_ahead)
    trainer.timed_step(batch)
  pipe_s, mem_s, ratios, step_ratios = [], [], [], []
  for r in range(rounds):
    pipe_t, mem_t, at = [], [], 0
    for steps in partitions:
      step_batches = loader.batches(reader, steps, start=0, sharding=trainer.sharding,
                                    global_batch=batch_size, how=config.data.prefetch)
      it = iter(step_batches)
      for s in range(len(steps)):
        if (r + s) % 2:
          mem_t.append(trainer.timed_step(batches[at + s]))
          pipe_t.append(_piped_step(trainer, it, step_batches))
        else:
          pipe_t.append(_piped_step(trainer, it, step_batches))
          mem_t.append(trainer.timed_step(batches[at + s]))
      at += len(steps)
    pipe_s.append(float(np.mean(pipe_t)))
    mem_s.append(float(np.mean(mem_t)))
    ratios.append(sum(pipe_t) / sum(mem_t))
    step_ratios.extend(np.asarray(pipe_t) / np.asarray(mem_t))
  # Reading alone (no step), to show how much there is to hide behind the step.
  t0 = time.perf_counter()
  for steps in partitions:
    for step_Wxb in steps:
      loader.to_global(reader.read(reader.local_rows(step_Wxb)), trainer.sharding, batch_size)
  read_s = (time.perf_counter() - t0) / len(batches)
  result = {"global_batch": batch_size, "steps_per_epoch": len(batches),
            "partitions": len(partitions), "rounds": rounds,
            "pipeline_step_ms_median": round(1e3 * float(np.median(pipe_s)), 3),
            "in_memory_step_ms_median": round(1e3 * float(np.median(mem_s)), 3),
            "read_only_ms_per_batch": round(1e3 * read_s, 3),
            "pipeline_over_in_memory": spread(ratios),
            "pipeline_over_in_memory_per_step": spread(step_ratios),
            "pipeline_over_in_memory_best_rounds": round(min(pipe_s) / min(mem_s), 4),
            "ratio_per_round": [round(x, 4) for x in ratios], "target_ratio": 1.05}
  q = result["pipeline_over_in_memory"]
  log(f"pipeline: batch {batch_size}: {result['pipeline_step_ms_median']} ms/step with the input "
      f"pipeline vs {result['in_memory_step_ms_median']} ms in memory: {q['median']:.3f}x "
      f"(IQR {q['p25']:.3f}-{q['p75']:.3f}; per step pair "
      f"{result['pipeline_over_in_memory_per_step']['median']:.3f}; best rounds "
      f"{result['pipeline_over_in_memory_best_rounds']:.3f}; reading alone "
      f"{result['read_only_ms_per_batch']} ms/batch)")
  return result


def bench_convs(config, batch_sizes, repeats: int) -> list[dict]:
  """Diagnostic: the image encoder's strided convs alone, forward and both gradients.

  The step's FLOPs are mostly these convs. Their gradients lower to convolutions with base
  (input) or window (kernel) dilation, which XLA:CPU does not run on its fast convolution path.
  """
  out = []
  dims = ("NHWC", "HWIO", "NHWC")
  conv = lambda x, w: jax.lax.conv_general_dilated(x, w, (2, 2), "SAME", dimension_numbers=dims)
  fwd = jax.jit(conv)
  dx = jax.jit(lambda x, w, g: jax.vjp(lambda x: conv(x, w), x)[1](g)[0])
  dw = jax.jit(lambda x, w, g: jax.vjp(lambda w: conv(x, w), w)[1](g)[0])
  for bs in batch_sizes:
    images = bs * config.data.max_images
    side, c_in = config.data.image_size, 1
    for c_out in config.model.image_channels:
      x = jax.random.uniform(jax.random.key(0), (images, side, side, c_in))
      w = jax.random.normal(jax.random.key(1), (3, 3, c_in, c_out))
      g = jnp.ones_like(fwd(x, w))
      entry = {"global_batch": bs, "images": images, "input": [side, side, c_in],
               "out_channels": c_out}
      for name, fn, fn_args in (("fwd", fwd, (x, w)), ("dx", dx, (x, w, g)),
                                ("dw", dw, (x, w, g))):
        flops = model_flops(fn, *fn_args)
        jax.block_until_ready(fn(*fn_args))
        times = []
        for _ in range(repeats):
          t0 = time.perf_counter()
          jax.block_until_ready(fn(*fn_args))
          times.append(time.perf_counter() - t0)
        t = min(times)  # best of the repeats: the least disturbed by other processes
        entry[name] = {"ms": round(1e3 * t, 3), "gflops_per_s": round(flops / t / 1e9, 2)}
      log(f"conv {side}x{side}x{c_in}->{c_out} at batch {bs}: " + ", ".join(
          f"{k} {entry[k]['ms']} ms ({entry[k]['gflops_per_s']} GFLOP/s)"
          for k in ("fwd", "dx", "dw")))
      out.append(entry)
      side, c_in = -(-side // 2), c_out
  return out


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--config", default="quickstart",
                      help="a module in configs/: quickstart, default or paper")
  parser.add_argument("--patients", type=int, default=1500, help="cohort size (0: the config's)")
  parser.add_argument("--batch-sizes", default="32,128,512",
                      help="global batches for the FLOP/s comparison (the first is the config's)")
  parser.add_argument("--matmul", type=int, default=2048, help="matmul side")
  parser.add_argument("--rounds", type=int, default=15,
                      help="interleaved rounds per comparison (pipeline: one epoch per round)")
  parser.add_argument("--chunk-s", type=float, default=0.5,
                      help="FLOP/s comparison: seconds of work per round and side")
  parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                      help="config override, e.g. model.dtype=bfloat16 (repeatable)")
  parser.add_argument("--workdir", default="", help="default: a temporary directory")
  parser.add_argument("--parts", default="flops,pipeline,convs",
                      help="which of flops, pipeline, convs to run")
  parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                    "results", "bench_train.json"))
  args = parser.parse_args()
  config = importlib.import_module(f"configs.{args.config}").get_config()
  if args.patients:
    config.data.synthetic.num_patients = args.patients
  apply_overrides(config, args.set)
  batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
  t_start = time.perf_counter()
  with tempfile.TemporaryDirectory() as tmp:
    workdir = args.workdir or tmp
    prepared, reader = prepare_data(config, workdir)
    matmul = Matmul(args.matmul, dtype_name(config))
    parts = args.parts.split(",")
    flops = (bench_flops(config, prepared, reader, batch_sizes, args.rounds, matmul,
                         args.chunk_s) if "flops" in parts else [])
    pipe = (bench_pipeline(config, prepared, reader, config.data.batch_size, args.rounds)
            if "pipeline" in parts else None)
    convs = (bench_convs(config, [batch_sizes[0], batch_sizes[-1]], repeats=15)
             if "convs" in parts else [])
  result = {
      "device": str(jax.devices()[0]), "cpu_count": os.cpu_count(),
      "load_average_at_end": list(os.getloadavg()),
      "config": f"configs/{args.config}.py",
      "patients": int(config.data.synthetic.num_patients),
      "matmul": {"n": args.matmul, "dtype": matmul.dtype, "flops": matmul.flops},
      "model_dtype": dtype_name(config),
      "step_vs_matmul_flops": flops, "pipeline_vs_in_memory": pipe, "conv_breakdown": convs,
      "wall_seconds": round(time.perf_counter() - t_start, 1)}
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(result, f, indent=2)
  for e in flops:
    print(f"step FLOP/s / {args.matmul}^2 matmul FLOP/s at batch {e['global_batch']}: "
          f"{e['fraction_of_matmul']['median']:.3f} ({e['step_gflops_per_s']} vs "
          f"{e['matmul_gflops_per_s']} GFLOP/s; target >= 0.3)")
  if pipe:
    print(f"step time with the input pipeline / in memory at batch {pipe['global_batch']}: "
          f"{pipe['pipeline_over_in_memory']['median']:.3f} (target <= 1.05)")
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
