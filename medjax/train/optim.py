"""The optimizer, from config.optim: AdamW, warmup + cosine decay, clipping, accumulation."""

from __future__ import annotations

import jax
import optax


def schedule(optim_config, total_updates: int) -> optax.Schedule:
  warmup = max(1, int(optim_config.warmup_fraction * total_updates))
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=optim_config.lr, warmup_steps=warmup,
      decay_steps=max(total_updates, warmup + 1),
      end_value=optim_config.lr * optim_config.end_lr_fraction)


def make(optim_config, total_steps: int) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """(optimizer, learning-rate schedule) for `total_steps` training steps.

  With `grad_accum` = k > 1, gradients of k consecutive steps are averaged before one update, so
  the schedule counts total_steps / k updates.
  """
  k = optim_config.grad_accum
  lr = schedule(optim_config, max(1, total_steps // k))
  # Decay matrices and kernels, not biases, norms or embeddings' scale vectors.
  decay_mask = lambda params: jax.tree.map(lambda p: p.ndim > 1, params)
  tx = optax.chain(
      optax.clip_by_global_norm(optim_config.clip_norm),
      optax.adamw(lr, b1=optim_config.b1, b2=optim_config.b2,
                  weight_decay=optim_config.weight_decay, mask=decay_mask))
  if k > 1:
    tx = optax.MultiSteps(tx, every_k_schedule=k)
  return tx, lr
