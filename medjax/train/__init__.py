"""Training: the trainer (`loop.train_and_evaluate`) and what it is made of.

  loop           mesh -> data -> model and optimizer -> state -> step -> restore -> loop -> evals
  state, step    the sharded training state; the pure, jitted train and predict steps
  optim          optimizer and learning-rate schedule from config.optim
  checkpointing  when to save, the commit path, preemption, restore-or-start
  reporting      metrics and progress at the logging interval (one device sync per interval)
  metrics        classification metrics (accuracy, macro F1, top-3, rare recall, by subset, CIs)
  writers        metrics.jsonl and TensorBoard
"""
