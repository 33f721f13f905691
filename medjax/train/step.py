"""Pure, jitted training and prediction steps with explicit shardings and donated state.

A batch is a dict of global arrays sharded along the batch axis: the record fields of
`medjax.data.records` (normalised), `label` (int32) and `weight` (float32: 0 for padding and for
records the missing-modality policy leaves out of training, times the class weight).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from medjax import programs
from medjax.model import ensemble
from medjax.train import local_sgd
from medjax.train import optim
from medjax.train import state as state_lib


def loss_and_metrics(graphdef, params, fill, batch, rng, *, train: bool):
  model = nnx.merge(graphdef, params, fill)
  # The loss in float32; an ensemble's is the mean of its members' own losses.
  logits_MxBxK = ensemble.member_logits(model, batch, train=train, rng=rng)
  labels_MxB = jnp.broadcast_to(batch["label"], logits_MxBxK.shape[:2])
  ce_B = jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits_MxBxK, labels_MxB),
                  axis=0)
  weight_B = batch["weight"]
  total = jnp.maximum(jnp.sum(weight_B), 1e-9)
  loss = jnp.sum(ce_B * weight_B) / total
  predicted_B = jnp.argmax(ensemble.probabilities(logits_MxBxK), -1)
  correct = (predicted_B == batch["label"]).astype(jnp.float32)
  return loss, {"loss": loss, "accuracy": jnp.sum(correct * weight_B) / total,
                "weight": jnp.sum(weight_B)}


def make_train_step(graphdef, tx, built: state_lib.Built, mesh, *, seed: int,
                    lr_schedule=None, grad_accum: int = 1,
                    local: local_sgd.Local | None = None):
  """state, batch -> (state, metrics). The modality-dropout key depends only on (seed, step).

  With `lr_schedule`, metrics include the learning rate the step's update used (computed on the
  device, so logging it costs the host nothing); with `grad_accum` = k the schedule counts updates.
  `local`: 'local' mode's inner step (`medjax.train.local_sgd`; its metrics per replica, and
  `make_average` ends its rounds) instead of the synchronous step.
  """
  base_key = jax.random.key(seed)

  def update(params, opt, fill, batch, rng):
    """One optimiser update of `params` on `batch`: (params, opt, metrics)."""
    (_, metrics), grads = jax.value_and_grad(
        lambda p: loss_and_metrics(graphdef, p, fill, batch, rng, train=True),
        has_aux=True)(params)
    updates, opt = tx.update(grads, opt, params)
    metrics["grad_norm"] = optax.tree.norm(grads)
    return optax.apply_updates(params, updates), opt, metrics

  if local is not None:
    inner = local_sgd.make_inner(update, local, mesh, base_key=base_key,
                                 lr_schedule=lr_schedule, grad_accum=grad_accum)
    return _jit_step(inner, built, mesh, metrics=local_sgd.replica_sharding(local, mesh))

  def train_step(state, batch):
    rng = jax.random.fold_in(base_key, state["step"])
    params, opt, metrics = update(state["params"], state["opt"], state["fill"], batch, rng)
    if lr_schedule is not None:
      metrics["learning_rate"] = lr_schedule((state["step"] + 1) // grad_accum)
    new_state = {"params": params, "fill": state["fill"], "opt": opt, "step": state["step"] + 1}
    return new_state, metrics

  return _jit_step(train_step, built, mesh)


def _jit_step(train_step, built: state_lib.Built, mesh, metrics=None):
  return programs.cached(jax.jit(train_step,
                                in_shardings=(built.shardings, state_lib.batch_sharding(mesh)),
                                out_shardings=(built.shardings,
                                               metrics or state_lib.replicated(mesh)),
                                donate_argnums=(0,)))


def make_average(built: state_lib.Built, mesh, local: local_sgd.Local):
  """'local' mode's round end (`local_sgd.make_average`), jitted: state, trained_R, global
  step, schedule position -> state."""
  return programs.cached(jax.jit(
      local_sgd.make_average(local),
      in_shardings=(built.shardings, local_sgd.replica_sharding(local, mesh),
                    state_lib.replicated(mesh), state_lib.replicated(mesh)),
      out_shardings=built.shardings, donate_argnums=(0,)))


def make_grad_fn(graphdef, built: state_lib.Built, mesh, *, seed: int):
  """state, batch -> (loss, grads): for checking that device count does not change the math."""
  base_key = jax.random.key(seed)

  def fn(state, batch):
    rng = jax.random.fold_in(base_key, state["step"])
    (loss, _), grads = jax.value_and_grad(
        lambda p: loss_and_metrics(graphdef, p, state["fill"], batch, rng, train=True),
        has_aux=True)(state["params"])
    return loss, grads

  return jax.jit(fn, in_shardings=(built.shardings, state_lib.batch_sharding(mesh)),
                 out_shardings=state_lib.replicated(mesh))


def make_predict_step(graphdef, built: state_lib.Built, mesh):
  """state, batch -> class probabilities (B, K), replicated on every process; from the
  parameters' moving average where the optimiser keeps one (`optim.evaluated_params`)."""

  def predict(state, batch):
    model = nnx.merge(graphdef, optim.evaluated_params(state["params"], state["opt"]),
                      state["fill"])
    return ensemble.probabilities(ensemble.member_logits(model, batch, train=False))

  return programs.cached(jax.jit(
      predict, in_shardings=(built.shardings, state_lib.batch_sharding(mesh)),
      out_shardings=state_lib.replicated(mesh)))
