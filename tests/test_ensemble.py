"""config.model.members: a packed deep ensemble trained by its members' own losses."""

import jax
import numpy as np
import pytest
from flax import nnx

from configs import default as default_config
from medjax import config_check
from medjax import model as model_lib
from medjax.model import ensemble, fusion
from medjax.train import optim
from medjax.train import state as state_lib
from medjax.train import step as step_lib
from tests.test_model import SHAPES, _batch


def _config(members):
  config = default_config.get_config()
  config.model.members = members
  config.model.modality_dropout = 0.0   # the members' losses below are compared without dropout
  config.model.fusion = "gated"          # (compiles faster than attention; the same members)
  return config


def _build(config):
  mesh = state_lib.make_mesh(config.mesh, jax.devices()[:1])
  tx, _ = optim.make(config.optim, 100)
  state, built = state_lib.build(config.model, tx, mesh, num_classes=5, shapes=SHAPES, seed=0)
  return state, built, mesh, tx


def test_one_member_is_the_plain_model_and_its_state_is_unchanged():
  plain = model_lib.create(default_config.get_config().model, num_classes=5, shapes=SHAPES,
                           seed=0)
  assert isinstance(plain, fusion.FusionModel)
  one = model_lib.create(_config(1).model, num_classes=5, shapes=SHAPES, seed=0)
  assert isinstance(one, fusion.FusionModel)
  three = model_lib.create(_config(3).model, num_classes=5, shapes=SHAPES, seed=0)
  assert isinstance(three, ensemble.Ensemble) and len(three.members) == 3
  count = lambda m: sum(x.size for x in jax.tree.leaves(nnx.state(m, nnx.Param)))
  assert count(three) == 3 * count(one)


def test_members_start_apart_and_predict_the_mean_of_their_probabilities():
  model = model_lib.create(_config(3).model, num_classes=5, shapes=SHAPES, seed=0)
  batch = _batch(np.random.default_rng(0))
  logits = ensemble.member_logits(model, batch)
  assert logits.shape == (3, 12, 5)
  assert not np.allclose(logits[0], logits[1]) and not np.allclose(logits[1], logits[2])
  for k, member in enumerate(model.members):
    np.testing.assert_allclose(logits[k], member(batch), rtol=1e-6)
  probs = ensemble.probabilities(logits)
  np.testing.assert_allclose(probs, jax.nn.softmax(logits, -1).mean(0), rtol=1e-6)
  np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-5)
  # A plain model's logits are one member's.
  plain = model_lib.create(_config(1).model, num_classes=5, shapes=SHAPES, seed=0)
  assert ensemble.member_logits(plain, batch).shape == (1, 12, 5)


def test_each_member_learns_from_its_own_loss_only():
  """The ensemble's loss is the mean of its members' losses: member k's gradient is the
  gradient of member k's own loss over the members (it would involve the others' outputs if the
  loss were taken on the averaged prediction), and the predict step gives the mean of the
  members' probabilities."""
  state, built, mesh, _ = _build(_config(3))
  batch = _batch(np.random.default_rng(1), n=16)
  sharded = jax.device_put(batch, state_lib.batch_sharding(mesh))
  loss, grads = step_lib.make_grad_fn(built.graphdef, built, mesh, seed=0)(state, sharded)
  model = nnx.merge(built.graphdef, state["params"], state["fill"])
  own = []
  for k, member in enumerate(model.members):
    graphdef, params, fill = nnx.split(member, nnx.Param, fusion.FillValue)
    params, fill = nnx.to_pure_dict(params), nnx.to_pure_dict(fill)
    (member_loss, _), member_grads = jax.jit(jax.value_and_grad(
        lambda p, f, graphdef=graphdef: step_lib.loss_and_metrics(
            graphdef, p, f, batch, None, train=False), has_aux=True))(params, fill)
    own.append(float(member_loss))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b / 3, rtol=2e-4, atol=1e-7),
                 grads["members"][k], member_grads)
  assert float(loss) == pytest.approx(np.mean(own), rel=1e-5)
  probs = step_lib.make_predict_step(built.graphdef, built, mesh)(state, sharded)
  np.testing.assert_allclose(probs, ensemble.probabilities(ensemble.member_logits(model, batch)),
                             rtol=1e-5, atol=1e-7)


def test_an_ensemble_trains_with_modality_dropout_and_its_size_is_checked():
  config = _config(2)
  config.model.modality_dropout = 0.3
  state, built, mesh, tx = _build(config)
  train_step = step_lib.make_train_step(built.graphdef, tx, built, mesh, seed=0)
  batch = jax.device_put(_batch(np.random.default_rng(2), n=16), state_lib.batch_sharding(mesh))
  losses = []
  for _ in range(5):
    state, metrics = train_step(state, batch)
    losses.append(float(metrics["loss"]))
  assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]
  config.model.members = 0
  problems = config_check.problems(config)
  assert any("model.members" in p for p in problems), problems
