"""What each --scale of the report runs: the config, the failures injected, the simulator's
trials, the ablation's seeds."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Scale:
  """One size of the report.

  Attributes:
    name: 'tiny' (the test's), 'quickstart', 'default'.
    config: launch.py's --config for every measured run.
    overrides: extra --config.* flags for every measured run.
    fault_fractions: where in training (fractions of its global steps) the crash, the hang, the
      out-of-memory error and the lost host are injected, in that order.
    time_fraction: the time-based strategy saves every this fraction of the clean run's
      training seconds.
    every_k: the lineage+every-k strategy's ckpt.every_steps.
    ablation: (policies, seeds) of the missing-modality ablation, or None (reuse the committed
      result, labelled with its cohort).
    sim_trials, sim_workers: the simulator's Monte Carlo trials and worker counts.
  """
  name: str
  config: str
  overrides: tuple[str, ...] = ()
  fault_fractions: tuple[float, float, float, float] = (0.2, 0.4, 0.6, 0.8)
  time_fraction: float = 0.1
  every_k: int = 8
  ablation: tuple[str, tuple[int, ...]] | None = ("learned,zero,mean,drop", (0, 1, 2))
  sim_trials: int = 300
  sim_workers: tuple[int, ...] = tuple(2 ** i for i in range(2, 15))


SCALES = {
    "tiny": Scale("tiny", "configs/quickstart.py:tiny", ("--config.optim.epochs=3",),
                  every_k=4, ablation=None, sim_trials=20, sim_workers=(4, 64, 16384)),
    "quickstart": Scale("quickstart", "configs/quickstart.py"),
    "default": Scale("default", "configs/default.py", every_k=25),
}
