"""Quickstart: a small synthetic cohort, ingested and trained on a laptop's CPU in minutes.

Run:
  python launch.py --config configs/quickstart.py
Variants:
  configs/quickstart.py:ingest   only synthesise and ingest the cohort (no training)
"""

from configs import default


def get_config(arg=None):
  config = default.get_config(arg)
  config.data.synthetic.num_patients = 1500
  config.data.synthetic.image_size = 64
  config.data.image_size = 32
  config.data.num_partitions = 4
  return config
