"""One host leaves: where its cached records go, consistent-hash ring vs medjax's bounded loads.

  nice -n 10 python -m experiments.cache_sim [--hosts 1024] [--trials 500] [--records 524288]
      [--vnodes 10,50,100,500,1000] [--bounded-trials 200] [--out experiments/results]

The cache paper's Fig. 6(b) setting: 1024 hosts; each trial removes one random host from the same
initial placement (trials are independent; the departed hosts come from a seeded RNG and are the
same, in the same order, for every method). Compared:
  ring-V      plain consistent hashing with V virtual nodes per host (the paper's scheme): a
              departed host's records go to the next vnode clockwise of another host. The initial
              placement and the ring are `placement.place(method='ring')` and `placement.ring`;
              removal is vectorised here (one searchsorted of the departed host's records on the
              ring without its vnodes), which experiments/tests/test_cache_sim.py checks equals
              `placement.replace_hosts` on the ring.
  bounded     medjax's placement (`placement.place`, method 'bounded', vnodes 100), one
              `placement.replace_hosts` per trial. That call re-hashes every record id (about 1 s at
              524,288 records), so bounded runs --bounded-trials trials (the first ones of the same
              sequence); its figures barely vary between trials.
Bounded runs on two manifests: 'files' (homogeneous records, one stratum: the paper's files) and
'cohort' (medjax's cohort proportions, ~57 strata that are each balanced to +-1).

Per trial: hosts receiving moved records, moved records per receiving host (mean and standard
deviation over receivers), max/mean records per host before and after, records moved / ideal (the
departed host's fair share, records / hosts) and / the departed host's own record count.

Default record count: 524,288, the cache paper's own training set (CosmoFlow, 524,288 samples),
i.e. 512 records per host at 1024 hosts. Receivers depend on records per host as well as vnodes
(a vnode's arc may hold none of the departed host's records), so the paper's count is the one to
compare with.

Writes <out>/cache_sim.json (config, per-trial and summary numbers, wall time), cache_sim.md
(the table), cache_sim_fig6b.png and cache_sim_load.png; prints the table.
"""

import argparse
import json
import os
import time

import numpy as np
from matplotlib import figure

from medjax.data import manifest as manifest_lib
from medjax.data import synthetic
from medjax.data.cache import placement

# The cache paper's Fig. 6(b) as described in its text (the figure's exact values are not given).
PAPER_RECEIVERS = {10: "about 3", 1000: "about 300", "plateau": "about 350"}


def log(msg: str) -> None:
  print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def host_names(num_hosts: int) -> list[str]:
  """'host-0000', ...: zero-padded, so sorted order (placement's host index) is numeric order."""
  width = len(str(num_hosts - 1))
  return [f"host-{i:0{width}d}" for i in range(num_hosts)]


def files_manifest(num_records: int) -> manifest_lib.Manifest:
  """Homogeneous records (one image each, all train): one stratum, like the paper's files."""
  mask_Nx3 = np.zeros((num_records, 3), bool)
  mask_Nx3[:, manifest_lib.IMAGES] = True
  images_N = np.ones(num_records, np.int32)
  return manifest_lib.Manifest(
      record_ids=np.array([f"file-{i:08d}" for i in range(num_records)]),
      labels=np.zeros(num_records, np.int32), modality_mask=mask_Nx3, num_images=images_N,
      cost=manifest_lib.expected_cost(mask_Nx3, images_N),
      split=np.full(num_records, "train", "<U5"), image_files=[[] for _ in range(num_records)],
      class_names=["file"])


def cohort_manifest(num_records: int, seed: int = 0) -> manifest_lib.Manifest:
  """Records in medjax's cohort proportions, with no image paths (placement does not read them)."""
  return synthetic.random_manifest(num_records, seed, image_files=False)


def ring_expected_receivers(records_per_host: float, vnodes: int, num_hosts: int) -> float:
  """Receivers a plain ring should give on average, as a check on the simulation.

  The arc before each of the departed host's vnodes has an exponential length, so the records on
  it are geometric with mean lam = records_per_host / vnodes, non-empty with probability
  lam / (1 + lam); the non-empty arcs' successors are near-uniform picks among the survivors.
  (Ignores arcs whose successor is another vnode of the departed host, about 1 in num_hosts.)
  """
  lam = records_per_host / vnodes
  arcs = vnodes * lam / (1 + lam)
  return float((num_hosts - 1) * -np.expm1(-arcs / (num_hosts - 1)))


def departures(num_hosts: int, trials: int, seed: int) -> np.ndarray:
  """(T,) index of the host each trial removes; trials are independent, so repeats may occur."""
  return np.random.default_rng(seed).integers(0, num_hosts, size=trials)


def removal_stats(before_N: np.ndarray, after_N: np.ndarray, gone: int,
                  num_hosts: int) -> dict:
  """One trial's figures from the owners before and after (both indices into the full host list).

  Args:
    before_N: (N,) owner of each record with all hosts.
    after_N: (N,) owner after host `gone` left (never `gone`).
    gone: index of the departed host.
    num_hosts: hosts before the removal.
  """
  n = len(before_N)
  if np.any(after_N == gone):
    raise AssertionError(f"host {gone} left but still owns {int((after_N == gone).sum())} records")
  moved_N = after_N != before_N
  count_W = np.bincount(before_N, minlength=num_hosts)
  after_W = np.bincount(after_N, minlength=num_hosts)
  received_W = np.bincount(after_N[moved_N], minlength=num_hosts)
  received_R = received_W[received_W > 0]
  num_moved, departed = int(moved_N.sum()), int(count_W[gone])
  return {
      "departed": int(gone),
      "departed_records": departed,
      "moved": num_moved,
      "only_departed_moved": bool(num_moved == departed and np.all(before_N[moved_N] == gone)),
      "receivers": int(len(received_R)),
      "per_receiver_mean": float(received_R.mean()) if len(received_R) else 0.0,
      "per_receiver_std": float(received_R.std()) if len(received_R) else 0.0,
      "max_over_mean_before": float(count_W.max() / (n / num_hosts)),
      "max_over_mean_after": float(after_W.max() / (n / (num_hosts - 1))),
      "moved_over_ideal": num_moved / (n / num_hosts),
      "moved_over_departed": num_moved / departed if departed else float("nan"),
  }


def ring_remove(owner_N: np.ndarray, pos_N: np.ndarray, ring_pos_V: np.ndarray,
                ring_host_V: np.ndarray, gone: int) -> np.ndarray:
  """Owners after host `gone` leaves a plain ring: its records go to the next vnode clockwise.

  Same rule as placement's ring baseline re-placed on the survivors (first vnode at or after the
  record's position, wrapping), but only the departed host's records are looked up.
  """
  rows_M = np.flatnonzero(owner_N == gone)
  keep_V = ring_host_V != gone
  live_pos_V, live_host_V = ring_pos_V[keep_V], ring_host_V[keep_V]
  idx_M = np.searchsorted(live_pos_V, pos_N[rows_M], side="left")
  idx_M[idx_M == len(live_pos_V)] = 0
  after_N = owner_N.copy()
  after_N[rows_M] = live_host_V[idx_M]
  return after_N


def ring_trials(manifest: manifest_lib.Manifest, hosts: list[str], departed_T: np.ndarray, *,
                seed: int, vnodes: int) -> list[dict]:
  """Per-trial figures for a plain ring with `vnodes` virtual nodes per host."""
  start = placement.place(manifest, hosts, seed=seed, vnodes=vnodes, method="ring")
  if start.hosts != tuple(hosts):
    raise AssertionError("host names must sort in index order; use host_names()")
  pos_N = placement.record_positions(manifest, seed)
  ring_pos_V, ring_host_V = placement.ring(start.hosts, seed=seed, vnodes=vnodes)
  return [removal_stats(start.owner_N, ring_remove(start.owner_N, pos_N, ring_pos_V, ring_host_V,
                                                   int(gone)), int(gone), len(hosts))
          for gone in departed_T]


def bounded_remove(start: placement.Placement, manifest: manifest_lib.Manifest, gone: int, *,
                   seed: int) -> tuple[placement.Placement, np.ndarray]:
  """medjax's next generation without host `gone`, and its owners as indices into start.hosts."""
  survivors = start.hosts[:gone] + start.hosts[gone + 1:]
  nxt = placement.replace_hosts(start, manifest, survivors, seed=seed, vnodes=start.vnodes)
  index = {h: i for i, h in enumerate(start.hosts)}
  to_start_W = np.array([index[h] for h in nxt.hosts], np.int32)
  return nxt, to_start_W[nxt.owner_N]


def bounded_trials(manifest: manifest_lib.Manifest, hosts: list[str], departed_T: np.ndarray, *,
                   seed: int, vnodes: int, every: int = 0) -> list[dict]:
  """Per-trial figures for medjax's bounded-load placement; logs every `every` trials."""
  start = placement.place(manifest, hosts, seed=seed, vnodes=vnodes)
  if start.hosts != tuple(hosts):
    raise AssertionError("host names must sort in index order; use host_names()")
  out = []
  t0 = time.perf_counter()
  for t, gone in enumerate(departed_T):
    _, after_N = bounded_remove(start, manifest, int(gone), seed=seed)
    out.append(removal_stats(start.owner_N, after_N, int(gone), len(hosts)))
    if every and (t + 1) % every == 0:
      log(f"  bounded trial {t + 1}/{len(departed_T)} "
          f"({(time.perf_counter() - t0) / (t + 1):.2f} s/trial)")
  return out


# Per-trial columns kept in the JSON (the rest follow from them and the config).
PER_TRIAL = ("departed", "departed_records", "moved", "receivers", "per_receiver_std",
             "max_over_mean_after")


def columns(trials: list[dict]) -> dict:
  """Per-trial figures as columns, floats rounded to 6 digits."""
  return {k: [round(t[k], 6) if isinstance(t[k], float) else t[k] for t in trials]
          for k in PER_TRIAL}


def summarize(trials: list[dict]) -> dict:
  """Mean over trials (std over trials where it says so) of the per-trial figures."""
  def col(key):
    return np.array([t[key] for t in trials], np.float64)

  return {
      "trials": len(trials),
      "receivers_mean": float(col("receivers").mean()),
      "receivers_std": float(col("receivers").std()),
      "per_receiver_mean": float(col("per_receiver_mean").mean()),
      "per_receiver_std": float(col("per_receiver_std").mean()),
      "max_over_mean_before": float(col("max_over_mean_before").mean()),
      "max_over_mean_after_mean": float(col("max_over_mean_after").mean()),
      "max_over_mean_after_worst": float(col("max_over_mean_after").max()),
      "moved_over_ideal_mean": float(col("moved_over_ideal").mean()),
      "moved_over_ideal_std": float(col("moved_over_ideal").std()),
      "moved_over_ideal_worst": float(col("moved_over_ideal").max()),
      "moved_over_departed_mean": float(np.nanmean(col("moved_over_departed"))),
      "only_departed_moved": all(t["only_departed_moved"] for t in trials),
  }


def run(num_hosts: int, trials: int, num_records: int, vnodes_list: list[int], *,
        bounded_trials_count: int, bounded_vnodes: int = 100,
        manifests: tuple[str, ...] = ("files", "cohort"), seed: int = 0,
        every: int = 0) -> dict:
  """The whole study; returns the JSON-ready result (methods in table order)."""
  wall0 = time.perf_counter()
  hosts = host_names(num_hosts)
  departed_T = departures(num_hosts, trials, seed)
  log(f"{num_records} records over {num_hosts} hosts ({num_records / num_hosts:.1f} per host), "
      f"{trials} trials")
  t0 = time.perf_counter()
  builders = {"files": files_manifest, "cohort": lambda n: cohort_manifest(n, seed)}
  built = {name: builders[name](num_records) for name in ("files",) + tuple(manifests)}
  log(f"manifests built in {time.perf_counter() - t0:.1f} s")
  methods = {}
  for vnodes in vnodes_list:
    t0 = time.perf_counter()
    per_trial = ring_trials(built["files"], hosts, departed_T, seed=seed, vnodes=vnodes)
    seconds = time.perf_counter() - t0
    summary = summarize(per_trial)
    summary["receivers_expected"] = ring_expected_receivers(num_records / num_hosts, vnodes,
                                                            num_hosts)
    methods[f"ring-{vnodes}"] = {"kind": "ring", "vnodes": vnodes, "manifest": "files",
                                 "seconds": round(seconds, 2), "summary": summary,
                                 "per_trial": columns(per_trial)}
    s = methods[f"ring-{vnodes}"]["summary"]
    log(f"ring-{vnodes}: {seconds:.1f} s; receivers {s['receivers_mean']:.1f} (expected "
        f"{s['receivers_expected']:.1f}), "
        f"max/mean after {s['max_over_mean_after_mean']:.3f}")
  bounded_T = departed_T[:bounded_trials_count]
  for name in manifests:
    t0 = time.perf_counter()
    log(f"bounded-{bounded_vnodes} ({name}): placing, then {len(bounded_T)} trials")
    per_trial = bounded_trials(built[name], hosts, bounded_T, seed=seed, vnodes=bounded_vnodes,
                               every=every)
    seconds = time.perf_counter() - t0
    key = f"bounded-{bounded_vnodes} ({name})"
    methods[key] = {"kind": "bounded", "vnodes": bounded_vnodes, "manifest": name,
                    "strata": int(len(np.unique(placement.strata(built[name])))),
                    "seconds": round(seconds, 2), "summary": summarize(per_trial),
                    "per_trial": columns(per_trial)}
    s = methods[key]["summary"]
    log(f"{key}: {seconds:.1f} s; receivers {s['receivers_mean']:.1f}, "
        f"max/mean after {s['max_over_mean_after_mean']:.4f}")
  return {
      "config": {"hosts": num_hosts, "trials": trials, "records": num_records,
                 "records_per_host": num_records / num_hosts, "vnodes": list(vnodes_list),
                 "bounded_trials": len(bounded_T), "bounded_vnodes": bounded_vnodes,
                 "manifests": list(manifests), "seed": seed,
                 "ideal_moved": num_records / num_hosts},
      "paper_fig6b_receivers": {str(k): v for k, v in PAPER_RECEIVERS.items()},
      "wall_s": round(time.perf_counter() - wall0, 1),
      "methods": methods,
  }


def table(result: dict) -> str:
  """The Markdown table of the summaries."""
  lines = ["| method | vnodes/host | trials | receivers | receivers expected | "
           "records per receiver | max/mean before | max/mean after (worst) | "
           "moved / ideal (worst) | moved / departed's |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
  for key, m in result["methods"].items():
    s = m["summary"]
    expected = f"{s['receivers_expected']:.1f}" if "receivers_expected" in s else "-"
    lines.append(
        f"| {key} | {m['vnodes']} | {s['trials']} | {s['receivers_mean']:.1f} ± "
        f"{s['receivers_std']:.1f} | {expected} | {s['per_receiver_mean']:.2f} ± "
        f"{s['per_receiver_std']:.2f} | "
        f"{s['max_over_mean_before']:.4f} | {s['max_over_mean_after_mean']:.4f} "
        f"({s['max_over_mean_after_worst']:.4f}) | {s['moved_over_ideal_mean']:.3f} ± "
        f"{s['moved_over_ideal_std']:.3f} ({s['moved_over_ideal_worst']:.3f}) | "
        f"{s['moved_over_departed_mean']:.3f} |")
  return "\n".join(lines)


def markdown(result: dict) -> str:
  c = result["config"]
  return "\n".join([
      "# One host leaves: consistent-hash ring vs bounded loads (cache paper Fig. 6(b) setting)",
      "",
      f"{c['records']:,} records over {c['hosts']} hosts ({c['records_per_host']:g} per host; the "
      f"paper's CosmoFlow training set is 524,288 samples); each trial removes one random host "
      f"from the same initial placement (seed {c['seed']}; the same departed hosts, in order, "
      f"for every method). Ring: {c['trials']} trials per vnode count. Bounded (medjax "
      f"`placement`, vnodes {c['bounded_vnodes']}): the first {c['bounded_trials']} of those "
      f"trials (one `replace_hosts` per trial). Wall time {result['wall_s']:.0f} s.",
      "",
      table(result),
      "",
      "- receivers: hosts that receive moved records, mean ± std over trials; expected: the "
      "ring's analytic mean, (W-1)(1 - exp(-a/(W-1))) with a = V lam/(1+lam) non-empty arcs, "
      "lam = records per host / V (`ring_expected_receivers`).",
      "- records per receiver: mean over trials of the per-trial mean ± mean over trials of the "
      "per-trial std (over receivers).",
      "- max/mean: records on the fullest host / records per host; after = over the survivors, "
      "mean over trials (worst trial).",
      f"- moved / ideal: records that changed host / (records / hosts = {c['ideal_moved']:g}), "
      "mean ± std over trials (worst); moved / departed's: / the departed host's own count.",
      "- files: homogeneous records (one stratum); cohort: medjax cohort proportions, balanced "
      "per stratum (split, modality group, images), each to ±1.",
      "- The paper reports about 3 receivers at 10 vnodes and about 300 at 1000, levelling at "
      "about 350 (Fig. 6(b), 1024 nodes, 500 runs; exact values not given). Receivers depend "
      "on records per host: with V vnodes only the departed host's non-empty arcs send records, "
      "so the ring levels off once V nears the records per host.",
      ""])


def fig6b(result: dict) -> figure.Figure:
  """Receivers (bars, std over trials) and records per receiver (std over receivers) per method."""
  keys = list(result["methods"])
  ms = [result["methods"][k] for k in keys]
  labels = [str(m["vnodes"]) if m["kind"] == "ring" else f"bounded\n{m['manifest']}" for m in ms]
  x = np.arange(len(keys))
  fig = figure.Figure(figsize=(8, 4.2))
  ax = fig.subplots()
  colors = ["tab:blue" if m["kind"] == "ring" else "tab:green" for m in ms]
  ax.bar(x, [m["summary"]["receivers_mean"] for m in ms], 0.6, color=colors,
         yerr=[m["summary"]["receivers_std"] for m in ms], capsize=4)
  ax.set_ylabel("receiver hosts (bars)")
  ax.set_xticks(x, labels)
  ax.set_xlabel("virtual nodes per host (ring)  |  medjax bounded loads (100 vnodes)")
  right = ax.twinx()
  right.errorbar(x, [m["summary"]["per_receiver_mean"] for m in ms],
                 yerr=[m["summary"]["per_receiver_std"] for m in ms], color="tab:red", marker="o",
                 capsize=4, lw=1.5)
  right.set_ylabel("records per receiver (red)", color="tab:red")
  right.set_ylim(bottom=0)
  c = result["config"]
  ax.set_title(f"One of {c['hosts']} hosts leaves ({c['records']:,} records)")
  fig.tight_layout()
  return fig


def load_figure(result: dict) -> figure.Figure:
  """Max/mean load before and after, and records moved against the ideal, per method."""
  keys = list(result["methods"])
  ss = [result["methods"][k]["summary"] for k in keys]
  x = np.arange(len(keys))
  fig = figure.Figure(figsize=(10, 4))
  left, right = fig.subplots(1, 2)
  left.bar(x - 0.2, [s["max_over_mean_before"] for s in ss], 0.4, label="before")
  left.bar(x + 0.2, [s["max_over_mean_after_mean"] for s in ss], 0.4, label="after")
  left.axhline(1.05, color="k", ls="--", lw=1, label="1.05 target")
  left.set_ylabel("max / mean records per host")
  left.set_ylim(bottom=0.9)
  left.legend()
  right.errorbar(x, [s["moved_over_ideal_mean"] for s in ss],
                 yerr=[s["moved_over_ideal_std"] for s in ss], fmt="o", capsize=4,
                 label="mean ± std")
  right.plot(x, [s["moved_over_ideal_worst"] for s in ss], "kv", label="worst trial")
  right.axhline(1.05, color="k", ls="--", lw=1)
  right.set_ylabel("records moved / ideal (records / hosts)")
  right.legend()
  for ax in (left, right):
    ax.set_xticks(x, keys, rotation=30, ha="right", fontsize=8)
  fig.tight_layout()
  return fig


def dumps(obj, indent: str = "") -> str:
  """JSON with one key per line but lists of numbers on one line (per-trial columns)."""
  if isinstance(obj, dict) and obj:
    inner = indent + " "
    items = [f"{inner}{json.dumps(k)}: {dumps(v, inner)}" for k, v in obj.items()]
    return "{\n" + ",\n".join(items) + "\n" + indent + "}"
  return json.dumps(obj)


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--hosts", type=int, default=1024)
  parser.add_argument("--trials", type=int, default=500)
  parser.add_argument("--records", type=int, default=524_288,
                      help="default: the cache paper's CosmoFlow training set (512 per host)")
  parser.add_argument("--vnodes", default="10,50,100,500,1000", help="ring vnodes per host")
  parser.add_argument("--bounded-trials", type=int, default=200,
                      help="trials for bounded loads (about 1 s each at the default scale)")
  parser.add_argument("--bounded-vnodes", type=int, default=100)
  parser.add_argument("--manifests", default="files,cohort", help="manifests for bounded loads")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                    "results"))
  args = parser.parse_args(argv)
  if args.hosts < 2:
    parser.error(f"--hosts {args.hosts}: removing a host needs at least 2")
  manifests = tuple(m for m in args.manifests.split(",") if m)
  if set(manifests) - {"files", "cohort"}:
    parser.error(f"--manifests {args.manifests!r}: names are 'files' and 'cohort'")
  result = run(args.hosts, args.trials, args.records,
               [int(v) for v in args.vnodes.split(",") if v],
               bounded_trials_count=min(args.bounded_trials, args.trials),
               bounded_vnodes=args.bounded_vnodes, manifests=manifests, seed=args.seed,
               every=25)
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "cache_sim.json"), "w") as f:
    f.write(dumps(result) + "\n")
  with open(os.path.join(args.out, "cache_sim.md"), "w") as f:
    f.write(markdown(result))
  fig6b(result).savefig(os.path.join(args.out, "cache_sim_fig6b.png"), dpi=120)
  load_figure(result).savefig(os.path.join(args.out, "cache_sim_load.png"), dpi=120)
  print(table(result))
  log(f"wall {result['wall_s']} s; wrote cache_sim.json, .md, _fig6b.png, _load.png "
      f"in {args.out}")
  return result


if __name__ == "__main__":
  main()
