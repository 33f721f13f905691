"""Per-modality encoders: images, lab panels, vital-sign series -> one d-dim token each.

Each encoder only ever sees its inputs through their masks (`jnp.where`, not multiplication, so
that NaN or garbage in a masked slot cannot leak into the output or its gradient).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
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


class LabsEncoder(nnx.Module):
  """An MLP over lab values and their per-analyte mask: `layers` hidden layers of `hidden`."""

  def __init__(self, num_analytes: int, hidden: int, d_model: int, *, rngs: nnx.Rngs,
               dtype=jnp.float32, layers: int = 1):
    self.fc1 = nnx.Linear(2 * num_analytes, hidden, dtype=dtype, rngs=rngs)
    # Layers past the first (none by default, so the default parameters keep their names).
    self.deeper = nnx.List([nnx.Linear(hidden, hidden, dtype=dtype, rngs=rngs)
                            for _ in range(layers - 1)])
    self.fc2 = nnx.Linear(hidden, d_model, dtype=dtype, rngs=rngs)
    self.norm = nnx.LayerNorm(d_model, dtype=dtype, rngs=rngs)

  def __call__(self, labs_BxL: jax.Array, labs_mask_BxL: jax.Array) -> jax.Array:
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
