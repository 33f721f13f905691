"""Imported by the data pools' forkserver only (`medjax.data.pools.PRELOAD`): runs the caller's
main module there once, as `__mp_main__`, the way each pool process would otherwise run it
before its first job (and the way Python 3.13's forkserver does when '__main__' is preloaded).
The pool processes forked after it find their main module set up and run nothing again.
"""

import json
import os
import sys
from multiprocessing import process
from multiprocessing import spawn

from medjax.data import pools


def _run_main(entry: dict) -> None:
  if "name" not in entry and "path" not in entry:
    return
  argv = sys.argv
  sys.argv = entry.get("argv", argv)   # what the module sees in a pool process
  process.current_process()._inheriting = True   # pylint: disable=protected-access
  try:  # what spawn.prepare runs in each new process, given the same entry
    if "name" in entry:
      spawn._fixup_main_from_name(entry["name"])   # pylint: disable=protected-access
    else:
      spawn.import_main_path(entry["path"])
  except BaseException:  # pylint: disable=broad-except
    # A main module that fails here fails in each pool process too, where the pool reports it
    # (as before this preload); the forkserver itself must live.
    pass
  finally:
    del process.current_process()._inheriting
    sys.argv = argv


_run_main(json.loads(os.environ.get(pools.MAIN_ENV) or "{}"))
