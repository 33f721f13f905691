"""medjax's only entry point: parses flags and hands a config to the library.

  python launch.py --config configs/quickstart.py [--workdir DIR] [--config.a.b=value]
  python launch.py --config configs/quickstart.py --config.mode=ingest --workdir DIR
"""

import json
import logging
import os
import sys
import time

from absl import app
from absl import flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file (configs/NAME.py[:variant]); override fields with "
    "--config.a.b=value.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (default: runs/<config>-<time>).")
_ROLE = flags.DEFINE_enum("role", "local", ["local"], "What this process is: 'local' runs "
                          "everything on this machine.")
flags.mark_flags_as_required(["config"])


def _workdir() -> str:
  if _WORKDIR.value:
    return _WORKDIR.value
  name = os.path.splitext(os.path.basename(flags.FLAGS["config"].config_filename))[0]
  return os.path.join("runs", f"{name}-{time.strftime('%Y%m%d-%H%M%S')}")


def _setup_logging(workdir: str) -> None:
  handler = logging.FileHandler(os.path.join(workdir, "log.txt"))
  handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
  logging.getLogger().addHandler(handler)
  logging.getLogger().setLevel(logging.INFO)
  # Orbax and JAX log through absl at INFO for every save; keep their warnings, drop the chatter.
  logging.getLogger("absl").setLevel(logging.WARNING)


def main(argv):
  del argv
  config = _CONFIG.value
  workdir = _workdir()
  os.makedirs(workdir, exist_ok=True)
  _setup_logging(workdir)
  with open(os.path.join(workdir, "config.json"), "w") as f:
    f.write(config.to_json_best_effort(indent=2, sort_keys=True))
  logging.info("workdir %s, mode %s", workdir, config.mode)

  # Imported here so that `--help` and flag errors stay fast.
  from medjax.data import pipeline  # pylint: disable=import-outside-toplevel
  if config.mode == "synth":
    print(pipeline.cohort_root(config, workdir))
  elif config.mode == "ingest":
    pipeline.run_ingest(config, workdir)
  elif config.mode == "train":
    from medjax.train import loop  # pylint: disable=import-outside-toplevel
    summary = loop.train_and_evaluate(config, workdir)
    from medjax import evaluate  # pylint: disable=import-outside-toplevel
    print(evaluate.format_summary(summary))
  else:
    raise app.UsageError(f"config.mode={config.mode!r}: use 'synth', 'ingest' or 'train'")
  print(f"workdir: {workdir}")


if __name__ == "__main__":
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  app.run(main)
