"""Training end to end, in this process, for each missing-modality policy of the ablation."""

import math
import os

import numpy as np
import pytest

from configs import quickstart
from medjax.checkpoint import checkpointer
from medjax.train import loop


@pytest.fixture(scope="module")
def cohort(tmp_path_factory):
  """One tiny synthetic cohort (and salt) shared by the runs."""
  base = tmp_path_factory.mktemp("train")
  config = quickstart.get_config("tiny")
  from medjax.data import synthetic  # pylint: disable=import-outside-toplevel
  synthetic.generate(config.data.synthetic, str(base / "cohort"))
  return base


@pytest.mark.parametrize("missing", ["zero", "mean", "drop"])
def test_ablation_policies_train_and_evaluate(cohort, missing):
  config = quickstart.get_config("tiny")
  config.data.root = str(cohort / "cohort")
  config.data.salt_file = str(cohort / "id_salt")
  config.optim.epochs = 1
  config.model.missing = missing
  config.fault.ledger = False
  workdir = str(cohort / missing)
  summary = loop.train_and_evaluate(config, workdir)
  assert summary["test"]["count"] > 0 and math.isfinite(summary["test"]["macro_f1"])
  arrays, step = checkpointer.load_arrays(os.path.join(workdir, "checkpoints"))
  assert step == summary["train"]["global_step"] > 0
  if missing == "mean":
    # The mean training image was written into the fill values before training.
    assert np.abs(arrays["['fill']['image_fill']"]).sum() > 0
  assert all(np.isfinite(x).all() for k, x in arrays.items() if k.startswith("['params']"))
