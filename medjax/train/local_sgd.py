"""config.optim.mode='local': local SGD with periodic averaging, in DiLoCo's form.

R replicas (config.optim.replicas; 0: the mesh's 'data' axis) each take inner steps with the
inner optimiser (the same AdamW and schedule as 'sync') on their own slice of every global batch;
every config.optim.local_steps steps, and at the end of every epoch (so that validation and the
test split see one model), the replicas' parameters are averaged: the outer optimiser (SGD with
Nesterov momentum, DiLoCo's choice: Douillard et al. 2023) takes the mean delta, outer params
minus the replicas' mean, as its gradient, and every replica starts again from the result.

The replicas are one more leading axis of the state, sharded over the mesh's 'data' axis when it
divides it (each device then updates its own replica and nothing crosses the network between
averagings), replicated otherwise. It is all one jitted program over global arrays, like the
synchronous step: the same ledger, lineage and checkpoints, and a checkpoint at any step holds
every replica's parameters and inner optimiser state, so a recovered run equals an uninterrupted
one in this mode too.

State: {'params': the outer (averaged) parameters, which evaluation and prediction use,
'fill', 'opt': the outer optimiser's state, 'local': {'params', 'opt'} stacked over replicas,
'step'}.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from medjax import errors

MODES = ("sync", "local")


@dataclasses.dataclass(frozen=True)
class Local:
  """What the 'local' mode's state and step need beyond 'sync''s."""
  replicas: int
  every: int                    # local steps between averagings
  steps_per_epoch: int          # an epoch's end averages too
  outer: optax.GradientTransformation


def from_config(optim_config, mesh, steps_per_epoch: int) -> Local | None:
  """Local for config.optim.mode='local' on `mesh`, None for 'sync'."""
  mode = optim_config.get("mode", "sync")
  if mode not in MODES:
    raise errors.InputError(f"config.optim.mode={mode!r}: use one of {MODES}")
  if mode == "sync":
    return None
  replicas = int(optim_config.get("replicas", 0)) or mesh.shape["data"]
  outer = optax.sgd(optim_config.outer_lr, momentum=optim_config.outer_momentum or None,
                    nesterov=optim_config.outer_momentum > 0)
  return Local(replicas, int(optim_config.local_steps), max(1, int(steps_per_epoch)), outer)


def init(local: Local, params, tx: optax.GradientTransformation) -> dict:
  """The state's 'opt' (outer) and 'local' entries for fresh `params`."""
  stack = lambda tree: jax.tree.map(
      lambda x: jnp.broadcast_to(x, (local.replicas, *jnp.shape(x))), tree)
  return {"opt": local.outer.init(params),
          "local": {"params": stack(params), "opt": stack(tx.init(params))}}


def replica_sharding(local: Local, mesh, inner_spec: P) -> NamedSharding:
  """The leading replica axis over 'data' when it divides it, then `inner_spec`."""
  axis = "data" if local.replicas % mesh.shape["data"] == 0 else None
  return NamedSharding(mesh, P(axis, *inner_spec))


def _split(batch: dict, replicas: int) -> dict:
  def split(x):
    if x.shape[0] % replicas:
      raise errors.InputError(
          f"config.data.batch_size={x.shape[0]} does not divide among "
          f"config.optim.replicas={replicas}; make it a multiple")
    return x.reshape(replicas, x.shape[0] // replicas, *x.shape[1:])
  return jax.tree.map(split, batch)


def make_step(update, local: Local, *, base_key, lr_schedule=None, grad_accum: int = 1):
  """state, batch -> (state, metrics): one inner step on every replica, then the averaging
  where the step ends a round of `local.every` or an epoch. `update(params, opt, fill, batch,
  rng) -> (params, opt, metrics)` is the synchronous step's update, here one replica's."""

  def average(outer, outer_opt, params_R):
    delta = jax.tree.map(lambda o, p: o - jnp.mean(p, axis=0), outer, params_R)
    updates, outer_opt = local.outer.update(delta, outer_opt, outer)
    outer = optax.apply_updates(outer, updates)
    params_R = jax.tree.map(lambda o, p: jnp.broadcast_to(o, p.shape).astype(p.dtype),
                            outer, params_R)
    return outer, outer_opt, params_R

  def step(state, batch):
    rng = jax.random.fold_in(base_key, state["step"])
    keys = jax.vmap(lambda r: jax.random.fold_in(rng, r))(jnp.arange(local.replicas))
    params_R, opt_R, metrics_R = jax.vmap(update, in_axes=(0, 0, None, 0, 0))(
        state["local"]["params"], state["local"]["opt"], state["fill"],
        _split(batch, local.replicas), keys)
    done = state["step"] + 1
    averaging = (done % local.every == 0) | (done % local.steps_per_epoch == 0)
    outer, outer_opt, params_R = jax.lax.cond(
        averaging, average, lambda o, oo, p: (o, oo, p), state["params"], state["opt"], params_R)
    weight_R = metrics_R["weight"]
    total = jnp.maximum(jnp.sum(weight_R), 1e-9)
    metrics = {k: jnp.sum(metrics_R[k] * weight_R) / total for k in ("loss", "accuracy")}
    metrics["weight"] = jnp.sum(weight_R)
    metrics["grad_norm"] = jnp.sqrt(jnp.mean(metrics_R["grad_norm"] ** 2))
    if lr_schedule is not None:
      metrics["learning_rate"] = lr_schedule(done // grad_accum)
    return {"params": outer, "fill": state["fill"], "opt": outer_opt,
            "local": {"params": params_R, "opt": opt_R}, "step": done}, metrics

  return step
