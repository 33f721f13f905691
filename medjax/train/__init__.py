"""Training: the trainer (`loop.train_and_evaluate`) and what it is made of.

  prepare    mesh -> data -> model and optimizer (abstract) -> the compiled step, before restoring
  loop       restore -> one loop over the planned steps -> the last saves -> evals -> summary
  planned    the planned steps, epoch by epoch and partition by partition, each batch read ahead
  state      the device mesh and the training state, created already sharded
  step       the pure, jitted train and predict steps (explicit shardings, donated state)
  optim      optimizer and learning-rate schedule from config.optim
  local_sgd  config.optim.mode='local': replicas, rounds, their averaging, late replicas cut short
  reporting  training metrics and progress at the logging interval (one device sync per interval)
  writers    metrics.jsonl and TensorBoard
  stopping   validation at each epoch end: early stopping, the best checkpoint, a sweep's pruner

Below it: checkpoints (`medjax.checkpoint`), the worker-side hooks (`medjax.runtime`), the
evaluation (`medjax.evals`), the data (`medjax.data`) and the model (`medjax.model`).
"""
