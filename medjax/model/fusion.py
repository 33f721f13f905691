"""The fusion model: encoders -> modality tokens (learned 'missing' embeddings) -> fusion -> head.

Missing-modality handling (config.model.missing), for ablation:
  'learned'  an absent modality's token is a trained embedding (the lineage paper's method);
             encoders see per-analyte and per-step masks.
  'zero'     absent or unmeasured values are zero in raw units (images black); no masks, no
             missing embeddings: the encoders cannot tell missing from measured.
  'mean'     like 'zero', but filled with the training mean (0 after z-scoring; the mean image).
  'drop'     trains only on records with all three modalities (the trainer zeroes the others'
             loss weight); evaluates like 'zero'.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from medjax import errors
from medjax.model import encoders

MISSING_POLICIES = ("learned", "zero", "mean", "drop")
NUM_MODALITIES = 3


FillValue = encoders.FillValue   # not trained: fills and bin edges, set from training data


def needs_statistics(model_config) -> bool:
  """Whether a fresh model takes values from the training data (`FusionModel.set_statistics`)."""
  kind = encoders.labs_embedding_kind(model_config.get("labs_embedding", "none"),
                                      model_config.get("labs_tokens", False))
  return model_config.missing != "learned" or kind == "piecewise"


def compute_dtype(name: str) -> jnp.dtype:
  """config.model.dtype: 'auto' is bfloat16 on accelerators and float32 on CPU (XLA's CPU
  backend has no fast bfloat16 path: the quickstart trained at 176 steps/s against 259; the
  accuracy was within 0.004 of float32's on the quickstart and default configs, README)."""
  if name == "auto":
    return jnp.dtype(jnp.float32 if jax.default_backend() == "cpu" else jnp.bfloat16)
  return jnp.dtype(name)


def present_modalities(batch: dict[str, jax.Array]) -> jax.Array:
  """(B, 3) bool: images, labs, vitals present."""
  return jnp.stack([jnp.any(batch["image_mask"], axis=-1), jnp.any(batch["labs_mask"], axis=-1),
                    jnp.any(batch["vitals_mask"], axis=(-2, -1))], axis=-1)


def modality_dropout(key: jax.Array, present_Bx3: jax.Array, p: float) -> jax.Array:
  """Drops each present modality with probability p, never all of a record's modalities."""
  k_drop, k_keep = jax.random.split(key)
  drop = jax.random.bernoulli(k_drop, p, present_Bx3.shape) & present_Bx3
  kept = present_Bx3 & ~drop
  # Where everything present was dropped, keep one present modality chosen at random.
  score = jnp.where(present_Bx3, jax.random.uniform(k_keep, present_Bx3.shape), -1.0)
  rescue = jax.nn.one_hot(jnp.argmax(score, axis=-1), NUM_MODALITIES, dtype=bool)
  return jnp.where(jnp.any(kept, axis=-1, keepdims=True), kept, rescue & present_Bx3)


class FusionBlock(nnx.Module):
  """Pre-norm transformer block over the modality tokens."""

  def __init__(self, d_model: int, heads: int, mlp_dim: int, *, rngs: nnx.Rngs, dtype):
    self.norm1 = nnx.LayerNorm(d_model, dtype=dtype, rngs=rngs)
    self.attn = nnx.MultiHeadAttention(num_heads=heads, in_features=d_model, qkv_features=d_model,
                                       decode=False, dtype=dtype, rngs=rngs)
    self.norm2 = nnx.LayerNorm(d_model, dtype=dtype, rngs=rngs)
    self.fc1 = nnx.Linear(d_model, mlp_dim, dtype=dtype, rngs=rngs)
    self.fc2 = nnx.Linear(mlp_dim, d_model, dtype=dtype, rngs=rngs)

  def __call__(self, x_BxTxD: jax.Array) -> jax.Array:
    x_BxTxD = x_BxTxD + self.attn(self.norm1(x_BxTxD))
    return x_BxTxD + self.fc2(nnx.gelu(self.fc1(self.norm2(x_BxTxD))))


class FusionModel(nnx.Module):
  """Images + labs + vitals -> class logits, robust to any subset of modalities being absent."""

  def __init__(self, model_config, *, num_classes: int, image_size: int, max_images: int,
               num_analytes: int, vitals_steps: int, vitals_channels: int, rngs: nnx.Rngs):
    cfg = model_config
    if cfg.missing not in MISSING_POLICIES:
      raise errors.InputError(
          f"config.model.missing={cfg.missing!r}: use one of {MISSING_POLICIES}")
    if cfg.fusion not in ("attention", "gated"):
      raise errors.InputError(f"config.model.fusion={cfg.fusion!r}: use 'attention' or 'gated'")
    dtype = compute_dtype(cfg.dtype)
    d = cfg.d_model
    self.missing, self.fusion, self.p_drop = cfg.missing, cfg.fusion, cfg.modality_dropout
    self.image = encoders.ImageEncoder(image_size, tuple(cfg.image_channels), d, rngs=rngs,
                                       dtype=dtype)
    self.labs_tokens = bool(cfg.get("labs_tokens", False))
    self.labs = encoders.LabsEncoder(
        num_analytes, cfg.labs_hidden, d, rngs=rngs, dtype=dtype,
        layers=cfg.get("labs_layers", 1), embedding=cfg.get("labs_embedding", "none"),
        width=cfg.get("labs_embed_width", 8), bins=cfg.get("labs_bins", 16),
        frequencies=cfg.get("labs_frequencies", 16), scale=cfg.get("labs_frequency_scale", 0.1),
        tokens=self.labs_tokens)
    self.vitals = encoders.VitalsEncoder(vitals_steps, vitals_channels, cfg.vitals_hidden, d,
                                         rngs=rngs, dtype=dtype,
                                         layers=cfg.get("vitals_layers", 1))
    # Parameters are float32 whatever the compute dtype (as nnx.Linear's param_dtype keeps
    # them): `dtype` (e.g. bfloat16) is what they are cast to where they are used.
    init = jax.nn.initializers.normal(0.02)
    self.dtype = dtype
    self.missing_embed = nnx.Param(init(rngs.params(), (NUM_MODALITIES, d), jnp.float32))
    self.modality_embed = nnx.Param(init(rngs.params(), (NUM_MODALITIES, d), jnp.float32))
    # Set by the trainer from training statistics (see `set_statistics`); float32 like the
    # parameters, so that the state is the same whatever the compute dtype.
    self.image_fill = FillValue(jnp.zeros((image_size, image_size), jnp.float32))
    self.labs_fill = FillValue(jnp.zeros((num_analytes,), jnp.float32))
    self.vitals_fill = FillValue(jnp.zeros((vitals_channels,), jnp.float32))
    if cfg.fusion == "attention":
      self.cls = nnx.Param(init(rngs.params(), (1, 1, d), jnp.float32))
      self.blocks = nnx.List([FusionBlock(d, cfg.heads, cfg.mlp_dim, rngs=rngs, dtype=dtype)
                              for _ in range(cfg.fusion_layers)])
    else:
      self.gate = nnx.Linear(d, 1, dtype=dtype, rngs=rngs)
    self.norm = nnx.LayerNorm(d, dtype=dtype, rngs=rngs)
    self.head = nnx.Linear(d, num_classes, dtype=dtype, rngs=rngs)

  def set_statistics(self, image_mean_SxS, labs_zero_L, vitals_zero_C, labs_NxL,
                     labs_mask_NxL) -> None:
    """What 'zero'/'mean'/'drop' fill in and where piecewise-linear bins of the labs split, in
    the model's (z-scored) input space.

    Args:
      image_mean_SxS: the training images' mean image ('mean').
      labs_zero_L: where a raw value of 0 lands after z-scoring, -mean/std ('zero', 'drop').
      vitals_zero_C: likewise for the vitals channels.
      labs_NxL, labs_mask_NxL: the training records' z-scored lab values and their mask (the
        piecewise-linear bins' edges are their quantiles).
    """
    embed = self.labs.embed
    if embed is not None and embed.kind == "piecewise":
      bins = embed.edges.shape[-1] - 1
      embed.set_edges(encoders.quantile_edges(np.asarray(labs_NxL), np.asarray(labs_mask_NxL),
                                              bins))
    if self.missing == "mean":
      self.image_fill[...] = jnp.asarray(image_mean_SxS, self.image_fill.dtype)
    else:
      self.labs_fill[...] = jnp.asarray(labs_zero_L, self.labs_fill.dtype)
      self.vitals_fill[...] = jnp.asarray(vitals_zero_C, self.vitals_fill.dtype)

  def _fill(self, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """'zero'/'mean'/'drop': replace unmeasured values and hide the masks from the encoders."""
    out = dict(batch)
    any_image = jnp.any(batch["image_mask"], axis=-1, keepdims=True)
    # An absent modality is filled in its first slot only, like a single imputed image.
    first = jax.nn.one_hot(0, batch["image_mask"].shape[-1], dtype=bool)
    image_mask = jnp.where(any_image, batch["image_mask"], first)
    out["images"] = jnp.where(batch["image_mask"][..., None, None], batch["images"],
                              self.image_fill[...])
    out["image_mask"] = image_mask
    out["labs"] = jnp.where(batch["labs_mask"], batch["labs"], self.labs_fill[...])
    out["labs_mask"] = jnp.ones_like(batch["labs_mask"])
    out["vitals"] = jnp.where(batch["vitals_mask"], batch["vitals"], self.vitals_fill[...])
    out["vitals_mask"] = jnp.ones_like(batch["vitals_mask"])
    return out

  def __call__(self, batch: dict[str, jax.Array], *, train: bool = False,
               rng: jax.Array | None = None) -> jax.Array:
    present_Bx3 = present_modalities(batch)
    if train and self.p_drop > 0:
      if rng is None:
        raise ValueError("FusionModel: training with modality dropout needs an rng key")
      keep_Bx3 = modality_dropout(rng, present_Bx3, self.p_drop)
      batch = dict(batch, image_mask=batch["image_mask"] & keep_Bx3[:, :1],
                   labs_mask=batch["labs_mask"] & keep_Bx3[:, 1:2],
                   vitals_mask=batch["vitals_mask"] & keep_Bx3[:, 2:, None])
      present_Bx3 = keep_Bx3
    if self.missing != "learned":
      batch = self._fill(batch)
    tokens_Bx3xD = jnp.stack([self.image(batch["images"], batch["image_mask"]),
                              self.labs(batch["labs"], batch["labs_mask"]),
                              self.vitals(batch["vitals"], batch["vitals_mask"])], axis=1)
    if self.missing == "learned":
      tokens_Bx3xD = jnp.where(present_Bx3[..., None], tokens_Bx3xD,
                               self.missing_embed[...].astype(self.dtype))
    tokens_BxTxD = tokens_Bx3xD + self.modality_embed[...].astype(self.dtype)
    if self.labs_tokens:
      # One token per lab feature beside the modality tokens (an unmeasured feature's, and every
      # feature's of a record without labs, is that feature's learned missing embedding).
      tokens_BxTxD = jnp.concatenate(
          [tokens_BxTxD, self.labs.feature_tokens(batch["labs"], batch["labs_mask"])], axis=1)
    if self.fusion == "attention":
      cls_Bx1xD = jnp.broadcast_to(self.cls[...].astype(self.dtype), (tokens_BxTxD.shape[0], 1,
                                                   tokens_BxTxD.shape[-1]))
      x_BxTxD = jnp.concatenate([cls_Bx1xD, tokens_BxTxD], axis=1)
      for block in self.blocks:
        x_BxTxD = block(x_BxTxD)
      pooled_BxD = x_BxTxD[:, 0]
    else:
      gates_BxTx1 = jax.nn.softmax(self.gate(tokens_BxTxD), axis=1)
      pooled_BxD = jnp.sum(gates_BxTx1 * tokens_BxTxD, axis=1)
    return self.head(self.norm(pooled_BxD)).astype(jnp.float32)
