"""Training end to end, in this process, for each missing-modality policy of the ablation."""

import math
import os

import numpy as np
import pytest

import jax

from configs import quickstart
from medjax.checkpoint import checkpointer
from medjax.data import loader
from medjax.runtime import phases as phases_lib
from medjax.train import loop
from medjax.train import prepare as prepare_lib


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


def test_the_step_compiles_beside_the_data_setup_for_the_batches_that_come(cohort):
  """The model is built and its step compiled on a thread while the data is set up, for a batch
  of padding of the real batches' types: the first real batch is not traced, lowered or compiled
  again."""
  config = quickstart.get_config("tiny")
  config.data.root = str(cohort / "cohort")
  config.data.salt_file = str(cohort / "id_salt")
  phases = phases_lib.Phases()
  prepared = prepare_lib.prepare(config, str(cohort / "beside"), phases=phases)
  assert set(phases.beside_data) == {"model_build", "compile"}, phases.beside_data
  assert phases.beside_data["compile"] > 0 and "model_build" not in phases.seconds
  assert {"data_setup", "compile"} <= set(phases.seconds), phases.seconds
  assert phases.compile_cache["hits"] + phases.compile_cache["misses"] > 0

  steps = prepared.data.plan(0).steps[0]
  real = next(iter(prepare_lib.data_batches(config, prepared.reader, steps, 0,
                                            prepared.batch_sharding)))[2]
  padding = loader.padding_batch(prepared.data.shapes, prepared.data.tables,
                                 prepared.batch_sharding, config.data.batch_size)
  kind = lambda x: (type(x), x.shape, x.dtype)
  assert jax.tree.map(kind, padding) == jax.tree.map(kind, real)
  assert not padding["weight"].any()

  events = []
  listener = lambda event, seconds, **kw: events.append(event)
  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    state = prepared.built.create()
    events.clear()
    jax.block_until_ready(prepared.train_step(state, real))
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
  compiled = [e for e in events if e.startswith("/jax/core/compile/")]
  assert not compiled, compiled
