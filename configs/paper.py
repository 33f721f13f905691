"""Paper scale: the lineage paper's cohort shape (53,420 patients, 37 classes, 43 analytes).

Run (on a cluster; see docs/multi-host.md and deploy/):
  python launch.py --config configs/paper.py --workdir /pfs/runs/paper
Variants:
  configs/paper.py:ingest   only synthesise and ingest the cohort
"""

from configs import default


def get_config(arg=None):
  config = default.get_config(arg)
  config.data.synthetic.num_patients = 53420
  config.data.synthetic.image_size = 128
  config.data.image_size = 64
  config.data.num_partitions = 16
  config.data.batch_size = 512
  # About 31M parameters, as in the paper.
  config.model.d_model = 512
  config.model.image_channels = (64, 128, 256, 512)
  config.model.labs_hidden = 512
  config.model.vitals_hidden = 256
  config.model.fusion_layers = 8
  config.model.heads = 8
  config.model.mlp_dim = 2048
  config.optim.lr = 3e-4
  config.fault.local_hosts = 1
  return config
