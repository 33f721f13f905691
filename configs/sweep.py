"""Sweep: an Optuna study over the quickstart's hyperparameters; every trial is a medjax run.

Run (again, with the same --workdir, to resume a sweep that was stopped or killed):
  python launch.py --config configs/sweep.py --workdir runs/sweep
Variants:
  configs/sweep.py:tiny   3 trials of 3 epochs on the tiny quickstart cohort (the tests' sweep)
  configs/sweep.py:tables configs/tables.py's labs path on a table cohort, by validation AUROC:
    python launch.py --config configs/sweep.py:tables --workdir runs/sweep-tables \
        --config.overrides.data.root=COHORT
Watch it (optuna-dashboard is not pinned: pip install optuna-dashboard):
  optuna-dashboard sqlite:///runs/sweep/study.db
A sweep spread over machines: the same command on each, with a shared --workdir and
  --config.study.storage=postgresql://user@dbhost/medjax --config.study.seed=$SLURM_PROCID

The base config is ingested once into <workdir>/data; each trial runs in
<workdir>/trials/trial-NNNN with the searched fields as --config.<field>=<value>, and reports
evals.validation_metric at each epoch end to the study, whose pruner may stop it early. The
report (trials.md, trials.csv, PNGs) is in the workdir. docs/sweeps.md has the details.
"""

import ml_collections
from ml_collections import config_dict


def get_config(arg=None):
  config = ml_collections.ConfigDict()
  config.mode = "sweep"
  # The run config every trial starts from (path[:variant], as --config takes it).
  config.base = "configs/quickstart.py"
  # Base config fields fixed for every trial (nested like the run config). data.* fields that
  # shape the ingest belong here, never in the space: trials share one ingest and cache.
  config.overrides = ml_collections.ConfigDict()
  config.overrides.ckpt = ml_collections.ConfigDict({"keep_best": True})

  # The search space, nested like the run config; each entry one of
  #   ("loguniform", low, high)  ("uniform", low, high)  ("int", low, high[, step])
  #   ("categorical", a, b, ...)  or () to leave the field at the base config's value.
  # DiagnoseNET's model specs: encoder widths and depth, fusion kind, depth and width.
  config.space = space = ml_collections.ConfigDict()
  space.optim = ml_collections.ConfigDict()
  space.optim.lr = ("loguniform", 3e-4, 1e-2)
  space.optim.weight_decay = ("loguniform", 1e-5, 1e-2)
  space.optim.grad_accum = ("categorical", 1, 2)
  space.model = ml_collections.ConfigDict()
  space.model.d_model = ("categorical", 64, 128, 256)
  space.model.image_channels = ("categorical", (16,), (32,), (16, 32), (32, 64))
  space.model.labs_hidden = ("categorical", 64, 128, 256)
  space.model.labs_layers = ("int", 1, 3)
  space.model.vitals_hidden = ("categorical", 32, 64, 128)
  space.model.vitals_layers = ("int", 1, 3)
  space.model.mlp_dim = ("categorical", 128, 256, 512)
  space.model.fusion = ("categorical", "attention", "gated")
  space.model.fusion_layers = ("int", 1, 3)
  space.model.missing = ("categorical", "learned", "zero", "mean")
  space.model.modality_dropout = ("uniform", 0.0, 0.6)
  space.data = ml_collections.ConfigDict()
  space.data.batch_size = ("categorical", 16, 32, 64)

  config.study = study = ml_collections.ConfigDict()
  study.name = "sweep"
  # Optuna storage: '' = sqlite:///<workdir>/study.db; a sweep over several machines gives a
  # database URL they all reach (postgresql://user@host/db).
  study.storage = ""
  # Maximised: a key of the validation split's metrics (higher is better): 'macro_f1',
  # 'accuracy', 'top3_accuracy', 'rare_recall', 'auroc_macro'.
  study.metric = "macro_f1"
  study.n_trials = 30          # finished (complete or pruned) trials, over every resume
  study.sampler = "tpe"        # 'tpe' or 'random'
  study.seed = 0               # sampler seed; give each process of a cluster sweep its own
  study.start_with_base = True  # trial 0 runs the base config's values (those in the space)

  # Pruning on the validation metric at each epoch end: 'asha' (successive halving), 'hyperband'
  # or 'none'. Resources are epochs: a trial is judged after min_resource epochs, then after
  # min_resource x reduction_factor^k, and goes on only in the top 1/reduction_factor of the
  # trials judged there. 1 and 4 are the ASHA paper's and Ray Tune's defaults (grace period 1,
  # eta 4); experiments/bench_asha.py replays other settings on a full-budget sweep's curves.
  config.pruner = pruner = ml_collections.ConfigDict()
  pruner.kind = "asha"
  pruner.min_resource = 1
  pruner.reduction_factor = 4

  config.trials = trials = ml_collections.ConfigDict()
  # The sweep process beats for the trial it runs; a trial silent for grace_s (its sweep
  # process killed, its machine lost) is failed and queued again, up to max_retry times, and
  # resumes from its newest checkpoint.
  trials.heartbeat_s = 30
  trials.grace_s = 120
  trials.max_retry = 2
  trials.timeout_s = 0.0       # a trial's run is stopped (failed) after this long; 0: never
  trials.max_failures_in_a_row = 3   # then the sweep stops with the last reason

  if arg == "tiny":
    config.base = "configs/quickstart.py:tiny"
    config.overrides.optim = ml_collections.ConfigDict({"epochs": 3})
    config.space = space = ml_collections.ConfigDict()
    space.optim = ml_collections.ConfigDict({"lr": ("loguniform", 1e-4, 1e-2)})
    space.model = ml_collections.ConfigDict(
        {"d_model": ("categorical", 32, 64), "fusion": ("categorical", "attention", "gated")})
    study.n_trials = 3
    study.sampler = "random"
    pruner.min_resource = 1
    pruner.reduction_factor = 2
    trials.heartbeat_s = 2
    trials.grace_s = 6
  elif arg == "tables":
    # How configs/tables.py's values were chosen (experiments/results/real_cohorts.md).
    config.base = "configs/tables.py"
    config.overrides = ml_collections.ConfigDict()
    config.overrides.data = ml_collections.ConfigDict({"root": config_dict.placeholder(str)})
    config.space = space = ml_collections.ConfigDict()
    space.optim = ml_collections.ConfigDict({
        "lr": ("loguniform", 3e-4, 1e-2), "weight_decay": ("loguniform", 1e-5, 1e-1),
        "ema_epochs": ("categorical", 0.0, 1.0, 2.0, 5.0)})
    space.model = ml_collections.ConfigDict({
        "labs_bins": ("categorical", 4, 8, 16, 32),
        "labs_embed_width": ("categorical", 4, 8, 16),
        "labs_hidden": ("categorical", 64, 128, 256),
        "labs_layers": ("int", 1, 3),
        "d_model": ("categorical", 64, 128)})
    space.data = ml_collections.ConfigDict({"batch_size": ("categorical", 32, 64, 128)})
    study.metric = "auroc_macro"
    study.n_trials = 24
  elif arg:
    raise ValueError(f"configs/sweep.py: unknown variant {arg!r}; use 'tiny', 'tables' or none")
  return config
