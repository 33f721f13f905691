"""The worker-side runtime the trainer is handed: hooks below the trainer, above the data.

  context  progress heartbeats, commits and stop requests (to the coordinator, or local)
  inject   fault injection from config: real signals and errors at a chosen step or partition
  ledger   which records each executed step trained on (the exactly-once check's evidence)
  phases   a worker's start-up, phase by phase (where a recovery's time goes)

The coordinator, agents and the worker process around the trainer are `medjax.fault`.
"""
