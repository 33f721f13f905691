"""Checkpoints: the only package that imports Orbax (in `checkpointer` and `barrier`).

  checkpointer  the Orbax CheckpointManager, saves on a thread of ours, one step's restore
  packing       a state as one vector per dtype (what is saved), and back onto any shardings
  policy        when to save (config.ckpt.strategy)
  saver         saves handed to the checkpointer, commits once finalized, preemption
  restore       the newest committed, readable checkpoint (or a host-local snapshot) or a start
  snapshots     host-local snapshots: the state every few steps in host memory
  retention     checkpoint directories: retention, damaged steps set aside, uncommitted discarded
  barrier       Orbax's barrier in jax.distributed's coordination service

Modules are imported by name (`from medjax.checkpoint import saver`); importing the package
imports neither Orbax nor jax, so the coordinator can prune without them.
"""
