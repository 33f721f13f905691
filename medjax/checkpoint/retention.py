"""Checkpoint directories on disk: retention, damaged steps set aside, uncommitted steps discarded.

Retention (`prune`) is applied to committed steps only, so an uncommitted newer step never
pushes the last committed one out; whoever commits prunes (the coordinator in supervised runs).
No Orbax here: the coordinator, which imports no jax, prunes.
"""

from __future__ import annotations

import os
import shutil
import time


def set_aside(directory: str, steps: list[int]) -> str | None:
  """Moves damaged step directories to `<directory>-damaged/` (kept for inspection, never
  deleted, and out of the way of the same steps saved again); returns where they went."""
  if not steps:
    return None
  target = directory.rstrip("/") + "-damaged"
  os.makedirs(target, exist_ok=True)
  for step in steps:
    source = os.path.join(directory, str(step))
    if os.path.isdir(source):
      os.replace(source, os.path.join(target, f"{step}.{time.strftime('%Y%m%d-%H%M%S')}"))
  return target


def step_dirs(directory: str) -> list[int]:
  """The step directories in `directory` (finalized or not), in order."""
  names = os.listdir(directory) if os.path.isdir(directory) else []
  return sorted(int(n.split(".")[0]) for n in names if n.split(".")[0].isdigit())


def discard_uncommitted(directory: str, committed_steps: list[int]) -> list[int]:
  """Deletes step directories newer than the newest committed step: work a failure discarded.

  Call on one process while no generation is saving (before training resumes).
  """
  newest = max(committed_steps, default=-1)
  removed = []
  for name in os.listdir(directory) if os.path.isdir(directory) else []:
    step = name.split(".")[0]
    if step.isdigit() and int(step) > newest:
      shutil.rmtree(os.path.join(directory, name), ignore_errors=True)
      removed.append(int(step))
  return sorted(removed)


def prune(directory: str, committed_steps: list[int], keep: int | None,
          also_keep: tuple = ()) -> list[int]:
  """Deletes checkpoint step directories in `directory` older than the `keep` newest committed
  steps, except the steps in `also_keep` (the best checkpoint: ckpt.keep_best); returns them."""
  if not keep or len(committed_steps) <= keep or not os.path.isdir(directory):
    return []
  oldest_kept = sorted(committed_steps)[-keep]
  removed = []
  for name in os.listdir(directory):
    if name.isdigit() and int(name) < oldest_kept and int(name) not in also_keep:
      shutil.rmtree(os.path.join(directory, name), ignore_errors=True)
      removed.append(int(name))
  return sorted(removed)
