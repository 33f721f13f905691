"""Tables V-VI by simulation: a data-parallel job under failures and checkpoints, 4 to 16,384
workers, driven by the costs medjax measures and by failure rates published for large runs.

  nice -n 10 python -m experiments.failure_sim [--trials 500] [--seed 0] [--price 3.06]
      [--workers 4,8,...,16384] [--results experiments/results] [--out experiments/results]

Writes <out>/failure_sim.json (every input with its label, every simulated number),
failure_sim.md (the tables), failure_sim_goodput.png and failure_sim_waste.png, and prints a
compact table. experiments/report imports it: `load_costs`, `Costs`, `Job`, `Strategy`,
`RATES`, `simulate`, `sweep`, `table_v`, `table_vi`, `intervals`, `validate`,
`measured_from_bench_fault`, `measured_from_workdir`, `run`, `markdown`.

The model
- A job is `Job.steps` global steps of `Job.step_s` seconds, in epochs of `partitions_per_epoch`
  partitions of `partition_steps` steps (medjax's plan).
- A strategy is the set of steps after which a checkpoint is saved (the last step always is).
  A save blocks training for `Costs.checkpoint_s` and is committed when that ends (the
  validation replay also models medjax's async write: one save at a time on a saver thread,
  committed its measured write time after that write starts).
  none: only the end (a failure restarts from step 0); epoch: every epoch end; time: every
  `interval_s` s of training, rounded up to a step; lineage: every partition boundary and, with
  `every_k`, every global step divisible by k (medjax's `SavePolicy`); young_daly: every
  sqrt(2 C M) s (Young 1974; `order=2`: Daly 2006's higher-order form), rounded to a step, with C
  the save cost and M the job's mean time between failures at that worker count.
- Failures are a Poisson process in the time the job trains or saves (none while it is down),
  of rate workers x accelerators per worker / per-accelerator MTBF, with kinds crash, hang,
  host_lost and preemption in a source's stated mix. A failure costs its kind's detection time
  plus the recovery time (one recovery path, `Costs.recovery_path`, the same for a restart from
  step 0) and throws away the steps since the last committed save, the step in flight included
  (medjax counts a step as executed when it is dispatched). A preemption under a strategy that
  saves on SIGTERM (`lineage`, as medjax does) finishes its step, saves and loses no step.
- Monte Carlo over trials (vectorised over trials, one loop turn per failure), with the
  closed-form expectation beside it: the sum over checkpoint segments of d_i of
  (e^(lam d_i) - 1)(1/lam + mean downtime), exact without preemption saves. Where a trial would
  need more than `max_events` restarts the row is the closed form alone (usually: it does not
  finish).
- Per (strategy, workers): goodput (failure-free training time / wall time), time to train,
  waste fraction (steps thrown away / steps executed: the summary's `waste_fraction`),
  checkpoint overhead (time in saves / wall time), downtime fraction, failures by kind,
  accelerator-hours and cost.
- `validate` replays a measured run (its failures at their steps, its per-failure detection and
  recovery times, its checkpoint policy; deterministic) and compares waste and wall time.

What it leaves out (each can move the numbers at scale):
- stragglers and step-time variance: every step takes step_s, while a synchronous step waits
  for the slowest worker;
- correlated failures (a switch or power domain taking many hosts at once, a bad node failing
  again soon after it rejoins) and failures while the job is down or restoring;
- communication and parallel efficiency: under strong scaling a step takes step_s x W_ref / W
  (perfect scaling); the efficiency column of Table V shows only failure and checkpoint losses;
- checkpoint and recovery costs that grow with scale: network contention of many hosts writing
  at once, storage bandwidth limits, restore and jax.distributed start-up growing with model and
  cluster size; the costs are the measured (or published) ones at every worker count;
- at scale, the async write time of a save (it counts as committed when its blocking part
  ends; seconds against hours between failures), and the CPU that Orbax's background write
  takes from training (on 2 CPU cores the extra wall time
  per save is larger than its blocking time: `load_costs(checkpoint='wall')` uses it);
- data-loader warm-up and cache refill after a restart or a host change, and the first compile;
- elastic shrinking, waiting for a replacement machine (a lost host is replaced at once by a
  spare) and back-off after repeated failures;
- silent data corruption and loss spikes that force a rollback past the last checkpoint;
- evaluation passes.
"""

# The public API (and the helpers experiments/report uses), from the modules that define them.
from experiments.failure_sim.inputs import (  # noqa: F401
    ROOT, RESULTS, KINDS, STRATEGIES, WORKERS, KIND_OF, PAPER, LLAMA3, YOUNG, DALY, PRICE,
    PRICE_SOURCE, PAPER_TABLE_V, PAPER_TABLE_VI, FailureRate, RATES, Costs, _read_json, _get,
    load_costs)
from experiments.failure_sim.model import (  # noqa: F401
    Job, Strategy, default_strategies, young_daly_interval, checkpoint_steps, Timeline, Result,
    simulate, sweep, table_v, table_vi, intervals)
from experiments.failure_sim.validation import (  # noqa: F401
    MeasuredFailure, Measured, replay, validate, fault_steps, measured_from_bench_fault,
    measured_from_workdir)
from experiments.failure_sim.render import (  # noqa: F401
    LEFT_OUT, _finite, _hours, _goodput, _pct, goodput_table, detail_table, markdown, figures)
from experiments.failure_sim.cli import (  # noqa: F401
    run, main)
