"""The optimizer, from config.optim: AdamW, warmup + cosine decay, clipping, accumulation, and
a moving average of the parameters to evaluate (optim.ema_epochs)."""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
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
  if optim_config.get("ema_epochs", 0) > 0:
    updates_per_epoch = max(1, total_steps // k) / optim_config.epochs
    tx = optax.chain(tx, params_ema(
        math.exp(-1.0 / max(1.0, optim_config.ema_epochs * updates_per_epoch))))
  if k > 1:
    tx = optax.MultiSteps(tx, every_k_schedule=k)
  return tx, lr


class ParamsEmaState(NamedTuple):
  """`params_ema`'s state: the average's unnormalised sum and its total weight, 1 - decay^t
  after t updates (dividing by it removes the zero start's bias)."""
  ema: optax.Params
  weight: jax.Array


def params_ema(decay: float) -> optax.GradientTransformation:
  """Keeps an exponential moving average of the parameters after each update in the optimiser
  state (Polyak averaging), so that checkpoints and restarts carry it; the updates pass through
  unchanged. `evaluated_params` reads it."""

  def init(params):
    return ParamsEmaState(jax.tree.map(jnp.zeros_like, params), jnp.zeros((), jnp.float32))

  def update(updates, state, params):
    new = optax.apply_updates(params, updates)
    ema = jax.tree.map(lambda e, p: decay * e + (1.0 - decay) * p, state.ema, new)
    return updates, ParamsEmaState(ema, decay * state.weight + (1.0 - decay))

  return optax.GradientTransformation(init, update)


def evaluated_params(params, opt):
  """The parameters to evaluate and predict with: the optimiser state's moving average where it
  keeps one (optim.ema_epochs > 0) and has taken an update, else `params`."""
  state = optax.tree_utils.tree_get(opt, "ParamsEmaState")
  if state is None:
    return params
  scale = 1.0 / jnp.maximum(state.weight, 1e-12)
  return jax.tree.map(lambda e, p: jnp.where(state.weight > 0, e * scale, p).astype(p.dtype),
                      state.ema, params)
