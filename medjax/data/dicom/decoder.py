"""DICOM decoding where a crashing or runaway decoder costs one file, not the process.

The C decoders behind pydicom's plugins trust the codestream: gdcm aborts the whole process
(SIGABRT) on a JPEG-LS file whose Rows/Columns disagree with its codestream, and a decoder may
allocate whatever a header claims. `Decoder.load_image` therefore runs the decoding of compressed
(encapsulated) and deflated files in long-lived child processes (`python -m
medjax.data.dicom.decoder_child`), each under an address-space limit (RLIMIT_AS = config.data.
decode_memory_mb) and a per-file timeout (config.data.decode_timeout_s). A child that dies, runs
out of memory or times out turns that one file into a `dicom.RejectedFile` ("decoder crashed
(SIGABRT) on JPEG-LS Lossless Image Compression"), and a fresh child takes the next file. The
child runs the same `dicom.load_image`, so the result is bitwise that of decoding in-process.

`isolate` (config.data.isolate_decoding): 'compressed' (default; native pixel data, whose length
`dicom` has checked against the header, decodes in-process), 'all', or 'none' (everything
in-process, as before).

Children are started on first use (a cohort without compressed files never starts one), shared
by every `Decoder` of the process with the same limits, used by one thread at a time (a decoding
thread waits for a free child), and stopped at exit (`shutdown`; a child busy with a file is
stopped when that file is done). They never outlive the process: they exit on EOF of their
request pipe, and on Linux the kernel kills them when the process dies (PR_SET_PDEATHSIG). A
reply is checked before anything is allocated for it (the pipe protocol is in
`medjax.data.dicom.decoder_child`).
"""

from __future__ import annotations

import atexit
import concurrent.futures
import dataclasses
import json
import logging
import os
import queue
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence

import numpy as np

from medjax import lifeline
from medjax.data.dicom import decoder_child
from medjax.data.dicom import limits as dicom_limits

ISOLATE = ("compressed", "all", "none")
FAULT_ENV = decoder_child.FAULT_ENV
_LENGTH = decoder_child.LENGTH
_START_TIMEOUT_S = 120.0
_STDERR_TAIL = 2000
_MAX_HEADER = 1 << 16
# A child's stderr file is emptied before a request once it holds this much (pydicom warns a lot).
_STDERR_KEEP = 1 << 20
# What decoding takes (measured, docs/data.md): about 300 MB plus 22 bytes per pixel.
_DECODE_BASE_MB, _DECODE_BYTES_PER_PIXEL = 300, 22


class Decoder:
  """`dicom.load_image` under budgets, with the decoders that can crash isolated. Thread-safe.

  Args:
    budgets: header and file-size limits, checked before anything is decoded.
    isolate: 'compressed', 'all' or 'none' (see the module docstring).
    memory_mb: each child's address-space limit.
    timeout_s: how long one file may take in a child.
    workers: children at most (threads beyond that wait for a free one).
  """

  def __init__(self, budgets: dicom_limits.Budgets | None = None, *, isolate: str = "compressed",
               memory_mb: int = 2048, timeout_s: float = 120.0, workers: int = 2):
    if isolate not in ISOLATE:
      raise ValueError(f"config.data.isolate_decoding={isolate!r}: use one of {ISOLATE}")
    if isolate != "none" and memory_mb < 256:
      raise ValueError(f"config.data.decode_memory_mb={memory_mb}: a decoder process needs at "
                       "least 256 MB to start; give 2048 or more")
    if timeout_s <= 0 or workers < 1:
      raise ValueError(f"config.data.decode_timeout_s={timeout_s}, decode_workers={workers}: "
                       "both must be positive")
    self.budgets = budgets or dicom_limits.Budgets()
    self.isolate, self.memory_mb = isolate, int(memory_mb)
    self.timeout_s, self.workers = float(timeout_s), int(workers)

  @classmethod
  def from_config(cls, data_config) -> Decoder:
    """The decoder `config.data` describes (a config saved before these fields: defaults)."""
    get = data_config.get
    return cls(dicom_limits.Budgets.from_config(data_config),
               isolate=get("isolate_decoding", "compressed"),
               memory_mb=get("decode_memory_mb", 2048), timeout_s=get("decode_timeout_s", 120.0),
               workers=get("decode_workers", 2))

  def load_image(self, path: str | os.PathLike, roots: Sequence[str] = (),
                 frames: int | None = None) -> np.ndarray:
    """Like `dicom.load_image(path, budgets, roots=roots, frames=frames)`, in a child where
    `isolate` says.

    Raises:
      RejectedFile: as `dicom.load_image`, and when the child crashed, ran out of memory or
        timed out on this file.
      RuntimeError: a child could not even start (e.g. decode_memory_mb too small to import).
    """
    # pydicom (~0.15 s to import) only once a file is decoded: a run whose images are all in the
    # decoded cache never imports it.
    from medjax.data import dicom  # pylint: disable=import-outside-toplevel
    path = os.fspath(path)
    if self.isolate == "none":
      return dicom.load_image(path, self.budgets, roots=roots, frames=frames)
    image, ts = dicom.load_image_if(path, self._decodes_here, self.budgets, roots=roots,
                                    frames=frames)
    if image is not None:
      return image
    what = ts.name if _known(ts) else "a dataset without a known transfer syntax"
    pool = _pool(self.memory_mb, self.timeout_s, self.workers)
    try:
      return pool.decode(path, {"path": path, "roots": [os.fspath(r) for r in roots],
                                "budgets": dataclasses.asdict(self.budgets), "frames": frames},
                         what)
    except dicom_limits.RejectedFile as e:
      if not e.reason.startswith("decoder crashed ("):
        raise
      hint = self._memory_hint(path, roots)
      if not hint:
        raise
      raise dicom_limits.RejectedFile(path, e.reason + hint) from None

  def _memory_hint(self, path: str, roots) -> str:
    """Why a decoder library may have aborted: a C decoder that cannot allocate aborts or
    segfaults rather than raise. Said when the image's header asks for more than the limit."""
    from medjax.data import dicom  # pylint: disable=import-outside-toplevel  # loaded by now
    try:
      h = dicom.read_header(path, self.budgets, roots=roots)   # the header only: safe here
    except dicom_limits.RejectedFile:
      return ""
    pixels = h.rows * h.columns * max(h.frames, 1) * max(h.samples_per_pixel, 1)
    need = _DECODE_BASE_MB + _DECODE_BYTES_PER_PIXEL * pixels / 2**20
    if need <= self.memory_mb:
      return ""
    return (f" (its {pixels:,} pixels need about {need:,.0f} MB to decode, over "
            f"config.data.decode_memory_mb={self.memory_mb}; raise it if the file is genuine)")

  def _decodes_here(self, ts) -> bool:
    """Native pixel data decodes in this process ('compressed'), in the read that found it."""
    return (self.isolate == "compressed" and _known(ts)
            and not (ts.is_encapsulated or ts.is_deflated))


def _known(ts) -> bool:
  return ts is not None and ts.is_transfer_syntax


def default() -> Decoder:
  """A Decoder with the default budgets and isolation (for callers without a config)."""
  return Decoder()


_pools: dict[tuple, _Pool] = {}
_pools_lock = threading.Lock()


def _pool(memory_mb: int, timeout_s: float, workers: int) -> _Pool:
  key = (memory_mb, timeout_s, workers)
  with _pools_lock:
    pool = _pools.get(key)
    if pool is None:
      pool = _pools[key] = _Pool(memory_mb, timeout_s, workers)
    return pool


def shutdown() -> None:
  """Stops this process's children (also run at exit); later decodes start new ones.

  A child busy with a file is stopped by its decoding thread once that file is done.
  """
  with _pools_lock:
    pools = list(_pools.values())
    _pools.clear()
  for pool in pools:
    pool.close()


def children() -> list[int]:
  """Process ids of the live children (for tests and measurements)."""
  with _pools_lock:
    pools = list(_pools.values())
  return [c.proc.pid for p in pools for c in p.all if c.proc is not None and c.proc.poll() is None]


def _forget_after_fork() -> None:
  # A forked process must not talk to its parent's children through the inherited pipes.
  global _pools_lock
  _pools.clear()
  _pools_lock = threading.Lock()


atexit.register(shutdown)
os.register_at_fork(after_in_child=_forget_after_fork)


class _Died(Exception):
  pass


class _TimedOut(Exception):
  pass


class _Invalid(Exception):
  pass


class _Pool:
  """Children used one thread at a time; started lazily, restarted after a failure."""

  def __init__(self, memory_mb: int, timeout_s: float, workers: int):
    self.memory_mb, self.timeout_s = memory_mb, timeout_s
    self.closed = False
    # Children are started from one long-lived daemon thread: PR_SET_PDEATHSIG fires when the
    # thread that started a child ends, and decoding threads come and go. A daemon thread ends
    # only with the process (a ThreadPoolExecutor's thread would end, and kill the children, at
    # interpreter shutdown before `shutdown` runs).
    self._requests: queue.SimpleQueue = queue.SimpleQueue()
    threading.Thread(target=self._spawner, name="medjax-decoder-spawner", daemon=True).start()
    self.all = [_Child(self) for _ in range(workers)]
    self._idle: queue.LifoQueue[_Child] = queue.LifoQueue()
    for child in reversed(self.all):
      self._idle.put(child)

  def decode(self, path: str, request: dict, what: str) -> np.ndarray:
    child = self._idle.get()
    try:
      return child.decode(path, request, what)
    finally:
      if self.closed:
        child.stop()
      self._idle.put(child)

  def _spawner(self) -> None:
    while True:
      request = self._requests.get()
      if request is None:
        return
      argv, stderr, done = request
      try:
        done.set_result(subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=stderr, env=_child_env(), close_fds=True))
      except BaseException as e:  # pylint: disable=broad-except  # handed to the caller
        done.set_exception(e)

  def spawn(self, argv: list[str], stderr) -> subprocess.Popen:
    if self.closed:
      raise RuntimeError("the decoder pool is shut down")
    done = concurrent.futures.Future()
    self._requests.put((argv, stderr, done))
    return done.result()

  def close(self) -> None:
    """Stops the idle children; a busy one is stopped by its thread when its file is done."""
    self.closed = True
    idle = []
    while True:
      try:
        idle.append(self._idle.get_nowait())
      except queue.Empty:
        break
    for child in idle:
      child.stop()
      self._idle.put(child)
    self._requests.put(None)


class _Child:
  """One decoder process and its pipes; used by one thread at a time."""

  def __init__(self, pool: _Pool):
    self.pool = pool
    self.proc: subprocess.Popen | None = None
    self.stderr = None

  def decode(self, path: str, request: dict, what: str) -> np.ndarray:
    line = (json.dumps(request) + "\n").encode()
    for attempt in range(2):
      if self.proc is None:
        self._start()
      elif self.stderr.seek(0, os.SEEK_END) > _STDERR_KEEP:
        self.stderr.truncate(0)  # the child appends (O_APPEND), so it goes on writing from 0
      try:
        self._send(line)
      except OSError:  # it died while idle (killed from outside): one new child, one retry
        self.stop()
        self._start()
        self._send(line)
      try:
        # float32, one value per pixel: at most 4 bytes per pixel the budget admits.
        header, payload = self._receive(time.monotonic() + self.pool.timeout_s,
                                        max_bytes=4 * request["budgets"]["max_pixels"])
      except _Invalid as e:
        self.stop()
        raise dicom_limits.RejectedFile(
            path, f"decoder sent an invalid reply on {what} ({e})") from None
      except _TimedOut:
        self.stop()
        raise dicom_limits.RejectedFile(
            path, f"decoder timed out after {self.pool.timeout_s:g} s on {what} "
            "(config.data.decode_timeout_s)") from None
      except _Died:
        status, tail = self._reap()
        if status == "SIGKILL" and attempt == 0:
          # Decoders do not SIGKILL themselves; the host's OOM killer or an operator did.
          logging.warning("decoder: the child decoding %s was killed (SIGKILL); once more", path)
          continue
        logging.warning("decoder: the child decoding %s died (%s); its last output: %s", path,
                        status, tail or "(none)")
        raise dicom_limits.RejectedFile(path, f"decoder crashed ({status}) on {what}") from None
      if header["ok"]:
        return payload
      reason = header["reason"]
      if reason.startswith("out of memory"):
        self.stop()  # a fresh child rather than one whose heap just hit its limit
        reason += (f" (decoder limit config.data.decode_memory_mb={self.pool.memory_mb}; raise "
                   "it if the file is genuine)")
      raise dicom_limits.RejectedFile(path, reason)
    raise AssertionError("unreachable")

  def _start(self) -> None:
    self.stderr = tempfile.TemporaryFile("a+b")
    argv = [sys.executable, "-m", "medjax.data.dicom.decoder_child", str(os.getpid()),
            str(self.pool.memory_mb)]
    self.proc = self.pool.spawn(argv, self.stderr)
    try:
      header, _ = self._receive(time.monotonic() + _START_TIMEOUT_S, max_bytes=0)
    except (_Died, _TimedOut, _Invalid) as e:
      status, tail = self._reap() if isinstance(e, _Died) else ("no reply", self._tail())
      self.stop()
      raise RuntimeError(f"decoder process did not start ({status}); is "
                         f"config.data.decode_memory_mb={self.pool.memory_mb} too small? "
                         f"Its output: {tail}") from None
    assert header.get("ready"), header

  def _send(self, data: bytes) -> None:
    fd = self.proc.stdin.fileno()
    view = memoryview(data)
    while view:
      view = view[os.write(fd, view):]

  def _receive(self, deadline: float, max_bytes: int) -> tuple[dict, np.ndarray | None]:
    """One reply; its array (if any) may hold `max_bytes` at most.

    The reply is checked before anything is allocated for it: a child a decoder bug has taken
    over must not make this process allocate what it likes either.
    """
    fd = self.proc.stdout.fileno()
    length = bytearray(_LENGTH.size)
    _read_into(fd, memoryview(length), deadline)
    size = _LENGTH.unpack(length)[0]
    if size > _MAX_HEADER:
      raise _Invalid(f"a {size}-byte header")
    raw = bytearray(size)
    _read_into(fd, memoryview(raw), deadline)
    try:
      header = json.loads(raw)
      if "array" not in header:
        return header, None
      dtype, shape = np.dtype(header["array"]["dtype"]), tuple(header["array"]["shape"])
      nbytes = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
    except (ValueError, TypeError, KeyError) as e:
      raise _Invalid(f"unreadable header: {type(e).__name__}") from None
    if dtype != np.float32 or not 0 < nbytes <= max_bytes:
      raise _Invalid(f"a {dtype} array of shape {shape}")
    out = np.empty(shape, dtype)
    _read_into(fd, memoryview(out).cast("B"), deadline)
    return header, out

  def _reap(self) -> tuple[str, str]:
    """(how it ended, its last output) for a child whose pipe closed."""
    try:
      code = self.proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
      self.proc.kill()
      code = self.proc.wait()
    tail = self._tail()
    self.stop()
    if code < 0:
      try:
        return signal.Signals(-code).name, tail
      except ValueError:
        return f"signal {-code}", tail
    return f"exit code {code}", tail

  def _tail(self) -> str:
    if self.stderr is None:
      return ""
    self.stderr.seek(0, os.SEEK_END)
    size = self.stderr.tell()
    self.stderr.seek(max(size - _STDERR_TAIL, 0))
    return " ".join(self.stderr.read().decode(errors="replace").split())

  def stop(self) -> None:
    """Ends the child: EOF on its stdin, then SIGKILL if it does not exit at once."""
    proc, self.proc = self.proc, None
    if proc is not None:
      for pipe in (proc.stdin, proc.stdout):
        try:
          pipe.close()
        except OSError:
          pass
      try:
        proc.wait(timeout=1.0)
      except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if self.stderr is not None:
      self.stderr.close()
      self.stderr = None


def _read_into(fd: int, view: memoryview, deadline: float) -> None:
  got = 0
  while got < len(view):
    left = deadline - time.monotonic()
    if left <= 0 or not select.select([fd], [], [], left)[0]:
      raise _TimedOut()
    n = os.readv(fd, [view[got:]])
    if n == 0:
      raise _Died()
    got += n


def _child_env() -> dict[str, str]:
  env = dict(os.environ)
  # One thread: thread stacks and malloc arenas count against RLIMIT_AS, and decoding one file
  # gains nothing from a BLAS thread pool.
  for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    env[name] = "1"
  # The child imports medjax the way this process did, wherever it was started from.
  return lifeline.same_code(env)
