"""The fusion model: shapes, masks, missing-modality policies, dropout, size, device invariance."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs import default as default_config
from configs import paper as paper_config
from medjax import errors
from medjax import model as model_lib
from medjax.data import records
from medjax.model import fusion
from medjax.train import optim
from medjax.train import state as state_lib
from medjax.train import step as step_lib

SHAPES = records.Shapes(image_size=16, max_images=3, num_analytes=7, vitals_steps=5,
                        vitals_channels=6)


def _batch(rng, n=12, shapes=SHAPES):
  """Random records with every modality pattern, partial labs and partial vitals."""
  b = records.empty(shapes, n)
  b["images"] = rng.random(b["images"].shape).astype(np.float32)
  b["labs"] = rng.normal(size=b["labs"].shape).astype(np.float32)
  b["vitals"] = rng.normal(size=b["vitals"].shape).astype(np.float32)
  for i in range(n):
    pattern = (i % 7) + 1
    if pattern & 1:
      b["image_mask"][i, : 1 + i % shapes.max_images] = True
    if pattern & 2:
      b["labs_mask"][i] = rng.random(shapes.num_analytes) < 0.7
      b["labs_mask"][i, 0] = True
    if pattern & 4:
      b["vitals_mask"][i] = rng.random((shapes.vitals_steps, shapes.vitals_channels)) < 0.8
      b["vitals_mask"][i, 0, 0] = True
  b["label"] = rng.integers(0, 5, n).astype(np.int32)
  b["weight"] = np.ones(n, np.float32)
  return b


def _garbage(batch, rng):
  """The same batch with NaN and noise wherever a mask says 'not there'."""
  out = dict(batch)
  out["images"] = np.where(batch["image_mask"][..., None, None], batch["images"], np.nan)
  out["labs"] = np.where(batch["labs_mask"], batch["labs"], rng.normal(size=batch["labs"].shape) * 1e3)
  out["vitals"] = np.where(batch["vitals_mask"], batch["vitals"], np.nan)
  return out


def _model(missing="learned", fusion_kind="attention", **kw):
  config = default_config.get_config()
  config.model.missing = missing
  config.model.fusion = fusion_kind
  config.model.update(kw)
  return model_lib.create(config.model, num_classes=5, shapes=SHAPES, seed=0)


@pytest.mark.parametrize("missing", fusion.MISSING_POLICIES)
@pytest.mark.parametrize("fusion_kind", ["attention", "gated"])
def test_output_ignores_whatever_sits_in_masked_inputs(missing, fusion_kind):
  rng = np.random.default_rng(0)
  m = _model(missing, fusion_kind)
  batch = _batch(rng)
  clean = m(jax.tree.map(jnp.asarray, batch))
  dirty = m(jax.tree.map(jnp.asarray, _garbage(batch, rng)))
  assert clean.shape == (12, 5)
  assert np.isfinite(np.asarray(dirty)).all()
  np.testing.assert_allclose(np.asarray(clean), np.asarray(dirty), rtol=1e-5, atol=1e-5)
  # Training-mode gradients are finite too (jnp.where, not multiplication by the mask).
  dirty = jax.tree.map(jnp.asarray, _garbage(batch, rng))
  floats = {k: dirty[k] for k in ("images", "labs", "vitals")}
  grads = jax.grad(lambda f: m(dict(dirty, **f), train=True, rng=jax.random.key(1)).sum())(floats)
  for k in floats:
    assert np.isfinite(np.asarray(grads[k])).all(), k


def test_learned_missing_embedding_is_what_an_absent_modality_contributes():
  rng = np.random.default_rng(1)
  m = _model("learned")
  batch = _batch(rng)
  has_labs = batch["labs_mask"].any(1)
  before = np.asarray(m(jax.tree.map(jnp.asarray, batch)))
  noise = jax.random.normal(jax.random.key(5), m.missing_embed[...].shape[1:])
  m.missing_embed[...] = m.missing_embed[...].at[1].add(noise)
  after = np.asarray(m(jax.tree.map(jnp.asarray, batch)))
  change = np.abs(after - before).max(1)
  assert (change[~has_labs] > 1e-2).all()          # records without labs use the embedding
  np.testing.assert_allclose(change[has_labs], 0, atol=1e-6)  # records with labs do not


def test_modality_dropout_never_drops_every_modality():
  rng = np.random.default_rng(2)
  present = jnp.asarray(rng.random((20000, 3)) < 0.6)
  present = present.at[:, 0].set(present[:, 0] | ~present.any(1))
  kept = np.asarray(fusion.modality_dropout(jax.random.key(0), present, 0.9))
  assert kept.any(1).all()
  assert not (kept & ~np.asarray(present)).any()  # never adds a modality
  # With p small, the drop rate of a present modality is about p.
  kept = np.asarray(fusion.modality_dropout(jax.random.key(1), present, 0.15))
  rate = 1 - kept[np.asarray(present)].mean()
  assert 0.10 < rate < 0.16


def test_paper_model_has_about_31m_parameters():
  config = paper_config.get_config()
  shapes = records.Shapes(image_size=config.data.image_size, max_images=4, num_analytes=43,
                          vitals_steps=24, vitals_channels=6)
  n = state_lib.count_params(config.model, num_classes=37, shapes=shapes)
  assert 29e6 < n < 33e6, n


def test_auto_dtype_is_float32_on_cpu_and_bfloat16_elsewhere(monkeypatch):
  assert fusion.compute_dtype("auto") == jnp.float32   # the tests run on CPU
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  assert fusion.compute_dtype("auto") == jnp.bfloat16
  assert fusion.compute_dtype("float32") == jnp.float32


def test_bfloat16_computes_in_bfloat16_and_keeps_parameters_and_optimizer_in_float32():
  """model.dtype is the compute dtype: every parameter, the optimizer's state, the fill values
  and the loss stay float32 (mixed precision: the state is the same whatever the compute dtype),
  and training steps run with finite losses."""
  config = default_config.get_config()
  config.model.dtype = "bfloat16"
  mesh = state_lib.make_mesh(config.mesh, jax.devices()[:1])
  tx, _ = optim.make(config.optim, 100)
  state, built = state_lib.build(config.model, tx, mesh, num_classes=5, shapes=SHAPES, seed=0)
  floats = [x.dtype for x in jax.tree.leaves((state["params"], state["opt"], state["fill"]))
            if jnp.issubdtype(x.dtype, jnp.floating)]
  assert floats and set(floats) == {jnp.dtype(jnp.float32)}
  train_step = step_lib.make_train_step(built.graphdef, tx, built, mesh, seed=0)
  batch = jax.device_put(_batch(np.random.default_rng(1), n=16), state_lib.batch_sharding(mesh))
  assert "xbf16>" in train_step.lower(state, batch).as_text()   # the compute
  for _ in range(3):
    state, metrics = train_step(state, batch)
  assert metrics["loss"].dtype == jnp.float32 and np.isfinite(float(metrics["loss"]))
  assert {x.dtype for x in jax.tree.leaves(state["params"])} == {jnp.dtype(jnp.float32)}


def test_same_global_batch_same_loss_and_grads_on_1_and_8_devices():
  assert len(jax.devices()) == 8
  config = default_config.get_config()
  rng = np.random.default_rng(3)
  batch = _batch(rng, n=16)
  results = []
  for devices in (jax.devices()[:1], jax.devices()):
    mesh = state_lib.make_mesh(config.mesh, devices)
    tx, _ = optim.make(config.optim, 100)
    state, built = state_lib.build(config.model, tx, mesh, num_classes=5, shapes=SHAPES, seed=0)
    grad_fn = step_lib.make_grad_fn(built.graphdef, built, mesh, seed=0)
    sharded = jax.device_put(batch, state_lib.batch_sharding(mesh))
    loss, grads = grad_fn(state, sharded)
    results.append((float(loss), jax.tree.map(np.asarray, grads)))
  assert results[0][0] == pytest.approx(results[1][0], rel=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
               results[0][1], results[1][1])


def test_fsdp_mesh_shards_parameters_and_matches():
  config = default_config.get_config()
  config.mesh.fsdp = 2
  mesh = state_lib.make_mesh(config.mesh)
  assert dict(mesh.shape) == {"data": 4, "fsdp": 2}
  tx, _ = optim.make(config.optim, 10)
  state, built = state_lib.build(config.model, tx, mesh, num_classes=5, shapes=SHAPES, seed=0)
  specs = [s.spec for s in jax.tree.leaves(built.shardings["params"])]
  assert any("fsdp" in tuple(s) for s in specs)
  train_step = step_lib.make_train_step(built.graphdef, tx, built, mesh, seed=0)
  batch = jax.device_put(_batch(np.random.default_rng(4), n=16), state_lib.batch_sharding(mesh))
  state, metrics = train_step(state, batch)
  assert np.isfinite(float(metrics["loss"])) and int(state["step"]) == 1


@pytest.mark.parametrize("failure", [AssertionError(), RuntimeError("Unable to initialize "
                                                                      "backend 'cuda'")])
def test_a_platform_jax_cannot_start_is_one_line_that_says_what_to_do(monkeypatch, failure):
  def devices():
    raise failure
  monkeypatch.setattr(state_lib.jax, "devices", devices)
  monkeypatch.setenv("JAX_PLATFORMS", "cuda")
  with pytest.raises(errors.InputError, match=r"JAX could not start JAX_PLATFORMS=cuda .*"
                                              r"set JAX_PLATFORMS=cpu") as e:
    state_lib.make_mesh(default_config.get_config().mesh)
  assert "\n" not in str(e.value)


def test_the_optimiser_keeps_a_debiased_moving_average_of_the_parameters_after_each_update():
  """optim.ema_epochs: after each update (not each accumulation step) the optimiser state's
  average takes the new parameters with decay exp(-1 / (ema_epochs x updates per epoch));
  `evaluated_params` divides out the zero start's bias, and gives the parameters before any
  update."""
  config = default_config.get_config()
  config.optim.update(ema_epochs=0.5, epochs=2, grad_accum=2, warmup_fraction=0.0)
  tx, _ = optim.make(config.optim, 16)       # 8 updates in 2 epochs: 4 per epoch
  decay = np.exp(-1 / (0.5 * 4))
  rng = np.random.default_rng(0)
  params = {"w": jnp.asarray(rng.normal(size=(3, 2)), jnp.float32), "b": jnp.zeros(2)}
  opt = tx.init(params)
  np.testing.assert_array_equal(optim.evaluated_params(params, opt)["w"], params["w"])

  @jax.jit
  def step(grads, opt, params):
    updates, opt = tx.update(grads, opt, params)
    return optax.apply_updates(params, updates), opt

  after_updates = []
  for i in range(10):
    grads = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), params)
    params, opt = step(grads, opt, params)
    if i % 2 == 1:
      after_updates.append(jax.tree.map(lambda x: np.asarray(x, np.float64), params))
  n = len(after_updates)
  expected = jax.tree.map(
      lambda *ps: sum((1 - decay) * decay ** (n - 1 - j) * p for j, p in enumerate(ps))
      / (1 - decay ** n), *after_updates)
  evaluated = optim.evaluated_params(params, opt)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
               jax.tree.map(np.asarray, evaluated), expected)
  assert not np.allclose(evaluated["w"], params["w"])


def test_prediction_uses_the_parameters_moving_average():
  """With optim.ema_epochs, the predict step (validation, the best checkpoint's choice, test
  scores) predicts with the optimiser state's average, not the parameters."""
  config = default_config.get_config()
  config.optim.ema_epochs = 1.0
  config.model.update(fusion="gated", d_model=16, image_channels=(4,), labs_hidden=16,
                      vitals_hidden=8, heads=2, mlp_dim=16)
  mesh = state_lib.make_mesh(config.mesh, jax.devices()[:1])
  tx, _ = optim.make(config.optim, 20)
  state, built = state_lib.build(config.model, tx, mesh, num_classes=5, shapes=SHAPES, seed=0)
  predict = step_lib.make_predict_step(built.graphdef, built, mesh)
  batch = jax.device_put(_batch(np.random.default_rng(5), n=16), state_lib.batch_sharding(mesh))
  # An average of 1.5 x the parameters, with half its weight taken (as after a few updates).
  average = jax.tree.map(lambda p: 1.5 * p, state["params"])
  kept = optax.tree_utils.tree_set(state["opt"], ema=jax.tree.map(lambda a: 0.5 * a, average),
                                   weight=jnp.full((), 0.5, jnp.float32))
  empty = optax.tree_utils.tree_set(state["opt"], weight=jnp.zeros((), jnp.float32))
  with_average = predict({**state, "opt": kept}, batch)
  np.testing.assert_allclose(np.asarray(with_average), np.asarray(
      predict({**state, "params": average, "opt": empty}, batch)), rtol=1e-5, atol=1e-7)
  assert not np.allclose(np.asarray(with_average), np.asarray(predict(
      {**state, "opt": empty}, batch)), atol=1e-4)


def test_without_ema_epochs_evaluation_uses_the_parameters():
  config = default_config.get_config()
  tx, _ = optim.make(config.optim, 10)
  params = {"w": jnp.ones((2, 3))}
  assert optim.evaluated_params(params, tx.init(params)) is params

