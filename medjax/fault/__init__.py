"""Fault tolerance around the trainer: the coordinator, the agents, the worker process.

  coordinator  its own process: gRPC, events.jsonl, the lineage commit, the summary's FT block
  policy       the coordinator's decisions (what failed, restart where, after what back-off)
  run_state    what the coordinator knows and keeps over a restart; the workers' exit codes
  protocol     the gRPC service: methods, JSON messages, token authentication, TLS
  agent        one per host: starts, watches, stops and restarts its workers
  standbys     an agent's standby workers, kept ready and prepared ahead
  worker       a worker process: joins its generation's jax.distributed job and trains
  local        everything on one machine: the coordinator and agents as real processes
  layout       how many workers a host runs, and how many devices each
  report       summary.json's fault_tolerance block and the loss curve's marks
  spawn        medjax started as a child; forking: an agent forked from the launcher

The trainer's own side (heartbeats, commits, injection, the ledger) is `medjax.runtime`.
"""
