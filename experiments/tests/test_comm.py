"""experiments/failure_sim/comm: the exchange's bytes (from the compiled step) and its time."""

import jax
import pytest

from configs import quickstart
from experiments import failure_sim as fs
from experiments.failure_sim import comm

LINK = comm.Link("test", bandwidth_Bps=1e9, latency_s=1e-5, source="test")


def test_ring_all_reduce_time_and_bytes_per_mode():
  assert comm.ring_allreduce_s(1e9, 1, LINK) == 0.0
  # 2 (p-1) latency + 2 (p-1)/p n / bandwidth: p = 4, 1 GB at 1 GB/s.
  assert comm.ring_allreduce_s(1e9, 4, LINK) == pytest.approx(6e-5 + 1.5)
  sync = comm.Exchange("sync", 1e9, LINK)
  local = comm.Exchange("local", 1e9, LINK, every=16)
  assert local.per_step_s(4) == pytest.approx(sync.per_step_s(4) / 16)
  assert sync.sent_per_step(4) == pytest.approx(1.5e9)
  assert local.sent_per_step(4) == pytest.approx(1.5e9 / 16)


def test_all_reduce_bytes_are_read_from_hlo_text():
  hlo = """
  %all-reduce.3 = f32[128,64]{1,0} all-reduce(f32[128,64]{1,0} %p), replica_groups={{0,1}}
  %ar = (f32[10]{0}, bf16[4,2]{1,0}) all-reduce-start(%a, %b), to_apply=%add
  %x = f32[999]{0} add(f32[999]{0} %y, f32[999]{0} %z)
  """
  assert comm.allreduce_bytes(hlo) == 128 * 64 * 4 + 10 * 4 + 8 * 2


def test_the_compiled_step_exchanges_the_gradient_in_sync_and_the_deltas_in_local_mode():
  """The bytes term, checked against medjax's own compiled step on 2 devices: a synchronous
  step all-reduces 4 bytes per parameter (and a few scalars for the metrics); the local mode
  exchanges the same bytes once per averaging, nothing else but the metrics."""
  for mode in ("sync", "local"):
    config = quickstart.get_config()
    config.optim.mode, config.optim.replicas = mode, 2
    config.model.update(d_model=16, image_channels=(4,), labs_hidden=16, vitals_hidden=8,
                        mlp_dim=16)
    m = comm.measured_step_bytes(config, jax.devices()[:2])
    assert m["params"] > 5_000
    assert m["gradient_bytes"] <= m["allreduce_bytes"] <= m["gradient_bytes"] + 64, m
    assert m["every"] == (1 if mode == "sync" else config.optim.local_steps)
    if mode == "local":
      assert m["inner_step_allreduce_bytes"] == 0, m


def test_table_v_with_an_exchange_loses_efficiency_with_workers_and_local_loses_less():
  costs = fs.Costs(checkpoint_s=0.0, detect_s={k: 10.0 for k in fs.KINDS},
                   recover_s={"x": 20.0}, recovery_path="x", name="test")
  rate = fs.FailureRate("none", accelerator_mtbf_h=1e12, mix={"crash": 1.0}, source="test",
                        mix_source="test")
  job = fs.Job(step_s=1.0, partition_steps=10, partitions_per_epoch=4, epochs=2, name="t")
  slow = comm.Link("slow", bandwidth_Bps=1e8, latency_s=0.0, source="test")
  kw = {"job": job, "workers": (4, 8, 16), "ref_workers": 4, "trials": 5}
  free = fs.table_v(costs, rate, **kw)
  sync = fs.table_v(costs, rate, exchange=comm.Exchange("sync", 1e7, slow), **kw)
  local = fs.table_v(costs, rate, exchange=comm.Exchange("local", 1e7, slow, every=10), **kw)
  assert [r["comm_share"] for r in free] == [0.0, 0.0, 0.0]
  assert [r["efficiency"] for r in free] == pytest.approx([1.0, 1.0, 1.0], abs=1e-3)
  eff = [r["efficiency"] for r in sync]
  assert eff[0] == 1.0 and eff[1] < 0.95 and eff[2] < eff[1]
  assert all(l["efficiency"] > s["efficiency"] for l, s in zip(local[1:], sync[1:]))
  # The weak-scaling table: the step plus its share of each exchange.
  (row,) = comm.weak_scaling(0.01, 1e7, (2,), links={"slow": slow}, modes=(("sync", 1),))
  assert row["by_workers"][2]["efficiency"] == pytest.approx(0.01 / (0.01 + 0.1))
