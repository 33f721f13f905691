"""Sweeps: Optuna studies whose trials are ordinary medjax runs (docs/sweeps.md).

  spec      the sweep config: base config, overrides, search space; each trial's flags
  shared    the one ingest every trial shares
  studies   the study: storage (SQLite or an RDB URL), sampler, pruner, dead trials
  runner    `medjax --config configs/sweep.py`: the trials as medjax children
  process   a medjax child: started, stopped, its failure in one line
  trial     the trainer's side: `trial.reporter(config)` reports each epoch, relays pruning
  report    trials.csv, trials.md and the PNGs

Modules are imported by name (`from medjax.sweep import trial`); importing the package imports
neither optuna nor jax.
"""
