"""FT-Cache's load-distribution study at the report's size: when one of 1,024 hosts holding 500
records each leaves, where do its records go under medjax's bounded-load consistent hashing, a
plain consistent-hash ring and hash-mod-W (computed here, with experiments/cache_sim.py's
per-trial figures)."""

from __future__ import annotations

import time

import numpy as np

from experiments import cache_sim
from medjax.data.cache import placement


def modulo_trials(manifest, hosts: list[str], departed_T: np.ndarray, *, seed: int) -> list[dict]:
  """hash mod W before, hash mod (W-1) over the survivors after: nearly every record moves."""
  pos_N = placement.record_positions(manifest, seed)
  before_N = (pos_N % np.uint64(len(hosts))).astype(np.int32)
  out = []
  for gone in departed_T:
    survivors = np.array([i for i in range(len(hosts)) if i != gone], np.int32)
    after_N = survivors[(pos_N % np.uint64(len(survivors))).astype(np.int64)]
    out.append(cache_sim.removal_stats(before_N, after_N, int(gone), len(hosts)))
  return out


def load_study(hosts: int = 1024, per_host: int = 500, trials: int = 20, *, seed: int = 0,
               vnodes: int = 100) -> dict:
  """Per method: the mean over `trials` departures (the same hosts for every method) of
  receivers, max/mean load after and records moved over the ideal (the departed host's share)."""
  t0 = time.perf_counter()
  manifest = cache_sim.files_manifest(hosts * per_host)
  names = cache_sim.host_names(hosts)
  departed = cache_sim.departures(hosts, trials, seed)
  methods = {
      "bounded (medjax)": cache_sim.bounded_trials(manifest, names, departed, seed=seed,
                                                   vnodes=vnodes),
      "ring": cache_sim.ring_trials(manifest, names, departed, seed=seed, vnodes=vnodes),
      "modulo": modulo_trials(manifest, names, departed, seed=seed),
  }
  return {"hosts": hosts, "records_per_host": per_host, "trials": trials, "vnodes": vnodes,
          "seed": seed, "seconds": round(time.perf_counter() - t0, 1),
          "methods": {k: cache_sim.summarize(v) for k, v in methods.items()}}


def load_study_md(study: dict) -> list[str]:
  out = [f"{study['hosts']:,} hosts x {study['records_per_host']} records; one host leaves "
         f"({study['trials']} trials, the same departed hosts for each method; "
         f"{study['vnodes']} virtual nodes per host; measured on this machine in "
         f"{study['seconds']} s):", "",
         "| placement | max/mean load before | max/mean after (worst) | receivers | records "
         "moved / ideal (worst) | only the departed host's records moved |",
         "|---|---:|---:|---:|---:|---|"]
  for name, s in study["methods"].items():
    out.append(f"| {name} | {s['max_over_mean_before']:.3f} | {s['max_over_mean_after_mean']:.3f}"
               f" ({s['max_over_mean_after_worst']:.3f}) | {s['receivers_mean']:.1f} | "
               f"{s['moved_over_ideal_mean']:.2f} ({s['moved_over_ideal_worst']:.2f}) | "
               f"{s['only_departed_moved']} |")
  return out
