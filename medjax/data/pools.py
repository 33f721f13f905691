"""The data layer's process pools (the header scan, the cache fill) start from one forkserver.

Not fork: the caller may have started JAX's threads, and a forked copy can deadlock on them. The
forkserver is a fresh interpreter, started once per process, and it imports the decoding code
(NumPy, pydicom, PIL, TensorStore) before it forks any pool process: each pool process then
starts with it imported instead of importing it again (about 0.6 CPU seconds a process, and
the pool's start on a host with many cores).
"""

from __future__ import annotations

import multiprocessing

# What the forkserver imports once; '__main__' is multiprocessing's own default (the script's
# main module, which each pool process would otherwise run again).
PRELOAD = ("__main__", "medjax.data.cache.fill", "medjax.data.dicom.scan")


def context() -> multiprocessing.context.ForkServerContext:
  """The forkserver context of the data layer's pools (the preload applies from the
  forkserver's start, the first pool of the process)."""
  ctx = multiprocessing.get_context("forkserver")
  ctx.set_forkserver_preload(list(PRELOAD))
  return ctx
