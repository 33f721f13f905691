"""Default: a 24,000-patient synthetic cohort with the paper's shape, trained on CPU.

Run:
  python launch.py --config configs/default.py --workdir runs/default
Variants:
  configs/default.py:ingest   only synthesise and ingest the cohort (no training)
"""

import ml_collections
from ml_collections import config_dict

from medjax.data.synthetic import config as synthetic_config


def get_config(arg=None):
  config = ml_collections.ConfigDict()
  # What the command runs: 'synth' (write the cohort), 'ingest' (+ manifest, placement, cache),
  # 'train' (+ training and evaluation).
  config.mode = "train"
  config.seed = 0
  # Training metrics are fetched from the device, checked and logged every this many steps.
  config.log_every_steps = 10
  # Steps the host may dispatch ahead of the device (0: as many as JAX queues; -1: 2 where XLA
  # computes on the CPU, 4 on an accelerator, whose ~9 ms steps a host pause of two steps (an
  # epoch's end, a metrics flush) would otherwise leave idle). A crash throws away the steps in
  # flight beyond the last snapshot, so more cost more (on a GPU, milliseconds).
  config.max_steps_in_flight = -1

  config.data = data = ml_collections.ConfigDict()
  # Cohort directory (dicom/, labs.csv, vitals.csv, labels.csv). None: synthesise one from
  # data.synthetic into <workdir>/cohort.
  data.root = config_dict.placeholder(str)
  data.synthetic = synthetic_config.get_config()
  # 24,000 patients: at 6,000 this model is limited by training-set size (~0.91 of the Bayes
  # ceiling whatever the architecture, in the tuning runs behind configs/quickstart.py).
  data.synthetic.num_patients = 24000
  data.analytes = ()          # expected lab columns in model order; empty: take them from labs.csv
  # labs.csv column, or a long file's analyte name or code -> analyte (or vitals channel) name;
  # any table's column -> a role's name ({'status': 'diagnosis'}, {'record_id': 'patient_id'})
  data.rename = ml_collections.ConfigDict()
  data.classes = ()           # class names in model order; empty: sorted names from labels.csv
  data.vitals_channels = ("hr", "sbp", "dbp", "rr", "spo2", "temp")
  data.vitals_steps = 24
  data.vitals_hours_per_step = 1.0
  data.image_size = 32        # cached image side (images are letterboxed and resized to it)
  data.max_images = 4
  data.split = (0.7, 0.1, 0.2)   # train, val, test; labels.csv's split column overrides it
  data.on_error = "quarantine"   # malformed table rows: 'quarantine' (report, go on) or 'raise'
  # Plausible (low, high) per lab analyte or vitals channel name (matched ignoring case, spaces
  # and punctuation; 'Sodium' is Na's); values outside are set to missing with a quarantine row.
  # Entries add to (or, as None, remove) the built-in ranges
  # (medjax/data/tables/analytes.py): hr, sbp, dbp, rr, spo2, temp, and 43 common
  # labs in US units (Na, K, Glucose, Creatinine, ...). Any value is also checked to be finite
  # and within float32's range.
  data.value_ranges = ml_collections.ConfigDict()
  # Merge patient ids that differ only by letter case (tables and DICOM). Off: they are kept as
  # different patients and counted in the ingest summary. On, record ids hash the casefolded id.
  data.ids_case_insensitive = False
  # How a time column's dates written with numbers ('03/01/2020') read: 'auto' (a day past 12
  # says which; else '/' is month/day, '.' and '-' day/month, said in the ingest table),
  # 'month_first' or 'day_first'. ISO 8601 (2020-03-01) needs none.
  data.date_order = "auto"
  data.salt_file = ""         # pseudonymisation salt; default <workdir>/secrets/id_salt
  data.scan_workers = 0       # header-scan processes; 0: one per core it may use
  # DICOM budgets, checked on the file size and header before any pixel is decoded; a file over
  # one is quarantined with the numbers and the field to raise. Rows x Columns x Frames x
  # Samples: 2**29 = 537M holds a 2000-frame 512x512 CT (524M) or a 4096x3328 mammogram (14M)
  # many times, and refuses a 65535x65535 header (4.3G). Decoded bytes (x BitsAllocated/8): the
  # same CT at 16 bits is 1000 MiB; 65535x65535 x 16 bits would be 8 GiB.
  data.max_pixels = 2**29
  data.max_decoded_mb = 1024
  data.max_file_mb = 2048     # above any file the byte budget admits (plus its header)
  # Compressed (encapsulated) and deflated files are decoded in child processes, where a crash,
  # a runaway allocation or a hang costs that one file: 'compressed', 'all' or 'none'.
  data.isolate_decoding = "compressed"
  # Each child's address-space limit. Decoding takes ~300 MB plus ~22 bytes per pixel (float64
  # windowing), so 2048 decodes ~80M pixels (a 300-frame 512x512 CT); raise it for larger files.
  data.decode_memory_mb = 2048
  # Per file in a decoder child (a 120-frame colour JPEG takes ~8 s), and in a scanning or
  # decoding process (a read a stalled mount never answers): past it the file is quarantined.
  data.decode_timeout_s = 120.0
  data.decode_workers = 2     # children at most (the cache decodes from up to 2 threads)
  # Processes that decode a cache fill (the records of a host's first epoch); 0: one per core
  # the worker may use (its CPU affinity: a SLURM allocation or cpuset, not the whole node).
  data.decode_processes = 0
  data.cache_dir = ""         # node-local decoded cache; default <workdir>/cache
  # Also hold a process's cached records in memory when they fit in this many MB; -1: a quarter
  # of the memory available, shared by the host's processes; 0: never.
  data.cache_memory_mb = -1
  data.prefetch = "auto"      # read ahead: 'thread', 'inline' (training thread), 'auto'
                              # (CPU: inline)
  data.reingest = False       # ingest again even if <workdir>/ingest exists
  data.placement_method = "bounded"   # 'bounded' (medjax), 'ring' or 'modulo' (baselines)
  # After a host set change: 'recache' (new owners decode moved records once, in the background)
  # or 'redirect' (the baseline: moved records are read from shared storage at every read).
  data.cache_policy = "recache"
  data.replicas = 1           # 2: also cache each record on its second owner (one loss is free)
  data.vnodes = 100           # virtual nodes per host on the hash ring
  data.num_partitions = 8     # partitions per epoch (the unit of lineage)
  data.batch_size = 32        # global batch, split evenly over hosts

  config.model = model = ml_collections.ConfigDict()
  model.d_model = 64
  model.image_channels = (16, 32, 64)   # strided 3x3 convs, one per entry
  # Model specs (DiagnoseNET's family: each encoder's width and depth, the fusion's): the image
  # encoder's depth and widths are image_channels; labs: labs_layers hidden layers of
  # labs_hidden; vitals: vitals_layers temporal convs of vitals_hidden; fusion: fusion_layers of
  # d_model (mlp_dim wide).
  model.labs_hidden = 128
  model.labs_layers = 1
  # Per-feature numeric embeddings of the labs (Gorishniy et al. 2022): 'none' (the raw z-scored
  # values and the mask into the labs MLP), 'piecewise' (piecewise-linear over labs_bins bins
  # between the training quantiles) or 'periodic' (labs_frequencies trained sin/cos frequencies
  # drawn from N(0, labs_frequency_scale)); each feature gets its own labs_embed_width-dim
  # embedding, and an unmeasured one its own learned missing embedding.
  model.labs_embedding = "none"
  model.labs_embed_width = 8
  model.labs_bins = 16
  model.labs_frequencies = 16
  model.labs_frequency_scale = 0.1
  # One d_model token per lab feature beside the image and vitals tokens (FT-Transformer's
  # feature tokens), instead of one labs token from the MLP; with labs_embedding 'none' the
  # features are embedded piecewise-linearly. configs/tables.py uses it.
  model.labs_tokens = False
  model.vitals_hidden = 64
  model.vitals_layers = 1
  model.fusion = "attention"            # 'attention' over modality tokens, or 'gated'
  model.fusion_layers = 1
  model.heads = 4
  model.mlp_dim = 128
  # Members of a packed deep ensemble (medjax/model/ensemble.py): each a whole model with its
  # own initialisation, trained on the same batches by its own loss; predictions are the mean of
  # their probabilities. Costs `members` times the model's compute.
  model.members = 1
  model.missing = "learned"             # 'learned', 'zero', 'mean' or 'drop' (ablations)
  model.modality_dropout = 0.15         # per modality, never all of a record's
  # Compute dtype: 'auto' is bfloat16 on a GPU or TPU and float32 on CPU (README, "What to
  # expect on one GPU"); parameters, optimiser state and the loss are float32 whatever it is.
  model.dtype = "auto"
  model.num_classes = 0                 # 0: from the data; otherwise checked against it
  model.num_analytes = 0                # 0: from the data; otherwise checked against it
  model.vitals_channels = 0             # 0: from the data; otherwise checked against it

  config.optim = optim = ml_collections.ConfigDict()
  optim.epochs = 10
  optim.lr = 2e-3
  optim.warmup_fraction = 0.05
  optim.end_lr_fraction = 0.01
  optim.b1 = 0.9
  optim.b2 = 0.999
  optim.weight_decay = 1e-4
  optim.clip_norm = 1.0
  optim.grad_accum = 1                  # average the gradients of k steps per update
  # Gradient coordination (medjax/train/local_sgd.py): 'sync' averages every step's gradients
  # over all devices; 'local' trains `replicas` copies (0: one per data-parallel device, fixed
  # when the run first starts) on their own slices of each batch and averages their parameters
  # every local_steps steps and at each epoch's end, through an outer SGD with Nesterov
  # momentum (DiLoCo). late_after_s > 0: once late_quorum other processes (0: half of them)
  # finished a round, a process still in it trains at most that much longer, then skips the
  # round's rest, and one at a round's end waits at most that much, then trains on until the
  # others come; the records skipped train in a catch-up at the epoch's end. With it, average
  # plainly (outer_lr=1, outer_momentum=0): experiments/results/bench_modes.md.
  optim.mode = "sync"
  optim.replicas = 0
  optim.local_steps = 16
  optim.outer_lr = 0.7
  optim.outer_momentum = 0.9
  optim.late_after_s = 0.0
  optim.late_quorum = 0
  optim.class_weighted = False          # inverse-frequency loss weights for rare classes
  optim.class_weight_power = 0.5        # weight = count^-power (0.5: square-root balancing)
  # Stop after this many epochs without an improvement of evals.validation_metric (0: never).
  optim.early_stopping_patience = 0
  # Evaluate (validation, best checkpoint, test) with an exponential moving average of the
  # parameters whose time constant is this many epochs ('sync' mode; 0: the parameters).
  optim.ema_epochs = 0.0

  config.mesh = mesh = ml_collections.ConfigDict()
  mesh.data = -1                        # data-parallel axis size; -1: all devices fsdp leaves
  mesh.fsdp = 1                         # parameter-sharding axis size
  # JAX persistent compilation cache; unset: $JAX_COMPILATION_CACHE_DIR, else <workdir>/jax_cache
  mesh.compilation_cache_dir = ""

  config.ckpt = ckpt = ml_collections.ConfigDict()
  ckpt.max_to_keep = 3                  # committed checkpoints kept
  ckpt.async_save = True
  # When to checkpoint (the lineage paper's Table I): 'lineage' (the two fields below), 'epoch'
  # (epoch ends), 'time' (every ckpt.every_seconds), 'none' (the end only: a failure restarts
  # from step 0). Every strategy saves the end of training.
  ckpt.strategy = "lineage"
  ckpt.partition_boundaries = True      # lineage: checkpoint at every partition boundary
  ckpt.every_steps = 0                  # lineage: also every k steps inside a partition (0: no)
  ckpt.every_seconds = 0.0              # time: seconds between checkpoints
  # lineage: a boundary's or k-step save sooner than this after the previous one is skipped
  # (0: every one, the paper's policy). Each save costs tens of ms of CPU on the saver thread.
  ckpt.min_interval_s = 0.0
  # Host-local snapshots (medjax.checkpoint.snapshots): the state every k global steps in host
  # memory, which a crashed or hung worker's replacement on the same host resumes from (0: off).
  ckpt.snapshot_every_steps = 4
  ckpt.snapshot_dir = ""                # default /dev/shm (else the temporary directory)
  # The most of the wall time each background writer (checkpoints, snapshots) spends writing:
  # after a write of w seconds the checkpoint writer rests w * (1/duty - 1) (boundaries reached
  # meanwhile coalesce, the newest written), and snapshots space out in powers of two of
  # snapshot_every_steps. Writers that never rested held an H100's loop to 0.24 of the step's
  # speed (README, "What to expect on one GPU"); a failure's replay grows by at most a rest.
  # 1.0: write whenever due (every boundary the writer is free for, every k steps).
  ckpt.writer_duty = 0.02
  ckpt.lineage_store = ""               # TensorStore kvstore path or URL; default <workdir>/lineage
  # When every committed checkpoint is damaged: 'stop' (one line naming the damage) or
  # 'start_fresh' (train from step 0; the damaged checkpoints are moved aside, not deleted).
  ckpt.if_all_damaged = "stop"
  # Keep the best-on-validation checkpoint (evals.validation_metric at each epoch end) beside the
  # newest ones, and evaluate the test split on it.
  ckpt.keep_best = False

  config.evals = evals = ml_collections.ConfigDict()
  evals.splits = ("val", "test")
  evals.bootstrap = 1000                # resamples for the 95% intervals
  # What "better on validation" means for early stopping, the best checkpoint and sweeps:
  # a key of the validation split's metrics (medjax/evals/metrics.py): 'macro_f1', 'accuracy',
  # 'top3_accuracy', 'rare_recall', 'auroc_macro' (binary tasks: 'auroc'), 'neg_log_loss' (minus
  # the validation log-loss, which every record's probability moves); higher is better.
  evals.validation_metric = "macro_f1"

  # The monitor: per process, every interval_s, into metrics.jsonl (kind 'monitor') and
  # TensorBoard: throughput, step time, host CPU and memory, accelerator utilisation, memory and
  # power where NVML has them, energy where RAPL or NVML measure it.
  config.monitor = monitor = ml_collections.ConfigDict()
  monitor.interval_s = 5.0              # 0: off
  # > 0: also an energy *estimate* from this nominal power (W) where nothing measures it,
  # labelled as an estimate; 0: energy is "not measured" there.
  monitor.nominal_power_w = 0.0

  # A run started as one trial of a sweep (medjax/sweep; set by the sweep, not by hand): it
  # reports evals.validation_metric at each epoch end to this Optuna study, whose pruner may
  # stop it early.
  config.trial = trial = ml_collections.ConfigDict()
  trial.storage = ""                    # Optuna storage URL ('' : not a trial)
  trial.study = ""
  trial.number = -1

  config.fault = fault = ml_collections.ConfigDict()
  # Supervised runs have a coordinator process, one agent per host and worker processes; an
  # unsupervised run trains in the launcher's own process (no fault tolerance beyond resume).
  fault.supervised = True
  fault.local_hosts = 1       # hosts (agents) started on this machine by the local launcher
  fault.local_spares = 0      # local runs: spare agents started in place of lost hosts
  fault.hosts = 0             # hosts a generation needs (0: local_hosts)
  # Worker processes per host. 0: auto (medjax/fault/layout.py): one per accelerator, or on a
  # CPU-only host one process whose single device uses every core (no gradient exchange).
  fault.workers_per_host = 0
  # Agents keep standby workers with everything imported (and, for a one-process generation on
  # CPU, the data, model and compiled step built), for restarts in about a second.
  fault.standby_workers = True
  # What a host's agent keeps ready while a generation trains (on CPU it takes the cores
  # training uses): 'always': a spare standby, prepared ahead for the next generation where it
  # can be (data, model, compiled step: a restart in ~0.3 s); 'after_failure': the same once
  # the run has restarted; before that, only a spare that imported while the run started (a
  # clean run pays for no work during training; the first restart prepares, ~1.5 s); 'never':
  # spares that import but do not prepare (~1.5 s).
  # A GPU host's spares, started while a generation trains, allocate GPU memory as they need it
  # and prepare beside its worker on the same GPU (one without the room stays unprepared); a TPU
  # host's spares only import.
  fault.warm_standby = "after_failure"
  fault.devices_per_worker = 1
  fault.elastic = False       # after a host is lost, go on with fewer hosts (>= min_hosts)
  fault.min_hosts = 1
  fault.replacement_wait_s = 60.0   # without elastic: how long to wait for a replacement host
  fault.timeout_training_s = 10.0   # hang: no progress for this long while training
  # ... or, once warm (hang_warmup_steps steps), learned (medjax/fault/policy.py hang_limits):
  # silence past hang_factor x the longest recent gap between heartbeats (at least hang_floor_s)
  # is a frozen worker; heartbeats without a step past 2 x (hang_factor x the longest recent
  # step gap + the heartbeat interval) (at least 2 x hang_floor_s) a stuck one. 0: off.
  fault.hang_factor = 5.0
  fault.hang_floor_s = 1.5
  fault.hang_warmup_steps = 20
  fault.timeout_compile_s = 180.0   # ... while compiling, restoring or checkpointing
  fault.timeout_start_s = 600.0     # ... while starting, preparing data or evaluating
  fault.host_timeout_s = 5.0        # lost host: no agent heartbeat for this long
  fault.stop_grace_s = 2.0          # stop at a step boundary, then SIGTERM, then SIGKILL
  fault.agent_interval_s = 0.2
  fault.coordinator_lost_s = 600.0  # agents give up on an unreachable coordinator after this
  fault.backoff_s = 1.0             # restart delay, doubled per failure without progress
  fault.backoff_max_s = 30.0
  fault.max_failures_without_progress = 3
  fault.max_coordinator_restarts = 3  # local launcher: coordinator deaths in a row without a commit
  fault.jax_heartbeat_timeout_s = 120   # above ours, so the coordinator acts first
  fault.port = 0              # coordinator port (0: a free one, local runs)
  fault.token_file = ""       # shared token (or $MEDJAX_TOKEN); default <workdir>/secrets/token
  fault.tls_cert = ""         # optional TLS: coordinator certificate and key, agents' CA
  fault.tls_key = ""
  fault.tls_ca = ""
  fault.inject = ""           # e.g. "kill@step=30:process=1; sigterm@partition=2:process=0"
  fault.slow_step_s = 0.5     # what a 'slow' fault adds to each step the process trains
  fault.pause_s = 1.0         # how long a 'pause' fault stops the process (SIGSTOP, SIGCONT)
  fault.ledger = True         # write the per-step record ledger (exactly-once checks)

  if arg == "ingest":
    config.mode = "ingest"
  elif arg:
    raise ValueError(f"configs/default.py: unknown variant {arg!r}; use 'ingest' or none")
  return config
