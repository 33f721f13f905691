"""Evaluation below the trainer: what a run's results are and how they are written.

  metrics   classification metrics over predicted probabilities (numpy, host side)
  splits    predictions over a split and its metrics, beside the Bayes ceiling's
  summary   summary.json (strict JSON) and the figures
  table     the plain-text summary table (no jax or matplotlib: the launcher prints it)

The notebook's entry point, which loads any workdir's checkpoint, is `medjax.evaluate`.
"""
