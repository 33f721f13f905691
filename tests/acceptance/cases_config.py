"""Bad-input cases of the config (see bad_inputs.py).

Each runs `launch.py --config=configs/quickstart.py:tiny` (or a config file written here) with
one thing wrong; it must be refused in one line, exit code 2, within 2 s of launch.
"""

from __future__ import annotations

import json
import os

from tests.acceptance import lib
from tests.acceptance.lib import CLEAR, DEBUG_TRACEBACK, case

FAST_S = 2.0   # a config error is answered this soon after launch


# -- config -------------------------------------------------------------------------------------

def _config_plan(ctx, *args: str, error: str, config: str = lib.TINY, workdir: str | None = None,
                 env=None, debug=False, note="") -> lib.Plan:
  workdir = workdir or ctx.path("work")
  argv = ([config] if config else []) + [f"--workdir={workdir}", *args]
  return lib.Plan(argv=argv, workdir=workdir, raw_ids=[], error=error, env=env or {},
                  debug=debug, error_within_s=None if debug else FAST_S, timeout=60, note=note)


def _config_file(ctx, body: str, name: str = "my_config.py") -> str:
  return lib.write(ctx.path(name), body)


@case("config", "unknown field (override)", CLEAR, quick=True)
def _(ctx):
  return _config_plan(ctx, "--config.data.batch_sise=3", error="did you mean 'batch_size'")


@case("config", "unknown field (in a config file)", CLEAR)
def _(ctx):
  path = _config_file(ctx, "from configs import quickstart\n\ndef get_config(arg=None):\n"
                      "  config = quickstart.get_config('tiny')\n  config.data.batch_sise = 3\n"
                      "  return config\n")
  return _config_plan(ctx, error="did you mean config.data.batch_size", config=f"--config={path}")


@case("config", "unknown section (override)", CLEAR)
def _(ctx):
  return _config_plan(ctx, "--config.trainer.lr=1", error="trainer")


@case("config", "wrong type (override)", CLEAR)
def _(ctx):
  return _config_plan(ctx, "--config.data.batch_size=abc", error="batch_size")


@case("config", "wrong type (in a config file)", CLEAR)
def _(ctx):
  path = _config_file(ctx, "from configs import quickstart\n\ndef get_config(arg=None):\n"
                      "  config = quickstart.get_config('tiny')\n  config.optim.lr = 'fast'\n"
                      "  return config\n")
  # ConfigDict itself refuses a str for a float field, inside get_config.
  return _config_plan(ctx, error="lr", config=f"--config={path}")


@case("config", "tuple field given a number", CLEAR)
def _(ctx):
  return _config_plan(ctx, "--config.data.split=0.7", error="config.data.split")


@case("config", "bad enum (model.fusion)", CLEAR, quick=True)
def _(ctx):
  return _config_plan(ctx, "--config.model.fusion=concat", error="use one of ('attention'")


@case("config", "mode misspelt", CLEAR)
def _(ctx):
  return _config_plan(ctx, "--config.mode=trian", error="did you mean 'train'")


@case("config", "negative learning rate", CLEAR)
def _(ctx):
  return _config_plan(ctx, "--config.optim.lr=-0.001", error="config.optim.lr=-0.001: must be > 0")


@case("config", "split not summing to 1", CLEAR)
def _(ctx):
  return _config_plan(ctx, "--config.data.split=(0.5,0.2,0.2)", error="sums to 0.9, not 1")


@case("config", "batch not divisible by processes x devices", CLEAR)
def _(ctx):
  return _config_plan(ctx, "--config.fault.workers_per_host=2", "--config.data.batch_size=15",
                      error="does not split evenly")


@case("config", "heads not dividing d_model", CLEAR)
def _(ctx):
  return _config_plan(ctx, "--config.model.heads=5", error="does not divide config.model.d_model")


@case("config", "port out of range", CLEAR)
def _(ctx):
  return _config_plan(ctx, "--config.fault.port=70000", error="config.fault.port=70000")


@case("config", "bad fault.inject spec", CLEAR)
def _(ctx):
  return _config_plan(ctx, "--config.fault.inject=kil@step=3:process=0",
                      error="config.fault.inject")


@case("config", "fault.inject that can never fire", CLEAR)
def _(ctx):
  return _config_plan(ctx, "--config.fault.inject=kill@step=3:process=7",
                      error="config.fault.inject")


@case("config", "data.root missing", CLEAR)
def _(ctx):
  return _config_plan(ctx, f"--config.data.root={ctx.path('no_such_dir')}",
                      error="is not a directory")


@case("config", "data.root is a file", CLEAR)
def _(ctx):
  path = lib.write(ctx.path("cohort.txt"), "not a cohort\n")
  return _config_plan(ctx, f"--config.data.root={path}", error="is not a directory")


@case("config", "data.root is an empty directory", CLEAR)
def _(ctx):
  os.makedirs(ctx.path("empty"))
  return _config_plan(ctx, f"--config.data.root={ctx.path('empty')}", error="config.data.root")


@case("config", "data.root without labels.csv (train mode)", CLEAR)
def _(ctx):
  root = lib.cohort(ctx.path("cohort"), labels=False, images=0)
  return _config_plan(ctx, f"--config.data.root={root}", error="labels.csv")


@case("config", "data.root with its labels saved as Labels.xlsx (train mode)", CLEAR)
def _(ctx):
  root = lib.cohort(ctx.path("cohort"), labels=False, images=0)
  lib.write(os.path.join(root, "Labels.xlsx"), b"PK\x03\x04")
  return _config_plan(ctx, f"--config.data.root={root}",
                      error="found Labels.xlsx: a spreadsheet; save it as CSV to labels.csv")


@case("config", "config file missing", CLEAR)
def _(ctx):
  return _config_plan(ctx, error="cannot load it", config="--config=configs/quikstart.py")


@case("config", "config file with a syntax error", CLEAR)
def _(ctx):
  path = _config_file(ctx, "def get_config(arg=None:\n  return None\n")
  return _config_plan(ctx, error="my_config.py", config=f"--config={path}")


@case("config", "config file raising", CLEAR, quick=True)
def _(ctx):
  path = _config_file(ctx, "def get_config(arg=None):\n"
                      "  raise RuntimeError('the cohort share is not mounted')\n")
  return _config_plan(ctx, error="the cohort share is not mounted", config=f"--config={path}")


@case("config", "config file without get_config", CLEAR)
def _(ctx):
  path = _config_file(ctx, "LR = 3e-4\n")
  return _config_plan(ctx, error="get_config", config=f"--config={path}")


@case("config", "config given as a run's config.json", CLEAR)
def _(ctx):
  path = lib.write(ctx.path("config.json"), json.dumps({"mode": "train", "seed": 0}))
  return _config_plan(ctx, error="config.json", config=f"--config={path}")


@case("config", "unknown config variant", CLEAR)
def _(ctx):
  return _config_plan(ctx, error="unknown variant 'huge'",
                      config="--config=configs/quickstart.py:huge")


@case("config", "unknown flag", CLEAR)
def _(ctx):
  return _config_plan(ctx, "--wrokdir=/tmp/x", error="wrokdir")


@case("config", "no --config and no config.json", CLEAR)
def _(ctx):
  return _config_plan(ctx, error="--config", config="")


@case("config", "workdir is a regular file", CLEAR)
def _(ctx):
  path = lib.write(ctx.path("workdir.txt"), "x\n")
  return _config_plan(ctx, error="workdir.txt", workdir=path)


@case("config", "tls files missing", CLEAR)
def _(ctx):
  missing = ctx.path("tls")
  return _config_plan(ctx, f"--config.fault.tls_cert={missing}/cert.pem",
                      f"--config.fault.tls_key={missing}/key.pem",
                      f"--config.fault.tls_ca={missing}/ca.pem", error="cert.pem")


@case("config", "tls cert without key", CLEAR)
def _(ctx):
  cert = lib.write(ctx.path("cert.pem"), "-----BEGIN CERTIFICATE-----\n")
  return _config_plan(ctx, f"--config.fault.tls_cert={cert}", error="tls_key")


@case("config", "token file is a directory", CLEAR)
def _(ctx):
  os.makedirs(ctx.path("tokendir"))
  return _config_plan(ctx, f"--config.fault.token_file={ctx.path('tokendir')}",
                      error="token_file")


@case("config", "salt file under a regular file", CLEAR)
def _(ctx):
  f = lib.write(ctx.path("afile"), "x")
  return _config_plan(ctx, f"--config.data.salt_file={f}/id_salt", error="salt_file")


@case("config", "agent without --coordinator", CLEAR)
def _(ctx):
  work = ctx.path("work")
  return _config_plan(ctx, "--role=agent", error="--coordinator", workdir=work)


@case("config", "--debug shows the traceback", DEBUG_TRACEBACK, quick=True)
def _(ctx):
  return _config_plan(ctx, "--config.optim.lr=-1", "--debug", error="must be > 0", debug=True)


@case("config", "MEDJAX_DEBUG=1 shows the traceback", DEBUG_TRACEBACK)
def _(ctx):
  return _config_plan(ctx, "--config.optim.lr=-1", error="must be > 0", debug=True,
                      env={"MEDJAX_DEBUG": "1"})
