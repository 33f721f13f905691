"""medjax.programs: process 1 of a two-process CPU run keeps its compiled programs on disk.

Real jax.distributed processes over gloo on loopback, three runs on one compilation cache:
the first compiles and keeps, the second loads instead of compiling, the third finds its entry
damaged, compiles again and repairs it. Every run computes the same (cross-process) sum.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from medjax.fault import protocol

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = textwrap.dedent("""
    import json, sys
    import jax, numpy as np
    from medjax import programs
    process, port, cache = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.config.update("jax_compilation_cache_dir", cache)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=process)
    compiles = []
    real_compile = jax.stages.Lowered.compile
    jax.stages.Lowered.compile = lambda self, *a, **k: compiles.append(1) or real_compile(
        self, *a, **k)
    mesh = jax.make_mesh((2,), ("d",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("d"))
    x = jax.make_array_from_process_local_data(
        sharding, np.full((3,), process + 1, np.float32))
    double_sum = programs.cached(jax.jit(lambda a: (2 * a).sum()))
    total = float(double_sum(x))
    again = float(double_sum(x))   # the same executable, not loaded a second time
    compiled = len(compiles)
    # Two argument trees that lower to one program (jax.jit leaves the unused entry out) are two
    # entries: each executable takes its own tree.
    for state in ({"a": x}, {"a": x, "unused": x}):
      assert float(programs.cached(jax.jit(lambda s: (2 * s["a"]).sum()))(state)) == total
    print(json.dumps({"process": process, "needed": programs.needed(), "total": total,
                      "again": again, "compiles": compiled}))
    jax.distributed.shutdown()
""")


def _run_pair(cache: str) -> dict:
  port = protocol.free_port()
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1",
             JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  procs = [subprocess.Popen([sys.executable, "-c", SCRIPT, str(p), str(port), cache], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for p in (0, 1)]
  out = {}
  for p, proc in enumerate(procs):
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr[-3000:]
    out[p] = json.loads(stdout.strip().splitlines()[-1])
    out[p]["stderr"] = stderr
  return out


def test_process_one_loads_what_it_compiled_and_survives_a_damaged_entry(tmp_path):
  cache = str(tmp_path / "jax_cache")
  first = _run_pair(cache)
  # Process 0 is served by JAX's own persistent cache; process 1 by medjax.programs.
  assert not first[0]["needed"] and first[1]["needed"]
  assert first[0]["total"] == first[1]["total"] == first[1]["again"] == 2 * 3 * (1 + 2)
  assert first[1]["compiles"] == 1
  entries = os.listdir(os.path.join(cache, "process-1"))
  assert len(entries) == 3   # the sum, and the same sum for each of two trees
  # The first written is the sum's (`compiles` counts its compilations only).
  entry = min(entries, key=lambda e: os.path.getmtime(os.path.join(cache, "process-1", e)))

  second = _run_pair(cache)
  assert second[1]["compiles"] == 0                   # loaded, not compiled
  assert second[1]["total"] == second[1]["again"] == 18.0

  with open(os.path.join(cache, "process-1", entry), "wb") as f:
    f.write(b"not an executable")
  third = _run_pair(cache)
  assert third[1]["compiles"] == 1 and third[1]["total"] == 18.0
  assert "unreadable" in third[1]["stderr"] and "compiling it again" in third[1]["stderr"]
  fourth = _run_pair(cache)                           # the entry was written anew
  assert fourth[1]["compiles"] == 0 and fourth[1]["total"] == 18.0
