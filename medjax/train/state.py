"""The device mesh (config.mesh) and the training state, created already sharded.

The state is a pytree of plain containers and arrays: {'params': dict, 'fill': dict, 'opt': optax
state, 'step': int32}, the model's variables as nested dicts (`nnx.to_pure_dict`), which
`nnx.merge` takes back inside the step. Flattening it is C++ only: with nnx.State's Python
flatten and unflatten, dispatching a quickstart step took 2.6 ms instead of 1.4 ms.

Parameters are replicated over the 'data' axis and, when config.mesh.fsdp > 1, sharded over the
'fsdp' axis along their largest dimension that divides evenly.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from medjax import errors
from medjax import model as model_lib
from medjax import programs
from medjax.data import records
from medjax.model import fusion
from medjax.train import local_sgd

DATA_AXES = ("data", "fsdp")


def available_devices() -> list:
  """jax.devices(); where JAX cannot start the platform it was asked for (JAX_PLATFORMS=cuda
  without JAX's CUDA plugin, or no GPU; tpu without libtpu), one line that says so and what to do,
  instead of JAX's internal error."""
  try:
    return jax.devices()
  except (RuntimeError, AssertionError) as e:   # jax 0.10 asserts where no platform is left
    asked = os.environ.get("JAX_PLATFORMS", "")
    raise errors.InputError(
        f"JAX could not start {f'JAX_PLATFORMS={asked}' if asked else 'a backend'} "
        f"({type(e).__name__}: {str(e) or 'no platform left'}): install JAX's plugin for that "
        "platform (e.g. jax[cuda12] at requirements.txt's jax version) on a machine that has the "
        "device, or set JAX_PLATFORMS=cpu") from e


def make_mesh(mesh_config, devices=None) -> jax.sharding.Mesh:
  """A ('data', 'fsdp') mesh over all devices (or `devices`); data=-1 takes what fsdp leaves."""
  devices = list(devices if devices is not None else available_devices())
  fsdp = mesh_config.fsdp
  data = mesh_config.data if mesh_config.data > 0 else len(devices) // max(fsdp, 1)
  if data * fsdp != len(devices):
    raise errors.InputError(f"config.mesh data={mesh_config.data} x fsdp={fsdp} does not cover the "
                     f"{len(devices)} devices; set data=-1 or make the product equal")
  # Auto axes: shardings are given explicitly at the jit boundary and propagated inside.
  return jax.make_mesh((data, fsdp), DATA_AXES,
                       axis_types=(jax.sharding.AxisType.Auto,) * 2, devices=devices)


def batch_sharding(mesh) -> NamedSharding:
  """Leading (batch) axis split over every device."""
  return NamedSharding(mesh, P(DATA_AXES))


def replicated(mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def _param_spec(shape: tuple[int, ...], fsdp: int) -> P:
  if fsdp <= 1 or not shape:
    return P()
  for axis in np.argsort(shape)[::-1]:
    if shape[axis] % fsdp == 0 and shape[axis] >= fsdp:
      spec = [None] * len(shape)
      spec[axis] = "fsdp"
      return P(*spec)
  return P()


def shardings_for(abstract_state, mesh, local: local_sgd.Local | None = None):
  """Every entry's sharding: parameters (and their optimiser state) replicated over 'data' and
  split over 'fsdp'; 'local' mode's replicas over 'data', each split over 'fsdp'."""
  fsdp = mesh.shape["fsdp"]
  spec = lambda x: NamedSharding(mesh, _param_spec(tuple(x.shape), fsdp))
  shardings = {k: jax.tree.map(spec, v) for k, v in abstract_state.items() if k != "local"}
  if "local" in abstract_state:
    shardings["local"] = jax.tree.map(
        lambda x: local_sgd.replica_sharding(local, mesh, _param_spec(tuple(x.shape[1:]), fsdp)),
        abstract_state["local"])
  return shardings


@dataclasses.dataclass(frozen=True)
class Built:
  graphdef: nnx.GraphDef
  abstract: dict           # ShapeDtypeStructs with shardings (a restore target)
  shardings: dict
  # () -> a fresh state, created directly in its sharded layout (compiled on first use).
  create: Callable[[], dict] = dataclasses.field(repr=False, compare=False)


def build(model_config, tx, mesh, *, num_classes: int, shapes, seed: int,
          local: local_sgd.Local | None = None):
  """(state, Built): the training state created directly in its sharded layout."""
  built = build_abstract(model_config, tx, mesh, num_classes=num_classes, shapes=shapes,
                         seed=seed, local=local)
  return built.create(), built


def build_abstract(model_config, tx, mesh, *, num_classes: int, shapes, seed: int,
                   local: local_sgd.Local | None = None) -> Built:
  """The state's structure, shapes and shardings from one abstract evaluation; no state is
  created (`Built.create` makes one). A restart restores its state: creating a fresh one first
  (a second trace, a compile or cache load, and the run) took ~0.3-0.5 s of every restart.
  `local`: 'local' mode's state (`medjax.train.local_sgd`)."""

  # The model's graph definition, kept from the abstract evaluation below (static structure,
  # no arrays): building the model once more for it took ~0.1-0.2 s of every start and restart.
  graphdefs = []

  def create():
    model = model_lib.create(model_config, num_classes=num_classes, shapes=shapes, seed=seed)
    graphdef, params, fill = nnx.split(model, nnx.Param, fusion.FillValue)
    graphdefs.append(graphdef)
    params, fill = nnx.to_pure_dict(params), nnx.to_pure_dict(fill)
    state = {"params": params, "fill": fill, "opt": tx.init(params),
             "step": jnp.zeros((), jnp.int32)}
    return state if local is None else {**state, **local_sgd.init(local, params, tx)}

  abstract = jax.eval_shape(create)
  graphdef = graphdefs[0]
  shardings = shardings_for(abstract, mesh, local)
  abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                          abstract, shardings)
  return Built(graphdef, abstract, shardings,
               create=programs.cached(jax.jit(create, out_shardings=shardings)))


def count_params(model_config, *, num_classes: int, shapes) -> int:
  """Parameter count from an abstract evaluation (allocates nothing)."""
  abstract = nnx.eval_shape(
      lambda: model_lib.create(model_config, num_classes=num_classes, shapes=shapes, seed=0))
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))


def statistics(reader, rows: np.ndarray, tables) -> tuple:
  """`FusionModel.set_statistics`'s arguments from the training rows: the mean training image,
  raw zero in z-space for labs and for vitals ('mean'/'zero' fills), the z-scored training labs
  and their mask (piecewise-linear bins)."""
  size = reader.cache.shapes.image_size
  sample = reader.cache.read(rows[:256])
  images = sample["images"][sample["image_mask"]]
  image_mean = (images.mean(0, dtype=np.float32) if len(images)
                else np.zeros((size, size), np.float32))
  labs_mask = tables["labs_mask"][rows]
  return (image_mean, -tables["labs_mean"] / tables["labs_std"],
          -tables["vitals_mean"] / tables["vitals_std"],
          records.zscore("labs", tables["labs"][rows], labs_mask, tables), labs_mask)


def with_statistics(state: dict, built, reader, rows: np.ndarray, tables) -> dict:
  """`state` with the values a fresh model takes from the training data set (the ablations' fill
  values, the labs' bin edges)."""
  # Writable host copies: set_statistics assigns into the FillValue variables.
  host = lambda tree: jax.tree.map(np.array, jax.device_get(tree))
  model = nnx.merge(built.graphdef, host(state["params"]), host(state["fill"]))
  model.set_statistics(*statistics(reader, rows, tables))
  return dict(state, fill=jax.device_put(nnx.to_pure_dict(nnx.state(model, fusion.FillValue)),
                                         built.shardings["fill"]))
