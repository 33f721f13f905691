"""Compiled programs kept on disk for the processes JAX's persistent cache does not serve.

JAX writes persistent compilation-cache entries from process 0 only and lets the others read
them. On the CPU backend (jax 0.10.2) the cache key also hashes a topology fingerprint that
differs from process to process (`xla_client.get_topology_for_devices(jax.devices())` gives each
process of the same gloo run its own), so every process but 0 misses every program, in every
generation: in a two-process restart process 1 compiled for ~5 s while process 0 loaded its
programs in ~1 s, and process 0 then waited for it at the checkpoint restore's barrier.

For those processes, `cached(jitted)` keeps the compiled executable itself: serialized with
`jax.experimental.serialize_executable`, keyed by the lowered program's text, the process index
and count, the devices, JAX's and jaxlib's versions and XLA_FLAGS, in
`<compilation cache dir>/process-<N>/`. Elsewhere (one process, process 0, accelerators, no cache
directory) it returns the jitted function unchanged. A missing, stale or unreadable entry costs a
compile, never the run.

  step = programs.cached(jax.jit(train_step, ...))
  step.lower(state, batch)        # as jax.jit's
  step(state, batch)              # the executable for these arguments' shapes, loaded or compiled
  programs.warm(step, state, batch)   # compiled (or loaded) now, so the first call only runs
"""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
import tempfile

import jax
import jaxlib
from jax.experimental import serialize_executable

_FORMAT = 1


def needed() -> bool:
  """Whether this process's programs miss JAX's own persistent cache (see the module doc)."""
  return (jax.process_count() > 1 and jax.process_index() != 0
          and jax.default_backend() == "cpu" and bool(jax.config.jax_compilation_cache_dir))


def cached(jitted):
  """`jitted` itself, or where `needed()`, a wrapper that loads or compiles its executables."""
  return _Cached(jitted) if needed() else jitted


def warm(fn, *args) -> None:
  """Compiles (or loads) `fn`'s program for `args` now; a later `fn(*args)` only runs it."""
  if isinstance(fn, _Cached):
    fn.compiled_for(*args)
  else:
    fn.lower(*args).compile()   # fills jax.jit's own cache (and the persistent one)


def _load_or_compile(lowered: jax.stages.Lowered) -> jax.stages.Compiled:
  """`lowered.compile()`, from this process's own entry when there is one."""
  path = _entry(lowered)
  try:
    with open(path, "rb") as f:
      fmt, payload, in_tree, out_tree = pickle.load(f)
    if fmt == _FORMAT:
      return serialize_executable.deserialize_and_load(payload, in_tree, out_tree)
  except FileNotFoundError:
    pass
  except Exception as e:  # pylint: disable=broad-except  # a damaged entry is compiled again
    logging.warning("compiled program %s unreadable (%s: %s); compiling it again",
                    os.path.basename(path), type(e).__name__, str(e)[:200])
  compiled = lowered.compile()
  try:
    payload, in_tree, out_tree = serialize_executable.serialize(compiled)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
      pickle.dump((_FORMAT, payload, in_tree, out_tree), f)
    os.replace(tmp, path)
  except Exception as e:  # pylint: disable=broad-except  # full disk, read-only cache
    logging.warning("compiled program not kept in %s (%s: %s); the next generation compiles "
                    "it again", os.path.dirname(path), type(e).__name__, str(e)[:200])
  return compiled


def _entry(lowered: jax.stages.Lowered) -> str:
  key = hashlib.sha256()
  # The arguments' tree too: jax.jit leaves unused arguments out of the program, so two
  # functions of differently shaped states (a 'local' mode state and a 'sync' one, to a predict
  # step that reads only the parameters) lower to one text, but their executables take
  # different trees.
  for part in (lowered.as_text(), str(lowered.in_tree), jax.__version__, jaxlib.__version__,
               os.environ.get("XLA_FLAGS", ""), str(jax.process_count()),
               repr([(d.id, d.process_index, d.device_kind) for d in jax.devices()])):
    key.update(part.encode())
    key.update(b"\0")
  return os.path.join(jax.config.jax_compilation_cache_dir, f"process-{jax.process_index()}",
                      key.hexdigest() + ".exe")


class _Cached:
  """A jitted function whose executables come from `_load_or_compile`, one per argument shapes
  (made only where `needed()`)."""

  def __init__(self, jitted):
    self._jitted = jitted
    self._compiled: dict = {}

  def lower(self, *args, **kwargs):
    return self._jitted.lower(*args, **kwargs)

  def compiled_for(self, *args) -> jax.stages.Compiled:
    leaves, tree = jax.tree.flatten(args)
    signature = (tree, tuple((getattr(x, "shape", None), getattr(x, "dtype", type(x)),
                              getattr(x, "sharding", None)) for x in leaves))
    compiled = self._compiled.get(signature)
    if compiled is None:
      compiled = self._compiled[signature] = _load_or_compile(self._jitted.lower(*args))
    return compiled

  def __call__(self, *args):
    return self.compiled_for(*args)(*args)
