"""Table-heavy cohorts: most of the signal in labs and other table columns (demographics,
scores, indicators), few or no images and series.

Run:
  python launch.py --config configs/tables.py --config.data.root=COHORT --workdir runs/NAME

Each lab (table) column gets its own piecewise-linear embedding between its training quantiles
(Gorishniy et al. 2022), an unmeasured one its own learned missing embedding, and the labs MLP
reads the embeddings instead of the raw z-scored values: a skewed lab (bilirubin, copper) is
split where its values lie, as a tree would. Chosen on the public cohorts' benchmark
(experiments/real_cohorts; experiments/results/real_cohorts.md), where it beat the default
config on every cohort and feature tokens (model.labs_tokens) and the best-on-validation
checkpoint with 30 epochs did worse than either.
"""

from configs import default


def get_config(arg=None):
  config = default.get_config(arg)
  config.model.labs_embedding = "piecewise"
  config.model.labs_bins = 16
  config.model.labs_embed_width = 8
  return config
