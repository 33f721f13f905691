"""Several fusion models trained side by side in one step (config.model.members).

A deep ensemble packed into one model (TabM's "packed" ensemble, Gorishniy et al. 2024): each
member is a whole FusionModel with its own initialisation and its own modality-dropout draws,
trained on the same batches by the mean of the members' own losses (not the loss of their
averaged prediction: members trained jointly on one output collude instead of averaging out
each other's errors, Jeffares et al. 2023). A prediction is the mean of the members' class
probabilities. The members share the data pipeline, the checkpoints and the lineage; the step
costs `members` times the model's compute, which on table-only cohorts is small beside the
loop's own.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from medjax.model import fusion


class Ensemble(nnx.Module):
  """`members` FusionModels; calling it gives each member's logits, (members, B, classes)."""

  def __init__(self, model_config, members: int, *, rngs: nnx.Rngs, **shapes):
    # One parameter stream: each member draws its own keys from it, so members start apart.
    self.members = nnx.List([fusion.FusionModel(model_config, rngs=rngs, **shapes)
                             for _ in range(members)])

  def set_statistics(self, *args) -> None:
    for member in self.members:
      member.set_statistics(*args)

  def __call__(self, batch: dict[str, jax.Array], *, train: bool = False,
               rng: jax.Array | None = None) -> jax.Array:
    keys = [None if rng is None else jax.random.fold_in(rng, k)
            for k in range(len(self.members))]
    return jnp.stack([member(batch, train=train, rng=key)
                      for member, key in zip(self.members, keys)])


def member_logits(model, batch: dict[str, jax.Array], **kwargs) -> jax.Array:
  """(members, B, classes) float32 logits of a FusionModel (one member) or an Ensemble."""
  logits = model(batch, **kwargs).astype(jnp.float32)
  return logits[None] if logits.ndim == 2 else logits


def probabilities(logits_MxBxK: jax.Array) -> jax.Array:
  """The ensemble's prediction: the mean of its members' class probabilities, (B, classes)."""
  return jnp.mean(jax.nn.softmax(logits_MxBxK, axis=-1), axis=0)
