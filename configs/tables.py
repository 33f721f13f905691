"""Table-heavy cohorts: most of the signal in labs and other table columns (demographics,
scores, indicators), few or no images and series.

Run:
  python launch.py --config configs/tables.py --config.data.root=COHORT --workdir runs/NAME

Each lab (table) column becomes its own token, embedded piecewise-linearly between its training
quantiles (Gorishniy et al. 2022; FT-Transformer's feature tokens), beside the image and vitals
tokens; validation AUROC picks the checkpoint the test split is scored on, and training stops
when it has not improved for a while. Chosen on the public cohorts' benchmark
(experiments/real_cohorts, experiments/results/real_cohorts.md).
"""

from configs import default


def get_config(arg=None):
  config = default.get_config(arg)
  config.model.labs_tokens = True
  config.model.labs_bins = 16
  config.ckpt.keep_best = True
  config.evals.validation_metric = "auroc_macro"
  config.optim.epochs = 30
  config.optim.early_stopping_patience = 8
  return config
