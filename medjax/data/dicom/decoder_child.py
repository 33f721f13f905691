"""The decoder child process: `python -m medjax.data.dicom.decoder_child PARENT_PID MEMORY_MB`.

Started by `medjax.data.dicom.decoder`; imports no jax. It sets PR_SET_PDEATHSIG (Linux), limits its
address space to MEMORY_MB (RLIMIT_AS) and core files to nothing, then decodes one file per
request with `dicom.load_image` until its stdin closes.

Protocol (the child's stdout; its own prints, and any library's, go to stderr): one JSON request
line per file on stdin ({"path", "roots", "budgets", "frames"}); each reply is an 8-byte
little-endian length, a JSON header of that length ({"ok": true, "array": {"dtype", "shape"}}
or {"ok": false, "reason"}), then the array's bytes. The first reply, {"ok": true, "ready":
true}, comes once the child has imported everything and set its limits.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import struct
import sys
import time
import warnings

import numpy as np

from medjax import lifeline

# Test hook: "abort=a.dcm;hang=b.dcm" makes the child os.abort() on a file whose path ends with
# a.dcm and sleep on b.dcm (also: segv, kill, oom, lie). Tests only.
FAULT_ENV = "MEDJAX_DECODER_FAULT"
LENGTH = struct.Struct("<Q")


def _limit_memory(memory_mb: int) -> None:
  import resource  # pylint: disable=import-outside-toplevel  # POSIX only, child only
  resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crashing decoder leaves no core file
  _, hard = resource.getrlimit(resource.RLIMIT_AS)
  limit = memory_mb << 20
  if hard != resource.RLIM_INFINITY:
    limit = min(limit, hard)
  resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _warm_up() -> None:
  """Imports the pixel plugins now, so their code is mapped before the memory limit is set."""
  import pydicom  # pylint: disable=import-outside-toplevel
  from pydicom import uid  # pylint: disable=import-outside-toplevel
  for ts in (uid.RLELossless, uid.JPEGBaseline8Bit, uid.JPEGLSLossless, uid.JPEG2000Lossless):
    try:
      pydicom.pixels.get_decoder(ts).is_available  # pylint: disable=expression-not-assigned
    except Exception:  # pylint: disable=broad-except  # a missing plugin is reported per file
      pass
  for module in ("gdcm", "openjpeg", "libjpeg", "jpeg_ls", "rle"):
    try:
      __import__(module)
    except Exception:  # pylint: disable=broad-except
      pass


def _fault(path: str, memory_mb: int) -> dict | None:
  """Acts out the test hook for `path`; returns a forged reply to send instead of decoding."""
  for entry in filter(None, os.environ.get(FAULT_ENV, "").split(";")):
    action, _, suffix = entry.partition("=")
    if suffix and path.endswith(suffix):
      if action == "abort":
        os.abort()
      if action == "segv":
        ctypes.string_at(0)
      if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
      if action == "hang":
        time.sleep(3600)
      if action == "oom":
        raise MemoryError(f"test hook: {memory_mb} MB")
      if action == "lie":  # what a decoder bug that took the child over could send
        return {"ok": True, "array": {"dtype": "<f4", "shape": [65536, 65536]}}
  return None


def _main(argv: list[str]) -> None:
  parent, memory_mb = int(argv[0]), int(argv[1])
  out = os.dup(1)
  os.dup2(2, 1)  # whatever a library prints goes to stderr, never into the replies
  lifeline.die_with(parent)
  try:
    import fcntl  # pylint: disable=import-outside-toplevel
    fcntl.fcntl(out, 1031, 1 << 20)  # F_SETPIPE_SZ: fewer, larger writes of pixel data
  except (ImportError, OSError):
    pass
  # Warnings could quote element values (names, ids); the parent logs this process's stderr.
  warnings.simplefilter("ignore")
  logging.getLogger("pydicom").setLevel(logging.CRITICAL)
  # Here, not at the top: the parent imports this module for its constants, and pydicom only
  # when it decodes. Before the memory limit, like the plugins (`_warm_up`).
  from medjax.data import dicom  # pylint: disable=import-outside-toplevel
  _warm_up()
  _limit_memory(memory_mb)

  def reply(header: dict, array: np.ndarray | None = None) -> None:
    raw = json.dumps(header).encode()
    views = [memoryview(LENGTH.pack(len(raw)) + raw)]
    if array is not None:
      views.append(memoryview(np.ascontiguousarray(array)).cast("B"))
    for view in views:
      while view:
        view = view[os.write(out, view):]

  reply({"ok": True, "ready": True})
  for line in sys.stdin.buffer:
    request = json.loads(line)
    path = request["path"]
    try:
      forged = _fault(path, memory_mb)
      if forged is not None:
        reply(forged)
        continue
      image = dicom.load_image(path, dicom.Budgets(**request["budgets"]),
                               roots=request["roots"], frames=request.get("frames"))
    except dicom.RejectedFile as e:
      reply({"ok": False, "reason": e.reason})
      continue
    except MemoryError:
      reply({"ok": False, "reason": "out of memory while decoding"})
      continue
    reply({"ok": True, "array": {"dtype": image.dtype.str, "shape": list(image.shape)}}, image)


if __name__ == "__main__":
  _main(sys.argv[1:])
