"""Quickstart: a small synthetic cohort, ingested and trained on a laptop's CPU in minutes.

Run:
  python launch.py --config configs/quickstart.py
Variants:
  configs/quickstart.py:ingest   only synthesise and ingest the cohort (no training)
  configs/quickstart.py:tiny     a 300-patient cohort and 2 short epochs (the tests' runs)
"""

from configs import default


def get_config(arg=None):
  config = default.get_config(None if arg == "tiny" else arg)
  # Tuned on three fresh splits (experiments/results/tuning.md): this model at this cohort size
  # is limited by training-set size, so more patients and stronger modality dropout beat a
  # bigger image encoder.
  config.data.synthetic.num_patients = 6000
  config.data.synthetic.image_size = 64
  config.data.image_size = 16
  config.data.num_partitions = 4
  config.model.image_channels = (32,)
  config.model.modality_dropout = 0.5
  # Wide enough that the step's matmuls use the CPU well (0.32 of a large matmul's FLOP/s at
  # d_model 256 vs 0.13 at 64; experiments/bench_train.py). On one split: 0.880 of the ceiling
  # vs 0.893 with d_model 64, in 2m48s vs 2m30s.
  config.model.d_model = 256
  config.model.mlp_dim = 512
  config.model.labs_hidden = 256
  config.model.vitals_hidden = 128
  config.optim.epochs = 15
  if arg == "tiny":
    config.data.synthetic.num_patients = 300
    config.data.synthetic.image_size = 32
    config.data.image_size = 16
    config.data.num_partitions = 3
    config.data.batch_size = 16
    config.model.image_channels = (8, 16)
    config.model.d_model, config.model.mlp_dim = 64, 128
    config.model.labs_hidden, config.model.vitals_hidden = 128, 64
    config.model.modality_dropout = 0.15
    config.optim.epochs = 2
    config.evals.splits = ("test",)
    config.evals.bootstrap = 50
    config.ckpt.every_steps = 4
    config.fault.timeout_training_s = 4.0
    config.fault.backoff_s = 0.5
  return config
