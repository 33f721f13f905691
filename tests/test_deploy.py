"""deploy/: the SLURM script run end to end on one machine, and the Kubernetes manifests checked.

The SLURM script runs under `bash` with stand-ins for `srun` and `scontrol` first on PATH: srun
starts each task as a local process with the variables slurmd sets (SLURMD_NODENAME,
SLURM_NODEID, SLURM_PROCID, ...); the two "nodes" are 127.0.0.2 and 127.0.0.3, both this
machine's loopback, so each has its own address as a real node would, and neither is the
address medjax falls back on (127.0.0.1) where a flag does not reach it.
"""

import glob
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time

import psutil
import pytest
import yaml

from medjax import cli
from medjax import config_check
from medjax.fault import protocol
from tests import runs

DEPLOY = os.path.join(runs.ROOT, "deploy")
SBATCH = os.path.join(DEPLOY, "slurm", "medjax.sbatch")
K8S = os.path.join(DEPLOY, "k8s")

# slurm's hostlist syntax, expanded by both stand-ins: `a,b`, `prefix[1-3,7]suffix`.
_EXPAND = '''
def expand(spec):
  out = []
  for item in re.findall(r"[^,\\[]+(?:\\[[^\\]]*\\])?[^,]*", spec):
    m = re.fullmatch(r"(.*)\\[(.*)\\](.*)", item)
    if not m:
      out.append(item)
      continue
    for part in m.group(2).split(","):
      lo, _, hi = part.partition("-")
      for i in range(int(lo), int(hi or lo) + 1):
        out.append(f"{m.group(1)}{str(i).zfill(len(lo))}{m.group(3)}")
  return out
'''

_SCONTROL = '''
import re, sys
{expand}
if sys.argv[1:3] != ["show", "hostnames"] or len(sys.argv) != 4:
  sys.exit(f"scontrol stand-in: only `scontrol show hostnames LIST`, not {{sys.argv[1:]}}")
print("\\n".join(expand(sys.argv[3])))
'''

_SRUN = '''
"""srun stand-in: one local process per task, with slurmd's per-task variables."""
import json, os, re, signal, subprocess, sys, time
{expand}
# srun's options the script may use: name -> takes a value (always as --name=value here).
KNOWN = {{"overlap": False, "nodes": True, "ntasks": True, "ntasks-per-node": True,
          "nodelist": True, "gres": True, "kill-on-bad-exit": True, "cpus-per-task": True,
          "export": True, "label": False, "unbuffered": False, "chdir": True}}
args, opts = sys.argv[1:], {{}}
while args and args[0].startswith("-"):
  arg = args.pop(0)
  name, eq, value = arg[2:].partition("=")
  if not arg.startswith("--") or KNOWN.get(name) != bool(eq):
    sys.exit(f"srun stand-in: unknown or malformed option {{arg!r}}")
  opts[name] = value
job_nodes = expand(os.environ["SLURM_JOB_NODELIST"])
nodes = expand(opts["nodelist"]) if "nodelist" in opts else job_nodes
if "nodes" in opts:
  if int(opts["nodes"]) > len(nodes):
    sys.exit("srun stand-in: more --nodes than the allocation has")
  nodes = nodes[:int(opts["nodes"])]
assert set(nodes) <= set(job_nodes), (nodes, job_nodes)
per_node = int(opts.get("ntasks-per-node", 1))
tasks = [node for node in nodes for _ in range(per_node)]
if "ntasks" in opts and int(opts["ntasks"]) != len(tasks):
  sys.exit(f"srun stand-in: --ntasks={{opts['ntasks']}} over {{len(nodes)}} node(s)")
with open({log!r}, "a") as f:
  f.write(json.dumps({{"opts": opts, "nodes": nodes, "argv": args}}) + "\\n")
procs = []
for rank, node in enumerate(tasks):
  env = dict(os.environ, SLURMD_NODENAME=node, SLURM_NODEID=str(job_nodes.index(node)),
             SLURM_PROCID=str(rank), SLURM_LOCALID="0", SLURM_STEP_NUM_TASKS=str(len(tasks)),
             SLURM_STEP_NUM_NODES=str(len(nodes)), SLURM_STEP_NODELIST=",".join(nodes))
  procs.append(subprocess.Popen(args, env=env))
stopping = []
def forward(signum, frame):
  stopping.append(time.monotonic())
  for p in procs:
    if p.poll() is None:
      p.send_signal(signum)
signal.signal(signal.SIGTERM, forward)
signal.signal(signal.SIGINT, forward)
while any(p.poll() is None for p in procs):
  if stopping and time.monotonic() - stopping[0] > 15:   # slurm's KillWait
    for p in procs:
      if p.poll() is None:
        p.kill()
  time.sleep(0.1)
codes = [p.returncode if p.returncode >= 0 else 128 - p.returncode for p in procs]
sys.exit(max(codes))
'''


def _write_standins(bin_dir: str, log: str) -> None:
  os.makedirs(bin_dir, exist_ok=True)
  for name, body in (("srun", _SRUN.format(expand=_EXPAND, log=log)),
                     ("scontrol", _SCONTROL.format(expand=_EXPAND))):
    path = os.path.join(bin_dir, name)
    with open(path, "w") as f:
      f.write(f"#!{sys.executable}\n{body}")
    os.chmod(path, 0o755)


def _ours(*markers: str) -> list[psutil.Process]:
  """Live processes whose command line names one of `markers` (this test's own paths)."""
  alive = []
  for p in psutil.process_iter(["cmdline"]):
    try:
      if (any(m in arg for m in markers for arg in p.info["cmdline"] or [])
          and p.status() != psutil.STATUS_ZOMBIE):
        alive.append(p)
    except psutil.Error:
      pass
  return alive


def _leftovers(*markers: str) -> list[psutil.Process]:
  """This test's processes still alive a few seconds after the script exited (a killed process
  takes a moment to go); they are killed, and returned."""
  deadline = time.monotonic() + 5
  while (alive := _ours(*markers)) and time.monotonic() < deadline:
    time.sleep(0.2)
  for p in alive:   # this test's own processes only (its tmp paths in their command lines)
    try:
      p.kill()
    except psutil.Error:
      pass
  return alive


# -- medjax's flags and fields -------------------------------------------------------------------

def _defined_in_cli() -> list[str]:
  """The flags medjax.cli defines (absl's registry also holds absl's own: --logtostderr, ...)."""
  return [f.name for f in cli.flags.FLAGS.get_flags_for_module(cli)]


FIELDS = set(config_check.field_names())


def _check_medjax_args(args: list[str], where: str) -> dict[str, str]:
  """Every `--flag` is one of medjax.cli's and every `--config.a.b` a config field; returns the
  flags given (name -> value as written, `$VAR` and all; '' for a flag without `=value`)."""
  flags = set(_defined_in_cli())
  assert {"config", "workdir", "role", "coordinator", "bind", "port", "host_name",
          "advertise"} <= flags, flags
  given = {}
  for arg in args:
    if not arg.startswith("--"):
      continue
    name, _, value = arg[2:].partition("=")
    if name.startswith("config."):
      assert name[len("config."):] in FIELDS, f"{where}: {arg}: no config field of that name"
    else:
      assert name in flags, f"{where}: {arg}: not a flag of medjax.cli ({sorted(flags)})"
    given[name] = value
  return given


# -- SLURM ---------------------------------------------------------------------------------------

def _sbatch_commands() -> dict[str, list[str]]:
  """The script's medjax command lines: its `*_cmd=( ... )` arrays, and the words the agents'
  `bash -c '...'` adds on each node."""
  text = open(SBATCH).read()
  text = re.sub(r"^\s*#.*$", "", text, flags=re.M).replace("\\\n", " ")
  commands = {}
  for name, body in re.findall(r"^(\w+_cmd)=\((.*?)\)\s*$", text, flags=re.S | re.M):
    words = []
    for word in shlex.split(body):
      # ${VAR:+"--flag=$VAR"}: the flag, given where VAR is set.
      given_if_set = re.fullmatch(r"\$\{\w+:\+(.*)\}", word)
      words += shlex.split(given_if_set.group(1)) if given_if_set else [word]
    commands[name] = words
  for body in re.findall(r"bash -c '([^']*)'", text):
    commands.setdefault("per_task", []).extend(shlex.split(body))
  return commands


def test_sbatch_medjax_command_lines_use_real_flags_and_fields():
  commands = _sbatch_commands()
  assert set(commands) == {"coordinator_cmd", "agent_cmd", "per_task"}, commands
  for name, words in commands.items():
    if name != "per_task":
      assert words[1:3] == ["-m", "medjax"], f"{name}: run `python -m medjax`, not {words[:3]}"
  coordinator = _check_medjax_args(commands["coordinator_cmd"], "coordinator_cmd")
  agent = _check_medjax_args(commands["agent_cmd"], "agent_cmd")
  per_task = _check_medjax_args(commands["per_task"], "the agents' bash -c")
  assert coordinator["role"] == "coordinator" and agent["role"] == "agent"
  assert {"config", "workdir", "bind", "port", "config.fault.hosts",
          "config.data.cache_dir"} <= set(coordinator)
  assert coordinator["config.fault.hosts"] == "$SLURM_NNODES"
  assert coordinator["config.fault.workers_per_host"] == "$SLURM_GPUS_ON_NODE"
  # The agents read the coordinator's config.json: the overrides have one place to go.
  assert "config" not in agent and not any(k.startswith("config.") for k in agent)
  assert agent["workdir"] == coordinator["workdir"] == "$WORKDIR"
  assert agent["coordinator"] == "$HEAD:" + coordinator["port"]
  assert {"host_name", "advertise"} <= set(per_task)
  text = open(SBATCH).read()
  assert text.startswith("#!/bin/bash\n") and re.search(r"^#SBATCH --nodes=\d+$", text, re.M)
  assert "export MEDJAX_TOKEN" in text
  assert subprocess.run(["bash", "-n", SBATCH]).returncode == 0


def _slurm_env(bin_dir: str, workdir: str, cache: str) -> dict:
  """The environment of a 2-node job, as sbatch gives it to the script."""
  env = runs.env()
  env.pop(protocol.TOKEN_ENV, None)   # the script makes the run's token
  env.update({
      "PATH": f"{bin_dir}{os.pathsep}{env['PATH']}",
      "SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "medjax", "SLURM_NNODES": "2",
      "SLURM_JOB_NODELIST": "127.0.0.[2-3]", "SLURM_SUBMIT_DIR": runs.ROOT,
      "PYTHON": sys.executable, "WORKDIR": workdir, "CACHE_DIR": cache,
      "PORT": str(protocol.free_port()), "CONFIG": "configs/quickstart.py:tiny",
  })
  return env


def test_sbatch_stops_with_the_coordinators_error_and_starts_no_agents(tmp_path):
  bin_dir, srun_log = str(tmp_path / "bin"), str(tmp_path / "srun.jsonl")
  _write_standins(bin_dir, srun_log)
  workdir = str(tmp_path / "run")
  env = _slurm_env(bin_dir, workdir, str(tmp_path / "cache"))
  out = subprocess.run(["bash", SBATCH, "--config.optim.learning_rate=0.1"], cwd=str(tmp_path),
                       env=env, capture_output=True, text=True, timeout=120)
  leftovers = _leftovers(workdir, bin_dir)
  assert out.returncode == 2, out.stdout + out.stderr
  assert "learning_rate" in out.stderr, out.stderr   # medjax's one line naming the bad field
  assert "the coordinator exited (2) before serving" in out.stderr, out.stderr
  steps = [json.loads(line) for line in open(srun_log)]
  assert len(steps) == 1 and "--role=coordinator" in steps[0]["argv"], steps
  assert not leftovers


@pytest.mark.slow
def test_sbatch_runs_a_two_node_job_on_one_machine(tmp_path):
  bin_dir, srun_log = str(tmp_path / "bin"), str(tmp_path / "srun.jsonl")
  _write_standins(bin_dir, srun_log)
  workdir, cache = str(tmp_path / "pfs" / "run"), str(tmp_path / "node-local" / "cache")
  env = _slurm_env(bin_dir, workdir, cache)
  env.update({
      # A small cohort, one epoch: the point is the wiring, not the model.
      "OVERRIDES": "--config.data.synthetic.num_patients=160 --config.optim.epochs=1",
      # As sbatch sets it for --gpus-per-node=1: one worker per node.
      "SLURM_GPUS_ON_NODE": "1",
  })
  # Started from elsewhere: the script goes to the checkout (SLURM_SUBMIT_DIR) itself.
  proc = subprocess.Popen(["bash", SBATCH, "--config.evals.bootstrap=10"], cwd=str(tmp_path),
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          start_new_session=True)
  try:
    out, _ = proc.communicate(timeout=300)
  except subprocess.TimeoutExpired:
    proc.kill()
    out = proc.communicate()[0]
  finally:
    leftovers = _leftovers(workdir, bin_dir)
  logs = "\n".join(f"--- {p}\n{open(p, errors='replace').read()[-3000:]}"
                   for p in sorted(glob.glob(os.path.join(workdir, "logs", "*.log"))))
  assert proc.returncode == 0, f"{out}\n{logs}"
  assert not leftovers, f"processes left behind: {[p.info['cmdline'] for p in leftovers]}"
  assert f"done; {workdir}/summary.json" in out

  # Both "nodes" registered under their node names and trained together.
  events = runs.events(workdir)
  registered = {e["host"] for e in events if e["event"] == "agent_registered"}
  assert registered == {"127.0.0.2", "127.0.0.3"}, events
  (start,) = [e for e in events if e["event"] == "generation_start"]
  assert sorted(start["hosts"]) == ["127.0.0.2", "127.0.0.3"]
  # jax.distributed's service at the first host's advertised address (--advertise; without it
  # every agent would offer 127.0.0.1).
  spec = json.load(open(os.path.join(workdir, "generations", "gen-001.json")))
  assert spec["jax_address"].rsplit(":", 1)[0] == spec["hosts"][0]
  assert spec["num_processes"] == 2
  assert any(e["event"] == "done" for e in events)
  assert not any(e["event"] in ("failure", "gave_up") for e in events), events

  summary = runs.summary(workdir)
  assert summary["test"]["count"] > 0 and 0.0 <= summary["test"]["accuracy"] <= 1.0
  assert 0.0 <= summary["ceiling"]["accuracy"] <= 1.0   # the Bayes ceiling of the synthetic cohort
  assert summary["fault_tolerance"]["exactly_once"] is True
  assert summary["fault_tolerance"]["failures"] == []

  # The overrides reached the run through the coordinator's config.json; each host decoded its
  # records into the node-local cache, not the workdir.
  config = json.load(open(os.path.join(workdir, "config.json")))
  assert config["fault"]["hosts"] == 2 and config["data"]["cache_dir"] == cache
  assert config["optim"]["epochs"] == 1 and config["evals"]["bootstrap"] == 10
  assert config["fault"]["workers_per_host"] == 1   # not 0 ("auto"): from SLURM_GPUS_ON_NODE
  assert sorted(os.listdir(cache)) == ["127.0.0.2", "127.0.0.3"]
  assert not os.path.exists(os.path.join(workdir, "cache"))

  # Every call was authenticated with the script's token (a coordinator bound to 0.0.0.0
  # refuses to serve without one), and it was written nowhere in the workdir.
  coordinator_log = open(os.path.join(workdir, "logs", "coordinator.txt")).read()
  assert "rejected unauthenticated call" not in coordinator_log
  assert not os.path.exists(os.path.join(workdir, "secrets", "token"))

  # The steps srun was asked for: the coordinator on the first node, one agent per node.
  steps = [json.loads(line) for line in open(srun_log)]
  assert [s["nodes"] for s in steps] == [["127.0.0.2"], ["127.0.0.2", "127.0.0.3"]]
  coordinator_argv, agent_argv = steps[0]["argv"], steps[1]["argv"]
  assert coordinator_argv[:3] == [sys.executable, "-m", "medjax"]
  given = _check_medjax_args(coordinator_argv, "coordinator step")
  assert given["bind"] == "0.0.0.0" and given["port"] == env["PORT"]
  assert given["config.fault.hosts"] == "2" and given["config.evals.bootstrap"] == "10"
  i = agent_argv.index(sys.executable)
  given = _check_medjax_args(agent_argv[i:], "agent step")
  assert given["coordinator"] == f"127.0.0.2:{env['PORT']}"


@pytest.mark.slow
def test_sbatch_cancelled_mid_run_stops_both_steps_and_leaves_nothing(tmp_path):
  """scancel: SIGTERM to the batch script while the agents run; everything goes, in seconds."""
  bin_dir, srun_log = str(tmp_path / "bin"), str(tmp_path / "srun.jsonl")
  _write_standins(bin_dir, srun_log)
  workdir = str(tmp_path / "run")
  env = _slurm_env(bin_dir, workdir, str(tmp_path / "cache"))
  env["OVERRIDES"] = "--config.data.synthetic.num_patients=160 --config.fault.workers_per_host=1"
  proc = subprocess.Popen(["bash", SBATCH], cwd=str(tmp_path), env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, start_new_session=True)
  try:
    # Both agents registered and their workers of generation 1 started.
    runs.wait_for(lambda: any(e["event"] == "generation_start" for e in runs.events(workdir)),
                  120, "the first generation")
    runs.wait_for(lambda: len(glob.glob(os.path.join(workdir, "logs", "gen-001-proc-*"))) == 2,
                  60, "its two workers")
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
  finally:
    if proc.poll() is None:
      proc.kill()
    leftovers = _leftovers(workdir, bin_dir)
  assert proc.returncode == 143, out
  assert not leftovers, [p.info["cmdline"] for p in leftovers]
  assert not os.path.exists(os.path.join(workdir, "summary.json"))


# -- Kubernetes ----------------------------------------------------------------------------------

def _manifests() -> list[dict]:
  docs = []
  for path in sorted(glob.glob(os.path.join(K8S, "*.yaml"))):
    with open(path) as f:
      docs += [d for d in yaml.safe_load_all(f) if d]
  return docs


def _one(docs, kind, name=None):
  found = [d for d in docs if d["kind"] == kind and name in (None, d["metadata"]["name"])]
  assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
  return found[0]


def _pod_spec(workload: dict) -> dict:
  return workload["spec"]["template"]["spec"]


def _medjax_container(pod: dict) -> dict:
  (container,) = [c for c in pod["containers"] if c["name"] in ("coordinator", "agent")]
  words = [*container.get("command", []), *container.get("args", [])]
  assert words[:3] == ["python", "-m", "medjax"], words[:3]
  return container


def test_k8s_manifests_wire_the_roles_together():
  docs = _manifests()
  kinds = sorted(d["kind"] for d in docs)
  assert kinds == sorted(["Secret", "PersistentVolumeClaim", "Deployment", "Service", "Job"]), kinds
  secret = _one(docs, "Secret")
  pvc = _one(docs, "PersistentVolumeClaim")
  assert "ReadWriteMany" in pvc["spec"]["accessModes"]
  deployment, service, job = _one(docs, "Deployment"), _one(docs, "Service"), _one(docs, "Job")

  assert deployment["spec"]["replicas"] == 1
  # Never two coordinators of one run at once (a rolling update would start the new one first).
  assert deployment["spec"]["strategy"]["type"] == "Recreate"
  coord_pod, agent_pod = _pod_spec(deployment), _pod_spec(job)
  coord, agent = _medjax_container(coord_pod), _medjax_container(agent_pod)
  coord_flags = _check_medjax_args(coord["args"], "coordinator Deployment")
  agent_flags = _check_medjax_args(agent["args"], "agent Job")
  assert coord_flags["role"] == "coordinator" and agent_flags["role"] == "agent"
  assert coord_flags["bind"] == "0.0.0.0"

  # The config file is baked into the image (the checkout at the image's working directory).
  config_file = coord_flags["config"].split(":")[0]
  assert config_file.startswith("configs/") and os.path.isfile(
      os.path.join(runs.ROOT, config_file)), config_file
  assert "config" not in agent_flags   # agents read the coordinator's config.json
  hosts = int(coord_flags["config.fault.hosts"])
  spec = job["spec"]
  assert spec["completionMode"] == "Indexed"
  assert spec["completions"] == spec["parallelism"] == hosts
  assert coord_flags["config.data.cache_dir"]

  # The Service selects the coordinator's pod, on the coordinator's port; agents dial it.
  port = int(coord_flags["port"])
  assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"][
      "labels"].items()
  assert deployment["spec"]["selector"]["matchLabels"].items() <= deployment["spec"][
      "template"]["metadata"]["labels"].items()
  assert not service["spec"]["selector"].items() <= job["spec"]["template"]["metadata"][
      "labels"].items(), "the coordinator's Service also selects the agents' pods"
  assert [p["port"] for p in service["spec"]["ports"]] == [port]
  target = service["spec"]["ports"][0].get("targetPort", port)
  named = {p.get("name"): p["containerPort"] for p in coord.get("ports", [])}
  assert named.get(target, target) == port, (target, named)
  address = f"{service['metadata']['name']}:{port}"
  assert agent_flags["coordinator"] == address, (agent_flags["coordinator"], address)
  # The agents start once it serves: their init container waits for that address.
  (wait,) = agent_pod["initContainers"]
  script = " ".join(wait["command"])
  assert f'"{service["metadata"]["name"]}", {port}' in script, script
  images = {c["image"] for c in [coord, agent, wait]}
  assert len(images) == 1, f"one image (it holds the config file): {images}"

  # Kubernetes leaves a $(VAR) it cannot resolve as it is: each one names the container's env.
  for where, container in (("coordinator", coord), ("agent", agent)):
    names = {e["name"] for e in container.get("env", [])}
    refs = {r for arg in container["args"] for r in re.findall(r"\$\((\w+)\)", arg)}
    assert refs <= names, f"{where}: args use {refs - names}, which its env does not define"
  # One worker per GPU the agent's pod gets.
  gpus = agent["resources"]["limits"]["nvidia.com/gpu"]
  assert int(coord_flags["config.fault.workers_per_host"]) == gpus

  # Host name and address per pod from the downward API; the token from the Secret in both.
  env = {e["name"]: e for e in agent.get("env", [])}
  assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
  assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
  assert agent_flags["host_name"] == "$(POD_NAME)" and agent_flags["advertise"] == "$(POD_IP)"
  secret_keys = set(secret.get("stringData", {})) | set(secret.get("data", {}))
  for where, container in (("coordinator", coord), ("agent", agent)):
    token = {e["name"]: e for e in container.get("env", [])}[protocol.TOKEN_ENV]
    ref = token["valueFrom"]["secretKeyRef"]
    assert ref["name"] == secret["metadata"]["name"] and ref["key"] in secret_keys, where

  # Mounts name declared volumes; the workdir is the shared claim in both, the cache a
  # node-local volume of the agents mounted where config.data.cache_dir points.
  mounts_of = {}
  for where, pod, container in (("coordinator", coord_pod, coord), ("agent", agent_pod, agent)):
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    undeclared = [m["name"] for m in container["volumeMounts"] if m["name"] not in volumes]
    assert not undeclared, f"{where}: mounts volumes the pod does not declare: {undeclared}"
    mounts = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}
    mounts_of[where] = mounts
    workdir = coord_flags["workdir"] if where == "coordinator" else agent_flags["workdir"]
    (claim,) = [v for path, v in mounts.items() if _under(workdir, path)]
    assert claim["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"], where
  assert agent_flags["workdir"] == coord_flags["workdir"]
  (cache,) = [v for path, v in mounts_of["agent"].items()
              if _under(coord_flags["config.data.cache_dir"], path)]
  assert "emptyDir" in cache or "hostPath" in cache or "ephemeral" in cache, cache
  # One agent pod per node.
  anti = agent_pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
  assert anti[0]["topologyKey"] == "kubernetes.io/hostname"
  assert anti[0]["labelSelector"]["matchLabels"].items() <= job["spec"]["template"]["metadata"][
      "labels"].items()


def _under(path: str, mount: str) -> bool:
  return path == mount or path.startswith(mount.rstrip("/") + "/")


def test_deploy_readme_names_the_files_and_how_to_watch_a_run():
  text = open(os.path.join(DEPLOY, "README.md")).read()
  for name in ("slurm/medjax.sbatch", "k8s/", "summary.json", "events.jsonl", "sbatch",
               "kubectl apply"):
    assert name in text, name
