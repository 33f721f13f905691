"""The labs' per-feature numeric embeddings and feature tokens (config.model.labs_embedding,
labs_tokens): the encoding, missing values, statistics from the training data."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs import default as default_config
from medjax import model as model_lib
from medjax.data import records
from medjax.model import encoders

SHAPES = records.Shapes(image_size=8, max_images=2, num_analytes=5, vitals_steps=4,
                        vitals_channels=3)
VARIANTS = [{"labs_embedding": "piecewise"}, {"labs_embedding": "periodic"},
            {"labs_tokens": True}, {"labs_tokens": True, "fusion": "gated"}]


def _model(**kw):
  config = default_config.get_config()
  config.model.update(d_model=16, mlp_dim=32, heads=2, labs_hidden=16, vitals_hidden=8,
                      image_channels=(4,))
  config.model.update(kw)
  return model_lib.create(config.model, num_classes=2, shapes=SHAPES, seed=0)


def _labs_batch(rng, n=16):
  b = records.empty(SHAPES, n)
  b["labs"] = rng.normal(size=b["labs"].shape).astype(np.float32)
  b["labs_mask"] = rng.random(b["labs_mask"].shape) < 0.7
  b["labs_mask"][:, 0] = True
  b["labs_mask"][-1] = False   # a record without labs
  b["image_mask"][: n // 2, 0] = True
  return b


def test_piecewise_encoding_is_one_below_the_value_zero_above_and_the_fraction_between():
  embed = encoders.NumericEmbedding(1, "piecewise", 4, bins=4, frequencies=1, scale=1.0,
                                    rngs=nnx.Rngs(0))
  embed.set_edges(np.array([[0.0, 1.0, 2.0, 2.0, 4.0]]))   # a repeated quantile: a step at 2
  got = np.asarray(embed.encode(jnp.array([[-1.0], [0.5], [1.5], [2.0], [3.0], [9.0]])))[:, 0]
  np.testing.assert_allclose(got, [[0, 0, 0, 0], [0.5, 0, 0, 0], [1, 0.5, 0, 0], [1, 1, 1, 0],
                                   [1, 1, 1, 0.5], [1, 1, 1, 1]])


def test_quantile_edges_use_only_measured_values():
  values = np.array([[1.0, 0.0], [2.0, 0.0], [3.0, 0.0], [1000.0, 0.0]])
  mask = np.array([[True, False]] * 3 + [[False, False]])
  edges = encoders.quantile_edges(values, mask, bins=2)
  np.testing.assert_allclose(edges, [[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]])


def test_the_default_labs_encoder_has_no_embedding():
  params = nnx.to_pure_dict(nnx.state(_model(), nnx.Param))
  assert set(params["labs"]) == {"fc1", "fc2", "norm"}   # as before labs_embedding existed


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(map(str, v.values())))
def test_unmeasured_features_are_their_missing_embedding_whatever_sits_in_them(variant):
  rng = np.random.default_rng(0)
  m = _model(**variant)
  batch = _labs_batch(rng)
  garbage = dict(batch, labs=np.where(batch["labs_mask"], batch["labs"], np.nan))
  clean = np.asarray(m(jax.tree.map(jnp.asarray, batch)))
  dirty = np.asarray(m(jax.tree.map(jnp.asarray, garbage)))
  assert np.isfinite(dirty).all()
  np.testing.assert_allclose(clean, dirty, rtol=1e-5, atol=1e-5)
  grads = jax.grad(lambda labs: m(dict(jax.tree.map(jnp.asarray, garbage), labs=labs),
                                  train=True, rng=jax.random.key(1)).sum())(
                                      jnp.asarray(garbage["labs"]))
  assert np.isfinite(np.asarray(grads)).all()
  # Feature 2's missing embedding moves exactly the records where feature 2 is unmeasured (of
  # a record without labs, the MLP's labs token is the modality's missing embedding; its feature
  # tokens are the features' missing embeddings).
  m.labs.embed.missing[...] = m.labs.embed.missing[...].at[2].add(1.0)
  moved = np.abs(np.asarray(m(jax.tree.map(jnp.asarray, batch))) - clean).max(1) > 1e-4
  has_labs = batch["labs_mask"].any(1) | variant.get("labs_tokens", False)
  np.testing.assert_array_equal(moved, ~batch["labs_mask"][:, 2] & has_labs)


def test_set_statistics_puts_the_training_quantiles_in_the_bins():
  m = _model(labs_embedding="piecewise", labs_bins=4)
  rng = np.random.default_rng(3)
  labs = rng.lognormal(size=(400, 5))   # skewed, like bilirubin
  mask = rng.random((400, 5)) < 0.8
  m.set_statistics(np.zeros((8, 8)), np.zeros(5), np.zeros(3), labs, mask)
  for j in range(5):
    np.testing.assert_allclose(np.asarray(m.labs.embed.edges[...])[j],
                               np.quantile(labs[mask[:, j], j], [0, 0.25, 0.5, 0.75, 1]),
                               rtol=1e-5)
  # About a quarter of the measured values fall in each bin.
  encoded = np.asarray(m.labs.embed.encode(jnp.asarray(labs, jnp.float32)))
  inside = ((encoded > 0) & (encoded < 1)).mean(0)
  assert np.all(np.abs(inside - 0.25) < 0.06)


def test_needs_statistics_for_piecewise_bins_and_fill_ablations_only():
  config = default_config.get_config().model
  assert not model_lib.needs_statistics(config)
  config.labs_tokens = True
  assert model_lib.needs_statistics(config)
  config.labs_embedding = "periodic"
  assert not model_lib.needs_statistics(config)
  config.missing = "zero"
  assert model_lib.needs_statistics(config)
