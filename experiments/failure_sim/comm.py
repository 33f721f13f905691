"""What a step's exchange between workers costs, per gradient mode (issue 35).

A data-parallel step exchanges what the mode says: 'sync' all-reduces every step's gradients,
'local' all-reduces the replicas' parameter deltas once every H steps (medjax/train/local_sgd).
The time of one all-reduce of n bytes over p workers on a ring (reduce-scatter, then all-gather:
Patarasuk and Yuan 2009; Thakur, Rabenseifner and Gropp 2005) is

    2 (p - 1) latency + 2 (p - 1) / p x n / bandwidth,

each worker sending 2 (p - 1) / p x n bytes. The bytes come from the compiled step itself
(`measured_step_bytes`: the all-reduce operands XLA emits for medjax's step), the links'
bandwidths and latencies from their published figures, each labelled with its source. The
exchange is not overlapped with compute here (XLA's CPU and GPU data-parallel steps reduce after
the backward pass), so the estimate is an upper bound on its cost.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re

RING = ("ring all-reduce: Patarasuk and Yuan, J. Parallel Distrib. Comput. 69(2), 2009; "
        "Thakur, Rabenseifner and Gropp, IJHPCA 19(1), 2005")


@dataclasses.dataclass(frozen=True)
class Link:
  """A worker's network link: bytes/s each way, and the latency of one message."""
  name: str
  bandwidth_Bps: float
  latency_s: float
  source: str


LINKS = {
    "1gbe": Link("1 GbE", 1e9 / 8, 50e-6,
                 "published: IEEE 802.3ab 1000BASE-T line rate (DiagnoseNET's Jetson TX2 "
                 "cluster's network); latency assumption: 50 us per TCP message"),
    "10gbe": Link("10 GbE", 10e9 / 8, 20e-6,
                  "published: IEEE 802.3ae line rate; latency assumption: 20 us per TCP "
                  "message"),
    "ib_hdr": Link("InfiniBand HDR", 200e9 / 8, 2e-6,
                   "published: InfiniBand HDR, 200 Gb/s per port (InfiniBand Trade "
                   "Association); latency assumption: 2 us per MPI message"),
}


def ring_allreduce_s(nbytes: float, workers: int, link: Link) -> float:
  """Seconds for one ring all-reduce of `nbytes` over `workers`."""
  if workers <= 1:
    return 0.0
  return 2 * (workers - 1) * link.latency_s + 2 * (workers - 1) / workers * nbytes / \
      link.bandwidth_Bps


@dataclasses.dataclass(frozen=True)
class Exchange:
  """A gradient mode's exchange: `nbytes` all-reduced once every `every` steps."""
  mode: str
  nbytes: float
  link: Link
  every: int = 1
  source: str = ""

  def per_step_s(self, workers: int) -> float:
    return ring_allreduce_s(self.nbytes, workers, self.link) / self.every

  def sent_per_step(self, workers: int) -> float:
    """Bytes each worker sends per step, on average."""
    return 2 * (workers - 1) / workers * self.nbytes / self.every if workers > 1 else 0.0


_DTYPE_BYTES = {"f64": 8, "f32": 4, "s32": 4, "u32": 4, "bf16": 2, "f16": 2, "s8": 1, "u8": 1,
                "pred": 1, "s64": 8, "u64": 8}
_SHAPE = re.compile(r"\b(f64|f32|s32|u32|bf16|f16|s8|u8|pred|s64|u64)\[([0-9,]*)\]")
# An all-reduce instruction: "%name = <result shape(s)> all-reduce(" (or -start, async).
_ALL_REDUCE = re.compile(r"=\s*(.*?)\s*all-reduce(?:-start)?\(")


def allreduce_bytes(hlo_text: str) -> int:
  """Bytes all-reduced by the instructions of an optimised HLO module's text (each
  instruction's result: its operands' shapes)."""
  total = 0
  for m in _ALL_REDUCE.finditer(hlo_text):
    for dtype, dims in _SHAPE.findall(m.group(1)):
      size = 1
      for d in filter(None, dims.split(",")):
        size *= int(d)
      total += size * _DTYPE_BYTES[dtype]
  return total


def measured_step_bytes(config, devices) -> dict:
  """The bytes medjax's compiled training step all-reduces on a data-parallel mesh over
  `devices` (at least 2), beside 4 bytes per parameter (the float32 gradient a synchronous step
  must exchange). For 'local' mode the averaging round's bytes, which run every
  config.optim.local_steps steps ('inner_step_allreduce_bytes': the inner step's, 0). Imports
  JAX and medjax (the simulator itself does not)."""
  # pylint: disable=import-outside-toplevel
  import jax
  import numpy as np
  from medjax.data import records
  from medjax.train import local_sgd, optim
  from medjax.train import state as state_lib
  from medjax.train import step as step_lib

  shapes = records.Shapes(image_size=config.data.image_size, max_images=config.data.max_images,
                          num_analytes=max(1, config.data.synthetic.num_analytes),
                          vitals_steps=config.data.vitals_steps, vitals_channels=len(config.data.vitals_channels))
  mesh = state_lib.make_mesh(config.mesh, devices)
  tx, _ = optim.make(config.optim, 100)
  local = local_sgd.from_config(config.optim, mesh)
  built = state_lib.build_abstract(config.model, tx, mesh, num_classes=4, shapes=shapes,
                                   seed=0, local=local)
  train_step = step_lib.make_train_step(built.graphdef, tx, built, mesh, seed=0, local=local)
  batch = records.empty(shapes, config.data.batch_size)
  batch["label"] = np.zeros(config.data.batch_size, np.int32)
  batch["weight"] = np.ones(config.data.batch_size, np.float32)
  batch = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                      sharding=state_lib.batch_sharding(mesh)),
                       batch)
  hlo = train_step.lower(built.abstract, batch).compile().as_text()
  step_bytes = allreduce_bytes(hlo)
  if local is not None:
    # 'local': the inner step exchanges nothing; the round's averaging is its own program.
    trained = jax.ShapeDtypeStruct((local.replicas,), np.float32,
                                   sharding=local_sgd.replica_sharding(local, mesh))
    average = step_lib.make_average(built, mesh, local)
    hlo = average.lower(built.abstract, trained, np.int32(0), np.int32(0)).compile().as_text()
  params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(built.abstract["params"]))
  return {"mode": config.optim.get("mode", "sync"), "devices": len(devices),
          "allreduce_bytes": allreduce_bytes(hlo), "inner_step_allreduce_bytes": step_bytes,
          "params": params,
          "gradient_bytes": 4 * params,
          "every": config.optim.local_steps if local is not None else 1}


# What the simulator's communication tables assume for the step they exchange around.
H100_STEP = ("gpu_h100_loop/before_ccef327/bench_loop_f32.json",
             "measured: configs/paper.py's in-memory step, batch 512, float32, one H100 80GB")
MODES = (("sync", 1), ("local", 16), ("local", 64))


def _shown(path: str) -> str:
  """`path` relative to the working directory where it lies below it (no home directories in
  the tables)."""
  rel = os.path.relpath(path)
  return path if rel.startswith("..") else rel


def load_bytes(results_dir: str, config: str = "paper") -> tuple[float, str]:
  """(bytes a synchronous step all-reduces for configs/<config>.py, its source): from
  <results_dir>/comm_bytes.json (`python -m experiments.failure_sim.comm`), else, for the paper
  config, 4 bytes for each of its model's parameters (labelled as such)."""
  path = os.path.join(results_dir, "comm_bytes.json")
  try:
    with open(path) as f:
      row = next(r for r in json.load(f)["rows"] if r["config"] == config and
                 r["mode"] == "sync")
    return float(row["allreduce_bytes"]), (
        f"measured: the all-reduce operands of configs/{config}.py's compiled step "
        f"({_shown(path)}, {row['devices']} CPU devices)")
  except (OSError, ValueError, KeyError, StopIteration):
    if config != "paper":
      return float("nan"), f"not measured: no configs/{config}.py row in {_shown(path)}"
    return 4 * 31_618_564.0, ("assumption: 4 bytes per parameter of configs/paper.py "
                              f"(31,618,564); {_shown(path)} absent or unreadable")


def step_s(results_dir: str) -> tuple[float, str]:
  """(seconds of the measured H100 step, its source), or a CPU-free assumption."""
  path = os.path.join(results_dir, H100_STEP[0])
  try:
    with open(path) as f:
      return json.load(f)["in_memory_step_ms"] / 1000, f"{H100_STEP[1]} ({_shown(path)})"
  except (OSError, ValueError, KeyError):
    return 0.0122, f"assumption: 12.2 ms ({_shown(path)} absent)"


def weak_scaling(step: float, nbytes: float, workers, links=LINKS, modes=MODES) -> list[dict]:
  """Per mode, link and worker count: each worker keeps its own batch (weak scaling) and adds
  its share of the mode's exchange to every step; efficiency = step / (step + exchange)."""
  rows = []
  for mode, every in modes:
    for key, link in links.items():
      ex = Exchange(mode, nbytes, link, every)
      rows.append({"mode": mode, "every": every, "link": key,
                   "by_workers": {w: {"exchange_ms": 1000 * ex.per_step_s(w),
                                      "efficiency": step / (step + ex.per_step_s(w)),
                                      "sent_mb_per_step": ex.sent_per_step(w) / 1e6}
                                  for w in workers}})
  return rows


def main(argv=None) -> dict:
  """Measures the bytes medjax's compiled steps all-reduce (quickstart and paper configs, each
  mode) on 4 CPU devices; writes <out>/comm_bytes.json."""
  import argparse  # pylint: disable=import-outside-toplevel
  parser = argparse.ArgumentParser(description=main.__doc__.split(";")[0])
  parser.add_argument("--out", default=os.path.join("experiments", "results"))
  args = parser.parse_args(argv)
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             " --xla_force_host_platform_device_count=4")
  import jax  # pylint: disable=import-outside-toplevel
  jax.config.update("jax_platforms", "cpu")
  from configs import paper, quickstart  # pylint: disable=import-outside-toplevel
  rows = []
  for name, module in (("quickstart", quickstart), ("paper", paper)):
    for mode, every in (("sync", 1), ("local", 16)):
      config = module.get_config()
      config.optim.mode, config.optim.local_steps, config.optim.replicas = mode, every, 4
      row = {"config": name, **measured_step_bytes(config, jax.devices()[:4])}
      row["allreduce_over_gradient"] = row["allreduce_bytes"] / row["gradient_bytes"]
      rows.append(row)
      print(f"{name} {mode}: {row['allreduce_bytes']:,} bytes all-reduced per "
            f"{'step' if mode == 'sync' else 'averaging'} ({row['allreduce_over_gradient']:.6f}"
            f" x 4 bytes per parameter)")
  out = {"what": "bytes all-reduced by medjax's compiled training step (experiments/failure_sim"
                 "/comm.py)", "jax": jax.__version__, "rows": rows}
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "comm_bytes.json"), "w") as f:
    json.dump(out, f, indent=1)
  return out


if __name__ == "__main__":
  main()
