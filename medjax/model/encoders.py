"""Per-modality encoders: images, lab panels, vital-sign series -> one d-dim token each.

Each encoder only ever sees its inputs through their masks (`jnp.where`, not multiplication, so
that NaN or garbage in a masked slot cannot leak into the output or its gradient).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


def masked_mean(x_BxNxD: jax.Array, mask_BxN: jax.Array) -> jax.Array:
  """Mean over N of the entries where mask is true; zeros where none is."""
  weight_BxNx1 = mask_BxN[..., None].astype(x_BxNxD.dtype)
  total_BxD = jnp.sum(jnp.where(mask_BxN[..., None], x_BxNxD, 0), axis=1)
  return total_BxD / jnp.maximum(jnp.sum(weight_BxNx1, axis=1), 1.0)


class ImageEncoder(nnx.Module):
  """A strided CNN over each image, a dense layer, masked mean over a patient's images.

  The flatten before the dense layer keeps where things are in the image; global pooling would
  throw that away.
  """

  def __init__(self, image_size: int, channels: tuple[int, ...], d_model: int, *,
               rngs: nnx.Rngs, dtype=jnp.float32):
    convs = []
    c_in, side = 1, image_size
    for c_out in channels:
      convs.append(nnx.Conv(c_in, c_out, kernel_size=(3, 3), strides=(2, 2), padding="SAME",
                            dtype=dtype, rngs=rngs))
      c_in, side = c_out, -(-side // 2)
    self.convs = nnx.List(convs)
    self.dense = nnx.Linear(side * side * c_in, d_model, dtype=dtype, rngs=rngs)
    self.norm = nnx.LayerNorm(d_model, dtype=dtype, rngs=rngs)

  def __call__(self, images_BxMxSxS: jax.Array, image_mask_BxM: jax.Array) -> jax.Array:
    b, m, s, _ = images_BxMxSxS.shape
    images_BxMxSxS = jnp.where(image_mask_BxM[..., None, None], images_BxMxSxS, 0)
    x = images_BxMxSxS.reshape(b * m, s, s, 1)
    for conv in self.convs:
      x = nnx.gelu(conv(x))
    x_BxMxD = self.dense(x.reshape(b, m, -1)).reshape(b, m, -1)
    return self.norm(masked_mean(x_BxMxD, image_mask_BxM))


class FillValue(nnx.Variable):
  """Not trained: values set from the training data before training (fills, bin edges)."""


NUMERIC_EMBEDDINGS = ("none", "piecewise", "periodic")


class NumericEmbedding(nnx.Module):
  """Each feature's value -> its own `width`-dim embedding (Gorishniy et al. 2022, "On
  Embeddings for Numerical Features in Tabular Deep Learning"), then a per-feature linear map
  and ReLU. An unmeasured value gets the feature's learned missing embedding instead.

    'piecewise'  piecewise-linear encoding over `bins` bins between the training values'
                 quantiles (set from data, `set_edges`): one number per bin, 1 below the value,
                 0 above it, the fraction in between. Invariant to monotone rescaling, as trees
                 are: a skewed lab (bilirubin, copper) is split where its values lie.
    'periodic'   sin and cos of 2 pi c x for `frequencies` trained frequencies c per feature,
                 drawn from N(0, scale) (the PLR embedding).
  """

  def __init__(self, num_features: int, kind: str, width: int, *, bins: int, frequencies: int,
               scale: float, rngs: nnx.Rngs, dtype=jnp.float32):
    self.kind, self.dtype = kind, dtype
    if kind == "piecewise":
      self.edges = FillValue(jnp.tile(jnp.linspace(-2.0, 2.0, bins + 1), (num_features, 1)))
      encoded = bins
    else:
      self.frequencies = nnx.Param(
          scale * jax.random.normal(rngs.params(), (num_features, frequencies), jnp.float32))
      encoded = 2 * frequencies
    init = jax.nn.initializers.lecun_normal(in_axis=-2, out_axis=-1, batch_axis=0)
    self.kernel = nnx.Param(init(rngs.params(), (num_features, encoded, width), jnp.float32))
    self.bias = nnx.Param(jnp.zeros((num_features, width), jnp.float32))
    self.missing = nnx.Param(0.02 * jax.random.normal(rngs.params(), (num_features, width),
                                                      jnp.float32))

  def set_edges(self, edges_LxE) -> None:
    self.edges[...] = jnp.asarray(edges_LxE, self.edges.dtype)

  def encode(self, x_BxL: jax.Array) -> jax.Array:
    if self.kind == "piecewise":
      lo_LxT, hi_LxT = self.edges[...][:, :-1], self.edges[...][:, 1:]
      width_LxT = hi_LxT - lo_LxT
      x_BxLx1 = x_BxL[..., None].astype(jnp.float32)
      # A bin of zero width (a repeated quantile: 0/1 indicators, rounded values) is a step.
      frac = jnp.clip((x_BxLx1 - lo_LxT) / jnp.where(width_LxT > 0, width_LxT, 1.0), 0, 1)
      return jnp.where(width_LxT > 0, frac, (x_BxLx1 >= hi_LxT).astype(jnp.float32))
    angle_BxLxF = 2 * jnp.pi * x_BxL[..., None].astype(jnp.float32) * self.frequencies[...]
    return jnp.concatenate([jnp.sin(angle_BxLxF), jnp.cos(angle_BxLxF)], axis=-1)

  def __call__(self, x_BxL: jax.Array, mask_BxL: jax.Array) -> jax.Array:
    """(B, L, width): embeddings of the measured values, missing embeddings elsewhere."""
    e_BxLxW = jnp.einsum("bli,liw->blw", self.encode(x_BxL).astype(self.dtype),
                         self.kernel[...].astype(self.dtype)) + self.bias[...].astype(self.dtype)
    return jnp.where(mask_BxL[..., None], nnx.relu(e_BxLxW), self.missing[...].astype(self.dtype))


def quantile_edges(values_NxL: np.ndarray, mask_NxL: np.ndarray, bins: int) -> np.ndarray:
  """(L, bins + 1): each feature's quantiles over its measured training values (0s where it
  has none)."""
  q = np.linspace(0.0, 1.0, bins + 1)
  edges = np.zeros((values_NxL.shape[1], bins + 1), np.float32)
  for j in range(values_NxL.shape[1]):
    seen = values_NxL[mask_NxL[:, j], j]
    if len(seen):
      edges[j] = np.quantile(seen.astype(np.float64), q)
  return edges


def labs_embedding_kind(embedding: str, tokens: bool) -> str | None:
  """The labs' NumericEmbedding kind (None: none): feature tokens need one, piecewise unless
  config.model.labs_embedding names another."""
  if embedding == "none":
    return "piecewise" if tokens else None
  return embedding


class LabsEncoder(nnx.Module):
  """Lab values and their per-analyte mask -> one d_model token.

  By default an MLP (`layers` hidden layers of `hidden`) over the raw values and the mask. With
  a numeric embedding (config.model.labs_embedding) the MLP reads each feature's embedding
  instead, an unmeasured feature's being its learned missing embedding. With `tokens`
  (config.model.labs_tokens) there is no MLP: each feature becomes a d_model token
  (`feature_tokens`) that the fusion attends over beside the image and vitals tokens, and the
  labs token is their mean."""

  def __init__(self, num_analytes: int, hidden: int, d_model: int, *, rngs: nnx.Rngs,
               dtype=jnp.float32, layers: int = 1, embedding: str = "none", width: int = 8,
               bins: int = 16, frequencies: int = 16, scale: float = 0.1, tokens: bool = False):
    if embedding not in NUMERIC_EMBEDDINGS:
      raise ValueError(f"config.model.labs_embedding={embedding!r}: use one of "
                       f"{NUMERIC_EMBEDDINGS}")
    self.tokens = tokens
    kind = labs_embedding_kind(embedding, tokens)
    self.embed = (NumericEmbedding(
        num_analytes, kind, d_model if tokens else width, bins=bins, frequencies=frequencies,
        scale=scale, rngs=rngs, dtype=dtype) if kind else None)
    if tokens:
      self.feature_embed = nnx.Param(
          0.02 * jax.random.normal(rngs.params(), (num_analytes, d_model), jnp.float32))
    else:
      inputs = num_analytes * width if self.embed else 2 * num_analytes
      self.fc1 = nnx.Linear(inputs, hidden, dtype=dtype, rngs=rngs)
      # Layers past the first (none by default, so the default parameters keep their names).
      self.deeper = nnx.List([nnx.Linear(hidden, hidden, dtype=dtype, rngs=rngs)
                              for _ in range(layers - 1)])
      self.fc2 = nnx.Linear(hidden, d_model, dtype=dtype, rngs=rngs)
    self.norm = nnx.LayerNorm(d_model, dtype=dtype, rngs=rngs)

  def feature_tokens(self, labs_BxL: jax.Array, labs_mask_BxL: jax.Array) -> jax.Array:
    """(B, L, d_model): one token per feature (`tokens=True`)."""
    e_BxLxD = self.embed(jnp.where(labs_mask_BxL, labs_BxL, 0), labs_mask_BxL)
    return e_BxLxD + self.feature_embed[...].astype(e_BxLxD.dtype)

  def __call__(self, labs_BxL: jax.Array, labs_mask_BxL: jax.Array) -> jax.Array:
    if self.tokens:
      return self.norm(jnp.mean(self.feature_tokens(labs_BxL, labs_mask_BxL), axis=1))
    if self.embed is not None:
      e_BxLxW = self.embed(jnp.where(labs_mask_BxL, labs_BxL, 0), labs_mask_BxL)
      x = e_BxLxW.reshape(e_BxLxW.shape[0], -1)
    else:
      x = jnp.concatenate([jnp.where(labs_mask_BxL, labs_BxL, 0),
                           labs_mask_BxL.astype(labs_BxL.dtype)], axis=-1)
    h = nnx.gelu(self.fc1(x))
    for layer in self.deeper:
      h = h + nnx.gelu(layer(h))
    return self.norm(self.fc2(h))


class VitalsEncoder(nnx.Module):
  """Per-step embedding with a learned time embedding, `layers` residual temporal convs, masked
  mean over time."""

  def __init__(self, steps: int, channels: int, hidden: int, d_model: int, *, rngs: nnx.Rngs,
               dtype=jnp.float32, layers: int = 1):
    self.embed = nnx.Linear(2 * channels, hidden, dtype=dtype, rngs=rngs)
    self.time = nnx.Param(0.02 * jax.random.normal(rngs.params(), (steps, hidden), jnp.float32))
    self.conv = nnx.Conv(hidden, hidden, kernel_size=(3,), padding="SAME", dtype=dtype, rngs=rngs)
    self.deeper = nnx.List([nnx.Conv(hidden, hidden, kernel_size=(3,), padding="SAME",
                                     dtype=dtype, rngs=rngs) for _ in range(layers - 1)])
    self.out = nnx.Linear(hidden, d_model, dtype=dtype, rngs=rngs)
    self.norm = nnx.LayerNorm(d_model, dtype=dtype, rngs=rngs)

  def __call__(self, vitals_BxTxC: jax.Array, vitals_mask_BxTxC: jax.Array) -> jax.Array:
    x = jnp.concatenate([jnp.where(vitals_mask_BxTxC, vitals_BxTxC, 0),
                         vitals_mask_BxTxC.astype(vitals_BxTxC.dtype)], axis=-1)
    step_mask_BxT = jnp.any(vitals_mask_BxTxC, axis=-1)
    e_BxTxH = self.embed(x)
    h_BxTxH = nnx.gelu(e_BxTxH + self.time[...].astype(e_BxTxH.dtype))
    h_BxTxH = jnp.where(step_mask_BxT[..., None], h_BxTxH, 0)
    h_BxTxH = h_BxTxH + nnx.gelu(self.conv(h_BxTxH))
    for conv in self.deeper:
      h_BxTxH = h_BxTxH + nnx.gelu(conv(h_BxTxH))
    return self.norm(self.out(masked_mean(h_BxTxH, step_mask_BxT)))
