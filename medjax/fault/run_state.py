"""What the coordinator knows of a run: its status, hosts, workers and failures (`State`), what
survives a coordinator's restart (`State.to_json`), and the worker exit codes it reads.

Plain data, no decisions: `medjax.fault.policy` decides over it.
"""

from __future__ import annotations

import dataclasses
import enum
import signal

from medjax import schema


# A worker's exit codes (besides 0, success, and -N, killed by signal N); `medjax.fault.worker`
# exits with them and the policy reads them, so they live here, where no jax is imported.
# EXIT_INPUT (bad input or damaged state, medjax.errors) is not a failure that a restart cures:
# the coordinator stops the run with the worker's error line.
EXIT_ERROR, EXIT_INPUT, EXIT_STOPPED, EXIT_PREEMPTED, EXIT_OOM = 1, 2, 10, 11, 12


# A crash is SIGKILL or a fatal signal of the process's own (abort, segmentation or bus fault,
# illegal instruction, arithmetic error). Killed by signal N, a process exits with -N.
_CRASH_SIGNALS = (signal.SIGKILL, signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS, signal.SIGILL,
                  signal.SIGFPE)
# A signal that a process's own code does not send itself when a peer fails (as an abort can, a
# failed check in a collective whose peer is gone): its death is a cause, not a symptom.
CAUSE_SIGNALS = tuple(-s for s in _CRASH_SIGNALS if s != signal.SIGABRT)
EXIT_KINDS = {**{-s: "crash" for s in _CRASH_SIGNALS}, -signal.SIGTERM: "sigterm",
              -signal.SIGSTOP: "hang", EXIT_ERROR: "error", EXIT_INPUT: "input",
              EXIT_PREEMPTED: "preemption", EXIT_OOM: "oom", EXIT_STOPPED: "stopped", 0: "exit"}


class Status(enum.Enum):
  """The coordinator's state; the values are what the Status RPC and the lineage store carry."""
  WAITING = "waiting"        # no generation runs; start one once enough hosts are alive
  RUNNING = "running"        # a generation trains; watch for exits, hangs and lost hosts
  STOPPING = "stopping"      # a failure stops the generation; wait until its workers are gone
  BACKOFF = "backoff"        # wait before the next generation (longer after each failure)
  RECOVERING = "recovering"  # restarted mid-generation: do the agents still run it?
  DONE = "done"
  FAILED = "failed"


@dataclasses.dataclass
class Failure:
  """One failure, as the summary and events.jsonl report it."""
  kind: str                   # an EXIT_KINDS value, 'hang' or 'host_lost'
  worker: int | str           # a process id, or a host name for a lost host
  host: str | None
  generation: int
  step: int                   # the worker's last reported step, else the last committed one
  committed_step: int
  detected_s: float           # from the fault (its marker, else the last heartbeat) to detection
  t_detect: float
  fault: str | None = None    # the fault marker it was matched to
  recovered_s: float | None = None  # from detection to the next generation's first step
  observed: str | None = None  # the symptom, when a lost host or a peer's crash was the cause
  reason: str = ""            # the worker's one-line error, when it left one


@dataclasses.dataclass
class Worker:
  """A worker process of the current generation, from its heartbeats and its agent's reports."""
  process_id: int
  exit_code: int | None = None
  phase: str | None = None
  step: int | None = None
  epoch: int | None = None
  partition: int | None = None
  counter: int = -1
  last_seen: float | None = None
  last_progress: float | None = None
  gap_s: float | None = None   # its longest recent gap between finished steps while training
  gaps: int = 0                # how many gaps that is over
  gap_steps: int = 0           # how many finished steps those gaps spanned (the warm-up)
  beat_s: float = 0.0          # its heartbeat interval
  beat_gap_s: float | None = None  # its longest recent gap between heartbeats while training


@dataclasses.dataclass
class Agent:
  """A host's agent, from its registration and heartbeats."""
  host: str
  last_seen: float
  agent_id: str | None = None
  address: str = "127.0.0.1"
  free_port: int | None = None
  generation: int = -1
  workers: list[dict] = dataclasses.field(default_factory=list)

  def running(self) -> bool:
    return any(w.get("running") for w in self.workers)


_PERSISTED = ("status", "generation", "history", "failures", "gen_stats", "strikes",
              "commits_at_failure", "spec")

_HOSTS = schema.List(schema.Str(nonempty=True), min_len=1)


def _spec_agrees(spec: dict) -> bool:
  return spec["num_processes"] == len(spec["hosts"]) * spec["workers_per_host"]


# A generation's spec, as the policy writes it (`Policy._start_generation`) to
# <workdir>/generations/gen-<G>.json and its state, and as agents, standbys and workers read it.
SPEC = schema.Satisfies(
    schema.Object({"generation": schema.Int(min=1), "hosts": _HOSTS,
                   "host_history": schema.List(_HOSTS),
                   "workers_per_host": schema.Int(min=1), "num_processes": schema.Int(min=1),
                   "devices_per_worker": schema.Int(min=1),
                   "jax_address": schema.Str(nonempty=True)}),
    _spec_agrees, "a spec whose num_processes is len(hosts) * workers_per_host")

_FAILURE = schema.Object(
    {"kind": schema.Str(nonempty=True), "worker": schema.AnyOf(schema.COUNT, schema.STR),
     "host": schema.Nullable(schema.STR), "generation": schema.COUNT, "step": schema.COUNT,
     "committed_step": schema.COUNT, "detected_s": schema.NUM, "t_detect": schema.NUM},
    optional={"fault": schema.Nullable(schema.STR), "recovered_s": schema.Nullable(schema.NUM),
              "observed": schema.Nullable(schema.STR), "reason": schema.STR})

# A generation's statistics: what the summary adds up (report.fault_tolerance) and the policy
# reads back; other keys are the workers' phase reports, carried as they are.
_GEN_STATS = schema.Object({}, optional={
    "started": schema.NUM, "first_step": schema.NUM, "first_global_step": schema.COUNT,
    "hosts": schema.List(schema.STR), "executed": schema.COUNT, "blocked_s": schema.NUM,
    "writes": schema.COUNT, "write_s": schema.NUM, "last_step": schema.COUNT,
    "training_s": schema.NUM, "phases": schema.Map(schema.Map(schema.ANY))})

# What `State.to_json` writes (the lineage store's state "coordinator"): every field is there.
SAVED = schema.Object({
    "status": schema.OneOf(*(s.value for s in Status)), "generation": schema.COUNT,
    "history": schema.List(schema.List(schema.STR)), "failures": schema.List(_FAILURE),
    "gen_stats": schema.Map(_GEN_STATS, key=schema.Satisfies(
        schema.STR, str.isdigit, "a generation number")),
    "strikes": schema.COUNT, "commits_at_failure": schema.Int(min=-1),
    "spec": schema.Nullable(SPEC)})


@dataclasses.dataclass
class State:
  """The coordinator's state. `to_json` holds what survives a restart; the rest (agents, workers,
  timers) is rebuilt from the agents' and workers' next reports."""
  status: Status = Status.WAITING
  generation: int = 0
  history: list[list[str]] = dataclasses.field(default_factory=list)  # each generation's hosts
  failures: list[Failure] = dataclasses.field(default_factory=list)
  gen_stats: dict[str, dict] = dataclasses.field(default_factory=dict)  # by str(generation)
  strikes: int = 0                # failures in a row without a new committed step
  commits_at_failure: int = -1    # the last committed step at the latest failure
  spec: dict | None = None        # the current generation's spec
  last_commit: int = 0            # the newest committed step (from the lineage store)
  error: str = ""
  agents: dict[str, Agent] = dataclasses.field(default_factory=dict)
  workers: dict[int, Worker] = dataclasses.field(default_factory=dict)
  dismissed: set[str] = dataclasses.field(default_factory=set)  # agents told the run is over
  stop_started: float = 0.0
  stop_deadline: float = 0.0
  backoff_until: float = 0.0
  waiting_since: float = 0.0
  recover_until: float = 0.0

  def to_json(self) -> dict:
    out = {name: getattr(self, name) for name in _PERSISTED}
    out["status"] = self.status.value
    out["failures"] = [dataclasses.asdict(f) for f in self.failures]
    return out

  @classmethod
  def from_json(cls, saved: dict) -> "State":
    """The state `to_json` saved.

    Raises:
      schema.SchemaError: `saved` is not what `to_json` writes (`SAVED`); names the field.
    """
    schema.check(saved, SAVED)
    if saved["spec"] is not None and saved["spec"]["generation"] != saved["generation"]:
      raise schema.SchemaError("spec.generation", f"is {saved['spec']['generation']}, not the "
                               f"state's generation {saved['generation']}")
    fields = {f.name for f in dataclasses.fields(Failure)}
    return cls(status=Status(saved["status"]), generation=saved["generation"],
               history=saved["history"],
               failures=[Failure(**{k: v for k, v in f.items() if k in fields})
                         for f in saved["failures"]],
               gen_stats=saved["gen_stats"], strikes=saved["strikes"],
               commits_at_failure=saved["commits_at_failure"], spec=saved["spec"])


@dataclasses.dataclass
class Effects:
  """What the shell does after a policy call, in this order: write `spec` (the new generation's),
  write `events` (name, fields), persist the state if `persist`; then answer with `reply`."""
  events: list[tuple[str, dict]] = dataclasses.field(default_factory=list)
  persist: bool = False
  spec: dict | None = None
  reply: dict | None = None
